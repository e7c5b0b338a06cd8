//! `train gpt --accumulate K` and the GPT's data-parallel step: a step's windows cut into K
//! micro-batches by the rule of `crate::trainer::accumulate` (`micro_batches`: the first `n % K`
//! one window larger; micro-batch k weighs `c_k = K m_k / n`; gradients added left to right in
//! micro-batch order and divided by K once; its dropout drawn from `dropout_micro_rng(seed, t, k)`).
//! With an `Exchange`, rank k runs micro-batch k and every rank folds all ranks' buffers in rank
//! order, so N ranks give the bits of `--accumulate N` in one process.

use super::{at_step, GptRun};
use crate::data::{Batch, BatchTargets};
use crate::error::{NnError, NnResult};
use crate::grad::Grad;
use crate::rng::dropout_micro_rng;
use crate::trainer::{micro_batches, Exchange};
use std::ops::Range;
use tapegrad_tensor::{DType, Scalar, Tensor};

/// The running fold of micro-batches, in order (the same arithmetic as the tabular trainer's).
struct Fold<S> {
    k: usize,
    n: usize,
    acc: Option<Vec<S>>,
    loss: f64,
}

impl<S: Scalar> Fold<S> {
    /// Adds a micro-batch of `rows` windows with mean loss `loss` and flat gradient `flat`.
    fn add(&mut self, rows: f64, loss: f64, flat: &[S]) {
        if rows == 0.0 {
            return;
        }
        let c = self.k as f64 * rows / self.n as f64;
        let cs = S::from_f64(c);
        self.loss += c * loss;
        match &mut self.acc {
            None => self.acc = Some(flat.iter().map(|&v| cs * v).collect()),
            Some(acc) => {
                for (a, &v) in acc.iter_mut().zip(flat) {
                    *a += cs * v;
                }
            }
        }
    }

    fn finish(self) -> NnResult<(Vec<S>, f64)> {
        let mut acc = self
            .acc
            .ok_or_else(|| NnError::Config("accumulation: the batch had no windows".into()))?;
        let k = S::from_usize(self.k);
        for a in &mut acc {
            *a /= k;
        }
        Ok((acc, self.loss / self.k as f64))
    }
}

/// Windows `rows` of `batch` (`[n, context]` ids and their `n * context` targets).
fn sub_batch<S: Scalar>(batch: &Batch<S>, rows: &Range<usize>) -> NnResult<Batch<S>> {
    let t = batch.x.dims()[1];
    let x = batch.x.data()[rows.start * t..rows.end * t].to_vec();
    let y = match &batch.y {
        BatchTargets::Classes(l) => BatchTargets::Classes(l[rows.start * t..rows.end * t].to_vec()),
        BatchTargets::Values(_) => {
            return Err(NnError::Config(
                "a gpt batch has class targets, not values".into(),
            ))
        }
    };
    Ok(Batch {
        x: Tensor::new(&[rows.len(), t], x)?,
        y,
    })
}

impl<S: Scalar> GptRun<S> {
    /// The step's gradient (one tensor per trainable parameter) and mean loss over
    /// `config.accumulate` micro-batches of `batch`: all here, or one per rank of the exchange.
    pub(super) fn accumulated_gradients(
        &mut self,
        batch: &Batch<S>,
    ) -> NnResult<(Vec<Tensor<S>>, f64)> {
        let k = self.config.accumulate;
        let n = batch.x.dims()[0];
        let parts = micro_batches(n, k);
        let shapes: Vec<Vec<usize>> = self
            .model
            .params
            .trainable()
            .map(|p| p.value.dims().to_vec())
            .collect();
        let len: usize = shapes.iter().map(|d| d.iter().product::<usize>()).sum();
        self.backend.set_factored_grads(false);
        let mut fold = Fold::<S> {
            k,
            n,
            acc: None,
            loss: 0.0,
        };
        let mut exchange = self.exchange.take();
        let result = match exchange.as_deref_mut() {
            None => parts.iter().enumerate().try_for_each(|(i, r)| {
                let (loss, flat) = self.micro(i, batch, r, len)?;
                fold.add(r.len() as f64, loss, &flat);
                Ok(())
            }),
            Some(ex) => {
                let i = ex.rank();
                let local = self.micro(i, batch, &parts[i], len);
                if let Err(e) = &local {
                    ex.abort(e);
                }
                local.and_then(|(loss, flat)| {
                    let metas = ex.all_gather_f64(&[parts[i].len() as f64, loss])?;
                    let flats = gather_flat(ex, &flat)?;
                    for r in 0..k {
                        fold.add(
                            metas[2 * r],
                            metas[2 * r + 1],
                            &flats[r * len..(r + 1) * len],
                        );
                    }
                    Ok(())
                })
            }
        };
        self.exchange = exchange;
        result?;
        let (flat, loss) = fold.finish()?;
        let mut grads = Vec::with_capacity(shapes.len());
        let mut off = 0;
        for dims in shapes {
            let size: usize = dims.iter().product();
            grads.push(Tensor::new(&dims, flat[off..off + size].to_vec())?);
            off += size;
        }
        Ok((grads, loss))
    }

    /// Runs micro-batch `index` (windows `rows` of `batch`): its mean loss and flat gradient.
    fn micro(
        &mut self,
        index: usize,
        batch: &Batch<S>,
        rows: &Range<usize>,
        len: usize,
    ) -> NnResult<(f64, Vec<S>)> {
        if rows.is_empty() {
            return Ok((0.0, vec![S::ZERO; len]));
        }
        let sub = sub_batch(batch, rows)?;
        let rng = dropout_micro_rng(self.config.seed, self.step, index as u64);
        let out = self
            .backend
            .train_step(&self.model, &sub, rng)
            .map_err(|e| at_step(e, self.step + 1))?;
        let mut flat = Vec::with_capacity(len);
        for g in Grad::all_dense(out.grads)? {
            flat.extend_from_slice(g.data());
        }
        if flat.len() != len {
            return Err(NnError::Config(format!(
                "accumulation: the step gave {} gradient values for {len} trainable values",
                flat.len()
            )));
        }
        Ok((out.loss, flat))
    }

    /// Makes this run one rank of a data-parallel job: `exchange.size()` must equal the config's
    /// `accumulate`, and every rank must hold rank 0's configuration (with the step),
    /// parameters, optimizer state and text (compared by hash with one all-gather, so a
    /// mismatch is an error on every rank rather than a hang).
    pub fn set_exchange(&mut self, mut exchange: Box<dyn Exchange>) -> NnResult<()> {
        let (rank, size) = (exchange.rank(), exchange.size());
        let mine = self.fingerprint()?;
        let words: Vec<f64> = mine
            .iter()
            .flat_map(|h| [(h >> 32) as f64, (h & 0xffff_ffff) as f64])
            .collect();
        let all = exchange.all_gather_f64(&words)?;
        let hash = |r: usize, i: usize| {
            ((all[r * 6 + 2 * i] as u64) << 32) | all[r * 6 + 2 * i + 1] as u64
        };
        for r in 1..size {
            for (i, (what, hint)) in [
                ("text", " (a different --text file, or other contents?)"),
                ("configuration", " (other flags, or another checkpoint?)"),
                ("parameters", " (another --init-from file?)"),
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
                "distributed: {size} ranks for a run of {} micro-batches per step; run it on {} ranks",
                self.config.accumulate, self.config.accumulate
            )));
        }
        self.exchange = Some(exchange);
        Ok(())
    }

    /// Ends a data-parallel run cleanly (every rank calls it after its last step).
    pub fn finish_exchange(&mut self) {
        if let Some(mut ex) = self.exchange.take() {
            ex.finish();
        }
    }

    /// Hashes of the text, the configuration with the step, and the parameters with the
    /// optimizer state (64-bit FNV-1a; an agreement check, not a security hash).
    fn fingerprint(&self) -> NnResult<[u64; 3]> {
        let mut text = Fnv::new();
        for part in [&self.data.train, &self.data.val] {
            text.bytes(&(part.len() as u64).to_le_bytes());
            for &id in part.iter() {
                text.bytes(&id.to_le_bytes());
            }
        }
        for c in &self.data.vocab {
            text.bytes(&u32::from(*c).to_le_bytes());
        }
        let mut config = Fnv::new();
        let json = serde_json::to_vec(&self.config)
            .map_err(|e| NnError::Config(format!("cannot encode the config: {e}")))?;
        config.bytes(&json);
        config.bytes(&self.step.to_le_bytes());
        let mut params = Fnv::new();
        for p in self.model.params.iter() {
            params.bytes(p.name.as_bytes());
            params.scalars(p.value.data());
        }
        for (slot, i, t) in self.optimizer.state_entries() {
            params.bytes(slot.as_bytes());
            params.bytes(&(i as u64).to_le_bytes());
            params.scalars(t.data());
        }
        Ok([text.0, config.0, params.0])
    }
}

/// Every rank's flat buffer in rank order, sent as the run's own element type.
fn gather_flat<S: Scalar>(ex: &mut dyn Exchange, local: &[S]) -> NnResult<Vec<S>> {
    Ok(match S::DTYPE {
        DType::F32 => {
            let mine: Vec<f32> = local.iter().map(|v| v.to_f64() as f32).collect();
            ex.all_gather_f32(&mine)?
                .into_iter()
                .map(|v| S::from_f64(f64::from(v)))
                .collect()
        }
        DType::F64 => {
            let mine: Vec<f64> = local.iter().map(|v| v.to_f64()).collect();
            ex.all_gather_f64(&mine)?
                .into_iter()
                .map(S::from_f64)
                .collect()
        }
    })
}

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
