//! Sampling from a GPT with a key/value cache: plain tensor code, no tape. Each new token runs
//! the blocks on one position only (the same ops' forwards as the model: layer norm, linear,
//! GELU), attending over the keys and values cached for the earlier positions, so a token costs
//! one position's work, not the whole context's. When the window is full, the cache is rebuilt
//! from the last half of the context (one prefill every `context / 2` tokens) and sampling goes
//! on past the context length.

use super::GptShape;
use crate::error::{NnError, NnResult};
use crate::model::Model;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tapegrad_core::ops::activation::Gelu;
use tapegrad_core::ops::linalg::Linear;
use tapegrad_core::ops::nn::LayerNorm;
use tapegrad_core::ops::{ActivationOp, GeluApproximate, LinalgOp, NnOp};
use tapegrad_core::Error;
use tapegrad_core::Op;
use tapegrad_tensor::kernels::exp::exp_in_place;
use tapegrad_tensor::{Scalar, Tensor};

/// How to pick each next token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Logits are divided by this (positive) before the softmax.
    pub temperature: f64,
    /// Sample only among the `k` likeliest tokens (`None`: all).
    pub top_k: Option<usize>,
}

impl Sampling {
    /// An error for a temperature that is not positive and finite, or a top-k of 0.
    pub fn validate(&self) -> NnResult<()> {
        if !(self.temperature > 0.0 && self.temperature.is_finite()) {
            return Err(NnError::Config(format!(
                "--temperature must be a positive number, found {}",
                self.temperature
            )));
        }
        if self.top_k == Some(0) {
            return Err(NnError::Config(
                "--top-k must be at least 1 (leave it out to sample from every character)".into(),
            ));
        }
        Ok(())
    }
}

struct Block<S> {
    ln_1: [Tensor<S>; 2],
    c_attn: [Tensor<S>; 2],
    attn_proj: [Tensor<S>; 2],
    ln_2: [Tensor<S>; 2],
    c_fc: [Tensor<S>; 2],
    mlp_proj: [Tensor<S>; 2],
    /// Per head, the cached keys and values of the window's positions, `[t, head_dim]` rows.
    keys: Vec<Vec<S>>,
    values: Vec<Vec<S>>,
}

/// A GPT's weights with a key/value cache over the current window.
pub struct Generator<S> {
    shape: GptShape,
    wte: Tensor<S>,
    wpe: Tensor<S>,
    blocks: Vec<Block<S>>,
    ln_f: [Tensor<S>; 2],
    lm_head: Tensor<S>,
    /// The token ids of the current window (their keys and values are cached).
    window: Vec<u32>,
}

impl<S: Scalar> Generator<S> {
    /// Reads the weights of `model` (a GPT) by their names.
    pub fn new(model: &Model<S>) -> NnResult<Self> {
        let shape = model.spec.gpt_shape().ok_or_else(|| {
            NnError::Config(format!(
                "generation needs a gpt model, found {}",
                model.spec.name()
            ))
        })?;
        let get = |name: &str| -> NnResult<Tensor<S>> {
            let id = model.params.find(name).ok_or_else(|| {
                NnError::Config(format!("the model has no tensor named '{name}'"))
            })?;
            Ok(model.params.get(id).value.clone())
        };
        let pair = |p: &str| -> NnResult<[Tensor<S>; 2]> {
            Ok([get(&format!("{p}.weight"))?, get(&format!("{p}.bias"))?])
        };
        let mut blocks = Vec::with_capacity(shape.layers);
        for i in 0..shape.layers {
            let p = format!("transformer.h.{i}");
            blocks.push(Block {
                ln_1: pair(&format!("{p}.ln_1"))?,
                c_attn: pair(&format!("{p}.attn.c_attn"))?,
                attn_proj: pair(&format!("{p}.attn.c_proj"))?,
                ln_2: pair(&format!("{p}.ln_2"))?,
                c_fc: pair(&format!("{p}.mlp.c_fc"))?,
                mlp_proj: pair(&format!("{p}.mlp.c_proj"))?,
                keys: vec![Vec::new(); shape.heads],
                values: vec![Vec::new(); shape.heads],
            });
        }
        let lm_head = match shape.tie_weights {
            true => get("transformer.wte.weight")?,
            false => get("lm_head.weight")?,
        };
        Ok(Generator {
            shape,
            wte: get("transformer.wte.weight")?,
            wpe: get("transformer.wpe.weight")?,
            blocks,
            ln_f: pair("transformer.ln_f")?,
            lm_head,
            window: Vec::new(),
        })
    }

    /// Appends token `id` to the window and returns the logits `[vocab]` for the token after it.
    /// A full window is first rebuilt from its last half.
    pub fn push(&mut self, id: u32) -> NnResult<Tensor<S>> {
        if id as usize >= self.shape.vocab {
            return Err(Error::invalid(
                "generate",
                format!(
                    "token {id} is outside the vocabulary of {}",
                    self.shape.vocab
                ),
            )
            .into());
        }
        if self.window.len() == self.shape.context {
            let keep = (self.shape.context / 2).max(1);
            let kept = self.window[self.window.len() - keep..].to_vec();
            self.clear();
            for t in kept {
                self.step(t)?;
            }
        }
        self.step(id)
    }

    /// Empties the window and the cache.
    pub fn clear(&mut self) {
        self.window.clear();
        for b in &mut self.blocks {
            b.keys.iter_mut().for_each(Vec::clear);
            b.values.iter_mut().for_each(Vec::clear);
        }
    }

    /// Runs one position (the window's next) through the model, caching its keys and values.
    fn step(&mut self, id: u32) -> NnResult<Tensor<S>> {
        let (e, heads) = (self.shape.embd, self.shape.heads);
        let d = e / heads;
        let pos = self.window.len();
        let row = |t: &Tensor<S>, r: usize| t.data()[r * e..(r + 1) * e].to_vec();
        let tok = row(&self.wte, id as usize);
        let at = row(&self.wpe, pos);
        let mut x = Tensor::new(&[1, e], tok.iter().zip(&at).map(|(&a, &b)| a + b).collect())?;
        let scale = S::from_f64(1.0 / (d as f64).sqrt());
        for b in &mut self.blocks {
            let h = layer_norm(&x, &b.ln_1, e)?;
            let qkv = linear(&h, &b.c_attn)?;
            let qkv = qkv.data();
            let mut merged = vec![S::ZERO; e];
            for head in 0..heads {
                let q = &qkv[head * d..(head + 1) * d];
                b.keys[head].extend_from_slice(&qkv[e + head * d..e + (head + 1) * d]);
                b.values[head].extend_from_slice(&qkv[2 * e + head * d..2 * e + (head + 1) * d]);
                let (keys, values) = (&b.keys[head], &b.values[head]);
                let scores: Vec<S> = keys
                    .chunks_exact(d)
                    .map(|k| q.iter().zip(k).fold(S::ZERO, |s, (&a, &b)| s + a * b) * scale)
                    .collect();
                let max = scores
                    .iter()
                    .fold(S::NEG_INFINITY, |m, &s| if s > m { s } else { m });
                let mut exps: Vec<S> = scores.iter().map(|&s| s - max).collect();
                exp_in_place(&mut exps);
                let total = exps.iter().fold(S::ZERO, |s, &v| s + v);
                let out = &mut merged[head * d..(head + 1) * d];
                for (p, v) in exps.iter().zip(values.chunks_exact(d)) {
                    let w = *p / total;
                    for (o, &vv) in out.iter_mut().zip(v) {
                        *o += w * vv;
                    }
                }
            }
            let y = linear(&Tensor::new(&[1, e], merged)?, &b.attn_proj)?;
            x = add(&x, &y)?;
            let h = layer_norm(&x, &b.ln_2, e)?;
            let h = linear(&h, &b.c_fc)?;
            let h = Op::Activation(ActivationOp::Gelu(Gelu {
                approximate: GeluApproximate::None,
            }))
            .forward(&[&h])?
            .value;
            let y = linear(&h, &b.mlp_proj)?;
            x = add(&x, &y)?;
        }
        let x = layer_norm(&x, &self.ln_f, e)?;
        let logits = Op::Linalg(LinalgOp::Linear(Linear { bias: false }))
            .forward(&[&x, &self.lm_head])?
            .value;
        self.window.push(id);
        Ok(logits.reshape(&[self.shape.vocab])?)
    }
}

fn layer_norm<S: Scalar>(x: &Tensor<S>, [w, b]: &[Tensor<S>; 2], e: usize) -> NnResult<Tensor<S>> {
    let op = Op::Nn(Box::new(NnOp::LayerNorm(LayerNorm {
        normalized_shape: vec![e],
        eps: 1e-5,
        weight: true,
        bias: true,
    })));
    Ok(op.forward(&[x, w, b])?.value)
}

fn linear<S: Scalar>(x: &Tensor<S>, [w, b]: &[Tensor<S>; 2]) -> NnResult<Tensor<S>> {
    Ok(Op::Linalg(LinalgOp::Linear(Linear { bias: true }))
        .forward(&[x, w, b])?
        .value)
}

fn add<S: Scalar>(a: &Tensor<S>, b: &Tensor<S>) -> NnResult<Tensor<S>> {
    let data = a
        .data()
        .iter()
        .zip(b.data())
        .map(|(&x, &y)| x + y)
        .collect();
    Ok(Tensor::new(a.dims(), data)?)
}

/// Feeds `prompt` to `gen`, then draws `tokens` ids one at a time with `sampling` from `rng`,
/// handing each to `emit` as soon as it is drawn: the loop `tapegrad generate` streams and
/// `tapegrad bench generate` times. The last id drawn is not pushed, as nothing reads the logits
/// after it; an empty prompt draws nothing.
pub fn continue_prompt<S: Scalar, E: From<NnError>>(
    gen: &mut Generator<S>,
    prompt: &[u32],
    tokens: usize,
    sampling: Sampling,
    rng: &mut ChaCha8Rng,
    mut emit: impl FnMut(u32) -> Result<(), E>,
) -> Result<(), E> {
    let mut logits = None;
    for &id in prompt {
        logits = Some(gen.push(id)?);
    }
    let Some(mut logits) = logits else {
        return Ok(());
    };
    for drawn in 1..=tokens {
        let next = sample(&logits, sampling, rng);
        emit(next)?;
        if drawn < tokens {
            logits = gen.push(next)?;
        }
    }
    Ok(())
}

/// Draws the next token from `logits`: divided by the temperature, restricted to the `top_k`
/// likeliest (ties at the cut kept), softmax in f64, one uniform draw from `rng`.
pub fn sample<S: Scalar>(logits: &Tensor<S>, sampling: Sampling, rng: &mut ChaCha8Rng) -> u32 {
    let scaled: Vec<f64> = logits
        .data()
        .iter()
        .map(|v| v.to_f64() / sampling.temperature)
        .collect();
    let cut = match sampling.top_k {
        Some(k) if k < scaled.len() => {
            let mut sorted = scaled.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            sorted[k - 1]
        }
        _ => f64::NEG_INFINITY,
    };
    let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scaled
        .iter()
        .map(|&v| if v >= cut { (v - max).exp() } else { 0.0 })
        .collect();
    let total: f64 = weights.iter().sum();
    let mut u = rng.random::<f64>() * total;
    for (i, w) in weights.iter().enumerate() {
        if u < *w {
            return i as u32;
        }
        u -= w;
    }
    // Rounding left `u` past the last positive weight: take that one.
    weights.iter().rposition(|&w| w > 0.0).unwrap_or(0) as u32
}
