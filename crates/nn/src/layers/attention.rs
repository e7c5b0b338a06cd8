//! `CausalSelfAttention`: nanoGPT's multi-head self-attention. One fused `c_attn` linear makes
//! queries, keys and values (`[3E, E]` as `nn.Linear` stores it); `qkv_attention(is_causal)` splits
//! them into heads, mixes them as `scaled_dot_product_attention` does (with dropout on the
//! attention weights in training) and merges the heads; `c_proj` projects back, followed by
//! residual dropout.

use super::{Builder, Ctx, Dropout, Linear, Mode};
use crate::init::Init;
use rand::Rng;
use tapegrad_core::ops::nn::QkvAttention;
use tapegrad_core::Var;
use tapegrad_core::{Error, Result};
use tapegrad_tensor::Scalar;

/// Causal multi-head self-attention over `[batch, time, embd]`.
#[derive(Debug, Clone)]
pub struct CausalSelfAttention {
    pub embd: usize,
    pub heads: usize,
    pub c_attn: Linear,
    pub c_proj: Linear,
    /// Dropout on the attention weights (training only).
    pub attn_dropout: f64,
    pub resid_dropout: Dropout,
}

impl CausalSelfAttention {
    /// Tensors `prefix.c_attn.{weight,bias}` and `prefix.c_proj.{weight,bias}`: weights drawn by
    /// `init` and `proj_init` (GPT-2 scales the residual projection down), biases zero.
    pub fn new<S: Scalar>(
        b: &mut Builder<'_, S>,
        prefix: &str,
        embd: usize,
        heads: usize,
        init: Init,
        proj_init: Init,
        dropout: f64,
    ) -> Result<Self> {
        if heads == 0 || embd % heads != 0 {
            return Err(Error::invalid(
                "attention",
                format!("the width {embd} must be a positive multiple of the heads {heads}"),
            ));
        }
        let zero = Some(Init::Constant(0.0));
        Ok(CausalSelfAttention {
            embd,
            heads,
            c_attn: Linear::with_init(b, &format!("{prefix}.c_attn"), embd, 3 * embd, init, zero)?,
            c_proj: Linear::with_init(b, &format!("{prefix}.c_proj"), embd, embd, proj_init, zero)?,
            attn_dropout: dropout,
            resid_dropout: Dropout::new(dropout)?,
        })
    }

    /// `[B, T, E] -> [B, T, E]`.
    pub fn forward<S: Scalar>(&self, ctx: &mut Ctx<'_, S>, x: Var) -> Result<Var> {
        let dims = ctx.session().value(x)?.dims().to_vec();
        if dims.len() != 3 || dims[2] != self.embd {
            return Err(Error::invalid(
                "attention",
                format!("expects [batch, time, {}], found {dims:?}", self.embd),
            ));
        }
        let qkv = self.c_attn.forward(ctx, x)?;
        let train_dropout = ctx.mode() == Mode::Train && self.attn_dropout > 0.0;
        // The heads' split and merge happen inside the op, on the projection's own layout.
        let options = QkvAttention {
            heads: self.heads,
            is_causal: true,
            dropout_p: if train_dropout {
                self.attn_dropout
            } else {
                0.0
            },
            seed: if train_dropout { ctx.rng().random() } else { 0 },
            ..Default::default()
        };
        let y = ctx.session().qkv_attention(qkv, options)?;
        if train_dropout {
            ctx.note_seeded(y);
        }
        let y = self.c_proj.forward(ctx, y)?;
        self.resid_dropout.forward(ctx, y)
    }
}
