//! Adam and AdamW, as `torch.optim.Adam` / `torch.optim.AdamW` (amsgrad off), at step `t`
//! (counted from 1):
//!
//! ```text
//! AdamW:  p = p * (1 - lr * weight_decay)                   (decoupled decay)
//! Adam:   g = grad + weight_decay * p                       (if weight_decay != 0)
//! m = lerp(m, g, 1 - beta1)                                 (m + (1 - beta1) * (g - m))
//! v = v * beta2 + ((1 - beta2) * g) * g
//! step_size = lr / (1 - beta1^t)
//! denom = sqrt(v) / sqrt(1 - beta2^t) + eps
//! p = p + ((-step_size) * m) / denom
//! ```
//!
//! `m` and `v` start at zero. `lerp` is PyTorch's: `a + w * (b - a)` for `|w| < 0.5`, else
//! `b - (b - a) * (1 - w)`.

use super::{s, Slots};
use tapegrad_tensor::Scalar;

const EXP_AVG: usize = 0;
const EXP_AVG_SQ: usize = 1;

/// PyTorch's `lerp(start, end, weight)` formula.
pub(super) fn lerp<S: Scalar>(start: S, end: S, weight: S, weight_f64: f64) -> S {
    if weight_f64.abs() < 0.5 {
        start + weight * (end - start)
    } else {
        end - (end - start) * (S::ONE - weight)
    }
}

/// Adam's hyper-parameters besides the learning rate; `decoupled` is AdamW's weight decay.
#[derive(Debug, Clone, Copy)]
pub(super) struct AdamRule {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub decoupled: bool,
}

pub(super) fn update<S: Scalar>(
    rule: &AdamRule,
    lr: f64,
    step: u64,
    p: &mut [S],
    grad: &[S],
    mut state: Slots<'_, S>,
) {
    let AdamRule {
        beta1,
        beta2,
        eps,
        weight_decay,
        decoupled,
    } = *rule;
    if decoupled {
        let factor = s::<S>(1.0 - lr * weight_decay);
        for p in p.iter_mut() {
            *p *= factor;
        }
    }
    let wd = s::<S>(weight_decay);
    let coupled_decay = !decoupled && weight_decay != 0.0;
    let w1 = 1.0 - beta1;
    let (w1_s, b2, w2) = (s::<S>(w1), s::<S>(beta2), s::<S>(1.0 - beta2));
    let t = step as f64;
    let bias_correction1 = 1.0 - beta1.powf(t);
    let bias_correction2 = 1.0 - beta2.powf(t);
    let neg_step_size = s::<S>(-(lr / bias_correction1));
    let bc2_sqrt = s::<S>(bias_correction2.sqrt());
    let eps = s::<S>(eps);
    let (m, v) = state.two(EXP_AVG, EXP_AVG_SQ);
    for i in 0..p.len() {
        let g = if coupled_decay {
            grad[i] + wd * p[i]
        } else {
            grad[i]
        };
        m[i] = lerp(m[i], g, w1_s, w1);
        v[i] = v[i] * b2 + w2 * g * g;
        let denom = v[i].sqrt() / bc2_sqrt + eps;
        p[i] += neg_step_size * m[i] / denom;
    }
}
