//! Gradient clipping by global norm, as `torch.nn.utils.clip_grad_norm_` (2-norm): the norm of
//! the per-tensor norms is `total`; every gradient is multiplied by
//! `min(max_norm / (total + 1e-6), 1)`. Norms are accumulated in f64 and the factor rounded to the
//! element type.

use tapegrad_core::{Error, Result};
use tapegrad_tensor::{Scalar, Tensor};

/// Scales `grads` in place so their global 2-norm is at most about `max_norm`; returns the norm
/// before clipping.
pub fn clip_grad_norm<S: Scalar>(grads: &mut [Tensor<S>], max_norm: f64) -> Result<f64> {
    check_max_norm(max_norm)?;
    let total = global_norm(grads);
    let coef = (max_norm / (total + 1e-6)).min(1.0);
    if coef < 1.0 {
        let c = S::from_f64(coef);
        for g in grads.iter_mut() {
            for v in g.data_mut() {
                *v *= c;
            }
        }
    }
    Ok(total)
}

/// Rejects a `max_norm` that is not positive (NaN included); a trainer checks it before its
/// first step rather than failing at it.
pub fn check_max_norm(max_norm: f64) -> Result<()> {
    if max_norm.is_nan() || max_norm <= 0.0 {
        return Err(Error::invalid(
            "clip_grad_norm",
            format!("max_norm must be positive, found {max_norm}"),
        ));
    }
    Ok(())
}

/// The 2-norm of the per-tensor 2-norms.
pub fn global_norm<S: Scalar>(grads: &[Tensor<S>]) -> f64 {
    grads
        .iter()
        .map(|g| {
            let n = g
                .data()
                .iter()
                .map(|v| v.to_f64() * v.to_f64())
                .sum::<f64>()
                .sqrt();
            n * n
        })
        .sum::<f64>()
        .sqrt()
}
