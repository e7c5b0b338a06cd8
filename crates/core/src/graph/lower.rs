//! Lowering a graph to a tape: one leaf per input (requiring grad as the input says), then one op
//! node per graph node, so graph node k is tape id `inputs + k` and emits contributions only to
//! lower ids. Checked lowering validates each node before evaluating it and names the first failure.

use super::Graph;
use crate::tape::Tape;
use crate::Result;
use tapegrad_tensor::{Scalar, Tensor};

impl Graph {
    fn lower_with<S: Scalar>(&self, inputs: &[Tensor<S>], checked: bool) -> Result<Tape<S>> {
        self.check_inputs(inputs, "values")?;
        let mut tape = Tape::with_capacity(self.slots());
        for (x, v) in self.inputs().iter().zip(inputs) {
            tape.leaf_named(x.name.clone(), v.clone(), x.requires_grad);
        }
        let mut context: Vec<Tensor<S>> = inputs.to_vec();
        for (k, node) in self.nodes().iter().enumerate() {
            let forward = self.forward_node(k, &context, checked)?;
            context.push(forward.value.clone());
            let id = tape
                .record(node.op.clone(), &node.args, forward)
                .map_err(|e| e.at_node(self.node_label(k)))?;
            tape.set_name(id, node.name.clone())?;
        }
        Ok(tape)
    }

    /// The tape of this graph at `inputs`: slot k is tape id k.
    pub fn lower<S: Scalar>(&self, inputs: &[Tensor<S>]) -> Result<Tape<S>> {
        self.lower_with(inputs, false)
    }

    /// As [`Graph::lower`], but each node's shapes, attributes and domain rules are validated
    /// before it is evaluated; the first failure is returned as an error naming the node.
    pub fn lower_checked<S: Scalar>(&self, inputs: &[Tensor<S>]) -> Result<Tape<S>> {
        self.lower_with(inputs, true)
    }
}
