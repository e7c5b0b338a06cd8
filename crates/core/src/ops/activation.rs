//! Activation functions: relu, leaky_relu, sigmoid, tanh, gelu (exact erf form and tanh
//! approximation), softplus and silu, with PyTorch's definitions and gradient conventions.

use super::{Arity, Forward, OpRules, Saves, VjpContext};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// Which GELU formula: PyTorch's `approximate="none"` (erf) or `"tanh"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GeluApproximate {
    None,
    Tanh,
}

/// Elementwise activation functions (one argument, output of the same shape).
#[derive(Debug, Clone, PartialEq)]
pub enum ActivationOp {
    /// max(x, 0); gradient 0 at x = 0 (PyTorch).
    Relu,
    /// x for x > 0, negative_slope * x otherwise.
    LeakyRelu {
        negative_slope: f64,
    },
    Sigmoid,
    Tanh,
    Gelu {
        approximate: GeluApproximate,
    },
    /// (1/beta) * log(1 + exp(beta * x)), linear above `threshold` (PyTorch's defaults: 1, 20).
    Softplus {
        beta: f64,
        threshold: f64,
    },
    /// x * sigmoid(x).
    Silu,
}

use ActivationOp as A;

impl OpRules for ActivationOp {
    fn name(&self) -> &'static str {
        match self {
            A::Relu => "relu",
            A::LeakyRelu { .. } => "leaky_relu",
            A::Sigmoid => "sigmoid",
            A::Tanh => "tanh",
            A::Gelu { .. } => "gelu",
            A::Softplus { .. } => "softplus",
            A::Silu => "silu",
        }
    }

    fn arity(&self) -> Arity {
        Arity::Exact(1)
    }

    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        Ok(inputs[0].clone())
    }

    fn saves(&self) -> Saves {
        Saves::inputs(&[0])
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

impl std::fmt::Display for ActivationOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
