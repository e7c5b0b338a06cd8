//! Structural ops that move or copy elements: reshape (one -1 inferred), flatten, broadcast_to,
//! concat along an axis and slice with Python semantics (negative bounds count from the end).

use super::{Arity, Forward, OpRules, Saves, VjpContext};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// Shape-changing and copying ops.
#[derive(Debug, Clone, PartialEq)]
pub enum StructureOp {
    /// New shape with the same element count; at most one -1, which is inferred.
    Reshape { shape: Vec<isize> },
    /// Merges axes start_dim..=end_dim into one (torch.flatten).
    Flatten { start_dim: isize, end_dim: isize },
    /// Broadcasts to a shape (torch.broadcast_to).
    BroadcastTo { shape: Vec<usize> },
    /// Concatenates its arguments along `axis` (torch.cat).
    Concat { axis: isize },
    /// Elements start, start + step, ... below end along `axis`, Python slice semantics.
    Slice {
        axis: isize,
        start: isize,
        end: isize,
        step: usize,
    },
}

use StructureOp as St;

impl OpRules for StructureOp {
    fn name(&self) -> &'static str {
        match self {
            St::Reshape { .. } => "reshape",
            St::Flatten { .. } => "flatten",
            St::BroadcastTo { .. } => "broadcast_to",
            St::Concat { .. } => "concat",
            St::Slice { .. } => "slice",
        }
    }

    fn arity(&self) -> Arity {
        match self {
            St::Concat { .. } => Arity::AtLeast(1),
            _ => Arity::Exact(1),
        }
    }

    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        Ok(inputs[0].clone())
    }

    fn saves(&self) -> Saves {
        Saves::NOTHING
    }

    fn forward<S: Scalar>(&self, _x: &[&Tensor<S>]) -> Result<Forward<S>> {
        Err(Error::invalid(self.name(), "not implemented yet"))
    }

    fn vjp<S: Scalar>(
        &self,
        _ctx: &VjpContext<'_, S>,
        _cot: &Tensor<S>,
    ) -> Result<Vec<Option<Tensor<S>>>> {
        Err(Error::invalid(self.name(), "not implemented yet"))
    }

    fn jvp<S: Scalar>(
        &self,
        _x: &[&Tensor<S>],
        _out: &Forward<S>,
        _t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        Err(Error::invalid(self.name(), "not implemented yet"))
    }
}

impl std::fmt::Display for StructureOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
