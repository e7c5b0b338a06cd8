//! `Dropout` with PyTorch's semantics: in training mode each element is kept with probability
//! `1 - p` and scaled by `1 / (1 - p)`, else zeroed; in eval mode it is the identity. The mask is
//! drawn from the context's seeded stream and applied as an elementwise product with a constant,
//! so its gradient is the same mask.

use super::{Ctx, Mode};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tapegrad_core::Var;
use tapegrad_core::{Error, Result};
use tapegrad_tensor::{Scalar, Shape, Tensor};

/// Random zeroing during training.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    pub p: f64,
}

impl Dropout {
    /// A dropout layer; `p` must lie in `[0, 1)`.
    pub fn new(p: f64) -> Result<Self> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::invalid(
                "dropout",
                format!("probability must lie in [0, 1), found {p}"),
            ));
        }
        Ok(Dropout { p })
    }

    /// Applies dropout in training mode; the identity otherwise.
    pub fn forward<S: Scalar>(&self, ctx: &mut Ctx<'_, S>, x: Var) -> Result<Var> {
        if ctx.mode() == Mode::Eval || self.p == 0.0 {
            return Ok(x);
        }
        let shape = ctx.session().value(x)?.shape().clone();
        let mask = dropout_mask::<S>(&shape, self.p, ctx.rng())?;
        let mask = ctx.session().constant(mask);
        ctx.note_mask(mask, self.p);
        ctx.session().mul(x, mask)
    }
}

/// A dropout mask of `shape`: each element `1 / (1 - p)` with probability `1 - p`, else 0, drawn
/// in row-major order from `rng` (one uniform per element). Kept separate so that a backend that
/// replays a traced model can redraw the masks of a step exactly as the eager pass does.
pub fn dropout_mask<S: Scalar>(shape: &Shape, p: f64, rng: &mut ChaCha8Rng) -> Result<Tensor<S>> {
    let keep = 1.0 - p;
    let scale = S::ONE / S::from_f64(keep);
    let mask = (0..shape.numel())
        .map(|_| {
            if rng.random::<f64>() < keep {
                scale
            } else {
                S::ZERO
            }
        })
        .collect();
    Ok(Tensor::from_shape(shape.clone(), mask)?)
}
