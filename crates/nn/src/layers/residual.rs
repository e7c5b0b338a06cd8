//! `Residual`: a block that adds its input to what its body makes of it, `x + body(x)` (the
//! pre-norm transformer's `x = x + attn(ln_1(x))`). The body is a `Sequential`, so its layers keep
//! the names they were built with.

use super::{Ctx, Sequential};
use tapegrad_core::Result;
use tapegrad_core::Var;
use tapegrad_tensor::Scalar;

/// `x + body(x)`.
#[derive(Debug, Clone, Default)]
pub struct Residual {
    pub body: Sequential,
}

impl Residual {
    /// A residual block around `body`.
    pub fn new(body: Sequential) -> Self {
        Residual { body }
    }

    /// `x + body(x)` (the input on the left, as PyTorch's `x = x + f(x)`).
    pub fn forward<S: Scalar>(&self, ctx: &mut Ctx<'_, S>, x: Var) -> Result<Var> {
        let y = self.body.forward(ctx, x)?;
        ctx.session().add(x, y)
    }
}
