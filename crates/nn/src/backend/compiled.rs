//! The compiled backend: the model is traced once per batch size and mode into a `Graph` (one
//! eager forward pass recorded on a tape: leaves become inputs, op nodes become nodes in the same
//! order), compiled to a `CompiledGraph`, and every step runs its saved graph on fresh inputs
//! (parameters, the batch, dropout masks redrawn from the step's stream in trace order). The loss
//! stays outside the graph, because cross entropy carries the labels as an attribute: its op runs
//! forward and VJP on the graph's output, as the eager tape runs its loss node, and the output's
//! cotangent seeds the saved graph's backward. By the laws (saved = graph = executed tape) the
//! gradients, hence the parameters, equal the eager backend's bit for bit. Batch norm's running
//! statistics are redone each step from the batch statistics its node kept in the saved pass, as
//! the eager backend does from its tape, so the buffers match too.
//! A saved graph keeps no per-node tape to watch, so anomaly mode here checks each step's
//! outputs, loss and gradients, and when one is not finite replays the step on an eager tape
//! in anomaly mode (same inputs, same dropout stream, so the same bits) to name the node.

use super::{loss_op, outer_product_user, Backend, BackendKind, Eager, StepGraph, StepOutput};
use crate::data::{Batch, BatchTargets};
use crate::error::{NnError, NnResult};
use crate::grad::Grad;
use crate::layers::{dropout_mask, Ctx, Mode, RunningStats};
use crate::model::Model;
use crate::params::{ParamId, ParamKind};
use crate::rng::dropout_rng;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::cell::Cell;
use tapegrad_core::graph::{CompiledGraph, Graph, SavedGraph};
use tapegrad_core::ops::nn::{IndexTensor, NnOp};
use tapegrad_core::ops::Saved;
use tapegrad_core::tape::Rule;
use tapegrad_core::Error;
use tapegrad_core::{Op, Session};
use tapegrad_tensor::{Scalar, Shape, Tensor};

/// Where a graph input's value comes from each step.
#[derive(Debug, Clone)]
enum Source {
    /// Tensor `i` of the model's `ParamSet`.
    Param(usize),
    /// The batch's features.
    Batch,
    /// A dropout mask of this shape and probability, redrawn each step.
    Mask(Shape, f64),
}

/// A value drawn from the step's dropout stream, in the order the eager pass draws them.
#[derive(Debug, Clone, Copy)]
enum Draw {
    /// The mask of input `sources[i]`.
    Mask(usize),
    /// The `seed` attribute of the attention node at this slot.
    Seed(usize),
}

struct Plan {
    /// The batch's shape (a plan's graph has the shapes of its trace).
    shape: Shape,
    mode: Mode,
    factored: bool,
    graph: CompiledGraph,
    sources: Vec<Source>,
    /// `(param index, linear node slot)` for each weight whose gradient is handed over as the
    /// factors of `rows^T cols`: that node's cotangent and the batch (the weight input requires
    /// no grad here).
    outer: Vec<(usize, usize)>,
    /// Each training-mode batch norm's running update, with the index of its node among the
    /// graph's nodes (whose kept statistics feed it).
    running: Vec<(RunningStats, usize)>,
    /// `(slot, op)` of each embedding whose indices are the batch's values: the op is set to
    /// the step's indices before each pass (a trace would otherwise replay its first batch).
    lookups: Vec<(usize, NnOp)>,
    /// The masks and attention seeds, in drawing order.
    draws: Vec<Draw>,
    /// The bytes a training step keeps for backward, counted on the plan's first step. Every
    /// step of a plan keeps the same tensors, of the same shapes, sharing buffers the same way,
    /// so counting them again each step (a sort of every kept buffer) would only repeat it.
    kept_bytes: Cell<Option<usize>>,
}

/// Runs a compiled (saved) graph each step.
pub struct Compiled<S> {
    session: Session<S>,
    plans: Vec<Plan>,
    detect_anomaly: bool,
    factored: bool,
    label_smoothing: f64,
    kept_bytes: usize,
}

impl<S: Scalar> Compiled<S> {
    /// A backend with no compiled plans yet (they are built on first use).
    pub fn new() -> NnResult<Self> {
        Ok(Compiled {
            session: Session::new(),
            plans: Vec::new(),
            detect_anomaly: false,
            factored: false,
            label_smoothing: 0.0,
            kept_bytes: 0,
        })
    }

    fn plan(&mut self, model: &Model<S>, x: &Tensor<S>, mode: Mode) -> NnResult<usize> {
        let factored = self.factored && mode == Mode::Train;
        if let Some(i) = self
            .plans
            .iter()
            .position(|p| p.shape == *x.shape() && p.mode == mode && p.factored == factored)
        {
            return Ok(i);
        }
        let plan = trace(&mut self.session, model, x, mode, factored)?;
        self.plans.push(plan);
        Ok(self.plans.len() - 1)
    }

    /// The graph inputs of one pass on `x`: parameters, the batch and the masks; the lookups
    /// take the batch's indices and the attention seeds are redrawn, all drawn from `rng` in the
    /// eager pass's order.
    fn inputs(
        plan: &mut Plan,
        model: &Model<S>,
        x: &Tensor<S>,
        rng: &mut ChaCha8Rng,
    ) -> NnResult<Vec<Tensor<S>>> {
        for (slot, op) in &plan.lookups {
            let mut op = op.clone();
            if let NnOp::Embedding(e) = &mut op {
                let rows = plan
                    .graph
                    .graph()
                    .shape(plan.graph.graph().nodes()[slot - plan.sources.len()].args[0])?
                    .dims()[0];
                e.indices = batch_indices(x, rows)?;
            }
            plan.graph.set_op(*slot, Op::Nn(Box::new(op)))?;
        }
        let mut masks: Vec<Option<Tensor<S>>> = vec![None; plan.sources.len()];
        for draw in &plan.draws {
            match *draw {
                Draw::Mask(i) => {
                    if let Source::Mask(shape, p) = &plan.sources[i] {
                        masks[i] = Some(dropout_mask(shape, *p, rng)?);
                    }
                }
                Draw::Seed(slot) => {
                    let k = slot - plan.sources.len();
                    let mut op = plan.graph.graph().nodes()[k].op.clone();
                    if let Op::Nn(nn) = &mut op {
                        match nn.as_mut() {
                            NnOp::ScaledDotProductAttention(a) => a.seed = rng.random(),
                            NnOp::QkvAttention(a) => a.seed = rng.random(),
                            _ => {}
                        }
                    }
                    plan.graph.set_op(slot, op)?;
                }
            }
        }
        let params: Vec<&Tensor<S>> = model.params.iter().map(|p| &p.value).collect();
        plan.sources
            .iter()
            .zip(masks)
            .map(|(s, mask)| {
                Ok(match s {
                    Source::Param(i) => params[*i].clone(),
                    Source::Batch => x.clone(),
                    Source::Mask(..) => mask.ok_or_else(|| {
                        Error::invalid("compiled", "a dropout mask was not drawn")
                    })?,
                })
            })
            .collect()
    }
}

/// The batch's values as embedding indices: whole numbers in `0..rows` (the eager `Embedding`
/// layer's rule, with its message).
fn batch_indices<S: Scalar>(x: &Tensor<S>, rows: usize) -> NnResult<IndexTensor> {
    let mut idx = Vec::with_capacity(x.numel());
    for (i, v) in x.data().iter().enumerate() {
        let f = v.to_f64();
        if f.fract() != 0.0 || f < 0.0 || f >= rows as f64 {
            return Err(Error::invalid(
                "embedding",
                format!("element {i} of the input is {f}, not an index in 0..{rows}"),
            )
            .into());
        }
        idx.push(f as usize);
    }
    Ok(IndexTensor::new(x.dims(), idx)?)
}

/// Records one forward pass of `model` on `x` and turns the tape into a compiled graph.
fn trace<S: Scalar>(
    session: &mut Session<S>,
    model: &Model<S>,
    x: &Tensor<S>,
    mode: Mode,
    factored: bool,
) -> NnResult<Plan> {
    session.reset();
    let mut ctx = Ctx::tracing(session, &model.params, mode, dropout_rng(0, 0))?;
    let xv = ctx.session().input(x.clone());
    let out = model.forward(&mut ctx, xv)?;
    let param_ids: Vec<usize> = ctx.param_vars().iter().map(|v| v.id()).collect();
    let masks: Vec<(usize, f64)> = ctx.masks().iter().map(|&(v, p)| (v.id(), p)).collect();
    let running = ctx.running_stats().to_vec();
    let lookups: Vec<(usize, usize)> = ctx
        .lookups()
        .iter()
        .map(|&(n, s)| (n.id(), s.id()))
        .collect();
    let seeded: Vec<usize> = ctx.seeded().iter().map(|v| v.id()).collect();
    if let Some(&(node, _)) = lookups.iter().find(|&&(_, s)| s != xv.id()) {
        return Err(NnError::Config(format!(
            "the compiled backend cannot trace this model: the embedding at node {node} reads indices computed inside the model; use --backend eager"
        )));
    }
    // Every buffer update must be one a running-statistics record can redo each step.
    if ctx.into_updates().len() != 3 * running.len() {
        return Err(NnError::Config(
            "the compiled backend cannot trace this model: it updates buffers other than batch norm's running statistics; use --backend eager".into(),
        ));
    }
    session.set_grad_enabled(true);
    let tape = session.tape();
    let mut graph = Graph::new();
    let mut slot_of = vec![usize::MAX; out.id() + 1];
    let mut sources = Vec::new();
    // The tape id of each source's leaf.
    let mut sources_at = Vec::new();
    let nodes = &tape.nodes()[..=out.id()];
    let trainable = |i: usize| {
        mode == Mode::Train
            && model
                .params
                .iter()
                .nth(i)
                .is_some_and(|p| p.kind == ParamKind::Trainable)
    };
    // (param index, tape id of its linear node) for the weights handed over factored.
    let outer_ids: Vec<(usize, usize)> = if factored {
        (0..param_ids.len())
            .filter(|&i| trainable(i))
            .filter_map(|i| {
                let node = outer_product_user(nodes, param_ids[i], xv.id())?;
                let bias = nodes[node].parents[2];
                param_ids
                    .iter()
                    .position(|&p| p == bias)
                    .is_some_and(trainable)
                    .then_some((i, node))
            })
            .collect()
    } else {
        Vec::new()
    };
    for (id, node) in nodes.iter().enumerate() {
        if !matches!(node.rule, Rule::Leaf) {
            continue;
        }
        let (source, requires_grad) = if let Some(i) = param_ids.iter().position(|&p| p == id) {
            let outer = outer_ids.iter().any(|&(k, _)| k == i);
            (Source::Param(i), trainable(i) && !outer)
        } else if id == xv.id() {
            (Source::Batch, false)
        } else if let Some(&(_, p)) = masks.iter().find(|&&(m, _)| m == id) {
            (Source::Mask(node.value.shape().clone(), p), false)
        } else {
            return Err(NnError::Config(format!(
                "the compiled backend cannot trace this model: leaf {id} is a constant it cannot recompute"
            )));
        };
        slot_of[id] = graph.input(format!("in{id}"), node.value.shape().clone(), requires_grad)?;
        sources.push(source);
        sources_at.push(id);
    }
    for (id, node) in nodes.iter().enumerate() {
        match &node.rule {
            Rule::Leaf => {}
            Rule::Op { op, .. } => {
                let args: Vec<usize> = node.parents.iter().map(|&p| slot_of[p]).collect();
                slot_of[id] = graph.node(format!("n{id}"), op.clone(), &args)?;
            }
            Rule::Custom { label, .. } => {
                return Err(NnError::Config(format!(
                    "the compiled backend cannot trace the custom rule '{label}' at node {id}"
                )))
            }
        }
    }
    if slot_of[out.id()] + 1 != graph.slots() {
        return Err(Error::invalid(
            "compiled",
            "the model's output is not the last node of its trace",
        )
        .into());
    }
    let n_in = sources.len();
    let mut timed: Vec<(usize, Draw)> = Vec::new();
    for (id, &slot) in slot_of.iter().enumerate().take(nodes.len()) {
        if masks.iter().any(|&(m, _)| m == id) {
            if let Some(i) = sources_at.iter().position(|&leaf| leaf == id) {
                timed.push((id, Draw::Mask(i)));
            }
        } else if seeded.contains(&id) {
            timed.push((id, Draw::Seed(slot)));
        }
    }
    timed.sort_by_key(|&(id, _)| id);
    let lookups = lookups
        .iter()
        .filter_map(|&(node, _)| match &nodes.get(node)?.rule {
            Rule::Op { op: Op::Nn(op), .. } if matches!(**op, NnOp::Embedding(_)) => {
                Some((slot_of[node], (**op).clone()))
            }
            _ => None,
        })
        .collect();
    let running = running
        .into_iter()
        .map(|r| {
            let slot = slot_of.get(r.node.id()).copied().unwrap_or(usize::MAX);
            match slot.checked_sub(n_in) {
                Some(k) if slot != usize::MAX => Ok((r, k)),
                _ => Err(NnError::Config(format!(
                    "the compiled backend cannot trace this model: batch norm output {} is not an op node of its trace",
                    r.node.id()
                ))),
            }
        })
        .collect::<NnResult<Vec<_>>>()?;
    Ok(Plan {
        shape: x.shape().clone(),
        lookups,
        draws: timed.into_iter().map(|(_, d)| d).collect(),
        mode,
        factored,
        graph: CompiledGraph::new(graph),
        sources,
        running,
        kept_bytes: Cell::new(None),
        outer: outer_ids
            .into_iter()
            .map(|(i, node)| (i, slot_of[node]))
            .collect(),
    })
}

impl<S: Scalar> Backend<S> for Compiled<S> {
    fn kind(&self) -> BackendKind {
        BackendKind::Compiled
    }

    fn train_step(
        &mut self,
        model: &Model<S>,
        batch: &Batch<S>,
        rng: ChaCha8Rng,
    ) -> NnResult<StepOutput<S>> {
        self.step(model, batch, rng, None)
    }

    fn train_step_observed(
        &mut self,
        model: &Model<S>,
        batch: &Batch<S>,
        rng: ChaCha8Rng,
        on_final: &mut dyn FnMut(usize, &Tensor<S>),
    ) -> NnResult<StepOutput<S>> {
        self.step(model, batch, rng, Some(on_final))
    }

    fn kept_bytes(&self) -> usize {
        self.kept_bytes
    }

    fn infer(&mut self, model: &Model<S>, x: &Tensor<S>) -> NnResult<Tensor<S>> {
        let i = self.plan(model, x, Mode::Eval)?;
        let inputs = Self::inputs(&mut self.plans[i], model, x, &mut dropout_rng(0, 0))?;
        let plan = &self.plans[i];
        let out = plan
            .graph
            .forward_for_input_grads(&inputs)?
            .output()
            .clone();
        if self.detect_anomaly {
            if let Some((i, v)) = out.first_non_finite() {
                let found = format!("{} at element {i} of the outputs", v.to_f64());
                return Err(replay(found, |eager| eager.infer(model, x).map(|_| ())));
            }
        }
        Ok(out)
    }

    fn set_detect_anomaly(&mut self, on: bool) {
        self.detect_anomaly = on;
    }

    fn set_factored_grads(&mut self, on: bool) {
        self.factored = on;
    }

    fn set_label_smoothing(&mut self, smoothing: f64) {
        self.label_smoothing = smoothing;
    }

    fn step_graph(
        &mut self,
        model: &Model<S>,
        batch: &Batch<S>,
        mut rng: ChaCha8Rng,
    ) -> NnResult<Option<StepGraph<'_, S>>> {
        let i = self.plan(model, &batch.x, Mode::Train)?;
        let plan = &mut self.plans[i];
        let inputs = Self::inputs(plan, model, &batch.x, &mut rng)?;
        Ok(Some(StepGraph {
            graph: &plan.graph,
            inputs,
        }))
    }
}

/// A step's loss: its value and what its VJP read.
struct Loss<S> {
    value: Tensor<S>,
    record: Saved<S>,
}

/// The task's loss on the saved pass's `outputs` and the outputs' cotangent for a seed of ones:
/// the loss op's forward and VJP, which the eager backend's tape runs for its loss node (its
/// first and only contribution to the outputs is stored as is, here too), so the same bits.
fn loss_and_cotangent<S: Scalar>(
    outputs: &Tensor<S>,
    y: &BatchTargets<S>,
    label_smoothing: f64,
) -> NnResult<(Loss<S>, Tensor<S>)> {
    let (op, target) = loss_op(outputs.shape(), y, label_smoothing)?;
    let args: Vec<&Tensor<S>> = std::iter::once(outputs).chain(target.as_ref()).collect();
    let forward = op.forward(&args)?;
    // Only the outputs need a gradient; MSE's targets are a constant.
    let needs = (0..args.len()).map(|i| i == 0);
    let record = Saved::keep(op.saves(), &args, &forward, needs);
    let seed = Tensor::ones(forward.value.shape());
    let dout = op
        .vjp(&record.context(), &seed)?
        .into_iter()
        .next()
        .flatten()
        .ok_or_else(|| Error::invalid("compiled", "the loss gave its input no gradient"))?;
    let loss = Loss {
        value: forward.value,
        record,
    };
    Ok((loss, dout))
}

/// The buffer updates of `plan`'s batch norms from the statistics their nodes kept in `saved`,
/// in the order an eager pass schedules them.
fn running_updates<S: Scalar>(
    plan: &Plan,
    model: &Model<S>,
    saved: &SavedGraph<S>,
) -> NnResult<Vec<(ParamId, Tensor<S>)>> {
    let mut updates = Vec::with_capacity(3 * plan.running.len());
    for (running, k) in &plan.running {
        let stats = running.op.stats_from_aux(saved.aux(*k)?, &running.input)?;
        let value = |id: ParamId| &model.params.get(id).value;
        updates.extend(running.updates(
            &stats,
            [
                value(running.mean),
                value(running.var),
                value(running.tracked),
            ],
        )?);
    }
    Ok(updates)
}

/// Reruns a step on an eager tape in anomaly mode after the saved graph made `found`, and returns
/// the eager report naming the node (or, should the replay stay finite, says so: that would
/// break the law that saved and executed sweeps give the same bits).
fn replay<S: Scalar>(found: String, step: impl FnOnce(&mut Eager<S>) -> NnResult<()>) -> NnError {
    let mut eager = Eager::new();
    eager.set_detect_anomaly(true);
    let note = format!(
        "the compiled backend's step made {found}; replaying it on an eager tape found the node"
    );
    match step(&mut eager) {
        Err(NnError::Engine(e)) => match *e {
            Error::Anomaly(m) => Error::Anomaly(format!("{m} ({note})")).into(),
            other => other.into(),
        },
        Err(other) => other,
        Ok(()) => Error::Anomaly(format!(
            "the compiled backend's step made {found}, but its eager replay in anomaly mode stayed finite (the saved graph and the tape disagree: please report this)"
        ))
        .into(),
    }
}

impl<S: Scalar> Compiled<S> {
    /// `train_step`, telling `on_final` each gradient as soon as it is final where it can
    /// (`Backend::train_step_observed`): during the backward for dense gradients, after the
    /// step when some are factored.
    fn step(
        &mut self,
        model: &Model<S>,
        batch: &Batch<S>,
        mut rng: ChaCha8Rng,
        on_final: Option<super::OnGrad<'_, S>>,
    ) -> NnResult<StepOutput<S>> {
        let replay_rng = self.detect_anomaly.then(|| rng.clone());
        let i = self.plan(model, &batch.x, Mode::Train)?;
        let inputs = Self::inputs(&mut self.plans[i], model, &batch.x, &mut rng)?;
        let plan = &self.plans[i];
        let saved = plan.graph.forward_for_input_grads(&inputs)?;
        let updates = running_updates(plan, model, &saved)?;
        let outputs = saved.output().clone();
        let (loss, dout) = loss_and_cotangent(&outputs, &batch.y, self.label_smoothing)?;
        self.kept_bytes = match plan.kept_bytes.get() {
            Some(n) => n,
            None => {
                let n = saved.kept_bytes_with(Some(&loss.record));
                plan.kept_bytes.set(Some(n));
                n
            }
        };
        let loss_value = loss.value.item()?.to_f64();
        let keep: Vec<usize> = plan.outer.iter().map(|&(_, slot)| slot).collect();
        let (input_grads, mut kept, on_final) = match on_final {
            // Dense gradients: each is told as its input slot becomes final.
            Some(tell) if plan.outer.is_empty() => {
                let trainable: Vec<usize> = (model.params.iter().enumerate())
                    .filter(|(_, p)| p.kind == ParamKind::Trainable)
                    .map(|(k, _)| k)
                    .collect();
                let shape = |j: usize| {
                    model
                        .params
                        .iter()
                        .nth(trainable[j])
                        .map(|p| p.value.shape())
                };
                let mut told = vec![false; trainable.len()];
                let (grads, kept) =
                    saved.backward_keeping_observed(&dout, &keep, &mut |s, g| {
                        let j = match plan.sources.get(s) {
                            Some(Source::Param(k)) => trainable.iter().position(|t| t == k),
                            _ => None,
                        };
                        if let Some(j) = j {
                            told[j] = true;
                            match (g, shape(j)) {
                                (Some(g), _) => tell(j, g),
                                (None, Some(shape)) => tell(j, &Tensor::zeros(shape)),
                                (None, None) => {}
                            }
                        }
                    })?;
                // A tensor the graph does not read has a zero gradient, told last.
                for j in (0..trainable.len()).rev().filter(|&j| !told[j]) {
                    if let Some(shape) = shape(j) {
                        tell(j, &Tensor::zeros(shape));
                    }
                }
                (grads, kept, None)
            }
            later => {
                let (grads, kept) = saved.backward_keeping(&dout, &keep)?;
                (grads, kept, later)
            }
        };
        // An all-zero cotangent makes the eager backend take the dense step (its sweep may have
        // skipped the linear), so here too every factored gradient is multiplied out then, with
        // linear's own kernel: the dense gradients' bits, and the same step as eager's.
        let dense_step = kept.iter().any(|c| c.data().iter().all(|&v| v == S::ZERO));
        // Sized up front: a grown list of a few gradients would already reach the pool's sizes.
        let trainable = model.params.trainable().count();
        let mut grads = Vec::with_capacity(trainable);
        for (k, p) in model.params.iter().enumerate() {
            if p.kind != ParamKind::Trainable {
                continue;
            }
            if let Some(j) = plan.outer.iter().position(|&(i, _)| i == k) {
                // The linear's weight VJP would multiply exactly these two out.
                let rows = std::mem::replace(&mut kept[j], Tensor::scalar(S::ZERO));
                let outer = Grad::Outer {
                    rows,
                    cols: batch.x.clone(),
                };
                grads.push(match dense_step {
                    true => Grad::Dense(outer.into_dense()?),
                    false => outer,
                });
                continue;
            }
            let slot = plan
                .sources
                .iter()
                .position(|s| matches!(s, Source::Param(i) if *i == k));
            let g = slot.and_then(|s| input_grads[s].clone());
            grads.push(Grad::Dense(
                g.unwrap_or_else(|| Tensor::zeros(p.value.shape())),
            ));
        }
        if let Some(rng) = replay_rng {
            let loss_tensor = Tensor::scalar(S::from_f64(loss_value));
            // Factored gradients are multiplied out (linear's kernel: the dense gradients' bits)
            // to be checked, and handed on factored, so the step is the one without the flag.
            let dense = Grad::all_dense(grads.clone())?;
            let checked = [("the outputs", &outputs), ("the loss", &loss_tensor)];
            let named_grads = model
                .params
                .iter()
                .filter(|p| p.kind == ParamKind::Trainable)
                .zip(&dense)
                .map(|(p, g)| (p.name.as_str(), g));
            let found = checked
                .into_iter()
                .chain(named_grads)
                .find_map(|(what, t)| {
                    t.first_non_finite()
                        .map(|(i, v)| format!("{} at element {i} of {what}", v.to_f64()))
                });
            if let Some(found) = found {
                let smoothing = self.label_smoothing;
                return Err(replay(found, |eager| {
                    eager.set_label_smoothing(smoothing);
                    eager.train_step(model, batch, rng).map(|_| ())
                }));
            }
        }
        if let Some(tell) = on_final {
            super::tell_after(&grads, tell)?;
        }
        Ok(StepOutput {
            loss: loss_value,
            outputs,
            grads,
            updates,
        })
    }
}
