//! The zero-preserving audit (docs/design.md section 3.2): every node that requires grad must map a
//! zero cotangent to exact zeros of its parents' shapes at valid ids. The audit names each node
//! that does not, with the op, the parent and the first offending element, and says why when it
//! can.

use super::Tape;
use crate::Error;
use tapegrad_tensor::{Scalar, Shape, Tensor};

/// How a node fails to be zero-preserving.
#[derive(Debug, Clone, PartialEq)]
pub enum FindingKind {
    /// The VJP returned an error on the zero cotangent.
    VjpError(Error),
    /// A contribution names an id that is not a node.
    BadParent { parent: usize },
    /// A contribution's shape differs from its parent's value shape.
    WrongShape {
        parent: usize,
        expected: Shape,
        found: Shape,
    },
    /// A contribution holds a non-zero element (typically NaN from `0 * inf` or `0 / 0`).
    NonZero {
        parent: usize,
        index: usize,
        value: f64,
    },
}

/// One node that breaks zero preservation.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditFinding {
    pub node: usize,
    pub name: Option<String>,
    pub op: String,
    pub kind: FindingKind,
    /// The first non-finite saved value of the node, if any: the usual cause of a `NonZero` finding.
    pub non_finite_saved: Option<(usize, f64)>,
}

impl std::fmt::Display for AuditFinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = self
            .name
            .as_deref()
            .map(|n| format!(" '{n}'"))
            .unwrap_or_default();
        write!(f, "node {}{} ({}): ", self.node, name, self.op)?;
        match &self.kind {
            FindingKind::VjpError(e) => write!(f, "the vjp fails on a zero cotangent: {e}")?,
            FindingKind::BadParent { parent } => write!(f, "emits a contribution to id {parent}, which is not a node")?,
            FindingKind::WrongShape { parent, expected, found } => write!(
                f,
                "emits a contribution of shape {found} to parent {parent}, whose value has shape {expected}"
            )?,
            FindingKind::NonZero { parent, index, value } => write!(
                f,
                "a zero cotangent gives {value} at element {index} of the contribution to parent {parent}"
            )?,
        }
        if let (FindingKind::NonZero { .. }, Some((i, v))) = (&self.kind, self.non_finite_saved) {
            write!(
                f,
                "; a saved value is {v} (element {i}), so 0 * {v} is not 0"
            )?;
        }
        Ok(())
    }
}

/// Everything the audit found; empty means the tape is zero-preserving.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AuditReport {
    pub findings: Vec<AuditFinding>,
}

impl AuditReport {
    /// True when every node maps a zero cotangent to exact zeros.
    pub fn is_zero_preserving(&self) -> bool {
        self.findings.is_empty()
    }
}

impl std::fmt::Display for AuditReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.findings.is_empty() {
            return writeln!(
                f,
                "zero-preserving: every node maps a zero cotangent to zeros"
            );
        }
        for finding in &self.findings {
            writeln!(f, "{finding}")?;
        }
        Ok(())
    }
}

/// Runs each grad-requiring node's backward rule on a zero cotangent and reports what is not zero.
pub fn audit<S: Scalar>(tape: &Tape<S>) -> AuditReport {
    let mut findings = Vec::new();
    for (id, node) in tape.nodes.iter().enumerate() {
        if !node.requires_grad {
            continue;
        }
        let non_finite_saved = super::anomaly::non_finite_saved(tape, id);
        let finding = |kind| AuditFinding {
            node: id,
            name: tape.name(id).map(str::to_string),
            op: node.op_name(),
            kind,
            non_finite_saved,
        };
        let zero = Tensor::zeros(node.value.shape());
        let contributions = match tape.contributions(id, &zero) {
            Ok(c) => c,
            Err(e) => {
                findings.push(finding(FindingKind::VjpError(e)));
                continue;
            }
        };
        for (parent, g) in contributions {
            let Some(p) = tape.nodes.get(parent) else {
                findings.push(finding(FindingKind::BadParent { parent }));
                break;
            };
            if g.shape() != p.value.shape() {
                findings.push(finding(FindingKind::WrongShape {
                    parent,
                    expected: p.value.shape().clone(),
                    found: g.shape().clone(),
                }));
                break;
            }
            if let Some(index) = g.data().iter().position(|&v| v != S::ZERO) {
                findings.push(finding(FindingKind::NonZero {
                    parent,
                    index,
                    value: g.data()[index].to_f64(),
                }));
                break;
            }
        }
    }
    AuditReport { findings }
}
