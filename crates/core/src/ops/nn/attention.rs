//! `scaled_dot_product_attention` on (..., L, E) queries and (..., S, E) keys, (..., S, Ev) values
//! whose leading (batch, head) dimensions broadcast as PyTorch's matmul does, with an optional
//! causal, boolean or float mask and seeded dropout on the attention weights.
//! Masked scores never reach a maximum, a sum or a weight, so no NaN arises from them; a row
//! with every key masked (boolean or -inf) has output 0 and passes no gradient (a documented
//! choice).

use super::dropout::dropout_mask;
use crate::ops::{Arity, Forward, Grads, Mask, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::kernels::alloc::ensure_allocatable;
use tapegrad_tensor::kernels::causal_softmax::causal_softmax;
use tapegrad_tensor::kernels::exp::exp_in_place;
use tapegrad_tensor::kernels::head_product::{batched_head_product, Extent};
use tapegrad_tensor::kernels::par_map::MIN_MAP_PER_THREAD;
use tapegrad_tensor::kernels::{
    broadcast_shape, broadcast_to, for_each_band_mut, pairwise_sum, pairwise_sum_by,
    pairwise_sums_by, sum_to,
};

/// How many rows of the softmax derivative take their dot products together.
const DOT_ROWS: usize = 8;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// `F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale)`:
/// `dropout(softmax(q k^T * scale + mask), dropout_p) v`. Arguments `(query, key, value)`, plus
/// the float mask when `float_mask` is set.
///
/// - Leading dimensions: each argument has rank 2 or more, and the dimensions before the last
///   two broadcast as in PyTorch's math kernel (its matmuls): the scores' leading dimensions are
///   those of the query and the key broadcast together, the output's those of the scores and the
///   value. So a key and value `[B, 1, S, E]` serve every head of a query `[B, H, L, E]`
///   (multi-query attention), and `[S, E]` every batch. Each gradient is summed back over the
///   dimensions its argument was broadcast along.
///
/// - `scale` defaults to `1 / sqrt(E)` (1 when `E = 0`, where every score is 0 anyway).
/// - `is_causal`: query `i` attends keys `j <= i` (top-left aligned, as PyTorch).
/// - `attn_mask`: a boolean mask broadcastable to (..., L, S); `true` means "takes part", as
///   PyTorch's boolean masks.
/// - `float_mask`: PyTorch's float `attn_mask`, given as a fourth tensor argument broadcastable
///   to (..., L, S) and added to the scaled scores; it is differentiable (its gradient is the
///   scores' gradient summed over the broadcast axes). A `-inf` entry masks its key exactly like
///   a `false` in a boolean mask.
/// - Only one mask can be given, and none together with `is_causal` (PyTorch's rule).
/// - `dropout_p` zeroes each attention weight with that probability and scales the rest by
///   `1 / (1 - dropout_p)`, with the mask drawn from `seed` as [`dropout_mask`] over the weights
///   (so the same seed gives the same mask, and the VJP and JVP regenerate it); `0` is the
///   identity. PyTorch applies it whenever `dropout_p > 0`, so pass 0 in evaluation.
/// - A query row whose keys are all masked has attention weights 0, so its output row is 0 and
///   it sends zero gradient to the query, keys, values and mask (PyTorch's math kernel gives NaN
///   there).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScaledDotProductAttention {
    pub is_causal: bool,
    pub scale: Option<f64>,
    pub attn_mask: Option<Mask>,
    pub float_mask: bool,
    pub dropout_p: f64,
    pub seed: u64,
}

/// Shapes of one attention call.
pub(super) struct Geometry {
    /// (..., L, S): the query's and the key's leading dimensions broadcast.
    pub(super) scores: Shape,
    /// (..., L, Ev): the scores' and the value's leading dimensions broadcast.
    pub(super) out: Shape,
    pub(super) keys: usize,
    pub(super) scale: f64,
    /// The float mask's own shape, when there is one.
    float_mask: Option<Shape>,
}

impl ScaledDotProductAttention {
    pub(super) fn geometry(&self, shapes: &[&Shape]) -> Result<Geometry> {
        let op = "scaled_dot_product_attention";
        let (q, k, v) = (shapes[0], shapes[1], shapes[2]);
        let shapes_text = || format!("query {q}, key {k}, value {v}");
        if q.rank() < 2 || k.rank() < 2 || v.rank() < 2 {
            return Err(Error::invalid(
                op,
                format!(
                    "query, key and value must each have rank 2 or more (..., L, E), found {}",
                    shapes_text()
                ),
            ));
        }
        let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
        let (rq, rk, rv) = (q.rank(), k.rank(), v.rank());
        let lead = |d: &[usize]| Shape::for_op(op, &d[..d.len() - 2]);
        let batch = broadcast_shape(op, &lead(qd)?, &lead(kd)?)
            .and_then(|qk| Ok((broadcast_shape(op, &qk, &lead(vd)?)?, qk)));
        let Ok((out_batch, score_batch)) = batch else {
            return Err(Error::invalid(
                op,
                format!(
                    "the leading (batch, head) dimensions do not broadcast together, found {}",
                    shapes_text()
                ),
            ));
        };
        if qd[rq - 1] != kd[rk - 1] || kd[rk - 2] != vd[rv - 2] {
            return Err(Error::invalid(
                op,
                format!(
                    "query and key must share the embedding size and key and value the sequence length, found {}",
                    shapes_text()
                ),
            ));
        }
        if self.is_causal && (self.attn_mask.is_some() || self.float_mask) {
            return Err(Error::invalid(
                op,
                "an explicit attn_mask cannot be combined with is_causal",
            ));
        }
        if self.float_mask && self.attn_mask.is_some() {
            return Err(Error::invalid(
                op,
                "attn_mask is given twice: as a boolean mask and as a float tensor argument",
            ));
        }
        check_dropout_and_scale(op, self.dropout_p, self.scale)?;
        let e = qd[rq - 1];
        let scale = match self.scale {
            Some(s) => s,
            None if e == 0 => 1.0,
            None => 1.0 / (e as f64).sqrt(),
        };
        let mut scores = score_batch.dims().to_vec();
        scores.extend([qd[rq - 2], kd[rk - 2]]);
        // Empty queries and keys beside huge lengths can make scores too large to exist.
        let scores = Shape::for_op(op, scores)?;
        let fits = |m: &Shape| broadcast_shape(op, m, &scores).is_ok_and(|b| b == scores);
        if let Some(m) = &self.attn_mask {
            if !fits(&m.shape) || m.data.len() != m.shape.numel() {
                return Err(Error::invalid(
                    op,
                    format!(
                        "attn_mask of shape {} does not broadcast to the scores {scores} ({})",
                        m.shape,
                        shapes_text()
                    ),
                ));
            }
        }
        let float_mask = if self.float_mask {
            let m = shapes[3];
            if !fits(m) {
                return Err(Error::invalid(
                    op,
                    format!(
                        "float attn_mask of shape {m} does not broadcast to the scores {scores} ({})",
                        shapes_text()
                    ),
                ));
            }
            Some(m.clone())
        } else {
            None
        };
        let mut out = out_batch.dims().to_vec();
        out.extend([qd[rq - 2], vd[rv - 1]]);
        Ok(Geometry {
            scores,
            out: Shape::for_op(op, out)?,
            keys: kd[rk - 2],
            scale,
            float_mask,
        })
    }

    fn shapes_of<'a, S: Scalar>(x: &[&'a Tensor<S>]) -> Vec<&'a Shape> {
        x.iter().map(|t| t.shape()).collect()
    }

    /// Which scores take part by the causal or boolean mask, row-major over the scores shape;
    /// `None` when all do.
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

    /// Attention weights before dropout: a softmax over each row's allowed scores (scaled, plus
    /// the float mask), 0 elsewhere; all-0 rows when nothing is allowed.
    fn weights<S: Scalar>(
        &self,
        g: &Geometry,
        q: &Tensor<S>,
        k: &Tensor<S>,
        float_mask: Option<&Tensor<S>>,
    ) -> Result<Tensor<S>> {
        let scores = self.products(q, false, k, true, Extent::LowerColumns)?;
        self.weights_of_scores(g, scores, float_mask)
    }

    /// [`Self::weights`] from the products `q k^T` already made (shaped as the scores).
    pub(super) fn weights_of_scores<S: Scalar>(
        &self,
        g: &Geometry,
        mut scores: Tensor<S>,
        float_mask: Option<&Tensor<S>>,
    ) -> Result<Tensor<S>> {
        if self.is_causal && float_mask.is_none() && scores.shape() == &g.scores {
            // In place on the product's own buffer: no copy of the scores.
            causal_softmax_rows(g, scores.data_mut());
            return Ok(scores);
        }
        let mut p = scores.into_vec();
        let allowed = self.allowed(g)?;
        let added = float_mask.map(|m| broadcast_to(m, &g.scores)).transpose()?;
        let added = added.as_ref().map(|m| m.data());
        let scale = S::from_f64(g.scale);
        let keys = g.keys;
        if allowed.is_none() && added.is_none() {
            unmasked_softmax_rows(&mut p, keys, scale);
        } else if keys > 0 {
            for (r, row) in p.chunks_mut(keys).enumerate() {
                let i = |j: usize| r * keys + j;
                let ok = |j: usize| {
                    allowed.as_ref().is_none_or(|a| a[i(j)])
                        && added.is_none_or(|m| m[i(j)] != S::NEG_INFINITY)
                };
                let z = |j: usize, s: S| s * scale + added.map_or(S::ZERO, |m| m[i(j)]);
                let m = (0..keys)
                    .filter(|&j| ok(j))
                    .map(|j| z(j, row[j]))
                    .fold(None, |m: Option<S>, s| Some(m.map_or(s, |m| m.max_nan(s))));
                let Some(m) = m else {
                    row.fill(S::ZERO);
                    continue;
                };
                // A masked score becomes -inf, whose exp is exactly 0.
                for (j, s) in row.iter_mut().enumerate() {
                    *s = if ok(j) { z(j, *s) - m } else { S::NEG_INFINITY };
                }
                exp_in_place(row);
                // Pairwise, as softmax's denominator: long rows stay accurate in f32. Up to the
                // last key taken, so that a causal row has the bits of the same row cut there
                // (a generation step with a key/value cache).
                let end = (0..keys).rposition(ok).map_or(0, |j| j + 1);
                let total = pairwise_sum(&row[..end]);
                for s in row.iter_mut() {
                    *s /= total;
                }
            }
        }
        Tensor::from_shape(g.scores.clone(), p)
    }

    /// The dropout map on score-shaped `t` (the attention weights, or their gradient or tangent:
    /// it is linear and diagonal); the identity when `dropout_p` is 0.
    pub(super) fn dropped<S: Scalar>(&self, t: &Tensor<S>) -> Result<Tensor<S>> {
        if self.dropout_p == 0.0 {
            return Ok(t.clone());
        }
        let keep_scale = self.keep_scale::<S>();
        let mask = dropout_mask(self.seed, t.numel(), self.dropout_p);
        let data = t
            .data()
            .iter()
            .zip(mask)
            .map(|(&v, keep)| if keep { v * keep_scale } else { S::ZERO })
            .collect();
        Tensor::from_shape(t.shape().clone(), data)
    }

    /// `P * (d - rowsum(P * d))`: the softmax derivative applied to a change `d` of the
    /// pre-softmax scores, zero wherever `P` is (masked scores and fully masked rows); with
    /// `then_scale`, each element times it after (the bits of a separate pass).
    pub(super) fn softmax_derivative<S: Scalar>(
        &self,
        g: &Geometry,
        p: &Tensor<S>,
        d: &Tensor<S>,
        then_scale: Option<f64>,
    ) -> Result<Tensor<S>> {
        if p.numel() != g.scores.numel() || d.numel() != g.scores.numel() {
            return Err(Error::invalid(
                "scaled_dot_product_attention",
                format!(
                    "the weights {} and their change {} do not match the scores {}",
                    p.shape(),
                    d.shape(),
                    g.scores
                ),
            ));
        }
        // Every row written, straight into a pooled buffer (no vector copied in); rows are
        // independent, so bands of them go to the threads with the same bits.
        let keys = g.keys;
        let then_scale = then_scale.map(S::from_f64);
        Ok(Tensor::from_writer(g.scores.clone(), |out| {
            if keys == 0 {
                return;
            }
            let rows_per_thread = MIN_MAP_PER_THREAD.div_ceil(keys);
            for_each_band_mut(out, keys, rows_per_thread, |start, band| {
                let (p, d) = (&p.data()[start..], &d.data()[start..]);
                derivative_rows(p, d, band, keys, then_scale)
            })
        }))
    }

    /// Batched `op(a) @ op(b)` of attention, within `causal` (the part of the product a causal
    /// mask leaves) when the mask is causal.
    fn products<S: Scalar>(
        &self,
        a: &Tensor<S>,
        trans_a: bool,
        b: &Tensor<S>,
        trans_b: bool,
        causal: Extent,
    ) -> Result<Tensor<S>> {
        let extent = if self.is_causal { causal } else { Extent::Full };
        batched_head_product(a, trans_a, b, trans_b, extent)
    }

    /// What `dropped` multiplies a kept element by.
    pub(super) fn keep_scale<S: Scalar>(&self) -> S {
        if self.dropout_p < 1.0 {
            S::from_f64(1.0 / (1.0 - self.dropout_p))
        } else {
            S::ZERO
        }
    }
}

/// An error naming `op` unless `dropout_p` is a probability and `scale`, if given, is finite.
pub(super) fn check_dropout_and_scale(
    op: &'static str,
    dropout_p: f64,
    scale: Option<f64>,
) -> Result<()> {
    if !(0.0..=1.0).contains(&dropout_p) {
        return Err(Error::invalid(
            op,
            format!("dropout_p has to be between 0 and 1, but got {dropout_p}"),
        ));
    }
    match scale {
        Some(s) if !s.is_finite() => {
            Err(Error::invalid(op, format!("scale must be finite, got {s}")))
        }
        _ => Ok(()),
    }
}

/// The rows of `out` (`keys` each) as `softmax_derivative` writes them, from the rows of `p` and
/// `d` that start where they do.
pub(super) fn derivative_rows<S: Scalar>(
    p: &[S],
    d: &[S],
    out: &mut [S],
    keys: usize,
    then_scale: Option<S>,
) {
    let rows = out.len() / keys;
    // The rows' dot products eight at a time, with each one's bits.
    let mut dots = Vec::with_capacity(rows);
    let whole = rows - rows % DOT_ROWS;
    for first in (0..whole).step_by(DOT_ROWS) {
        let at = |g: usize, j: usize| {
            let i = (first + g) * keys + j;
            p[i] * d[i]
        };
        dots.extend(pairwise_sums_by::<S, DOT_ROWS>(keys, &at));
    }
    for r in whole..rows {
        let (pr, dr) = (&p[r * keys..(r + 1) * keys], &d[r * keys..(r + 1) * keys]);
        dots.push(pairwise_sum_by(keys, |j| pr[j] * dr[j]));
    }
    let rows = p.chunks(keys).zip(d.chunks(keys)).zip(dots);
    for (o, ((pr, dr), dot)) in out.chunks_mut(keys).zip(rows) {
        let terms = o.iter_mut().zip(pr).zip(dr);
        match then_scale {
            None => terms.for_each(|((o, &a), &b)| *o = a * (b - dot)),
            Some(c) => terms.for_each(|((o, &a), &b)| *o = a * (b - dot) * c),
        }
    }
}

/// Softmax of `scores * scale` over each whole row of `keys`, in place: the weights with no mask
/// (what the general masked path computes when every key takes part).
pub(super) fn unmasked_softmax_rows<S: Scalar>(p: &mut [S], keys: usize, scale: S) {
    if keys == 0 {
        return;
    }
    for row in p.chunks_mut(keys) {
        let Some(m) = row
            .iter()
            .map(|&s| s * scale + S::ZERO)
            .fold(None, |m: Option<S>, s| Some(m.map_or(s, |m| m.max_nan(s))))
        else {
            continue;
        };
        for s in row.iter_mut() {
            *s = (*s * scale + S::ZERO) - m;
        }
        exp_in_place(row);
        let total = pairwise_sum(row);
        for s in row.iter_mut() {
            *s /= total;
        }
    }
}

/// The causal weights in place over the raw scores `p` (row-major over `g.scores`): query `i`
/// of a row keeps keys `j <= i`, the row's valid prefix, known without a mask. The same values,
/// in the same order, as the general masked path of `weights`, so the bits are those of that
/// path and of a key/value-cache step cut at the row's last key.
fn causal_softmax_rows<S: Scalar>(g: &Geometry, p: &mut [S]) {
    let dims = g.scores.dims();
    let queries = dims[dims.len() - 2];
    causal_softmax(p, queries, g.keys, S::from_f64(g.scale));
}

fn add<S: Scalar>(a: Tensor<S>, b: &Tensor<S>) -> Result<Tensor<S>> {
    a.zip_map(b, "scaled_dot_product_attention", |x, y| x + y)
}

fn scaled<S: Scalar>(t: &Tensor<S>, by: f64) -> Tensor<S> {
    let by = S::from_f64(by);
    t.map(|v| v * by)
}

impl OpRules for ScaledDotProductAttention {
    fn arity(&self) -> Arity {
        Arity::Exact(if self.float_mask { 4 } else { 3 })
    }
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        Ok(self.geometry(inputs)?.out)
    }
    /// Query, key and value, and the float mask when there is one: the VJP recomputes the
    /// attention weights from them (as flash attention does) rather than keep a scores-sized
    /// tensor per call, and regenerates the dropout mask from the seed.
    fn saves(&self) -> Saves {
        if self.float_mask {
            Saves::inputs(&[0, 1, 2, 3])
        } else {
            Saves::inputs(&[0, 1, 2])
        }
    }
    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        let g = self.geometry(&Self::shapes_of(x))?;
        // The scores can be far larger than every argument and the result (long sequences).
        ensure_allocatable::<S>(self.name(), &g.scores)?;
        let p = self.weights(&g, x[0], x[1], x.get(3).copied())?;
        let out = self.products(&self.dropped(&p)?, false, x[2], false, Extent::LowerWeights)?;
        Ok(Forward::new(out))
    }
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let op = self.name();
        let shapes: Vec<&Shape> = ctx.input_shapes.iter().collect();
        let g = self.geometry(&shapes)?;
        let mask = match self.float_mask {
            true => Some(ctx.input(op, 3)?),
            false => None,
        };
        let p = &self.weights(&g, ctx.input(op, 0)?, ctx.input(op, 1)?, mask)?;
        // `dz`, the gradient of the pre-softmax scores `q k^T * scale + mask`, is the float
        // mask's; `ds = dz * scale`, that of `q k^T`, the query's and the key's. The weights
        // were broadcast over the value's extra leading dimensions, if any.
        let dz_needed = self.float_mask && ctx.needs(3);
        let ds_needed = ctx.needs(0) || ctx.needs(1);
        let (dz, ds) = if dz_needed || ds_needed {
            let v = ctx.input(op, 2)?;
            let dp = sum_to(
                &self.products(cot, false, v, true, Extent::LowerColumns)?,
                &g.scores,
            )?;
            let dp = self.dropped(&dp)?;
            if dz_needed {
                let dz = self.softmax_derivative(&g, p, &dp, None)?;
                let ds = ds_needed.then(|| scaled(&dz, g.scale));
                (Some(dz), ds)
            } else {
                // The same two roundings per element as `dz`, then `* scale`, in one pass.
                let ds = self.softmax_derivative(&g, p, &dp, Some(g.scale))?;
                (None, Some(ds))
            }
        } else {
            (None, None)
        };
        let dz = dz.as_ref();
        let need_dz = || dz.ok_or_else(|| Error::invalid(op, "score gradient missing"));
        let ds = ds.as_ref();
        let need_ds = || ds.ok_or_else(|| Error::invalid(op, "score gradient missing"));
        // Each summed back over the leading dimensions its argument was broadcast along.
        let to = |i: usize, t: Tensor<S>| sum_to(&t, &ctx.input_shapes[i]);
        let mut grads = smallvec![
            if ctx.needs(0) {
                let k = ctx.input(op, 1)?;
                let dq = self.products(need_ds()?, false, k, false, Extent::LowerWeights)?;
                Some(to(0, dq)?)
            } else {
                None
            },
            if ctx.needs(1) {
                let q = ctx.input(op, 0)?;
                let dk = self.products(need_ds()?, true, q, false, Extent::UpperWeights)?;
                Some(to(1, dk)?)
            } else {
                None
            },
            if ctx.needs(2) {
                let p = self.dropped(p)?;
                let dv = self.products(&p, true, cot, false, Extent::UpperWeights)?;
                Some(to(2, dv)?)
            } else {
                None
            },
        ];
        if let Some(mask_shape) = &g.float_mask {
            grads.push(if ctx.needs(3) {
                Some(sum_to(need_dz()?, mask_shape)?)
            } else {
                None
            });
        }
        Ok(grads)
    }
    fn jvp<S: Scalar>(
        &self,
        x: &[&Tensor<S>],
        _out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        self.tangent(x, t)
    }
}

impl ScaledDotProductAttention {
    /// The JVP: the output's tangent from the arguments `x` and their tangents `t`.
    pub(super) fn tangent<S: Scalar>(
        &self,
        x: &[&Tensor<S>],
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        let g = self.geometry(&Self::shapes_of(x))?;
        let p = &self.weights(&g, x[0], x[1], x.get(3).copied())?;
        // d(pre-softmax scores) = (dq k^T + q dk^T) * scale + d mask.
        let mut dz = scaled(
            &add(
                self.products(t[0], false, x[1], true, Extent::LowerColumns)?,
                &self.products(x[0], false, t[1], true, Extent::LowerColumns)?,
            )?,
            g.scale,
        );
        if g.float_mask.is_some() {
            dz = add(dz, &broadcast_to(t[3], &g.scores)?)?;
        }
        let dp = self.dropped(&self.softmax_derivative(&g, p, &dz, None)?)?;
        add(
            self.products(&dp, false, x[2], false, Extent::LowerWeights)?,
            &self.products(&self.dropped(p)?, false, t[2], false, Extent::LowerWeights)?,
        )
    }
}

impl std::fmt::Display for ScaledDotProductAttention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mask = match (&self.attn_mask, self.float_mask) {
            (Some(m), _) => m.shape.to_string(),
            (None, true) => "float argument".to_string(),
            (None, false) => "none".to_string(),
        };
        write!(
            f,
            "scaled_dot_product_attention(is_causal={}, scale={:?}, attn_mask={mask}",
            self.is_causal, self.scale
        )?;
        if self.dropout_p != 0.0 {
            write!(f, ", dropout_p={}, seed={}", self.dropout_p, self.seed)?;
        }
        write!(f, ")")
    }
}
