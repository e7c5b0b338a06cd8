//! Activation layers (no parameters): ReLU, leaky ReLU, tanh, sigmoid, GELU and SiLU, with
//! PyTorch's definitions (see the ops layer).

use super::Ctx;
use serde::{Deserialize, Serialize};
use tapegrad_core::Result;
use tapegrad_core::Var;
use tapegrad_tensor::Scalar;

/// An elementwise nonlinearity.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    Relu,
    LeakyRelu {
        negative_slope: f64,
    },
    Tanh,
    Sigmoid,
    /// GELU, exact (erf) form.
    Gelu,
    Silu,
}

impl Activation {
    /// Applies the nonlinearity.
    pub fn forward<S: Scalar>(&self, ctx: &mut Ctx<'_, S>, x: Var) -> Result<Var> {
        let s = ctx.session();
        match *self {
            Activation::Relu => s.relu(x),
            Activation::LeakyRelu { negative_slope } => s.leaky_relu(x, negative_slope),
            Activation::Tanh => s.tanh(x),
            Activation::Sigmoid => s.sigmoid(x),
            Activation::Gelu => s.gelu(x, false),
            Activation::Silu => s.silu(x),
        }
    }

    /// PyTorch's class name.
    pub fn name(&self) -> &'static str {
        match self {
            Activation::Relu => "ReLU",
            Activation::LeakyRelu { .. } => "LeakyReLU",
            Activation::Tanh => "Tanh",
            Activation::Sigmoid => "Sigmoid",
            Activation::Gelu => "GELU",
            Activation::Silu => "SiLU",
        }
    }
}
