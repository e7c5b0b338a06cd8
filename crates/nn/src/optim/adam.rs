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
use tapegrad_tensor::kernels::update::{self, Piece};
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

/// One step of every tensor: `tensors` holds each tensor's values, gradient (same length) and
/// state. Each element is updated on its own, so the tensors' elements go together to the GEMM
/// threads when long (`update::spread`), with the bits of one thread.
pub(super) fn update_all<S: Scalar>(
    rule: &AdamRule,
    lr: f64,
    step: u64,
    tensors: Vec<(&mut [S], &[S], Slots<'_, S>)>,
) {
    let pieces = tensors
        .into_iter()
        .map(|(p, grad, state)| {
            // Callers pass equal lengths (the optimizer checks shapes).
            let len = p.len().min(grad.len());
            let (m, v) = state.into_two(EXP_AVG, EXP_AVG_SQ);
            AdamPiece {
                p: &mut p[..len],
                grad: &grad[..len],
                m: &mut m[..len],
                v: &mut v[..len],
            }
        })
        .collect();
    let step = Step::new(rule, lr, step);
    update::spread(pieces, |piece| step.apply(piece));
}

/// A run of one tensor's elements: values, gradient and both moments.
struct AdamPiece<'a, S> {
    p: &'a mut [S],
    grad: &'a [S],
    m: &'a mut [S],
    v: &'a mut [S],
}

impl<S: Scalar> Piece for AdamPiece<'_, S> {
    fn len(&self) -> usize {
        self.p.len()
    }

    fn cut(self, at: usize) -> (Self, Self) {
        let (p, p_rest) = self.p.split_at_mut(at);
        let (grad, grad_rest) = self.grad.split_at(at);
        let (m, m_rest) = self.m.split_at_mut(at);
        let (v, v_rest) = self.v.split_at_mut(at);
        (
            AdamPiece { p, grad, m, v },
            AdamPiece {
                p: p_rest,
                grad: grad_rest,
                m: m_rest,
                v: v_rest,
            },
        )
    }
}

/// The step's constants, in the element type.
struct Step<S> {
    /// `1 - lr * weight_decay` when the decay is decoupled (AdamW).
    decay_factor: Option<S>,
    /// `weight_decay` when it is added to the gradient (Adam).
    coupled_decay: Option<S>,
    w1: (S, f64),
    b2: S,
    w2: S,
    neg_step_size: S,
    bc2_sqrt: S,
    eps: S,
}

impl<S: Scalar> Step<S> {
    fn new(rule: &AdamRule, lr: f64, step: u64) -> Step<S> {
        let AdamRule {
            beta1,
            beta2,
            eps,
            weight_decay,
            decoupled,
        } = *rule;
        let t = step as f64;
        let bias_correction1 = 1.0 - beta1.powf(t);
        let bias_correction2 = 1.0 - beta2.powf(t);
        Step {
            decay_factor: decoupled.then(|| s::<S>(1.0 - lr * weight_decay)),
            coupled_decay: (!decoupled && weight_decay != 0.0).then(|| s::<S>(weight_decay)),
            w1: (s::<S>(1.0 - beta1), 1.0 - beta1),
            b2: s::<S>(beta2),
            w2: s::<S>(1.0 - beta2),
            neg_step_size: s::<S>(-(lr / bias_correction1)),
            bc2_sqrt: s::<S>(bias_correction2.sqrt()),
            eps: s::<S>(eps),
        }
    }

    fn apply(&self, piece: AdamPiece<'_, S>) {
        let AdamPiece { p, grad, m, v } = piece;
        for (((p, &grad), m), v) in p.iter_mut().zip(grad).zip(m.iter_mut()).zip(v.iter_mut()) {
            if let Some(factor) = self.decay_factor {
                *p *= factor;
            }
            let g = match self.coupled_decay {
                Some(wd) => grad + wd * *p,
                None => grad,
            };
            *m = lerp(*m, g, self.w1.0, self.w1.1);
            *v = *v * self.b2 + self.w2 * g * g;
            let denom = v.sqrt() / self.bc2_sqrt + self.eps;
            *p += self.neg_step_size * *m / denom;
        }
    }
}
