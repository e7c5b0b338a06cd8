//! `Graph`: typed inputs followed by SSA nodes over one context. Construction checks every node as
//! it is appended (arity and shapes through the op's own shape rule, unique names, and arguments that
//! name an earlier slot), so every graph that exists is well-typed.

use crate::ops::Op;
use crate::{Error, OpError, Result};
use std::collections::HashMap;
use tapegrad_tensor::{Scalar, Shape, Tensor};

/// Context name used in errors raised while building or running a graph.
pub(crate) const CONTEXT: &str = "graph";

/// A typed input: the context starts with these, in declaration order.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphInput {
    pub name: String,
    pub shape: Shape,
    pub requires_grad: bool,
}

/// A node: an op (carrying its non-differentiable attributes), the context slots it reads, and the
/// shape of its value, computed by the op's shape rule when the node was appended.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphNode {
    pub name: String,
    pub op: Op,
    pub args: Vec<usize>,
    pub shape: Shape,
}

/// A straight-line graph: slot `k < inputs` is input k, slot `inputs + k` is node k.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Graph {
    inputs: Vec<GraphInput>,
    nodes: Vec<GraphNode>,
    names: HashMap<String, usize>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares an input and returns its slot. Inputs must all come before the first node, so
    /// that node slots never move.
    pub fn input(
        &mut self,
        name: impl Into<String>,
        shape: Shape,
        requires_grad: bool,
    ) -> Result<usize> {
        let name = name.into();
        if let Some(first) = self.nodes.first() {
            return Err(Error::invalid(
                CONTEXT,
                format!(
                    "input '{name}' is declared after node '{}'; inputs must come first",
                    first.name
                ),
            )
            .at_node(quoted(&name)));
        }
        self.claim_name(&name)?;
        self.inputs.push(GraphInput {
            name,
            shape,
            requires_grad,
        });
        Ok(self.inputs.len() - 1)
    }

    /// Appends a node reading `args` (earlier slots) and returns its slot. Fails, naming the node,
    /// when an argument is not an earlier slot, when the op rejects the argument shapes, or when
    /// the name is already taken.
    pub fn node(&mut self, name: impl Into<String>, op: Op, args: &[usize]) -> Result<usize> {
        let name = name.into();
        let slot = self.slots();
        let at = |e: Error| e.at_node(format!("'{name}' ({})", op.name()));
        let mut shapes = Vec::with_capacity(args.len());
        for (i, &a) in args.iter().enumerate() {
            if a >= slot {
                return Err(at(Error::invalid(
                    CONTEXT,
                    format!(
                        "argument {i} reads slot {a}, which is not defined before this node (slot {slot})"
                    ),
                )));
            }
            shapes.push(self.shape(a)?);
        }
        let shape = op.output_shape(&shapes).map_err(|e| at(e.into()))?;
        self.claim_name(&name)?;
        self.nodes.push(GraphNode {
            name,
            op,
            args: args.to_vec(),
            shape,
        });
        Ok(slot)
    }

    /// Replaces the op of the node at `slot` by one with other attributes (new class labels for
    /// the next batch, say). The new op must accept the same arguments and give the same shape,
    /// so the rest of the graph stays valid.
    pub fn set_op(&mut self, slot: usize, op: Op) -> Result<()> {
        let k = slot
            .checked_sub(self.inputs.len())
            .filter(|&k| k < self.nodes.len())
            .ok_or_else(|| self.bad_slot(slot))?;
        let label = self.node_label(k);
        let shapes = self.nodes[k]
            .args
            .iter()
            .map(|&a| self.shape(a))
            .collect::<Result<Vec<_>>>()?;
        let shape = op
            .output_shape(&shapes)
            .map_err(|e| Error::from(e).at_node(label.clone()))?;
        let node = &mut self.nodes[k];
        if shape != node.shape {
            return Err(Error::from(OpError::ShapeMismatch {
                op: op.name(),
                expected: Box::new(node.shape.clone()),
                found: Box::new(shape),
            })
            .at_node(label));
        }
        node.op = op;
        Ok(())
    }

    /// Appends a node named after its slot (`%k`).
    pub fn push(&mut self, op: Op, args: &[usize]) -> Result<usize> {
        let name = format!("%{}", self.slots());
        self.node(name, op, args)
    }

    fn claim_name(&mut self, name: &str) -> Result<()> {
        if self.names.contains_key(name) {
            return Err(Error::invalid(
                CONTEXT,
                format!("the name '{name}' is used twice; names must be unique"),
            )
            .at_node(quoted(name)));
        }
        self.names.insert(name.to_string(), self.slots());
        Ok(())
    }

    /// The inputs, in slot order.
    pub fn inputs(&self) -> &[GraphInput] {
        &self.inputs
    }

    /// The nodes, in evaluation order.
    pub fn nodes(&self) -> &[GraphNode] {
        &self.nodes
    }

    /// Number of context slots (inputs plus nodes).
    pub fn slots(&self) -> usize {
        self.inputs.len() + self.nodes.len()
    }

    /// The slot holding the value called `name`.
    pub fn slot_of(&self, name: &str) -> Option<usize> {
        self.names.get(name).copied()
    }

    /// The last slot (the last node, or the last input of a graph without nodes).
    pub fn last_slot(&self) -> Result<usize> {
        self.slots()
            .checked_sub(1)
            .ok_or_else(|| Error::invalid(CONTEXT, "the graph is empty"))
    }

    fn bad_slot(&self, slot: usize) -> Error {
        Error::BadId {
            context: CONTEXT,
            id: slot,
            len: self.slots(),
        }
    }

    /// The shape of slot `slot`.
    pub fn shape(&self, slot: usize) -> Result<&Shape> {
        if let Some(x) = self.inputs.get(slot) {
            return Ok(&x.shape);
        }
        self.nodes
            .get(slot - self.inputs.len())
            .map(|n| &n.shape)
            .ok_or_else(|| self.bad_slot(slot))
    }

    /// The name of slot `slot`.
    pub fn name(&self, slot: usize) -> Result<&str> {
        if let Some(x) = self.inputs.get(slot) {
            return Ok(&x.name);
        }
        self.nodes
            .get(slot - self.inputs.len())
            .map(|n| n.name.as_str())
            .ok_or_else(|| self.bad_slot(slot))
    }

    /// Every slot's shape, in slot order.
    pub fn shapes(&self) -> Vec<&Shape> {
        self.inputs
            .iter()
            .map(|x| &x.shape)
            .chain(self.nodes.iter().map(|n| &n.shape))
            .collect()
    }

    /// Whether each slot requires grad: an input's flag, or the OR of a node's arguments' flags
    /// (the rule lowering gives the tape).
    pub fn requires_grad(&self) -> Vec<bool> {
        let mut rg: Vec<bool> = self.inputs.iter().map(|x| x.requires_grad).collect();
        for n in &self.nodes {
            let r = n.args.iter().any(|&a| rg[a]);
            rg.push(r);
        }
        rg
    }

    /// How errors name node `k`: its name and op.
    pub(crate) fn node_label(&self, k: usize) -> String {
        let n = &self.nodes[k];
        format!("'{}' ({})", n.name, n.op.name())
    }

    /// Checks that `values` has one tensor per input, each of its declared shape.
    pub(crate) fn check_inputs<S: Scalar>(&self, values: &[Tensor<S>], what: &str) -> Result<()> {
        if values.len() != self.inputs.len() {
            return Err(Error::invalid(
                CONTEXT,
                format!(
                    "expected {} {what} (one per input), found {}",
                    self.inputs.len(),
                    values.len()
                ),
            ));
        }
        for (x, v) in self.inputs.iter().zip(values) {
            if *v.shape() != x.shape {
                return Err(Error::invalid(
                    CONTEXT,
                    format!(
                        "{what} for input '{}' has shape {}, but the input is declared with shape {}",
                        x.name,
                        v.shape(),
                        x.shape
                    ),
                )
                .at_node(quoted(&x.name)));
            }
        }
        Ok(())
    }

    /// Checks that `seed` has one tensor per slot, each of its slot's shape.
    pub(crate) fn check_seed<S: Scalar>(&self, seed: &[Tensor<S>]) -> Result<()> {
        if seed.len() != self.slots() {
            return Err(Error::GradCount {
                context: CONTEXT,
                expected: self.slots(),
                found: seed.len(),
            });
        }
        for (slot, (s, shape)) in seed.iter().zip(self.shapes()).enumerate() {
            if s.shape() != shape {
                let name = self.name(slot)?.to_string();
                return Err(Error::invalid(
                    CONTEXT,
                    format!(
                        "the seed for slot {slot} has shape {}, but the slot has shape {shape}",
                        s.shape()
                    ),
                )
                .at_node(quoted(&name)));
            }
        }
        Ok(())
    }

    /// The full seed that is `seed` at `slot` and zeros elsewhere.
    pub fn single<S: Scalar>(&self, slot: usize, seed: &Tensor<S>) -> Result<Vec<Tensor<S>>> {
        let shape = self.shape(slot)?;
        if seed.shape() != shape {
            return Err(Error::invalid(
                CONTEXT,
                format!(
                    "the seed has shape {}, but slot {slot} has shape {shape}",
                    seed.shape()
                ),
            )
            .at_node(quoted(self.name(slot)?)));
        }
        Ok(self
            .shapes()
            .into_iter()
            .enumerate()
            .map(|(s, shape)| {
                if s == slot {
                    seed.clone()
                } else {
                    Tensor::zeros(shape)
                }
            })
            .collect())
    }

    /// Zeros for every slot (a full seed that asks for nothing).
    pub fn zero_seed<S: Scalar>(&self) -> Vec<Tensor<S>> {
        self.shapes().into_iter().map(Tensor::zeros).collect()
    }
}

fn quoted(name: &str) -> String {
    format!("'{name}'")
}
