//! binary_cross_entropy_with_logits per element, with PyTorch's optional `pos_weight` (the weight
//! of the positive term, of a shape that broadcasts into the input's) and `weight`
//! (a factor per element, broadcast to the input): the loss and its two partial derivatives, each
//! stable for every finite logit.

use tapegrad_tensor::kernels::broadcast_to;
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
    /// At most one axis: element `i` reads `w[i % w.len()]`, without a copy.
    Cyclic(&'a [f64]),
    /// Any other shape that broadcasts into the input's, broadcast to it.
    Full(Tensor<f64>),
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
        Ok(match factors {
            None => Factors::None,
            Some(w) if w.rank() <= 1 => Factors::Cyclic(w.data()),
            Some(w) => Factors::Full(broadcast_to(w, shape)?),
        })
    }

    /// The factor of element `i`, `None` without factors.
    pub(super) fn at<S: Scalar>(&self, i: usize) -> Option<S> {
        match self {
            Factors::None => None,
            Factors::Cyclic(w) => Some(S::from_f64(w[i % w.len()])),
            Factors::Full(t) => Some(S::from_f64(t.data()[i])),
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
