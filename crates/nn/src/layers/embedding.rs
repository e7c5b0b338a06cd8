//! `Embedding`: a lookup table `[num_embeddings, dim]` initialised `N(0, 1)` as PyTorch's
//! `nn.Embedding`, optionally with a `padding_idx` row that starts at zero and gets no gradient.
//! Inside a `Sequential` its input is a float tensor of whole numbers (the indices); each must be
//! an integer in `0..num_embeddings`.

use super::{Builder, Ctx};
use crate::init::Init;
use crate::params::ParamId;
use tapegrad_core::ops;
use tapegrad_core::ops::nn::IndexTensor;
use tapegrad_core::Var;
use tapegrad_core::{Error, Result};
use tapegrad_tensor::{Scalar, Tensor};

/// A table of learned vectors indexed by integers.
#[derive(Debug, Clone)]
pub struct Embedding {
    pub num_embeddings: usize,
    pub dim: usize,
    /// The row that gets no gradient, normalised to `0..num_embeddings`.
    pub padding_idx: Option<usize>,
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
            padding_idx: None,
        })
    }

    /// A table filled by `init` (GPT-2 draws its tables from `N(0, 0.02^2)`).
    pub fn with_init<S: Scalar>(
        b: &mut Builder<'_, S>,
        prefix: &str,
        num_embeddings: usize,
        dim: usize,
        init: Init,
    ) -> Result<Self> {
        Ok(Embedding {
            num_embeddings,
            dim,
            weight: b.trainable(prefix, "weight", &[num_embeddings, dim], init)?,
            padding_idx: None,
        })
    }

    /// The table's id in the model's `ParamSet` (a tied output layer shares it).
    pub fn weight(&self) -> ParamId {
        self.weight
    }

    /// `nn.Embedding(num_embeddings, dim, padding_idx)`: as `new` (same draws), then row
    /// `padding_idx` (negative counts from the end) is set to zeros; it never gets a gradient.
    pub fn with_padding_idx<S: Scalar>(
        b: &mut Builder<'_, S>,
        prefix: &str,
        num_embeddings: usize,
        dim: usize,
        padding_idx: isize,
    ) -> Result<Self> {
        let row = ops::nn::Embedding::padding_row_of(padding_idx, num_embeddings)?;
        let mut layer = Embedding::new(b, prefix, num_embeddings, dim)?;
        let mut table = b.value(layer.weight).clone();
        table.data_mut()[row * dim..(row + 1) * dim].fill(S::ZERO);
        b.set(layer.weight, table)?;
        layer.padding_idx = Some(row);
        Ok(layer)
    }

    /// The indices named by the values of `value`, each a whole number in `0..num_embeddings`.
    pub fn indices_of<S: Scalar>(&self, value: &Tensor<S>) -> Result<IndexTensor> {
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
        Ok(IndexTensor::new(value.dims(), idx)?)
    }

    /// Looks up the rows named by the values of `x` (any shape): the result has shape
    /// `x.shape + [dim]`.
    pub fn forward<S: Scalar>(&self, ctx: &mut Ctx<'_, S>, x: Var) -> Result<Var> {
        let indices = self.indices_of(ctx.session().value(x)?)?;
        let w = ctx.param(self.weight);
        let y = match self.padding_idx {
            Some(p) => ctx.session().embedding_with_padding_idx(
                indices,
                w,
                isize::try_from(p).unwrap_or(isize::MAX),
            ),
            None => ctx.session().embedding(indices, w),
        }?;
        ctx.note_lookup(y, x);
        Ok(y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::Mode;
    use crate::params::ParamSet;
    use crate::rng::{dropout_rng, init_rng};
    use tapegrad_core::Session;
    use tapegrad_tensor::Tensor;

    /// As `nn.Embedding(4, 3, padding_idx=-1)`: the same draws as without padding, row 3 zeroed,
    /// and that row gets no gradient even when looked up.
    #[test]
    fn padding_idx_row_starts_at_zero_and_gets_no_gradient() {
        let (mut plain, mut padded) = (ParamSet::<f64>::new(), ParamSet::<f64>::new());
        Embedding::new(&mut Builder::new(&mut plain, &mut init_rng(3)), "emb", 4, 3).unwrap();
        let emb = Embedding::with_padding_idx(
            &mut Builder::new(&mut padded, &mut init_rng(3)),
            "emb",
            4,
            3,
            -1,
        )
        .unwrap();
        assert_eq!(emb.padding_idx, Some(3));
        let (a, b) = (
            plain.iter().next().unwrap().value.data().to_vec(),
            padded.iter().next().unwrap().value.data().to_vec(),
        );
        assert_eq!(&a[..9], &b[..9]);
        assert_eq!(&b[9..], &[0., 0., 0.]);

        let mut s = Session::new();
        let mut ctx = Ctx::new(&mut s, &padded, Mode::Train, dropout_rng(0, 0)).unwrap();
        let x = ctx
            .session()
            .input(Tensor::from_f64(&[3], &[3.0, 1.0, 3.0]).unwrap());
        let y = emb.forward(&mut ctx, x).unwrap();
        let l = ctx.session().sum(y).unwrap();
        let g = s.backward(l).unwrap();
        assert_eq!(
            g.get("emb.weight").unwrap().data(),
            &[0., 0., 0., 1., 1., 1., 0., 0., 0., 0., 0., 0.]
        );
    }

    #[test]
    fn padding_idx_out_of_range_is_an_error_naming_it() {
        for p in [4, -5] {
            let mut params = ParamSet::<f64>::new();
            let e = Embedding::with_padding_idx(
                &mut Builder::new(&mut params, &mut init_rng(0)),
                "emb",
                4,
                2,
                p,
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.contains("embedding") && e.contains("padding_idx") && e.contains(&p.to_string()),
                "{e}"
            );
        }
    }
}
