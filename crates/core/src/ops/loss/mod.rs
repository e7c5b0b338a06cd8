//! Loss functions with PyTorch's definitions and reductions: mse_loss, cross_entropy from logits
//! with integer class labels, binary_cross_entropy_with_logits (with PyTorch's `pos_weight` and
//! per-element `weight`, constant attributes) and nll_loss. Class labels are
//! attributes (not differentiable), one per position of a (C), (N, C) or (N, C, d1, ..., dk)
//! input; an out-of-range label is an error naming it and the bound. cross_entropy_probs is
//! PyTorch's cross_entropy with a probability target, a second differentiable argument. Each is
//! a struct of this folder; `LossOp` dispatches to them.

mod binary;
mod class_options;
mod cross_entropy_probs;
mod label_losses;
mod layout;
mod pointwise;
mod reduction;
mod soft_targets;

pub use cross_entropy_probs::CrossEntropyProbs;
pub use label_losses::{CrossEntropy, NllLoss};
pub use pointwise::{BinaryCrossEntropyWithLogits, MseLoss};
pub use reduction::Reduction;

use super::{op_family, s, Arity, Aux, Forward, Grads, LinearVjp, OpRules, Saves, VjpContext};
use reduction::Weights;
use std::sync::Arc;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// PyTorch's keyword arguments of `cross_entropy` and `nll_loss`, for the session's
/// `cross_entropy_with` and `nll_loss_with`. The default is PyTorch's: mean, no class weights, no
/// ignored label, no smoothing.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassLossOptions {
    pub reduction: Reduction,
    /// One weight per class.
    pub weight: Option<Vec<f64>>,
    /// Samples with this label give 0 and do not count in the mean. Any integer, as PyTorch's
    /// (whose default, -100, marks padding); `None` ignores nothing, so a negative label is then
    /// an error.
    pub ignore_index: Option<i64>,
    /// cross_entropy only, in [0, 1].
    pub label_smoothing: f64,
}

impl Default for ClassLossOptions {
    fn default() -> Self {
        ClassLossOptions {
            reduction: Reduction::Mean,
            weight: None,
            ignore_index: None,
            label_smoothing: 0.0,
        }
    }
}

op_family!($
/// Loss functions, each variant holding its op's struct.
pub enum LossOp {
    MseLoss,
    CrossEntropy,
    BinaryCrossEntropyWithLogits,
    NllLoss,
    CrossEntropyProbs,
});

impl LossOp {
    /// cross_entropy with none of PyTorch's options (no class weights, no ignored label, no
    /// smoothing): every label a class index.
    pub fn cross_entropy(targets: Arc<Vec<usize>>, reduction: Reduction) -> LossOp {
        LossOp::CrossEntropy(CrossEntropy {
            targets: class_labels(&targets),
            reduction,
            weight: None,
            ignore_index: None,
            label_smoothing: 0.0,
        })
    }

    /// nll_loss with no class weights and no ignored label.
    pub fn nll_loss(targets: Arc<Vec<usize>>, reduction: Reduction) -> LossOp {
        LossOp::NllLoss(NllLoss {
            targets: class_labels(&targets),
            reduction,
            weight: None,
            ignore_index: None,
        })
    }

    /// binary_cross_entropy_with_logits with PyTorch's `weight` (its shape must broadcast into
    /// the input's) and optional `pos_weight`.
    pub fn bce_with_logits_weighted(
        reduction: Reduction,
        weight: Tensor<f64>,
        pos_weight: Option<Tensor<f64>>,
    ) -> LossOp {
        LossOp::BinaryCrossEntropyWithLogits(BinaryCrossEntropyWithLogits {
            reduction,
            pos_weight: pos_weight.map(Arc::new),
            weight: Some(Arc::new(weight)),
        })
    }

    /// binary_cross_entropy_with_logits without a positive weight.
    pub fn bce_with_logits(reduction: Reduction) -> LossOp {
        LossOp::BinaryCrossEntropyWithLogits(BinaryCrossEntropyWithLogits {
            reduction,
            pos_weight: None,
            weight: None,
        })
    }
}

/// Class labels as PyTorch's int64 targets hold them, from any integer type a caller has.
pub trait ClassLabel: Copy {
    /// The label as an `i64`; a `usize` beyond `i64::MAX` becomes `i64::MAX` (out of range for
    /// any input, so still an error naming it).
    fn label(self) -> i64;
}

impl ClassLabel for i64 {
    fn label(self) -> i64 {
        self
    }
}

impl ClassLabel for i32 {
    fn label(self) -> i64 {
        i64::from(self)
    }
}

impl ClassLabel for usize {
    fn label(self) -> i64 {
        i64::try_from(self).unwrap_or(i64::MAX)
    }
}

impl ClassLabel for u32 {
    fn label(self) -> i64 {
        i64::from(self)
    }
}

/// `labels` as the class-label losses store them.
pub fn class_labels<L: ClassLabel>(labels: &[L]) -> Arc<Vec<i64>> {
    Arc::new(labels.iter().map(|&l| l.label()).collect())
}

/// Two arguments that must have one shape (PyTorch broadcasts with a warning; we refuse).
fn same_shape(op: &'static str, a: &Shape, b: &Shape) -> Result<()> {
    if a == b {
        Ok(())
    } else {
        Err(Error::ShapeMismatch {
            op,
            expected: Box::new(a.clone()),
            found: Box::new(b.clone()),
        })
    }
}

fn arg<'a, T>(op: &'static str, args: &[&'a T], i: usize, arity: usize) -> Result<&'a T> {
    if args.len() != arity {
        return Err(Error::Arity {
            op,
            expected: arity,
            found: args.len(),
        });
    }
    Ok(args[i])
}

/// The input and its tangent, of one shape, for a JVP of `arity` arguments.
fn input_and_tangent<'a, S: Scalar>(
    op: &'static str,
    xs: &[&'a Tensor<S>],
    ts: &[&'a Tensor<S>],
    arity: usize,
) -> Result<(&'a Tensor<S>, &'a Tensor<S>)> {
    let x = arg(op, xs, 0, arity)?;
    let tx = arg(op, ts, 0, arity)?;
    same_shape(op, x.shape(), tx.shape())?;
    Ok((x, tx))
}

/// The rows cross_entropy's forward leaves in its aux data: the softmax for class labels, the
/// log-softmax for probability targets.
fn probabilities<'a, S: Scalar>(
    op: &'static str,
    aux: &'a Aux<S>,
    shape: &Shape,
) -> Result<&'a Tensor<S>> {
    match aux {
        Aux::Tensors(ts) if ts.len() == 1 && ts[0].shape() == shape => Ok(&ts[0]),
        _ => Err(Error::invalid(
            op,
            format!("the softmax rows of the input (shape {shape}) were not saved"),
        )),
    }
}

/// `[a, b, ...]`, the first eight items and then the count (`[1, 2, ... 40 labels]`).
fn write_list<T: std::fmt::Display>(
    f: &mut std::fmt::Formatter<'_>,
    items: &[T],
    what: &str,
) -> std::fmt::Result {
    const SHOWN: usize = 8;
    write!(f, "[")?;
    for (i, v) in items.iter().take(SHOWN).enumerate() {
        if i > 0 {
            write!(f, ", ")?;
        }
        write!(f, "{v}")?;
    }
    if items.len() > SHOWN {
        write!(f, ", ... {} {what}", items.len())?;
    }
    write!(f, "]")
}

/// A factor tensor (`pos_weight`, `weight`): its values, and its shape unless it has one axis.
fn write_factors(f: &mut std::fmt::Formatter<'_>, w: &Tensor<f64>) -> std::fmt::Result {
    write_list(f, w.data(), "weights")?;
    if w.rank() != 1 {
        write!(f, " of shape {}", w.shape())?;
    }
    Ok(())
}
