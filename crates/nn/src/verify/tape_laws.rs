//! The laws checked on a recorded tape: 1 (executed = reference from the one-hot seed of the
//! loss), 7 (the audit finds the tape zero-preserving), and 3 (the executed sweep on the lowered
//! tape from an intermediate slot equals graph backprop from a single seed there).

use super::compare::{first_difference, Equality};
use super::failure::{Law, VerifyFailure};
use super::{Recorded, TapeGraph};
use tapegrad_core::audit;
use tapegrad_tensor::{Scalar, Tensor};

/// Law 1 on the loss: `backward_all(loss, 1)` equals `backward_from(one_hot(loss, 1))` in every
/// slot (`==`, so +0 equals -0). Returns the executed sweep's slots.
pub fn executed_reference<S: Scalar>(rec: &Recorded<S>) -> Result<Vec<Tensor<S>>, VerifyFailure> {
    let law = Law::ExecutedReference;
    let fail = |node, msg: String| VerifyFailure::new(law, node, msg);
    let tape = rec.tape();
    let seed = rec.seed().map_err(|e| fail(None, e.to_string()))?;
    let executed = tape.backward_all(rec.loss, &seed);
    let reference = tape
        .one_hot(rec.loss, &seed)
        .and_then(|g| tape.backward_from(g));
    match (executed, reference) {
        (Ok(e), Ok(r)) => match first_difference(&e, &r, None, Equality::Values) {
            None => Ok(e),
            Some(d) => Err(fail(
                Some(rec.describe(d.slot)),
                format!(
                    "its gradient differs between the sweeps: {}",
                    d.what("the executed sweep", "the reference sweep")
                ),
            )),
        },
        (Err(a), Err(b)) if a == b => Err(fail(None, format!("both sweeps fail: {a}"))),
        (Err(a), Err(b)) => Err(fail(
            None,
            format!("the executed sweep fails with '{a}' but the reference sweep with '{b}'"),
        )),
        (Err(a), Ok(_)) => Err(fail(
            None,
            format!("the executed sweep fails ('{a}') but the reference sweep does not"),
        )),
        (Ok(_), Err(b)) => Err(fail(
            None,
            format!("the reference sweep fails ('{b}') but the executed sweep does not"),
        )),
    }
}

/// Law 7: every node that requires grad maps a zero cotangent to zeros; else the first node
/// that does not, with the audit's reason.
pub fn zero_preserving<S: Scalar>(rec: &Recorded<S>) -> Result<(), VerifyFailure> {
    let report = audit(rec.tape());
    let Some(first) = report.findings.first() else {
        return Ok(());
    };
    let more = match report.findings.len() - 1 {
        0 => String::new(),
        n => format!(" ({n} more nodes are not zero-preserving)"),
    };
    Err(VerifyFailure::new(
        Law::ZeroPreserving,
        Some(rec.describe(first.node)),
        format!("the audit finds {first}{more}"),
    ))
}

/// Law 3 at graph slot `slot` with `seed`: the executed sweep of the lowered tape from `slot`
/// equals `backprop_all` with `seed` at `slot` alone, in every slot that requires grad.
pub fn lowered_executed<S: Scalar>(
    rec: &Recorded<S>,
    tg: &TapeGraph<S>,
    slot: usize,
    seed: &Tensor<S>,
) -> Result<(), VerifyFailure> {
    let fail = |node, msg: String| VerifyFailure::new(Law::LoweredExecuted, node, msg);
    let run = || -> tapegrad_core::Result<_> {
        let lowered = tg.graph.lower(&tg.inputs)?;
        let executed = lowered.backward_all(slot, seed)?;
        let single = tg.graph.single(slot, seed)?;
        let graph = tg.graph.backprop_all(&tg.inputs, single)?;
        Ok((executed, graph))
    };
    let (executed, graph) = run().map_err(|e| fail(None, e.to_string()))?;
    let needs: Vec<usize> = tg
        .graph
        .requires_grad()
        .iter()
        .enumerate()
        .filter(|(_, &r)| r)
        .map(|(s, _)| s)
        .collect();
    match first_difference(&executed, &graph, Some(&needs), Equality::Values) {
        None => Ok(()),
        Some(d) => Err(fail(
            Some(rec.describe(tg.tape_ids[d.slot])),
            format!(
                "from slot {slot}, {}",
                d.what("the lowered tape's executed sweep", "graph backprop")
            ),
        )),
    }
}
