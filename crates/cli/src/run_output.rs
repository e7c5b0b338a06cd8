//! What every `tapegrad train` run shows and writes beside its own figures: the checks it
//! announces, the progress bar (only on a terminal), the verifier's summary, the loss curves it
//! collects and the SVG plot drawn from them.

use crate::error::CliError;
use crate::train::TrainOptions;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::Path;
use std::time::Instant;
use tapegrad_nn::plot::{self, Series};
use tapegrad_nn::runlog::RunLog;
use tapegrad_nn::summary::Table;
use tapegrad_nn::verify::{StepVerification, Verifier};
use tapegrad_nn::BackendKind;

/// The lines that say which checks run beside the training: anomaly mode and `--verify-every`.
pub(crate) fn announce_checks(args: &TrainOptions) {
    if args.detect_anomaly {
        println!("anomaly mode: the first NaN or infinity stops the run and names its node");
    }
    if let Some(every) = args.verify_every {
        let laws = match args.engine.backend() {
            BackendKind::Compiled => "1, 4, 5, 6 and 7",
            BackendKind::Eager => "1, 5, 6 and 7",
        };
        println!("verify: laws {laws} are checked on every {every}th step");
    }
}

/// The verifier's rows of the summary table: checks passed and the worst relative error.
pub(crate) fn verify_rows(table: &mut Table, verifier: Option<&Verifier>) {
    if let Some(v) = verifier {
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
}

/// What the verification cost, against the `seconds` the whole run took.
pub(crate) fn print_verify_cost(verifier: Option<&Verifier>, seconds: f64) {
    if let Some(v) = verifier {
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
}

/// A verified step's results: a line of the log and, with `--verify-warn` (`warn`), each failed
/// check on stderr.
pub(crate) fn record_verification(
    log: Option<&mut RunLog>,
    verification: &StepVerification,
    warn: bool,
) -> Result<(), CliError> {
    if let Some(log) = log {
        log.record_value(&verification.to_json())?;
    }
    if warn {
        for failure in verification
            .checks
            .iter()
            .filter_map(|c| c.failure.as_ref())
        {
            eprintln!("warning: {failure}");
        }
    }
    Ok(())
}

/// The end of a run's steps: clears the bar and flushes the log; the seconds since `started`.
pub(crate) fn finish_steps(
    bar: Option<&ProgressBar>,
    log: Option<&mut RunLog>,
    started: Instant,
) -> Result<f64, CliError> {
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let seconds = started.elapsed().as_secs_f64();
    if let Some(log) = log {
        log.flush()?;
    }
    Ok(seconds)
}

/// A progress bar of `steps` steps when stderr is a terminal and the run is not quiet; `{msg}`
/// in `template` is the run's own line (loss, metric), `{steps_per_s}` the rate in steps.
pub(crate) fn progress_bar(steps: u64, quiet: bool, template: &str) -> Option<ProgressBar> {
    (!quiet && std::io::stderr().is_terminal()).then(|| {
        let style = ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .with_key(
                "steps_per_s",
                |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = write!(w, "{:.0} steps/s", state.per_sec());
                },
            );
        let bar = ProgressBar::new(steps);
        bar.set_style(style);
        bar
    })
}

/// The training loss of every step and the validation loss of every evaluation, by step.
pub(crate) struct LossCurves {
    pub train: Vec<(f64, f64)>,
    pub val: Vec<(f64, f64)>,
}

impl LossCurves {
    /// Curves that start with the validation loss before the first step.
    pub fn new(start_step: u64, val_loss: f64) -> LossCurves {
        LossCurves {
            train: Vec::new(),
            val: vec![(start_step as f64, val_loss)],
        }
    }

    /// Writes the curves as an SVG chart: each step's training loss, its moving mean over
    /// `window` steps, and the validation loss.
    pub fn write_plot(
        &self,
        path: &Path,
        title: &str,
        y_label: &str,
        window: usize,
    ) -> Result<(), CliError> {
        let series = vec![
            Series {
                name: "train loss (per step)".into(),
                color: "#9ecae1".into(),
                points: self.train.clone(),
                width: 1.0,
            },
            Series {
                name: format!("train loss (mean of {window})"),
                color: "#08519c".into(),
                points: plot::moving_average(&self.train, window),
                width: 2.0,
            },
            Series {
                name: "validation loss".into(),
                color: "#d94801".into(),
                points: self.val.clone(),
                width: 2.0,
            },
        ];
        let svg = plot::svg(title, "step", y_label, &series);
        std::fs::write(path, svg).map_err(|e| CliError::Io {
            path: path.display().to_string(),
            source: e,
        })
    }
}
