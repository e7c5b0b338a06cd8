//! Which values a training pass (`forward_for_input_grads`) recomputes in its backward instead of
//! keeping: the output of a cheap op (`OpRules::recomputable`, such as layer norm or GELU) that
//! one later node would keep for its VJP is left out of that node's record and made again from
//! the cheap op's own record just before that VJP runs. The same op on the same arguments gives
//! the same bits, so the gradients are unchanged while the pass keeps less.

use super::record::Record;
use super::Graph;
use crate::ops::{Aux, Saves};
use crate::{Error, Result};
use smallvec::SmallVec;
use tapegrad_tensor::{Scalar, Tensor};

/// The recomputation plan of a graph, fixed with its needs.
#[derive(Debug, Clone)]
pub(super) struct Recompute {
    /// Per node: arguments its record keeps beyond its op's `saves_for` (a recomputed op keeps
    /// every argument its forward reads), as a mask of argument positions.
    keep_more: Vec<u64>,
    /// Per node: arguments its record leaves out because they are recomputed, as a mask.
    keep_less: Vec<u64>,
}

impl Recompute {
    /// Plans what `graph`'s inputs-only passes recompute, for nodes whose arguments need
    /// contributions as `needs` says. A node's value is recomputed when its op allows it, its
    /// own record outlives the one node that keeps the value (it requires grad), its record can
    /// hold every argument its forward reads at no cost (they are kept already or are graph
    /// inputs, which live anyway), it does not keep its output itself (the reader would share
    /// that buffer), it is not the output, and no recomputed node reads it (that one's record
    /// keeps it anyway).
    pub(super) fn plan(graph: &Graph, requires_grad: &[bool], needs: &[Vec<bool>]) -> Self {
        let nodes = graph.nodes();
        let n_in = graph.inputs().len();
        let output = graph.slots().checked_sub(1);
        let saves: Vec<Saves> = nodes
            .iter()
            .zip(needs)
            .map(|(n, needs)| match needs.iter().any(|&x| x) {
                true => n.op.saves_for(needs),
                false => Saves::NOTHING,
            })
            .collect();
        // Per slot: the (node, argument position) pairs whose records keep it.
        let mut keepers: Vec<SmallVec<[(usize, usize); 2]>> = vec![SmallVec::new(); graph.slots()];
        for (k, node) in nodes.iter().enumerate() {
            for (j, &a) in node.args.iter().enumerate() {
                if saves[k].keeps_input(j) {
                    keepers[a].push((k, j));
                }
            }
        }
        let mut keep_more = vec![0u64; nodes.len()];
        let mut keep_less = vec![0u64; nodes.len()];
        let mut pinned = vec![false; graph.slots()];
        // Last to first, so a recomputed reader pins its arguments before they are considered.
        for (p, node) in nodes.iter().enumerate().rev() {
            let slot = n_in + p;
            let candidate = !pinned[slot]
                && Some(slot) != output
                && requires_grad[slot]
                && !saves[p].output
                && node.args.len() <= 64
                && node.op.recomputable();
            let readers = &keepers[slot];
            let Some(&(reader, _)) = readers.first() else {
                continue;
            };
            if !candidate || readers.iter().any(|&(k, _)| k != reader) {
                continue;
            }
            let missing: u64 = (0..node.args.len())
                .filter(|&j| !saves[p].keeps_input(j))
                .fold(0, |m, j| m | 1 << j);
            let costly = node
                .args
                .iter()
                .enumerate()
                .any(|(j, &a)| missing & (1 << j) != 0 && a >= n_in);
            if costly {
                continue;
            }
            keep_more[p] = missing;
            for &(k, j) in readers {
                keep_less[k] |= 1 << j;
            }
            for &a in &node.args {
                pinned[a] = true;
            }
        }
        Recompute {
            keep_more,
            keep_less,
        }
    }

    /// What node `k`'s record keeps in an inputs-only pass, given its op's `saves_for`.
    pub(super) fn saves(&self, k: usize, saves: Saves) -> Saves {
        let (more, less) = (self.keep_more[k], self.keep_less[k]);
        Saves {
            inputs: (saves.inputs | more) & !less,
            output: saves.output,
        }
    }

    /// Whether node `k` reads a recomputed value.
    pub(super) fn reads_recomputed(&self, k: usize) -> bool {
        self.keep_less[k] != 0
    }

    /// Recomputes, into node `k`'s record, each argument it left out: the producing node's op
    /// run again on the arguments its record kept (`records` holds node `k`'s record and every
    /// earlier one). Aux data the recomputation made is kept on the producer's record when it
    /// has none, for its own VJP to read.
    pub(super) fn restore<S: Scalar>(
        &self,
        graph: &Graph,
        k: usize,
        records: &mut [Record<S>],
    ) -> Result<()> {
        let n_in = graph.inputs().len();
        let node = &graph.nodes()[k];
        if k >= records.len() {
            return Err(Error::invalid(
                super::graph::CONTEXT,
                "the saved record was already freed",
            )
            .at_node(graph.node_label(k)));
        }
        let (earlier, rest) = records.split_at_mut(k);
        let record = &mut rest[0];
        let mut last: Option<(usize, Tensor<S>)> = None;
        for (j, &a) in node.args.iter().enumerate() {
            if j >= 64 || self.keep_less[k] & (1 << j) == 0 {
                continue;
            }
            let value = match &last {
                Some((slot, value)) if *slot == a => value.clone(),
                _ => {
                    let p = a
                        .checked_sub(n_in)
                        .filter(|&p| p < k)
                        .ok_or_else(|| not_recomputable(graph, a))?;
                    let producer = &mut earlier[p];
                    let args = producer
                        .inputs
                        .iter()
                        .map(|t| t.as_ref().ok_or_else(|| not_recomputable(graph, a)))
                        .collect::<Result<SmallVec<[&Tensor<S>; 4]>>>()?;
                    let forward = graph.nodes()[p]
                        .op
                        .recompute(&args)
                        .map_err(|e| Error::from(e).at_node(graph.node_label(p)))?;
                    drop(args);
                    if matches!(producer.aux, Aux::None) {
                        producer.aux = forward.aux;
                    }
                    forward.value
                }
            };
            if let Some(slot) = record.inputs.get_mut(j) {
                *slot = Some(value.clone());
            }
            last = Some((a, value));
        }
        Ok(())
    }
}

/// The error for a recomputation whose arguments were not kept (a broken plan, never user input).
fn not_recomputable(graph: &Graph, slot: usize) -> Error {
    Error::invalid(
        super::graph::CONTEXT,
        format!("slot {slot} cannot be recomputed: its node did not keep its arguments"),
    )
    .at_node(format!("'{}'", graph.name(slot).unwrap_or("?")))
}
