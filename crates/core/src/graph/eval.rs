//! Graph evaluation: the whole context (inputs followed by every node value), unchecked or checked.
//! Checked evaluation runs each op's domain rules before its forward; both name the failing node.

use super::Graph;
use crate::ops::Forward;
use crate::Result;
use tapegrad_tensor::{Scalar, Tensor};

/// The whole context and every node's forward result (value and auxiliary data).
pub(crate) type Evaluated<S> = (Vec<Tensor<S>>, Vec<Forward<S>>);

impl Graph {
    /// Evaluates node `k` on its arguments. `checked` runs the op's domain rules first; an error
    /// names the node.
    pub(crate) fn run_node<S: Scalar>(
        &self,
        k: usize,
        args: &[&Tensor<S>],
        checked: bool,
    ) -> Result<Forward<S>> {
        let op = &self.nodes()[k].op;
        let run = || {
            if checked {
                op.check_domain(args)?;
            }
            op.forward(args)
        };
        run().map_err(|e| crate::Error::from(e).at_node(self.node_label(k)))
    }

    /// Evaluates node `k` on the context built so far.
    pub(crate) fn forward_node<S: Scalar>(
        &self,
        k: usize,
        context: &[Tensor<S>],
        checked: bool,
    ) -> Result<Forward<S>> {
        let args: Vec<&Tensor<S>> = self.nodes()[k].args.iter().map(|&a| &context[a]).collect();
        self.run_node(k, &args, checked)
    }

    /// Every node's forward result (value and auxiliary data) and the whole context.
    pub(crate) fn forward_all<S: Scalar>(
        &self,
        inputs: &[Tensor<S>],
        checked: bool,
    ) -> Result<Evaluated<S>> {
        self.check_inputs(inputs, "values")?;
        let mut context: Vec<Tensor<S>> = Vec::with_capacity(self.slots());
        context.extend(inputs.iter().cloned());
        let mut forwards = Vec::with_capacity(self.nodes().len());
        for k in 0..self.nodes().len() {
            let fwd = self.forward_node(k, &context, checked)?;
            context.push(fwd.value.clone());
            forwards.push(fwd);
        }
        Ok((context, forwards))
    }

    /// The whole context: the inputs followed by every node's value.
    pub fn eval<S: Scalar>(&self, inputs: &[Tensor<S>]) -> Result<Vec<Tensor<S>>> {
        Ok(self.forward_all(inputs, false)?.0)
    }

    /// As [`Graph::eval`], but each node's domain rules (e.g. `log` of a non-positive value) are
    /// checked before it runs; the first failure is an error naming the node.
    pub fn eval_checked<S: Scalar>(&self, inputs: &[Tensor<S>]) -> Result<Vec<Tensor<S>>> {
        Ok(self.forward_all(inputs, true)?.0)
    }
}
