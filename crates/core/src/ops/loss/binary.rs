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

/// `pos_weight` checked against the input's shape, read per element.
pub(super) enum PosWeight<'a> {
    /// No positive weight.
    None,
    /// A weight of at most one axis: element `i` of a row-major input reads `w[i % w.len()]`
    /// (one per class along the last axis, or one for all), without a copy.
    Cyclic(&'a [f64]),
    /// Any other shape that broadcasts into the input's, broadcast to it.
    Full(Tensor<f64>),
}

impl<'a> PosWeight<'a> {
    /// PyTorch broadcasts `pos_weight` with the target into the loss, which it cannot enlarge:
    /// its shape must broadcast into the input's (no more axes, trailing axes equal or 1), as
    /// `weight`'s. So [C] weighs classes along the last axis, [C, 1, 1] along the third-to-last
    /// (PyTorch's recommendation for a [C, H, W] target), [1] or a 0-d one weighs all.
    pub(super) fn new(
        op: &'static str,
        pos_weight: Option<&'a Tensor<f64>>,
        shape: &Shape,
    ) -> Result<Self> {
        let Some(w) = pos_weight else {
            return Ok(PosWeight::None);
        };
        if !broadcasts_into(w.shape(), shape) {
            let mut msg = format!(
                "pos_weight of shape {} does not broadcast to the input's shape {shape}",
                w.shape()
            );
            if w.rank() == 1 {
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
            return Err(Error::invalid(op, msg));
        }
        if w.rank() <= 1 {
            Ok(PosWeight::Cyclic(w.data()))
        } else {
            Ok(PosWeight::Full(broadcast_to(w, shape)?))
        }
    }

    /// The weight of element `i` of a row-major input, `None` without `pos_weight`.
    pub(super) fn at<S: Scalar>(&self, i: usize) -> Option<S> {
        match self {
            PosWeight::None => None,
            PosWeight::Cyclic(w) => Some(S::from_f64(w[i % w.len()])),
            PosWeight::Full(t) => Some(S::from_f64(t.data()[i])),
        }
    }
}

/// PyTorch's `weight`, broadcast to the input: one factor per element of every loss and partial.
/// A constant attribute, as in PyTorch (whose autograd does not differentiate `weight` either).
pub(super) struct Rescale {
    factors: Option<Tensor<f64>>,
}

impl Rescale {
    /// Whether `weight` fits the input's `shape`: its shape must broadcast into the input's
    /// (trailing axes equal or 1, no more axes), as PyTorch requires (it rescales the loss in
    /// place, so the weight cannot enlarge it). Allocates nothing.
    pub(super) fn check(
        op: &'static str,
        weight: Option<&Tensor<f64>>,
        shape: &Shape,
    ) -> Result<()> {
        let Some(w) = weight else {
            return Ok(());
        };
        if broadcasts_into(w.shape(), shape) {
            Ok(())
        } else {
            Err(Error::invalid(
                op,
                format!(
                    "weight of shape {} does not broadcast to the input's shape {shape}",
                    w.shape()
                ),
            ))
        }
    }

    /// `weight` checked against the input's `shape` and broadcast to it.
    pub(super) fn new(
        op: &'static str,
        weight: Option<&Tensor<f64>>,
        shape: &Shape,
    ) -> Result<Self> {
        Self::check(op, weight, shape)?;
        Ok(Rescale {
            factors: weight.map(|w| broadcast_to(w, shape)).transpose()?,
        })
    }

    /// `v` times the factor of element `i`; `v` itself without a weight.
    pub(super) fn apply<S: Scalar>(&self, i: usize, v: S) -> S {
        match &self.factors {
            None => v,
            Some(f) => v * S::from_f64(f.data()[i]),
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
