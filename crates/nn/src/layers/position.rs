//! `TokenPosition`: a language model's input layer, token embedding plus learned position
//! embedding (nanoGPT's `wte(idx) + wpe(arange(T))`), then dropout. Its input is `[batch, time]`
//! token ids given as whole numbers; `time` may not exceed the position table.

use super::{Builder, Ctx, Dropout, Embedding};
use crate::init::Init;
use crate::params::ParamId;
use tapegrad_core::ops::nn::IndexTensor;
use tapegrad_core::Var;
use tapegrad_core::{Error, Result};
use tapegrad_tensor::Scalar;

/// Token and position embeddings, summed.
#[derive(Debug, Clone)]
pub struct TokenPosition {
    pub wte: Embedding,
    pub context: usize,
    pub dim: usize,
    pub dropout: Dropout,
    wpe: ParamId,
}

impl TokenPosition {
    /// Tables `{wte}.weight` `[vocab, dim]` and `{wpe}.weight` `[context, dim]`, both drawn by
    /// `init`.
    pub fn new<S: Scalar>(
        b: &mut Builder<'_, S>,
        [wte, wpe]: [&str; 2],
        vocab: usize,
        context: usize,
        dim: usize,
        init: Init,
        dropout: f64,
    ) -> Result<Self> {
        let wte = Embedding::with_init(b, wte, vocab, dim, init)?;
        let wpe = b.trainable(wpe, "weight", &[context, dim], init)?;
        Ok(TokenPosition {
            wte,
            context,
            dim,
            dropout: Dropout::new(dropout)?,
            wpe,
        })
    }

    /// `[B, T]` ids to `[B, T, dim]`.
    pub fn forward<S: Scalar>(&self, ctx: &mut Ctx<'_, S>, x: Var) -> Result<Var> {
        let dims = ctx.session().value(x)?.dims().to_vec();
        if dims.len() != 2 || dims[1] == 0 || dims[1] > self.context {
            return Err(Error::invalid(
                "token_position",
                format!(
                    "expects token ids [batch, time] with 1 <= time <= {}, found {dims:?}",
                    self.context
                ),
            ));
        }
        let tok = self.wte.forward(ctx, x)?;
        let positions = IndexTensor::vector((0..dims[1]).collect());
        let wpe = ctx.param(self.wpe);
        let pos = ctx.session().embedding(positions, wpe)?;
        let y = ctx.session().add(tok, pos)?;
        self.dropout.forward(ctx, y)
    }
}
