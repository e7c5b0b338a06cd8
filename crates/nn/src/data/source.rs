//! `DataSource`: where a run's table comes from (an embedded set or a user's CSV file) and which
//! column it predicts; serialisable so a checkpoint can reload the same data on resume.

use super::{embedded, parse_csv, Dataset, TaskKind};
use crate::error::{NnError, NnResult};
use serde::{Deserialize, Serialize};

/// The table of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DataSource {
    /// The embedded digits table: 64 pixels, 10 classes.
    Digits,
    /// The embedded Auto MPG table: 7 numeric features, predict `mpg`.
    AutoMpg,
    /// A user's CSV file with a header, predicting column `target`.
    Csv {
        path: String,
        target: String,
        task: TaskKind,
    },
}

impl DataSource {
    /// Reads the table and builds the data set.
    pub fn load(&self) -> NnResult<Dataset> {
        match self {
            DataSource::Digits => {
                Dataset::from_table(&embedded::digits()?, "label", TaskKind::Classification)
            }
            DataSource::AutoMpg => {
                Dataset::from_table(&embedded::auto_mpg()?, "mpg", TaskKind::Regression)
            }
            DataSource::Csv { path, target, task } => {
                let text = std::fs::read_to_string(path).map_err(|e| NnError::io(path, e))?;
                Dataset::from_table(&parse_csv(path, &text, true)?, target, *task)
            }
        }
    }

    /// A short description for the run header.
    pub fn describe(&self) -> String {
        match self {
            DataSource::Digits => "digits (embedded, 1797 8x8 images, 10 classes)".into(),
            DataSource::AutoMpg => "auto-mpg (embedded, 392 cars, target mpg)".into(),
            DataSource::Csv { path, target, task } => {
                let task = match task {
                    TaskKind::Regression => "regression",
                    TaskKind::Classification => "classification",
                };
                format!("{path} (target {target}, {task})")
            }
        }
    }
}
