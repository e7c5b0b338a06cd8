//! `--verify-every N`: the laws of `docs/design.md` checked on a user's own training steps (1, 7,
//! 4 on the compiled backend, 5 and 6 along a random direction), and the same checkers for the
//! whole-model law tests. `Verifier` (in `step`) is the trainer's hook; every checker takes a
//! `Recorded` loss, so any model recorded on a session can be checked.

mod compare;
mod describe;
mod directional;
mod failure;
mod graph;
mod locate;
mod record;
mod saved;
mod step;
mod tape_laws;

pub use compare::{first_difference, Difference, Equality};
pub use describe::{describe_node, LeafLabels};
pub use directional::{directional, epsilon, Directional, FD_STEP, ROUNDING};
pub use failure::{Law, VerifyFailure};
pub use graph::{tape_id_of, TapeGraph};
pub use locate::locate_adjoint;
pub use record::Recorded;
pub use saved::saved_graph;
pub use step::{direction_rng, CheckResult, StepCheck, StepVerification, Verifier, VerifyStats};
pub use tape_laws::{executed_reference, lowered_executed, zero_preserving};
