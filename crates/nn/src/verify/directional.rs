//! Laws 5 and 6 on the whole loss along one seeded random direction `v` over the trainable
//! parameters: forward mode through the recorded graph (the JVP of the loss along `v`) equals
//! `<grad, v>` to rounding, and a central finite difference of the loss along `v`, recomputed in
//! f64, equals it to a tolerance derived from the step. See `Directional` for the tolerances.

use super::failure::{Law, VerifyFailure};
use super::locate::locate_adjoint;
use super::{Recorded, TapeGraph};
use crate::error::NnResult;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tapegrad_tensor::{DType, Scalar, Tensor};

/// The step of the central differences along the unit direction.
pub const FD_STEP: f64 = 1e-5;

/// Roundings allowed per node and unit of the terms' size (see `Directional::tol_adjoint`).
pub const ROUNDING: f64 = 16.0;

/// What the directional check measured. Errors are relative to `scale` = `sum |g_i| |v_i|`, the
/// size of the terms of `<grad, v>`.
#[derive(Debug, Clone, PartialEq)]
pub struct Directional {
    /// The JVP of the loss along `v` in the training dtype.
    pub jvp: f64,
    /// `<grad, v>` (the gradient in the training dtype, summed in f64).
    pub dot: f64,
    /// `sum |g_i| |v_i|`.
    pub scale: f64,
    /// `(f(h) - f(-h)) / 2h` in f64.
    pub fd: f64,
    /// Allowed `|jvp - dot|`: `ROUNDING eps (k scale + output terms)` for `k` nodes and the
    /// dtype's `eps` (the output terms: see `output_terms`).
    pub tol_adjoint: f64,
    /// Allowed `|fd - dot|`: `tol_adjoint` (the gradient's rounding), Richardson's estimate of
    /// the truncation `|fd(2h) - fd(h)|`, the curvature `|f(h) - 2 f(0) + f(-h)| / h` (which
    /// covers a kink such as relu's within `h`), and `8 k eps64 max|f| / h` for the rounding of
    /// `f` in f64.
    pub tol_derivative: f64,
}

impl Directional {
    /// `|jvp - dot| / scale`.
    pub fn adjoint_error(&self) -> f64 {
        (self.jvp - self.dot).abs() / self.scale
    }

    /// `|fd - dot| / scale`.
    pub fn derivative_error(&self) -> f64 {
        (self.fd - self.dot).abs() / self.scale
    }

    /// Law 5, then law 6 (none names a node: see `check`).
    fn verdict(&self) -> Option<(Law, String)> {
        let close = |d: f64, tol: f64| d.is_finite() && d <= tol;
        if !close((self.jvp - self.dot).abs(), self.tol_adjoint) {
            return Some((
                Law::Adjoint,
                format!(
                    "along a random direction v the jvp of the loss is {:e} but <grad, v> is {:e} (relative error {:.2e}, tolerance {:.2e})",
                    self.jvp,
                    self.dot,
                    self.adjoint_error(),
                    self.tol_adjoint / self.scale
                ),
            ));
        }
        if !close((self.fd - self.dot).abs(), self.tol_derivative) {
            return Some((
                Law::Derivative,
                format!(
                    "along a random direction v the central difference of the loss (f64, h = {FD_STEP:e}) is {:e} but <grad, v> is {:e} (relative error {:.2e}, tolerance {:.2e})",
                    self.fd,
                    self.dot,
                    self.derivative_error(),
                    self.tol_derivative / self.scale
                ),
            ));
        }
        None
    }
}

/// Laws 5 and 6 for `rec` (as the graph `tg`) with `executed`, the executed sweep's slots (the
/// gradients), along a direction drawn from `rng`. `Ok(Err(..))` is a law that failed, with
/// the node whose own JVP and VJP disagree, when one does.
pub fn directional<S: Scalar>(
    rec: &Recorded<S>,
    tg: &TapeGraph<S>,
    executed: &[Tensor<S>],
    rng: &mut ChaCha8Rng,
) -> NnResult<(Directional, Result<(), VerifyFailure>)> {
    let n_in = tg.inputs.len();
    let trainable: Vec<bool> = tg.tape_ids[..n_in]
        .iter()
        .map(|id| rec.params.iter().any(|(_, p)| p == id))
        .collect();
    // The direction: uniform entries scaled to unit norm, rounded to the dtype; the rounded
    // values are the direction every computation below uses.
    let mut raw: Vec<Vec<f64>> = Vec::with_capacity(n_in);
    for (x, &t) in tg.inputs.iter().zip(&trainable) {
        let n = if t { x.numel() } else { 0 };
        raw.push((0..n).map(|_| rng.random_range(-1.0..1.0)).collect());
    }
    let norm = raw.iter().flatten().map(|v| v * v).sum::<f64>().sqrt();
    let norm = if norm > 0.0 { norm } else { 1.0 };
    let tangents: Vec<Tensor<S>> = tg
        .inputs
        .iter()
        .zip(&raw)
        .map(|(x, r)| match r.is_empty() {
            true => Ok(Tensor::zeros(x.shape())),
            false => Tensor::from_shape(
                x.shape().clone(),
                r.iter().map(|v| S::from_f64(v / norm)).collect(),
            ),
        })
        .collect::<tapegrad_tensor::Result<_>>()?;
    let (mut dot, mut scale) = (0.0, 0.0);
    for (slot, v) in tangents.iter().enumerate().filter(|&(s, _)| trainable[s]) {
        let g = &executed[tg.tape_ids[slot]];
        for (&gi, &vi) in g.data().iter().zip(v.data()) {
            dot += gi.to_f64() * vi.to_f64();
            scale += (gi.to_f64() * vi.to_f64()).abs();
        }
    }
    let scale = scale.max(f64::MIN_POSITIVE);
    let dots = tg.graph.jvp(&tg.inputs, &tangents)?;
    let jvp = last_value(&dots)?;
    // Rounding grows with the number of roundings in a chain (about the node count `k`) and
    // with the size of the terms summed: those of `<grad, v>`, and those at the model's output
    // (`output_terms`, the larger when the loss's slope cancels late in training).
    let out_slot = tg.slot(rec.output);
    let k = tg.graph.nodes().len() as f64;
    let cross_entropy = rec.tape().nodes()[rec.loss].op_name() == "cross_entropy";
    let out_terms = match out_slot {
        Some(slot) => output_terms(
            rec.tape().value(rec.output)?,
            &executed[rec.output],
            &dots[slot],
            cross_entropy,
            k,
        ),
        None => 0.0,
    };
    let tol_adjoint = ROUNDING * epsilon::<S>() * (k * scale + out_terms);
    // f64 re-evaluation along the same direction.
    let x64: Vec<Tensor<f64>> = tg.inputs.iter().map(|x| x.cast()).collect();
    let v64: Vec<Tensor<f64>> = tangents.iter().map(|v| v.cast()).collect();
    let f = |t: f64| -> NnResult<f64> {
        let moved: Vec<Tensor<f64>> = x64
            .iter()
            .zip(&v64)
            .zip(&trainable)
            .map(|((x, v), &tr)| match tr {
                false => Ok(x.clone()),
                true => Tensor::from_shape(
                    x.shape().clone(),
                    x.data()
                        .iter()
                        .zip(v.data())
                        .map(|(a, b)| a + t * b)
                        .collect(),
                ),
            })
            .collect::<tapegrad_tensor::Result<_>>()?;
        last_value(&tg.graph.eval(&moved)?)
    };
    let h = FD_STEP;
    let (f0, fp, fm, fp2, fm2) = (f(0.0)?, f(h)?, f(-h)?, f(2.0 * h)?, f(-2.0 * h)?);
    let fd = (fp - fm) / (2.0 * h);
    let fd2 = (fp2 - fm2) / (4.0 * h);
    let fmax = [f0, fp, fm, fp2, fm2]
        .iter()
        .fold(0.0f64, |m, v| m.max(v.abs()));
    let tol_derivative = tol_adjoint
        + (fd2 - fd).abs()
        + (fp - 2.0 * f0 + fm).abs() / h
        + 8.0 * k * f64::EPSILON * fmax / h;
    let d = Directional {
        jvp,
        dot,
        scale,
        fd,
        tol_adjoint,
        tol_derivative,
    };
    let verdict = match d.verdict() {
        None => Ok(()),
        Some((law, message)) => {
            let node = locate_adjoint(rec, tg)?;
            Err(VerifyFailure::new(law, node, message))
        }
    };
    Ok((d, verdict))
}

/// The rounding terms at the model's output `out` (cotangent `c`, tangent `t`) for `k` nodes:
/// `sum_j |t_j| (k |c_j| + q)`. `c_j` is a difference of terms of size up to `q` per element
/// (cross entropy's `p_j / rows` and `y_j / rows`: `q = 2 / rows`; otherwise, as mean squared
/// error's `2 (out_j - y_j) / rows`, `q = 4 max(1, max |out|) / rows`), computed once, so
/// its rounding (up to `eps q` each) meets the tangent once: when the model fits the batch `c`
/// is small but still carries it.
fn output_terms<S: Scalar>(
    out: &Tensor<S>,
    c: &Tensor<S>,
    t: &Tensor<S>,
    cross_entropy: bool,
    k: f64,
) -> f64 {
    let rows = out.dims().first().copied().unwrap_or(1).max(1) as f64;
    let q = match cross_entropy {
        true => 2.0 / rows,
        false => {
            4.0 * out
                .data()
                .iter()
                .fold(1.0f64, |m, v| m.max(v.to_f64().abs()))
                / rows
        }
    };
    c.data()
        .iter()
        .zip(t.data())
        .map(|(c, t)| t.to_f64().abs() * (k * c.to_f64().abs() + q))
        .sum()
}

/// The last slot's single value, as f64.
fn last_value<T: Scalar>(slots: &[Tensor<T>]) -> NnResult<f64> {
    let last = slots.last().ok_or_else(|| {
        tapegrad_core::Error::invalid("verify", "the recorded graph has no slots")
    })?;
    Ok(last.item()?.to_f64())
}

/// The dtype's machine epsilon.
pub fn epsilon<S: Scalar>() -> f64 {
    match S::DTYPE {
        DType::F32 => f64::from(f32::EPSILON),
        DType::F64 => f64::EPSILON,
    }
}
