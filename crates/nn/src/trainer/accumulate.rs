//! The trainer's step over `config.accumulate` micro-batches (`train --accumulate K`) and its
//! data-parallel side (`set_exchange`, one micro-batch per rank): what a micro-batch is for a
//! table (its rows, with batch norm's buffers and the accuracy), the rest by the rule of
//! `crate::exchange`, which the GPT's run shares.

use super::{StepRecord, Trainer};
use crate::data::BatchTargets;
use crate::error::{NnError, NnResult};
use crate::exchange::{self, Exchange, Fingerprint, Fnv, Layout, Micro};
use crate::metrics;
use crate::rng::dropout_micro_rng;
use crate::update;
use tapegrad_tensor::Scalar;

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
        let rows = self.order.next_batch();
        let n = rows.len();
        let layout = Layout::of(&self.model.params);
        self.backend.set_factored_grads(false);
        self.backend
            .set_label_smoothing(self.config.label_smoothing);
        let mut exchange = self.exchange.take();
        let summed = exchange::accumulate(
            n,
            self.config.accumulate,
            &layout,
            exchange.as_mut(),
            &mut |i, part, on_final| self.micro(i, &rows[part], &layout, on_final),
        );
        self.exchange = exchange;
        let Micro {
            meta: [_, loss, correct],
            flat,
        } = summed?;
        update::check_loss(loss, self.step + 1, self.config.clip_norm)?;
        let mut grads = layout.grads(&flat)?;
        let lr = self.current_lr();
        let (params, clip) = (&mut self.model.params, self.config.clip_norm);
        let grad_norm = update::clip_and_step(&mut self.optimizer, params, &mut grads, clip, lr)?;
        for (id, value) in layout.buffers(&flat)? {
            self.model.params.set(id, value)?;
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
            return Ok(Micro::empty(layout));
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
        Ok(Micro {
            meta: [rows.len() as f64, out.loss, correct],
            flat: layout.flatten(out.grads, out.updates)?,
        })
    }

    /// What every rank of a data-parallel run must share: the data (both splits), the
    /// configuration with the position in the run, the parameters with the optimizer's state.
    pub fn fingerprint(&self) -> NnResult<Fingerprint> {
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
        let position = [self.step, self.order.epoch(), self.order.cursor() as u64];
        Ok(Fingerprint {
            data: d.value(),
            config: Fingerprint::config_hash(&self.config, &position)?,
            params: Fingerprint::params_hash(&self.model.params, &self.optimizer),
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
    /// config's `accumulate`, and every rank must hold rank 0's `fingerprint` (checked on every
    /// rank with one all-gather, so a mismatch is an error on every rank rather than a hang).
    pub fn set_exchange(&mut self, exchange: Box<dyn Exchange>) -> NnResult<()> {
        let data = (
            "data differ",
            " (a different --csv file, or other contents?)",
        );
        let mine = self.fingerprint()?;
        self.exchange = Some(exchange::join(
            exchange,
            mine,
            data,
            self.config.accumulate,
        )?);
        Ok(())
    }
}
