//! The differentiation layers of tapegrad: `ops` (every operation defined once), `tape` (the eager
//! engine, its three sweeps, the zero-preserving audit and the imperative session), `graph` (the
//! typed IR, reference backprop, lowering and the saved graph) and `laws` (the reusable checkers).

#![forbid(unsafe_code)]

mod error;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub mod graph;
pub mod laws;
pub mod ops;
pub mod tape;

pub use error::{Error, OpError, Result};
pub use ops::Op;
pub use tape::{audit, Session, Tape, Var};
pub use tapegrad_tensor::{DType, Scalar, Shape, Tensor};
