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
use pulp::{Arch, Simd, WithSimd};
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
    let wd = (weight_decay != 0.0).then_some(wd);
    Arch::new().dispatch(MomentumStep {
        p,
        grad,
        b,
        neg_lr,
        wd,
        m,
        keep,
        first,
        nesterov,
    });
}

/// One momentum step over a tensor, element by element as above, compiled for the CPU's widest
/// vector instructions. The per-call choices (first step, Nesterov, weight decay) are made
/// outside the element loop, so each of the loops is branch-free and vectorises; each lane does
/// the scalar formula's roundings in its order (Rust never fuses a multiply-add), so the result
/// is the same bits as the plain loop.
struct MomentumStep<'a, S> {
    p: &'a mut [S],
    grad: &'a [S],
    b: &'a mut [S],
    neg_lr: S,
    wd: Option<S>,
    m: S,
    keep: S,
    first: bool,
    nesterov: bool,
}

impl<S: Scalar> WithSimd for MomentumStep<'_, S> {
    type Output = ();
    // Inlined into pulp's `#[target_feature]` function, which is what lets the loops use it.
    #[inline(always)]
    fn with_simd<V: Simd>(self, _simd: V) {
        match self.wd {
            None => self.loops(|g, _| g),
            Some(wd) => self.loops(move |g, p| g + wd * p),
        }
    }
}

impl<S: Scalar> MomentumStep<'_, S> {
    #[inline(always)]
    fn loops(self, decayed: impl Fn(S, S) -> S) {
        let MomentumStep {
            p,
            grad,
            b,
            neg_lr,
            m,
            keep,
            first,
            nesterov,
            ..
        } = self;
        // `step(g, b)`: updates the buffer from the decayed gradient and returns the step.
        #[inline(always)]
        fn each<S: Scalar>(
            p: &mut [S],
            grad: &[S],
            b: &mut [S],
            neg_lr: S,
            decayed: impl Fn(S, S) -> S,
            step: impl Fn(S, &mut S) -> S,
        ) {
            for ((p, &g), b) in p.iter_mut().zip(grad).zip(b.iter_mut()) {
                let g = decayed(g, *p);
                *p += neg_lr * step(g, b);
            }
        }
        match (first, nesterov) {
            (true, false) => each(p, grad, b, neg_lr, decayed, |g, b| {
                *b = g;
                *b
            }),
            (true, true) => each(p, grad, b, neg_lr, decayed, |g, b| {
                *b = g;
                g + m * *b
            }),
            (false, false) => each(p, grad, b, neg_lr, decayed, |g, b| {
                *b = *b * m + keep * g;
                *b
            }),
            (false, true) => each(p, grad, b, neg_lr, decayed, |g, b| {
                *b = *b * m + keep * g;
                g + m * *b
            }),
        }
    }
}
