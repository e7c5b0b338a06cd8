//! `tapegrad predict --load PATH --csv FILE`: runs a checkpoint's model on the rows of a CSV file
//! (standardised with the statistics saved in the checkpoint) and writes one prediction per row:
//! the value in the target's units for regression, the class and its softmax probability for
//! classification. When the file also has the target column, the metric goes to stderr.

use crate::engine_flags::{by_dtype, EngineFlags};
use crate::error::{CliError, CliResult};
use std::io::Write;
use std::path::PathBuf;
use tapegrad_nn::checkpoint::{self, Checkpoint};
use tapegrad_nn::data::{parse_csv, standardize_rows, Dataset, Task};
use tapegrad_nn::trainer::predict_in_chunks;
use tapegrad_nn::{make_backend, metrics, NnError};
use tapegrad_tensor::Scalar;

/// Arguments of `tapegrad predict`.
#[derive(Debug, clap::Args)]
pub struct PredictArgs {
    /// The checkpoint whose model predicts.
    #[arg(long)]
    pub load: PathBuf,
    /// Rows to predict: a CSV file with the model's feature columns.
    #[arg(long)]
    pub csv: PathBuf,
    /// The file has no header row: its first columns are the features, in the model's order.
    #[arg(long)]
    pub no_header: bool,
    /// Write the predictions here (default: standard output).
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub engine: EngineFlags,
}

/// Runs `tapegrad predict`.
pub fn run(args: PredictArgs) -> CliResult {
    args.engine.apply()?;
    let ckpt = Checkpoint::read(&args.load)?;
    by_dtype!(ckpt.header.dtype, predict_typed(&args, &ckpt))
}

fn predict_typed<S: Scalar>(args: &PredictArgs, ckpt: &Checkpoint) -> CliResult {
    let model = ckpt.inference_model::<S>()?;
    let (features, target) = ckpt.standardizers()?;
    let names = &ckpt.header.feature_names;
    let path = args.csv.display().to_string();
    let text = std::fs::read_to_string(&args.csv).map_err(|e| CliError::Io {
        path: path.clone(),
        source: e,
    })?;
    let mut table = parse_csv(&path, &text, !args.no_header)?;
    if args.no_header {
        if table.header.len() < names.len() {
            return Err(NnError::data(
                &path,
                format!(
                    "the model needs {} feature columns, the file has {}",
                    names.len(),
                    table.header.len()
                ),
            )
            .into());
        }
        for (h, n) in table.header.iter_mut().zip(names) {
            *h = n.clone();
        }
        // One column more than the features: the target, as in the training file.
        if table.header.len() == names.len() + 1 {
            if let Some(t) = ckpt.header.config.data_target_name() {
                table.header[names.len()] = t;
            }
        }
    }
    let matrix = Dataset::features_of(&table, names)?;
    let rows: Vec<usize> = (0..table.rows.len()).collect();
    let x = standardize_rows::<S>(&matrix, &features, &rows)?;
    let mut backend = make_backend::<S>(args.engine.backend())?;
    let out = predict_in_chunks(backend.as_mut(), &model, &x)?;

    let target_name = ckpt.header.config.data_target_name();
    let target_col = target_name.and_then(|t| table.header.iter().position(|h| *h == t));
    let mut text = String::new();
    match &ckpt.header.task {
        Task::Regression => {
            let t = target.unwrap_or_else(|| tapegrad_nn::data::Standardizer {
                mean: vec![0.0],
                std: vec![1.0],
            });
            text.push_str("row,prediction\n");
            let preds: Vec<f64> = out.data().iter().map(|v| t.invert(0, v.to_f64())).collect();
            for (i, p) in preds.iter().enumerate() {
                text.push_str(&format!("{i},{p}\n"));
            }
            if let Some(c) = target_col {
                let truth: Option<Vec<f64>> = table
                    .rows
                    .iter()
                    .map(|r| r[c].trim().parse().ok())
                    .collect();
                if let Some(truth) = truth {
                    eprintln!(
                        "rmse against column '{}': {:.4}",
                        table.header[c],
                        metrics::rmse(&preds, &truth)?
                    );
                }
            }
        }
        Task::Classification { classes } => {
            text.push_str("row,prediction,probability\n");
            let k = classes.len();
            let pred = metrics::argmax_rows(&out)?;
            for (i, &p) in pred.iter().enumerate() {
                let row: Vec<f64> = out.data()[i * k..(i + 1) * k]
                    .iter()
                    .map(|v| v.to_f64())
                    .collect();
                let max = row[p];
                let z: f64 = row.iter().map(|v| (v - max).exp()).sum();
                text.push_str(&format!("{i},{},{:.6}\n", classes[p], 1.0 / z));
            }
            if let Some(c) = target_col {
                let hits = pred
                    .iter()
                    .zip(&table.rows)
                    .filter(|(&p, r)| r[c].trim() == classes[p])
                    .count();
                eprintln!(
                    "accuracy against column '{}': {:.2}%",
                    table.header[c],
                    100.0 * hits as f64 / pred.len().max(1) as f64
                );
            }
        }
    }
    match &args.out {
        Some(p) => checkpoint::write_atomic(p, text.as_bytes())?,
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(text.as_bytes())
                .map_err(|e| CliError::Io {
                    path: "standard output".into(),
                    source: e,
                })?;
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}
