//! The eager backend: each step resets one session, records the forward pass and the loss on its
//! tape, and runs the executed sweep (`backward_all`) for the parameters' gradients. In anomaly
//! mode the session's tape checks every value it records and every backward contribution. Asked
//! for factored gradients, it records the weights of linears that read the batch as constants
//! and hands each one's gradient as its linear's cotangent and the batch (`Grad::Outer`); in
//! anomaly mode it also multiplies those out to check them.

use super::{outer_product_user, record_loss, Backend, BackendKind, StepOutput};
use crate::data::Batch;
use crate::error::NnResult;
use crate::grad::Grad;
use crate::layers::{Ctx, Mode};
use crate::model::Model;
use crate::params::ParamKind;
use crate::rng::dropout_rng;
use rand_chacha::ChaCha8Rng;
use tapegrad_core::graph::tape_kept_bytes;
use tapegrad_core::Error;
use tapegrad_core::Session;
use tapegrad_tensor::{Scalar, Shape, Tensor};

/// Records every step on a session tape.
pub struct Eager<S> {
    session: Session<S>,
    kept_bytes: usize,
    detect_anomaly: bool,
    factored: bool,
    label_smoothing: f64,
    /// The batch shape last stepped with factored gradients and the trainable tensors (indices in
    /// the `ParamSet`) whose gradients were factored for it.
    outer: Option<(Shape, Vec<usize>)>,
}

/// How a step with some weights recorded as constants ended.
enum Attempt<S> {
    Done(StepOutput<S>),
    /// The recorded pass did not use these weights as expected: the step must be retaken
    /// with only `Retry`'s weights as constants (the dense step when empty).
    Retry(Vec<usize>),
    /// This step's gradients must be dense; the weights stay constants for later steps.
    Dense,
}

impl<S: Scalar> Eager<S> {
    /// A backend with a fresh session.
    pub fn new() -> Self {
        Eager {
            session: Session::new(),
            kept_bytes: 0,
            detect_anomaly: false,
            factored: false,
            label_smoothing: 0.0,
            outer: None,
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
        let x = &batch.x;
        if !self.factored {
            return self.dense_step(model, batch, rng, None);
        }
        let mut constants = match &self.outer {
            Some((shape, list)) if shape == x.shape() => list.clone(),
            // First try: every trainable matrix the batch's rows could be multiplied by.
            _ => model
                .params
                .iter()
                .enumerate()
                .filter(|(_, p)| {
                    p.kind == ParamKind::Trainable
                        && p.value.rank() == 2
                        && p.value.dims().get(1) == x.dims().last()
                })
                .map(|(i, _)| i)
                .collect(),
        };
        loop {
            self.outer = Some((x.shape().clone(), constants.clone()));
            if constants.is_empty() {
                return self.dense_step(model, batch, rng, None);
            }
            match self.outer_step(model, batch, rng.clone(), &constants)? {
                Attempt::Done(out) if self.detect_anomaly && !products_finite(&out.grads)? => {
                    // The one gradient the tape did not check went non-finite: the dense step
                    // makes the same product on the tape, which names the node.
                    return self.dense_step(model, batch, rng, None);
                }
                Attempt::Done(out) => return Ok(out),
                Attempt::Retry(fewer) => constants = fewer,
                Attempt::Dense => return self.dense_step(model, batch, rng, None),
            }
        }
    }

    fn train_step_observed(
        &mut self,
        model: &Model<S>,
        batch: &Batch<S>,
        rng: ChaCha8Rng,
        on_final: &mut dyn FnMut(usize, &Tensor<S>),
    ) -> NnResult<StepOutput<S>> {
        if self.factored {
            let out = self.train_step(model, batch, rng)?;
            super::tell_after(&out.grads, on_final)?;
            return Ok(out);
        }
        self.dense_step(model, batch, rng, Some(on_final))
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

    fn set_factored_grads(&mut self, on: bool) {
        self.factored = on;
    }

    fn set_label_smoothing(&mut self, smoothing: f64) {
        self.label_smoothing = smoothing;
    }

    fn set_detect_anomaly(&mut self, on: bool) {
        self.detect_anomaly = on;
        // The flag lives on the session's tape and survives `reset`.
        self.session.set_detect_anomaly(on);
    }
}

/// Whether every factored gradient of `grads` multiplies out to finite values. Anomaly mode
/// checks these products (made by linear's kernel, as the dense step's are) because the tape never
/// makes them, and hands the factors on, so a healthy run steps as it does without the flag.
fn products_finite<S: Scalar>(grads: &[Grad<S>]) -> NnResult<bool> {
    for g in grads {
        if let Grad::Outer { .. } = g {
            if g.clone().into_dense()?.first_non_finite().is_some() {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

impl<S: Scalar> Eager<S> {
    /// The step with every gradient dense: the executed sweep at the parameters, telling
    /// `on_final` each gradient as soon as it is final (`Backend::train_step_observed`).
    fn dense_step(
        &mut self,
        model: &Model<S>,
        batch: &Batch<S>,
        rng: ChaCha8Rng,
        on_final: Option<super::OnGrad<'_, S>>,
    ) -> NnResult<StepOutput<S>> {
        self.session.reset();
        let mut ctx = Ctx::new(&mut self.session, &model.params, Mode::Train, rng)?;
        let x = ctx.session().input(batch.x.clone());
        let out = model.forward(&mut ctx, x)?;
        let loss = record_loss(ctx.session(), out, &batch.y, self.label_smoothing)?;
        let outputs = ctx.session().value(out)?.clone();
        let loss_value = ctx.session().value(loss)?.item()?.to_f64();
        let kept_bytes = tape_kept_bytes(ctx.session().tape());
        let grads: Vec<Tensor<S>> = match on_final {
            None => ctx
                .session()
                .backward(loss)?
                .into_vec()
                .into_iter()
                .map(|(_, g)| g)
                .collect(),
            Some(tell) => {
                // `Session::backward`'s sweep (the seed 1, the trainable tensors' ids in order),
                // observed.
                let (ids, shapes): (Vec<usize>, Vec<&Shape>) = ctx
                    .param_vars()
                    .iter()
                    .zip(model.params.iter())
                    .filter(|(_, p)| p.kind == ParamKind::Trainable)
                    .map(|(v, p)| (v.id(), p.value.shape()))
                    .unzip();
                let seed = Tensor::ones(ctx.session().value(loss)?.shape());
                let tape = ctx.session().tape();
                tape.backward_at_observed(loss.id(), &seed, &ids, &mut |j, g| match g {
                    Some(g) => tell(j, g),
                    None => tell(j, &Tensor::zeros(shapes[j])),
                })?
            }
        };
        let updates = ctx.into_updates();
        self.kept_bytes = kept_bytes;
        // Drop the tape's references to the parameters, so the optimizer updates them in place.
        self.session.reset();
        Ok(StepOutput {
            loss: loss_value,
            outputs,
            grads: grads.into_iter().map(Grad::Dense).collect(),
            updates,
        })
    }

    /// The step with the trainable tensors at `constants` recorded as constants, each of which
    /// must be the weight of a linear that reads the batch: its gradient is then `Grad::Outer`
    /// of that linear's final cotangent and the batch, the two factors its VJP would have
    /// multiplied. Should a weight be used otherwise, or a linear's cotangent be all
    /// zeros (the sweep may have skipped it, and then the dense gradient is zeros, not the
    /// product), the step is retaken.
    fn outer_step(
        &mut self,
        model: &Model<S>,
        batch: &Batch<S>,
        rng: ChaCha8Rng,
        constants: &[usize],
    ) -> NnResult<Attempt<S>> {
        self.session.reset();
        let mut ctx = Ctx::with_constants(&mut self.session, &model.params, rng, constants)?;
        let x = ctx.session().input(batch.x.clone());
        let out = model.forward(&mut ctx, x)?;
        let loss = record_loss(ctx.session(), out, &batch.y, self.label_smoothing)?;
        let vars = ctx.param_vars().to_vec();
        let updates = ctx.into_updates();
        let tape = self.session.tape();
        let linears: Vec<Option<usize>> = constants
            .iter()
            .map(|&i| {
                outer_product_user(tape.nodes(), vars[i].id(), x.id())
                    .filter(|&id| tape.nodes()[id].requires_grad)
            })
            .collect();
        if linears.iter().any(Option::is_none) {
            let fewer = constants
                .iter()
                .zip(&linears)
                .filter(|(_, l)| l.is_some())
                .map(|(&i, _)| i)
                .collect();
            self.session.reset();
            return Ok(Attempt::Retry(fewer));
        }
        let outputs = self.session.value(out)?.clone();
        let loss_value = self.session.value(loss)?.item()?.to_f64();
        let kept_bytes = tape_kept_bytes(self.session.tape());
        let seed = Tensor::ones(self.session.value(loss)?.shape());
        let trainable: Vec<usize> = model
            .params
            .iter()
            .enumerate()
            .filter(|(_, p)| p.kind == ParamKind::Trainable)
            .map(|(i, _)| i)
            .collect();
        let dense_ids = trainable
            .iter()
            .filter(|i| !constants.contains(i))
            .map(|&i| vars[i].id());
        let ids: Vec<usize> = dense_ids.chain(linears.iter().flatten().copied()).collect();
        let mut dense = self.session.tape().backward_at(loss.id(), &seed, &ids)?;
        let cotangents = dense.split_off(ids.len() - constants.len());
        if cotangents
            .iter()
            .any(|c| c.data().iter().all(|&v| v == S::ZERO))
        {
            self.session.reset();
            return Ok(Attempt::Dense);
        }
        self.kept_bytes = kept_bytes;
        // Drop the tape's references to the parameters, so the optimizer updates them in place.
        self.session.reset();
        let mut dense = dense.into_iter();
        let mut cotangents = cotangents.into_iter();
        // Sized up front: a collect through `Option` grows from 4 to 8 slots of 144 bytes.
        let mut grads = Vec::with_capacity(trainable.len());
        for i in &trainable {
            let grad = match constants.contains(i) {
                true => cotangents.next().map(|rows| Grad::Outer {
                    rows,
                    cols: batch.x.clone(),
                }),
                false => dense.next().map(Grad::Dense),
            };
            grads.push(
                grad.ok_or_else(|| {
                    Error::invalid("eager", "the sweep returned too few gradients")
                })?,
            );
        }
        Ok(Attempt::Done(StepOutput {
            loss: loss_value,
            outputs,
            grads,
            updates,
        }))
    }
}
