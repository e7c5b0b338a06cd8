//! `Embedding`: a lookup table `[num_embeddings, dim]` initialised `N(0, 1)` as PyTorch's
//! `nn.Embedding`. Inside a `Sequential` its input is a float tensor of whole numbers (the
//! indices); each must be an integer in `0..num_embeddings`.

use super::{Builder, Ctx};
use crate::init::Init;
use crate::params::ParamId;
use tapegrad_core::ops::nn::IndexTensor;
use tapegrad_core::Var;
use tapegrad_tensor::{Error, Result, Scalar};

/// A table of learned vectors indexed by integers.
#[derive(Debug, Clone)]
pub struct Embedding {
    pub num_embeddings: usize,
    pub dim: usize,
    weight: ParamId,
}

impl Embedding {
    /// A table with PyTorch's `N(0, 1)` initialisation.
    pub fn new<S: Scalar>(
        b: &mut Builder<'_, S>,
        prefix: &str,
        num_embeddings: usize,
        dim: usize,
    ) -> Result<Self> {
        Ok(Embedding {
            num_embeddings,
            dim,
            weight: b.trainable(
                prefix,
                "weight",
                &[num_embeddings, dim],
                Init::Normal {
                    mean: 0.0,
                    std: 1.0,
                },
            )?,
        })
    }

    /// Looks up the rows named by the values of `x` (any shape): the result has shape
    /// `x.shape + [dim]`.
    pub fn forward<S: Scalar>(&self, ctx: &mut Ctx<'_, S>, x: Var) -> Result<Var> {
        let value = ctx.session().value(x)?.clone();
        let mut idx = Vec::with_capacity(value.numel());
        for (i, v) in value.data().iter().enumerate() {
            let f = v.to_f64();
            if f.fract() != 0.0 || f < 0.0 || f >= self.num_embeddings as f64 {
                return Err(Error::invalid(
                    "embedding",
                    format!(
                        "element {i} of the input is {f}, not an index in 0..{}",
                        self.num_embeddings
                    ),
                ));
            }
            idx.push(f as usize);
        }
        let indices = IndexTensor::new(value.dims(), idx)?;
        let w = ctx.param(self.weight);
        ctx.session().embedding(indices, w)
    }
}
