//! Neural-network operations with PyTorch's names, layouts (NCHW, batch-first) and argument
//! conventions: convolution, pooling, normalisation, embedding and indexing, dropout, attention.
//! One file per family; `NnOp` dispatches to the op structs, each of which implements `OpRules`.

mod attention;
mod conv;
mod dropout;
mod index;
mod norm;
mod pad;
mod pool;
mod qkv_attention;

pub use attention::ScaledDotProductAttention;
pub use conv::{Conv1d, Conv2d};
pub use dropout::{dropout_mask, Dropout};
pub use index::{Embedding, Gather, IndexSelect, IndexTensor, ScatterAdd, Select};
pub use norm::{batch_stats, BatchNorm, BatchStats, GroupNorm, LayerNorm};
pub use pad::{NamedPadding, PaddingMode};
pub use pool::{AdaptiveAvgPool2d, AvgPool2d, MaxPool2d};
pub use qkv_attention::QkvAttention;

use super::{op_family, Arity, Forward, Grads, LinearVjp, OpRules, Saves, VjpContext};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

op_family!($
/// Neural-network operations; each variant holds the op's attributes.
pub enum NnOp {
    Conv1d,
    Conv2d,
    MaxPool2d,
    AvgPool2d,
    AdaptiveAvgPool2d,
    LayerNorm,
    BatchNorm,
    GroupNorm,
    Embedding,
    IndexSelect,
    Gather,
    ScatterAdd,
    Select,
    Dropout,
    ScaledDotProductAttention,
    QkvAttention,
});

impl From<NnOp> for super::Op {
    fn from(op: NnOp) -> super::Op {
        super::Op::Nn(Box::new(op))
    }
}

/// `1 + [weight] + [bias]`-style arity of ops with optional trailing arguments.
fn arity_with(base: usize, optional: &[bool]) -> Arity {
    Arity::Exact(base + optional.iter().filter(|&&b| b).count())
}

/// An error unless `eps` is finite and non-negative (a negative eps can make `var + eps` negative).
fn check_eps(op: &'static str, eps: f64) -> Result<()> {
    if eps.is_finite() && eps >= 0.0 {
        Ok(())
    } else {
        Err(Error::invalid(
            op,
            format!("eps must be finite and non-negative, got {eps}"),
        ))
    }
}

/// An error unless `shape` equals `expected`, naming the argument.
fn expect_shape(op: &'static str, what: &str, shape: &Shape, expected: &Shape) -> Result<()> {
    if shape == expected {
        Ok(())
    } else {
        Err(Error::invalid(
            op,
            format!("{what} must have shape {expected}, found {shape}"),
        ))
    }
}

/// `Some(f())` when argument `i` needs a gradient.
fn when<S>(
    ctx: &VjpContext<'_, S>,
    i: usize,
    f: impl FnOnce() -> Result<Tensor<S>>,
) -> Result<Option<Tensor<S>>>
where
    S: Scalar,
{
    if ctx.needs(i) {
        f().map(Some)
    } else {
        Ok(None)
    }
}

/// Converts an index for an `Error::Index` (indices beyond `i64` saturate).
fn index_i64(i: usize) -> i64 {
    i64::try_from(i).unwrap_or(i64::MAX)
}
