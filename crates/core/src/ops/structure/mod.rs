//! Structural ops that move or copy elements: reshape (one -1 inferred), flatten, broadcast_to,
//! concat along an axis and slice with Python semantics (negative bounds count from the end).
//! Each is a struct of this folder; `StructureOp` dispatches to them. All are linear, so none
//! keeps a tensor (`linear_shell!`): their VJPs and JVPs need only shapes and attributes.

mod join;
mod shape;

pub use join::{Concat, Slice};
pub use shape::{BroadcastTo, Flatten, Reshape};

use super::{op_family, Arity, Forward, Grads, LinearVjp, OpRules, Saves, VjpContext};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

op_family!($
/// Shape-changing and copying ops, each variant holding its op's struct.
pub enum StructureOp {
    Reshape,
    Flatten,
    BroadcastTo,
    Concat,
    Slice,
});

/// Normalises a signed axis; a rank-0 shape accepts 0 and -1 when `scalar_ok` (torch.flatten).
fn resolve_axis(
    op: &'static str,
    what: &str,
    axis: isize,
    shape: &Shape,
    scalar_ok: bool,
) -> Result<usize> {
    let rank = if scalar_ok {
        shape.rank().max(1)
    } else {
        shape.rank()
    };
    let r = rank as isize;
    let a = if axis < 0 {
        axis.saturating_add(r)
    } else {
        axis
    };
    if a < 0 || a >= r {
        return Err(Error::invalid(
            op,
            format!("{what} {axis} is out of range for input of shape {shape}"),
        ));
    }
    Ok(a as usize)
}
