//! The GPT of [`ModelSpec::Gpt`](crate::ModelSpec): nanoGPT's layout and parameter names, built
//! from layers (`TokenPosition`, `Residual` blocks around `LayerNorm -> CausalSelfAttention` and
//! `LayerNorm -> Linear -> GELU -> Linear -> Dropout`, a final `LayerNorm` and the LM head),
//! with GPT-2's initialisation: every weight `N(0, 0.02^2)`, the residual projections
//! `N(0, (0.02 / sqrt(2 layers))^2)`, biases zero, layer norms one and zero.

use crate::init::Init;
use crate::layers::{
    Activation, Builder, CausalSelfAttention, Dropout, Layer, LayerNorm, Linear, Residual,
    Sequential, TokenPosition,
};
use tapegrad_core::{Error, Result};
use tapegrad_tensor::Scalar;

/// The sizes of a GPT.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GptShape {
    pub vocab: usize,
    pub context: usize,
    pub layers: usize,
    pub heads: usize,
    pub embd: usize,
    /// The MLP's hidden width is `mlp_ratio * embd`.
    pub mlp_ratio: usize,
    pub dropout: f64,
    /// The LM head reads the token embedding's table (`lm_head.weight` is then not a tensor of
    /// its own).
    pub tie_weights: bool,
}

impl GptShape {
    /// An error unless every size is positive and the width splits into the heads.
    pub fn validate(&self) -> Result<()> {
        let sizes = [
            ("vocab", self.vocab),
            ("context", self.context),
            ("layers", self.layers),
            ("heads", self.heads),
            ("embd", self.embd),
            ("mlp_ratio", self.mlp_ratio),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(Error::invalid("gpt", format!("{name} must be positive")));
        }
        if self.embd % self.heads != 0 {
            return Err(Error::invalid(
                "gpt",
                format!(
                    "the width {} must be a multiple of the heads {}",
                    self.embd, self.heads
                ),
            ));
        }
        Dropout::new(self.dropout)?;
        Ok(())
    }

    /// The number of parameter elements, `None` on overflow.
    pub fn params(&self) -> Option<usize> {
        let (e, v, c) = (self.embd, self.vocab, self.context);
        let h = self.mlp_ratio.checked_mul(e)?;
        let sq = |a: usize, b: usize| a.checked_mul(b);
        let block = [
            sq(4, e)?,                         // ln_1, ln_2
            sq(3 * e, e)?.checked_add(3 * e)?, // c_attn
            sq(e, e)?.checked_add(e)?,         // attn.c_proj
            sq(h, e)?.checked_add(h)?,         // c_fc
            sq(e, h)?.checked_add(e)?,         // mlp.c_proj
        ]
        .iter()
        .try_fold(0usize, |n, &k| n.checked_add(k))?;
        let head = if self.tie_weights { 0 } else { sq(v, e)? };
        sq(v, e)?
            .checked_add(sq(c, e)?)?
            .checked_add(sq(block, self.layers)?)?
            .checked_add(2 * e)?
            .checked_add(head)
    }
}

/// Builds the GPT: its input is `[batch, time]` token ids (whole numbers), its output the logits
/// `[batch * time, vocab]` (rows in batch-major order, ready for cross entropy).
pub fn gpt<S: Scalar>(b: &mut Builder<'_, S>, shape: &GptShape) -> Result<Sequential> {
    shape.validate()?;
    let GptShape {
        vocab,
        context,
        layers,
        heads,
        embd,
        mlp_ratio,
        dropout,
        tie_weights,
    } = *shape;
    let std = 0.02;
    let init = Init::Normal { mean: 0.0, std };
    let proj = Init::Normal {
        mean: 0.0,
        std: std / ((2 * layers) as f64).sqrt(),
    };
    let zero = Some(Init::Constant(0.0));
    let mut net = Sequential::new();
    let embed = TokenPosition::new(
        b,
        ["transformer.wte", "transformer.wpe"],
        vocab,
        context,
        embd,
        init,
        dropout,
    )?;
    let wte = embed.wte.weight();
    net.push(Layer::TokenPosition(embed));
    for i in 0..layers {
        let p = format!("transformer.h.{i}");
        let mut attn = Sequential::new();
        attn.push(Layer::LayerNorm(LayerNorm::new(
            b,
            &format!("{p}.ln_1"),
            &[embd],
        )?));
        attn.push(Layer::CausalSelfAttention(CausalSelfAttention::new(
            b,
            &format!("{p}.attn"),
            embd,
            heads,
            init,
            proj,
            dropout,
        )?));
        net.push(Layer::Residual(Residual::new(attn)));
        let hidden = mlp_ratio * embd;
        let mut mlp = Sequential::new();
        mlp.push(Layer::LayerNorm(LayerNorm::new(
            b,
            &format!("{p}.ln_2"),
            &[embd],
        )?));
        let fc = Linear::with_init(b, &format!("{p}.mlp.c_fc"), embd, hidden, init, zero)?;
        mlp.push(Layer::Linear(fc));
        mlp.push(Layer::Activation(Activation::Gelu));
        let c_proj = Linear::with_init(b, &format!("{p}.mlp.c_proj"), hidden, embd, proj, zero)?;
        mlp.push(Layer::Linear(c_proj));
        if dropout != 0.0 {
            mlp.push(Layer::Dropout(Dropout::new(dropout)?));
        }
        net.push(Layer::Residual(Residual::new(mlp)));
    }
    net.push(Layer::LayerNorm(LayerNorm::new(
        b,
        "transformer.ln_f",
        &[embd],
    )?));
    let head = match tie_weights {
        true => Linear::tied(wte, embd, vocab),
        false => Linear::with_init(b, "lm_head", embd, vocab, init, None)?,
    };
    net.push(Layer::Linear(head));
    // Lossless: the head's weight exists, so vocab is below isize::MAX.
    net.push(Layer::Reshape(vec![-1, vocab as isize]));
    Ok(net)
}
