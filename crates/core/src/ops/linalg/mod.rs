//! Linear algebra: matmul (PyTorch semantics, batch broadcasting), linear (x W^T + b), transpose
//! and permute, each a struct of this folder; `LinalgOp` dispatches to them. VJPs use transposed
//! GEMMs and never materialise a transposed copy of an operand.

mod axes;
mod products;

pub use axes::{Permute, Transpose};
pub use products::{Linear, Matmul};

use super::{op_family, Arity, Forward, Grads, LinearVjp, OpRules, Saves, VjpContext};
use tapegrad_tensor::{Result, Scalar, Shape, Tensor};

op_family!($
/// Linear-algebra and axis-reordering ops, each variant holding its op's struct.
pub enum LinalgOp {
    Matmul,
    Linear,
    Transpose,
    Permute,
});
