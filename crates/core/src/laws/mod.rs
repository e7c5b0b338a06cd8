//! Reusable law checkers: finite-difference gradient checks and the JVP/VJP adjoint check, per op
//! and per program. Tests and the `tapegrad check` command both call these.

mod gradcheck;
pub mod program;
pub mod registry;

pub use gradcheck::{check_op, op_vjp, CheckReport, Tolerance};
pub use program::{random_program, Program, ProgramConfig, ProgramNode};
pub use registry::{op_cases, NnKind, OpCase, OpKind};
