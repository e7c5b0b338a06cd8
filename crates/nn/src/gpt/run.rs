//! `GptRun`: training a GPT on character windows. `GptConfig` (everything that defines the run,
//! stored in its checkpoints) and the run itself: each optimizer step draws its batch of windows
//! from the step's own stream, runs the backend (eager or compiled, the same bits), clips by the
//! global norm and updates with the schedule's rate; the validation loss is the mean cross entropy
//! per character over fixed windows. A run is a pure function of its config: resuming at step `t`
//! needs only `t`.

use crate::backend::Backend;
use crate::clip::check_max_norm;
use crate::data::text::{TextData, TextSource};
use crate::data::{Batch, BatchTargets};
use crate::error::{NnError, NnResult};
use crate::exchange::Exchange;
use crate::grad::Grad;
use crate::metrics;
use crate::model::{Model, ModelSpec};
use crate::optim::{Optimizer, OptimizerConfig};
use crate::rng::dropout_rng;
use crate::schedule::{Decay, Schedule};
use crate::update;
use crate::verify::{StepCheck, StepVerification, Verifier};
use serde::{Deserialize, Serialize};
use tapegrad_tensor::Scalar;

/// Everything that defines a GPT training run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GptConfig {
    pub text: TextSource,
    /// A [`ModelSpec::Gpt`].
    pub model: ModelSpec,
    pub optimizer: OptimizerConfig,
    pub schedule: Schedule,
    /// Clip gradients to this global 2-norm before each update.
    pub clip_norm: Option<f64>,
    pub batch_size: usize,
    pub seed: u64,
    /// How many fixed validation windows an evaluation reads.
    pub val_windows: usize,
    /// Micro-batches per optimizer step (gradient accumulation, and the ranks of a data-parallel
    /// run); 1 is none. Written only when above 1, so other checkpoints keep their bytes.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub accumulate: usize,
}

fn one() -> usize {
    1
}

fn is_one(k: &usize) -> bool {
    *k == 1
}

impl GptConfig {
    /// The preset: AdamW (lr 1e-3, weight decay 0.1, betas 0.9/0.99), `warmup` linear warm-up
    /// steps then cosine decay to a tenth of the rate at `steps`, clipping at 1, for `model`.
    pub fn preset(text: TextSource, model: ModelSpec, batch_size: usize, steps: u64) -> Self {
        let lr = 1e-3;
        let warmup = 100u64.min(steps / 10);
        GptConfig {
            text,
            model,
            optimizer: OptimizerConfig::AdamW {
                lr,
                beta1: 0.9,
                beta2: 0.99,
                eps: 1e-8,
                weight_decay: 0.1,
            },
            schedule: Schedule {
                warmup,
                decay: Decay::Cosine {
                    t_max: steps.saturating_sub(warmup).max(1),
                    eta_min: lr / 10.0,
                },
            },
            clip_norm: Some(1.0),
            batch_size,
            seed: 0,
            val_windows: 256,
            accumulate: 1,
        }
    }

    /// The model's context length, or an error when the model is not a GPT.
    pub fn context(&self) -> NnResult<usize> {
        match &self.model {
            ModelSpec::Gpt { context, .. } => Ok(*context),
            other => Err(NnError::Config(format!(
                "a gpt run needs a gpt model, found {}",
                other.name()
            ))),
        }
    }
}

/// What one optimizer step did.
#[derive(Debug, Clone, PartialEq)]
pub struct GptStep {
    /// Steps taken, this one included.
    pub step: u64,
    /// The batch's mean loss per character (before the update).
    pub loss: f64,
    pub lr: f64,
    /// Characters predicted in the batch (`batch * context`).
    pub tokens: usize,
    /// Global gradient norm before clipping (when clipping is on).
    pub grad_norm: Option<f64>,
}

/// A GPT, its optimizer and its text, with the position in the run.
pub struct GptRun<S: Scalar> {
    pub config: GptConfig,
    pub model: Model<S>,
    pub optimizer: Optimizer<S>,
    pub data: TextData,
    /// Optimizer steps taken.
    pub step: u64,
    backend: Box<dyn Backend<S>>,
    detect_anomaly: bool,
    verify: Option<Verifier>,
    /// The other ranks of a data-parallel run (`set_exchange`); none in one process.
    exchange: Option<Box<dyn Exchange>>,
    val: Vec<Batch<S>>,
}

mod accumulate;

impl<S: Scalar> GptRun<S> {
    /// A fresh run of `config` on `data`.
    pub fn new(config: GptConfig, data: TextData, backend: Box<dyn Backend<S>>) -> NnResult<Self> {
        let model = Model::new(&config.model, config.seed)?;
        let optimizer = Optimizer::new(config.optimizer, &model.params)?;
        Self::from_parts(config, model, optimizer, data, 0, backend)
    }

    /// Reassembles a run from saved parts (see `gpt::checkpoint`).
    pub fn from_parts(
        config: GptConfig,
        model: Model<S>,
        optimizer: Optimizer<S>,
        data: TextData,
        step: u64,
        backend: Box<dyn Backend<S>>,
    ) -> NnResult<Self> {
        config.schedule.validate()?;
        if let Some(max_norm) = config.clip_norm {
            check_max_norm(max_norm)?;
        }
        let context = config.context()?;
        if config.batch_size == 0 {
            return Err(NnError::Config("the batch size must be positive".into()));
        }
        if !(1..=config.batch_size).contains(&config.accumulate) {
            return Err(NnError::Config(format!(
                "--accumulate {} needs 1 to {} micro-batches (the batch size)",
                config.accumulate, config.batch_size
            )));
        }
        if config.model.outputs() != data.vocab.len() {
            return Err(NnError::Config(format!(
                "the model has a vocabulary of {} characters but the text {} has {}",
                config.model.outputs(),
                data.name,
                data.vocab.len()
            )));
        }
        let val = data.val_batches(config.val_windows, config.batch_size, context)?;
        Ok(GptRun {
            config,
            model,
            optimizer,
            data,
            step,
            backend,
            detect_anomaly: false,
            verify: None,
            exchange: None,
            val,
        })
    }

    /// Swaps the backend (eager and compiled give the same bits).
    pub fn set_backend(&mut self, mut backend: Box<dyn Backend<S>>) {
        backend.set_detect_anomaly(self.detect_anomaly);
        self.backend = backend;
    }

    /// Anomaly mode: the first NaN or infinity a step makes stops the run, naming its node.
    pub fn set_detect_anomaly(&mut self, on: bool) {
        self.detect_anomaly = on;
        self.backend.set_detect_anomaly(on);
    }

    /// `--verify-every`: checks the laws on every N-th step (see `verify`), on the step's own
    /// parameters, windows and dropout masks; it leaves the trained bits unchanged.
    pub fn set_verify(&mut self, verifier: Option<Verifier>) {
        self.verify = verifier;
    }

    /// The verifier, with its totals.
    pub fn verifier(&self) -> Option<&Verifier> {
        self.verify.as_ref()
    }

    /// The results of the last verified step, once (for the run's log).
    pub fn take_verification(&mut self) -> Option<StepVerification> {
        self.verify.as_mut().and_then(Verifier::take_last)
    }

    /// The learning rate of the next step.
    pub fn current_lr(&self) -> f64 {
        self.config
            .schedule
            .lr(self.config.optimizer.lr(), self.step)
    }

    /// The batch of the next step.
    pub fn next_batch(&self) -> NnResult<Batch<S>> {
        self.data.train_batch(
            self.config.seed,
            self.step,
            self.config.batch_size,
            self.config.context()?,
        )
    }

    /// The bytes the backend's last step kept for its backward pass.
    pub fn kept_bytes(&self) -> usize {
        self.backend.kept_bytes()
    }

    /// One optimizer step on the next batch of windows.
    pub fn train_step(&mut self) -> NnResult<GptStep> {
        if self.config.accumulate > 1 || self.exchange.is_some() {
            return self.accumulated_step();
        }
        let batch = self.next_batch()?;
        let rng = dropout_rng(self.config.seed, self.step);
        self.backend.set_factored_grads(false);
        let verify_rng = self.verify.is_some().then(|| rng.clone());
        let out = self
            .backend
            .train_step(&self.model, &batch, rng)
            .map_err(|e| at_step(e, self.step + 1))?;
        update::check_loss(out.loss, self.step + 1, self.config.clip_norm)?;
        if let (Some(verifier), Some(rng)) = (&mut self.verify, verify_rng) {
            let check = StepCheck {
                step: self.step + 1,
                seed: self.config.seed,
                model: &self.model,
                batch: &batch,
                rng,
                label_smoothing: 0.0,
                output: &out,
            };
            verifier.check(check, self.backend.as_mut())?;
        }
        let lr = self.current_lr();
        let mut grads = Grad::all_dense(out.grads)?;
        let (params, clip) = (&mut self.model.params, self.config.clip_norm);
        let grad_norm = update::clip_and_step(&mut self.optimizer, params, &mut grads, clip, lr)?;
        self.step = self.step.saturating_add(1);
        Ok(GptStep {
            step: self.step,
            loss: out.loss,
            lr,
            tokens: batch.x.numel(),
            grad_norm,
        })
    }

    /// The mean cross entropy per character over the fixed validation windows, in eval mode.
    pub fn evaluate(&mut self) -> NnResult<f64> {
        let (mut total, mut count) = (0.0, 0usize);
        for batch in &self.val {
            let logits = self.backend.infer(&self.model, &batch.x)?;
            if let BatchTargets::Classes(labels) = &batch.y {
                total += metrics::cross_entropy(&logits, labels)? * labels.len() as f64;
                count += labels.len();
            }
        }
        Ok(total / count.max(1) as f64)
    }
}

/// Says at which step an anomaly happened.
fn at_step(e: NnError, step: u64) -> NnError {
    match e {
        NnError::Engine(boxed) => match *boxed {
            tapegrad_core::Error::Anomaly(m) => tapegrad_core::Error::Anomaly(format!(
                "step {step}: {m}. In training, values that overflow usually mean the parameters \
                 diverged: try a smaller learning rate (--lr)"
            ))
            .into(),
            other => other.into(),
        },
        other => other,
    }
}
