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

mod buckets;

use super::Exchange;
use crate::backend::OnGrad;
use crate::error::{NnError, NnResult};
use crate::grad::Grad;
use crate::params::{ParamId, ParamKind, ParamSet};
use buckets::{Buckets, Summarised, Wire};
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
        gathered: &Summarised<'_, W>,
    ) -> NnResult<Micro<S>> {
        let Summarised {
            metas,
            buckets,
            parts,
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
            let rank_part = |r: usize| &parts.part(b, r)[at..at + len];
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

/// This rank's micro-batch run (`run`) while its gradients are exchanged: each bucket but the
/// last is handed to `ex` as soon as the backward has made all its gradients final and every
/// bucket before it was handed over; the last one, with the buffers and the summary, once the
/// run is done. Returns every rank's `Micro::meta` and buckets, in rank order.
fn exchanged<'a, S: Scalar, W: Wire>(
    ex: &'a mut dyn Exchange,
    layout: &Layout,
    run: RunMine<'_, S>,
) -> NnResult<Summarised<'a, W>> {
    let size = ex.size();
    let cap = (ex.bucket_bytes() / std::mem::size_of::<W>()).max(1);
    let buckets = Buckets::of(layout, cap);
    let early = buckets.early();
    let gathered = W::overlap(ex, &buckets.lens, &mut |sink| {
        // Each early bucket is put together in the type it travels in, then handed over whole.
        let mut stage: Vec<Vec<W>> = buckets.lens[..early]
            .iter()
            .map(|&l| vec![W::default(); l])
            .collect();
        let mut left: Vec<usize> = buckets.pieces[..early].iter().map(Vec::len).collect();
        let mut told = vec![false; buckets.place.len()];
        // What the hook sent, kept in debug builds to check it against the step's result.
        let mut sent: Vec<Vec<W>> = Vec::new();
        let mut next = 0;
        let m = run(Some(&mut |j: usize, g: &Tensor<S>| {
            let Some(&(b, off, len)) = buckets.place.get(j) else {
                return;
            };
            // Told twice, or of another size: left to the check of the step's result.
            if b >= early || told[j] || g.numel() != len {
                return;
            }
            told[j] = true;
            for (w, &v) in stage[b][off..off + len].iter_mut().zip(g.data()) {
                *w = W::from_scalar(v);
            }
            left[b] -= 1;
            while next < early && left[next] == 0 {
                let bucket = std::mem::take(&mut stage[next]);
                if cfg!(debug_assertions) {
                    sent.push(bucket.clone());
                }
                sink(next, bucket);
                next += 1;
            }
        }))?;
        // Buckets the backward did not complete (a micro-batch without rows runs none), and
        // the last one, from the step's result; the ones already sent held its bits.
        let wire = |b: usize| -> Vec<W> { buckets.cut(b, &m.flat, &m.meta) };
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
        Ok(())
    })?;
    Summarised::of(buckets, gathered, size)
}

/// This rank's micro-batch exchanged (`exchanged`), then every rank's folded in rank order. A
/// failure of the run or of the exchange ends the job (`Exchange::abort`).
fn exchange_and_fold<S: Scalar, W: Wire>(
    ex: &mut dyn Exchange,
    layout: &Layout,
    fold: Fold<S>,
    run: RunMine<'_, S>,
) -> NnResult<Micro<S>> {
    // The fold ends the borrow of `ex` that its result holds, so an error can still abort.
    match exchanged::<S, W>(ex, layout, run).map(|gathered| fold.finish_gathered(layout, &gathered))
    {
        Ok(folded) => folded,
        Err(e) => {
            ex.abort(&e);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::buckets::boxed;
    use super::{micro_batches, Buckets, Fold, Layout, Summarised, Wire};
    use crate::exchange::Concatenated;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
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

    /// Four trainable tensors (one empty), then a buffer of two values when `buffers`.
    fn layout(buffers: bool) -> Layout {
        Layout {
            trainable: vec![(vec![3, 2], 0), (vec![0], 6), (vec![5], 6), (vec![1], 11)],
            buffers: if buffers {
                vec![(4, "bn.running_mean".into(), vec![2], 12)]
            } else {
                Vec::new()
            },
            len: if buffers { 14 } else { 12 },
        }
    }

    /// A random layout: up to six trainable tensors of up to six values (some empty), then up
    /// to two buffers.
    fn random_layout(rng: &mut impl Rng) -> Layout {
        let mut len = 0;
        let trainable = (0..rng.random_range(0..7))
            .map(|_| {
                let n = rng.random_range(0..7);
                len += n;
                (vec![n], len - n)
            })
            .collect();
        let buffers = (0..rng.random_range(0..3))
            .map(|i| {
                let n = rng.random_range(1..4);
                len += n;
                (10 + i, format!("buffer{i}"), vec![n], len - n)
            })
            .collect();
        Layout {
            trainable,
            buffers,
            len,
        }
    }

    /// Folding from the buckets gives the bits of folding whole buffers in rank order, and the
    /// step summaries come back exactly: random layouts, bucket caps, rank counts, rows per
    /// rank (empty micro-batches included) and values (signed zeros, summaries an f32 cannot
    /// hold).
    fn check_fold_from_buckets<S: Scalar, W: Wire>(seed: u64) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let layout = random_layout(&mut rng);
        let cap = rng.random_range(1..16);
        let buckets = Buckets::of(&layout, cap);
        let k = rng.random_range(1..5);
        let mut rows: Vec<usize> = (0..k).map(|_| rng.random_range(0..4)).collect();
        if rows.iter().all(|&r| r == 0) {
            rows[0] = 1;
        }
        let n: usize = rows.iter().sum();
        let flats: Vec<Vec<S>> = (0..k)
            .map(|_| {
                (0..layout.len)
                    .map(|_| match rng.random_range(0..8) {
                        0 => S::from_f64(-0.0),
                        _ => S::from_f64(rng.random_range(-4.0..4.0)),
                    })
                    .collect()
            })
            .collect();
        let metas: Vec<f64> = rows
            .iter()
            .flat_map(|&m| {
                [
                    m as f64,
                    rng.random_range(0.0..10.0),
                    rng.random_range(0..4) as f64,
                ]
            })
            .collect();
        let mut whole = fold::<S>(k, n);
        for (r, flat) in flats.iter().enumerate() {
            whole.add(&metas[3 * r..3 * r + 3], flat);
        }
        let whole = whole.finish().unwrap();
        let values = (0..buckets.lens.len())
            .map(|b| {
                (0..k)
                    .flat_map(|r| {
                        let meta = [metas[3 * r], metas[3 * r + 1], metas[3 * r + 2]];
                        buckets.cut::<S, W>(b, &flats[r], &meta)
                    })
                    .collect()
            })
            .collect();
        let lens = buckets.lens.clone();
        let parts = boxed(Concatenated::new(&lens, k, values).unwrap());
        let gathered = Summarised::of(buckets, parts, k).unwrap();
        assert_eq!(
            gathered.metas, metas,
            "seed {seed}: the summaries travel exactly"
        );
        let from_buckets = fold::<S>(k, n).finish_gathered(&layout, &gathered).unwrap();
        let bits = |v: &[S]| v.iter().map(|x| x.to_f64().to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&from_buckets.flat), bits(&whole.flat), "seed {seed}");
        assert_eq!(from_buckets.meta, whole.meta, "seed {seed}");
    }

    #[test]
    fn folding_from_the_buckets_gives_the_bits_of_folding_whole_buffers() {
        for seed in 0..300 {
            check_fold_from_buckets::<f32, f32>(seed);
            check_fold_from_buckets::<f64, f64>(seed);
        }
    }

    #[test]
    fn the_last_bucket_carries_the_first_tensors_the_buffers_and_the_summary() {
        let layout = layout(true);
        // One tensor per bucket, last tensor first; the empty tensor closes no bucket.
        let b = Buckets::of(&layout, 1);
        assert_eq!(
            b.pieces,
            [vec![(11, 1)], vec![(6, 5)], vec![(6, 0), (0, 6), (12, 2)]]
        );
        assert_eq!(b.lens, [1, 5, 6 + 2 + 12]);
        assert_eq!(b.early(), 2);
        // Everything in one bucket: nothing leaves before the step is done.
        let one = Buckets::of(&layout, 100);
        assert_eq!(one.lens, [12 + 2 + 12]);
        assert_eq!(one.early(), 0);
        let flat: Vec<f32> = (0..14).map(|i| i as f32).collect();
        let wire = one.cut::<f32, f32>(0, &flat, &[2.0, 0.25, 1.0]);
        let expected: Vec<f32> = [11, 6, 7, 8, 9, 10, 0, 1, 2, 3, 4, 5, 12, 13]
            .map(|i| i as f32)
            .to_vec();
        assert_eq!(wire[..14], expected[..]);
        // No trainable tensors at all: one bucket, for the summary.
        let empty = Layout {
            trainable: Vec::new(),
            buffers: Vec::new(),
            len: 0,
        };
        assert_eq!(Buckets::of(&empty, 1).lens, [12]);
    }

    #[test]
    fn a_garbled_summary_is_an_error() {
        let layout = layout(false);
        let buckets = Buckets::of(&layout, 100);
        let mut values = buckets.cut::<f32, f32>(0, &[0.0; 12], &[2.0, 0.5, 1.0]);
        let last = values.len() - 1;
        values[last] = 0.5;
        let lens = buckets.lens.clone();
        let parts = boxed(Concatenated::new(&lens, 1, vec![values]).unwrap());
        let error = Summarised::of(buckets, parts, 1).err().unwrap();
        assert!(
            error
                .to_string()
                .contains("rank 0's step summary came back garbled (0.5)"),
            "{error}"
        );
    }

    #[test]
    fn micro_batches_cover_the_batch_with_the_extra_rows_first() {
        assert_eq!(micro_batches(32, 1), vec![0..32]);
        assert_eq!(micro_batches(32, 2), vec![0..16, 16..32]);
        assert_eq!(micro_batches(10, 3), vec![0..4, 4..7, 7..10]);
        assert_eq!(micro_batches(2, 3), vec![0..1, 1..2, 2..2]);
    }
}
