//! `Tape`: the append-only list of nodes. A node's id is its index; appending returns the length
//! before the append. A leaf's `requires_grad` is the caller's; an op node's is the OR of its parents'.

use super::node::{CustomVjp, Node, NodeSaved, Rule};
use super::Parents;
use crate::ops::{Aux, Forward, Op};
use crate::{Error, Result};
use smallvec::SmallVec;
use tapegrad_tensor::{Scalar, Tensor};

/// An append-only record of a computation.
#[derive(Clone)]
pub struct Tape<S> {
    pub(crate) nodes: Vec<Node<S>>,
    pub(crate) detect_anomaly: bool,
}

impl<S: Scalar> Default for Tape<S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: Scalar> Tape<S> {
    /// An empty tape.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An empty tape with room for `n` nodes.
    pub fn with_capacity(n: usize) -> Self {
        Tape {
            nodes: Vec::with_capacity(n),
            detect_anomaly: false,
        }
    }

    /// Turns anomaly mode on or off: the first NaN or infinity made in forward or in the executed
    /// backward sweep becomes an `Error::Anomaly` naming the node (see `tape::anomaly`).
    pub fn set_detect_anomaly(&mut self, on: bool) {
        self.detect_anomaly = on;
    }

    /// Whether anomaly mode is on.
    pub fn detect_anomaly(&self) -> bool {
        self.detect_anomaly
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when no node was recorded.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// All nodes in id order.
    pub fn nodes(&self) -> &[Node<S>] {
        &self.nodes
    }

    /// Removes every node (keeping the allocation).
    pub fn clear(&mut self) {
        // Each node is taken apart: its value goes back to the pool as usual, and a rule that
        // holds no heap data is forgotten rather than dropped (its drop glue, calls through
        // `Rule`, `Op` and `Aux`, cost as much per node as the rest of the node's drop, for
        // nothing to free).
        for node in self.nodes.drain(..) {
            let Node {
                name,
                value,
                parents,
                rule,
                ..
            } = node;
            drop(name);
            drop(value);
            drop(parents);
            if rule.holds_no_heap() {
                std::mem::forget(rule);
            }
        }
    }

    /// Node `id`, or an error naming the id and the tape length.
    pub fn node(&self, id: usize) -> Result<&Node<S>> {
        // A `match`, not `ok_or(Error::..)`, which would build and drop the error on every call.
        match self.nodes.get(id) {
            Some(node) => Ok(node),
            None => Err(Error::BadId {
                context: "tape",
                id,
                len: self.nodes.len(),
            }),
        }
    }

    /// The name of node `id`, if it has one.
    pub fn name(&self, id: usize) -> Option<&str> {
        self.nodes.get(id)?.name.as_deref()
    }

    /// The forward value of node `id`.
    pub fn value(&self, id: usize) -> Result<&Tensor<S>> {
        Ok(&self.node(id)?.value)
    }

    /// Appends a node and returns its id (the length before the append). Crate-private: a
    /// node's parents must be ids already on the tape, which every caller here checks (`leaf`,
    /// `append_op`, `custom`); a public `push` let a caller break that invariant.
    #[inline]
    pub(crate) fn push(&mut self, node: Node<S>) -> usize {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// Appends a leaf.
    pub fn leaf(&mut self, value: Tensor<S>, requires_grad: bool) -> usize {
        self.push(Node {
            name: None,
            value,
            requires_grad,
            parents: Parents::none(),
            rule: Rule::Leaf,
        })
    }

    /// Appends a named leaf.
    pub fn leaf_named(
        &mut self,
        name: impl Into<String>,
        value: Tensor<S>,
        requires_grad: bool,
    ) -> usize {
        let id = self.leaf(value, requires_grad);
        self.nodes[id].name = Some(name.into().into_boxed_str());
        id
    }

    /// Sets the display name of node `id`.
    pub fn set_name(&mut self, id: usize, name: impl Into<String>) -> Result<()> {
        let len = self.nodes.len();
        let Some(node) = self.nodes.get_mut(id) else {
            return Err(Error::BadId {
                context: "set_name",
                id,
                len,
            });
        };
        node.name = Some(name.into().into_boxed_str());
        Ok(())
    }

    /// Pushes the values of `args` onto `inputs` (filled through a reference: returning the
    /// list inside a `Result` copied it), or an error naming the first id not on the tape.
    fn args_into<'t>(
        &'t self,
        op: &Op,
        args: &[usize],
        inputs: &mut SmallVec<[&'t Tensor<S>; 4]>,
    ) -> Result<()> {
        for &a in args {
            match self.nodes.get(a) {
                Some(n) => inputs.push(&n.value),
                None => {
                    return Err(Error::BadId {
                        context: op.name(),
                        id: a,
                        len: self.nodes.len(),
                    })
                }
            }
        }
        Ok(())
    }

    /// Argument `id` of `op`, or an error naming the id.
    #[inline]
    fn arg(&self, op: &Op, id: usize) -> Result<&Node<S>> {
        match self.nodes.get(id) {
            Some(n) => Ok(n),
            None => Err(Error::BadId {
                context: op.name(),
                id,
                len: self.nodes.len(),
            }),
        }
    }

    /// Evaluates `op` on the values of `args` and appends the result.
    #[inline]
    pub fn apply(&mut self, op: Op, args: &[usize]) -> Result<usize> {
        // One and two arguments (most ops) pass their values in an array, not a list, and
        // read each argument's `requires_grad` from the node looked up for its value. The
        // common elementwise ops give their value alone (`Op::plain_forward`): no auxiliary
        // data to move or box.
        let (forward, requires_grad) = match *args {
            [a] => {
                let a = self.arg(&op, a)?;
                let requires_grad = a.requires_grad;
                if op.has_plain_forward() {
                    let value = op.plain_forward(&[&a.value])?;
                    return self.append_op(op, args, value, NodeSaved::nothing(), requires_grad);
                }
                (op.forward(&[&a.value])?, requires_grad)
            }
            [a, b] => {
                let (a, b) = (self.arg(&op, a)?, self.arg(&op, b)?);
                let requires_grad = a.requires_grad || b.requires_grad;
                if op.has_plain_forward() {
                    let value = op.plain_forward(&[&a.value, &b.value])?;
                    return self.append_op(op, args, value, NodeSaved::nothing(), requires_grad);
                }
                (op.forward(&[&a.value, &b.value])?, requires_grad)
            }
            _ => {
                let mut inputs = SmallVec::new();
                self.args_into(&op, args, &mut inputs)?;
                (op.forward(&inputs)?, self.any_requires_grad(args))
            }
        };
        self.append_op(
            op,
            args,
            forward.value,
            saved(forward.aux, requires_grad),
            requires_grad,
        )
    }

    /// Appends an op node whose forward result was already computed (used by lowering).
    pub fn record(&mut self, op: Op, args: &[usize], forward: Forward<S>) -> Result<usize> {
        self.args_into(&op, args, &mut SmallVec::new())?;
        let requires_grad = self.any_requires_grad(args);
        self.append_op(
            op,
            args,
            forward.value,
            saved(forward.aux, requires_grad),
            requires_grad,
        )
    }

    /// Whether any of `args` (valid ids) requires grad.
    fn any_requires_grad(&self, args: &[usize]) -> bool {
        args.iter().any(|&a| self.nodes[a].requires_grad)
    }

    /// Appends the op node; `requires_grad` is the OR of its arguments'. Its VJP will read its
    /// arguments, their `requires_grad` and its output off the tape, so the node keeps only
    /// `saved`, the forward's auxiliary data (see [`saved`]). `args` are valid ids, so all below
    /// the new id. Inlined into `apply`, so the value and the op are not copied once more into
    /// its arguments.
    #[inline(always)]
    fn append_op(
        &mut self,
        op: Op,
        args: &[usize],
        value: Tensor<S>,
        saved: NodeSaved<S>,
        requires_grad: bool,
    ) -> Result<usize> {
        if self.detect_anomaly {
            super::anomaly::check_forward(self, op.name(), args, &value)?;
        }
        let parents = Parents::from_slice(args);
        Ok(self.push(Node {
            name: None,
            value,
            requires_grad,
            parents,
            rule: Rule::Op { op, saved },
        }))
    }

    /// Appends a node with a hand-written backward rule; requires grad as any parent does.
    pub fn custom(
        &mut self,
        label: impl Into<String>,
        value: Tensor<S>,
        parents: &[usize],
        vjp: CustomVjp<S>,
    ) -> Result<usize> {
        for &p in parents {
            self.node(p)?;
        }
        let requires_grad = parents.iter().any(|&p| self.nodes[p].requires_grad);
        Ok(self.push(Node {
            name: None,
            value,
            requires_grad,
            parents: Parents::from_slice(parents),
            rule: Rule::Custom {
                label: label.into(),
                vjp,
            },
        }))
    }

    /// Bytes held for backward: what each node's VJP reads beyond the node's own value (saved
    /// arguments, each counted as often as it is saved) plus auxiliary data.
    pub fn saved_bytes(&self) -> usize {
        (0..self.nodes.len())
            .map(|id| self.node_saved_bytes(id))
            .sum()
    }

    /// Bytes of all node values.
    pub fn value_bytes(&self) -> usize {
        self.nodes.iter().map(|n| n.value.nbytes()).sum()
    }
}

/// What an op node keeps of its forward's auxiliary data `aux`: nothing for a node nobody
/// differentiates through, since its VJP never runs.
#[inline(always)]
fn saved<S>(aux: Aux<S>, requires_grad: bool) -> NodeSaved<S> {
    if requires_grad {
        NodeSaved::new(aux)
    } else {
        NodeSaved::nothing()
    }
}

impl<S: Scalar> std::fmt::Display for Tape<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (id, n) in self.nodes.iter().enumerate() {
            let name = self.name(id).map(|s| format!(" '{s}'")).unwrap_or_default();
            let op = match &n.rule {
                Rule::Op { op, .. } => op.to_string(),
                _ => n.op_name(),
            };
            writeln!(
                f,
                "%{id}{name} = {op}{:?} : {}{}",
                n.parents,
                n.value.shape(),
                if n.requires_grad { "" } else { " (no grad)" }
            )?;
        }
        Ok(())
    }
}
