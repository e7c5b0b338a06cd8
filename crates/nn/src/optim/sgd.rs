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

use super::{s, OptimizerConfig, Slots};
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
    let mut g: Vec<S> = if weight_decay != 0.0 {
        let wd = s::<S>(weight_decay);
        grad.iter()
            .zip(p.iter())
            .map(|(&g, &p)| g + wd * p)
            .collect()
    } else {
        grad.to_vec()
    };
    if momentum != 0.0 {
        let m = s::<S>(momentum);
        if !state.has(MOMENTUM_BUFFER) {
            state.set(MOMENTUM_BUFFER, g.clone());
        } else {
            let keep = s::<S>(1.0 - dampening);
            let b = state.zeroed(MOMENTUM_BUFFER);
            for (b, &g) in b.iter_mut().zip(&g) {
                *b = *b * m + keep * g;
            }
        }
        let b = state.zeroed(MOMENTUM_BUFFER);
        if nesterov {
            for (g, &b) in g.iter_mut().zip(b.iter()) {
                *g += m * b;
            }
        } else {
            g.copy_from_slice(b);
        }
    }
    let neg_lr = s::<S>(-lr);
    for (p, &g) in p.iter_mut().zip(&g) {
        *p += neg_lr * g;
    }
}
