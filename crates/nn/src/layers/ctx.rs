//! `Ctx`: one forward pass of a model on a `Session`. It registers every trainable tensor as a
//! session parameter (so each gets a gradient, zero if unused, in the model's order), buffers as
//! constants, and keeps the mode, the dropout stream and pending buffer updates.

use super::norm::RunningStats;
use crate::params::{ParamId, ParamKind, ParamSet};
use rand_chacha::ChaCha8Rng;
use tapegrad_core::Result;
use tapegrad_core::{Session, Var};
use tapegrad_tensor::{Scalar, Tensor};

/// Training mode (dropout active, batch statistics) or evaluation mode (no dropout, running
/// statistics, no gradient recording).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Train,
    Eval,
}

/// The state of one forward pass.
pub struct Ctx<'s, S: Scalar> {
    session: &'s mut Session<S>,
    vars: Vec<Var>,
    mode: Mode,
    rng: ChaCha8Rng,
    updates: Vec<(ParamId, Tensor<S>)>,
    running: Vec<RunningStats>,
    masks: Vec<(Var, f64)>,
    lookups: Vec<(Var, Var)>,
    seeded: Vec<Var>,
}

impl<'s, S: Scalar> Ctx<'s, S> {
    /// Registers `params` on `session` (which the caller has reset) and returns the context. In
    /// eval mode gradient recording is switched off for the whole pass.
    pub fn new(
        session: &'s mut Session<S>,
        params: &ParamSet<S>,
        mode: Mode,
        rng: ChaCha8Rng,
    ) -> Result<Self> {
        Self::with_recording(session, params, mode, rng, mode == Mode::Train, &[])
    }

    /// As [`Ctx::new`] in training mode, recording the trainable tensors at `constants` (indices
    /// in the `ParamSet`) as constants: they get no gradient from the session, for a caller that
    /// computes theirs from other cotangents (the eager backend's outer-product gradients).
    pub fn with_constants(
        session: &'s mut Session<S>,
        params: &ParamSet<S>,
        rng: ChaCha8Rng,
        constants: &[usize],
    ) -> Result<Self> {
        Self::with_recording(session, params, Mode::Train, rng, true, constants)
    }

    /// As [`Ctx::new`] but recording every op on the tape in either mode, so the pass can be
    /// turned into a graph (the compiled backend traces models this way).
    pub fn tracing(
        session: &'s mut Session<S>,
        params: &ParamSet<S>,
        mode: Mode,
        rng: ChaCha8Rng,
    ) -> Result<Self> {
        Self::with_recording(session, params, mode, rng, true, &[])
    }

    fn with_recording(
        session: &'s mut Session<S>,
        params: &ParamSet<S>,
        mode: Mode,
        rng: ChaCha8Rng,
        record: bool,
        constants: &[usize],
    ) -> Result<Self> {
        session.set_grad_enabled(record);
        let mut vars = Vec::with_capacity(params.len());
        for (i, p) in params.iter().enumerate() {
            let v = match p.kind {
                ParamKind::Trainable if !constants.contains(&i) => {
                    session.parameter(p.name.clone(), p.value.clone())?
                }
                _ => session.constant(p.value.clone()),
            };
            vars.push(v);
        }
        Ok(Ctx {
            session,
            vars,
            mode,
            rng,
            updates: Vec::new(),
            running: Vec::new(),
            masks: Vec::new(),
            lookups: Vec::new(),
            seeded: Vec::new(),
        })
    }

    /// The session ops are recorded on.
    pub fn session(&mut self) -> &mut Session<S> {
        self.session
    }

    /// The handle of a model tensor in this pass.
    pub fn param(&self, id: ParamId) -> Var {
        self.vars[id.index()]
    }

    /// Train or eval.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The stream dropout masks are drawn from (seeded per step by the trainer).
    pub fn rng(&mut self) -> &mut ChaCha8Rng {
        &mut self.rng
    }

    /// Records a dropout mask constant (with its probability) so a traced pass can redraw it.
    pub fn note_mask(&mut self, mask: Var, p: f64) {
        self.masks.push((mask, p));
    }

    /// Records an embedding node whose indices were read from the values of `source`, so a
    /// traced pass can take the next batch's indices from its input instead of the traced ones.
    pub fn note_lookup(&mut self, node: Var, source: Var) {
        self.lookups.push((node, source));
    }

    /// The embedding lookups of this pass: `(node, the var its indices came from)`.
    pub fn lookups(&self) -> &[(Var, Var)] {
        &self.lookups
    }

    /// Records an op node whose attribute `seed` was drawn from the dropout stream (attention
    /// dropout), so a traced pass can redraw it each step in drawing order.
    pub fn note_seeded(&mut self, node: Var) {
        self.seeded.push(node);
    }

    /// The seeded op nodes of this pass, in drawing order.
    pub fn seeded(&self) -> &[Var] {
        &self.seeded
    }

    /// The handles of every model tensor, in the `ParamSet`'s order.
    pub fn param_vars(&self) -> &[Var] {
        &self.vars
    }

    /// The dropout masks drawn in this pass, in drawing order.
    pub fn masks(&self) -> &[(Var, f64)] {
        &self.masks
    }

    /// Schedules a new value for a buffer, applied after the step.
    pub fn update_buffer(&mut self, id: ParamId, value: Tensor<S>) {
        self.updates.push((id, value));
    }

    /// Records a batch norm's running-statistics update (already scheduled by
    /// `update_buffer`) so a traced pass can redo it each step.
    pub fn note_running_stats(&mut self, running: RunningStats) {
        self.running.push(running);
    }

    /// The running-statistics updates of this pass, in the order they were scheduled.
    pub fn running_stats(&self) -> &[RunningStats] {
        &self.running
    }

    /// The buffer updates this pass scheduled.
    pub fn into_updates(self) -> Vec<(ParamId, Tensor<S>)> {
        self.updates
    }
}
