//! What a data-parallel run needs from its ranks, written once for the tabular `Trainer` and the
//! `GptRun`: the `Exchange` collective (implemented over MPI by the CLI's `distributed` module),
//! the start-of-run agreement check on hashes of each rank's run, and (`step`) a step's
//! micro-batches folded in order, one rank's gradients exchanged in buckets during its backward.

mod step;

pub use step::micro_batches;
pub(crate) use step::{accumulate, Layout, Micro};

use crate::error::{NnError, NnResult};
use crate::optim::Optimizer;
use crate::params::ParamSet;
use serde::Serialize;
use tapegrad_tensor::Scalar;

/// A rank's part of an overlapped exchange (`Exchange::overlap_f32`): it runs the step and hands
/// each bucket of its values to the sink, `(bucket, values)`, once and in bucket order. The sink
/// keeps the values, so an exchange sends from them without copying them first.
pub type Work<'a, T> = &'a mut dyn FnMut(&mut dyn FnMut(usize, Vec<T>)) -> NnResult<()>;

/// What an overlapped exchange brought back: each rank's values of each bucket. It may borrow the
/// exchange's own memory (a shared-memory window), so it lives until the exchange is used again.
pub trait Received<T> {
    /// Rank `rank`'s values of bucket `bucket`: as many as the bucket's length, for every
    /// `rank < size()` and bucket of the exchange.
    fn part(&self, bucket: usize, rank: usize) -> &[T];
}

/// An overlapped exchange's result, borrowing the exchange.
pub type Gathered<'a, T> = Box<dyn Received<T> + 'a>;

/// Buckets gathered into vectors, each holding every rank's values in rank order: what an
/// all-gather returns.
pub struct Concatenated<T> {
    lens: Vec<usize>,
    values: Vec<Vec<T>>,
}

impl<T> Concatenated<T> {
    /// `values[b]`, every one of `size` ranks' `lens[b]` values of bucket `b` in rank order.
    pub fn new(lens: &[usize], size: usize, values: Vec<Vec<T>>) -> NnResult<Self> {
        if values.len() != lens.len() {
            return Err(NnError::Config(format!(
                "exchange: {} buckets came back of {}",
                values.len(),
                lens.len()
            )));
        }
        for (b, (all, &len)) in values.iter().zip(lens).enumerate() {
            if all.len() != size * len {
                return Err(NnError::Config(format!(
                    "exchange: bucket {b} came back with {} values for {size} ranks of {len}",
                    all.len()
                )));
            }
        }
        Ok(Concatenated {
            lens: lens.to_vec(),
            values,
        })
    }
}

impl<T> Received<T> for Concatenated<T> {
    fn part(&self, bucket: usize, rank: usize) -> &[T] {
        let len = self.lens[bucket];
        &self.values[bucket][rank * len..(rank + 1) * len]
    }
}

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
    /// How this exchange runs its collectives, when the environment may choose (overlapped or
    /// not, through shared memory or not, profiled or not): ranks that differ would wait in
    /// collectives that never match, so the start-of-run check compares it. 0 by default.
    fn mode(&self) -> u64 {
        0
    }
    /// Runs `work`, which hands each bucket `b` in `0..lens.len()` (of `lens[b]` values) to its
    /// sink once, in bucket order, and returns every rank's values of each bucket. An exchange
    /// may start sending a bucket as soon as it gets it, so communication overlaps the rest of
    /// `work` (the backward pass); when `work` fails it may end the job (`abort`). The default
    /// gathers each bucket with `all_gather_f32` after `work`.
    fn overlap_f32(&mut self, lens: &[usize], work: Work<'_, f32>) -> NnResult<Gathered<'_, f32>> {
        let all = gather_after(lens, work, &mut |v| self.all_gather_f32(v))?;
        Ok(Box::new(Concatenated::new(lens, self.size(), all)?))
    }
    /// As `overlap_f32`, for f64 values.
    fn overlap_f64(&mut self, lens: &[usize], work: Work<'_, f64>) -> NnResult<Gathered<'_, f64>> {
        let all = gather_after(lens, work, &mut |v| self.all_gather_f64(v))?;
        Ok(Box::new(Concatenated::new(lens, self.size(), all)?))
    }
    /// This rank failed on its own (its micro-batch's step) while the others may be waiting in
    /// a collective: end the whole job now, naming the error, rather than leave them hanging.
    fn abort(&mut self, _error: &NnError) {}
    /// Every rank found, together, that the ranks disagree at the start of the run; each then
    /// returns `error` from the run. An exchange whose clean shutdown is a collective (MPI's
    /// finalize) may take it, since every rank reaches it, so that each rank exits after
    /// reporting rather than be cut off by another's abort. The default does nothing.
    fn disagree(&mut self, _error: &NnError) {}
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
            kept.push(values);
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

/// 64-bit FNV-1a, for the start-of-run agreement check (not a security hash).
pub(crate) struct Fnv(u64);

impl Fnv {
    pub(crate) fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    pub(crate) fn scalars<S: Scalar>(&mut self, v: &[S]) {
        for x in v {
            self.bytes(&x.to_f64().to_bits().to_le_bytes());
        }
    }
    pub(crate) fn value(&self) -> u64 {
        self.0
    }
}

/// What each rank of a data-parallel run must agree on, hashed: the data (the tables, or the
/// text with its vocabulary), the configuration with the position in the run, and the parameters
/// (buffers included) with the optimizer's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    pub data: u64,
    pub config: u64,
    pub params: u64,
}

impl Fingerprint {
    /// The hash of a run's `config` (as its JSON) and its position (`step`, and what else says
    /// where the run is).
    pub(crate) fn config_hash(config: &impl Serialize, position: &[u64]) -> NnResult<u64> {
        let mut h = Fnv::new();
        let json = serde_json::to_vec(config)
            .map_err(|e| NnError::Config(format!("cannot encode the config: {e}")))?;
        h.bytes(&json);
        for v in position {
            h.bytes(&v.to_le_bytes());
        }
        Ok(h.value())
    }

    /// The hash of the parameters (names and values) and the optimizer's state.
    pub(crate) fn params_hash<S: Scalar>(params: &ParamSet<S>, optimizer: &Optimizer<S>) -> u64 {
        let mut h = Fnv::new();
        for p in params.iter() {
            h.bytes(p.name.as_bytes());
            h.scalars(p.value.data());
        }
        for (slot, i, t) in optimizer.state_entries() {
            h.bytes(slot.as_bytes());
            h.bytes(&(i as u64).to_le_bytes());
            h.scalars(t.data());
        }
        h.value()
    }
}

/// Checks, with one all-gather, that every rank holds rank 0's `mine` (so a mismatch is an error
/// on every rank rather than a hang later) and that the job has `accumulate` ranks, and returns
/// the exchange for the run to keep. `data` names the run's data and says what may differ.
pub(crate) fn join(
    mut exchange: Box<dyn Exchange>,
    mine: Fingerprint,
    data: (&str, &str),
    accumulate: usize,
) -> NnResult<Box<dyn Exchange>> {
    let (rank, size) = (exchange.rank(), exchange.size());
    // The ranks' buckets (`--bucket-mb`) and exchange modes must match too: they make the
    // collectives.
    let config = {
        let mut h = Fnv::new();
        h.bytes(&mine.config.to_le_bytes());
        h.bytes(&(exchange.bucket_bytes() as u64).to_le_bytes());
        h.bytes(&exchange.mode().to_le_bytes());
        h.value()
    };
    // Each hash in two exact halves: an f64 holds 32 bits without rounding.
    let words: Vec<f64> = [mine.data, config, mine.params]
        .iter()
        .flat_map(|h| [(h >> 32) as f64, (h & 0xffff_ffff) as f64])
        .collect();
    let all = exchange.all_gather_f64(&words)?;
    if all.len() != 6 * size {
        return Err(NnError::Config(format!(
            "distributed: the agreement check gathered {} values from {size} ranks of 6",
            all.len()
        )));
    }
    let hash =
        |r: usize, i: usize| ((all[r * 6 + 2 * i] as u64) << 32) | all[r * 6 + 2 * i + 1] as u64;
    let what = [
        data,
        (
            "configuration differs",
            " (other flags such as --bucket-mb, other TAPEGRAD_DDP_* settings, or another \
             checkpoint?)",
        ),
        (
            "parameters differ",
            " (another checkpoint or --init-from file?)",
        ),
    ];
    for r in 1..size {
        for (i, (what, hint)) in what.iter().enumerate() {
            if hash(r, i) != hash(0, i) {
                let error = NnError::Config(format!(
                    "distributed: rank {r}'s {what} from rank 0's{hint}, seen on rank {rank}"
                ));
                exchange.disagree(&error);
                return Err(error);
            }
        }
    }
    if size != accumulate {
        let error = NnError::Config(format!(
            "distributed: {size} ranks for a run of {accumulate} micro-batches per step; \
             run it on {accumulate} ranks"
        ));
        exchange.disagree(&error);
        return Err(error);
    }
    Ok(exchange)
}
