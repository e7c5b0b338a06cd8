//! Backends: how a training step's loss and gradients are computed. `Eager` records every step on
//! a fresh session tape; `Compiled` builds the model's graph once per batch size and runs its
//! saved graph each step. Both implement `Backend`, so the trainer does not know which one runs and a
//! new backend is one new file here.

mod compiled;
mod eager;

pub use compiled::Compiled;
pub use eager::Eager;

use crate::data::{Batch, BatchTargets};
use crate::error::NnResult;
use crate::grad::Grad;
use crate::model::Model;
use crate::params::ParamId;
use rand_chacha::ChaCha8Rng;
use tapegrad_core::graph::CompiledGraph;
use tapegrad_core::ops::linalg::Linear;
use tapegrad_core::ops::loss::{CrossEntropy, MseLoss};
use tapegrad_core::ops::{class_labels, LinalgOp, LossOp, Reduction};
use tapegrad_core::tape::{Node, Rule};
use tapegrad_core::{Error, Result};
use tapegrad_core::{Op, Session, Var};
use tapegrad_tensor::{Scalar, Shape, Tensor};

/// Which backend runs the steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Eager,
    Compiled,
}

impl BackendKind {
    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Eager => "eager",
            BackendKind::Compiled => "compiled",
        }
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "eager" => Ok(BackendKind::Eager),
            "compiled" => Ok(BackendKind::Compiled),
            other => Err(format!(
                "unknown backend '{other}' (expected eager or compiled)"
            )),
        }
    }
}

/// What one training step computed.
#[derive(Debug, Clone)]
pub struct StepOutput<S> {
    /// The mean loss of the batch.
    pub loss: f64,
    /// The model's outputs on the batch.
    pub outputs: Tensor<S>,
    /// One gradient per trainable tensor, in the model's order; dense unless the backend was
    /// asked for factored gradients (`Backend::set_factored_grads`).
    pub grads: Vec<Grad<S>>,
    /// New buffer values (running statistics) from the forward pass.
    pub updates: Vec<(ParamId, Tensor<S>)>,
}

/// Computes losses, gradients and predictions for a model.
pub trait Backend<S: Scalar> {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// Forward in training mode, loss, backward. `rng` is the step's dropout stream.
    fn train_step(
        &mut self,
        model: &Model<S>,
        batch: &Batch<S>,
        rng: ChaCha8Rng,
    ) -> NnResult<StepOutput<S>>;
    /// As `train_step`, also calling `on_final(j, g)` once for every trainable tensor `j` (its
    /// index among the trainable tensors) with its dense gradient `g`, the bits `grads[j]` then
    /// holds: as soon as the backward has made it final, while it goes on, where the backend can
    /// tell (a data-parallel step starts exchanging gradients then). The default tells them all,
    /// last first, after the step.
    fn train_step_observed(
        &mut self,
        model: &Model<S>,
        batch: &Batch<S>,
        rng: ChaCha8Rng,
        on_final: &mut dyn FnMut(usize, &Tensor<S>),
    ) -> NnResult<StepOutput<S>> {
        let out = self.train_step(model, batch, rng)?;
        tell_after(&out.grads, on_final)?;
        Ok(out)
    }
    /// Bytes the last `train_step` kept for its backward pass (values and saved tensors, each
    /// buffer once); 0 before the first step.
    fn kept_bytes(&self) -> usize;
    /// Forward in eval mode: the model's outputs for `x`.
    fn infer(&mut self, model: &Model<S>, x: &Tensor<S>) -> NnResult<Tensor<S>>;
    /// Anomaly mode: the first NaN or infinity a step makes becomes an `Error::Anomaly` naming the
    /// node that made it (see `tapegrad_core::tape` anomaly mode). Off by default; off, it costs
    /// one branch per step.
    fn set_detect_anomaly(&mut self, on: bool);
    /// Whether a step may hand the weight gradient of a linear layer that reads the batch as its
    /// two factors (`Grad::Outer`: the layer's output cotangent and the batch) instead of
    /// multiplying it out, for `Optimizer::step_grads` to apply without writing it. Off by
    /// default: every gradient dense. Only worth it for plain SGD (any other rule multiplies the
    /// factors out again). For a one-row batch the parameters keep the dense step's bits; for
    /// more rows plain SGD's fused GEMM update rounds differently from the dense step (within a
    /// few roundings, see `Optimizer::step_grads`), the same way on both backends, which still
    /// agree bit for bit. A step that cannot hand the factors over (the weight is used another
    /// way, an all-zero cotangent) hands the dense gradient. Anomaly mode multiplies the factors
    /// out to check them but hands them on, so the flag does not change a healthy run.
    fn set_factored_grads(&mut self, on: bool);
    /// Cross entropy's `label_smoothing` for classification steps (0, the default, is none).
    fn set_label_smoothing(&mut self, smoothing: f64);
    /// The saved graph a training step on `batch` runs, with its inputs for the dropout stream
    /// `rng`, for `--verify-every` to check law 4 on; `None` (the default) for a backend that
    /// records a tape each step.
    fn step_graph(
        &mut self,
        _model: &Model<S>,
        _batch: &Batch<S>,
        _rng: ChaCha8Rng,
    ) -> NnResult<Option<StepGraph<'_, S>>> {
        Ok(None)
    }
}

/// What `Backend::train_step_observed` tells: `(trainable index, final dense gradient)`.
pub type OnGrad<'a, S> = &'a mut dyn FnMut(usize, &Tensor<S>);

/// `Backend::train_step_observed`'s fallback: every gradient of a finished step, last first.
fn tell_after<S: Scalar>(
    grads: &[Grad<S>],
    on_final: &mut dyn FnMut(usize, &Tensor<S>),
) -> NnResult<()> {
    for (j, g) in grads.iter().enumerate().rev() {
        match g {
            Grad::Dense(t) => on_final(j, t),
            factored => on_final(j, &factored.clone().into_dense()?),
        }
    }
    Ok(())
}

/// A backend's saved graph and its inputs for one step. Its slots are named `in{id}` and
/// `n{id}` after the tape ids of the same pass recorded on a session (`verify::tape_id_of`).
pub struct StepGraph<'a, S> {
    pub graph: &'a CompiledGraph,
    pub inputs: Vec<Tensor<S>>,
}

/// A backend of the chosen kind.
pub fn make_backend<S: Scalar>(kind: BackendKind) -> NnResult<Box<dyn Backend<S>>> {
    Ok(match kind {
        BackendKind::Eager => Box::new(Eager::new()),
        BackendKind::Compiled => Box::new(Compiled::<S>::new()?),
    })
}

/// The task's loss on outputs of shape `out`: the op (MSE against values, cross entropy against
/// classes with `label_smoothing`, 0 for none) and MSE's targets, its second argument, which needs
/// no gradient. Both backends run this one op: the eager one records it on its tape
/// (`record_loss`), the compiled one evaluates it and its VJP on the saved pass's output.
pub(crate) fn loss_op<S: Scalar>(
    out: &Shape,
    y: &BatchTargets<S>,
    label_smoothing: f64,
) -> Result<(Op, Option<Tensor<S>>)> {
    Ok(match y {
        BatchTargets::Values(t) => {
            if out != t.shape() {
                return Err(Error::from(tapegrad_core::OpError::ShapeMismatch {
                    op: "mse_loss",
                    expected: Box::new(t.shape().clone()),
                    found: Box::new(out.clone()),
                }));
            }
            let mse = LossOp::MseLoss(MseLoss {
                reduction: Reduction::Mean,
            });
            (Op::Loss(mse), Some(t.clone()))
        }
        // What `Session::cross_entropy_with` records; with no smoothing, what `cross_entropy` does.
        BatchTargets::Classes(labels) => {
            let cross_entropy = LossOp::CrossEntropy(CrossEntropy {
                targets: class_labels(labels),
                reduction: Reduction::Mean,
                weight: None,
                ignore_index: None,
                label_smoothing,
            });
            (Op::Loss(cross_entropy), None)
        }
    })
}

/// Records the task's loss (`loss_op`) on `out`.
pub fn record_loss<S: Scalar>(
    session: &mut Session<S>,
    out: Var,
    y: &BatchTargets<S>,
    label_smoothing: f64,
) -> Result<Var> {
    let (op, target) = loss_op(session.value(out)?.shape(), y, label_smoothing)?;
    match target {
        Some(t) => {
            let target = session.constant(t);
            session.apply(op, &[out, target])
        }
        None => session.apply(op, &[out]),
    }
}

/// The tape id of the node through which weight `w`'s whole gradient is `rows^T cols` of that
/// node's cotangent and the batch: `w`'s only use is as the weight of a linear with a bias whose
/// input is the batch (leaf `x_id`), of any number of rows. `None` when the model uses `w` any
/// other way.
pub(crate) fn outer_product_user<S: Scalar>(
    nodes: &[Node<S>],
    w: usize,
    x_id: usize,
) -> Option<usize> {
    let mut users = nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| n.parents.contains(&w));
    let (id, node) = users.next()?;
    let is_linear = matches!(
        &node.rule,
        Rule::Op {
            op: Op::Linalg(LinalgOp::Linear(Linear { bias: true })),
            ..
        }
    );
    let wired = node.parents.len() == 3
        && node.parents[0] == x_id
        && node.parents[1] == w
        && node.parents[2] != w;
    (users.next().is_none() && is_linear && wired).then_some(id)
}
