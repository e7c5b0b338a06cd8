//! `tapegrad train`: presets (`digits`, the default, and `mlp` for Auto MPG) or a user's CSV file,
//! flags for the optimizer, schedule, batches, dtype and backend; a progress bar on a terminal
//! (plain lines otherwise), a summary table, and optional checkpoint, JSON-lines log and SVG plot.
//! Also holds what `eval` and `predict` share: error conversion and the dtype dispatch.

use crate::error::{CliError, CliResult};
use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;
use tapegrad_nn::checkpoint::{self, Checkpoint};
use tapegrad_nn::data::{DataSource, Prepared, TaskKind};
use tapegrad_nn::layers::Activation;
use tapegrad_nn::plot::{self, Series};
use tapegrad_nn::runlog::RunLog;
use tapegrad_nn::summary::{format_metric, Table};
use tapegrad_nn::trainer::metric_name;
use tapegrad_nn::verify::Verifier;
use tapegrad_nn::{
    make_backend, BackendKind, Decay, ModelSpec, NnError, OptimizerConfig, Schedule, TrainConfig,
    Trainer, Which,
};
use tapegrad_tensor::{DType, Scalar};

impl From<NnError> for CliError {
    fn from(e: NnError) -> Self {
        match e {
            NnError::Engine(e) => CliError::Engine(*e),
            NnError::Io { path, source } => CliError::Io { path, source },
            other => CliError::Other(other.to_string()),
        }
    }
}

/// The built-in runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// 10-class digits (8x8 images), MLP 64-128-10 by default, `--model cnn` for a small CNN.
    Digits,
    /// Auto MPG regression: 7 features, MLP 7-32-1, Adam with cosine decay, MSE; RMSE in mpg.
    Mlp,
    /// A character-level GPT on Shakespeare (or --text FILE): 4 layers, 4 heads, width 128,
    /// context 64, batch 32, AdamW 1e-3 with warm-up and cosine decay, 1500 steps.
    Gpt,
}

/// Architectures for `--model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModelKind {
    Mlp,
    Cnn,
}

/// Element types for `--dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DTypeArg {
    F32,
    F64,
}

/// Backends for `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    Eager,
    Compiled,
}

impl BackendArg {
    pub(crate) fn kind(self) -> BackendKind {
        match self {
            BackendArg::Eager => BackendKind::Eager,
            BackendArg::Compiled => BackendKind::Compiled,
        }
    }
}

/// Schedules for `--schedule`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ScheduleArg {
    Constant,
    Step,
    Cosine,
}

/// Tasks for `--task` (with `--csv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TaskArg {
    Regression,
    Classification,
}

/// Activations for `--activation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ActivationArg {
    Relu,
    Tanh,
    Sigmoid,
    Gelu,
    Silu,
}

/// Arguments of `tapegrad train` (boxed: the flags are many, and the subcommand enum stays small).
#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    #[command(flatten)]
    pub options: Box<TrainOptions>,
}

impl std::ops::Deref for TrainArgs {
    type Target = TrainOptions;
    fn deref(&self) -> &TrainOptions {
        &self.options
    }
}

/// The flags of `tapegrad train`.
#[derive(Debug, clap::Args)]
pub struct TrainOptions {
    /// What to train: `digits` (default) or `mlp` (Auto MPG). Ignored with --csv.
    #[arg(value_enum)]
    pub preset: Option<Preset>,
    /// Architecture for digits: mlp (default) or cnn.
    #[arg(long, value_enum)]
    pub model: Option<ModelKind>,
    /// Optimizer steps to take (overrides --epochs). With --resume: steps to add.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Passes over the training split (default: the preset's). With --resume: epochs to add.
    #[arg(long)]
    pub epochs: Option<u64>,
    /// Rows per mini-batch.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Base learning rate.
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// sgd (momentum 0.9), adam, adamw, rmsprop or adagrad.
    #[arg(long)]
    pub optimizer: Option<String>,
    /// Weight decay (L2 for sgd/adam/rmsprop/adagrad, decoupled for adamw).
    #[arg(long, allow_negative_numbers = true)]
    pub weight_decay: Option<f64>,
    /// Momentum for sgd and rmsprop.
    #[arg(long, allow_negative_numbers = true)]
    pub momentum: Option<f64>,
    /// Nesterov momentum (sgd).
    #[arg(long)]
    pub nesterov: bool,
    /// Learning-rate schedule after warm-up (default: cosine for mlp and --csv, constant for digits).
    #[arg(long, value_enum)]
    pub schedule: Option<ScheduleArg>,
    /// Cosine schedule: anneal over this many steps (default: this run's steps after warm-up).
    /// Set it to the planned total when you mean to stop, save and --resume.
    #[arg(long)]
    pub schedule_steps: Option<u64>,
    /// Linear warm-up steps.
    #[arg(long)]
    pub warmup: Option<u64>,
    /// Step schedule: decay every this many steps.
    #[arg(long)]
    pub step_size: Option<u64>,
    /// Step schedule: decay factor.
    #[arg(long, allow_negative_numbers = true)]
    pub gamma: Option<f64>,
    /// Clip gradients to this global 2-norm.
    #[arg(long, allow_negative_numbers = true)]
    pub clip: Option<f64>,
    /// Label smoothing of the cross entropy loss, in [0, 1] (classification only)
    #[arg(long, allow_negative_numbers = true)]
    pub label_smoothing: Option<f64>,
    /// Hidden layer widths of the MLP, comma-separated (e.g. 128,64).
    #[arg(long, value_delimiter = ',')]
    pub hidden: Option<Vec<usize>>,
    /// Activation between MLP layers.
    #[arg(long, value_enum)]
    pub activation: Option<ActivationArg>,
    /// Dropout probability after each hidden layer.
    #[arg(long, allow_negative_numbers = true)]
    pub dropout: Option<f64>,
    /// Seed for initialisation, split, shuffling and dropout.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Element type.
    #[arg(long, value_enum)]
    pub dtype: Option<DTypeArg>,
    /// eager (a tape per step) or compiled (a saved graph).
    #[arg(long, value_enum, default_value = "eager")]
    pub backend: BackendArg,
    /// Threads for the kernels (products, convolutions, element loops). The results are the same
    /// bits on any count; small models gain nothing (a split must pay for its hand-off).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Train on your own CSV file (with a header row) instead of a preset.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// The column of --csv to predict (name, 0-based index or `last`).
    #[arg(long)]
    pub target: Option<String>,
    /// Regression (default) or classification for --csv.
    #[arg(long, value_enum)]
    pub task: Option<TaskArg>,
    /// Fraction of rows held out for validation.
    #[arg(long, allow_negative_numbers = true)]
    pub val_fraction: Option<f64>,
    /// Evaluate on the validation split every this many steps (default: once per epoch).
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Save a checkpoint here at the end (written atomically).
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Also save the --save checkpoint whenever the step count is a multiple of N, so a run
    /// that is killed can --resume from its last save.
    #[arg(long, value_name = "N")]
    pub save_every: Option<u64>,
    /// Stop at the first NaN or infinity made in a forward or backward pass, with an error naming
    /// the node, op, shapes and element (and the masked-branch trap, with its remedy). Off, it
    /// costs nothing. With --backend compiled, the step's outputs, loss and gradients are checked
    /// and a non-finite one is traced to its node by replaying the step eagerly.
    #[arg(long)]
    pub detect_anomaly: bool,
    /// Check the laws on every N-th step: executed = reference sweep and the zero-preserving
    /// audit on the step's tape, saved graph = graph (compiled backend), and the loss along a
    /// random direction by forward mode and by finite differences in f64. A failure stops the
    /// run naming the law, the step and the node. Leaves the trained bits unchanged.
    #[arg(long, value_name = "N")]
    pub verify_every: Option<u64>,
    /// With --verify-every: report a failed check (stderr and --log) and go on.
    #[arg(long, requires = "verify_every")]
    pub verify_warn: bool,
    /// Continue the run saved in this checkpoint.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Write one JSON object per step and evaluation here.
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Write the loss curves here as an SVG chart.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print only the summary table.
    #[arg(long, short)]
    pub quiet: bool,
    /// gpt: train on this UTF-8 text file instead of the embedded Shakespeare plays.
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// gpt: transformer blocks (default 4).
    #[arg(long)]
    pub layers: Option<usize>,
    /// gpt: attention heads per block (default 4); must divide --embd.
    #[arg(long)]
    pub heads: Option<usize>,
    /// gpt: the model's width (default 128).
    #[arg(long)]
    pub embd: Option<usize>,
    /// gpt: characters of context (default 64).
    #[arg(long)]
    pub context: Option<usize>,
    /// gpt: the LM head shares the token embedding's table.
    #[arg(long)]
    pub tie_weights: bool,
    /// gpt: start from the weights in this safetensors file, saved by PyTorch under nanoGPT's
    /// names (docs/gpt.md); the flags must give the file's sizes.
    #[arg(long, value_name = "FILE")]
    pub init_from: Option<PathBuf>,
    /// Gradient accumulation: run each step's batch as K micro-batches (the first batch-size % K
    /// one row larger), sum their gradients in order and scale once (docs/distributed.md).
    #[arg(long, value_name = "K")]
    pub accumulate: Option<usize>,
    /// Run as one rank of a data-parallel job: `mpiexec -n N tapegrad train ... --distributed`
    /// (a build with `--features mpi`). Rank k runs micro-batch k of each batch; the parameters
    /// are bit for bit those of `--accumulate N` in one process. Only rank 0 writes files.
    #[arg(long)]
    pub distributed: bool,
    /// --distributed: gradients are exchanged in fused buckets of this many MiB.
    #[arg(long, value_name = "MB", default_value_t = 25.0)]
    pub bucket_mb: f64,
}

/// Runs `tapegrad train`.
pub fn run(args: TrainArgs) -> CliResult {
    crate::set_threads(args.threads)?;
    for (value, flag) in [
        (args.eval_every, "--eval-every"),
        (args.schedule_steps, "--schedule-steps"),
        (args.verify_every, "--verify-every"),
    ] {
        if value == Some(0) {
            return Err(CliError::Usage(format!("{flag} needs a positive N")));
        }
    }
    match (args.save_every, &args.save) {
        (Some(0), _) => return Err(CliError::Usage("--save-every needs a positive N".into())),
        (Some(_), None) => {
            return Err(CliError::Usage(
                "--save-every N needs --save FILE: where to write the checkpoint".into(),
            ))
        }
        _ => {}
    }
    let gpt_resume = args
        .resume
        .as_deref()
        .is_some_and(crate::train_gpt::is_gpt_checkpoint);
    if args.preset == Some(Preset::Gpt) || gpt_resume {
        return crate::train_gpt::run(&args);
    }
    let gpt_flags: Vec<&str> = [
        (args.text.is_some(), "--text"),
        (args.layers.is_some(), "--layers"),
        (args.heads.is_some(), "--heads"),
        (args.embd.is_some(), "--embd"),
        (args.context.is_some(), "--context"),
        (args.tie_weights, "--tie-weights"),
        (args.init_from.is_some(), "--init-from"),
    ]
    .into_iter()
    .filter_map(|(g, n)| g.then_some(n))
    .collect();
    if !gpt_flags.is_empty() {
        return Err(CliError::Usage(format!(
            "{} apply to the gpt preset: tapegrad train gpt",
            gpt_flags.join(", ")
        )));
    }
    if let Some(path) = &args.resume {
        let ckpt = Checkpoint::read(path)?;
        reject_changes_on_resume(&args, &ckpt)?;
        return match ckpt.header.dtype {
            DType::F32 => resume_typed::<f32>(&args, &ckpt),
            DType::F64 => resume_typed::<f64>(&args, &ckpt),
        };
    }
    let plan = Plan::from_args(&args)?;
    match args.dtype.unwrap_or(DTypeArg::F32) {
        DTypeArg::F32 => fresh_typed::<f32>(&args, plan),
        DTypeArg::F64 => fresh_typed::<f64>(&args, plan),
    }
}

/// The untyped part of a fresh run's configuration (the model's widths need the data).
struct Plan {
    preset: &'static str,
    cnn: bool,
    data: DataSource,
    hidden: Vec<usize>,
    activation: Activation,
    dropout: f64,
    optimizer: OptimizerConfig,
    schedule: ScheduleArg,
    batch_size: usize,
    epochs: u64,
    val_fraction: f64,
    seed: u64,
}

impl Plan {
    fn from_args(a: &TrainArgs) -> Result<Plan, CliError> {
        let usage = |m: &str| Err(CliError::Usage(m.to_string()));
        if a.model == Some(ModelKind::Cnn) && (a.csv.is_some() || a.preset == Some(Preset::Mlp)) {
            return usage("--model cnn is for the digits images; use the MLP for tables");
        }
        if a.model == Some(ModelKind::Cnn) && a.hidden.is_some() {
            return usage("--hidden sets MLP widths; the CNN's layers are fixed");
        }
        if a.target.is_some() && a.csv.is_none() {
            return usage("--target needs --csv FILE");
        }
        if a.task.is_some() && a.csv.is_none() {
            return usage("--task needs --csv FILE");
        }
        // (preset name, data, hidden widths, optimizer, lr, schedule, batch size, epochs)
        let (preset, data, hidden, opt, lr, schedule, batch, epochs) = match (&a.csv, a.preset) {
            (Some(path), _) => {
                let target = a.target.clone().ok_or_else(|| {
                    CliError::Usage(
                        "--csv needs --target COLUMN (a name, a 0-based index or `last`)".into(),
                    )
                })?;
                let task = match a.task.unwrap_or(TaskArg::Regression) {
                    TaskArg::Regression => TaskKind::Regression,
                    TaskArg::Classification => TaskKind::Classification,
                };
                let data = DataSource::Csv {
                    path: path.display().to_string(),
                    target,
                    task,
                };
                (
                    "csv",
                    data,
                    vec![32],
                    "adam",
                    0.01,
                    ScheduleArg::Cosine,
                    32,
                    100,
                )
            }
            (None, Some(Preset::Mlp)) => (
                "mlp",
                DataSource::AutoMpg,
                vec![32],
                "adam",
                0.01,
                ScheduleArg::Cosine,
                32,
                100,
            ),
            (None, Some(Preset::Digits | Preset::Gpt) | None) => (
                "digits",
                DataSource::Digits,
                vec![128],
                "adam",
                0.001,
                ScheduleArg::Constant,
                32,
                20,
            ),
        };
        let lr = a.lr.unwrap_or(lr);
        let mut optimizer = OptimizerConfig::by_name(a.optimizer.as_deref().unwrap_or(opt), lr)?;
        apply_optimizer_flags(&mut optimizer, a)?;
        let activation = match a.activation.unwrap_or(ActivationArg::Relu) {
            ActivationArg::Relu => Activation::Relu,
            ActivationArg::Tanh => Activation::Tanh,
            ActivationArg::Sigmoid => Activation::Sigmoid,
            ActivationArg::Gelu => Activation::Gelu,
            ActivationArg::Silu => Activation::Silu,
        };
        Ok(Plan {
            preset,
            cnn: a.model == Some(ModelKind::Cnn),
            data,
            hidden: a.hidden.clone().unwrap_or(hidden),
            activation,
            dropout: a.dropout.unwrap_or(0.0),
            optimizer,
            schedule: a.schedule.unwrap_or(schedule),
            batch_size: a.batch_size.unwrap_or(batch),
            epochs: a.epochs.unwrap_or(epochs),
            val_fraction: a.val_fraction.unwrap_or(0.2),
            seed: a.seed.unwrap_or(0),
        })
    }
}

fn apply_optimizer_flags(opt: &mut OptimizerConfig, a: &TrainOptions) -> Result<(), CliError> {
    if let Some(wd) = a.weight_decay {
        match opt {
            OptimizerConfig::Sgd { weight_decay, .. }
            | OptimizerConfig::Adam { weight_decay, .. }
            | OptimizerConfig::AdamW { weight_decay, .. }
            | OptimizerConfig::RmsProp { weight_decay, .. }
            | OptimizerConfig::Adagrad { weight_decay, .. } => *weight_decay = wd,
        }
    }
    if let Some(m) = a.momentum {
        match opt {
            OptimizerConfig::Sgd { momentum, .. } | OptimizerConfig::RmsProp { momentum, .. } => {
                *momentum = m
            }
            other => {
                return Err(CliError::Usage(format!(
                    "--momentum applies to sgd and rmsprop, not {}",
                    other.name()
                )))
            }
        }
    }
    if a.nesterov {
        match opt {
            OptimizerConfig::Sgd { nesterov, .. } => *nesterov = true,
            other => {
                return Err(CliError::Usage(format!(
                    "--nesterov applies to sgd, not {}",
                    other.name()
                )))
            }
        }
    }
    opt.validate()?;
    Ok(())
}

/// Flags that define the run cannot change when resuming: the continuation must be the same run.
fn reject_changes_on_resume(a: &TrainArgs, ckpt: &Checkpoint) -> Result<(), CliError> {
    let given: Vec<&str> = [
        (a.preset.is_some(), "a preset"),
        (a.model.is_some(), "--model"),
        (a.batch_size.is_some(), "--batch-size"),
        (a.lr.is_some(), "--lr"),
        (a.optimizer.is_some(), "--optimizer"),
        (a.weight_decay.is_some(), "--weight-decay"),
        (a.momentum.is_some(), "--momentum"),
        (a.nesterov, "--nesterov"),
        (a.schedule.is_some(), "--schedule"),
        (a.warmup.is_some(), "--warmup"),
        (a.schedule_steps.is_some(), "--schedule-steps"),
        (a.step_size.is_some(), "--step-size"),
        (a.gamma.is_some(), "--gamma"),
        (a.clip.is_some(), "--clip"),
        (a.label_smoothing.is_some(), "--label-smoothing"),
        (a.hidden.is_some(), "--hidden"),
        (a.activation.is_some(), "--activation"),
        (a.dropout.is_some(), "--dropout"),
        (a.seed.is_some(), "--seed"),
        (a.csv.is_some(), "--csv"),
        (a.target.is_some(), "--target"),
        (a.task.is_some(), "--task"),
        (a.val_fraction.is_some(), "--val-fraction"),
        (a.accumulate.is_some(), "--accumulate"),
    ]
    .into_iter()
    .filter_map(|(g, n)| g.then_some(n))
    .collect();
    if !given.is_empty() {
        return Err(CliError::Usage(format!(
            "--resume continues the run saved in {} with its own settings; remove {}",
            ckpt.path.display(),
            given.join(", ")
        )));
    }
    if let Some(d) = a.dtype {
        let want = match d {
            DTypeArg::F32 => DType::F32,
            DTypeArg::F64 => DType::F64,
        };
        if want != ckpt.header.dtype {
            return Err(CliError::Usage(format!(
                "--dtype {want} differs from the checkpoint's {}; resume keeps the checkpoint's dtype",
                ckpt.header.dtype
            )));
        }
    }
    Ok(())
}

fn fresh_typed<S: Scalar>(args: &TrainArgs, plan: Plan) -> CliResult {
    let dataset = plan.data.load()?;
    let data = Prepared::<S>::new(&dataset, plan.val_fraction, plan.seed)?;
    let model = if plan.cnn {
        ModelSpec::Cnn {
            image: [1, 8, 8],
            channels: vec![16, 32],
            outputs: data.task.outputs(),
            batch_norm: true,
            dropout: plan.dropout,
        }
    } else {
        ModelSpec::Mlp {
            inputs: data.feature_names.len(),
            hidden: plan.hidden.clone(),
            outputs: data.task.outputs(),
            activation: plan.activation,
            dropout: plan.dropout,
        }
    };
    let batches = data.train.len().div_ceil(plan.batch_size.max(1)) as u64;
    let steps = args.steps.unwrap_or(plan.epochs.saturating_mul(batches));
    let warmup = args.warmup.unwrap_or(0);
    let decay = match plan.schedule {
        ScheduleArg::Constant => Decay::Constant,
        ScheduleArg::Step => Decay::Step {
            step_size: args.step_size.unwrap_or((steps / 3).max(1)),
            gamma: args.gamma.unwrap_or(0.1),
        },
        ScheduleArg::Cosine => Decay::Cosine {
            t_max: args
                .schedule_steps
                .unwrap_or(steps.saturating_sub(warmup))
                .max(1),
            eta_min: 0.0,
        },
    };
    let config = TrainConfig {
        preset: plan.preset.to_string(),
        data: plan.data.clone(),
        model,
        optimizer: plan.optimizer,
        schedule: Schedule { warmup, decay },
        clip_norm: args.clip,
        label_smoothing: args.label_smoothing.unwrap_or(0.0),
        batch_size: plan.batch_size,
        val_fraction: plan.val_fraction,
        seed: plan.seed,
        accumulate: args.accumulate.unwrap_or(1),
    };
    if !args.quiet && !dataset.dropped.is_empty() {
        println!(
            "note: text columns left out of the features: {}",
            dataset.dropped.join(", ")
        );
    }
    let trainer = Trainer::new(config, data, make_backend::<S>(args.backend.kind())?)?;
    drive(args, trainer, steps)
}

fn resume_typed<S: Scalar>(args: &TrainArgs, ckpt: &Checkpoint) -> CliResult {
    let trainer = ckpt.resume::<S>(make_backend::<S>(args.backend.kind())?)?;
    let batches = trainer.order.batches_per_epoch() as u64;
    let steps = args
        .steps
        .or(args.epochs.map(|e| e.saturating_mul(batches)))
        .ok_or_else(|| {
            CliError::Usage(
                "--resume needs --steps N or --epochs N: how much further to train".into(),
            )
        })?;
    if !args.quiet {
        println!(
            "resuming {} at step {} (epoch {})",
            ckpt.path.display(),
            trainer.step,
            trainer.order.epoch()
        );
        let schedule = trainer.config.schedule;
        if let Decay::Cosine { t_max, eta_min } = schedule.decay {
            if trainer.step + steps > schedule.warmup + t_max {
                println!(
                    "note: the saved cosine schedule ends at step {}; later steps use its final rate {eta_min} \
                     (start with --schedule-steps TOTAL to plan a longer run)",
                    schedule.warmup + t_max
                );
            }
        }
    }
    drive(args, trainer, steps)
}

/// What the progress display and the plot need from each evaluation.
struct Curves {
    train: Vec<(f64, f64)>,
    val: Vec<(f64, f64)>,
}

/// Runs `steps` steps of `trainer` with progress, evaluations, log, summary, checkpoint and plot.
fn drive<S: Scalar>(args: &TrainArgs, mut trainer: Trainer<S>, steps: u64) -> CliResult {
    let metric = metric_name(&trainer.data.task);
    let metric_label = match (&trainer.config.data, metric) {
        (DataSource::AutoMpg, "rmse") => "RMSE (mpg)".to_string(),
        (_, "rmse") => "RMSE".to_string(),
        _ => "accuracy".to_string(),
    };
    let batches = trainer.order.batches_per_epoch() as u64;
    let eval_every = args.eval_every.unwrap_or(batches).max(1);
    // Every rank of a distributed run takes the same steps; only rank 0 prints and writes files.
    let root = crate::distributed::attach(args, &mut trainer)?;
    let quiet = args.quiet || !root;
    trainer.set_detect_anomaly(args.detect_anomaly);
    if let Some(every) = args.verify_every {
        trainer.set_verify(Some(Verifier::new(every, args.verify_warn)?));
    }
    if !quiet {
        print_header(&trainer, steps, args.backend.kind());
        if args.detect_anomaly {
            println!("anomaly mode: the first NaN or infinity stops the run and names its node");
        }
        if let Some(every) = args.verify_every {
            let laws = match args.backend.kind() {
                BackendKind::Compiled => "1, 4, 5, 6 and 7",
                BackendKind::Eager => "1, 5, 6 and 7",
            };
            println!("verify: laws {laws} are checked on every {every}th step");
        }
    }
    let before_train = trainer.evaluate(Which::Train)?;
    let before_val = trainer.evaluate(Which::Validation)?;
    if !quiet {
        println!(
            "before: validation loss {:.4}, {metric_label} {}",
            before_val.loss,
            format_metric(metric, before_val.metric)
        );
    }
    let mut log = match &args.log {
        Some(p) if root => Some(RunLog::create(p, metric)?),
        _ => None,
    };
    let start_step = trainer.step;
    if let Some(log) = &mut log {
        log.record(
            "validation",
            start_step,
            trainer.order.epoch(),
            before_val.loss,
            before_val.metric,
            None,
            0.0,
        )?;
    }
    let mut curves = Curves {
        train: Vec::new(),
        val: vec![(start_step as f64, before_val.loss)],
    };
    let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
        let bar = ProgressBar::new(steps);
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:30.cyan/blue} {pos}/{len} steps  {msg}  {rate}  eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .with_key(
                "rate",
                |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = write!(w, "{:.0} steps/s", state.per_sec());
                },
            ),
        );
        bar
    });
    // Without a terminal, print about 20 evaluation lines however long the run is.
    let evals_total = steps / eval_every;
    let print_every = evals_total.div_ceil(20).max(1);
    let mut evals_done = 0u64;
    let started = Instant::now();
    let mut last_val = before_val;
    let mut rows_seen = 0usize;
    for i in 0..steps {
        let step = trainer.train_step();
        if let Some(v) = trainer.take_verification() {
            if let Some(log) = &mut log {
                log.record_value(&v.to_json())?;
            }
            if args.verify_warn {
                for failure in v.checks.iter().filter_map(|c| c.failure.as_ref()) {
                    eprintln!("warning: {failure}");
                }
            }
        }
        let rec = step?;
        rows_seen += rec.rows;
        let seconds = started.elapsed().as_secs_f64();
        curves.train.push((rec.step as f64, rec.loss));
        if let Some(log) = &mut log {
            log.record(
                "train",
                rec.step,
                rec.epoch,
                rec.loss,
                rec.metric,
                Some(rec.lr),
                seconds,
            )?;
        }
        let is_eval = (i + 1) % eval_every == 0 || i + 1 == steps;
        if is_eval {
            last_val = trainer.evaluate(Which::Validation)?;
            curves.val.push((rec.step as f64, last_val.loss));
            if let Some(log) = &mut log {
                log.record(
                    "validation",
                    rec.step,
                    rec.epoch,
                    last_val.loss,
                    last_val.metric,
                    None,
                    seconds,
                )?;
            }
            evals_done += 1;
            if bar.is_none() && !quiet && (evals_done % print_every == 0 || i + 1 == steps) {
                println!(
                    "step {:>6}/{}  epoch {:>4}  loss {:.4}  val loss {:.4}  val {metric_label} {}  {:.0} steps/s",
                    rec.step,
                    start_step + steps,
                    rec.epoch,
                    rec.loss,
                    last_val.loss,
                    format_metric(metric, last_val.metric),
                    (i + 1) as f64 / seconds.max(1e-9)
                );
            }
        }
        if let Some(bar) = &bar {
            if is_eval || i % 10 == 0 {
                bar.set_message(format!(
                    "loss {:.4}  val {metric_label} {}",
                    rec.loss,
                    format_metric(metric, last_val.metric)
                ));
            }
            bar.inc(1);
        }
        if let (Some(every), Some(path), true) = (args.save_every, &args.save, root) {
            // The last step is saved after the summary below; saving it twice would be waste.
            if rec.step % every == 0 && i + 1 < steps {
                checkpoint::save(path, &trainer)?;
            }
        }
    }
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let seconds = started.elapsed().as_secs_f64();
    if let Some(log) = &mut log {
        log.flush()?;
    }
    let after_train = trainer.evaluate(Which::Train)?;
    let after_val = last_val;
    trainer.finish_exchange();

    let mut table = Table::new(&["", "before", "after"]);
    table.row(vec![
        "train loss".into(),
        format!("{:.4}", before_train.loss),
        format!("{:.4}", after_train.loss),
    ]);
    table.row(vec![
        "validation loss".into(),
        format!("{:.4}", before_val.loss),
        format!("{:.4}", after_val.loss),
    ]);
    table.row(vec![
        format!("train {metric_label}"),
        format_metric(metric, before_train.metric),
        format_metric(metric, after_train.metric),
    ]);
    table.row(vec![
        format!("validation {metric_label}"),
        format_metric(metric, before_val.metric),
        format_metric(metric, after_val.metric),
    ]);
    if !root {
        return Ok(std::process::ExitCode::SUCCESS);
    }
    if let Some(v) = trainer.verifier() {
        let s = v.stats();
        table.row(vec![
            "verify: checks passed".into(),
            "-".into(),
            format!("{}/{}", s.passed, s.checks),
        ]);
        table.row(vec![
            "verify: worst rel. error".into(),
            "-".into(),
            format!("{:.1e}", s.worst_rel_err),
        ]);
    }
    if !quiet {
        println!();
    }
    print!("{}", table.render());
    println!(
        "{} steps ({} to {}, epoch {}) in {:.2} s: {:.0} steps/s, {:.0} rows/s",
        steps,
        start_step,
        trainer.step,
        trainer.order.epoch(),
        seconds,
        steps as f64 / seconds.max(1e-9),
        rows_seen as f64 / seconds.max(1e-9)
    );
    if let Some(v) = trainer.verifier() {
        let s = v.stats();
        println!(
            "verified {} steps ({} checks, {} passed) in {:.2} s: {:.1}% on top of the training",
            s.steps,
            s.checks,
            s.passed,
            s.seconds,
            100.0 * s.seconds / (seconds - s.seconds).max(1e-9)
        );
    }
    if let Some(path) = &args.save {
        checkpoint::save(path, &trainer)?;
        if !quiet {
            println!(
                "saved checkpoint {} (step {})",
                path.display(),
                trainer.step
            );
        }
    }
    if let Some(path) = &args.plot {
        let title = format!(
            "{}: {} ({})",
            trainer.config.preset,
            trainer.model.spec.name(),
            trainer.config.optimizer.name()
        );
        let window = (batches as usize).clamp(1, 50);
        let series = vec![
            Series {
                name: "train loss (per step)".into(),
                color: "#9ecae1".into(),
                points: curves.train.clone(),
                width: 1.0,
            },
            Series {
                name: format!("train loss (mean of {window})"),
                color: "#08519c".into(),
                points: plot::moving_average(&curves.train, window),
                width: 2.0,
            },
            Series {
                name: "validation loss".into(),
                color: "#d94801".into(),
                points: curves.val,
                width: 2.0,
            },
        ];
        let svg = plot::svg(&title, "step", "loss", &series);
        std::fs::write(path, svg).map_err(|e| CliError::Io {
            path: path.display().to_string(),
            source: e,
        })?;
        if !quiet {
            println!("wrote plot {}", path.display());
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

fn print_header<S: Scalar>(t: &Trainer<S>, steps: u64, backend: BackendKind) {
    let c = &t.config;
    println!(
        "tapegrad train {}: {} ({} parameters), {} lr {}, {}, batch {}, {} steps, {}, {} backend, seed {}",
        c.preset,
        t.model.spec.name(),
        t.model.params.trainable_count(),
        c.optimizer.name(),
        c.optimizer.lr(),
        c.schedule.describe(),
        c.batch_size,
        steps,
        S::DTYPE,
        backend.name(),
        c.seed
    );
    println!(
        "data: {}; {} train rows, {} validation rows, {} features (standardised on the train rows)",
        c.data.describe(),
        t.data.train.len(),
        t.data.val.len(),
        t.data.feature_names.len()
    );
    if c.accumulate > 1 {
        println!(
            "accumulate: {} micro-batches per step, gradients summed in order and scaled once",
            c.accumulate
        );
    }
}
