//! Anomaly mode: the first NaN or infinity made in forward or backward stops the run with an error
//! naming the node, op, shapes, the offending element, and, in backward, whether a zero cotangent
//! met an infinite local derivative (the masked-branch trap) with its remedy. Off, it costs a branch.

use super::Tape;
use crate::Error;
use tapegrad_tensor::{Scalar, Tensor};

fn describe<S: Scalar>(tape: &Tape<S>, id: usize) -> String {
    match tape.nodes.get(id) {
        Some(n) => {
            let name = tape.name(id).map(|s| format!(" '{s}'")).unwrap_or_default();
            format!("node {id}{name} ({})", n.op_name())
        }
        None => format!("node {id}"),
    }
}

/// Each argument's shape and the node it comes from, so that a parameter is named by its name.
fn shapes<S: Scalar>(tape: &Tape<S>, args: &[usize]) -> String {
    let list: Vec<String> = args
        .iter()
        .filter_map(|&a| {
            let shape = tape.nodes.get(a)?.value.shape();
            Some(format!("{shape} from {}", describe(tape, a)))
        })
        .collect();
    list.join(", ")
}

/// The first non-finite value among what node `id`'s VJP reads (saved arguments, then output).
pub(crate) fn non_finite_saved<S: Scalar>(tape: &Tape<S>, id: usize) -> Option<(usize, f64)> {
    tape.saved_values(id)
        .find_map(|t| t.first_non_finite())
        .map(|(i, v)| (i, v.to_f64()))
}

/// Checks a value about to be appended as node `id` with arguments `args`.
pub(crate) fn check_forward<S: Scalar>(
    tape: &Tape<S>,
    op: &str,
    args: &[usize],
    value: &Tensor<S>,
) -> Result<(), Error> {
    let Some((index, bad)) = value.first_non_finite() else {
        return Ok(());
    };
    let id = tape.nodes.len();
    let mut msg = format!(
        "anomaly in forward: node {id} ({op}) with inputs of shapes {} produced {bad} at element {index} of its output (shape {})",
        shapes(tape, args),
        value.shape()
    );
    let bad_input = args.iter().find_map(|&a| {
        let n = tape.nodes.get(a)?;
        n.value.first_non_finite().map(|(i, v)| (a, i, v))
    });
    match bad_input {
        Some((a, i, v)) => msg.push_str(&format!(
            "; its input {} already holds {v} at element {i}",
            describe(tape, a)
        )),
        None => msg.push_str(
            "; all its inputs are finite, so this op made it. If the value is masked out later \
             (where), mask the op's input instead, e.g. log(where(x > 0, x, 1)): a masked output \
             still sends NaN gradients through the unsafe branch",
        ),
    }
    Err(Error::Anomaly(msg))
}

/// Checks one backward contribution of node `id` (cotangent `cot`) to parent `pid`.
pub(crate) fn check_backward<S: Scalar>(
    tape: &Tape<S>,
    id: usize,
    cot: &Tensor<S>,
    pid: usize,
    g: &Tensor<S>,
) -> Result<(), Error> {
    let Some((index, bad)) = g.first_non_finite() else {
        return Ok(());
    };
    let node = &tape.nodes[id];
    let mut msg = format!(
        "anomaly in backward: {} with inputs of shapes {} sent {bad} at element {index} to its parent {}",
        describe(tape, id),
        shapes(tape, &node.parents),
        describe(tape, pid)
    );
    let cot_zero_there = if cot.shape() == g.shape() {
        cot.data()[index] == S::ZERO
    } else {
        cot.is_all_zero()
    };
    let saved = non_finite_saved(tape, id);
    if let Some((i, v)) = cot.first_non_finite() {
        msg.push_str(&format!(
            "; its own cotangent already holds {} at element {i}",
            v.to_f64()
        ));
    } else if cot_zero_there {
        msg.push_str("; the cotangent there was zero, so a zero cotangent met an infinite or NaN local derivative");
        if let Some((i, v)) = saved {
            msg.push_str(&format!(" (a saved value is {v} at element {i})"));
        }
        msg.push_str(
            ". This is the masked-branch trap, as in where(x > 0, sqrt(x), 0) or log behind a mask: \
             mask the input of the unsafe branch, not only its output, e.g. sqrt(where(x > 0, x, 1))",
        );
    } else if let Some((i, v)) = saved {
        msg.push_str(&format!("; a saved value is {v} at element {i}"));
    } else {
        msg.push_str(
            "; the cotangent and saved values are finite, so the local derivative overflowed",
        );
    }
    Err(Error::Anomaly(msg))
}
