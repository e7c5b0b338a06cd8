//! `RunLog`: the JSON-lines log of a run (`--log PATH`): one object per training step (`split`
//! `"train"`) and one per evaluation (`"validation"`), each with `step`, `loss`, `metric` (its name
//! in `metric_name`) and `seconds` since training started; with `--verify-every`, one per verified
//! step (`"verify"`, see `verify::StepVerification::to_json`).

use crate::error::{NnError, NnResult};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// An open JSON-lines log.
pub struct RunLog {
    path: PathBuf,
    out: BufWriter<std::fs::File>,
    metric_name: &'static str,
}

impl RunLog {
    /// Creates (truncates) the log at `path`.
    pub fn create(path: impl AsRef<Path>, metric_name: &'static str) -> NnResult<Self> {
        let path = path.as_ref().to_path_buf();
        let file = std::fs::File::create(&path).map_err(|e| NnError::io(&path, e))?;
        Ok(RunLog {
            path,
            out: BufWriter::new(file),
            metric_name,
        })
    }

    /// Appends one record.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &mut self,
        split: &str,
        step: u64,
        epoch: u64,
        loss: f64,
        metric: f64,
        lr: Option<f64>,
        seconds: f64,
    ) -> NnResult<()> {
        let mut obj = serde_json::json!({
            "split": split,
            "step": step,
            "epoch": epoch,
            "loss": finite_or_null(loss),
            "metric": finite_or_null(metric),
            "metric_name": self.metric_name,
            "seconds": seconds,
        });
        if let Some(lr) = lr {
            obj["lr"] = serde_json::json!(lr);
        }
        writeln!(self.out, "{obj}").map_err(|e| NnError::io(&self.path, e))
    }

    /// Appends a record made elsewhere (a step's verification, `split` `"verify"`).
    pub fn record_value(&mut self, obj: &serde_json::Value) -> NnResult<()> {
        writeln!(self.out, "{obj}").map_err(|e| NnError::io(&self.path, e))
    }

    /// Flushes buffered records to disk.
    pub fn flush(&mut self) -> NnResult<()> {
        self.out.flush().map_err(|e| NnError::io(&self.path, e))
    }
}

fn finite_or_null(v: f64) -> serde_json::Value {
    if v.is_finite() {
        serde_json::json!(v)
    } else {
        serde_json::Value::Null
    }
}
