//! SGD with momentum, dampening, Nesterov and weight decay, as `torch.optim.SGD`:
//!
//! ```text
//! g = grad + weight_decay * p                      (if weight_decay != 0)
//! if momentum != 0:
//!     b = g                                        (first step: torch.clone(g))
//!     b = momentum * b + (1 - dampening) * g       (later steps)
//!     g = g + momentum * b   if nesterov   else   g = b
//! p = p + (-lr) * g
//! ```

use super::{s, simd, OptimizerConfig, Slots};
use tapegrad_tensor::Scalar;

const MOMENTUM_BUFFER: usize = 0;

pub(super) fn update<S: Scalar>(
    config: &OptimizerConfig,
    lr: f64,
    p: &mut [S],
    grad: &[S],
    mut state: Slots<'_, S>,
) {
    let OptimizerConfig::Sgd {
        momentum,
        dampening,
        nesterov,
        weight_decay,
        ..
    } = *config
    else {
        unreachable!("sgd::update is only called for Sgd")
    };
    // One pass per element, in place: the same operations in the same order as the whole-tensor
    // formulation above, so results are bit-identical, without a temporary gradient copy.
    let wd = s::<S>(weight_decay);
    let decayed = |g: S, p: S| if weight_decay != 0.0 { g + wd * p } else { g };
    let neg_lr = s::<S>(-lr);
    if momentum == 0.0 && weight_decay == 0.0 {
        // The common case: one vectorised pass, `p + (-lr) * g` as below.
        simd::add_scaled(p, neg_lr, grad);
        return;
    }
    if momentum == 0.0 {
        for (p, &g) in p.iter_mut().zip(grad) {
            *p += neg_lr * decayed(g, *p);
        }
        return;
    }
    let m = s::<S>(momentum);
    let first = !state.has(MOMENTUM_BUFFER);
    let keep = s::<S>(1.0 - dampening);
    let b = state.zeroed(MOMENTUM_BUFFER);
    for ((p, &g), b) in p.iter_mut().zip(grad).zip(b.iter_mut()) {
        let g = decayed(g, *p);
        *b = if first { g } else { *b * m + keep * g };
        let step = if nesterov { g + m * *b } else { *b };
        *p += neg_lr * step;
    }
}
