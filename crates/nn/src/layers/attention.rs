//! `CausalSelfAttention`: nanoGPT's multi-head self-attention. One fused `c_attn` linear makes
//! queries, keys and values (`[3E, E]` as `nn.Linear` stores it), heads are split and merged by
//! reshape and permute, `scaled_dot_product_attention(is_causal)` mixes them (with dropout on the
//! attention weights in training), and `c_proj` projects back, followed by residual dropout.

use super::{Builder, Ctx, Dropout, Linear, Mode};
use crate::init::Init;
use rand::Rng;
use tapegrad_core::ops::nn::ScaledDotProductAttention;
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
        // Lossless: the value exists, so each dimension is below isize::MAX.
        let (b, t) = (dims[0] as isize, dims[1] as isize);
        let (h, d) = (self.heads as isize, (self.embd / self.heads) as isize);
        let qkv = self.c_attn.forward(ctx, x)?;
        let s = ctx.session();
        let qkv = s.reshape(qkv, &[b, t, 3, h, d])?;
        let qkv = s.permute(qkv, &[2, 0, 3, 1, 4])?;
        let q = s.select(qkv, 0, 0)?;
        let k = s.select(qkv, 0, 1)?;
        let v = s.select(qkv, 0, 2)?;
        let train_dropout = ctx.mode() == Mode::Train && self.attn_dropout > 0.0;
        let options = ScaledDotProductAttention {
            is_causal: true,
            dropout_p: if train_dropout {
                self.attn_dropout
            } else {
                0.0
            },
            seed: if train_dropout { ctx.rng().random() } else { 0 },
            ..Default::default()
        };
        let y = ctx
            .session()
            .scaled_dot_product_attention(q, k, v, options)?;
        if train_dropout {
            ctx.note_seeded(y);
        }
        let s = ctx.session();
        let y = s.transpose(y, 1, 2)?;
        let y = s.reshape(y, &[b, t, h * d])?;
        let y = self.c_proj.forward(ctx, y)?;
        self.resid_dropout.forward(ctx, y)
    }
}
