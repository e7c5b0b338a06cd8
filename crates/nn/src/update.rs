//! The end of every training step, shared by the table trainer and the GPT run: the check that
//! stops a diverged run, clipping by the global norm and the optimizer's update.

use crate::clip::clip_grad_norm;
use crate::error::{NnError, NnResult};
use crate::optim::Optimizer;
use crate::params::ParamSet;
use tapegrad_tensor::{Scalar, Tensor};

/// An error when the loss of step `step` (counted from 1) is not finite: the run has diverged.
/// The advice names clipping too when the run does not clip.
pub(crate) fn check_loss(loss: f64, step: u64, clip_norm: Option<f64>) -> NnResult<()> {
    if loss.is_finite() {
        return Ok(());
    }
    let clipping = match clip_norm {
        Some(_) => "",
        None => " or gradient clipping (--clip)",
    };
    Err(NnError::Config(format!(
        "the loss became {loss} at step {step}; try a smaller learning rate (--lr){clipping}"
    )))
}

/// Clips `grads` to the global norm `clip_norm` when it is set, then applies them at rate `lr`;
/// the norm before clipping.
pub(crate) fn clip_and_step<S: Scalar>(
    optimizer: &mut Optimizer<S>,
    params: &mut ParamSet<S>,
    grads: &mut [Tensor<S>],
    clip_norm: Option<f64>,
    lr: f64,
) -> NnResult<Option<f64>> {
    let norm = match clip_norm {
        Some(max) => Some(clip_grad_norm(grads, max)?),
        None => None,
    };
    optimizer.step(params, grads, lr)?;
    Ok(norm)
}
