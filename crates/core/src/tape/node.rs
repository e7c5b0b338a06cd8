//! A tape node: optional name, forward value, `requires_grad`, parent ids (for display only) and
//! the backward rule that maps a cotangent to ordered `(parent id, contribution)` pairs.

use crate::ops::{Op, Saved};
use smallvec::SmallVec;
use std::sync::Arc;
use tapegrad_tensor::{Result, Scalar, Tensor};

/// A hand-written backward rule: cotangent in, `(parent id, contribution)` pairs out.
pub type CustomVjp<S> = Arc<dyn Fn(&Tensor<S>) -> Result<Vec<(usize, Tensor<S>)>> + Send + Sync>;

/// The `(parent id, contribution)` pairs of one backward step (inline for up to three parents).
pub type Contributions<S> = SmallVec<[(usize, Tensor<S>); 3]>;

/// How a node maps its cotangent to contributions.
// Nearly every node is an op node, so the large variant is the common one: boxing it would add an
// allocation per recorded op to shrink the rare leaves.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub enum Rule<S> {
    /// A leaf: no contributions.
    Leaf,
    /// A registered op with what its VJP saved; contribution i goes to `parents[i]`. Kept inline:
    /// a box cost an allocation and a free per recorded op, more than moving the larger node.
    Op { op: Op, saved: Saved<S> },
    /// A custom rule (used to plant test cases and by extensions).
    Custom { label: String, vjp: CustomVjp<S> },
}

/// One recorded value on the tape.
#[derive(Clone)]
pub struct Node<S> {
    pub name: Option<String>,
    pub value: Tensor<S>,
    pub requires_grad: bool,
    /// Parent ids, for display; the sweeps only use what `rule` emits.
    pub parents: SmallVec<[usize; 4]>,
    pub rule: Rule<S>,
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

    /// The ordered `(parent id, contribution)` pairs for cotangent `cot`.
    pub fn backward(&self, cot: &Tensor<S>) -> Result<Contributions<S>> {
        let mut out = Contributions::new();
        match &self.rule {
            Rule::Leaf => {}
            Rule::Op { op, saved } => {
                let grads = op.vjp(&saved.context(), cot)?;
                for (&p, g) in self.parents.iter().zip(grads) {
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

    /// Bytes the node keeps for its backward rule (beyond its own value).
    pub fn saved_bytes(&self) -> usize {
        match &self.rule {
            Rule::Op { saved, .. } => {
                // The saved output is the node's own value; do not count it twice.
                saved.nbytes() - saved.output.as_ref().map_or(0, |t| t.nbytes())
            }
            _ => 0,
        }
    }
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
