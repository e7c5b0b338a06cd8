//! `Recorded`: one training-loss evaluation of a model on a tape (forward pass and loss), with
//! which leaves are trainable parameters, buffers, the batch and dropout masks. Every law
//! checker here takes one, so any model that records its forward on a `Session` can be checked.

use super::describe::{describe_node, LeafLabels};
use crate::backend::record_loss;
use crate::data::Batch;
use crate::error::NnResult;
use crate::layers::{Ctx, Mode};
use crate::model::Model;
use crate::params::ParamKind;
use rand_chacha::ChaCha8Rng;
use tapegrad_core::{Session, Tape, Var};
use tapegrad_tensor::{Scalar, Tensor};

/// A loss recorded on a tape, and what its leaves are.
pub struct Recorded<S: Scalar> {
    session: Session<S>,
    /// Tape id of the model's output.
    pub output: usize,
    /// Tape id of the loss (the last node).
    pub loss: usize,
    /// The trainable parameters' names and leaf ids, in the model's order.
    pub params: Vec<(String, usize)>,
    /// What each known leaf is (parameters, buffers, the batch, masks), for reports.
    pub labels: Vec<(usize, String)>,
}

impl<S: Scalar> Recorded<S> {
    /// Records `model` on `batch` in `mode` (training: batch statistics, dropout masks drawn from
    /// `rng`, as the step with that stream draws them) and the task's loss. Buffer updates the
    /// pass schedules are dropped: recording changes nothing in the model.
    pub fn model(
        model: &Model<S>,
        batch: &Batch<S>,
        mode: Mode,
        rng: ChaCha8Rng,
        label_smoothing: f64,
    ) -> NnResult<Self> {
        let mut session = Session::new();
        // `tracing` records in either mode; in training mode it is `Ctx::new`.
        let mut ctx = Ctx::tracing(&mut session, &model.params, mode, rng)?;
        let x = ctx.session().input(batch.x.clone());
        let out = model.forward(&mut ctx, x)?;
        let loss = record_loss(ctx.session(), out, &batch.y, label_smoothing)?;
        let vars = ctx.param_vars().to_vec();
        let masks: Vec<Var> = ctx.masks().iter().map(|&(v, _)| v).collect();
        drop(ctx.into_updates());
        let mut params = Vec::new();
        let mut labels = vec![(x.id(), "the batch".to_string())];
        for (p, v) in model.params.iter().zip(&vars) {
            let trainable = p.kind == ParamKind::Trainable;
            if trainable {
                params.push((p.name.clone(), v.id()));
            }
            let kind = if trainable { "parameter" } else { "buffer" };
            labels.push((v.id(), format!("{kind} {}", p.name)));
        }
        labels.extend(masks.iter().map(|m| (m.id(), "a dropout mask".to_string())));
        Ok(Recorded {
            session,
            output: out.id(),
            loss: loss.id(),
            params,
            labels,
        })
    }

    /// A loss some other front-end recorded on `session`: `output` is the model's output,
    /// `loss` the last node, `params` the trainable leaves by name; `labels` name other leaves.
    pub fn from_session(
        session: Session<S>,
        output: Var,
        loss: Var,
        params: Vec<(String, Var)>,
        labels: Vec<(Var, String)>,
    ) -> Self {
        let params: Vec<(String, usize)> = params.into_iter().map(|(n, v)| (n, v.id())).collect();
        let mut all: Vec<(usize, String)> = params
            .iter()
            .map(|(n, id)| (*id, format!("parameter {n}")))
            .collect();
        all.extend(labels.into_iter().map(|(v, l)| (v.id(), l)));
        Recorded {
            session,
            output: output.id(),
            loss: loss.id(),
            params,
            labels: all,
        }
    }

    /// The tape.
    pub fn tape(&self) -> &Tape<S> {
        self.session.tape()
    }

    /// The loss value.
    pub fn loss_value(&self) -> NnResult<f64> {
        Ok(self.tape().value(self.loss)?.item()?.to_f64())
    }

    /// The seed of the loss: ones of its shape.
    pub fn seed(&self) -> NnResult<Tensor<S>> {
        Ok(Tensor::ones(self.tape().value(self.loss)?.shape()))
    }

    /// Names tape node `id` for a report.
    pub fn describe(&self, id: usize) -> String {
        describe_node(self.tape(), id, self.leaf_labels())
    }

    /// What the known leaves are.
    pub fn leaf_labels(&self) -> &LeafLabels {
        &self.labels
    }
}
