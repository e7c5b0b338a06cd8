//! The eager engine: an append-only tape of nodes (docs/design.md section 3), its three backward
//! sweeps, the zero-preserving audit, and the imperative `Session` front-end built on it.

mod anomaly;
mod audit;
pub(crate) mod finals;
mod node;
mod parents;
mod session;
mod session_nn;
mod steps;
mod sweeps;
#[allow(clippy::module_inception)]
mod tape;

pub use audit::{audit, AuditFinding, AuditReport, FindingKind};
pub use finals::OnFinal;
pub use node::{Contributions, CustomVjp, Node, NodeSaved, Rule};
pub use parents::Parents;
pub use session::{Gradients, Session, Var};
pub use tape::Tape;
