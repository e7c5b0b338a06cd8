//! The trainer: `TrainConfig` (everything that defines a run, stored in checkpoints) and
//! `Trainer`, which takes optimizer steps on seeded mini-batches (learning-rate schedule, optional
//! clipping by global norm) and evaluates the model on either split. A run is a pure function of
//! its config and seed: the same config gives the same bits. Anomaly mode (`set_detect_anomaly`)
//! is a switch of the run, not of its config: checkpoints neither store nor need it.

use crate::backend::Backend;
use crate::clip::check_max_norm;
use crate::data::{BatchOrder, DataSource, Prepared, Split, SplitTargets, Task};
use crate::error::{NnError, NnResult};
use crate::grad::Grad;
use crate::metrics;
use crate::model::{Model, ModelSpec};
use crate::optim::{Optimizer, OptimizerConfig};
use crate::rng::dropout_rng;
use crate::schedule::Schedule;
use crate::update;
use crate::verify::{StepCheck, StepVerification, Verifier};
use serde::{Deserialize, Serialize};
use tapegrad_tensor::{Scalar, Tensor};

mod accumulate;
pub use crate::exchange::{
    gather_after, micro_batches, Concatenated, Exchange, Fingerprint, Gathered, Received, Work,
};

/// Everything that defines a training run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// The preset it came from (`digits`, `mlp`, `csv`).
    pub preset: String,
    pub data: DataSource,
    pub model: ModelSpec,
    pub optimizer: OptimizerConfig,
    pub schedule: Schedule,
    /// Clip gradients to this global 2-norm before each update.
    pub clip_norm: Option<f64>,
    pub batch_size: usize,
    /// Fraction of rows held out for validation.
    pub val_fraction: f64,
    pub seed: u64,
    /// Cross entropy's label smoothing in [0, 1] for classification (0 is none; absent in
    /// checkpoints written before it existed).
    #[serde(default)]
    pub label_smoothing: f64,
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

/// Which split to evaluate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    Train,
    Validation,
}

/// What one optimizer step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    /// Steps taken, this one included.
    pub step: u64,
    /// Completed epochs after this step.
    pub epoch: u64,
    /// The batch's mean loss (before the update).
    pub loss: f64,
    /// The batch's metric (accuracy, or RMSE in the target's units).
    pub metric: f64,
    /// The learning rate used.
    pub lr: f64,
    /// Rows in the batch.
    pub rows: usize,
    /// Global gradient norm before clipping (when clipping is on).
    pub grad_norm: Option<f64>,
}

/// Loss and metric on a split.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    pub loss: f64,
    pub metric: f64,
}

/// The metric of a task: its name, unit, and whether higher is better.
pub fn metric_name(task: &Task) -> &'static str {
    match task {
        Task::Regression => "rmse",
        Task::Classification { .. } => "accuracy",
    }
}

/// A model, its optimizer and its data, with the position in the run.
pub struct Trainer<S: Scalar> {
    pub config: TrainConfig,
    pub model: Model<S>,
    pub optimizer: Optimizer<S>,
    pub data: Prepared<S>,
    pub order: BatchOrder,
    /// Optimizer steps taken.
    pub step: u64,
    backend: Box<dyn Backend<S>>,
    detect_anomaly: bool,
    verify: Option<Verifier>,
    /// The other ranks of a data-parallel run (`set_exchange`); none in one process.
    exchange: Option<Box<dyn Exchange>>,
}

impl<S: Scalar> Trainer<S> {
    /// A fresh run of `config` on `data` (prepared with the config's seed and split).
    pub fn new(
        config: TrainConfig,
        data: Prepared<S>,
        backend: Box<dyn Backend<S>>,
    ) -> NnResult<Self> {
        config.schedule.validate()?;
        if let Some(max_norm) = config.clip_norm {
            check_max_norm(max_norm)?;
        }
        let model = Model::new(&config.model, config.seed)?;
        check_fits(&config, &data)?;
        let optimizer = Optimizer::new(config.optimizer, &model.params)?;
        let order = BatchOrder::new(data.train.len(), config.batch_size, config.seed)?;
        Ok(Trainer {
            config,
            model,
            optimizer,
            data,
            order,
            step: 0,
            backend,
            detect_anomaly: false,
            verify: None,
            exchange: None,
        })
    }

    /// Reassembles a trainer from saved parts (see `checkpoint`).
    pub fn from_parts(
        config: TrainConfig,
        model: Model<S>,
        optimizer: Optimizer<S>,
        data: Prepared<S>,
        order: BatchOrder,
        step: u64,
        backend: Box<dyn Backend<S>>,
    ) -> NnResult<Self> {
        check_fits(&config, &data)?;
        Ok(Trainer {
            config,
            model,
            optimizer,
            data,
            order,
            step,
            backend,
            detect_anomaly: false,
            verify: None,
            exchange: None,
        })
    }

    /// Swaps the backend (eager and compiled give the same bits).
    pub fn set_backend(&mut self, mut backend: Box<dyn Backend<S>>) {
        backend.set_detect_anomaly(self.detect_anomaly);
        self.backend = backend;
    }

    /// Anomaly mode: the first NaN or infinity made in a step's forward or backward pass (or in an
    /// evaluation) stops the run with an error naming the node, its op, shapes and the element.
    pub fn set_detect_anomaly(&mut self, on: bool) {
        self.detect_anomaly = on;
        self.backend.set_detect_anomaly(on);
    }

    /// `--verify-every`: checks the laws on every N-th step (see `verify`); a switch of the
    /// run, like anomaly mode, that leaves the trained bits unchanged.
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

    /// One optimizer step on the next mini-batch.
    pub fn train_step(&mut self) -> NnResult<StepRecord> {
        if self.config.accumulate > 1 || self.exchange.is_some() {
            return self.accumulated_step();
        }
        let rows = self.order.next_batch();
        let batch = self.data.train.batch(&rows)?;
        let rng = dropout_rng(self.config.seed, self.step);
        // Factored gradients pay off only where the optimizer applies them without multiplying
        // them out; clipping needs every gradient dense.
        let factored = self.config.clip_norm.is_none() && self.config.optimizer.is_plain_sgd();
        self.backend.set_factored_grads(factored);
        self.backend
            .set_label_smoothing(self.config.label_smoothing);
        let verify_rng = self.verify.is_some().then(|| rng.clone());
        let out = self
            .backend
            .train_step(&self.model, &batch, rng)
            .map_err(|e| anomaly_at(e, &format!("step {}", self.step + 1)))?;
        update::check_loss(out.loss, self.step + 1, self.config.clip_norm)?;
        if let (Some(verifier), Some(rng)) = (&mut self.verify, verify_rng) {
            let check = StepCheck {
                step: self.step + 1,
                seed: self.config.seed,
                model: &self.model,
                batch: &batch,
                rng,
                label_smoothing: self.config.label_smoothing,
                output: &out,
            };
            verifier.check(check, self.backend.as_mut())?;
        }
        let lr = self.current_lr();
        let grad_norm = match self.config.clip_norm {
            Some(max) => {
                let mut grads = Grad::all_dense(out.grads)?;
                let params = &mut self.model.params;
                update::clip_and_step(&mut self.optimizer, params, &mut grads, Some(max), lr)?
            }
            None => {
                self.optimizer
                    .step_grads(&mut self.model.params, out.grads, lr)?;
                None
            }
        };
        for (id, value) in out.updates {
            self.model.params.set(id, value)?;
        }
        self.step = self.step.saturating_add(1);
        let metric = match &batch.y {
            crate::data::BatchTargets::Values(_) => {
                let std = self.data.target.as_ref().map_or(1.0, |t| t.std[0]);
                out.loss.sqrt() * std
            }
            crate::data::BatchTargets::Classes(labels) => metrics::accuracy(&out.outputs, labels)?,
        };
        Ok(StepRecord {
            step: self.step,
            epoch: self.order.epoch(),
            loss: out.loss,
            metric,
            lr,
            rows: rows.len(),
            grad_norm,
        })
    }

    /// The model's raw outputs for standardised rows `x`, in chunks, in eval mode.
    pub fn predict(&mut self, x: &Tensor<S>) -> NnResult<Tensor<S>> {
        predict_in_chunks(self.backend.as_mut(), &self.model, x)
    }

    /// Loss and metric on a split, in eval mode.
    pub fn evaluate(&mut self, which: Which) -> NnResult<Evaluation> {
        let split = match which {
            Which::Train => &self.data.train,
            Which::Validation => &self.data.val,
        };
        evaluate_split(
            self.backend.as_mut(),
            &self.model,
            split,
            self.data.target.as_ref().map(|t| (t.mean[0], t.std[0])),
        )
        .map_err(|e| anomaly_at(e, &format!("evaluation after step {}", self.step)))
    }
}

/// Runs `model` on `x` in chunks of rows (bounded memory for large tables).
pub fn predict_in_chunks<S: Scalar>(
    backend: &mut dyn Backend<S>,
    model: &Model<S>,
    x: &Tensor<S>,
) -> NnResult<Tensor<S>> {
    const CHUNK: usize = 1024;
    let rows = x.dims()[0];
    let width = x.dims()[1];
    if rows <= CHUNK {
        return backend.infer(model, x);
    }
    let mut out = Vec::new();
    let mut out_width = 0;
    for start in (0..rows).step_by(CHUNK) {
        let end = (start + CHUNK).min(rows);
        let chunk = Tensor::new(
            &[end - start, width],
            x.data()[start * width..end * width].to_vec(),
        )?;
        let y = backend.infer(model, &chunk)?;
        out_width = y.dims()[1];
        out.extend_from_slice(y.data());
    }
    Ok(Tensor::new(&[rows, out_width], out)?)
}

/// Loss and metric of `model` on `split`; `target` holds the regression target's mean and std.
pub fn evaluate_split<S: Scalar>(
    backend: &mut dyn Backend<S>,
    model: &Model<S>,
    split: &Split<S>,
    target: Option<(f64, f64)>,
) -> NnResult<Evaluation> {
    if split.is_empty() {
        return Ok(Evaluation {
            loss: f64::NAN,
            metric: f64::NAN,
        });
    }
    let out = predict_in_chunks(backend, model, &split.x)?;
    match &split.y {
        SplitTargets::Values { standardized, raw } => {
            let (mean, std) = target.unwrap_or((0.0, 1.0));
            let pred: Vec<f64> = out.data().iter().map(|v| v.to_f64()).collect();
            let ys: Vec<f64> = standardized.iter().map(|v| v.to_f64()).collect();
            let orig: Vec<f64> = pred.iter().map(|p| p * std + mean).collect();
            Ok(Evaluation {
                loss: metrics::mse(&pred, &ys)?,
                metric: metrics::rmse(&orig, raw)?,
            })
        }
        SplitTargets::Classes(labels) => Ok(Evaluation {
            loss: metrics::cross_entropy(&out, labels)?,
            metric: metrics::accuracy(&out, labels)?,
        }),
    }
}

/// Says where in the run (`when`) an anomaly happened and what usually causes one in training.
fn anomaly_at(e: NnError, when: &str) -> NnError {
    match e {
        NnError::Engine(boxed) => match *boxed {
            tapegrad_core::Error::Anomaly(m) => tapegrad_core::Error::Anomaly(format!(
                "{when}: {m}. In training, values that overflow usually mean the parameters \
                 diverged: try a smaller learning rate (--lr) or gradient clipping (--clip)"
            ))
            .into(),
            other => other.into(),
        },
        other => other,
    }
}

fn check_fits<S: Scalar>(config: &TrainConfig, data: &Prepared<S>) -> NnResult<()> {
    let spec = &config.model;
    let k = config.accumulate;
    if k == 0 || k > config.batch_size {
        return Err(NnError::Config(format!(
            "--accumulate {k} needs 1 <= K <= the batch size ({})",
            config.batch_size
        )));
    }
    let e = config.label_smoothing;
    if e != 0.0 {
        if !(0.0..=1.0).contains(&e) {
            return Err(NnError::Config(format!(
                "label smoothing must be between 0 and 1, found {e}"
            )));
        }
        if !matches!(data.task, Task::Classification { .. }) {
            return Err(NnError::Config(format!(
                "label smoothing {e} applies to classification; this run is a regression"
            )));
        }
    }
    let width = data.feature_names.len();
    if spec.inputs() != width {
        return Err(NnError::Config(format!(
            "the model takes {} inputs but the data has {width} feature columns",
            spec.inputs()
        )));
    }
    if spec.outputs() != data.task.outputs() {
        return Err(NnError::Config(format!(
            "the model has {} outputs but the task needs {}",
            spec.outputs(),
            data.task.outputs()
        )));
    }
    Ok(())
}

impl TrainConfig {
    /// The name of the column the run predicts (`label` for digits, `mpg` for Auto MPG).
    pub fn data_target_name(&self) -> Option<String> {
        match &self.data {
            DataSource::Digits => Some("label".into()),
            DataSource::AutoMpg => Some("mpg".into()),
            DataSource::Csv { target, .. } => Some(target.clone()),
        }
    }
}
