//! `Dataset`: a table turned into numbers: a row-major feature matrix, the feature names, and the
//! targets (values for regression, class indices for classification). Columns that are mostly
//! text (such as a car's name) are dropped and listed; a stray non-number in a numeric column is
//! an error naming its line and column.

use super::Table;
use crate::error::{NnError, NnResult};
use serde::{Deserialize, Serialize};

/// Regression (predict a number) or classification (predict a class).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    Regression,
    Classification,
}

/// The targets of a data set.
#[derive(Debug, Clone, PartialEq)]
pub enum Targets {
    /// One value per row.
    Values(Vec<f64>),
    /// One class index per row; `names[i]` is the label text of class `i`.
    Classes {
        labels: Vec<usize>,
        names: Vec<String>,
    },
}

/// A numeric data set.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    pub name: String,
    pub feature_names: Vec<String>,
    /// `rows x feature_names.len()`, row-major.
    pub features: Vec<f64>,
    pub rows: usize,
    pub targets: Targets,
    /// Columns left out because they hold text.
    pub dropped: Vec<String>,
}

fn parse_number(cell: &str) -> Option<f64> {
    let v: f64 = cell.trim().parse().ok()?;
    v.is_finite().then_some(v)
}

impl Dataset {
    /// Builds a data set from `table`, predicting column `target` (a name, a 0-based index or
    /// `last`); every other mostly-numeric column is a feature.
    pub fn from_table(table: &Table, target: &str, task: TaskKind) -> NnResult<Dataset> {
        let target_col = table.column(target)?;
        if table.rows.is_empty() {
            return Err(NnError::data(&table.name, "the table has no data rows"));
        }
        let mut feature_cols = Vec::new();
        let mut dropped = Vec::new();
        for (c, name) in table.header.iter().enumerate() {
            if c == target_col {
                continue;
            }
            let numeric = table
                .rows
                .iter()
                .filter(|r| parse_number(&r[c]).is_some())
                .count();
            if numeric * 2 > table.rows.len() {
                feature_cols.push(c);
            } else {
                dropped.push(name.clone());
            }
        }
        if feature_cols.is_empty() {
            return Err(NnError::data(
                &table.name,
                format!(
                    "no numeric feature columns besides the target '{}'",
                    table.header[target_col]
                ),
            ));
        }
        let features = numeric_matrix(table, &feature_cols)?;
        let targets = match task {
            TaskKind::Regression => {
                let values = numeric_matrix(table, &[target_col])?;
                Targets::Values(values)
            }
            TaskKind::Classification => class_targets(table, target_col)?,
        };
        Ok(Dataset {
            name: table.name.clone(),
            feature_names: feature_cols
                .iter()
                .map(|&c| table.header[c].clone())
                .collect(),
            features,
            rows: table.rows.len(),
            targets,
            dropped,
        })
    }

    /// The columns `names` of `table` as a row-major matrix (for predicting on a new file); a
    /// missing column is an error naming it.
    pub fn features_of(table: &Table, names: &[String]) -> NnResult<Vec<f64>> {
        let cols = names
            .iter()
            .map(|n| {
                table.header.iter().position(|h| h == n).ok_or_else(|| {
                    NnError::data(
                        &table.name,
                        format!(
                            "the model needs column '{n}', which the table lacks (columns: {})",
                            table.header.join(", ")
                        ),
                    )
                })
            })
            .collect::<NnResult<Vec<_>>>()?;
        numeric_matrix(table, &cols)
    }

    /// Number of features per row.
    pub fn width(&self) -> usize {
        self.feature_names.len()
    }
}

fn numeric_matrix(table: &Table, cols: &[usize]) -> NnResult<Vec<f64>> {
    let mut out = Vec::with_capacity(table.rows.len() * cols.len());
    for (r, row) in table.rows.iter().enumerate() {
        for &c in cols {
            let v = parse_number(&row[c]).ok_or_else(|| {
                NnError::data(
                    &table.name,
                    format!(
                        "line {}, column '{}': '{}' is not a finite number",
                        table.lines[r], table.header[c], row[c]
                    ),
                )
            })?;
            out.push(v);
        }
    }
    Ok(out)
}

fn class_targets(table: &Table, col: usize) -> NnResult<Targets> {
    let cells: Vec<String> = table
        .rows
        .iter()
        .map(|r| r[col].trim().to_string())
        .collect();
    let mut names: Vec<String> = cells.clone();
    names.sort();
    names.dedup();
    if names.iter().all(|n| n.parse::<i64>().is_ok()) {
        names.sort_by_key(|n| n.parse::<i64>().unwrap_or(0));
    }
    if names.len() < 2 {
        return Err(NnError::data(
            &table.name,
            format!(
                "classification needs at least 2 classes in column '{}', found {}",
                table.header[col],
                names.len()
            ),
        ));
    }
    let labels = cells
        .iter()
        .map(|c| names.iter().position(|n| n == c).unwrap_or(0))
        .collect();
    Ok(Targets::Classes { labels, names })
}
