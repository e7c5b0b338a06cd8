//! Per-op law checks in f64: the VJP against central finite differences of `<seed, f(x)>` (law 6)
//! and the JVP against the VJP through `<jvp(x, dx), s> = <dx, vjp(x, s)>` (law 5).

use crate::ops::{Op, Saved};
use crate::Result;
use tapegrad_tensor::Tensor;

/// Tolerances of a check: an element passes when `|got - want| <= abs + rel * |want|`.
#[derive(Debug, Clone, Copy)]
pub struct Tolerance {
    pub abs: f64,
    pub rel: f64,
}

impl Default for Tolerance {
    fn default() -> Self {
        Tolerance {
            abs: 1e-6,
            rel: 1e-5,
        }
    }
}

/// Outcome of checking one op at one point.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckReport {
    /// Largest |vjp - finite difference| over all checked elements.
    pub max_abs_err: f64,
    /// Largest relative error |vjp - fd| / max(|fd|, 1e-12) over checked elements.
    pub max_rel_err: f64,
    /// Relative error of the adjoint identity `<jvp(dx), s>` versus `<dx, vjp(s)>`.
    pub adjoint_rel_err: f64,
    /// Whether every element and the adjoint identity are within tolerance.
    pub passed: bool,
}

/// The VJP of `op` at `inputs` applied to `seed`, one gradient per argument (all needed).
pub fn op_vjp(op: &Op, inputs: &[&Tensor<f64>], seed: &Tensor<f64>) -> Result<Vec<Tensor<f64>>> {
    let fwd = op.forward(inputs)?;
    let saved = Saved::keep(op.saves(), inputs, &fwd, vec![true; inputs.len()]);
    let grads = op.vjp(&saved.context(), seed)?;
    Ok(grads
        .into_iter()
        .zip(inputs)
        .map(|(g, x)| g.unwrap_or_else(|| Tensor::zeros(x.shape())))
        .collect())
}

fn dot(a: &Tensor<f64>, b: &Tensor<f64>) -> f64 {
    a.data().iter().zip(b.data()).map(|(x, y)| x * y).sum()
}

/// Checks `op`'s VJP against central differences (step `h`) and its JVP against its VJP, at
/// `inputs`, with output cotangent `seed` and input tangents `tangents`.
pub fn check_op(
    op: &Op,
    inputs: &[Tensor<f64>],
    seed: &Tensor<f64>,
    tangents: &[Tensor<f64>],
    h: f64,
    tol: Tolerance,
) -> Result<CheckReport> {
    let refs: Vec<&Tensor<f64>> = inputs.iter().collect();
    let grads = op_vjp(op, &refs, seed)?;
    let objective = |xs: &[&Tensor<f64>]| -> Result<f64> { Ok(dot(&op.forward(xs)?.value, seed)) };
    let (mut max_abs, mut max_rel, mut passed) = (0.0f64, 0.0f64, true);
    for (i, x) in inputs.iter().enumerate() {
        for j in 0..x.numel() {
            let mut plus = x.clone();
            plus.data_mut()[j] += h;
            let mut minus = x.clone();
            minus.data_mut()[j] -= h;
            let mut args = refs.clone();
            args[i] = &plus;
            let fp = objective(&args)?;
            args[i] = &minus;
            let fm = objective(&args)?;
            let fd = (fp - fm) / (2.0 * h);
            let got = grads[i].data()[j];
            let err = (got - fd).abs();
            if err.is_nan() || err > tol.abs + tol.rel * fd.abs() {
                passed = false;
            }
            max_abs = max_abs.max(if err.is_nan() { f64::INFINITY } else { err });
            max_rel = max_rel.max(err / fd.abs().max(1e-12));
        }
    }
    let fwd = op.forward(&refs)?;
    let trefs: Vec<&Tensor<f64>> = tangents.iter().collect();
    let jvp = op.jvp(&refs, &fwd, &trefs)?;
    let lhs = dot(&jvp, seed);
    let rhs: f64 = grads.iter().zip(tangents).map(|(g, t)| dot(g, t)).sum();
    let scale = lhs.abs().max(rhs.abs()).max(1.0);
    let adjoint_rel_err = (lhs - rhs).abs() / scale;
    if adjoint_rel_err.is_nan() || adjoint_rel_err > 1e-9 {
        passed = false;
    }
    Ok(CheckReport {
        max_abs_err: max_abs,
        max_rel_err: max_rel,
        adjoint_rel_err,
        passed,
    })
}
