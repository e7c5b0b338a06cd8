//! Reference backprop over the whole context (docs/design.md section 4): from the last node down,
//! node k's cotangent is its seed plus everything later nodes added; its VJP runs on it, zero or
//! not, and each contribution is added into its argument's slot, in argument order, as `slot +
//! contribution`.

use super::Graph;
use crate::ops::{ArgShapes, ArgValues, Forward, Grads, VjpContext};
use crate::Result;
use tapegrad_tensor::{Scalar, Shape, Tensor};

/// `slot = slot + contribution`, element by element with the slot on the left: the one addition
/// every backward pass of the graph uses, so their results agree bit for bit.
pub(crate) fn accumulate<S: Scalar>(slot: &mut Tensor<S>, contribution: &Tensor<S>) {
    for (e, &c) in slot.data_mut().iter_mut().zip(contribution.data()) {
        *e += c; // slot on the left
    }
}

impl Graph {
    /// Per-slot cotangents for a full seed (one tensor per slot, intermediate seeds allowed). Every
    /// node's VJP is called, and every slot gets a result, whether or not it requires grad.
    pub fn backprop_all<S: Scalar>(
        &self,
        inputs: &[Tensor<S>],
        seed: Vec<Tensor<S>>,
    ) -> Result<Vec<Tensor<S>>> {
        self.check_seed(&seed)?;
        let (context, forwards) = self.forward_all(inputs, false)?;
        let mut acc = seed;
        let n_in = self.inputs().len();
        for k in (0..self.nodes().len()).rev() {
            let contributions = self
                .reference_vjp(k, &context, &forwards[k], &acc[n_in + k])
                .map_err(|e| e.at_node(self.node_label(k)))?;
            for (&arg, c) in self.nodes()[k].args.iter().zip(contributions) {
                if let Some(c) = c {
                    accumulate(&mut acc[arg], &c);
                }
            }
        }
        Ok(acc)
    }

    /// The input block of [`Graph::backprop_all`].
    pub fn backprop<S: Scalar>(
        &self,
        inputs: &[Tensor<S>],
        seed: Vec<Tensor<S>>,
    ) -> Result<Vec<Tensor<S>>> {
        let mut all = self.backprop_all(inputs, seed)?;
        all.truncate(self.inputs().len());
        Ok(all)
    }

    /// Node k's VJP with every argument and the output at hand (the reference does not rely on the
    /// op's `saves` declaration; the saved graph does, and law 4 compares the two).
    fn reference_vjp<S: Scalar>(
        &self,
        k: usize,
        context: &[Tensor<S>],
        forward: &Forward<S>,
        cot: &Tensor<S>,
    ) -> Result<Grads<S>> {
        let node = &self.nodes()[k];
        let inputs: Vec<Option<Tensor<S>>> = node
            .args
            .iter()
            .map(|&a| Some(context[a].clone()))
            .collect();
        let input_shapes: Vec<Shape> = node
            .args
            .iter()
            .map(|&a| context[a].shape().clone())
            .collect();
        let needs = vec![true; node.args.len()];
        let ctx = VjpContext {
            inputs: ArgValues::Kept(&inputs),
            input_shapes: ArgShapes::Shapes(&input_shapes),
            output: Some(&forward.value),
            output_shape: forward.value.shape(),
            aux: &forward.aux,
            needs: &needs,
        };
        Ok(node.op.vjp(&ctx, cot)?)
    }
}
