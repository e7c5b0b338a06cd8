//! The saved graph (compiled mode). A `CompiledGraph` is built once from a graph; each `forward`
//! runs one pass in which every node keeps only what its op's `saves()` declared (a `Record`)
//! and drops each value after its last use. The resulting `SavedGraph` has a dense
//! backward equal to `backprop_all` bit for bit, and an inputs-only backward that frees each
//! intermediate's cotangent and saved tensors as soon as its node has run.

use super::backprop::accumulate;
use super::graph::CONTEXT;
use super::recompute::Recompute;
use super::record::{give_back_records, spare_records, Record};
use super::Graph;
use crate::ops::{Aux, Forward, Op, Saved, VjpContext};
use crate::tape::finals::{Finals, NoWatch, OnFinal, Watch};
use crate::tape::{Rule, Tape};
use crate::{Error, Result};
use smallvec::SmallVec;
use std::sync::Arc;
use tapegrad_tensor::{Scalar, Shape, Tensor};

/// What is fixed about a graph across batches: the graph, which slots require grad, which
/// arguments of each node need a contribution, the last node reading each slot, and each node's
/// argument shapes (which the records then need not copy).
#[derive(Debug, Clone)]
struct Plan {
    graph: Graph,
    requires_grad: Vec<bool>,
    /// Per node: whether each argument requires grad (the inputs-only backward computes only those).
    needs: Vec<Vec<bool>>,
    /// Per node: every argument needs a contribution (the dense backward's needs).
    all_needed: Vec<Vec<bool>>,
    /// Per node: its arguments' shapes.
    arg_shapes: Vec<Vec<Shape>>,
    /// Per slot: the last node that reads it, if any.
    last_use: Vec<Option<usize>>,
    /// Per slot: the first node that reads it, if any (the backward's last).
    first_use: Vec<Option<usize>>,
    /// What inputs-only passes recompute in the backward instead of keeping.
    recompute: Recompute,
}

impl Plan {
    /// The context node `k`'s VJP reads from its record, with `needs`.
    fn context<'a, S: Scalar>(
        &'a self,
        k: usize,
        record: &'a Record<S>,
        needs: &'a [bool],
    ) -> VjpContext<'a, S> {
        let node = &self.graph.nodes()[k];
        record.context(&self.arg_shapes[k], &node.shape, needs)
    }
}

/// A graph prepared for running many batches in compiled mode.
#[derive(Debug, Clone)]
pub struct CompiledGraph {
    plan: Arc<Plan>,
}

/// One forward execution: per node, the tensors its VJP declared, plus the final node's value.
#[derive(Debug, Clone)]
pub struct SavedGraph<S> {
    plan: Arc<Plan>,
    records: Vec<Record<S>>,
    output: Tensor<S>,
    /// The records keep only what the inputs-only backward reads
    /// ([`CompiledGraph::forward_for_input_grads`]), so the dense backward cannot run.
    input_grads_only: bool,
}

/// How a forward pass runs: validating each node first, keeping every value (for comparing with
/// `Graph::eval`), keeping only what the inputs-only backward reads.
#[derive(Debug, Clone, Copy, Default)]
struct Pass {
    checked: bool,
    keep_values: bool,
    input_grads_only: bool,
}

/// A forward pass and the context it left (values freed after their last use are `None`).
type PassWithContext<S> = (SavedGraph<S>, Vec<Option<Tensor<S>>>);

/// The inputs' gradients (`None` where an input needs none) and the cotangents asked to be kept.
type GradsAndKept<S> = (Vec<Option<Tensor<S>>>, Vec<Tensor<S>>);

impl CompiledGraph {
    /// Prepares `graph` for compiled execution.
    pub fn new(graph: Graph) -> Self {
        let requires_grad = graph.requires_grad();
        let needs: Vec<Vec<bool>> = graph
            .nodes()
            .iter()
            .map(|n| n.args.iter().map(|&a| requires_grad[a]).collect())
            .collect();
        let mut last_use = vec![None; graph.slots()];
        let mut first_use = vec![None; graph.slots()];
        for (k, n) in graph.nodes().iter().enumerate() {
            for &a in &n.args {
                last_use[a] = Some(k);
                first_use[a].get_or_insert(k);
            }
        }
        let all_needed = graph.nodes().iter().map(|n| vec![true; n.args.len()]);
        let recompute = Recompute::plan(&graph, &requires_grad, &needs);
        // Every argument is an earlier slot of a valid graph, so each has a shape.
        let arg_shapes = graph.nodes().iter().map(|n| {
            n.args
                .iter()
                .filter_map(|&a| graph.shape(a).ok())
                .cloned()
                .collect()
        });
        CompiledGraph {
            plan: Arc::new(Plan {
                requires_grad,
                needs,
                all_needed: all_needed.collect(),
                arg_shapes: arg_shapes.collect(),
                last_use,
                first_use,
                recompute,
                graph,
            }),
        }
    }

    /// The graph this was built from.
    pub fn graph(&self) -> &Graph {
        &self.plan.graph
    }

    /// Replaces a node's op by one with other attributes and the same shapes (see
    /// [`Graph::set_op`]), e.g. the class labels of the next batch. Passes already run keep theirs.
    pub fn set_op(&mut self, slot: usize, op: crate::ops::Op) -> Result<()> {
        let plan = Arc::make_mut(&mut self.plan);
        let n_in = plan.graph.inputs().len();
        let old = slot
            .checked_sub(n_in)
            .and_then(|k| plan.graph.nodes().get(k))
            .map(|n| (n.op.saves(), n.op.recomputable()));
        let new = (op.saves(), op.recomputable());
        plan.graph.set_op(slot, op)?;
        // Attributes that change what the op keeps or recomputes change the plan.
        if old != Some(new) {
            plan.recompute = Recompute::plan(&plan.graph, &plan.requires_grad, &plan.needs);
        }
        Ok(())
    }

    /// One forward pass keeping only what each node's VJP needs; values are dropped after their
    /// last use, except the last slot's, which is the output.
    pub fn forward<S: Scalar>(&self, inputs: &[Tensor<S>]) -> Result<SavedGraph<S>> {
        Ok(self.run(inputs, Pass::default())?.0)
    }

    /// As [`CompiledGraph::forward`] for a pass that will only run an inputs-only backward
    /// ([`SavedGraph::backward`], `backward_seeded`, `backward_keeping`): each node keeps only
    /// what the contributions to its arguments that require grad read (`OpRules::saves_for`), and
    /// a node none of whose arguments requires grad keeps nothing. The gradients are those of
    /// `forward`, bit for bit; [`SavedGraph::backward_all`] on such a pass is an error. A first
    /// linear layer whose input needs no gradient, for one, keeps its input but not its weight.
    pub fn forward_for_input_grads<S: Scalar>(
        &self,
        inputs: &[Tensor<S>],
    ) -> Result<SavedGraph<S>> {
        let pass = Pass {
            input_grads_only: true,
            ..Pass::default()
        };
        Ok(self.run(inputs, pass)?.0)
    }

    /// As [`CompiledGraph::forward`], validating each node's domain rules before it runs.
    pub fn forward_checked<S: Scalar>(&self, inputs: &[Tensor<S>]) -> Result<SavedGraph<S>> {
        let pass = Pass {
            checked: true,
            ..Pass::default()
        };
        Ok(self.run(inputs, pass)?.0)
    }

    /// The forward pass that also returns the whole context (every value), for comparing with
    /// `Graph::eval`. Holding the context keeps every value alive, as the eager tape does.
    pub fn forward_with_context<S: Scalar>(
        &self,
        inputs: &[Tensor<S>],
    ) -> Result<(SavedGraph<S>, Vec<Tensor<S>>)> {
        let pass = Pass {
            keep_values: true,
            ..Pass::default()
        };
        let (saved, context) = self.run(inputs, pass)?;
        Ok((saved, context.into_iter().flatten().collect()))
    }

    fn run<S: Scalar>(&self, inputs: &[Tensor<S>], pass: Pass) -> Result<PassWithContext<S>> {
        let Pass {
            checked,
            keep_values,
            input_grads_only,
        } = pass;
        let plan = &self.plan;
        let g = &plan.graph;
        let output_slot = g.last_slot()?;
        g.check_inputs(inputs, "values")?;
        let n_in = g.inputs().len();
        let mut context: Vec<Option<Tensor<S>>> = Vec::with_capacity(g.slots());
        context.extend(inputs.iter().cloned().map(Some));
        let mut records = spare_records(g.nodes().len());
        for (k, node) in g.nodes().iter().enumerate() {
            if !checked && !keep_values {
                if let Some(value) = forward_in_place(plan, k, n_in, output_slot, &mut context) {
                    let forward = Forward::new(value);
                    // The op keeps no argument (checked by `forward_in_place`), so the output
                    // stands in for the one it overwrote, which had its shape.
                    let args = [&forward.value];
                    if input_grads_only {
                        let needs = &plan.needs[k];
                        let saves = plan.recompute.saves(k, node.op.saves_for(needs));
                        Record::keep_onto(&mut records, saves, &args, &forward, needs);
                    } else {
                        let needs = &plan.all_needed[k];
                        Record::keep_onto(&mut records, node.op.saves(), &args, &forward, needs);
                    }
                    context.push(Some(forward.value));
                    continue;
                }
            }
            let args = node
                .args
                .iter()
                .map(|&a| context[a].as_ref().ok_or_else(|| dropped(g, a)))
                .collect::<Result<SmallVec<[&Tensor<S>; 4]>>>()?;
            let forward = g.run_node(k, &args, checked)?;
            // The dense backward must equal `backprop_all`, which gives every argument a
            // contribution; the inputs-only backward narrows `needs` when it runs, and a pass
            // for it alone keeps only what those contributions read.
            if input_grads_only {
                let needs = &plan.needs[k];
                let saves = plan.recompute.saves(k, node.op.saves_for(needs));
                Record::keep_onto(&mut records, saves, &args, &forward, needs);
            } else {
                let needs = &plan.all_needed[k];
                Record::keep_onto(&mut records, node.op.saves(), &args, &forward, needs);
            }
            // Ends the arguments' borrow of the context, updated next.
            drop(args);
            context.push(Some(forward.value));
            if !keep_values {
                for &a in &node.args {
                    if plan.last_use[a] == Some(k) && a != output_slot {
                        context[a] = None;
                    }
                }
                if plan.last_use[n_in + k].is_none() && n_in + k != output_slot {
                    context[n_in + k] = None;
                }
            }
        }
        let output = context[output_slot]
            .clone()
            .ok_or_else(|| dropped(g, output_slot))?;
        Ok((
            SavedGraph {
                plan: self.plan.clone(),
                records,
                output,
                input_grads_only,
            },
            context,
        ))
    }
}

impl<S: Scalar> SavedGraph<S> {
    /// The value of the last slot.
    pub fn output(&self) -> &Tensor<S> {
        &self.output
    }

    /// The graph this pass ran.
    pub fn graph(&self) -> &Graph {
        &self.plan.graph
    }

    /// The auxiliary data node `k` (counted among the graph's nodes, inputs excluded) kept from
    /// this pass (`Aux::None` where none was kept): batch norm's batch statistics, for one, which
    /// the compiled trainer turns into running statistics as the eager one does from its tape.
    pub fn aux(&self, k: usize) -> Result<&Aux<S>> {
        self.records.get(k).map(|r| &r.aux).ok_or_else(|| {
            Error::invalid(
                "saved graph",
                format!("no node {k}: the graph has {} nodes", self.records.len()),
            )
        })
    }

    /// Bytes held for backward per node, in graph order: each node's kept buffers that no
    /// earlier node kept (so the entries sum to [`SavedGraph::kept_bytes`] without the output),
    /// to see which ops hold a pass's memory.
    pub fn kept_bytes_by_node(&self) -> Vec<usize> {
        let mut seen = std::collections::HashSet::new();
        self.records
            .iter()
            .map(|r| {
                let mut mine = Distinct::default();
                mine.kept(&r.inputs, r.output.as_ref(), &r.aux);
                mine.buffers.retain(|&(key, _)| seen.insert(key));
                mine.bytes()
            })
            .collect()
    }

    /// Bytes held for backward: distinct buffers among the saved tensors, auxiliary data and
    /// the output (a buffer kept by several nodes counts once).
    pub fn kept_bytes(&self) -> usize {
        self.kept_bytes_with(None)
    }

    /// As [`SavedGraph::kept_bytes`], also counting what `more` keeps: the record of an op run
    /// on this pass's output outside the graph, such as a training step's loss (a buffer it
    /// shares with the pass counts once).
    pub fn kept_bytes_with(&self, more: Option<&Saved<S>>) -> usize {
        let mut seen = Distinct::default();
        seen.tensor(&self.output);
        for r in &self.records {
            seen.kept(&r.inputs, r.output.as_ref(), &r.aux);
        }
        if let Some(r) = more {
            seen.kept(&r.inputs, r.output.as_ref(), &r.aux);
        }
        seen.bytes()
    }

    /// Per-slot cotangents for a full seed: exactly `Graph::backprop_all` (same VJPs on the same
    /// cotangents, same additions in the same order), so the results are identical bit for bit.
    pub fn backward_all(&self, seed: Vec<Tensor<S>>) -> Result<Vec<Tensor<S>>> {
        let g = &self.plan.graph;
        if self.input_grads_only {
            return Err(Error::invalid(
                CONTEXT,
                "this pass kept only what the inputs' gradients read \
                 (forward_for_input_grads); run forward for the dense backward",
            ));
        }
        g.check_seed(&seed)?;
        let n_in = g.inputs().len();
        let mut acc = seed;
        for k in (0..g.nodes().len()).rev() {
            let node = &g.nodes()[k];
            let contributions = node
                .op
                .vjp(
                    &self
                        .plan
                        .context(k, &self.records[k], &self.plan.all_needed[k]),
                    &acc[n_in + k],
                )
                .map_err(|e| Error::from(e).at_node(g.node_label(k)))?;
            for (&arg, c) in node.args.iter().zip(contributions) {
                if let Some(c) = c {
                    accumulate(&mut acc[arg], &c);
                }
            }
        }
        Ok(acc)
    }

    /// Gradients of the inputs that require grad (`None` for the others) for a seed at the last
    /// slot, consuming the pass: each node's saved tensors and cotangent are freed as soon as it
    /// has run, and nodes that do not require grad are skipped. Equals the input block of
    /// `backprop_all` for the one-hot seed: every non-zero element bit for bit; a zero may differ
    /// in sign only, because the first contribution into a slot is stored rather than added to
    /// zero (`0 + (-0)` is `+0`), which saves a pass over every gradient.
    pub fn backward(self, seed: &Tensor<S>) -> Result<Vec<Option<Tensor<S>>>> {
        let seeds = self.seeds_at_output(seed)?;
        self.backward_seeded(seeds)
    }

    /// One seed per slot: `seed` at the last slot (its shape checked against the output's),
    /// `None` (zeros) elsewhere.
    fn seeds_at_output(&self, seed: &Tensor<S>) -> Result<Vec<Option<Tensor<S>>>> {
        let g = &self.plan.graph;
        let out = g.last_slot()?;
        let shape = g.shape(out)?;
        if seed.shape() != shape {
            return Err(Error::invalid(
                CONTEXT,
                format!(
                    "the seed has shape {}, but the output has shape {shape}",
                    seed.shape()
                ),
            )
            .at_node(format!("'{}'", g.name(out)?)));
        }
        let mut seeds: Vec<Option<Tensor<S>>> = vec![None; g.slots()];
        seeds[out] = Some(seed.clone());
        Ok(seeds)
    }

    /// As [`SavedGraph::backward`], also returning the final cotangent of each slot in `keep`
    /// (the one its node's VJP is called on; zeros where nothing reached it, as that VJP sees),
    /// in `keep`'s order. A slot that does not require grad, or is an input, has no such
    /// cotangent: an error.
    pub fn backward_keeping(self, seed: &Tensor<S>, keep: &[usize]) -> Result<GradsAndKept<S>> {
        self.keeping(seed, keep, &mut NoWatch)
    }

    /// As [`SavedGraph::backward_keeping`], also calling `on_final(slot, g)` once for every
    /// input slot that requires grad as soon as its gradient is final, while the backward goes
    /// on: once the first node reading it has run. `g` is the gradient then (`None` for zeros),
    /// which the backward no longer changes, so the result holds the same bits.
    pub fn backward_keeping_observed(
        self,
        seed: &Tensor<S>,
        keep: &[usize],
        on_final: OnFinal<'_, S>,
    ) -> Result<GradsAndKept<S>> {
        let plan = self.plan.clone();
        let leaves = (0..plan.graph.inputs().len())
            .filter(|&s| plan.requires_grad[s])
            .map(|s| (s, plan.first_use[s], s));
        self.keeping(seed, keep, &mut Finals::new(leaves, on_final))
    }

    /// `backward_keeping`, telling `watch`.
    fn keeping(
        self,
        seed: &Tensor<S>,
        keep: &[usize],
        watch: &mut impl Watch<S>,
    ) -> Result<GradsAndKept<S>> {
        let seeds = self.seeds_at_output(seed)?;
        let g = &self.plan.graph;
        let n_in = g.inputs().len();
        for &slot in keep {
            if slot < n_in || slot >= g.slots() || !self.plan.requires_grad[slot] {
                return Err(Error::invalid(
                    CONTEXT,
                    format!("slot {slot} is not a node that requires grad, so it has no cotangent to keep"),
                ));
            }
        }
        let mut kept = vec![None; keep.len()];
        let grads = self.run_backward(seeds, keep, &mut kept, watch)?;
        let kept = kept
            .into_iter()
            .map(|t| t.ok_or_else(|| Error::invalid(CONTEXT, "a kept cotangent was never reached")))
            .collect::<Result<_>>()?;
        Ok((grads, kept))
    }

    /// As [`SavedGraph::backward`] for a seed per slot, where `None` stands for zeros. Every node
    /// that requires grad runs its VJP, on a zero cotangent if nothing reached it, as the
    /// reference does.
    pub fn backward_seeded(self, seeds: Vec<Option<Tensor<S>>>) -> Result<Vec<Option<Tensor<S>>>> {
        self.run_backward(seeds, &[], &mut [], &mut NoWatch)
    }

    /// The inputs-only backward; node `keep[i]`'s final cotangent is also stored in `kept[i]`.
    /// `watch` is told before each node (by node index) and at the end; it only reads the slots.
    fn run_backward(
        self,
        seeds: Vec<Option<Tensor<S>>>,
        keep: &[usize],
        kept: &mut [Option<Tensor<S>>],
        watch: &mut impl Watch<S>,
    ) -> Result<Vec<Option<Tensor<S>>>> {
        let SavedGraph {
            plan,
            mut records,
            input_grads_only,
            ..
        } = self;
        let g = &plan.graph;
        if seeds.len() != g.slots() {
            return Err(Error::GradCount {
                context: CONTEXT,
                expected: g.slots(),
                found: seeds.len(),
            });
        }
        for (slot, s) in seeds.iter().enumerate() {
            if let Some(s) = s {
                let shape = g.shape(slot)?;
                if s.shape() != shape {
                    return Err(Error::invalid(
                        CONTEXT,
                        format!(
                            "the seed for slot {slot} has shape {}, but the slot has shape {shape}",
                            s.shape()
                        ),
                    )
                    .at_node(format!("'{}'", g.name(slot)?)));
                }
            }
        }
        let n_in = g.inputs().len();
        let mut acc = seeds;
        if records.len() != g.nodes().len() {
            return Err(Error::invalid(
                CONTEXT,
                format!(
                    "the pass kept {} records for {} nodes",
                    records.len(),
                    g.nodes().len()
                ),
            ));
        }
        for k in (0..g.nodes().len()).rev() {
            watch.before(k, &acc);
            let slot = n_in + k;
            let cot = acc[slot].take();
            // Node k's record is the last one left (nodes run last to first). It is read where
            // it lies (moving a record of a few hundred bytes out would copy it per node) and
            // freed by truncating the list as soon as the node has run, or here when it won't:
            // nothing reads it again.
            if !plan.requires_grad[slot] {
                records.truncate(k);
                continue;
            }
            // Only a pass for input gradients leaves recomputed values out of its records.
            if input_grads_only && plan.recompute.reads_recomputed(k) {
                plan.recompute.restore(g, k, &mut records)?;
            }
            let Some(record) = records.get(k) else {
                return Err(
                    Error::invalid(CONTEXT, "the saved record was already freed")
                        .at_node(g.node_label(k)),
                );
            };
            let node = &g.nodes()[k];
            let cot = cot.unwrap_or_else(|| Tensor::zeros(&node.shape));
            for (&want, out) in keep.iter().zip(kept.iter_mut()) {
                if want == slot {
                    *out = Some(cot.clone());
                }
            }
            let cot = match vjp_in_place(&node.op, &plan.needs[k], record, cot) {
                Ok(c) => {
                    records.truncate(k);
                    add_contribution(&mut acc[node.args[0]], c);
                    continue;
                }
                Err(cot) => cot,
            };
            let ctx = plan.context(k, record, &plan.needs[k]);
            let contributions = node
                .op
                .vjp(&ctx, &cot)
                .map_err(|e| Error::from(e).at_node(g.node_label(k)))?;
            drop(cot);
            records.truncate(k);
            for ((&arg, c), &needed) in node.args.iter().zip(contributions).zip(&plan.needs[k]) {
                if let (Some(c), true) = (c, needed) {
                    add_contribution(&mut acc[arg], c);
                }
            }
        }
        watch.end(&acc);
        give_back_records(records);
        acc.truncate(n_in);
        Ok(acc
            .into_iter()
            .zip(g.inputs())
            .map(|(a, x)| {
                x.requires_grad
                    .then(|| a.unwrap_or_else(|| Tensor::zeros(&x.shape)))
            })
            .collect())
    }
}

/// Adds a contribution into an argument's cotangent slot (`existing + c`, existing on the left).
fn add_contribution<S: Scalar>(slot: &mut Option<Tensor<S>>, c: Tensor<S>) {
    match slot {
        Some(existing) => accumulate(existing, &c),
        // Stored as is: the dense pass's `0 + c` would only turn a -0 into +0, and rewriting
        // every first contribution costs a pass over it.
        empty => *empty = Some(c),
    }
}

/// Whether `op` keeps, for its VJP, its output and none of its arguments: what the in-place
/// hooks (`OpRules::forward_in_place`, `vjp_in_place`) ask of the ops that have them.
fn keeps_only_its_output(op: &Op) -> bool {
    let saves = op.saves();
    saves.output && !saves.keeps_input(0)
}

/// Node `k`'s value written over its one argument's buffer by the op's `forward_in_place`
/// hook, when that argument is an intermediate value no later node reads (typically a linear
/// layer's output, which linear does not keep) and has the output's shape: the value is then
/// made without allocating. `None`, the context untouched, for any other node.
fn forward_in_place<S: Scalar>(
    plan: &Plan,
    k: usize,
    n_in: usize,
    output_slot: usize,
    context: &mut [Option<Tensor<S>>],
) -> Option<Tensor<S>> {
    let node = &plan.graph.nodes()[k];
    let &[a] = node.args.as_slice() else {
        return None;
    };
    if a < n_in || a == output_slot || plan.last_use[a] != Some(k) {
        return None;
    }
    if !keeps_only_its_output(&node.op) || plan.graph.shape(a).ok() != Some(&node.shape) {
        return None;
    }
    let mut value = context[a].take()?;
    if node.op.forward_in_place(&mut value) {
        Some(value)
    } else {
        context[a] = Some(value);
        None
    }
}

/// The contribution to a one-argument node's argument written over its cotangent's own buffer
/// (which nothing else reads once the node has run) by the op's `vjp_in_place` hook, from the
/// saved output. Gives the cotangent back untouched when the op has no such hook, keeps more
/// than its output, or its argument needs no gradient, so the op's own VJP runs.
fn vjp_in_place<S: Scalar>(
    op: &Op,
    needs: &[bool],
    record: &Record<S>,
    mut cot: Tensor<S>,
) -> std::result::Result<Tensor<S>, Tensor<S>> {
    match &record.output {
        Some(y) if needs == [true] && keeps_only_its_output(op) => {
            if op.vjp_in_place(y, &mut cot) {
                Ok(cot)
            } else {
                Err(cot)
            }
        }
        _ => Err(cot),
    }
}

/// The error for a value the forward pass freed too early (a broken plan, never user input).
fn dropped(g: &Graph, slot: usize) -> Error {
    Error::invalid(
        CONTEXT,
        format!("slot {slot} was freed before its last use"),
    )
    .at_node(format!("'{}'", g.name(slot).unwrap_or("?")))
}

/// Bytes of the distinct buffers among `tensors` (clones sharing a buffer count once).
pub fn distinct_bytes<'a, S: Scalar + 'a>(
    tensors: impl IntoIterator<Item = &'a Tensor<S>>,
) -> usize {
    let mut seen = Distinct::default();
    for t in tensors {
        seen.tensor(t);
    }
    seen.bytes()
}

/// Bytes an eager tape holds after its forward pass: every node value plus what each node saved
/// for its VJP, distinct buffers counted once.
pub fn tape_kept_bytes<S: Scalar>(tape: &Tape<S>) -> usize {
    let mut seen = Distinct::default();
    for node in tape.nodes() {
        seen.tensor(&node.value);
        // What a node's VJP reads besides its aux data are node values, counted here already.
        if let Rule::Op { saved, .. } = &node.rule {
            seen.aux(saved.aux());
        }
    }
    seen.bytes()
}

/// Buffers seen while counting kept bytes, each counted once. Both backends count every step,
/// so this sorts a list of keys once at the end rather than hashing each tensor into a set.
#[derive(Default)]
struct Distinct {
    /// (buffer key, bytes) per tensor seen, duplicates included.
    buffers: Vec<((usize, usize), usize)>,
    /// Bytes of aux data that is not tensors (indices), never shared.
    other: usize,
}

impl Distinct {
    fn tensor<S: Scalar>(&mut self, t: &Tensor<S>) {
        // A one-element tensor holds its element itself, so its clones share no buffer address:
        // they are told apart by value instead (equal scalars then count once).
        let key = match t.data() {
            [v] => (v.to_f64().to_bits() as usize, 1),
            data => (data.as_ptr() as usize, t.numel()),
        };
        if t.numel() > 0 {
            self.buffers.push((key, t.nbytes()));
        }
    }

    /// What a record keeps: its kept arguments, output and aux data.
    fn kept<S: Scalar>(
        &mut self,
        inputs: &[Option<Tensor<S>>],
        output: Option<&Tensor<S>>,
        aux: &Aux<S>,
    ) {
        for t in inputs.iter().flatten().chain(output) {
            self.tensor(t);
        }
        self.aux(aux);
    }

    fn aux<S: Scalar>(&mut self, aux: &Aux<S>) {
        match aux {
            Aux::Tensors(ts) => ts.iter().for_each(|t| self.tensor(t)),
            other => self.other += other.nbytes(),
        }
    }

    /// The total: each key's bytes once (equal keys have equal bytes: the key holds the length).
    fn bytes(mut self) -> usize {
        self.buffers.sort_unstable_by_key(|&(key, _)| key);
        self.buffers.dedup_by_key(|&mut (key, _)| key);
        self.other + self.buffers.iter().map(|&(_, b)| b).sum::<usize>()
    }
}
