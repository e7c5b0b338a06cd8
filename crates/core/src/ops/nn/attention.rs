//! `scaled_dot_product_attention` on (..., L, E) queries and (..., S, E) keys, (..., S, Ev) values,
//! with an optional causal or boolean mask. Masked scores never enter an `exp`, so no NaN arises;
//! a row with every key masked has output 0 and passes no gradient (a documented choice).

use crate::ops::{Arity, Aux, Forward, Mask, OpRules, Saves, VjpContext};
use tapegrad_tensor::kernels::{batched_matmul, broadcast_shape, broadcast_to};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// `F.scaled_dot_product_attention(query, key, value, attn_mask, is_causal, scale)` without
/// dropout: `softmax(q k^T * scale + mask) v`. Arguments `(query, key, value)` share their leading
/// (batch, heads, ...) dimensions.
///
/// - `scale` defaults to `1 / sqrt(E)` (1 when `E = 0`, where every score is 0 anyway).
/// - `is_causal`: query `i` attends keys `j <= i` (top-left aligned, as PyTorch).
/// - `attn_mask`: a boolean mask broadcastable to (..., L, S); `true` means "takes part", as
///   PyTorch's boolean masks. It cannot be combined with `is_causal`.
/// - A query row whose keys are all masked has attention weights 0, so its output row is 0 and
///   it sends zero gradient to the query, keys and values (PyTorch's math kernel gives NaN there).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScaledDotProductAttention {
    pub is_causal: bool,
    pub scale: Option<f64>,
    pub attn_mask: Option<Mask>,
}

/// Shapes of one attention call.
struct Geometry {
    scores: Shape,
    out: Shape,
    keys: usize,
    scale: f64,
}

impl ScaledDotProductAttention {
    fn geometry(&self, q: &Shape, k: &Shape, v: &Shape) -> Result<Geometry> {
        let op = "scaled_dot_product_attention";
        let shapes = || format!("query {q}, key {k}, value {v}");
        let r = q.rank();
        if r < 2 || k.rank() != r || v.rank() != r {
            return Err(Error::invalid(
                op,
                format!(
                    "query, key and value must have one rank of at least 2 (..., L, E), found {}",
                    shapes()
                ),
            ));
        }
        let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
        if qd[..r - 2] != kd[..r - 2] || qd[..r - 2] != vd[..r - 2] {
            return Err(Error::invalid(
                op,
                format!(
                    "leading (batch) dimensions must be equal, found {}",
                    shapes()
                ),
            ));
        }
        if qd[r - 1] != kd[r - 1] || kd[r - 2] != vd[r - 2] {
            return Err(Error::invalid(
                op,
                format!(
                    "query and key must share the embedding size and key and value the sequence length, found {}",
                    shapes()
                ),
            ));
        }
        if self.is_causal && self.attn_mask.is_some() {
            return Err(Error::invalid(
                op,
                "an explicit attn_mask cannot be combined with is_causal",
            ));
        }
        let e = qd[r - 1];
        let scale = match self.scale {
            Some(s) if !s.is_finite() => {
                return Err(Error::invalid(op, format!("scale must be finite, got {s}")))
            }
            Some(s) => s,
            None if e == 0 => 1.0,
            None => 1.0 / (e as f64).sqrt(),
        };
        let mut scores = qd[..r - 1].to_vec();
        scores.push(kd[r - 2]);
        let scores = Shape::new(scores)?;
        if let Some(m) = &self.attn_mask {
            let fits = broadcast_shape(op, &m.shape, &scores).is_ok_and(|b| b == scores);
            if !fits || m.data.len() != m.shape.numel() {
                return Err(Error::invalid(
                    op,
                    format!(
                        "attn_mask of shape {} does not broadcast to the scores {scores} ({})",
                        m.shape,
                        shapes()
                    ),
                ));
            }
        }
        let mut out = qd[..r - 1].to_vec();
        out.push(vd[r - 1]);
        for dims in [qd, kd, vd, scores.dims(), &out] {
            super::product(op, dims)?;
        }
        Ok(Geometry {
            scores,
            out: Shape::new(out)?,
            keys: kd[r - 2],
            scale,
        })
    }

    /// Which scores take part, row-major over the scores shape; `None` when all do.
    fn allowed(&self, g: &Geometry) -> Result<Option<Vec<bool>>> {
        if self.is_causal {
            let dims = g.scores.dims();
            let queries = dims[dims.len() - 2];
            let keys = g.keys;
            let allowed = (0..g.scores.numel())
                .map(|i| (i % keys.max(1)) <= (i / keys.max(1)) % queries.max(1))
                .collect();
            return Ok(Some(allowed));
        }
        match &self.attn_mask {
            None => Ok(None),
            Some(m) => {
                let as_f32 = Tensor::<f32>::from_shape(
                    m.shape.clone(),
                    m.data.iter().map(|&b| f32::from(u8::from(b))).collect(),
                )?;
                let spread = broadcast_to(&as_f32, &g.scores)?;
                Ok(Some(spread.data().iter().map(|&v| v != 0.0).collect()))
            }
        }
    }

    /// Attention weights: a softmax over each row's allowed scores, 0 elsewhere; all-0 rows when
    /// nothing is allowed.
    fn weights<S: Scalar>(&self, g: &Geometry, q: &Tensor<S>, k: &Tensor<S>) -> Result<Tensor<S>> {
        let mut p = batched_matmul(q, false, k, true)?.into_vec();
        let allowed = self.allowed(g)?;
        let scale = S::from_f64(g.scale);
        let keys = g.keys;
        if keys > 0 {
            for (r, row) in p.chunks_mut(keys).enumerate() {
                let ok = |j: usize| allowed.as_ref().is_none_or(|a| a[r * keys + j]);
                let m = (0..keys)
                    .filter(|&j| ok(j))
                    .map(|j| row[j] * scale)
                    .fold(None, |m: Option<S>, s| Some(m.map_or(s, |m| m.max_nan(s))));
                let Some(m) = m else {
                    row.fill(S::ZERO);
                    continue;
                };
                let mut total = S::ZERO;
                for (j, s) in row.iter_mut().enumerate() {
                    *s = if ok(j) {
                        let e = (*s * scale - m).exp();
                        total += e;
                        e
                    } else {
                        S::ZERO
                    };
                }
                for s in row.iter_mut() {
                    *s /= total;
                }
            }
        }
        Tensor::from_shape(g.scores.clone(), p)
    }

    /// `P * (d - rowsum(P * d)) * scale`: the softmax derivative applied to `d`, zero wherever
    /// `P` is (masked scores and fully masked rows).
    fn softmax_derivative<S: Scalar>(
        &self,
        g: &Geometry,
        p: &Tensor<S>,
        d: &Tensor<S>,
    ) -> Result<Tensor<S>> {
        let scale = S::from_f64(g.scale);
        let mut out = Vec::with_capacity(p.numel());
        if g.keys > 0 {
            for (pr, dr) in p.data().chunks(g.keys).zip(d.data().chunks(g.keys)) {
                let dot: S = pr.iter().zip(dr).map(|(&a, &b)| a * b).sum();
                out.extend(pr.iter().zip(dr).map(|(&a, &b)| a * (b - dot) * scale));
            }
        }
        Tensor::from_shape(g.scores.clone(), out)
    }
}

fn weights_of<'a, S: Scalar>(aux: &'a Aux<S>, scores: &Shape) -> Result<&'a Tensor<S>> {
    match aux {
        Aux::Tensors(ts) if ts.len() == 1 && ts[0].shape() == scores => Ok(&ts[0]),
        _ => Err(Error::invalid(
            "scaled_dot_product_attention",
            format!("the attention weights of shape {scores} were not kept by the forward pass"),
        )),
    }
}

fn add<S: Scalar>(a: Tensor<S>, b: &Tensor<S>) -> Result<Tensor<S>> {
    a.zip_map(b, "scaled_dot_product_attention", |x, y| x + y)
}

impl OpRules for ScaledDotProductAttention {
    fn name(&self) -> &'static str {
        "scaled_dot_product_attention"
    }
    fn arity(&self) -> Arity {
        Arity::Exact(3)
    }
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        Ok(self.geometry(inputs[0], inputs[1], inputs[2])?.out)
    }
    /// Query, key and value; the attention weights travel in `Aux`.
    fn saves(&self) -> Saves {
        Saves::inputs(&[0, 1, 2])
    }
    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        let g = self.geometry(x[0].shape(), x[1].shape(), x[2].shape())?;
        let p = self.weights(&g, x[0], x[1])?;
        let out = batched_matmul(&p, false, x[2], false)?;
        Ok(Forward {
            value: out,
            aux: Aux::Tensors(vec![p]),
        })
    }
    fn vjp<S: Scalar>(
        &self,
        ctx: &VjpContext<'_, S>,
        cot: &Tensor<S>,
    ) -> Result<Vec<Option<Tensor<S>>>> {
        let op = self.name();
        let sh = ctx.input_shapes;
        let g = self.geometry(&sh[0], &sh[1], &sh[2])?;
        let p = weights_of(ctx.aux, &g.scores)?;
        let ds = if ctx.needs(0) || ctx.needs(1) {
            let dp = batched_matmul(cot, false, ctx.input(op, 2)?, true)?;
            Some(self.softmax_derivative(&g, p, &dp)?)
        } else {
            None
        };
        let ds = ds.as_ref();
        let need_ds = || ds.ok_or_else(|| Error::invalid(op, "score gradient missing"));
        Ok(vec![
            if ctx.needs(0) {
                Some(batched_matmul(need_ds()?, false, ctx.input(op, 1)?, false)?)
            } else {
                None
            },
            if ctx.needs(1) {
                Some(batched_matmul(need_ds()?, true, ctx.input(op, 0)?, false)?)
            } else {
                None
            },
            if ctx.needs(2) {
                Some(batched_matmul(p, true, cot, false)?)
            } else {
                None
            },
        ])
    }
    fn jvp<S: Scalar>(
        &self,
        x: &[&Tensor<S>],
        out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        let g = self.geometry(x[0].shape(), x[1].shape(), x[2].shape())?;
        let p = weights_of(&out.aux, &g.scores)?;
        // d scores (before scaling) = dq k^T + q dk^T; softmax_derivative applies the scale.
        let dscores = add(
            batched_matmul(t[0], false, x[1], true)?,
            &batched_matmul(x[0], false, t[1], true)?,
        )?;
        let dp = self.softmax_derivative(&g, p, &dscores)?;
        add(
            batched_matmul(&dp, false, x[2], false)?,
            &batched_matmul(p, false, t[2], false)?,
        )
    }
}

impl std::fmt::Display for ScaledDotProductAttention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "scaled_dot_product_attention(is_causal={}, scale={:?}, attn_mask={})",
            self.is_causal,
            self.scale,
            self.attn_mask
                .as_ref()
                .map_or("none".to_string(), |m| m.shape.to_string())
        )
    }
}
