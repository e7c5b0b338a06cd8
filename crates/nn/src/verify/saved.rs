//! Law 4 on a compiled graph: its saved forward pass gives `eval`'s output and its dense backward
//! gives `backprop_all`'s cotangents in every slot, with identical bits (same VJPs on the same
//! cotangents, same additions in the same order).

use super::compare::{first_difference, Equality};
use super::failure::{Law, VerifyFailure};
use tapegrad_core::graph::CompiledGraph;
use tapegrad_tensor::{Scalar, Tensor};

/// Law 4 at `inputs` with the full seed `seed`; `describe` names a slot for a report.
pub fn saved_graph<S: Scalar>(
    compiled: &CompiledGraph,
    inputs: &[Tensor<S>],
    seed: Vec<Tensor<S>>,
    describe: impl Fn(usize) -> String,
) -> Result<(), VerifyFailure> {
    let fail = |node, msg: String| VerifyFailure::new(Law::SavedGraph, node, msg);
    let graph = compiled.graph();
    let run = || -> tapegrad_core::Result<_> {
        let saved = compiled.forward(inputs)?;
        let output = saved.output().clone();
        let got = saved.backward_all(seed.clone())?;
        let values = graph.eval(inputs)?;
        let want = graph.backprop_all(inputs, seed)?;
        Ok((output, values, got, want))
    };
    let (output, values, got, want) = run().map_err(|e| fail(None, e.to_string()))?;
    let last = values.len() - 1;
    if let Some(d) = first_difference(&[output], &values[last..], None, Equality::Bits) {
        return Err(fail(
            Some(describe(last)),
            format!(
                "the output differs: {}",
                d.what("the saved pass", "graph eval")
            ),
        ));
    }
    match first_difference(&got, &want, None, Equality::Bits) {
        None => Ok(()),
        Some(d) => Err(fail(
            Some(describe(d.slot)),
            format!(
                "its cotangent differs: {}",
                d.what("the saved graph's backward", "graph backprop_all")
            ),
        )),
    }
}
