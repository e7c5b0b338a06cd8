//! Forward mode over the whole context: given one tangent per input, the tangent of every slot,
//! each node's through its op's JVP on the node's arguments and forward result.

use super::Graph;
use crate::{Error, OpError, Result};
use tapegrad_tensor::{Scalar, Tensor};

impl Graph {
    /// Tangents of every slot: the input tangents followed by each node's output tangent.
    pub fn jvp<S: Scalar>(
        &self,
        inputs: &[Tensor<S>],
        tangents: &[Tensor<S>],
    ) -> Result<Vec<Tensor<S>>> {
        self.check_inputs(tangents, "tangents")?;
        let (context, forwards) = self.forward_all(inputs, false)?;
        let mut dots: Vec<Tensor<S>> = Vec::with_capacity(self.slots());
        dots.extend(tangents.iter().cloned());
        for (k, (node, fwd)) in self.nodes().iter().zip(&forwards).enumerate() {
            let args: Vec<&Tensor<S>> = node.args.iter().map(|&a| &context[a]).collect();
            let ts: Vec<&Tensor<S>> = node.args.iter().map(|&a| &dots[a]).collect();
            let dot = node
                .op
                .jvp(&args, fwd, &ts)
                .map_err(|e| Error::from(e).at_node(self.node_label(k)))?;
            if *dot.shape() != node.shape {
                return Err(Error::from(OpError::ShapeMismatch {
                    op: node.op.name(),
                    expected: Box::new(node.shape.clone()),
                    found: Box::new(dot.shape().clone()),
                })
                .at_node(self.node_label(k)));
            }
            dots.push(dot);
        }
        Ok(dots)
    }
}
