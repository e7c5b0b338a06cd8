//! A tape node: optional name, forward value, `requires_grad`, parent ids (for display only) and
//! the backward rule that maps a cotangent to ordered `(parent id, contribution)` pairs.

use super::{Parents, Tape};
use crate::ops::{ArgShapes, ArgValues, Aux, Grads, Op, Saves, VjpContext};
use crate::{Error, Result};
use smallvec::SmallVec;
use std::sync::Arc;
use tapegrad_tensor::{Scalar, Tensor};

/// A hand-written backward rule: cotangent in, `(parent id, contribution)` pairs out.
pub type CustomVjp<S> = Arc<dyn Fn(&Tensor<S>) -> Result<Vec<(usize, Tensor<S>)>> + Send + Sync>;

/// The `(parent id, contribution)` pairs of one backward step (inline for up to three parents).
pub type Contributions<S> = SmallVec<[(usize, Tensor<S>); 3]>;

/// What an op node keeps for its VJP besides the tape itself: the forward's auxiliary data. The
/// arguments and the output the VJP reads (as its op's `saves` says) are the values already on
/// the append-only tape, each parent's and the node's own, and which arguments need a gradient
/// is their `requires_grad`, also on the tape and never changed after the append; so recording
/// an op copies no tensor handle, shape or flag list, and the node stays small. Most ops have
/// no auxiliary data, so the rare one that has is boxed (8 bytes in every node, not 24).
#[derive(Debug, Clone)]
pub struct NodeSaved<S> {
    aux: Option<Box<Aux<S>>>,
}

impl<S> NodeSaved<S> {
    /// The record of a forward whose auxiliary data is `aux`.
    #[inline]
    pub fn new(aux: Aux<S>) -> Self {
        NodeSaved {
            aux: match aux {
                Aux::None => None,
                aux => Some(Box::new(aux)),
            },
        }
    }

    /// The record of a forward without auxiliary data.
    #[inline]
    pub const fn nothing() -> Self {
        NodeSaved { aux: None }
    }

    /// The forward's auxiliary data (`Aux::None` for most ops).
    #[inline]
    pub fn aux(&self) -> &Aux<S> {
        match &self.aux {
            Some(aux) => aux,
            None => &const { Aux::None },
        }
    }
}

impl<S: Scalar> NodeSaved<S> {
    /// Bytes this record holds itself (its auxiliary data); `Tape::saved_bytes` adds the argument
    /// values the VJP reads.
    pub fn nbytes(&self) -> usize {
        self.aux().nbytes()
    }
}

/// How a node maps its cotangent to contributions.
#[derive(Clone)]
pub enum Rule<S> {
    /// A leaf: no contributions.
    Leaf,
    /// A registered op with what its VJP keeps; contribution i goes to `parents[i]`.
    Op { op: Op, saved: NodeSaved<S> },
    /// A custom rule (used to plant test cases and by extensions).
    Custom { label: String, vjp: CustomVjp<S> },
}

/// One recorded value on the tape, kept small (192 bytes with f32 or f64, from 272) since
/// recording copies it and the sweeps walk every node: the name, read only by displays and
/// reports, is a boxed `str`; the parent list holds three ids inline; auxiliary data and the
/// `nn` ops' attributes are boxed.
#[derive(Clone)]
pub struct Node<S> {
    pub name: Option<Box<str>>,
    pub value: Tensor<S>,
    pub requires_grad: bool,
    /// Parent ids, for display; the sweeps only use what `rule` emits.
    pub parents: Parents,
    pub rule: Rule<S>,
}

impl<S> Rule<S> {
    /// Whether this rule holds no heap data (a plain elementwise op without auxiliary data, the
    /// most common node of scalar code), so that forgetting it frees nothing dropping it would.
    #[inline]
    pub(crate) fn holds_no_heap(&self) -> bool {
        match self {
            Rule::Op {
                op: Op::Elementwise(op),
                saved: NodeSaved { aux: None },
            } => op.holds_no_heap(),
            _ => false,
        }
    }
}

impl<S: Scalar> Node<S> {
    /// The op's name, `leaf`, or the custom rule's label.
    pub fn op_name(&self) -> String {
        match &self.rule {
            Rule::Leaf => "leaf".to_string(),
            Rule::Op { op, .. } => op.name().to_string(),
            Rule::Custom { label, .. } => label.clone(),
        }
    }
}

/// The parents' values, in argument order (inline for up to four).
type ArgRefs<'t, S> = SmallVec<[&'t Tensor<S>; 4]>;

impl<S: Scalar> Tape<S> {
    /// Pushes the values of `node`'s parents onto `values` and whether each requires grad onto
    /// `needs` (filled through references: returning the lists inside a `Result` copied them);
    /// an error for an id not on the tape.
    fn parent_values_into<'t>(
        &'t self,
        node: &Node<S>,
        values: &mut ArgRefs<'t, S>,
        needs: &mut SmallVec<[bool; 4]>,
    ) -> Result<()> {
        for &p in &node.parents {
            let parent = self.parent(p)?;
            values.push(&parent.value);
            needs.push(parent.requires_grad);
        }
        Ok(())
    }

    /// The VJP of op node `node` for cotangent `cot`, reading its arguments and output off the
    /// tape: one optional contribution per parent, each shape-checked against the parent's value
    /// by `Op::vjp` (so the sweeps need not check it again).
    pub(crate) fn op_vjp(
        &self,
        node: &Node<S>,
        op: &Op,
        saved: &NodeSaved<S>,
        cot: &Tensor<S>,
    ) -> Result<Grads<S>> {
        self.with_vjp_context(node, op.saves(), saved, cot, |ctx, cot| {
            Ok(op.vjp(ctx, cot)?)
        })
    }

    /// Runs `vjp` on the context of op node `node` (its arguments and output read off the tape,
    /// those `saves` names, and which arguments need a gradient: the parents' `requires_grad`)
    /// and on `arg`.
    #[inline]
    fn with_vjp_context<T, R>(
        &self,
        node: &Node<S>,
        saves: Saves,
        saved: &NodeSaved<S>,
        arg: T,
        vjp: impl FnOnce(&VjpContext<'_, S>, T) -> Result<R>,
    ) -> Result<R> {
        // One and two parents (most ops) pass their values and flags in arrays, not lists; one
        // call of `vjp` for all three cases, so that it is inlined.
        let (one, two, mut list);
        let (values, needs): (&[&Tensor<S>], &[bool]) = match node.parents[..] {
            [a] => {
                let a = self.parent(a)?;
                one = ([&a.value], [a.requires_grad]);
                (&one.0, &one.1)
            }
            [a, b] => {
                let (a, b) = (self.parent(a)?, self.parent(b)?);
                two = ([&a.value, &b.value], [a.requires_grad, b.requires_grad]);
                (&two.0, &two.1)
            }
            _ => {
                list = (ArgRefs::new(), SmallVec::<[bool; 4]>::new());
                self.parent_values_into(node, &mut list.0, &mut list.1)?;
                (&list.0, &list.1)
            }
        };
        run_vjp(node, saves, saved, values, needs, arg, vjp)
    }

    /// Parent `id`, or an error for an id not on the tape.
    #[inline]
    pub(super) fn parent(&self, id: usize) -> Result<&Node<S>> {
        match self.nodes.get(id) {
            Some(parent) => Ok(parent),
            None => Err(Error::BadId {
                context: "backward",
                id,
                len: self.nodes.len(),
            }),
        }
    }

    /// The ordered `(parent id, contribution)` pairs of node `id` for cotangent `cot`.
    pub fn contributions(&self, id: usize, cot: &Tensor<S>) -> Result<Contributions<S>> {
        let node = self.node(id)?;
        let mut out = Contributions::new();
        match &node.rule {
            Rule::Leaf => {}
            Rule::Op { op, saved } => {
                let grads = self.op_vjp(node, op, saved, cot)?;
                for (&p, g) in node.parents.iter().zip(grads) {
                    if let Some(g) = g {
                        out.push((p, g));
                    }
                }
            }
            Rule::Custom { vjp, .. } => {
                for pair in vjp(cot)? {
                    out.push(pair);
                }
            }
        }
        Ok(out)
    }

    /// The arguments node `id`'s VJP reads (its parents' values the op's `saves` names, in
    /// order) and whether it reads its own value. Nothing for a node that does not require grad
    /// (its VJP never runs), a leaf, a custom rule, or an id not on the tape.
    fn kept_values(&self, id: usize) -> (impl Iterator<Item = &Tensor<S>>, Option<&Tensor<S>>) {
        let node = self.nodes.get(id);
        let saves = match node {
            Some(Node {
                rule: Rule::Op { op, .. },
                requires_grad: true,
                ..
            }) => op.saves(),
            _ => Saves::NOTHING,
        };
        let parents = node.map_or(&[][..], |n| &n.parents[..]);
        let inputs = parents
            .iter()
            .enumerate()
            .filter(move |&(i, _)| saves.keeps_input(i))
            .filter_map(|(_, &p)| self.nodes.get(p).map(|n| &n.value));
        (inputs, node.filter(|_| saves.output).map(|n| &n.value))
    }

    /// Every tensor node `id`'s VJP reads: the saved arguments, then its own value if saved.
    pub(crate) fn saved_values(&self, id: usize) -> impl Iterator<Item = &Tensor<S>> {
        let (inputs, output) = self.kept_values(id);
        inputs.chain(output)
    }

    /// Bytes node `id` holds for backward beyond its own value: the arguments its VJP reads (each
    /// counted as often as it is saved) plus its auxiliary data.
    pub fn node_saved_bytes(&self, id: usize) -> usize {
        let aux = match self.nodes.get(id).map(|n| &n.rule) {
            Some(Rule::Op { saved, .. }) => saved.nbytes(),
            _ => 0,
        };
        self.kept_values(id).0.map(|t| t.nbytes()).sum::<usize>() + aux
    }
}

/// Builds the VJP context of op node `node` from its arguments' values and flags and runs `vjp`
/// on it (a function, not a closure, so that it is inlined into each caller).
#[inline(always)]
fn run_vjp<S: Scalar, T, R>(
    node: &Node<S>,
    saves: Saves,
    saved: &NodeSaved<S>,
    values: &[&Tensor<S>],
    needs: &[bool],
    arg: T,
    vjp: impl FnOnce(&VjpContext<'_, S>, T) -> Result<R>,
) -> Result<R> {
    let ctx = VjpContext {
        inputs: ArgValues::Values {
            values,
            keep: saves,
        },
        input_shapes: ArgShapes::Values(values),
        output: saves.output.then_some(&node.value),
        output_shape: node.value.shape(),
        aux: saved.aux(),
        needs,
    };
    vjp(&ctx, arg)
}

impl<S: Scalar> std::fmt::Debug for Node<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.name)
            .field("op", &self.op_name())
            .field("shape", self.value.shape())
            .field("requires_grad", &self.requires_grad)
            .field("parents", &self.parents)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::{Node, Rule};
    use crate::ops::Op;
    use std::mem::size_of;

    /// Recording copies the op and the node, and the sweeps and `Tape::clear` walk every node:
    /// a new large op attribute belongs behind a box (as `Op::Nn` and auxiliary data are).
    #[test]
    fn ops_and_nodes_stay_small() {
        assert_eq!(size_of::<Op>(), 56);
        assert_eq!(size_of::<Rule<f64>>(), 64);
        assert_eq!(size_of::<Node<f32>>(), 192);
        assert_eq!(size_of::<Node<f64>>(), 192);
    }
}
