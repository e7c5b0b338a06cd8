//! Metrics computed in f64 from model outputs: mean cross entropy and accuracy for
//! classification, mean squared error (standardised units) and RMSE (original units) for
//! regression.

use tapegrad_core::{Error, Result};
use tapegrad_tensor::{Scalar, Tensor};

/// Index of the largest logit of each row of a `[rows, classes]` tensor (first on ties).
pub fn argmax_rows<S: Scalar>(logits: &Tensor<S>) -> Result<Vec<usize>> {
    let (rows, classes) = rows_cols(logits, "argmax")?;
    let d = logits.data();
    Ok((0..rows)
        .map(|r| {
            let row = &d[r * classes..(r + 1) * classes];
            let mut best = 0;
            for (i, v) in row.iter().enumerate() {
                if *v > row[best] {
                    best = i;
                }
            }
            best
        })
        .collect())
}

/// Fraction of rows whose largest logit is the label.
pub fn accuracy<S: Scalar>(logits: &Tensor<S>, labels: &[usize]) -> Result<f64> {
    let pred = argmax_rows(logits)?;
    check_len("accuracy", pred.len(), labels.len())?;
    let hits = pred.iter().zip(labels).filter(|(p, l)| p == l).count();
    Ok(hits as f64 / labels.len().max(1) as f64)
}

/// Mean cross entropy of logits against labels (log-sum-exp with the row maximum subtracted).
pub fn cross_entropy<S: Scalar>(logits: &Tensor<S>, labels: &[usize]) -> Result<f64> {
    let (rows, classes) = rows_cols(logits, "cross_entropy")?;
    check_len("cross_entropy", rows, labels.len())?;
    let d = logits.data();
    let mut total = 0.0;
    for (r, &label) in labels.iter().enumerate() {
        if label >= classes {
            return Err(Error::from(tapegrad_core::OpError::Index {
                op: "cross_entropy",
                what: "class label",
                index: label as i64,
                bound: classes,
            }));
        }
        let row: Vec<f64> = d[r * classes..(r + 1) * classes]
            .iter()
            .map(|v| v.to_f64())
            .collect();
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
        total += lse - row[label];
    }
    Ok(total / rows.max(1) as f64)
}

/// Mean of squared differences.
pub fn mse(pred: &[f64], target: &[f64]) -> Result<f64> {
    check_len("mse", pred.len(), target.len())?;
    let s: f64 = pred
        .iter()
        .zip(target)
        .map(|(p, t)| (p - t) * (p - t))
        .sum();
    Ok(s / pred.len().max(1) as f64)
}

/// Root of the mean squared difference.
pub fn rmse(pred: &[f64], target: &[f64]) -> Result<f64> {
    Ok(mse(pred, target)?.sqrt())
}

fn rows_cols<S: Scalar>(t: &Tensor<S>, op: &'static str) -> Result<(usize, usize)> {
    match t.dims() {
        [r, c] => Ok((*r, *c)),
        _ => Err(Error::invalid(
            op,
            format!(
                "expected logits of shape [rows, classes], found {}",
                t.shape()
            ),
        )),
    }
}

fn check_len(op: &'static str, a: usize, b: usize) -> Result<()> {
    if a != b {
        return Err(Error::invalid(
            op,
            format!("{a} predictions but {b} targets"),
        ));
    }
    Ok(())
}
