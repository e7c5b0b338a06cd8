//! Loss functions with PyTorch's definitions and reductions: mse_loss, cross_entropy from logits
//! with integer class labels, binary_cross_entropy_with_logits and nll_loss. Class labels are
//! attributes (not differentiable); an out-of-range label is an error naming it and the bound.

use super::{Arity, Forward, OpRules, Saves, VjpContext};
use std::sync::Arc;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// How a loss reduces over elements: PyTorch's `reduction` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    None,
    Mean,
    Sum,
}

/// Loss functions.
#[derive(Debug, Clone, PartialEq)]
pub enum LossOp {
    /// (input - target)^2, both arguments differentiable, same shape.
    MseLoss { reduction: Reduction },
    /// Logits (N, C) or (C) and one class label per row.
    CrossEntropy {
        targets: Arc<Vec<usize>>,
        reduction: Reduction,
    },
    /// Logits and targets of one shape, both differentiable.
    BinaryCrossEntropyWithLogits { reduction: Reduction },
    /// Log-probabilities (N, C) or (C) and one class label per row: -input[n, target[n]].
    NllLoss {
        targets: Arc<Vec<usize>>,
        reduction: Reduction,
    },
}

use LossOp as Lo;

impl OpRules for LossOp {
    fn name(&self) -> &'static str {
        match self {
            Lo::MseLoss { .. } => "mse_loss",
            Lo::CrossEntropy { .. } => "cross_entropy",
            Lo::BinaryCrossEntropyWithLogits { .. } => "binary_cross_entropy_with_logits",
            Lo::NllLoss { .. } => "nll_loss",
        }
    }

    fn arity(&self) -> Arity {
        match self {
            Lo::MseLoss { .. } | Lo::BinaryCrossEntropyWithLogits { .. } => Arity::Exact(2),
            Lo::CrossEntropy { .. } | Lo::NllLoss { .. } => Arity::Exact(1),
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

impl std::fmt::Display for LossOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
