//! The loop of `tapegrad train gpt`: the steps with their verification, log lines, evaluations,
//! progress bar (tokens/s) and periodic checkpoints, then the summary table, the final
//! checkpoint and the plot. Output and files come from rank 0 only.

use crate::error::{CliError, CliResult};
use crate::run_output::{self, LossCurves};
use crate::train::TrainArgs;
use indicatif::ProgressBar;
use std::process::ExitCode;
use std::time::Instant;
use tapegrad_nn::gpt::checkpoint;
use tapegrad_nn::gpt::{GptPreset, GptRun};
use tapegrad_nn::runlog::RunLog;
use tapegrad_nn::summary::Table;
use tapegrad_nn::verify::Verifier;
use tapegrad_tensor::Scalar;

/// Runs `steps` steps with progress, evaluations, log, summary, checkpoints and plot (the
/// files and the output on rank 0 only: `root`).
pub(super) fn drive<S: Scalar>(
    args: &TrainArgs,
    mut run: GptRun<S>,
    steps: u64,
    root: bool,
) -> CliResult {
    let quiet = args.quiet || !root;
    run.set_detect_anomaly(args.detect_anomaly);
    if let Some(every) = args.verify_every {
        run.set_verify(Some(Verifier::new(every, args.verify_warn)?));
    }
    if !quiet {
        super::print_header(&run, steps, args);
        run_output::announce_checks(args);
    }
    let before = run.evaluate()?;
    if !quiet {
        println!(
            "before: validation loss {before:.4} nats/char (perplexity {:.2})",
            before.exp()
        );
    }
    let mut progress = Progress::start(args, run.step, steps, root, before)?;
    for i in 0..steps {
        progress.step(args, &mut run, i)?;
    }
    let seconds = progress.finish()?;
    run.finish_exchange();
    if !root {
        return Ok(ExitCode::SUCCESS);
    }
    print_summary(&run, &progress, before, seconds, quiet);
    write_files(args, &run, &progress.curves, quiet)?;
    Ok(ExitCode::SUCCESS)
}

/// The state of a run between steps: what it shows, logs and plots.
struct Progress {
    eval_every: u64,
    start_step: u64,
    steps: u64,
    tokens: usize,
    last_val: f64,
    started: Instant,
    quiet: bool,
    root: bool,
    log: Option<RunLog>,
    curves: LossCurves,
    bar: Option<ProgressBar>,
}

impl Progress {
    /// Opens the log (rank 0 only) with the evaluation `before` the first step, and the bar.
    fn start(
        args: &TrainArgs,
        start_step: u64,
        steps: u64,
        root: bool,
        before: f64,
    ) -> Result<Progress, CliError> {
        let mut log = match &args.log {
            Some(p) if root => Some(RunLog::create(p, "perplexity")?),
            _ => None,
        };
        if let Some(log) = &mut log {
            log.record("validation", start_step, 0, before, before.exp(), None, 0.0)?;
        }
        let quiet = args.quiet || !root;
        let bar = run_output::progress_bar(
            steps,
            quiet,
            "{bar:30.cyan/blue} {pos}/{len} steps  {msg}  eta {eta}",
        );
        Ok(Progress {
            eval_every: args
                .eval_every
                .unwrap_or(GptPreset::SHAKESPEARE.eval_every)
                .max(1),
            start_step,
            steps,
            tokens: 0,
            last_val: before,
            started: Instant::now(),
            quiet,
            root,
            log,
            curves: LossCurves::new(start_step, before),
            bar,
        })
    }

    /// Step `i` of the run: the step itself, its verification, the log, the evaluation when
    /// one is due, the display and the periodic checkpoint.
    fn step<S: Scalar>(
        &mut self,
        args: &TrainArgs,
        run: &mut GptRun<S>,
        i: u64,
    ) -> Result<(), CliError> {
        let step = run.train_step();
        if let Some(v) = run.take_verification() {
            let warn = args.verify_warn && self.root;
            run_output::record_verification(self.log.as_mut(), &v, warn)?;
        }
        let rec = step?;
        self.tokens += rec.tokens;
        let seconds = self.started.elapsed().as_secs_f64();
        let tokens_per_s = self.tokens as f64 / seconds.max(1e-9);
        self.curves.train.push((rec.step as f64, rec.loss));
        if let Some(log) = &mut self.log {
            let (loss, lr) = (rec.loss, Some(rec.lr));
            log.record("train", rec.step, 0, loss, loss.exp(), lr, seconds)?;
        }
        let is_eval = rec.step % self.eval_every == 0 || i + 1 == self.steps;
        if is_eval {
            self.evaluate(run, rec.step, seconds)?;
            if self.bar.is_none() && !self.quiet {
                println!(
                    "step {:>6}/{}  loss {:.4}  val loss {:.4}  lr {:.2e}  {:.0} tokens/s  {:.1} s",
                    rec.step,
                    self.start_step + self.steps,
                    rec.loss,
                    self.last_val,
                    rec.lr,
                    tokens_per_s,
                    seconds
                );
            }
        }
        if let Some(bar) = &self.bar {
            let last_val = self.last_val;
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
        if let (Some(every), Some(path), true) = (args.save_every, &args.save, self.root) {
            if rec.step % every == 0 && i + 1 < self.steps {
                checkpoint::save(path, run)?;
            }
        }
        Ok(())
    }

    /// The validation loss after `step`, into the curves and the log.
    fn evaluate<S: Scalar>(
        &mut self,
        run: &mut GptRun<S>,
        step: u64,
        seconds: f64,
    ) -> Result<(), CliError> {
        self.last_val = run.evaluate()?;
        self.curves.val.push((step as f64, self.last_val));
        if let Some(log) = &mut self.log {
            let loss = self.last_val;
            log.record("validation", step, 0, loss, loss.exp(), None, seconds)?;
        }
        Ok(())
    }

    /// Clears the bar and flushes the log; the seconds the steps took.
    fn finish(&mut self) -> Result<f64, CliError> {
        run_output::finish_steps(self.bar.as_ref(), self.log.as_mut(), self.started)
    }
}

/// The table of the validation loss and perplexity before and after, the verifier's rows, and
/// the speed of the steps.
fn print_summary<S: Scalar>(
    run: &GptRun<S>,
    progress: &Progress,
    before: f64,
    seconds: f64,
    quiet: bool,
) {
    let after = progress.last_val;
    let mut table = Table::new(&["", "before", "after"]);
    table.row(vec![
        "validation loss (nats/char)".into(),
        format!("{before:.4}"),
        format!("{after:.4}"),
    ]);
    table.row(vec![
        "validation perplexity".into(),
        format!("{:.2}", before.exp()),
        format!("{:.2}", after.exp()),
    ]);
    run_output::verify_rows(&mut table, run.verifier());
    if !quiet {
        println!();
    }
    print!("{}", table.render());
    let (steps, tokens) = (progress.steps, progress.tokens);
    println!(
        "{} steps ({} to {}) in {:.2} s: {:.2} steps/s, {:.0} tokens/s",
        steps,
        progress.start_step,
        run.step,
        seconds,
        steps as f64 / seconds.max(1e-9),
        tokens as f64 / seconds.max(1e-9)
    );
    run_output::print_verify_cost(run.verifier(), seconds);
}

/// The final checkpoint (`--save`) and the loss plot (`--plot`).
fn write_files<S: Scalar>(
    args: &TrainArgs,
    run: &GptRun<S>,
    curves: &LossCurves,
    quiet: bool,
) -> Result<(), CliError> {
    if let Some(path) = &args.save {
        checkpoint::save(path, run)?;
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
    Ok(())
}
