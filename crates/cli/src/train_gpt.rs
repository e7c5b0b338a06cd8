//! `tapegrad train gpt`: a character-level GPT on the embedded Shakespeare plays (or `--text
//! FILE`), with the preset's sizes and schedule, `--layers --heads --embd --context` to change
//! them, tokens/s in the progress bar, the validation loss on fixed windows, and the same run
//! options as the other presets (log, plot, checkpoints and resume, backend, threads, dtype,
//! anomaly mode, `--accumulate`, `--distributed` under `mpiexec`), and `--init-from` to start
//! from weights saved by PyTorch.

use crate::engine_flags::{by_dtype, reject_settings_on_resume, DTypeArg};
use crate::error::{CliError, CliResult};
use crate::run_output::{self, LossCurves};
use crate::train::TrainArgs;
use std::path::Path;
use std::time::Instant;
use tapegrad_nn::data::text::{TextData, TextSource};
use tapegrad_nn::gpt::checkpoint::{self, GptCheckpoint};
use tapegrad_nn::gpt::import;
use tapegrad_nn::gpt::{GptConfig, GptRun};
use tapegrad_nn::runlog::RunLog;
use tapegrad_nn::summary::Table;
use tapegrad_nn::verify::Verifier;
use tapegrad_nn::{make_backend, ModelSpec, OptimizerConfig};
use tapegrad_tensor::Scalar;

/// The preset's sizes: 4 layers, 4 heads, width 128, context 64, batch 32, 1500 steps.
pub const LAYERS: usize = 4;
pub const HEADS: usize = 4;
pub const EMBD: usize = 128;
pub const CONTEXT: usize = 64;
pub const BATCH: usize = 32;
pub const STEPS: u64 = 1500;
/// The validation loss is evaluated every this many steps by default.
pub const EVAL_EVERY: u64 = 250;

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
    let steps = args.steps.unwrap_or(STEPS);
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
    let context = a.context.unwrap_or(CONTEXT);
    let data = TextData::load(&text, context)?;
    let model = ModelSpec::Gpt {
        vocab: data.vocab.len(),
        context,
        layers: a.layers.unwrap_or(LAYERS),
        heads: a.heads.unwrap_or(HEADS),
        embd: a.embd.unwrap_or(EMBD),
        mlp_ratio: 4,
        dropout: a.dropout.unwrap_or(0.0),
        tie_weights: a.tie_weights,
    };
    if let Some(shape) = model.gpt_shape() {
        shape.validate()?;
    }
    let steps = a.steps.unwrap_or(STEPS);
    let batch = a.batch_size.unwrap_or(BATCH);
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

/// Runs `steps` steps with progress, evaluations, log, summary, checkpoints and plot (the
/// files and the output on rank 0 only: `root`).
fn drive<S: Scalar>(args: &TrainArgs, mut run: GptRun<S>, steps: u64, root: bool) -> CliResult {
    let quiet = args.quiet || !root;
    let eval_every = args.eval_every.unwrap_or(EVAL_EVERY).max(1);
    run.set_detect_anomaly(args.detect_anomaly);
    if let Some(every) = args.verify_every {
        run.set_verify(Some(Verifier::new(every, args.verify_warn)?));
    }
    if !quiet {
        print_header(&run, steps, args);
        run_output::announce_checks(args);
    }
    let before = run.evaluate()?;
    if !quiet {
        println!(
            "before: validation loss {before:.4} nats/char (perplexity {:.2})",
            before.exp()
        );
    }
    let mut log = match &args.log {
        Some(p) if root => Some(RunLog::create(p, "perplexity")?),
        _ => None,
    };
    let start_step = run.step;
    if let Some(log) = &mut log {
        log.record("validation", start_step, 0, before, before.exp(), None, 0.0)?;
    }
    let mut curves = LossCurves::new(start_step, before);
    let bar = run_output::progress_bar(
        steps,
        quiet,
        "{bar:30.cyan/blue} {pos}/{len} steps  {msg}  eta {eta}",
    );
    let started = Instant::now();
    let mut last_val = before;
    let mut tokens = 0usize;
    for i in 0..steps {
        let step = run.train_step();
        if let Some(v) = run.take_verification() {
            if let Some(log) = &mut log {
                log.record_value(&v.to_json())?;
            }
            if args.verify_warn && root {
                for failure in v.checks.iter().filter_map(|c| c.failure.as_ref()) {
                    eprintln!("warning: {failure}");
                }
            }
        }
        let rec = step?;
        tokens += rec.tokens;
        let seconds = started.elapsed().as_secs_f64();
        let tokens_per_s = tokens as f64 / seconds.max(1e-9);
        curves.train.push((rec.step as f64, rec.loss));
        if let Some(log) = &mut log {
            log.record(
                "train",
                rec.step,
                0,
                rec.loss,
                rec.loss.exp(),
                Some(rec.lr),
                seconds,
            )?;
        }
        let is_eval = rec.step % eval_every == 0 || i + 1 == steps;
        if is_eval {
            last_val = run.evaluate()?;
            curves.val.push((rec.step as f64, last_val));
            if let Some(log) = &mut log {
                log.record(
                    "validation",
                    rec.step,
                    0,
                    last_val,
                    last_val.exp(),
                    None,
                    seconds,
                )?;
            }
            if bar.is_none() && !quiet {
                println!(
                    "step {:>6}/{}  loss {:.4}  val loss {:.4}  lr {:.2e}  {:.0} tokens/s  {:.1} s",
                    rec.step,
                    start_step + steps,
                    rec.loss,
                    last_val,
                    rec.lr,
                    tokens_per_s,
                    seconds
                );
            }
        }
        if let Some(bar) = &bar {
            bar.set_message(format!(
                "loss {:.4}  val {last_val:.4}  {tokens_per_s:.0} tokens/s",
                rec.loss
            ));
            bar.inc(1);
            if is_eval {
                bar.println(format!(
                    "step {:>6}  val loss {last_val:.4}  ({seconds:.1} s)",
                    rec.step
                ));
            }
        }
        if let (Some(every), Some(path), true) = (args.save_every, &args.save, root) {
            if rec.step % every == 0 && i + 1 < steps {
                checkpoint::save(path, &run)?;
            }
        }
    }
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let seconds = started.elapsed().as_secs_f64();
    run.finish_exchange();
    if !root {
        return Ok(std::process::ExitCode::SUCCESS);
    }
    if let Some(log) = &mut log {
        log.flush()?;
    }
    let mut table = Table::new(&["", "before", "after"]);
    table.row(vec![
        "validation loss (nats/char)".into(),
        format!("{before:.4}"),
        format!("{last_val:.4}"),
    ]);
    table.row(vec![
        "validation perplexity".into(),
        format!("{:.2}", before.exp()),
        format!("{:.2}", last_val.exp()),
    ]);
    run_output::verify_rows(&mut table, run.verifier());
    if !quiet {
        println!();
    }
    print!("{}", table.render());
    println!(
        "{} steps ({} to {}) in {:.2} s: {:.2} steps/s, {:.0} tokens/s",
        steps,
        start_step,
        run.step,
        seconds,
        steps as f64 / seconds.max(1e-9),
        tokens as f64 / seconds.max(1e-9)
    );
    run_output::print_verify_cost(run.verifier(), seconds);
    if let Some(path) = &args.save {
        checkpoint::save(path, &run)?;
        if !quiet {
            println!("saved checkpoint {} (step {})", path.display(), run.step);
        }
    }
    if let Some(path) = &args.plot {
        let title = format!("gpt: {} (adamw)", run.model.spec.name());
        curves.write_plot(path, &title, "loss (nats/char)", 50)?;
        if !quiet {
            println!("wrote plot {}", path.display());
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}
