//! Gradient accumulation (`TrainConfig::accumulate`, `train --accumulate K`) and the data-parallel
//! step built on it: a step's batch is cut into K micro-batches whose gradients are summed in
//! micro-batch order and scaled once. `Exchange` is what a data-parallel run (one micro-batch per
//! rank, see the CLI's `distributed` module) plugs in; both modes run the same fold, so N ranks
//! give the bits of `--accumulate N` in one process (law 10 of `docs/design.md`).
//!
//! The rule, written once here:
//! - Split: a batch of `n` rows gives micro-batch `k` the rows `[k*q + min(k, r), ..)` with
//!   `q = n / K`, `r = n % K`: the first `r` micro-batches hold one row more, so every row of the
//!   batch is used and sizes differ by at most one. A micro-batch can be empty only when `n < K`
//!   (the last batch of an epoch); it contributes nothing.
//! - Gradients: micro-batch `k` gives its mean-loss gradient `g_k` (the backends' loss is a mean)
//!   and weight `c_k = K * m_k / n` (exactly 1 when the sizes are equal); the step's gradient is
//!   `(c_0 g_0 + c_1 g_1 + ...) / K`, added left to right in micro-batch order, divided once.
//!   Mathematically this is the batch's mean gradient whatever the sizes.
//! - Batch norm: each micro-batch normalises with its own statistics (as PyTorch's DDP without
//!   SyncBatchNorm); the running statistics become the same weighted mean of the micro-batches'
//!   updated values, folded like the gradients.
//! - Dropout: micro-batch `k` of step `t` draws from `dropout_micro_rng(seed, t, k)`.
//! - The loss is `(sum of c_k L_k) / K` (the batch's mean loss), the accuracy the batch's.

use super::{StepRecord, Trainer};
use crate::clip::clip_grad_norm;
use crate::data::BatchTargets;
use crate::error::{NnError, NnResult};
use crate::grad::Grad;
use crate::metrics;
use crate::params::{ParamId, ParamKind, ParamSet};
use crate::rng::dropout_micro_rng;
use std::ops::Range;
use tapegrad_tensor::{DType, Scalar, Tensor};

/// A rank's part of an overlapped exchange (`Exchange::overlap_f32`): it runs the step and hands
/// each bucket of its values to the sink, `(bucket, values)`, once and in bucket order.
pub type Work<'a, T> = &'a mut dyn FnMut(&mut dyn FnMut(usize, &[T])) -> NnResult<()>;

/// The collective a data-parallel run needs: every rank's buffer, in rank order. Implemented over
/// MPI by the CLI's `distributed` module; a fake one in tests.
pub trait Exchange {
    /// This process's rank, `0..size()`.
    fn rank(&self) -> usize;
    /// How many ranks run the job.
    fn size(&self) -> usize;
    /// Every rank's `local` (all of the same length), concatenated in rank order.
    fn all_gather_f64(&mut self, local: &[f64]) -> NnResult<Vec<f64>>;
    /// As `all_gather_f64`, for f32 buffers (half the bytes).
    fn all_gather_f32(&mut self, local: &[f32]) -> NnResult<Vec<f32>>;
    /// The size of the buckets gradients are exchanged in, in bytes: a bucket takes whole
    /// gradients, last tensor first, until it holds at least this many. The default,
    /// `usize::MAX`, makes one bucket.
    fn bucket_bytes(&self) -> usize {
        usize::MAX
    }
    /// Runs `work`, which hands each bucket `b` in `0..lens.len()` (of `lens[b]` values) to its
    /// sink once, in bucket order, and returns every rank's values of each bucket, in rank
    /// order. An exchange may start sending a bucket as soon as it gets it, so communication
    /// overlaps the rest of `work` (the backward pass); when `work` fails it may end the job
    /// (`abort`). The default gathers each bucket with `all_gather_f32` after `work`.
    fn overlap_f32(&mut self, lens: &[usize], work: Work<'_, f32>) -> NnResult<Vec<Vec<f32>>> {
        gather_after(lens, work, &mut |v| self.all_gather_f32(v))
    }
    /// As `overlap_f32`, for f64 values.
    fn overlap_f64(&mut self, lens: &[usize], work: Work<'_, f64>) -> NnResult<Vec<Vec<f64>>> {
        gather_after(lens, work, &mut |v| self.all_gather_f64(v))
    }
    /// This rank failed on its own (its micro-batch's step) while the others may be waiting in
    /// a collective: end the whole job now, naming the error, rather than leave them hanging.
    fn abort(&mut self, _error: &NnError) {}
    /// The run ended normally on every rank: shut the exchange down cleanly.
    fn finish(&mut self) {}
}

/// `Exchange::overlap_f32`'s default: runs `work`, keeping the buckets it hands over, then
/// gathers each with `gather`.
pub fn gather_after<T: Copy>(
    lens: &[usize],
    work: Work<'_, T>,
    gather: &mut dyn FnMut(&[T]) -> NnResult<Vec<T>>,
) -> NnResult<Vec<Vec<T>>> {
    let mut kept: Vec<Vec<T>> = Vec::with_capacity(lens.len());
    let mut fault = None;
    work(&mut |b, values| {
        if b == kept.len() && lens.get(b) == Some(&values.len()) {
            kept.push(values.to_vec());
        } else {
            fault.get_or_insert(format!(
                "bucket {b} of {} values handed over as bucket {} of {:?}",
                values.len(),
                kept.len(),
                lens.get(kept.len())
            ));
        }
    })?;
    if let Some(fault) = fault {
        return Err(NnError::Config(format!("exchange: {fault}")));
    }
    if kept.len() != lens.len() {
        return Err(NnError::Config(format!(
            "exchange: {} of {} buckets were handed over",
            kept.len(),
            lens.len()
        )));
    }
    kept.iter().map(|b| gather(b)).collect()
}

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
struct Layout {
    /// (shape, offset) of every trainable tensor in registration order: the gradients first.
    trainable: Vec<(Vec<usize>, usize)>,
    /// (index in the set, shape, offset) of every buffer, after the gradients.
    buffers: Vec<(usize, Vec<usize>, usize)>,
    len: usize,
}

impl Layout {
    fn of<S: Scalar>(params: &ParamSet<S>) -> Layout {
        let mut len = 0;
        let mut trainable = Vec::new();
        for p in params.trainable() {
            trainable.push((p.value.dims().to_vec(), len));
            len += p.value.numel();
        }
        let mut buffers = Vec::new();
        for (i, p) in params.iter().enumerate() {
            if p.kind == ParamKind::Buffer {
                buffers.push((i, p.value.dims().to_vec(), len));
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
        self.buffers.first().map_or(self.len, |b| b.2)
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

    /// Bucket `b`'s values, cut from flat buffer `flat`.
    fn cut<S: Copy>(&self, b: usize, flat: &[S]) -> Vec<S> {
        let mut out = Vec::with_capacity(self.lens[b]);
        for &(off, len) in &self.pieces[b] {
            out.extend_from_slice(&flat[off..off + len]);
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

/// One micro-batch's contribution: its size, mean loss, correct predictions (classification) and
/// its flat buffer (gradients, then the buffers' updated values).
struct Micro<S> {
    meta: [f64; 3],
    flat: Vec<S>,
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
    fn new(k: usize, n: usize) -> Self {
        Fold {
            k,
            n,
            acc: None,
            loss: 0.0,
            correct: 0.0,
        }
    }

    /// Adds micro-batch `meta`/`flat`; empty micro-batches are skipped.
    fn add(&mut self, meta: &[f64], flat: &[S]) {
        let rows = meta[0];
        if rows == 0.0 {
            return;
        }
        let c = self.k as f64 * rows / self.n as f64;
        let cs = S::from_f64(c);
        self.loss += c * meta[1];
        self.correct += meta[2];
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
    fn finish(self) -> NnResult<(Vec<S>, f64, f64)> {
        let mut acc = self
            .acc
            .ok_or_else(|| NnError::Config("accumulation: the batch had no rows".into()))?;
        let k = S::from_usize(self.k);
        for a in &mut acc {
            *a /= k;
        }
        Ok((acc, self.loss / self.k as f64, self.correct))
    }
}

impl<S: Scalar> Trainer<S> {
    /// One optimizer step over `config.accumulate` micro-batches (all here, or one per rank).
    pub(super) fn accumulated_step(&mut self) -> NnResult<StepRecord> {
        if self.verify.is_some() {
            // The verifier replays one tape per step; a step cut into micro-batches has several.
            return Err(NnError::Config(
                "--verify-every checks a step recorded on one tape; it does not run with \
                 --accumulate above 1 or --distributed"
                    .into(),
            ));
        }
        let k = self.config.accumulate;
        let rows = self.order.next_batch();
        let n = rows.len();
        let parts = micro_batches(n, k);
        let layout = Layout::of(&self.model.params);
        self.backend.set_factored_grads(false);
        self.backend
            .set_label_smoothing(self.config.label_smoothing);
        let mut fold = Fold::<S>::new(k, n);
        let mut exchange = self.exchange.take();
        let result = match exchange.as_deref_mut() {
            None => parts.iter().enumerate().try_for_each(|(i, r)| {
                let m = self.micro(i, &rows[r.clone()], &layout, None)?;
                fold.add(&m.meta, &m.flat);
                Ok(())
            }),
            Some(ex) => {
                let i = ex.rank();
                let mine = &rows[parts[i].clone()];
                let exchanged = match S::DTYPE {
                    DType::F32 => self.exchanged::<f32>(ex, i, mine, &layout),
                    DType::F64 => self.exchanged::<f64>(ex, i, mine, &layout),
                };
                if let Err(e) = &exchanged {
                    ex.abort(e);
                }
                exchanged.map(|(metas, flats)| {
                    for r in 0..k {
                        let flat = &flats[r * layout.len..(r + 1) * layout.len];
                        fold.add(&metas[r * 3..r * 3 + 3], flat);
                    }
                })
            }
        };
        self.exchange = exchange;
        result?;
        let (flat, loss, correct) = fold.finish()?;
        if !loss.is_finite() {
            return Err(NnError::Config(format!(
                "the loss became {loss} at step {}; try a smaller learning rate (--lr) or gradient clipping",
                self.step + 1
            )));
        }
        let mut grads = Vec::with_capacity(layout.trainable.len());
        for (dims, off) in &layout.trainable {
            let size: usize = dims.iter().product();
            grads.push(Tensor::new(dims, flat[*off..off + size].to_vec())?);
        }
        let lr = self.current_lr();
        let grad_norm = match self.config.clip_norm {
            Some(max) => Some(clip_grad_norm(&mut grads, max)?),
            None => None,
        };
        self.optimizer.step(&mut self.model.params, &grads, lr)?;
        for (index, dims, off) in &layout.buffers {
            let size: usize = dims.iter().product();
            self.model.params.set(
                ParamId(*index),
                Tensor::new(dims, flat[*off..off + size].to_vec())?,
            )?;
        }
        self.step = self.step.saturating_add(1);
        let metric = match &self.data.train.y {
            crate::data::SplitTargets::Values { .. } => {
                let std = self.data.target.as_ref().map_or(1.0, |t| t.std[0]);
                loss.sqrt() * std
            }
            crate::data::SplitTargets::Classes(_) => correct / n.max(1) as f64,
        };
        Ok(StepRecord {
            step: self.step,
            epoch: self.order.epoch(),
            loss,
            metric,
            lr,
            rows: n,
            grad_norm,
        })
    }

    /// This rank's micro-batch `index` (rows `rows`) run while its gradients are exchanged: each
    /// bucket is handed to `ex` as soon as the backward has made all its gradients final and
    /// every bucket before it was handed over. Returns every rank's `Micro::meta` and flat
    /// buffer, concatenated in rank order.
    fn exchanged<W: Wire>(
        &mut self,
        ex: &mut dyn Exchange,
        index: usize,
        rows: &[usize],
        layout: &Layout,
    ) -> NnResult<(Vec<f64>, Vec<S>)> {
        let cap = (ex.bucket_bytes() / std::mem::size_of::<W>()).max(1);
        let buckets = Buckets::of(layout, cap);
        let mut meta = None;
        let gathered = W::overlap(ex, &buckets.lens, &mut |sink| {
            let mut stage: Vec<Vec<S>> = buckets.lens.iter().map(|&l| vec![S::ZERO; l]).collect();
            let mut left: Vec<usize> = buckets.pieces.iter().map(Vec::len).collect();
            let mut told = vec![false; buckets.place.len()];
            let mut next = 0;
            let send = |b: usize, values: &[S], sink: &mut dyn FnMut(usize, &[W])| {
                let wire: Vec<W> = values.iter().map(|&v| W::from_scalar(v)).collect();
                sink(b, &wire);
            };
            let m = self.micro(
                index,
                rows,
                layout,
                Some(&mut |j: usize, g: &Tensor<S>| {
                    let Some(&(b, off, len)) = buckets.place.get(j) else {
                        return;
                    };
                    // Told twice, or of another size: left to the check of the step's result.
                    if told[j] || g.numel() != len {
                        return;
                    }
                    told[j] = true;
                    stage[b][off..off + len].copy_from_slice(g.data());
                    left[b] -= 1;
                    while next < buckets.grad_buckets && left[next] == 0 {
                        send(next, &stage[next], sink);
                        next += 1;
                    }
                }),
            )?;
            // Buckets the backward did not complete (a micro-batch without rows runs none), and
            // the buffers' bucket, from the step's result; the ones already sent held its bits.
            debug_assert!((0..next).all(|b| {
                let bits = |v: &[S]| v.iter().map(|x| x.to_f64().to_bits()).collect::<Vec<_>>();
                bits(&stage[b]) == bits(&buckets.cut(b, &m.flat))
            }));
            for b in next..buckets.lens.len() {
                send(b, &buckets.cut(b, &m.flat), sink);
            }
            meta = Some(m.meta);
            Ok(())
        })?;
        let meta = meta.ok_or_else(|| NnError::Config("exchange: the step did not run".into()))?;
        let metas = ex.all_gather_f64(&meta)?;
        let size = ex.size();
        let mut flats = vec![S::ZERO; size * layout.len];
        for (b, all) in gathered.iter().enumerate() {
            let len = buckets.lens[b];
            if all.len() != size * len {
                return Err(NnError::Config(format!(
                    "exchange: bucket {b} came back with {} values for {size} ranks of {len}",
                    all.len()
                )));
            }
            for (r, part) in all.chunks_exact(len.max(1)).enumerate().take(size) {
                let flat = &mut flats[r * layout.len..(r + 1) * layout.len];
                let mut at = 0;
                for &(off, n) in &buckets.pieces[b] {
                    for (d, &v) in flat[off..off + n].iter_mut().zip(&part[at..at + n]) {
                        *d = v.to_scalar();
                    }
                    at += n;
                }
            }
        }
        Ok((metas, flats))
    }

    /// Runs micro-batch `index` (rows `rows`) and flattens what it gives, telling `on_final`
    /// each gradient as soon as the backward has made it final (`Backend::train_step_observed`).
    fn micro(
        &mut self,
        index: usize,
        rows: &[usize],
        layout: &Layout,
        on_final: Option<crate::backend::OnGrad<'_, S>>,
    ) -> NnResult<Micro<S>> {
        if rows.is_empty() {
            return Ok(Micro {
                meta: [0.0; 3],
                flat: vec![S::ZERO; layout.len],
            });
        }
        let batch = self.data.train.batch(rows)?;
        let rng = dropout_micro_rng(self.config.seed, self.step, index as u64);
        let out = match on_final {
            Some(tell) => self
                .backend
                .train_step_observed(&self.model, &batch, rng, tell),
            None => self.backend.train_step(&self.model, &batch, rng),
        };
        let out = out.map_err(|e| {
            super::anomaly_at(e, &format!("step {} (micro-batch {index})", self.step + 1))
        })?;
        let correct = match &batch.y {
            BatchTargets::Values(_) => 0.0,
            BatchTargets::Classes(labels) => {
                (metrics::accuracy(&out.outputs, labels)? * labels.len() as f64).round()
            }
        };
        let mut flat = Vec::with_capacity(layout.len);
        for g in Grad::all_dense(out.grads)? {
            flat.extend_from_slice(g.data());
        }
        if flat.len() != layout.grad_len() {
            return Err(NnError::Config(format!(
                "accumulation: the step gave {} gradient values for {} trainable values",
                flat.len(),
                layout.grad_len()
            )));
        }
        flat.resize(layout.len, S::ZERO);
        let mut seen = vec![false; layout.buffers.len()];
        for (id, value) in out.updates {
            let slot = layout
                .buffers
                .iter()
                .position(|b| b.0 == id.index())
                .filter(|&s| layout.buffers[s].1 == value.dims())
                .ok_or_else(|| {
                    NnError::Config(format!(
                        "accumulation: the step updated tensor {} ({}), which is not a buffer of that shape",
                        id.index(),
                        value.shape()
                    ))
                })?;
            let off = layout.buffers[slot].2;
            flat[off..off + value.numel()].copy_from_slice(value.data());
            seen[slot] = true;
        }
        if let Some(missing) = seen.iter().position(|s| !s) {
            let name = self
                .model
                .params
                .iter()
                .nth(layout.buffers[missing].0)
                .map_or("?", |p| p.name.as_str());
            return Err(NnError::Config(format!(
                "accumulation needs every buffer updated by a training step; {name} was not"
            )));
        }
        Ok(Micro {
            meta: [rows.len() as f64, out.loss, correct],
            flat,
        })
    }
}

/// 64-bit FNV-1a, for the start-of-run agreement check (not a security hash).
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn scalars<S: Scalar>(&mut self, v: &[S]) {
        for x in v {
            self.bytes(&x.to_f64().to_bits().to_le_bytes());
        }
    }
}

/// What each rank of a data-parallel run must agree on, hashed: the configuration with the
/// position in the run, the parameters (and buffers), and the data (both splits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    pub config: u64,
    pub params: u64,
    pub data: u64,
}

impl<S: Scalar> Trainer<S> {
    /// The run's `Fingerprint`.
    pub fn fingerprint(&self) -> NnResult<Fingerprint> {
        let mut c = Fnv::new();
        let json = serde_json::to_vec(&self.config)
            .map_err(|e| NnError::Config(format!("cannot encode the config: {e}")))?;
        c.bytes(&json);
        for v in [self.step, self.order.epoch(), self.order.cursor() as u64] {
            c.bytes(&v.to_le_bytes());
        }
        let mut p = Fnv::new();
        for param in self.model.params.iter() {
            p.bytes(param.name.as_bytes());
            p.scalars(param.value.data());
        }
        let mut d = Fnv::new();
        for split in [&self.data.train, &self.data.val] {
            d.bytes(&(split.len() as u64).to_le_bytes());
            d.scalars(split.x.data());
            match &split.y {
                crate::data::SplitTargets::Values { standardized, raw } => {
                    d.scalars(standardized);
                    d.scalars(raw);
                }
                crate::data::SplitTargets::Classes(labels) => {
                    for &l in labels {
                        d.bytes(&(l as u64).to_le_bytes());
                    }
                }
            }
        }
        Ok(Fingerprint {
            config: c.0,
            params: p.0,
            data: d.0,
        })
    }

    /// Ends a data-parallel run cleanly (every rank calls it after its last step); a no-op in
    /// one process.
    pub fn finish_exchange(&mut self) {
        if let Some(mut ex) = self.exchange.take() {
            ex.finish();
        }
    }

    /// Makes this trainer one rank of a data-parallel run: `exchange.size()` must equal the
    /// config's `accumulate`, and every rank must hold rank 0's configuration, parameters and
    /// data (checked here on every rank with one all-gather, so a mismatch is an error on every
    /// rank rather than a hang later).
    pub fn set_exchange(&mut self, mut exchange: Box<dyn Exchange>) -> NnResult<()> {
        let (rank, size) = (exchange.rank(), exchange.size());
        let mine = self.fingerprint()?;
        let words: Vec<f64> = [mine.data, mine.config, mine.params]
            .iter()
            .flat_map(|h| [(h >> 32) as f64, (h & 0xffff_ffff) as f64])
            .collect();
        let all = exchange.all_gather_f64(&words)?;
        let hash = |r: usize, i: usize| {
            ((all[r * 6 + 2 * i] as u64) << 32) | all[r * 6 + 2 * i + 1] as u64
        };
        for r in 1..size {
            for (i, (what, hint)) in [
                ("data", " (a different --csv file, or other contents?)"),
                ("configuration", " (other flags, or another checkpoint?)"),
                ("parameters", ""),
            ]
            .iter()
            .enumerate()
            {
                if hash(r, i) != hash(0, i) {
                    return Err(NnError::Config(format!(
                        "distributed: rank {r}'s {what} differ from rank 0's{hint}, seen on rank {rank}"
                    )));
                }
            }
        }
        if size != self.config.accumulate {
            return Err(NnError::Config(format!(
                "distributed: {size} ranks for a run of {} micro-batches per step; \
                 run it on {} ranks",
                self.config.accumulate, self.config.accumulate
            )));
        }
        self.exchange = Some(exchange);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::micro_batches;

    #[test]
    fn micro_batches_cover_the_batch_with_the_extra_rows_first() {
        assert_eq!(micro_batches(32, 1), vec![0..32]);
        assert_eq!(micro_batches(32, 2), vec![0..16, 16..32]);
        assert_eq!(micro_batches(10, 3), vec![0..4, 4..7, 7..10]);
        assert_eq!(micro_batches(2, 3), vec![0..1, 1..2, 2..2]);
    }
}
