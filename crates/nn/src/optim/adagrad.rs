//! Adagrad, as `torch.optim.Adagrad`, at step `t` (counted from 1):
//!
//! ```text
//! g = grad + weight_decay * p                   (if weight_decay != 0)
//! clr = lr / (1 + (t - 1) * lr_decay)
//! sum = sum + (1 * g) * g
//! p = p + ((-clr) * g) / (sqrt(sum) + eps)
//! ```
//!
//! `sum` starts at `initial_accumulator_value` (set when the optimizer is created).

use super::{s, Slots};
use tapegrad_tensor::Scalar;

const SUM: usize = 0;

/// Adagrad's hyper-parameters used by a step (the initial accumulator value is applied when the
/// optimizer is created).
#[derive(Debug, Clone, Copy)]
pub(super) struct AdagradRule {
    pub lr_decay: f64,
    pub weight_decay: f64,
    pub eps: f64,
}

pub(super) fn update<S: Scalar>(
    rule: &AdagradRule,
    lr: f64,
    step: u64,
    p: &mut [S],
    grad: &[S],
    mut state: Slots<'_, S>,
) {
    let AdagradRule {
        lr_decay,
        weight_decay,
        eps,
    } = *rule;
    let wd = s::<S>(weight_decay);
    let clr = lr / (1.0 + (step as f64 - 1.0) * lr_decay);
    let neg_clr = s::<S>(-clr);
    let eps = s::<S>(eps);
    let sum = state.zeroed(SUM);
    for i in 0..p.len() {
        let g = if weight_decay != 0.0 {
            grad[i] + wd * p[i]
        } else {
            grad[i]
        };
        sum[i] += S::ONE * g * g;
        p[i] += neg_clr * g / (sum[i].sqrt() + eps);
    }
}
