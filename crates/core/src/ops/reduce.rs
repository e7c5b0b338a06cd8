//! Reductions over chosen axes (sum, mean, amax with keepdim or not) and the softmax family along
//! one axis. `axes: None` reduces every axis; an empty list reduces none.

use super::{Arity, Forward, OpRules, Saves, VjpContext};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// Reductions and softmax-like ops (one argument).
#[derive(Debug, Clone, PartialEq)]
pub enum ReduceOp {
    Sum {
        axes: Option<Vec<isize>>,
        keepdim: bool,
    },
    Mean {
        axes: Option<Vec<isize>>,
        keepdim: bool,
    },
    /// Maximum over axes; tied maxima share the gradient equally.
    Amax {
        axes: Option<Vec<isize>>,
        keepdim: bool,
    },
    Softmax {
        axis: isize,
    },
    LogSoftmax {
        axis: isize,
    },
}

use ReduceOp as R;

impl OpRules for ReduceOp {
    fn name(&self) -> &'static str {
        match self {
            R::Sum { .. } => "sum",
            R::Mean { .. } => "mean",
            R::Amax { .. } => "amax",
            R::Softmax { .. } => "softmax",
            R::LogSoftmax { .. } => "log_softmax",
        }
    }

    fn arity(&self) -> Arity {
        Arity::Exact(1)
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

impl std::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
