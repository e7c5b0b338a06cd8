//! `qkv_attention`: multi-head scaled dot-product attention read straight from the packed
//! `[..., T, 3E]` output of one q|k|v projection and written straight into `[..., T, E]`. It is
//! the split into heads, `scaled_dot_product_attention` and the merge of the heads, with their
//! bits, but without their copies in the forward pass or their zero-filled gradients in the VJP.

use super::attention::{
    check_dropout_and_scale, derivative_rows, unmasked_softmax_rows, Geometry,
    ScaledDotProductAttention,
};
use super::dropout::dropout_mask;
use crate::ops::{Arity, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::kernels::alloc::ensure_allocatable;
use tapegrad_tensor::kernels::causal_softmax::causal_softmax;
use tapegrad_tensor::kernels::for_each_band_mut;
use tapegrad_tensor::kernels::head_product::{head_product, Extent};
use tapegrad_tensor::kernels::matmul::min_products_per_thread;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// Self-attention over the heads of a packed projection `qkv` of shape `[..., T, 3E]`: with
/// `q, k, v = qkv.split(E, dim=-1)`, each viewed as `[..., T, heads, E / heads]` and transposed to
/// `[..., heads, T, E / heads]`, the result is
/// `F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal,
/// scale=scale).transpose(-3, -2)` reshaped to `[..., T, E]` (nanoGPT's attention between its
/// `c_attn` and `c_proj`). The scale defaults to `1 / sqrt(E / heads)`; dropout draws its mask
/// from `seed` over the `[..., heads, T, T]` weights, as `scaled_dot_product_attention` does.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QkvAttention {
    pub heads: usize,
    pub is_causal: bool,
    pub scale: Option<f64>,
    pub dropout_p: f64,
    pub seed: u64,
}

/// Where one call's operands lie: leading (batch) rows of `t` positions, each position's `3e`
/// projections (q, k, v, each `heads` blocks of `d`) contiguous.
struct Layout {
    t: usize,
    e: usize,
    heads: usize,
    d: usize,
}

impl Layout {
    /// Elements of one part (q, k or v) of one batch row: `heads x t x d`.
    fn part_len(&self) -> usize {
        self.heads * self.t * self.d
    }

    /// Parts `0..N` of batch row `b` of `src` (rows of `width` elements, part `p`'s heads from
    /// column `p * e`) copied out, part `p` as `[heads, t, d]` into `out[p]`, or as `[heads, d,
    /// t]` (each head transposed) where `transposed[p]`. Row by row, every part at once, so that
    /// the source (far larger than a cache) is read in order, once.
    fn gather<S: Copy, const N: usize>(
        &self,
        src: &[S],
        width: usize,
        b: usize,
        mut out: [&mut [S]; N],
        transposed: [bool; N],
    ) {
        let (t, d) = (self.t, self.d);
        for i in 0..t {
            let row = &src[(b * t + i) * width..];
            for (part, out) in out.iter_mut().enumerate() {
                for h in 0..self.heads {
                    let at = part * self.e + h * d;
                    let from = &row[at..at + d];
                    if transposed[part] {
                        let head = &mut out[h * t * d..(h + 1) * t * d];
                        for (l, &v) in from.iter().enumerate() {
                            head[l * t + i] = v;
                        }
                    } else {
                        copy_head_row(&mut out[(h * t + i) * d..(h * t + i + 1) * d], from);
                    }
                }
            }
        }
    }

    /// `gather`'s inverse: `heads[p]` (`[heads, t, d]`) into part `p` of `rows`, one batch row's
    /// `t x width` block, written in order.
    fn scatter<S: Copy, const N: usize>(&self, heads: [&[S]; N], width: usize, rows: &mut [S]) {
        let (t, d) = (self.t, self.d);
        for i in 0..t {
            let row = &mut rows[i * width..];
            for (part, heads) in heads.iter().enumerate() {
                for h in 0..self.heads {
                    let at = part * self.e + h * d;
                    copy_head_row(
                        &mut row[at..at + d],
                        &heads[(h * t + i) * d..(h * t + i + 1) * d],
                    );
                }
            }
        }
    }

    /// `out = w rhs` (`w^T rhs` when `transpose`) for one head: `w` a `t x t` block of weights
    /// (or of their gradient), zero above its diagonal when causal, and `rhs` and `out` `t x d`,
    /// all contiguous, as `scaled_dot_product_attention`'s batched products lay them out; a
    /// causal product skips the zero weights.
    fn weights_times<S: Scalar>(
        &self,
        causal: bool,
        out: &mut [S],
        w: &[S],
        transpose: bool,
        rhs: &[S],
    ) {
        let (t, d) = (self.t, self.d);
        let (strides, extent) = match (transpose, causal) {
            (false, false) => ((t, 1), Extent::Full),
            (false, true) => ((t, 1), Extent::LowerWeights),
            (true, false) => ((1, t), Extent::Full),
            (true, true) => ((1, t), Extent::UpperWeights),
        };
        head_product(out, (t, d, t), (w, strides.0, strides.1), rhs, extent);
    }

    /// `out = a b^T` for one head: `a` `t x d` and `bt` (`b` transposed) `d x t`; when causal,
    /// only the scores a causal softmax keeps (the rest are +0).
    fn scores<S: Scalar>(&self, causal: bool, out: &mut [S], a: &[S], bt: &[S]) {
        let (t, d) = (self.t, self.d);
        let extent = if causal {
            Extent::LowerColumns
        } else {
            Extent::Full
        };
        head_product(out, (t, t, d), (a, d, 1), bt, extent);
    }

    /// Each head of `heads` (`[heads, t, d]`) transposed into `out` (`[heads, d, t]`).
    fn transpose_heads<S: Copy>(&self, heads: &[S], out: &mut [S]) {
        let (t, d) = (self.t, self.d);
        for (head, out) in heads.chunks_exact(t * d).zip(out.chunks_exact_mut(t * d)) {
            for (i, row) in head.chunks_exact(d).enumerate() {
                for (l, &v) in row.iter().enumerate() {
                    out[l * t + i] = v;
                }
            }
        }
    }

    /// `f(b, block, scratch)` for every batch row `b`, where `block` is row `b`'s `row_len`
    /// elements of `out` and `scratch` holds `scratch_len` elements; batch rows of `work`
    /// multiply-adds each go to the threads whole (each product on one thread, so the bits do
    /// not depend on the thread count).
    fn per_batch_row<S: Scalar>(
        &self,
        out: &mut [S],
        row_len: usize,
        work: usize,
        scratch_len: usize,
        f: impl Fn(usize, &mut [S], &mut [S]) + Sync,
    ) {
        if out.is_empty() || row_len == 0 {
            return;
        }
        for_each_band_mut(
            out,
            row_len,
            min_products_per_thread(work),
            |start, band| {
                let mut scratch = vec![S::ZERO; scratch_len];
                for (i, block) in band.chunks_mut(row_len).enumerate() {
                    f(start / row_len + i, block, &mut scratch);
                }
            },
        )
    }
}

/// `dst.copy_from_slice(src)` for one head's row (tens of elements), in fixed blocks of 16 that
/// compile to a few vector moves: `copy_from_slice` of a length known only at run time calls
/// `memmove`, whose call costs as much as such a copy.
#[inline(always)]
fn copy_head_row<S: Copy>(dst: &mut [S], src: &[S]) {
    let mut blocks = dst.chunks_exact_mut(16);
    let mut from = src.chunks_exact(16);
    for (d, s) in (&mut blocks).zip(&mut from) {
        let d: &mut [S; 16] = d.try_into().unwrap_or_else(|_| unreachable!());
        *d = s.try_into().unwrap_or_else(|_| unreachable!());
    }
    for (d, s) in blocks.into_remainder().iter_mut().zip(from.remainder()) {
        *d = *s;
    }
}

impl QkvAttention {
    /// The equivalent `scaled_dot_product_attention` on the split heads.
    fn on_heads(&self) -> ScaledDotProductAttention {
        ScaledDotProductAttention {
            is_causal: self.is_causal,
            scale: self.scale,
            dropout_p: self.dropout_p,
            seed: self.seed,
            ..Default::default()
        }
    }

    /// The layout of `qkv`, the shape of one split part (`[..., heads, T, E / heads]`) and the
    /// geometry of attention on the split heads.
    fn layout(&self, qkv: &Shape) -> Result<(Layout, Shape, Geometry)> {
        let op = self.name();
        let dims = qkv.dims();
        let Some(split) = dims.len().checked_sub(2) else {
            return Err(Error::invalid(
                op,
                format!("qkv must have rank 2 or more (..., T, 3E), found {qkv}"),
            ));
        };
        if self.heads == 0 {
            return Err(Error::invalid(op, "heads must be at least 1, got 0"));
        }
        check_dropout_and_scale(op, self.dropout_p, self.scale)?;
        let (t, width) = (dims[split], dims[split + 1]);
        if self
            .heads
            .checked_mul(3)
            .is_none_or(|group| width % group != 0)
        {
            return Err(Error::invalid(
                op,
                format!(
                    "the last dimension of qkv {qkv} ({width}) is not 3 x heads ({}) x a head width",
                    self.heads
                ),
            ));
        }
        let (e, d) = (width / 3, width / 3 / self.heads);
        let mut part = dims[..split].to_vec();
        part.extend([self.heads, t, d]);
        let part = Shape::for_op(op, part)?;
        let g = self.on_heads().geometry(&[&part, &part, &part])?;
        let layout = Layout {
            t,
            e,
            heads: self.heads,
            d,
        };
        Ok((layout, part, g))
    }

    /// The dropout keep-mask over all the weights, when there is dropout.
    fn dropout_mask(&self, weights: usize) -> Option<Vec<bool>> {
        (self.dropout_p != 0.0).then(|| dropout_mask(self.seed, weights, self.dropout_p))
    }

    /// One batch row's attention weights in `p` (`[heads, t, t]`) from its heads `q` and `kt`
    /// (`k` transposed, `[heads, d, t]`), before dropout: the products, then the softmax, row
    /// for row as `scaled_dot_product_attention` makes them.
    fn weights<S: Scalar>(&self, l: &Layout, scale: S, q: &[S], kt: &[S], p: &mut [S]) {
        let (t, d) = (l.t, l.d);
        for h in 0..l.heads {
            let s = &mut p[h * t * t..(h + 1) * t * t];
            l.scores(self.is_causal, s, &q[h * t * d..], &kt[h * t * d..]);
        }
        if self.is_causal {
            causal_softmax(p, t, t, scale);
        } else {
            unmasked_softmax_rows(p, t, scale);
        }
    }

    /// Dropout on batch row `b`'s `[heads, t, t]` block of weights (or of their change), in
    /// place: `mask` is drawn over every batch row's weights, as `scaled_dot_product_attention`
    /// draws it.
    fn drop_in_place<S: Scalar>(&self, mask: Option<&[bool]>, block: usize, b: usize, w: &mut [S]) {
        let Some(mask) = mask else {
            return;
        };
        let keep_scale = self.on_heads().keep_scale::<S>();
        for (v, &keep) in w.iter_mut().zip(&mask[b * block..(b + 1) * block]) {
            *v = if keep { *v * keep_scale } else { S::ZERO };
        }
    }
}

impl OpRules for QkvAttention {
    fn arity(&self) -> Arity {
        Arity::Exact(1)
    }
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        let (l, _, _) = self.layout(inputs[0])?;
        let mut out = inputs[0].dims().to_vec();
        let last = out.len() - 1;
        out[last] = l.e;
        Shape::for_op(self.name(), out)
    }
    /// `qkv` alone: the VJP recomputes the attention weights from it, as
    /// `scaled_dot_product_attention`'s does from its arguments.
    fn saves(&self) -> Saves {
        Saves::inputs(&[0])
    }
    /// One batch row at a time, everything in cache: its heads copied out, the weights, the
    /// products by `v`, the heads merged into the output. No scores-sized tensor exists.
    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        let (l, _, g) = self.layout(x[0].shape())?;
        ensure_allocatable::<S>(self.name(), &g.scores)?;
        let qkv = x[0].data();
        let (t, d, e, n, block) = (l.t, l.d, l.e, l.part_len(), l.heads * l.t * l.t);
        let scale = S::from_f64(g.scale);
        let mask = self.dropout_mask(g.scores.numel());
        let out = Tensor::from_writer(self.output_shape(&[x[0].shape()])?, |out| {
            let work = 2 * block * d;
            l.per_batch_row(out, t * e, work, 4 * n + block, |b, rows, scratch| {
                let (heads, p) = scratch.split_at_mut(4 * n);
                let (q, rest) = heads.split_at_mut(n);
                let (kt, rest) = rest.split_at_mut(n);
                let (v, y) = rest.split_at_mut(n);
                let parts = [&mut *q, &mut *kt, &mut *v];
                l.gather(qkv, 3 * e, b, parts, [false, true, false]);
                self.weights(&l, scale, q, kt, p);
                self.drop_in_place(mask.as_deref(), block, b, p);
                for h in 0..l.heads {
                    let head = h * t * d..(h + 1) * t * d;
                    let ph = &p[h * t * t..];
                    l.weights_times(self.is_causal, &mut y[head.clone()], ph, false, &v[head]);
                }
                l.scatter([&*y], e, rows);
            })
        });
        Ok(Forward::new(out))
    }
    /// One batch row at a time, as the forward: the weights recomputed, `dP = dY V^T`, through
    /// dropout and the softmax to `ds` (the gradient of `q k^T`, with the scale), then
    /// `dq = ds k`, `dk = ds^T q`, `dv = dropout(P)^T dY`, each written where its part of `qkv`
    /// came from.
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        if !ctx.needs(0) {
            return Ok(smallvec![None]);
        }
        let op = self.name();
        let x = ctx.input(op, 0)?;
        let (l, _, g) = self.layout(x.shape())?;
        if cot.dims()[..] != self.output_shape(&[x.shape()])?.dims()[..] {
            return Err(Error::invalid(
                op,
                format!("cotangent {} does not match qkv {}", cot.shape(), x.shape()),
            ));
        }
        let (qkv, dy) = (x.data(), cot.data());
        let (t, d, e, n, block) = (l.t, l.d, l.e, l.part_len(), l.heads * l.t * l.t);
        let scale = S::from_f64(g.scale);
        let mask = self.dropout_mask(g.scores.numel());
        let grad = Tensor::from_writer(x.shape().clone(), |out| {
            let work = 5 * block * d;
            l.per_batch_row(
                out,
                3 * t * e,
                work,
                8 * n + 3 * block,
                |b, rows, scratch| {
                    let (heads, weights) = scratch.split_at_mut(8 * n);
                    let (q, rest) = heads.split_at_mut(n);
                    let (k, rest) = rest.split_at_mut(n);
                    let (vt, rest) = rest.split_at_mut(n);
                    let (dyb, rest) = rest.split_at_mut(n);
                    let (kt, grads) = rest.split_at_mut(n);
                    let (p, rest) = weights.split_at_mut(block);
                    let (dp, ds) = rest.split_at_mut(block);
                    let parts = [&mut *q, &mut *k, &mut *vt];
                    l.gather(qkv, 3 * e, b, parts, [false, false, true]);
                    l.gather(dy, e, b, [&mut *dyb], [false]);
                    l.transpose_heads(k, kt);
                    self.weights(&l, scale, q, kt, p);
                    for h in 0..l.heads {
                        let s = &mut dp[h * t * t..(h + 1) * t * t];
                        l.scores(self.is_causal, s, &dyb[h * t * d..], &vt[h * t * d..]);
                    }
                    self.drop_in_place(mask.as_deref(), block, b, dp);
                    if t > 0 {
                        derivative_rows(p, dp, ds, t, Some(scale));
                    }
                    // `p` becomes dropout(P), which `dv` multiplies.
                    self.drop_in_place(mask.as_deref(), block, b, p);
                    let (dq, rest) = grads.split_at_mut(n);
                    let (dk, dv) = rest.split_at_mut(n);
                    for h in 0..l.heads {
                        let (dsh, ph) = (&ds[h * t * t..], &p[h * t * t..]);
                        let head = h * t * d..(h + 1) * t * d;
                        let (qh, kh, dyh) =
                            (&q[head.clone()], &k[head.clone()], &dyb[head.clone()]);
                        let causal = self.is_causal;
                        l.weights_times(causal, &mut dq[head.clone()], dsh, false, kh);
                        l.weights_times(causal, &mut dk[head.clone()], dsh, true, qh);
                        l.weights_times(causal, &mut dv[head], ph, true, dyh);
                    }
                    l.scatter([&*dq, &*dk, &*dv], 3 * e, rows);
                },
            )
        });
        Ok(smallvec![Some(grad)])
    }
    fn jvp<S: Scalar>(
        &self,
        x: &[&Tensor<S>],
        _out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        let (l, part, g) = self.layout(x[0].shape())?;
        ensure_allocatable::<S>(self.name(), &g.scores)?;
        let ([q, k, v], [tq, tk, tv]) =
            (split_heads(&l, &part, x[0])?, split_heads(&l, &part, t[0])?);
        let y = self.on_heads().tangent(&[&q, &k, &v], &[&tq, &tk, &tv])?;
        merge_heads(&l, &y, self.output_shape(&[x[0].shape()])?)
    }
}

/// `qkv`'s q, k and v, each split into heads: `[..., heads, T, E / heads]`.
fn split_heads<S: Scalar>(l: &Layout, shape: &Shape, qkv: &Tensor<S>) -> Result<[Tensor<S>; 3]> {
    if shape.numel() == 0 {
        // Also when `heads` is huge and the head width 0: no loop over the heads.
        return Ok(std::array::from_fn(|_| Tensor::zeros(shape)));
    }
    let n = l.part_len();
    let mut parts = [(); 3].map(|_| vec![S::ZERO; shape.numel()]);
    let [q, k, v] = &mut parts;
    let blocks = q.chunks_mut(n).zip(k.chunks_mut(n)).zip(v.chunks_mut(n));
    for (b, ((q, k), v)) in blocks.enumerate() {
        l.gather(qkv.data(), 3 * l.e, b, [q, k, v], [false; 3]);
    }
    let [q, k, v] = parts.map(|data| Tensor::from_shape(shape.clone(), data));
    Ok([q?, k?, v?])
}

/// `[..., heads, T, E / heads]` heads merged back into `[..., T, E]`.
fn merge_heads<S: Scalar>(l: &Layout, y: &Tensor<S>, shape: Shape) -> Result<Tensor<S>> {
    if shape.numel() == 0 {
        return Ok(Tensor::zeros(&shape));
    }
    let mut data = vec![S::ZERO; shape.numel()];
    let heads = y.data().chunks(l.part_len());
    for (rows, heads) in data.chunks_mut(l.t * l.e).zip(heads) {
        l.scatter([heads], l.e, rows);
    }
    Tensor::from_shape(shape, data)
}

impl std::fmt::Display for QkvAttention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "qkv_attention(heads={}, is_causal={}, scale={:?}",
            self.heads, self.is_causal, self.scale
        )?;
        if self.dropout_p != 0.0 {
            write!(f, ", dropout_p={}, seed={}", self.dropout_p, self.seed)?;
        }
        write!(f, ")")
    }
}
