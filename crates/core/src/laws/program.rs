//! `Program`: a replayable straight-line program over a context (inputs first, then one slot per
//! node, each reading earlier slots). Random programs built from every op drive the law tests of the
//! tape and of the graph IR alike.

use super::registry::{self, is_generic, OpKind};
use crate::graph::Graph;
use crate::ops::Op;
use crate::tape::Tape;
use crate::{Error, OpError, Result};
use rand::Rng;
use tapegrad_tensor::{Scalar, Tensor};

/// One node of a program: an op and the context slots it reads.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramNode {
    pub op: Op,
    /// Context slots: `0..inputs.len()` are inputs, `inputs.len() + k` is node k. Each is below
    /// this node's own slot.
    pub args: Vec<usize>,
}

/// A straight-line program with typed inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    pub inputs: Vec<Tensor<f64>>,
    pub requires_grad: Vec<bool>,
    pub nodes: Vec<ProgramNode>,
}

impl Program {
    /// Number of context slots (inputs plus nodes).
    pub fn slots(&self) -> usize {
        self.inputs.len() + self.nodes.len()
    }

    /// Records the program on a fresh tape in `S` with the given input values; slot k is tape id k.
    pub fn record<S: Scalar>(&self, inputs: &[Tensor<S>]) -> Result<Tape<S>> {
        let mut tape = Tape::with_capacity(self.slots());
        for (x, &rg) in inputs.iter().zip(&self.requires_grad) {
            tape.leaf(x.clone(), rg);
        }
        for node in &self.nodes {
            tape.apply(node.op.clone(), &node.args)?;
        }
        Ok(tape)
    }

    /// The program as a graph: inputs `x0, x1, ...`, nodes `v0, v1, ...`.
    pub fn to_graph(&self) -> Result<Graph> {
        let mut g = Graph::new();
        for (i, x) in self.inputs.iter().enumerate() {
            let rg = self.requires_grad.get(i).copied().unwrap_or(false);
            g.input(format!("x{i}"), x.shape().clone(), rg)?;
        }
        for (k, node) in self.nodes.iter().enumerate() {
            g.node(format!("v{k}"), node.op.clone(), &node.args)?;
        }
        Ok(g)
    }

    /// Records the program at its own (f64) input values.
    pub fn record_f64(&self) -> Result<Tape<f64>> {
        self.record(&self.inputs)
    }
}

impl Program {
    /// The same program at other input values (same wiring, same attributes).
    pub fn with_inputs(&self, inputs: Vec<Tensor<f64>>) -> Program {
        Program {
            inputs,
            requires_grad: self.requires_grad.clone(),
            nodes: self.nodes.clone(),
        }
    }

    /// Forward evaluation at `inputs` without a tape: the whole context (inputs, then one value
    /// per node).
    pub fn eval<S: Scalar>(&self, inputs: &[Tensor<S>]) -> Result<Vec<Tensor<S>>> {
        let mut ctx: Vec<Tensor<S>> = inputs.to_vec();
        for node in &self.nodes {
            let args = node
                .args
                .iter()
                .map(|&a| {
                    ctx.get(a).ok_or(Error::BadId {
                        context: node.op.name(),
                        id: a,
                        len: ctx.len(),
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let value = node.op.forward(&args)?.value;
            ctx.push(value);
        }
        Ok(ctx)
    }

    /// `<seed, slot out>` of the program evaluated at `inputs`: the objective whose gradient with
    /// respect to the inputs is `backward_all(out, seed)` restricted to the leaves.
    pub fn objective(&self, inputs: &[Tensor<f64>], out: usize, seed: &Tensor<f64>) -> Result<f64> {
        let ctx = self.eval(inputs)?;
        let value = ctx.get(out).ok_or(Error::BadId {
            context: "objective",
            id: out,
            len: ctx.len(),
        })?;
        if value.shape() != seed.shape() {
            return Err(Error::from(OpError::ShapeMismatch {
                op: "objective",
                expected: Box::new(value.shape().clone()),
                found: Box::new(seed.shape().clone()),
            }));
        }
        Ok(value
            .data()
            .iter()
            .zip(seed.data())
            .map(|(v, s)| v * s)
            .sum())
    }
}

/// How `random_program` draws programs.
#[derive(Debug, Clone)]
pub struct ProgramConfig {
    /// Upper bound on the number of nodes (the count is drawn in `1..=max_nodes`).
    pub max_nodes: usize,
    /// Probability that an argument reuses an earlier slot (fan-out) instead of a fresh input.
    pub reuse: f64,
    /// Probability that a fresh input does not require grad.
    pub no_grad: f64,
    /// The kinds of op drawn from; every registered kind by default.
    pub kinds: Vec<OpKind>,
}

impl Default for ProgramConfig {
    fn default() -> Self {
        ProgramConfig {
            max_nodes: 8,
            reuse: 0.7,
            no_grad: 0.2,
            kinds: OpKind::ALL.to_vec(),
        }
    }
}

/// Where a draft slot's value comes from while a program is being built.
enum Source {
    Input { requires_grad: bool },
    Node(ProgramNode),
}

/// A random program at a generic point of every node (see `registry::is_generic`): random ops of
/// `config.kinds` with random attributes and shapes, wired as a DAG in which arguments reuse earlier
/// slots (an input or a node may feed several nodes, twice into one node, on either side of a
/// broadcast), and fresh inputs of which some do not require grad. Kinds whose forward pass fails
/// (an unimplemented op) are never placed.
pub fn random_program<R: Rng + ?Sized>(rng: &mut R, config: &ProgramConfig) -> Program {
    let mut slots: Vec<(Tensor<f64>, Source)> = Vec::new();
    let fresh_input = |value: Tensor<f64>, slots: &mut Vec<(Tensor<f64>, Source)>, rng: &mut R| {
        let requires_grad = !rng.random_bool(config.no_grad);
        slots.push((value, Source::Input { requires_grad }));
        slots.len() - 1
    };
    let target = rng.random_range(1..=config.max_nodes.max(1));
    let mut placed = 0;
    let mut attempts = 0;
    while placed < target && attempts < 40 * target && !config.kinds.is_empty() {
        attempts += 1;
        let kind = config.kinds[rng.random_range(0..config.kinds.len())];
        let variant = rng.random_range(0..registry::variants(kind).len());
        // The first argument: usually an earlier slot (the latest half the time, for depth).
        let primary = (!slots.is_empty() && rng.random_bool(config.reuse)).then(|| {
            if rng.random_bool(0.5) {
                slots.len() - 1
            } else {
                rng.random_range(0..slots.len())
            }
        });
        let case = match primary {
            Some(p) => registry::draft(kind, variant, slots[p].0.shape(), rng),
            None => registry::draft_any(kind, variant, rng),
        };
        let Some(case) = case else { continue };
        if !is_generic(&case.op, &case.inputs.iter().collect::<Vec<_>>()) {
            continue;
        }
        // Each argument: an earlier slot of the right shape where the point stays generic,
        // otherwise the draft's own value as a fresh input.
        let mut chosen: Vec<Option<usize>> = vec![None; case.inputs.len()];
        for i in 0..case.inputs.len() {
            let candidate = if i == 0 && primary.is_some() {
                primary
            } else if rng.random_bool(config.reuse) {
                let same: Vec<usize> = (0..slots.len())
                    .filter(|&s| slots[s].0.shape() == case.inputs[i].shape())
                    .collect();
                (!same.is_empty()).then(|| same[rng.random_range(0..same.len())])
            } else {
                None
            };
            let Some(c) = candidate else { continue };
            let mut trial = chosen.clone();
            trial[i] = Some(c);
            let args: Vec<&Tensor<f64>> = trial
                .iter()
                .zip(&case.inputs)
                .map(|(s, own)| s.map_or(own, |s| &slots[s].0))
                .collect();
            if is_generic(&case.op, &args) {
                chosen = trial;
            }
        }
        let args: Vec<usize> = chosen
            .into_iter()
            .zip(case.inputs)
            .map(|(s, own)| s.unwrap_or_else(|| fresh_input(own, &mut slots, rng)))
            .collect();
        let values: Vec<&Tensor<f64>> = args.iter().map(|&a| &slots[a].0).collect();
        let Ok(out) = case.op.forward(&values) else {
            continue;
        };
        slots.push((out.value, Source::Node(ProgramNode { op: case.op, args })));
        placed += 1;
    }
    if slots.is_empty() {
        let value = registry::random_values(rng);
        fresh_input(value, &mut slots, rng);
    }
    renumber(slots)
}

/// Puts the inputs first (in creation order) and the nodes after them, remapping arguments. Nodes
/// only read earlier slots, and every input moves earlier, so the order stays topological.
fn renumber(slots: Vec<(Tensor<f64>, Source)>) -> Program {
    let mut new_id = vec![0; slots.len()];
    let inputs_count = slots
        .iter()
        .filter(|(_, s)| matches!(s, Source::Input { .. }))
        .count();
    let (mut next_input, mut next_node) = (0, inputs_count);
    for (old, (_, source)) in slots.iter().enumerate() {
        let slot = match source {
            Source::Input { .. } => &mut next_input,
            Source::Node(_) => &mut next_node,
        };
        new_id[old] = *slot;
        *slot += 1;
    }
    let mut program = Program {
        inputs: Vec::with_capacity(inputs_count),
        requires_grad: Vec::with_capacity(inputs_count),
        nodes: Vec::with_capacity(slots.len() - inputs_count),
    };
    for (value, source) in slots {
        match source {
            Source::Input { requires_grad } => {
                program.inputs.push(value);
                program.requires_grad.push(requires_grad);
            }
            Source::Node(mut node) => {
                node.args.iter_mut().for_each(|a| *a = new_id[*a]);
                program.nodes.push(node);
            }
        }
    }
    program
}
