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
use super::{s, Slots};
use tapegrad_tensor::Scalar;

/// RMSProp's hyper-parameters besides the learning rate.
#[derive(Debug, Clone, Copy)]
pub(super) struct RmsPropRule {
    pub alpha: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub momentum: f64,
    pub centered: bool,
}

/// One tensor's step, element by element in one pass (each element's operations in the order
/// above, so the bits of a pass per formula line). The momentum buffer and the gradient average
/// exist only when the rule uses them, as in PyTorch's state.
pub(super) fn update<S: Scalar>(
    rule: &RmsPropRule,
    lr: f64,
    p: &mut [S],
    grad: &[S],
    mut state: Slots<'_, S>,
) {
    let RmsPropRule {
        alpha,
        eps,
        weight_decay,
        momentum,
        centered,
    } = *rule;
    let has_momentum = momentum > 0.0;
    // The slots in `slot_names` order: square_avg, momentum_buffer, grad_avg.
    let [Some(square_avg), mut momentum_buffer, mut grad_avg] =
        state.some([true, has_momentum, centered])
    else {
        unreachable!("RMSProp's optimizer state has its three slots from creation")
    };
    let decay = weight_decay != 0.0;
    let (wd, a, w) = (s::<S>(weight_decay), s::<S>(alpha), s::<S>(1.0 - alpha));
    let (eps, neg_lr, m) = (s::<S>(eps), s::<S>(-lr), s::<S>(momentum));
    let minus_one = -S::ONE;
    for i in 0..p.len().min(grad.len()) {
        let g = if decay { grad[i] + wd * p[i] } else { grad[i] };
        let v = square_avg[i] * a + w * g * g;
        square_avg[i] = v;
        let avg = match grad_avg.as_deref_mut() {
            Some(ga) => {
                ga[i] = lerp(ga[i], g, w, 1.0 - alpha);
                (v + minus_one * ga[i] * ga[i]).sqrt() + eps
            }
            None => v.sqrt() + eps,
        };
        match momentum_buffer.as_deref_mut() {
            Some(b) => {
                b[i] = b[i] * m + g / avg;
                p[i] += neg_lr * b[i];
            }
            None => p[i] += neg_lr * g / avg,
        }
    }
}
