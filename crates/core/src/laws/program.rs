//! `Program`: a replayable straight-line program over a context (inputs first, then one slot per
//! node, each reading earlier slots). Random programs built from every op drive the law tests of the
//! tape and of the graph IR alike.

use crate::ops::Op;
use crate::tape::Tape;
use tapegrad_tensor::{Result, Scalar, Tensor};

/// One node of a program: an op and the context slots it reads.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramNode {
    pub op: Op,
    /// Context slots: `0..inputs.len()` are inputs, `inputs.len() + k` is node k. Each is below
    /// this node's own slot.
    pub args: Vec<usize>,
}

/// A straight-line program with typed inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    pub inputs: Vec<Tensor<f64>>,
    pub requires_grad: Vec<bool>,
    pub nodes: Vec<ProgramNode>,
}

impl Program {
    /// Number of context slots (inputs plus nodes).
    pub fn slots(&self) -> usize {
        self.inputs.len() + self.nodes.len()
    }

    /// Records the program on a fresh tape in `S` with the given input values; slot k is tape id k.
    pub fn record<S: Scalar>(&self, inputs: &[Tensor<S>]) -> Result<Tape<S>> {
        let mut tape = Tape::with_capacity(self.slots());
        for (x, &rg) in inputs.iter().zip(&self.requires_grad) {
            tape.leaf(x.clone(), rg);
        }
        for node in &self.nodes {
            tape.apply(node.op.clone(), &node.args)?;
        }
        Ok(tape)
    }

    /// Records the program at its own (f64) input values.
    pub fn record_f64(&self) -> Result<Tape<f64>> {
        self.record(&self.inputs)
    }
}
