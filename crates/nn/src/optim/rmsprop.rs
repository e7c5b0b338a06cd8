//! RMSProp, as `torch.optim.RMSprop`:
//!
//! ```text
//! g = grad + weight_decay * p                          (if weight_decay != 0)
//! v = v * alpha + ((1 - alpha) * g) * g
//! if centered:  a = lerp(a, g, 1 - alpha);  avg = sqrt(v + ((-1) * a) * a) + eps
//! else:         avg = sqrt(v) + eps
//! if momentum > 0:  b = b * momentum + g / avg;  p = p + (-lr) * b
//! else:             p = p + ((-lr) * g) / avg
//! ```
//!
//! `v` (`square_avg`), `b` (`momentum_buffer`) and `a` (`grad_avg`) start at zero.

use super::adam::lerp;
use super::{s, OptimizerConfig, Slots};
use tapegrad_tensor::Scalar;

const SQUARE_AVG: usize = 0;
const MOMENTUM_BUFFER: usize = 1;
const GRAD_AVG: usize = 2;

pub(super) fn update<S: Scalar>(
    config: &OptimizerConfig,
    lr: f64,
    p: &mut [S],
    grad: &[S],
    mut state: Slots<'_, S>,
) {
    let OptimizerConfig::RmsProp {
        alpha,
        eps,
        weight_decay,
        momentum,
        centered,
        ..
    } = *config
    else {
        unreachable!("rmsprop::update is only called for RmsProp")
    };
    let g: Vec<S> = if weight_decay != 0.0 {
        let wd = s::<S>(weight_decay);
        grad.iter()
            .zip(p.iter())
            .map(|(&g, &p)| g + wd * p)
            .collect()
    } else {
        grad.to_vec()
    };
    let (a, w) = (s::<S>(alpha), s::<S>(1.0 - alpha));
    let eps = s::<S>(eps);
    let v = state.zeroed(SQUARE_AVG);
    for (v, &g) in v.iter_mut().zip(&g) {
        *v = *v * a + w * g * g;
    }
    let v = v.to_vec();
    let avg: Vec<S> = if centered {
        let ga = state.zeroed(GRAD_AVG);
        let minus_one = -S::ONE;
        ga.iter_mut()
            .zip(&g)
            .zip(&v)
            .map(|((ga, &g), &v)| {
                *ga = lerp(*ga, g, w, 1.0 - alpha);
                (v + minus_one * *ga * *ga).sqrt() + eps
            })
            .collect()
    } else {
        v.iter().map(|&v| v.sqrt() + eps).collect()
    };
    let neg_lr = s::<S>(-lr);
    if momentum > 0.0 {
        let m = s::<S>(momentum);
        let b = state.zeroed(MOMENTUM_BUFFER);
        for i in 0..p.len() {
            b[i] = b[i] * m + g[i] / avg[i];
            p[i] += neg_lr * b[i];
        }
    } else {
        for i in 0..p.len() {
            p[i] += neg_lr * g[i] / avg[i];
        }
    }
}
