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

use super::{s, Slots};
use crate::grad::OuterDims;
use pulp::{Arch, Simd, WithSimd};
use tapegrad_tensor::kernels::num_threads;
use tapegrad_tensor::kernels::update::{self, Piece};
use tapegrad_tensor::Scalar;

const MOMENTUM_BUFFER: usize = 0;

/// SGD's hyper-parameters besides the learning rate, as `OptimizerConfig::Sgd` holds them.
#[derive(Debug, Clone, Copy)]
pub(super) struct SgdRule {
    pub momentum: f64,
    pub dampening: f64,
    pub nesterov: bool,
    pub weight_decay: f64,
}

impl SgdRule {
    /// No momentum and no weight decay: `p + (-lr) * g` (dampening and Nesterov then change
    /// nothing).
    pub const PLAIN: SgdRule = SgdRule {
        momentum: 0.0,
        dampening: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    };
}

/// One tensor's elements (or a run of them) with its momentum buffer, if the step keeps one.
pub(super) struct SgdPiece<'a, S> {
    p: &'a mut [S],
    grad: &'a [S],
    b: Option<&'a mut [S]>,
    /// The buffer was created this step (it starts as the gradient, not as a running mean).
    first: bool,
}

impl<S: Scalar> Piece for SgdPiece<'_, S> {
    fn len(&self) -> usize {
        self.p.len()
    }

    fn cut(self, at: usize) -> (Self, Self) {
        let (p, p_rest) = self.p.split_at_mut(at);
        let (grad, grad_rest) = self.grad.split_at(at);
        let (b, b_rest) = match self.b {
            Some(b) => {
                let (b, rest) = b.split_at_mut(at);
                (Some(b), Some(rest))
            }
            None => (None, None),
        };
        let first = self.first;
        (
            SgdPiece { p, grad, b, first },
            SgdPiece {
                p: p_rest,
                grad: grad_rest,
                b: b_rest,
                first,
            },
        )
    }
}

/// One step of every tensor: `tensors` holds each tensor's values, gradient (same length) and
/// state. The tensors' elements are updated together, spread over the GEMM threads when long.
pub(super) fn update_all<S: Scalar>(
    rule: SgdRule,
    lr: f64,
    tensors: Vec<(&mut [S], &[S], Slots<'_, S>)>,
) {
    let SgdRule {
        momentum,
        dampening,
        nesterov,
        weight_decay,
    } = rule;
    let pieces = tensors
        .into_iter()
        .map(|(p, grad, state)| {
            // Callers pass equal lengths (the optimizer checks shapes); zip's truncation, as
            // before.
            let len = p.len().min(grad.len());
            let (p, grad) = (&mut p[..len], &grad[..len]);
            if momentum == 0.0 {
                return SgdPiece {
                    p,
                    grad,
                    b: None,
                    first: false,
                };
            }
            let first = !state.has(MOMENTUM_BUFFER);
            let b = &mut state.into_zeroed(MOMENTUM_BUFFER)[..len];
            SgdPiece {
                p,
                grad,
                b: Some(b),
                first,
            }
        })
        .collect();
    let step = Step {
        neg_lr: s::<S>(-lr),
        wd: (weight_decay != 0.0).then(|| s::<S>(weight_decay)),
        m: s::<S>(momentum),
        keep: s::<S>(1.0 - dampening),
        nesterov,
    };
    update::spread(pieces, |piece| step.apply(piece));
}

/// Plain SGD's step `p + (-lr) * (rows^T cols)` by a factored gradient of sizes `d` (checked
/// against `p` and the factors by the caller), without writing the gradient. One row: one pass
/// with the dense step's bits (`update::add_scaled_outer`). More rows: one GEMM accumulating into
/// `p` with the product scaled by `-lr` (gemm's `dst := dst + beta * (lhs * rhs)`), operands and
/// thread count exactly those of linear's weight-gradient GEMM (`rows` read transposed in place),
/// so it takes that product's depth blocking, kernel path and thread split; only the final
/// roundings differ from the dense step (see `Optimizer::step_grads`).
pub(super) fn step_factored<S: Scalar>(
    p: &mut [S],
    neg_lr: S,
    d: OuterDims,
    rows: &[S],
    cols: &[S],
) {
    if d.batch == 1 {
        return update::add_scaled_outer(p, neg_lr, rows, cols);
    }
    S::gemm(
        d.out,
        d.inn,
        d.batch,
        p,
        d.inn,
        rows,
        1,
        d.out,
        cols,
        d.inn,
        1,
        true,
        neg_lr,
        num_threads(),
    );
}

/// The per-step constants, rounded to the element type.
struct Step<S> {
    neg_lr: S,
    wd: Option<S>,
    m: S,
    keep: S,
    nesterov: bool,
}

impl<S: Scalar> Step<S> {
    /// Updates one piece in place: the same operations in the same order as the whole-tensor
    /// formulation above, one pass per element, so results are bit-identical, without a
    /// temporary gradient copy.
    fn apply(&self, piece: SgdPiece<'_, S>) {
        let SgdPiece { p, grad, b, first } = piece;
        let neg_lr = self.neg_lr;
        match (b, self.wd) {
            // The common case: one vectorised pass, `p + (-lr) * g` as below.
            (None, None) => update::add_scaled(p, neg_lr, grad),
            (None, Some(wd)) => {
                for (p, &g) in p.iter_mut().zip(grad) {
                    *p += neg_lr * (g + wd * *p);
                }
            }
            (Some(b), wd) => Arch::new().dispatch(MomentumStep {
                p,
                grad,
                b,
                neg_lr,
                wd,
                m: self.m,
                keep: self.keep,
                first,
                nesterov: self.nesterov,
            }),
        }
    }
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
