//! `tapegrad train`: presets (`digits`, the default, and `mlp` for Auto MPG) or a user's CSV file,
//! flags for the optimizer, schedule, batches, dtype and backend; a progress bar on a terminal
//! (plain lines otherwise), a summary table, and optional checkpoint, JSON-lines log and SVG plot.
//! Also holds what `eval` and `predict` share: error conversion and the dtype dispatch.

use crate::engine_flags::{by_dtype, reject_settings_on_resume, DTypeArg, EngineFlags};
use crate::error::{CliError, CliResult};
use crate::run_output::{self, LossCurves};
use clap::ValueEnum;
use indicatif::ProgressBar;
use std::path::PathBuf;
use std::time::Instant;
use tapegrad_nn::checkpoint::{self, Checkpoint};
use tapegrad_nn::data::{DataSource, Prepared, TaskKind};
use tapegrad_nn::layers::Activation;
use tapegrad_nn::presets::{self, DecayKind, DecayOptions, PresetDefaults};
use tapegrad_nn::runlog::RunLog;
use tapegrad_nn::summary::{format_metric, Table};
use tapegrad_nn::trainer::metric_name;
use tapegrad_nn::verify::Verifier;
use tapegrad_nn::{
    make_backend, BackendKind, Decay, Evaluation, ModelSpec, NnError, OptimizerConfig, Schedule,
    StepRecord, TrainConfig, Trainer, Which,
};
use tapegrad_tensor::Scalar;

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
    #[command(flatten)]
    pub engine: EngineFlags,
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
    #[command(flatten)]
    pub dist: crate::distributed::DistributedFlags,
}

/// Runs `tapegrad train`.
pub fn run(args: TrainArgs) -> CliResult {
    args.engine.apply()?;
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
        return by_dtype!(ckpt.header.dtype, resume_typed(&args, &ckpt));
    }
    let plan = Plan::from_args(&args)?;
    let dtype = args.dtype.unwrap_or(DTypeArg::F32).dtype();
    by_dtype!(dtype, fresh_typed(&args, plan))
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
    decay: DecayKind,
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
        let data = match (&a.csv, a.preset) {
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
                DataSource::Csv {
                    path: path.display().to_string(),
                    target,
                    task,
                }
            }
            (None, Some(Preset::Mlp)) => DataSource::AutoMpg,
            (None, Some(Preset::Digits | Preset::Gpt) | None) => DataSource::Digits,
        };
        let defaults = PresetDefaults::of(&data);
        let lr = a.lr.unwrap_or(defaults.lr);
        let optimizer_name = a.optimizer.as_deref().unwrap_or(defaults.optimizer);
        let mut optimizer = OptimizerConfig::by_name(optimizer_name, lr)?;
        apply_optimizer_flags(&mut optimizer, a)?;
        let activation = match a.activation {
            None => defaults.activation,
            Some(ActivationArg::Relu) => Activation::Relu,
            Some(ActivationArg::Tanh) => Activation::Tanh,
            Some(ActivationArg::Sigmoid) => Activation::Sigmoid,
            Some(ActivationArg::Gelu) => Activation::Gelu,
            Some(ActivationArg::Silu) => Activation::Silu,
        };
        let decay = match a.schedule {
            None => defaults.decay,
            Some(ScheduleArg::Constant) => DecayKind::Constant,
            Some(ScheduleArg::Step) => DecayKind::Step,
            Some(ScheduleArg::Cosine) => DecayKind::Cosine,
        };
        Ok(Plan {
            preset: defaults.name,
            cnn: a.model == Some(ModelKind::Cnn),
            data,
            hidden: a.hidden.clone().unwrap_or_else(|| defaults.hidden.to_vec()),
            activation,
            dropout: a.dropout.unwrap_or(0.0),
            optimizer,
            decay,
            batch_size: a.batch_size.unwrap_or(defaults.batch_size),
            epochs: a.epochs.unwrap_or(defaults.epochs),
            val_fraction: a.val_fraction.unwrap_or(defaults.val_fraction),
            seed: a.seed.unwrap_or(defaults.seed),
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
    let flags = [
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
    ];
    reject_settings_on_resume(&ckpt.path, &flags, a.dtype, ckpt.header.dtype)
}

fn fresh_typed<S: Scalar>(args: &TrainArgs, plan: Plan) -> CliResult {
    let dataset = plan.data.load()?;
    let data = Prepared::<S>::new(&dataset, plan.val_fraction, plan.seed)?;
    let model = if plan.cnn {
        presets::digits_cnn(data.task.outputs(), plan.dropout)
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
    let decay = plan.decay.build(
        steps,
        warmup,
        DecayOptions {
            cosine_steps: args.schedule_steps,
            step_size: args.step_size,
            gamma: args.gamma,
        },
    );
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
    let mut trainer = Trainer::new(config, data, make_backend::<S>(args.engine.backend())?)?;
    // Every rank of a distributed run takes the same steps; only rank 0 prints and writes files.
    let root = crate::distributed::attach(args, &mut trainer)?;
    if root && !args.quiet && !dataset.dropped.is_empty() {
        println!(
            "note: text columns left out of the features: {}",
            dataset.dropped.join(", ")
        );
    }
    drive(args, trainer, steps, root)
}

fn resume_typed<S: Scalar>(args: &TrainArgs, ckpt: &Checkpoint) -> CliResult {
    let mut trainer = ckpt.resume::<S>(make_backend::<S>(args.engine.backend())?)?;
    let batches = trainer.order.batches_per_epoch() as u64;
    let steps = args
        .steps
        .or(args.epochs.map(|e| e.saturating_mul(batches)))
        .ok_or_else(|| {
            CliError::Usage(
                "--resume needs --steps N or --epochs N: how much further to train".into(),
            )
        })?;
    let root = crate::distributed::attach(args, &mut trainer)?;
    if root && !args.quiet {
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
    drive(args, trainer, steps, root)
}

/// Runs `steps` steps of `trainer` with progress, evaluations, log, summary, checkpoint and plot
/// (the output and the files on rank 0 only: `root`, from `distributed::attach`).
fn drive<S: Scalar>(
    args: &TrainArgs,
    mut trainer: Trainer<S>,
    steps: u64,
    root: bool,
) -> CliResult {
    let quiet = args.quiet || !root;
    trainer.set_detect_anomaly(args.detect_anomaly);
    if let Some(every) = args.verify_every {
        trainer.set_verify(Some(Verifier::new(every, args.verify_warn)?));
    }
    if !quiet {
        announce(args, &trainer, steps);
    }
    let before_train = trainer.evaluate(Which::Train)?;
    let before_val = trainer.evaluate(Which::Validation)?;
    let mut progress = Progress::start(args, &trainer, steps, root, before_val)?;
    if !quiet {
        println!(
            "before: validation loss {:.4}, {} {}",
            before_val.loss,
            progress.metric_label,
            format_metric(progress.metric, before_val.metric)
        );
    }
    for i in 0..steps {
        progress.step(args, &mut trainer, i)?;
    }
    let seconds = progress.finish()?;
    let after_train = trainer.evaluate(Which::Train)?;
    trainer.finish_exchange();
    if !root {
        return Ok(std::process::ExitCode::SUCCESS);
    }
    if !quiet {
        println!();
    }
    let evaluations = [(before_train, before_val), (after_train, progress.last_val)];
    print_summary(&trainer, &progress, &evaluations, seconds);
    write_files(args, &trainer, &progress.curves, quiet)?;
    Ok(std::process::ExitCode::SUCCESS)
}

/// The run's header, and which checks it runs besides training.
fn announce<S: Scalar>(args: &TrainArgs, trainer: &Trainer<S>, steps: u64) {
    print_header(trainer, steps, args.engine.backend());
    run_output::announce_checks(args);
}

/// The state of a run between steps: what it shows, logs and plots.
struct Progress {
    metric: &'static str,
    metric_label: String,
    eval_every: u64,
    /// Without a terminal, an evaluation line is printed every this many evaluations.
    print_every: u64,
    evals_done: u64,
    start_step: u64,
    steps: u64,
    rows_seen: usize,
    last_val: Evaluation,
    started: Instant,
    quiet: bool,
    root: bool,
    log: Option<RunLog>,
    curves: LossCurves,
    bar: Option<ProgressBar>,
}

impl Progress {
    /// Opens the log (rank 0 only) with the evaluation before the first step, and the bar.
    fn start<S: Scalar>(
        args: &TrainArgs,
        trainer: &Trainer<S>,
        steps: u64,
        root: bool,
        before_val: Evaluation,
    ) -> Result<Progress, CliError> {
        let metric = metric_name(&trainer.data.task);
        let metric_label = match (&trainer.config.data, metric) {
            (DataSource::AutoMpg, "rmse") => "RMSE (mpg)".to_string(),
            (_, "rmse") => "RMSE".to_string(),
            _ => "accuracy".to_string(),
        };
        let quiet = args.quiet || !root;
        let eval_every = args
            .eval_every
            .unwrap_or(trainer.order.batches_per_epoch() as u64)
            .max(1);
        let start_step = trainer.step;
        let mut log = match &args.log {
            Some(p) if root => Some(RunLog::create(p, metric)?),
            _ => None,
        };
        if let Some(log) = &mut log {
            let epoch = trainer.order.epoch();
            log.record(
                "validation",
                start_step,
                epoch,
                before_val.loss,
                before_val.metric,
                None,
                0.0,
            )?;
        }
        let bar = run_output::progress_bar(
            steps,
            quiet,
            "{bar:30.cyan/blue} {pos}/{len} steps  {msg}  {steps_per_s}  eta {eta}",
        );
        Ok(Progress {
            metric,
            metric_label,
            eval_every,
            print_every: (steps / eval_every).div_ceil(20).max(1),
            evals_done: 0,
            start_step,
            steps,
            rows_seen: 0,
            last_val: before_val,
            started: Instant::now(),
            quiet,
            root,
            log,
            curves: LossCurves::new(start_step, before_val.loss),
            bar,
        })
    }

    /// Step `i` of the run: the step itself, its verification, the log, the evaluation when
    /// one is due, the display and the periodic checkpoint.
    fn step<S: Scalar>(
        &mut self,
        args: &TrainArgs,
        trainer: &mut Trainer<S>,
        i: u64,
    ) -> Result<(), CliError> {
        let step = trainer.train_step();
        if let Some(v) = trainer.take_verification() {
            let warn = args.verify_warn && self.root;
            run_output::record_verification(self.log.as_mut(), &v, warn)?;
        }
        let rec = step?;
        self.rows_seen += rec.rows;
        let seconds = self.started.elapsed().as_secs_f64();
        self.curves.train.push((rec.step as f64, rec.loss));
        if let Some(log) = &mut self.log {
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
        let last = i + 1 == self.steps;
        let is_eval = (i + 1) % self.eval_every == 0 || last;
        if is_eval {
            self.evaluate(trainer, &rec, seconds, i, last)?;
        }
        if let Some(bar) = &self.bar {
            if is_eval || i % 10 == 0 {
                bar.set_message(format!(
                    "loss {:.4}  val {} {}",
                    rec.loss,
                    self.metric_label,
                    format_metric(self.metric, self.last_val.metric)
                ));
            }
            bar.inc(1);
        }
        if let (Some(every), Some(path), true) = (args.save_every, &args.save, self.root) {
            // The last step is saved after the summary; saving it twice would be waste.
            if rec.step % every == 0 && !last {
                checkpoint::save(path, trainer)?;
            }
        }
        Ok(())
    }

    /// The validation evaluation after step `i`: the curve, the log and, without a bar, about
    /// twenty printed lines however long the run is.
    fn evaluate<S: Scalar>(
        &mut self,
        trainer: &mut Trainer<S>,
        rec: &StepRecord,
        seconds: f64,
        i: u64,
        last: bool,
    ) -> Result<(), CliError> {
        self.last_val = trainer.evaluate(Which::Validation)?;
        let val = self.last_val;
        self.curves.val.push((rec.step as f64, val.loss));
        if let Some(log) = &mut self.log {
            log.record(
                "validation",
                rec.step,
                rec.epoch,
                val.loss,
                val.metric,
                None,
                seconds,
            )?;
        }
        self.evals_done += 1;
        if self.bar.is_none() && !self.quiet && (self.evals_done % self.print_every == 0 || last) {
            println!(
                "step {:>6}/{}  epoch {:>4}  loss {:.4}  val loss {:.4}  val {} {}  {:.0} steps/s",
                rec.step,
                self.start_step + self.steps,
                rec.epoch,
                rec.loss,
                val.loss,
                self.metric_label,
                format_metric(self.metric, val.metric),
                (i + 1) as f64 / seconds.max(1e-9)
            );
        }
        Ok(())
    }

    /// Clears the bar and flushes the log; returns the run's seconds.
    fn finish(&mut self) -> Result<f64, CliError> {
        run_output::finish_steps(self.bar.as_ref(), self.log.as_mut(), self.started)
    }
}

/// The before/after table, the speed line and the verification's cost.
fn print_summary<S: Scalar>(
    trainer: &Trainer<S>,
    progress: &Progress,
    evaluations: &[(Evaluation, Evaluation); 2],
    seconds: f64,
) {
    let (metric, label) = (progress.metric, &progress.metric_label);
    let [(before_train, before_val), (after_train, after_val)] = evaluations;
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
        format!("train {label}"),
        format_metric(metric, before_train.metric),
        format_metric(metric, after_train.metric),
    ]);
    table.row(vec![
        format!("validation {label}"),
        format_metric(metric, before_val.metric),
        format_metric(metric, after_val.metric),
    ]);
    run_output::verify_rows(&mut table, trainer.verifier());
    print!("{}", table.render());
    let steps = progress.steps;
    println!(
        "{} steps ({} to {}, epoch {}) in {:.2} s: {:.0} steps/s, {:.0} rows/s",
        steps,
        progress.start_step,
        trainer.step,
        trainer.order.epoch(),
        seconds,
        steps as f64 / seconds.max(1e-9),
        progress.rows_seen as f64 / seconds.max(1e-9)
    );
    run_output::print_verify_cost(trainer.verifier(), seconds);
}

/// The final checkpoint (`--save`) and the loss plot (`--plot`).
fn write_files<S: Scalar>(
    args: &TrainArgs,
    trainer: &Trainer<S>,
    curves: &LossCurves,
    quiet: bool,
) -> Result<(), CliError> {
    if let Some(path) = &args.save {
        checkpoint::save(path, trainer)?;
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
        let window = trainer.order.batches_per_epoch().clamp(1, 50);
        curves.write_plot(path, &title, "loss", window)?;
        if !quiet {
            println!("wrote plot {}", path.display());
        }
    }
    Ok(())
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
