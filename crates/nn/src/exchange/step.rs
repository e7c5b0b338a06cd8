//! One optimizer step's gradient over K micro-batches, for gradient accumulation (`--accumulate
//! K`, all in one process) and for a data-parallel step (one micro-batch per rank): both fold the
//! same micro-batches in the same order, so N ranks give the bits of `--accumulate N` in one
//! process (law 10 of `docs/design.md`). The rule, written once here for every run:
//! - Split: a batch of `n` rows (windows, for the GPT) gives micro-batch `k` the rows
//!   `[k*q + min(k, r), ..)` with `q = n / K`, `r = n % K`: the first `r` micro-batches hold one
//!   row more, so every row of the batch is used and sizes differ by at most one. A micro-batch
//!   can be empty only when `n < K` (the last batch of an epoch); it contributes nothing.
//! - Gradients: micro-batch `k` gives its mean-loss gradient `g_k` (the backends' loss is a mean)
//!   and weight `c_k = K * m_k / n` (exactly 1 when the sizes are equal); the step's gradient is
//!   `(c_0 g_0 + c_1 g_1 + ...) / K`, added left to right in micro-batch order, divided once.
//!   Mathematically this is the batch's mean gradient whatever the sizes.
//! - Batch norm: each micro-batch normalises with its own statistics (as PyTorch's DDP without
//!   SyncBatchNorm); the running statistics become the same weighted mean of the micro-batches'
//!   updated values, folded like the gradients.
//! - Dropout: micro-batch `k` of step `t` draws from `dropout_micro_rng(seed, t, k)`.
//! - The loss is `(sum of c_k L_k) / K` (the batch's mean loss), the accuracy the batch's.

use super::Exchange;
use super::Work;
use crate::backend::OnGrad;
use crate::error::{NnError, NnResult};
use crate::grad::Grad;
use crate::params::{ParamId, ParamKind, ParamSet};
use std::ops::Range;
use tapegrad_tensor::{DType, Scalar, Tensor};

/// The rows of each of `k` micro-batches of a batch of `n` rows (see the module's rule).
pub fn micro_batches(n: usize, k: usize) -> Vec<Range<usize>> {
    let k = k.max(1);
    let (q, r) = (n / k, n % k);
    (0..k)
        .map(|i| {
            let start = i * q + i.min(r);
            start..start + q + usize::from(i < r)
        })
        .collect()
}

/// Where each trainable tensor's gradient and each buffer's new value lie in a flat buffer.
pub(crate) struct Layout {
    /// (shape, offset) of every trainable tensor in registration order: the gradients first.
    trainable: Vec<(Vec<usize>, usize)>,
    /// (index in the set, name, shape, offset) of every buffer, after the gradients.
    buffers: Vec<(usize, String, Vec<usize>, usize)>,
    len: usize,
}

impl Layout {
    pub(crate) fn of<S: Scalar>(params: &ParamSet<S>) -> Layout {
        let mut len = 0;
        let mut trainable = Vec::new();
        for p in params.trainable() {
            trainable.push((p.value.dims().to_vec(), len));
            len += p.value.numel();
        }
        let mut buffers = Vec::new();
        for (i, p) in params.iter().enumerate() {
            if p.kind == ParamKind::Buffer {
                buffers.push((i, p.name.clone(), p.value.dims().to_vec(), len));
                len += p.value.numel();
            }
        }
        Layout {
            trainable,
            buffers,
            len,
        }
    }

    /// Where the buffers start: the number of gradient values.
    fn grad_len(&self) -> usize {
        self.buffers.first().map_or(self.len, |b| b.3)
    }

    /// A step's gradients (one per trainable tensor) and its buffers' new values in one flat
    /// buffer; every buffer must have been updated.
    pub(crate) fn flatten<S: Scalar>(
        &self,
        grads: Vec<Grad<S>>,
        updates: Vec<(ParamId, Tensor<S>)>,
    ) -> NnResult<Vec<S>> {
        let mut flat = Vec::with_capacity(self.len);
        for g in Grad::all_dense(grads)? {
            flat.extend_from_slice(g.data());
        }
        if flat.len() != self.grad_len() {
            return Err(NnError::Config(format!(
                "accumulation: the step gave {} gradient values for {} trainable values",
                flat.len(),
                self.grad_len()
            )));
        }
        flat.resize(self.len, S::ZERO);
        let mut seen = vec![false; self.buffers.len()];
        for (id, value) in updates {
            let slot = self
                .buffers
                .iter()
                .position(|b| b.0 == id.index())
                .filter(|&s| self.buffers[s].2 == value.dims())
                .ok_or_else(|| {
                    NnError::Config(format!(
                        "accumulation: the step updated tensor {} ({}), which is not a buffer of that shape",
                        id.index(),
                        value.shape()
                    ))
                })?;
            let off = self.buffers[slot].3;
            flat[off..off + value.numel()].copy_from_slice(value.data());
            seen[slot] = true;
        }
        if let Some(missing) = seen.iter().position(|s| !s) {
            return Err(NnError::Config(format!(
                "accumulation needs every buffer updated by a training step; {} was not",
                self.buffers[missing].1
            )));
        }
        Ok(flat)
    }

    /// The gradients held by flat buffer `flat`, one tensor per trainable tensor.
    pub(crate) fn grads<S: Scalar>(&self, flat: &[S]) -> NnResult<Vec<Tensor<S>>> {
        self.trainable
            .iter()
            .map(|(dims, off)| {
                let size: usize = dims.iter().product();
                Ok(Tensor::new(dims, flat[*off..off + size].to_vec())?)
            })
            .collect()
    }

    /// The buffers' new values held by flat buffer `flat`: `(id, value)`.
    pub(crate) fn buffers<S: Scalar>(&self, flat: &[S]) -> NnResult<Vec<(ParamId, Tensor<S>)>> {
        self.buffers
            .iter()
            .map(|(index, _, dims, off)| {
                let size: usize = dims.iter().product();
                Ok((
                    ParamId(*index),
                    Tensor::new(dims, flat[*off..off + size].to_vec())?,
                ))
            })
            .collect()
    }
}

/// How a flat buffer is cut into the buckets of an overlapped exchange: the gradients in the
/// backward's order (the last tensor first, as PyTorch's DDP), whole tensors per bucket, then one
/// bucket for the buffers' values, which exist only once the step is done.
struct Buckets {
    /// Per bucket: its `(offset in the flat buffer, length)` pieces, in bucket order.
    pieces: Vec<Vec<(usize, usize)>>,
    /// Per trainable tensor: its bucket, its offset there and its length.
    place: Vec<(usize, usize, usize)>,
    lens: Vec<usize>,
    /// How many buckets hold gradients (the buffers' one, if any, comes after them).
    grad_buckets: usize,
}

impl Buckets {
    /// Buckets of at least `cap` values (the last one may hold fewer).
    fn of(layout: &Layout, cap: usize) -> Buckets {
        let mut b = Buckets {
            pieces: Vec::new(),
            place: vec![(0, 0, 0); layout.trainable.len()],
            lens: Vec::new(),
            grad_buckets: 0,
        };
        let mut open = false;
        for (j, (dims, off)) in layout.trainable.iter().enumerate().rev() {
            let len: usize = dims.iter().product();
            if !open {
                b.pieces.push(Vec::new());
                b.lens.push(0);
            }
            let last = b.lens.len() - 1;
            b.place[j] = (last, b.lens[last], len);
            b.pieces[last].push((*off, len));
            b.lens[last] += len;
            open = b.lens[last] < cap;
        }
        b.grad_buckets = b.lens.len();
        let grad_len = layout.grad_len();
        if layout.len > grad_len {
            b.pieces.push(vec![(grad_len, layout.len - grad_len)]);
            b.lens.push(layout.len - grad_len);
        }
        b
    }

    /// Where the flat buffer's values lie in the buckets, in the flat buffer's order: `(bucket,
    /// offset there, length)` per trainable tensor, then the buffers' bucket.
    fn in_flat_order(&self, layout: &Layout) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let buffers = (self.lens.len() > self.grad_buckets)
            .then(|| (self.grad_buckets, 0, layout.len - layout.grad_len()));
        self.place.iter().copied().chain(buffers)
    }

    /// Bucket `b`'s values, cut from flat buffer `flat` and converted to the wire type.
    fn cut<S: Scalar, W: Wire>(&self, b: usize, flat: &[S]) -> Vec<W> {
        let mut out = Vec::with_capacity(self.lens[b]);
        for &(off, len) in &self.pieces[b] {
            out.extend(flat[off..off + len].iter().map(|&v| W::from_scalar(v)));
        }
        out
    }
}

/// The element type a flat buffer travels in: the run's own (f32 values pass through f64 and
/// back exactly, so the conversions are only copies).
trait Wire: Copy + Default + 'static {
    fn from_scalar<S: Scalar>(v: S) -> Self;
    fn to_scalar<S: Scalar>(self) -> S;
    fn overlap(
        ex: &mut dyn Exchange,
        lens: &[usize],
        work: Work<'_, Self>,
    ) -> NnResult<Vec<Vec<Self>>>;
}

impl Wire for f32 {
    fn from_scalar<S: Scalar>(v: S) -> Self {
        v.to_f64() as f32
    }
    fn to_scalar<S: Scalar>(self) -> S {
        S::from_f64(f64::from(self))
    }
    fn overlap(
        ex: &mut dyn Exchange,
        lens: &[usize],
        work: Work<'_, f32>,
    ) -> NnResult<Vec<Vec<f32>>> {
        ex.overlap_f32(lens, work)
    }
}

impl Wire for f64 {
    fn from_scalar<S: Scalar>(v: S) -> Self {
        v.to_f64()
    }
    fn to_scalar<S: Scalar>(self) -> S {
        S::from_f64(self)
    }
    fn overlap(
        ex: &mut dyn Exchange,
        lens: &[usize],
        work: Work<'_, f64>,
    ) -> NnResult<Vec<Vec<f64>>> {
        ex.overlap_f64(lens, work)
    }
}

/// One micro-batch's contribution: its size, mean loss, correct predictions (classification;
/// 0 otherwise) and its flat buffer (`Layout::flatten`).
pub(crate) struct Micro<S> {
    pub(crate) meta: [f64; 3],
    pub(crate) flat: Vec<S>,
}

impl<S: Scalar> Micro<S> {
    /// A micro-batch without rows: it contributes nothing.
    pub(crate) fn empty(layout: &Layout) -> Self {
        Micro {
            meta: [0.0; 3],
            flat: vec![S::ZERO; layout.len],
        }
    }
}

/// The running fold of micro-batches, in order.
struct Fold<S> {
    k: usize,
    n: usize,
    acc: Option<Vec<S>>,
    loss: f64,
    correct: f64,
}

impl<S: Scalar> Fold<S> {
    /// Counts micro-batch `meta`'s loss and correct predictions and returns its weight `c_k`;
    /// `None` for an empty micro-batch, which contributes nothing.
    fn weigh(&mut self, meta: &[f64]) -> Option<S> {
        let rows = meta[0];
        if rows == 0.0 {
            return None;
        }
        let c = self.k as f64 * rows / self.n as f64;
        self.loss += c * meta[1];
        self.correct += meta[2];
        Some(S::from_f64(c))
    }

    /// Adds micro-batch `meta`/`flat`; empty micro-batches are skipped.
    fn add(&mut self, meta: &[f64], flat: &[S]) {
        let Some(cs) = self.weigh(meta) else {
            return;
        };
        match &mut self.acc {
            None => self.acc = Some(flat.iter().map(|&v| cs * v).collect()),
            Some(acc) => {
                for (a, &v) in acc.iter_mut().zip(flat) {
                    *a += cs * v;
                }
            }
        }
    }

    /// The scaled sum, the batch's loss and its correct count.
    fn finish(mut self) -> NnResult<Micro<S>> {
        let mut acc = self.acc.take().ok_or_else(no_rows)?;
        let k = S::from_usize(self.k);
        for a in &mut acc {
            *a /= k;
        }
        Ok(Micro {
            meta: self.meta(),
            flat: acc,
        })
    }

    /// The batch's size, mean loss and correct count.
    fn meta(&self) -> [f64; 3] {
        [self.n as f64, self.loss / self.k as f64, self.correct]
    }

    /// `add` of every rank's buffer in rank order, then `finish`, folded straight from the
    /// exchanged buckets one tensor at a time: each tensor's sum stays in cache, and no rank's
    /// whole buffer is put together. Each value meets the same operations in the same order (the
    /// first non-empty rank's `c * v`, `+ c * v` for each later one, `/ K`), so the bits are
    /// those of `add` and `finish`.
    fn finish_gathered<W: Wire>(
        mut self,
        layout: &Layout,
        gathered: &Gathered<W>,
    ) -> NnResult<Micro<S>> {
        let Gathered {
            metas,
            buckets,
            values,
        } = gathered;
        let weights: Vec<(usize, S)> = metas
            .chunks_exact(3)
            .enumerate()
            .filter_map(|(r, meta)| self.weigh(meta).map(|c| (r, c)))
            .collect();
        let Some((&(first, c_first), rest)) = weights.split_first() else {
            return Err(no_rows());
        };
        let k = S::from_usize(self.k);
        let mut acc: Vec<S> = Vec::with_capacity(layout.len);
        for (b, at, len) in buckets.in_flat_order(layout) {
            let rank_part = |r: usize| {
                let start = r * buckets.lens[b] + at;
                &values[b][start..start + len]
            };
            let start = acc.len();
            acc.extend(rank_part(first).iter().map(|&v| c_first * v.to_scalar()));
            let sum = &mut acc[start..];
            for &(r, c) in rest {
                for (a, &v) in sum.iter_mut().zip(rank_part(r)) {
                    *a += c * v.to_scalar();
                }
            }
            for a in sum {
                *a /= k;
            }
        }
        Ok(Micro {
            meta: self.meta(),
            flat: acc,
        })
    }
}

fn no_rows() -> NnError {
    NnError::Config("accumulation: the batch had no rows".into())
}

/// Runs micro-batch `index` (its rows `rows` of the batch), telling the sink each gradient as
/// soon as the backward has made it final (`Backend::train_step_observed`) when one is given.
pub(crate) type RunMicro<'a, S> =
    &'a mut dyn FnMut(usize, Range<usize>, Option<OnGrad<'_, S>>) -> NnResult<Micro<S>>;

/// `RunMicro` for this rank's micro-batch.
type RunMine<'a, S> = &'a mut dyn FnMut(Option<OnGrad<'_, S>>) -> NnResult<Micro<S>>;

/// The step's fold over `k` micro-batches of a batch of `n` rows (`Micro::meta` then holds `n`,
/// the batch's mean loss and its correct count): every micro-batch run here, or, with an
/// exchange, this rank's one run while its gradients are exchanged and every rank's buffers
/// folded in rank order. A failure on this rank ends the job (`Exchange::abort`).
pub(crate) fn accumulate<S: Scalar>(
    n: usize,
    k: usize,
    layout: &Layout,
    exchange: Option<&mut Box<dyn Exchange>>,
    run: RunMicro<'_, S>,
) -> NnResult<Micro<S>> {
    let parts = micro_batches(n, k);
    let mut fold = Fold::<S> {
        k,
        n,
        acc: None,
        loss: 0.0,
        correct: 0.0,
    };
    match exchange {
        None => {
            for (i, rows) in parts.into_iter().enumerate() {
                let m = run(i, rows, None)?;
                fold.add(&m.meta, &m.flat);
            }
        }
        Some(ex) => {
            let ex: &mut dyn Exchange = ex.as_mut();
            let (i, size) = (ex.rank(), ex.size());
            if size != k || i >= k {
                return Err(NnError::Config(format!(
                    "distributed: rank {i} of {size} for a step of {k} micro-batches"
                )));
            }
            let rows = parts[i].clone();
            let mine: RunMine<'_, S> = &mut |on| run(i, rows.clone(), on);
            return match S::DTYPE {
                DType::F32 => exchange_and_fold::<S, f32>(ex, layout, fold, mine),
                DType::F64 => exchange_and_fold::<S, f64>(ex, layout, fold, mine),
            };
        }
    }
    fold.finish()
}

/// This rank's micro-batch run (`run`) while its gradients are exchanged: each bucket is handed
/// to `ex` as soon as the backward has made all its gradients final and every bucket before it
/// was handed over. Returns every rank's `Micro::meta` and buckets, in rank order.
fn exchanged<S: Scalar, W: Wire>(
    ex: &mut dyn Exchange,
    layout: &Layout,
    run: RunMine<'_, S>,
) -> NnResult<Gathered<W>> {
    let cap = (ex.bucket_bytes() / std::mem::size_of::<W>()).max(1);
    let buckets = Buckets::of(layout, cap);
    let mut meta = None;
    let gathered = W::overlap(ex, &buckets.lens, &mut |sink| {
        // Each bucket is put together in the type it travels in, then handed over whole.
        let mut stage: Vec<Vec<W>> = buckets
            .lens
            .iter()
            .map(|&l| vec![W::default(); l])
            .collect();
        let mut left: Vec<usize> = buckets.pieces.iter().map(Vec::len).collect();
        let mut told = vec![false; buckets.place.len()];
        // What the hook sent, kept in debug builds to check it against the step's result.
        let mut sent: Vec<Vec<W>> = Vec::new();
        let mut next = 0;
        let m = run(Some(&mut |j: usize, g: &Tensor<S>| {
            let Some(&(b, off, len)) = buckets.place.get(j) else {
                return;
            };
            // Told twice, or of another size: left to the check of the step's result.
            if told[j] || g.numel() != len {
                return;
            }
            told[j] = true;
            for (w, &v) in stage[b][off..off + len].iter_mut().zip(g.data()) {
                *w = W::from_scalar(v);
            }
            left[b] -= 1;
            while next < buckets.grad_buckets && left[next] == 0 {
                let bucket = std::mem::take(&mut stage[next]);
                if cfg!(debug_assertions) {
                    sent.push(bucket.clone());
                }
                sink(next, bucket);
                next += 1;
            }
        }))?;
        // Buckets the backward did not complete (a micro-batch without rows runs none), and
        // the buffers' bucket, from the step's result; the ones already sent held its bits.
        let wire = |b: usize| -> Vec<W> { buckets.cut(b, &m.flat) };
        debug_assert!(sent.iter().enumerate().all(|(b, values)| {
            let bits = |v: &[W]| {
                v.iter()
                    .map(|x| x.to_scalar::<f64>().to_bits())
                    .collect::<Vec<_>>()
            };
            bits(values) == bits(&wire(b))
        }));
        for b in next..buckets.lens.len() {
            sink(b, wire(b));
        }
        meta = Some(m.meta);
        Ok(())
    })?;
    let meta = meta.ok_or_else(|| NnError::Config("exchange: the step did not run".into()))?;
    let size = ex.size();
    let metas = ex.all_gather_f64(&meta)?;
    if metas.len() != 3 * size {
        return Err(NnError::Config(format!(
            "exchange: {} step summaries came back for {size} ranks of 3",
            metas.len()
        )));
    }
    for (b, all) in gathered.iter().enumerate() {
        let len = buckets.lens[b];
        if all.len() != size * len {
            return Err(NnError::Config(format!(
                "exchange: bucket {b} came back with {} values for {size} ranks of {len}",
                all.len()
            )));
        }
    }
    if gathered.len() != buckets.lens.len() {
        return Err(NnError::Config(format!(
            "exchange: {} buckets came back of {}",
            gathered.len(),
            buckets.lens.len()
        )));
    }
    Ok(Gathered {
        metas,
        buckets,
        values: gathered,
    })
}

/// What an exchange brought back: every rank's `Micro::meta` (three values each) and every
/// rank's values of each bucket, in rank order.
struct Gathered<W> {
    metas: Vec<f64>,
    buckets: Buckets,
    values: Vec<Vec<W>>,
}

/// This rank's micro-batch exchanged (`exchanged`), then every rank's folded in rank order. A
/// failure of the run or of the exchange ends the job (`Exchange::abort`).
fn exchange_and_fold<S: Scalar, W: Wire>(
    ex: &mut dyn Exchange,
    layout: &Layout,
    fold: Fold<S>,
    run: RunMine<'_, S>,
) -> NnResult<Micro<S>> {
    match exchanged::<S, W>(ex, layout, run) {
        Ok(gathered) => fold.finish_gathered(layout, &gathered),
        Err(e) => {
            ex.abort(&e);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{micro_batches, Buckets, Fold, Gathered, Layout, Wire};
    use tapegrad_tensor::Scalar;

    fn fold<S: Scalar>(k: usize, n: usize) -> Fold<S> {
        Fold {
            k,
            n,
            acc: None,
            loss: 0.0,
            correct: 0.0,
        }
    }

    /// Folding from the buckets gives the bits of folding whole buffers in rank order, for
    /// unequal and empty micro-batches, several buckets and a buffers' bucket.
    fn check_fold_from_buckets<S: Scalar, W: Wire>(cap: usize) {
        let layout = Layout {
            trainable: vec![(vec![3, 2], 0), (vec![0], 6), (vec![5], 6), (vec![1], 11)],
            buffers: vec![(4, "bn.running_mean".into(), vec![2], 12)],
            len: 14,
        };
        let buckets = Buckets::of(&layout, cap);
        // 7 rows on 4 ranks, the last one empty as on a short last batch: 2, 2, 3, 0 rows.
        let rows = [2.0, 2.0, 3.0, 0.0];
        let value = |r: usize, i: usize| {
            let x = ((r * 31 + i * 17) % 23) as f64 - 11.0;
            S::from_f64(if i == 4 {
                -0.0
            } else {
                x / 7.0 + 1e-3 * r as f64
            })
        };
        let flats: Vec<Vec<S>> = (0..4)
            .map(|r| (0..layout.len).map(|i| value(r, i)).collect())
            .collect();
        let metas: Vec<f64> = (0..4)
            .flat_map(|r| [rows[r], 0.5 + r as f64, r as f64])
            .collect();
        let mut whole = fold::<S>(4, 7);
        for (r, flat) in flats.iter().enumerate() {
            whole.add(&metas[3 * r..3 * r + 3], flat);
        }
        let whole = whole.finish().unwrap();
        let values = (0..buckets.lens.len())
            .map(|b| {
                flats
                    .iter()
                    .flat_map(|flat| buckets.cut::<S, W>(b, flat))
                    .collect()
            })
            .collect();
        let gathered = Gathered {
            metas,
            buckets,
            values,
        };
        let from_buckets = fold::<S>(4, 7).finish_gathered(&layout, &gathered).unwrap();
        let bits = |v: &[S]| v.iter().map(|x| x.to_f64().to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&from_buckets.flat), bits(&whole.flat), "cap {cap}");
        assert_eq!(from_buckets.meta, whole.meta);
    }

    #[test]
    fn folding_from_the_buckets_gives_the_bits_of_folding_whole_buffers() {
        for cap in [1, 4, 6, 100] {
            check_fold_from_buckets::<f32, f32>(cap);
            check_fold_from_buckets::<f64, f64>(cap);
        }
    }

    #[test]
    fn micro_batches_cover_the_batch_with_the_extra_rows_first() {
        assert_eq!(micro_batches(32, 1), vec![0..32]);
        assert_eq!(micro_batches(32, 2), vec![0..16, 16..32]);
        assert_eq!(micro_batches(10, 3), vec![0..4, 4..7, 7..10]);
        assert_eq!(micro_batches(2, 3), vec![0..1, 1..2, 2..2]);
    }
}
