//! `Linear`: `y = x W^T + b` with `W` of shape `[out, in]`, initialised as PyTorch's `nn.Linear`:
//! weight `kaiming_uniform_(a = sqrt(5))` (that is `U(-1/sqrt(in), 1/sqrt(in))`), bias
//! `U(-1/sqrt(in), 1/sqrt(in))`.

use super::{Builder, Ctx};
use crate::init::Init;
use crate::params::ParamId;
use tapegrad_core::Result;
use tapegrad_core::Var;
use tapegrad_tensor::Scalar;

/// A fully connected layer.
#[derive(Debug, Clone)]
pub struct Linear {
    pub in_features: usize,
    pub out_features: usize,
    weight: ParamId,
    bias: Option<ParamId>,
}

impl Linear {
    /// A layer with PyTorch's default initialisation; tensors named `prefix.weight`, `prefix.bias`.
    pub fn new<S: Scalar>(
        b: &mut Builder<'_, S>,
        prefix: &str,
        in_features: usize,
        out_features: usize,
        bias: bool,
    ) -> Result<Self> {
        let bound = 1.0 / (in_features.max(1) as f64).sqrt();
        Self::with_init(
            b,
            prefix,
            in_features,
            out_features,
            Init::KaimingUniform { a: 5f64.sqrt() },
            bias.then_some(Init::Uniform {
                low: -bound,
                high: bound,
            }),
        )
    }

    /// A layer with chosen initialisers (`bias_init = None`: no bias).
    pub fn with_init<S: Scalar>(
        b: &mut Builder<'_, S>,
        prefix: &str,
        in_features: usize,
        out_features: usize,
        weight_init: Init,
        bias_init: Option<Init>,
    ) -> Result<Self> {
        let weight = b.trainable(prefix, "weight", &[out_features, in_features], weight_init)?;
        let bias = match bias_init {
            Some(init) => Some(b.trainable(prefix, "bias", &[out_features], init)?),
            None => None,
        };
        Ok(Linear {
            in_features,
            out_features,
            weight,
            bias,
        })
    }

    /// A layer without bias whose weight is an existing `[out, in]` tensor of the model (weight
    /// tying: a language model's head reading its token embedding).
    pub fn tied(weight: ParamId, in_features: usize, out_features: usize) -> Self {
        Linear {
            in_features,
            out_features,
            weight,
            bias: None,
        }
    }

    /// `x W^T + b` for `x` of shape `[..., in]`.
    pub fn forward<S: Scalar>(&self, ctx: &mut Ctx<'_, S>, x: Var) -> Result<Var> {
        let w = ctx.param(self.weight);
        let b = self.bias.map(|id| ctx.param(id));
        ctx.session().linear(x, w, b)
    }
}
