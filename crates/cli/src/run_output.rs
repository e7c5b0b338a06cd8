//! What every `tapegrad train` run shows and writes besides its summary: the progress bar (only
//! on a terminal), the loss curves it collects, and the SVG plot drawn from them.

use crate::error::CliError;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::Path;
use tapegrad_nn::plot::{self, Series};

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
