//! `tapegrad train gpt`: a character-level GPT on the embedded Shakespeare plays (or `--text
//! FILE`), with the preset's sizes and schedule, `--layers --heads --embd --context` to change
//! them, tokens/s in the progress bar, the validation loss on fixed windows, and the same run
//! options as the other presets (log, plot, checkpoints and resume, backend, threads, dtype,
//! anomaly mode, `--accumulate`, `--distributed` under `mpiexec`), and `--init-from` to start
//! from weights saved by PyTorch.

use crate::engine_flags::{by_dtype, reject_settings_on_resume, DTypeArg};
use crate::error::{CliError, CliResult};
use crate::train::TrainArgs;
use std::path::Path;
use tapegrad_nn::data::text::{TextData, TextSource};
use tapegrad_nn::gpt::checkpoint::{self, GptCheckpoint};
use tapegrad_nn::gpt::import;
use tapegrad_nn::gpt::{GptConfig, GptPreset, GptRun};
use tapegrad_nn::{make_backend, ModelSpec, OptimizerConfig};
use tapegrad_tensor::Scalar;

mod drive;
use drive::drive;

/// The preset's sizes, batch and length, which the flags override.
const PRESET: GptPreset = GptPreset::SHAKESPEARE;

/// Whether the checkpoint at `path` is a GPT run's (unreadable files are left to the reader that
/// will report them).
pub fn is_gpt_checkpoint(path: &Path) -> bool {
    std::fs::read(path).is_ok_and(|b| checkpoint::is_gpt(&b))
}

/// Runs `tapegrad train gpt` (fresh, or `--resume` of a GPT checkpoint).
pub fn run(args: &TrainArgs) -> CliResult {
    reject_foreign_flags(args)?;
    if let Some(path) = &args.resume {
        let ckpt = GptCheckpoint::read(path)?;
        reject_changes_on_resume(args, &ckpt)?;
        return by_dtype!(ckpt.dtype, resume_typed(args, &ckpt));
    }
    let (config, data) = config_from_args(args)?;
    let steps = args.steps.unwrap_or(PRESET.steps);
    let dtype = args.dtype.unwrap_or(DTypeArg::F32).dtype();
    by_dtype!(dtype, fresh_typed(args, config, data, steps))
}

/// The tabular flags mean nothing to a language model.
fn reject_foreign_flags(a: &TrainArgs) -> Result<(), CliError> {
    let given: Vec<&str> = [
        (a.model.is_some(), "--model"),
        (a.epochs.is_some(), "--epochs"),
        (a.optimizer.is_some(), "--optimizer"),
        (a.momentum.is_some(), "--momentum"),
        (a.nesterov, "--nesterov"),
        (a.schedule.is_some(), "--schedule"),
        (a.step_size.is_some(), "--step-size"),
        (a.gamma.is_some(), "--gamma"),
        (a.label_smoothing.is_some(), "--label-smoothing"),
        (a.hidden.is_some(), "--hidden"),
        (a.activation.is_some(), "--activation"),
        (a.csv.is_some(), "--csv"),
        (a.target.is_some(), "--target"),
        (a.task.is_some(), "--task"),
        (a.val_fraction.is_some(), "--val-fraction"),
    ]
    .into_iter()
    .filter_map(|(g, n)| g.then_some(n))
    .collect();
    if given.is_empty() {
        Ok(())
    } else {
        Err(CliError::Usage(format!(
            "train gpt does not take {} (it trains AdamW with warm-up and cosine decay on the last 10% \
             held out)",
            given.join(", ")
        )))
    }
}

fn config_from_args(a: &TrainArgs) -> Result<(GptConfig, TextData), CliError> {
    let text = match &a.text {
        Some(p) => TextSource::File {
            path: p.display().to_string(),
        },
        None => TextSource::Shakespeare,
    };
    // The vocabulary is the text's: the text is read (and checked) first to size the model.
    let context = a.context.unwrap_or(PRESET.context);
    let data = TextData::load(&text, context)?;
    let model = ModelSpec::Gpt {
        vocab: data.vocab.len(),
        context,
        layers: a.layers.unwrap_or(PRESET.layers),
        heads: a.heads.unwrap_or(PRESET.heads),
        embd: a.embd.unwrap_or(PRESET.embd),
        mlp_ratio: PRESET.mlp_ratio,
        dropout: a.dropout.unwrap_or(0.0),
        tie_weights: a.tie_weights,
    };
    if let Some(shape) = model.gpt_shape() {
        shape.validate()?;
    }
    let steps = a.steps.unwrap_or(PRESET.steps);
    let batch = a.batch_size.unwrap_or(PRESET.batch_size);
    if batch == 0 {
        return Err(CliError::Usage("--batch-size must be at least 1".into()));
    }
    let mut c = GptConfig::preset(text, model, batch, a.schedule_steps.unwrap_or(steps));
    if let Some(w) = a.warmup {
        c.schedule.warmup = w;
        if let tapegrad_nn::Decay::Cosine { t_max, .. } = &mut c.schedule.decay {
            *t_max = a.schedule_steps.unwrap_or(steps).saturating_sub(w).max(1);
        }
    }
    if let OptimizerConfig::AdamW {
        lr, weight_decay, ..
    } = &mut c.optimizer
    {
        if let Some(v) = a.lr {
            *lr = v;
        }
        if let Some(v) = a.weight_decay {
            *weight_decay = v;
        }
    }
    if let (Some(v), tapegrad_nn::Decay::Cosine { eta_min, .. }) = (a.lr, &mut c.schedule.decay) {
        *eta_min = v / 10.0;
    }
    c.optimizer.validate()?;
    if let Some(clip) = a.clip {
        c.clip_norm = Some(clip);
    }
    c.seed = a.seed.unwrap_or(0);
    c.accumulate = a.accumulate.unwrap_or(1);
    if !(1..=batch).contains(&c.accumulate) {
        return Err(CliError::Usage(format!(
            "--accumulate {} needs 1 to {batch} micro-batches (--batch-size {batch})",
            c.accumulate
        )));
    }
    if c.accumulate > 1 && a.verify_every.is_some() {
        return Err(CliError::Usage(
            "--verify-every checks a step recorded on one tape; it does not run with \
             --accumulate above 1"
                .into(),
        ));
    }
    Ok((c, data))
}

/// The run's defining flags cannot change on resume.
fn reject_changes_on_resume(a: &TrainArgs, ckpt: &GptCheckpoint) -> Result<(), CliError> {
    let flags = [
        (a.batch_size.is_some(), "--batch-size"),
        (a.lr.is_some(), "--lr"),
        (a.weight_decay.is_some(), "--weight-decay"),
        (a.warmup.is_some(), "--warmup"),
        (a.schedule_steps.is_some(), "--schedule-steps"),
        (a.clip.is_some(), "--clip"),
        (a.dropout.is_some(), "--dropout"),
        (a.seed.is_some(), "--seed"),
        (a.text.is_some(), "--text"),
        (a.layers.is_some(), "--layers"),
        (a.heads.is_some(), "--heads"),
        (a.embd.is_some(), "--embd"),
        (a.context.is_some(), "--context"),
        (a.tie_weights, "--tie-weights"),
        (a.init_from.is_some(), "--init-from"),
        (a.accumulate.is_some(), "--accumulate"),
    ];
    reject_settings_on_resume(&ckpt.path, &flags, a.dtype, ckpt.dtype)
}

fn fresh_typed<S: Scalar>(
    args: &TrainArgs,
    config: GptConfig,
    data: TextData,
    steps: u64,
) -> CliResult {
    let mut run = GptRun::<S>::new(config, data, make_backend::<S>(args.engine.backend())?)?;
    let mut imported = None;
    if let Some(path) = &args.init_from {
        let vocab = run.data.vocab.clone();
        let got = import::init_from(path, &mut run.model, Some(&vocab))?;
        let notes = match got.notes.is_empty() {
            true => String::new(),
            false => format!(" ({})", got.notes.join("; ")),
        };
        imported = Some(format!(
            "init: {} tensors from {}{notes}",
            got.params,
            path.display()
        ));
    }
    // Every rank of a distributed run takes the same steps; only rank 0 prints and writes files.
    let root = crate::distributed::attach(args, &mut run)?;
    if let (Some(line), true) = (imported, root && !args.quiet) {
        println!("{line}");
    }
    drive(args, run, steps, root)
}

fn resume_typed<S: Scalar>(args: &TrainArgs, ckpt: &GptCheckpoint) -> CliResult {
    let mut run = ckpt.resume::<S>(make_backend::<S>(args.engine.backend())?)?;
    let steps = args.steps.ok_or_else(|| {
        CliError::Usage("--resume needs --steps N: how much further to train".into())
    })?;
    let root = crate::distributed::attach(args, &mut run)?;
    if root && !args.quiet {
        println!("resuming {} at step {}", ckpt.path.display(), run.step);
    }
    drive(args, run, steps, root)
}

fn print_header<S: Scalar>(run: &GptRun<S>, steps: u64, args: &TrainArgs) {
    let c = &run.config;
    println!(
        "tapegrad train gpt: {} ({} parameters), {} lr {}, {}, clip {}, batch {}, {} steps, {}, {} backend, seed {}",
        c.model.name(),
        run.model.params.trainable_count(),
        c.optimizer.name(),
        c.optimizer.lr(),
        c.schedule.describe(),
        c.clip_norm.map_or("off".to_string(), |v| v.to_string()),
        c.batch_size,
        steps,
        S::DTYPE,
        args.engine.backend().name(),
        c.seed
    );
    println!(
        "data: {}; {} characters ({} distinct), {} for training, the last {} held out ({} fixed validation windows)",
        c.text.describe(),
        run.data.train.len() + run.data.val.len(),
        run.data.vocab.len(),
        run.data.train.len(),
        run.data.val.len(),
        c.val_windows
    );
    if c.accumulate > 1 {
        println!(
            "accumulate: {} micro-batches per step, gradients summed in order and scaled once",
            c.accumulate
        );
    }
}
