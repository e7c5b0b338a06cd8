//! A recorded tape as a graph: every leaf becomes an input (requiring grad as the leaf does,
//! holding the leaf's value, so a dropout mask stays the mask the step drew), every op node a
//! node, in tape order. Forward mode (`Graph::jvp`), f64 re-evaluation and laws 3 and 4 run on
//! it; slot names `in{id}` and `n{id}` keep the tape ids for reports.

use super::Recorded;
use crate::error::{NnError, NnResult};
use tapegrad_core::graph::Graph;
use tapegrad_core::tape::Rule;
use tapegrad_tensor::{Scalar, Tensor};

/// A graph made from a recorded tape, with its inputs' values.
pub struct TapeGraph<S> {
    pub graph: Graph,
    /// One value per graph input: its leaf's value.
    pub inputs: Vec<Tensor<S>>,
    /// The tape id of each slot.
    pub tape_ids: Vec<usize>,
}

impl<S: Scalar> TapeGraph<S> {
    /// The graph of `rec`'s tape up to and including its loss node.
    pub fn new(rec: &Recorded<S>) -> NnResult<Self> {
        let nodes = &rec.tape().nodes()[..=rec.loss];
        let mut graph = Graph::new();
        let mut slot_of = vec![usize::MAX; nodes.len()];
        let mut inputs = Vec::new();
        let mut tape_ids = Vec::with_capacity(nodes.len());
        for (id, node) in nodes.iter().enumerate() {
            if matches!(node.rule, Rule::Leaf) {
                slot_of[id] = graph.input(
                    format!("in{id}"),
                    node.value.shape().clone(),
                    node.requires_grad,
                )?;
                inputs.push(node.value.clone());
                tape_ids.push(id);
            }
        }
        for (id, node) in nodes.iter().enumerate() {
            match &node.rule {
                Rule::Leaf => {}
                Rule::Op { op, .. } => {
                    let args: Vec<usize> = node.parents.iter().map(|&p| slot_of[p]).collect();
                    slot_of[id] = graph.node(format!("n{id}"), op.clone(), &args)?;
                    tape_ids.push(id);
                }
                Rule::Custom { label, .. } => {
                    return Err(NnError::Config(format!(
                        "verify: node {id} is the custom rule '{label}', which has no forward mode"
                    )))
                }
            }
        }
        Ok(TapeGraph {
            graph,
            inputs,
            tape_ids,
        })
    }

    /// The graph slot of tape id `id`, if the graph has one.
    pub fn slot(&self, id: usize) -> Option<usize> {
        self.tape_ids.iter().position(|&t| t == id)
    }
}

/// The tape id a slot named `in{id}` or `n{id}` stands for (the naming of `TapeGraph` and of the
/// compiled backend's trace).
pub fn tape_id_of(name: &str) -> Option<usize> {
    name.strip_prefix("in")
        .or_else(|| name.strip_prefix('n'))
        .and_then(|id| id.parse().ok())
}
