//! Linear algebra: matmul (PyTorch semantics, batch broadcasting), linear (x W^T + b), transpose
//! and permute, each a struct of this folder; `LinalgOp` dispatches to them. VJPs use transposed
//! GEMMs and never materialise a transposed copy of an operand.

mod axes;
mod products;

pub use axes::{Permute, Transpose};
pub use products::{Linear, Matmul};

use super::{family_dispatch, Arity, Forward, Grads, LinearVjp, OpRules, Saves, VjpContext};
use tapegrad_tensor::{Result, Scalar, Shape, Tensor};

/// Linear-algebra and axis-reordering ops, each variant holding its op's struct.
#[derive(Debug, Clone, PartialEq)]
pub enum LinalgOp {
    Matmul(Matmul),
    Linear(Linear),
    Transpose(Transpose),
    Permute(Permute),
}

macro_rules! each {
    ($self:expr, $op:ident => $body:expr) => {
        match $self {
            LinalgOp::Matmul($op) => $body,
            LinalgOp::Linear($op) => $body,
            LinalgOp::Transpose($op) => $body,
            LinalgOp::Permute($op) => $body,
        }
    };
}

family_dispatch!(LinalgOp, each);
