//! `train gpt --accumulate K` and the GPT's data-parallel side (`set_exchange`, one micro-batch
//! per rank): what a micro-batch is for the GPT (a range of the step's windows), the rest (the
//! split, the weights, the fold in micro-batch order, the bucketed exchange, the agreement
//! check) by the rule of `crate::exchange`, which the tabular trainer shares.

use super::{at_step, GptRun, GptStep};
use crate::data::{Batch, BatchTargets};
use crate::error::{NnError, NnResult};
use crate::exchange::{self, Exchange, Fingerprint, Fnv, Layout, Micro};
use crate::rng::dropout_micro_rng;
use crate::update;
use std::ops::Range;
use tapegrad_tensor::{Scalar, Tensor};

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
    /// One optimizer step over `config.accumulate` micro-batches of the step's windows: all
    /// here, or one per rank of the exchange.
    pub(super) fn accumulated_step(&mut self) -> NnResult<GptStep> {
        if self.verify.is_some() {
            // The verifier replays one tape per step; a step cut into micro-batches has several.
            return Err(NnError::Config(
                "--verify-every checks a step recorded on one tape; it does not run with \
                 --accumulate above 1 or --distributed"
                    .into(),
            ));
        }
        let batch = self.next_batch()?;
        let layout = Layout::of(&self.model.params);
        self.backend.set_factored_grads(false);
        let mut exchange = self.exchange.take();
        let summed = exchange::accumulate(
            batch.x.dims()[0],
            self.config.accumulate,
            &layout,
            exchange.as_mut(),
            &mut |i, rows, on_final| self.micro(i, &batch, &rows, &layout, on_final),
        );
        self.exchange = exchange;
        let Micro {
            meta: [_, loss, _],
            flat,
        } = summed?;
        update::check_loss(loss, self.step + 1, self.config.clip_norm)?;
        let mut grads = layout.grads(&flat)?;
        let lr = self.current_lr();
        let (params, clip) = (&mut self.model.params, self.config.clip_norm);
        let grad_norm = update::clip_and_step(&mut self.optimizer, params, &mut grads, clip, lr)?;
        self.step = self.step.saturating_add(1);
        Ok(GptStep {
            step: self.step,
            loss,
            lr,
            tokens: batch.x.numel(),
            grad_norm,
        })
    }

    /// Runs micro-batch `index` (windows `rows` of `batch`) and flattens its gradients, telling
    /// `on_final` each one as soon as the backward has made it final.
    fn micro(
        &mut self,
        index: usize,
        batch: &Batch<S>,
        rows: &Range<usize>,
        layout: &Layout,
        on_final: Option<crate::backend::OnGrad<'_, S>>,
    ) -> NnResult<Micro<S>> {
        if rows.is_empty() {
            return Ok(Micro::empty(layout));
        }
        let sub = sub_batch(batch, rows)?;
        let rng = dropout_micro_rng(self.config.seed, self.step, index as u64);
        let out = match on_final {
            Some(tell) => self
                .backend
                .train_step_observed(&self.model, &sub, rng, tell),
            None => self.backend.train_step(&self.model, &sub, rng),
        };
        let out = out.map_err(|e| at_step(e, self.step + 1))?;
        Ok(Micro {
            meta: [rows.len() as f64, out.loss, 0.0],
            flat: layout.flatten(out.grads, out.updates)?,
        })
    }

    /// What every rank of a data-parallel run must share: the text (both parts, with the
    /// vocabulary), the configuration with the step, the parameters with the optimizer's state.
    pub fn fingerprint(&self) -> NnResult<Fingerprint> {
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
        Ok(Fingerprint {
            data: text.value(),
            config: Fingerprint::config_hash(&self.config, &[self.step])?,
            params: Fingerprint::params_hash(&self.model.params, &self.optimizer),
        })
    }

    /// Makes this run one rank of a data-parallel job: `exchange.size()` must equal the config's
    /// `accumulate`, and every rank must hold rank 0's `fingerprint` (checked on every rank with
    /// one all-gather, so a mismatch is an error on every rank rather than a hang).
    pub fn set_exchange(&mut self, exchange: Box<dyn Exchange>) -> NnResult<()> {
        let text = (
            "text differs",
            " (a different --text file, or other contents?)",
        );
        let mine = self.fingerprint()?;
        self.exchange = Some(exchange::join(
            exchange,
            mine,
            text,
            self.config.accumulate,
        )?);
        Ok(())
    }

    /// Ends a data-parallel run cleanly (every rank calls it after its last step); a no-op in
    /// one process.
    pub fn finish_exchange(&mut self) {
        if let Some(mut ex) = self.exchange.take() {
            ex.finish();
        }
    }
}
