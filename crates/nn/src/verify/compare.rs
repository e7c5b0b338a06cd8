//! Element-by-element comparison of per-slot results, for the laws that demand equality: the
//! highest slot that differs (the first a backward sweep reaches), with the element and values.

use tapegrad_tensor::{Scalar, Tensor};

/// How two results are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Equality {
    /// `==` on values: +0 equals -0 (law 1).
    Values,
    /// Identical bits (law 4).
    Bits,
}

/// Where two per-slot lists differ: slot, element, and the two values (`None` when the shapes
/// or lengths differ).
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    pub slot: usize,
    pub element: Option<(usize, f64, f64)>,
}

impl Difference {
    /// `element 3: 0.25 against 0.5`, or that the shapes differ.
    pub fn what(&self, left: &str, right: &str) -> String {
        match self.element {
            Some((i, a, b)) => format!("element {i} is {a:e} in {left} but {b:e} in {right}"),
            None => format!("{left} and {right} differ in shape"),
        }
    }
}

/// The highest slot among `slots` (all when `None`) where `a` and `b` differ.
pub fn first_difference<S: Scalar>(
    a: &[Tensor<S>],
    b: &[Tensor<S>],
    slots: Option<&[usize]>,
    how: Equality,
) -> Option<Difference> {
    if a.len() != b.len() {
        return Some(Difference {
            slot: a.len().min(b.len()),
            element: None,
        });
    }
    let all: Vec<usize>;
    let slots = match slots {
        Some(s) => s,
        None => {
            all = (0..a.len()).collect();
            &all
        }
    };
    let mut order = slots.to_vec();
    order.sort_unstable_by(|x, y| y.cmp(x));
    order
        .into_iter()
        .find_map(|s| tensor_difference(&a[s], &b[s], how).map(|element| (s, element)))
        .map(|(slot, element)| Difference { slot, element })
}

/// `None` when equal; else the first differing element (`None` inside for a shape mismatch).
fn tensor_difference<S: Scalar>(
    a: &Tensor<S>,
    b: &Tensor<S>,
    how: Equality,
) -> Option<Option<(usize, f64, f64)>> {
    if a.shape() != b.shape() {
        return Some(None);
    }
    let same = |x: S, y: S| match how {
        Equality::Values => x == y,
        Equality::Bits => x.to_f64().to_bits() == y.to_f64().to_bits(),
    };
    a.data()
        .iter()
        .zip(b.data())
        .position(|(&x, &y)| !same(x, y))
        .map(|i| Some((i, a.data()[i].to_f64(), b.data()[i].to_f64())))
}
