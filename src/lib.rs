//! tapegrad: reverse-mode automatic differentiation and neural-network training in Rust, whose fast
//! executed backward pass is tied to a simple reference semantics by laws its tests check.
//! This facade re-exports the layers: `tensor`, `core` (ops, tape, graph, laws), `nn`.

#![forbid(unsafe_code)]
// The README's examples compile and run as doc tests.
#![doc = include_str!("../README.md")]

pub use tapegrad_core as core;
pub use tapegrad_core::{
    audit, ops, tape, Error, Op, Result, Scalar, Session, Shape, Tape, Tensor, Var,
};
pub use tapegrad_nn as nn;
pub use tapegrad_tensor as tensor;
