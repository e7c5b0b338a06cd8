//! Linear algebra: matmul (PyTorch semantics, batch broadcasting), linear (x W^T + b), transpose
//! and permute. VJPs use transposed GEMMs and never materialise a transposed copy of an operand.

use super::{Arity, Forward, OpRules, Saves, VjpContext};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// Linear-algebra and axis-reordering ops.
#[derive(Debug, Clone, PartialEq)]
pub enum LinalgOp {
    /// `a @ b` (torch.matmul).
    Matmul,
    /// `x @ w^T (+ b)`: arguments (x, w) or (x, w, b), as torch.nn.functional.linear.
    Linear { bias: bool },
    /// Swaps two axes.
    Transpose { dim0: isize, dim1: isize },
    /// Output axis i is input axis dims[i].
    Permute { dims: Vec<isize> },
}

use LinalgOp as L;

impl OpRules for LinalgOp {
    fn name(&self) -> &'static str {
        match self {
            L::Matmul => "matmul",
            L::Linear { .. } => "linear",
            L::Transpose { .. } => "transpose",
            L::Permute { .. } => "permute",
        }
    }

    fn arity(&self) -> Arity {
        match self {
            L::Matmul => Arity::Exact(2),
            L::Linear { bias } => Arity::Exact(if *bias { 3 } else { 2 }),
            L::Transpose { .. } | L::Permute { .. } => Arity::Exact(1),
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

impl std::fmt::Display for LinalgOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
