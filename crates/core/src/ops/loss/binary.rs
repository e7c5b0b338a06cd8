//! binary_cross_entropy_with_logits per element, with PyTorch's optional `pos_weight` (the weight
//! of the positive term, one per class along the input's last axis, or one for all) and `weight`
//! (a factor per element, broadcast to the input): the loss and its two partial derivatives, each
//! stable for every finite logit.

use std::sync::Arc;
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

/// `pos_weight` checked against the input's shape, read per element.
pub(super) struct PosWeight<'a> {
    weights: Option<&'a [f64]>,
}

impl<'a> PosWeight<'a> {
    /// PyTorch broadcasts `pos_weight` against the target; tapegrad takes the usual forms only:
    /// one weight per class along the last axis, or a single weight.
    pub(super) fn new(
        op: &'static str,
        pos_weight: &'a Option<Arc<Vec<f64>>>,
        shape: &Shape,
    ) -> Result<Self> {
        if let Some(w) = pos_weight {
            let Some(&last) = shape.dims().last() else {
                // PyTorch 2.15 rejects it too (its (1) broadcast does not fit the 0-d output).
                return Err(Error::invalid(
                    op,
                    "pos_weight needs an input with a class axis, found a 0-d input",
                ));
            };
            if w.len() != last && w.len() != 1 {
                return Err(Error::invalid(
                    op,
                    format!(
                        "pos_weight must have one entry per class along the last axis of the \
                         input ({last} for shape {shape}) or a single one, found {} entries",
                        w.len()
                    ),
                ));
            }
        }
        Ok(PosWeight {
            weights: pos_weight.as_deref().map(Vec::as_slice),
        })
    }

    /// The weight of element `i` of a row-major input, `None` without `pos_weight`.
    pub(super) fn at<S: Scalar>(&self, i: usize) -> Option<S> {
        self.weights.map(|w| S::from_f64(w[i % w.len()]))
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
        let fits = w.rank() <= shape.rank()
            && w.dims()
                .iter()
                .rev()
                .zip(shape.dims().iter().rev())
                .all(|(&a, &b)| a == b || a == 1);
        if fits {
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
