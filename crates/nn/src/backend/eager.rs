//! The eager backend: each step resets one session, records the forward pass and the loss on its
//! tape, and runs the executed sweep (`backward_all`) for the parameters' gradients. In anomaly
//! mode the session's tape checks every value it records and every backward contribution.

use super::{record_loss, Backend, BackendKind, StepOutput};
use crate::data::Batch;
use crate::error::NnResult;
use crate::layers::{Ctx, Mode};
use crate::model::Model;
use crate::rng::dropout_rng;
use rand_chacha::ChaCha8Rng;
use tapegrad_core::graph::tape_kept_bytes;
use tapegrad_core::Session;
use tapegrad_tensor::{Scalar, Tensor};

/// Records every step on a session tape.
pub struct Eager<S> {
    session: Session<S>,
    kept_bytes: usize,
}

impl<S: Scalar> Eager<S> {
    /// A backend with a fresh session.
    pub fn new() -> Self {
        Eager {
            session: Session::new(),
            kept_bytes: 0,
        }
    }
}

impl<S: Scalar> Default for Eager<S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: Scalar> Backend<S> for Eager<S> {
    fn kind(&self) -> BackendKind {
        BackendKind::Eager
    }

    fn train_step(
        &mut self,
        model: &Model<S>,
        batch: &Batch<S>,
        rng: ChaCha8Rng,
    ) -> NnResult<StepOutput<S>> {
        self.session.reset();
        let mut ctx = Ctx::new(&mut self.session, &model.params, Mode::Train, rng)?;
        let x = ctx.session().input(batch.x.clone());
        let out = model.forward(&mut ctx, x)?;
        let loss = record_loss(ctx.session(), out, &batch.y)?;
        let outputs = ctx.session().value(out)?.clone();
        let loss_value = ctx.session().value(loss)?.item()?.to_f64();
        let kept_bytes = tape_kept_bytes(ctx.session().tape());
        let grads = ctx.session().backward(loss)?;
        let updates = ctx.into_updates();
        self.kept_bytes = kept_bytes;
        // Drop the tape's references to the parameters, so the optimizer updates them in place.
        self.session.reset();
        Ok(StepOutput {
            loss: loss_value,
            outputs,
            grads: grads.into_vec().into_iter().map(|(_, g)| g).collect(),
            updates,
        })
    }

    fn kept_bytes(&self) -> usize {
        self.kept_bytes
    }

    fn infer(&mut self, model: &Model<S>, x: &Tensor<S>) -> NnResult<Tensor<S>> {
        self.session.reset();
        // Eval mode draws nothing from the stream; any seed will do.
        let mut ctx = Ctx::new(
            &mut self.session,
            &model.params,
            Mode::Eval,
            dropout_rng(0, 0),
        )?;
        let x = ctx.session().input(x.clone());
        let out = model.forward(&mut ctx, x)?;
        let value = ctx.session().value(out)?.clone();
        self.session.set_grad_enabled(true);
        Ok(value)
    }

    fn set_detect_anomaly(&mut self, on: bool) {
        // The flag lives on the session's tape and survives `reset`.
        self.session.set_detect_anomaly(on);
    }
}
