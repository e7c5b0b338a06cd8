//! `Prepared`: a data set split into train and validation rows, standardised with statistics
//! fitted on the training rows only, as tensors of the run's element type; and `Batch`, the
//! gathered rows of one mini-batch. Regression targets are standardised too (fitted on the
//! training rows) so the loss is in units of one standard deviation; metrics map them back.

use super::{split_indices, Dataset, Standardizer, Targets};
use crate::error::{NnError, NnResult};
use serde::{Deserialize, Serialize};
use tapegrad_core::Error;
use tapegrad_tensor::{Scalar, Tensor};

/// What the model predicts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Task {
    /// One number per row.
    Regression,
    /// One of `classes` per row (the model outputs one logit per class).
    Classification { classes: Vec<String> },
}

impl Task {
    /// Number of model outputs.
    pub fn outputs(&self) -> usize {
        match self {
            Task::Regression => 1,
            Task::Classification { classes } => classes.len(),
        }
    }
}

/// Targets of a split.
#[derive(Debug, Clone, PartialEq)]
pub enum SplitTargets<S> {
    /// Standardised values (what the loss sees) and the original values (for metrics).
    Values {
        standardized: Vec<S>,
        raw: Vec<f64>,
    },
    Classes(Vec<usize>),
}

/// One split: standardised features `[rows, width]` and targets.
#[derive(Debug, Clone, PartialEq)]
pub struct Split<S> {
    pub x: Tensor<S>,
    pub y: SplitTargets<S>,
}

impl<S: Scalar> Split<S> {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.x.dims()[0]
    }

    /// True when the split has no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Gathers `rows` into a mini-batch; a row outside the split is an error.
    pub fn batch(&self, rows: &[usize]) -> NnResult<Batch<S>> {
        let &[len, width] = self.x.dims() else {
            return Err(Error::invalid(
                "batch",
                format!(
                    "split features must be [rows, width], found {}",
                    self.x.shape()
                ),
            )
            .into());
        };
        if let Some(&r) = rows.iter().find(|&&r| r >= len) {
            return Err(Error::from(tapegrad_core::OpError::Index {
                op: "batch",
                what: "row",
                index: i64::try_from(r).unwrap_or(i64::MAX),
                bound: len,
            })
            .into());
        }
        let data = self.x.data();
        let mut x = Vec::with_capacity(rows.len() * width);
        for &r in rows {
            x.extend_from_slice(&data[r * width..(r + 1) * width]);
        }
        let x = Tensor::new(&[rows.len(), width], x)?;
        let y = match &self.y {
            SplitTargets::Values { standardized, .. } => {
                BatchTargets::Values(Tensor::new(&[rows.len(), 1], pick(standardized, rows)?)?)
            }
            SplitTargets::Classes(labels) => BatchTargets::Classes(pick(labels, rows)?),
        };
        Ok(Batch { x, y })
    }
}

/// `values[r]` for each row; the fields of a split are public, so the targets may be shorter.
fn pick<T: Copy>(values: &[T], rows: &[usize]) -> NnResult<Vec<T>> {
    rows.iter()
        .map(|&r| {
            values.get(r).copied().ok_or_else(|| {
                Error::invalid(
                    "batch",
                    format!(
                        "row {r} has no target (the split has {} targets)",
                        values.len()
                    ),
                )
                .into()
            })
        })
        .collect()
}

/// The targets of a mini-batch.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchTargets<S> {
    /// Standardised values, shape `[batch, 1]`.
    Values(Tensor<S>),
    Classes(Vec<usize>),
}

/// One mini-batch: features `[batch, width]` and targets.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch<S> {
    pub x: Tensor<S>,
    pub y: BatchTargets<S>,
}

/// A data set ready for training.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared<S> {
    pub name: String,
    pub feature_names: Vec<String>,
    pub task: Task,
    /// Feature statistics, fitted on the training rows.
    pub features: Standardizer,
    /// Target statistics for regression (one column), fitted on the training rows.
    pub target: Option<Standardizer>,
    pub train: Split<S>,
    pub val: Split<S>,
}

impl<S: Scalar> Prepared<S> {
    /// Splits `data` with the run's seed (`val_fraction` of the rows for validation) and
    /// standardises it with statistics of the training rows.
    pub fn new(data: &Dataset, val_fraction: f64, seed: u64) -> NnResult<Self> {
        let (train_rows, val_rows) = split_indices(data.rows, val_fraction, seed)?;
        if train_rows.is_empty() {
            return Err(NnError::data(&data.name, "no rows left for training"));
        }
        let width = data.width();
        let features = Standardizer::fit(&data.features, width, &train_rows);
        let (task, target) = match &data.targets {
            Targets::Values(v) => (Task::Regression, Some(Standardizer::fit(v, 1, &train_rows))),
            Targets::Classes { names, .. } => (
                Task::Classification {
                    classes: names.clone(),
                },
                None,
            ),
        };
        let prepared = Prepared {
            name: data.name.clone(),
            feature_names: data.feature_names.clone(),
            train: Self::split(data, &features, target.as_ref(), &train_rows)?,
            val: Self::split(data, &features, target.as_ref(), &val_rows)?,
            task,
            features,
            target,
        };
        Ok(prepared)
    }

    fn split(
        data: &Dataset,
        features: &Standardizer,
        target: Option<&Standardizer>,
        rows: &[usize],
    ) -> NnResult<Split<S>> {
        let x = standardize_rows(&data.features, features, rows)?;
        let y = match &data.targets {
            Targets::Values(v) => {
                let t = target.expect("regression data has target statistics");
                let raw: Vec<f64> = rows.iter().map(|&r| v[r]).collect();
                SplitTargets::Values {
                    standardized: raw
                        .iter()
                        .map(|&y| S::from_f64((y - t.mean[0]) / t.std[0]))
                        .collect(),
                    raw,
                }
            }
            Targets::Classes { labels, .. } => {
                SplitTargets::Classes(rows.iter().map(|&r| labels[r]).collect())
            }
        };
        Ok(Split { x, y })
    }
}

/// Standardises rows `rows` of the row-major matrix `data` into a `[rows, width]` tensor.
pub fn standardize_rows<S: Scalar>(
    data: &[f64],
    stats: &Standardizer,
    rows: &[usize],
) -> NnResult<Tensor<S>> {
    let width = stats.width();
    let mut out = Vec::with_capacity(rows.len() * width);
    let mut row = vec![0.0; width];
    for &r in rows {
        row.copy_from_slice(&data[r * width..(r + 1) * width]);
        stats.apply_row(&mut row);
        out.extend(row.iter().map(|&v| S::from_f64(v)));
    }
    Ok(Tensor::new(&[rows.len(), width], out)?)
}
