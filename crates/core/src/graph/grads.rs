//! Gradients of one output with respect to the inputs, by any of the three sweeps: `executed`
//! (lowered tape, `backward_all`), `reference` (`backprop` over the graph) and `saved` (the
//! compiled graph's inputs-only backward). On well-behaved graphs all three agree.

use super::{CompiledGraph, Graph};
use crate::Result;
use tapegrad_tensor::{Scalar, Tensor};

/// Which backward pass computes the gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sweep {
    Executed,
    Reference,
    Saved,
}

impl Sweep {
    /// Every sweep, in the order the CLI lists them.
    pub const ALL: [Sweep; 3] = [Sweep::Executed, Sweep::Reference, Sweep::Saved];

    /// The command-line spelling.
    pub fn name(self) -> &'static str {
        match self {
            Sweep::Executed => "executed",
            Sweep::Reference => "reference",
            Sweep::Saved => "saved",
        }
    }

    /// The sweep called `name`.
    pub fn parse(name: &str) -> Option<Sweep> {
        Sweep::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// The output's value and the gradient of every input that requires grad, in input order. A zero
/// gradient element is always +0: the sweeps may leave a -0 where another adds onto a zero slot
/// (`0 + (-0)` is `+0`), and the three must report the same numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct Gradients<S> {
    pub output: Tensor<S>,
    pub grads: Vec<(String, Tensor<S>)>,
}

impl Graph {
    /// The graph cut after slot `last`: its inputs and the nodes up to `last`.
    pub fn truncated(&self, last: usize) -> Result<Graph> {
        self.shape(last)?;
        let mut g = Graph::new();
        for x in self.inputs() {
            g.input(x.name.clone(), x.shape.clone(), x.requires_grad)?;
        }
        let keep = (last + 1).saturating_sub(self.inputs().len());
        for n in &self.nodes()[..keep] {
            g.node(n.name.clone(), n.op.clone(), &n.args)?;
        }
        Ok(g)
    }

    /// The value of slot `output` and the gradients of `<seed, output>` for every input that
    /// requires grad, computed by `sweep`. Nodes after `output` play no part.
    pub fn gradients<S: Scalar>(
        &self,
        inputs: &[Tensor<S>],
        output: usize,
        seed: &Tensor<S>,
        sweep: Sweep,
    ) -> Result<Gradients<S>> {
        let g = self.truncated(output)?;
        let (value, grads): (Tensor<S>, Vec<Option<Tensor<S>>>) = match sweep {
            Sweep::Executed => {
                let tape = g.lower(inputs)?;
                let all = tape.backward_all(output, seed)?;
                let grads = g
                    .inputs()
                    .iter()
                    .zip(all)
                    .map(|(x, t)| x.requires_grad.then_some(t))
                    .collect();
                (tape.value(output)?.clone(), grads)
            }
            Sweep::Reference => {
                let value = g.eval(inputs)?.swap_remove(output);
                let block = g.backprop(inputs, g.single(output, seed)?)?;
                let grads = g
                    .inputs()
                    .iter()
                    .zip(block)
                    .map(|(x, t)| x.requires_grad.then_some(t))
                    .collect();
                (value, grads)
            }
            Sweep::Saved => {
                let saved = CompiledGraph::new(g.clone()).forward(inputs)?;
                let value = saved.output().clone();
                (value, saved.backward(seed)?)
            }
        };
        let grads = g
            .inputs()
            .iter()
            .zip(grads)
            .filter_map(|(x, t)| t.map(|t| (x.name.clone(), t.map(|v| v + S::ZERO))))
            .collect();
        Ok(Gradients {
            output: value,
            grads,
        })
    }
}
