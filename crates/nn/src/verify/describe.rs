//! Names a tape node for a report: its id, op and name, and the parameters or inputs it reads
//! (the nearest named leaves above it), so a failure points at a layer, not only at an id.

use tapegrad_core::tape::Rule;
use tapegrad_core::Tape;
use tapegrad_tensor::Scalar;

/// How far up the parents to look for the leaves a node reads.
const MAX_DEPTH: usize = 8;

/// What a leaf is, by tape id: `parameter 0.weight`, `the batch`, `a dropout mask`.
pub type LeafLabels = [(usize, String)];

/// `node 12 (relu, shape [32, 64]) reading parameter 0.weight, parameter 0.bias, the batch`; a
/// leaf is named by itself. `labels` says what leaves are (unlabelled ones are named by the
/// tape's name or as constants).
pub fn describe_node<S: Scalar>(tape: &Tape<S>, id: usize, labels: &LeafLabels) -> String {
    let Some(node) = tape.nodes().get(id) else {
        return format!("node {id} (not on the tape)");
    };
    if matches!(node.rule, Rule::Leaf) {
        return format!("{} (leaf {id})", leaf_label(tape, id, labels));
    }
    let name = node
        .name
        .as_deref()
        .map(|n| format!(" '{n}'"))
        .unwrap_or_default();
    let reads = nearest_leaves(tape, id, labels);
    let reads = match reads.is_empty() {
        true => String::new(),
        false => format!(" reading {}", reads.join(", ")),
    };
    format!(
        "node {id}{name} ({}, shape {}){reads}",
        node.op_name(),
        node.value.shape()
    )
}

fn leaf_label<S: Scalar>(tape: &Tape<S>, id: usize, labels: &LeafLabels) -> String {
    if let Some((_, label)) = labels.iter().find(|(l, _)| *l == id) {
        return label.clone();
    }
    match tape.name(id) {
        Some(name) => format!("parameter {name}"),
        None => format!("constant {id}"),
    }
}

/// The labelled or named leaves at the smallest depth above `id` that has any.
fn nearest_leaves<S: Scalar>(tape: &Tape<S>, id: usize, labels: &LeafLabels) -> Vec<String> {
    let nodes = tape.nodes();
    let mut frontier = vec![id];
    let mut seen = vec![id];
    for _ in 0..MAX_DEPTH {
        let mut next = Vec::new();
        let mut found = Vec::new();
        for &n in &frontier {
            for &p in nodes[n].parents.iter() {
                if seen.contains(&p) || p >= nodes.len() {
                    continue;
                }
                seen.push(p);
                let leaf = matches!(nodes[p].rule, Rule::Leaf);
                let known = tape.name(p).is_some() || labels.iter().any(|(l, _)| *l == p);
                if leaf && known {
                    found.push(leaf_label(tape, p, labels));
                } else if !leaf {
                    next.push(p);
                }
            }
        }
        if !found.is_empty() || next.is_empty() {
            return found;
        }
        frontier = next;
    }
    Vec::new()
}
