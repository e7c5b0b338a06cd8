//! binary_cross_entropy_with_logits per element, with PyTorch's optional `pos_weight` (the weight
//! of the positive term, of a shape that broadcasts into the input's) and `weight`
//! (a factor per element, broadcast to the input): the loss and its two partial derivatives, each
//! stable for every finite logit.

use smallvec::SmallVec;
use std::cell::Cell;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// The logistic function without overflow (`exp` only sees non-positive arguments).
pub(super) fn sigmoid<S: Scalar>(x: S) -> S {
    if x >= S::ZERO {
        S::ONE / (S::ONE + (-x).exp())
    } else {
        let e = x.exp();
        e / (S::ONE + e)
    }
}

/// Whether a factor of shape `w` broadcasts into `shape` without enlarging it (no more axes,
/// trailing axes equal or 1): PyTorch's rule for `pos_weight` and `weight`, which scale the loss
/// element by element.
fn broadcasts_into(w: &Shape, shape: &Shape) -> bool {
    w.rank() <= shape.rank()
        && w.dims()
            .iter()
            .rev()
            .zip(shape.dims().iter().rev())
            .all(|(&a, &b)| a == b || a == 1)
}

/// A factor tensor of the loss (`pos_weight` or `weight`), checked against the input's shape and
/// read per element of the row-major input. PyTorch broadcasts both into the loss, which they
/// cannot enlarge: the shape must broadcast into the input's (no more axes, trailing axes equal
/// or 1). So [C] weighs classes along the last axis, [C, 1, 1] along the third-to-last (PyTorch's
/// recommendation for a [C, H, W] target), [1] or a 0-d one weighs all. Constant attributes, as
/// in PyTorch, whose autograd differentiates neither.
pub(super) enum Factors<'a> {
    /// No factor.
    None,
    /// A single value, or values that follow the input's innermost axes: element `i` reads
    /// `w[i % w.len()]`.
    Cyclic(&'a [f64]),
    /// Any other shape that broadcasts into the input's, read in place through the runs of axes
    /// it moves along (a copy broadcast to the input would be as large as the input, in f64, on
    /// every call).
    Strided(Strided<'a>),
}

/// A factor read through its runs, remembering the last span of elements that share one value:
/// the loops read elements in order, so a factor constant along the inner axes (a [C, 1, 1] of
/// an [N, C, H, W] input) costs its divisions once per span of H x W elements, not per element.
pub(super) struct Strided<'a> {
    w: &'a [f64],
    runs: SmallVec<[Run; 4]>,
    /// The elements between changes of the value: the innermost run's `inner`.
    span: usize,
    /// (first element of the span last read, its value).
    last: Cell<(usize, f64)>,
}

impl Strided<'_> {
    fn at(&self, i: usize) -> f64 {
        let (start, value) = self.last.get();
        if i >= start && i - start < self.span {
            return value;
        }
        let start = i - i % self.span;
        let at = self.runs.iter().map(|r| (i / r.inner) % r.len * r.stride);
        let value = self.w[at.sum::<usize>()];
        self.last.set((start, value));
        value
    }
}

/// Consecutive axes of the input along which a broadcast factor moves: element `i` of the input
/// is at step `(i / inner) % len` of the run, and a step moves `stride` factor values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Run {
    inner: usize,
    len: usize,
    stride: usize,
}

/// The runs through which a factor of shape `w`, which broadcasts into `shape`, is read per
/// element of the row-major input: its axes of more than one value, merged where adjacent (a
/// factor [C, 1, 1] of an [N, C, H, W] input is one run, read as `(i / HW) % C`).
fn runs(w: &Shape, shape: &Shape) -> SmallVec<[Run; 4]> {
    let mut runs: SmallVec<[Run; 4]> = SmallVec::new();
    let (mut inner, mut stride) = (1usize, 1usize);
    // Whether the last run reaches the axis just inside this one, so that it can grow.
    let mut open = false;
    // From the last axis in; the factor's missing leading axes are 1s.
    let w_dims = w.dims().iter().rev().chain(std::iter::repeat(&1));
    for (&n, &k) in shape.dims().iter().rev().zip(w_dims) {
        if n == 1 {
            // Moves nothing: it neither ends a run nor starts one.
            continue;
        }
        if k > 1 {
            match runs.last_mut() {
                Some(run) if open => run.len *= n,
                _ => runs.push(Run {
                    inner,
                    len: n,
                    stride,
                }),
            }
            stride *= k;
        }
        open = k > 1;
        inner = inner.saturating_mul(n);
    }
    runs
}

impl<'a> Factors<'a> {
    /// Whether `factors` (called `what` in the error) fit the input's `shape`. Allocates nothing.
    pub(super) fn check(
        op: &'static str,
        what: &str,
        factors: Option<&Tensor<f64>>,
        shape: &Shape,
    ) -> Result<()> {
        let Some(w) = factors else {
            return Ok(());
        };
        if broadcasts_into(w.shape(), shape) {
            return Ok(());
        }
        let mut msg = format!(
            "{what} of shape {} does not broadcast to the input's shape {shape}",
            w.shape()
        );
        if w.rank() == 1 && what == "pos_weight" {
            // The usual form: say what it should have been.
            match shape.dims().last() {
                Some(&last) => msg.push_str(&format!(
                    ": it needs one entry per class along the last axis of the input \
                     ({last} for shape {shape}) or a single one, found {} entries",
                    w.data().len()
                )),
                None => msg.push_str(" (a 0-d input takes a 0-d pos_weight only)"),
            }
        }
        Err(Error::invalid(op, msg))
    }

    /// `factors` checked against the input's `shape`, ready to read per element.
    pub(super) fn new(
        op: &'static str,
        what: &str,
        factors: Option<&'a Tensor<f64>>,
        shape: &Shape,
    ) -> Result<Self> {
        Self::check(op, what, factors, shape)?;
        let Some(w) = factors else {
            return Ok(Factors::None);
        };
        let runs = runs(w.shape(), shape);
        Ok(match runs.as_slice() {
            // One value, or one run along the innermost axes that move it (a [C] or a [1, C]
            // factor of an [N, C] input): element i reads w[i % len], one division, no span.
            [] | [Run { inner: 1, .. }] => Factors::Cyclic(w.data()),
            _ => {
                let span = runs[0].inner;
                Factors::Strided(Strided {
                    w: w.data(),
                    runs,
                    span,
                    // No span read yet: no element is at or past usize::MAX, so the first misses.
                    last: Cell::new((usize::MAX, 0.0)),
                })
            }
        })
    }

    /// The factor of element `i`, `None` without factors.
    pub(super) fn at<S: Scalar>(&self, i: usize) -> Option<S> {
        match self {
            Factors::None => None,
            Factors::Cyclic(w) => Some(S::from_f64(w[i % w.len()])),
            Factors::Strided(strided) => Some(S::from_f64(strided.at(i))),
        }
    }

    /// `v` times the factor of element `i`; `v` itself without factors.
    pub(super) fn scale<S: Scalar>(&self, i: usize, v: S) -> S {
        match self.at::<S>(i) {
            Some(f) => v * f,
            None => v,
        }
    }
}

/// `log(1 + exp(-x))`, finite for every finite x.
fn softplus_of_negative<S: Scalar>(x: S) -> S {
    let relu = if x < S::ZERO { -x } else { S::ZERO };
    relu + (-x.abs()).exp().ln_1p()
}

/// The loss of logit `x` and target `y`: `(1 - y) x + (1 + (p - 1) y) log(1 + exp(-x))`, which
/// without a positive weight is `max(x, 0) - x y + log(1 + exp(-|x|))`.
pub(super) fn loss<S: Scalar>(x: S, y: S, p: Option<S>) -> S {
    match p {
        None => {
            let relu = if x > S::ZERO { x } else { S::ZERO };
            relu - x * y + (-x.abs()).exp().ln_1p()
        }
        Some(p) => (S::ONE - y) * x + (S::ONE + (p - S::ONE) * y) * softplus_of_negative(x),
    }
}

/// d loss / d x: `(1 + (p - 1) y) sigmoid(x) - p y`, `sigmoid(x) - y` without a positive weight.
pub(super) fn d_logit<S: Scalar>(x: S, y: S, p: Option<S>) -> S {
    match p {
        None => sigmoid(x) - y,
        Some(p) => (S::ONE + (p - S::ONE) * y) * sigmoid(x) - p * y,
    }
}

/// d loss / d y: `(p - 1) log(1 + exp(-x)) - x`, `-x` without a positive weight.
pub(super) fn d_target<S: Scalar>(x: S, p: Option<S>) -> S {
    match p {
        None => -x,
        Some(p) => (p - S::ONE) * softplus_of_negative(x) - x,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tapegrad_tensor::kernels::broadcast_to;

    /// An input shape and a factor shape that broadcasts into it: some of its trailing axes,
    /// each the input's or 1.
    fn shapes() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
        prop::collection::vec(0usize..5, 0..5)
            .prop_flat_map(|x| {
                let rank = x.len();
                (
                    Just(x),
                    0..=rank,
                    prop::collection::vec(any::<bool>(), rank),
                )
            })
            .prop_map(|(x, rank, keep)| {
                let w = x[x.len() - rank..]
                    .iter()
                    .zip(&keep)
                    .map(|(&d, &k)| if k { d } else { 1 })
                    .collect();
                (x, w)
            })
    }

    proptest! {
        /// Every element reads the value a copy broadcast to the input holds there, read in
        /// order (the loops' way, which the remembered span serves), backwards and striding.
        #[test]
        fn factors_read_what_the_broadcast_copy_holds((x, w) in shapes()) {
            let w_shape = Shape::new(w.clone()).unwrap();
            let x_shape = Shape::new(x.clone()).unwrap();
            let values = (0..w_shape.numel()).map(|v| v as f64 * 1.5 - 2.0).collect();
            let w = Tensor::from_shape(w_shape, values).unwrap();
            let factors = Factors::new("test", "weight", Some(&w), &x_shape).unwrap();
            let copy = broadcast_to(&w, &x_shape).unwrap();
            let n = copy.numel();
            let orders = [
                (0..n).collect::<Vec<_>>(),
                (0..n).rev().collect(),
                (0..n).map(|i| i * 7 % n.max(1)).collect(),
            ];
            for i in orders.into_iter().flatten() {
                let read = factors.at::<f64>(i);
                prop_assert_eq!(read, Some(copy.data()[i]), "{:?} into {:?}, element {}", w.dims(), x, i);
            }
        }
    }

    #[test]
    fn adjacent_axes_merge_into_one_run() {
        let one = runs(
            &Shape::new([3, 1, 1]).unwrap(),
            &Shape::new([2, 3, 4, 5]).unwrap(),
        );
        let run = |inner, len, stride| Run { inner, len, stride };
        assert_eq!(one.as_slice(), [run(20, 3, 1)]);
        let two = runs(
            &Shape::new([2, 1, 4, 5]).unwrap(),
            &Shape::new([2, 3, 4, 5]).unwrap(),
        );
        assert_eq!(two.as_slice(), [run(1, 20, 1), run(60, 2, 20)]);
    }
}
