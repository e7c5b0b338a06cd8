//! Replays of the fixtures PyTorch recorded (crates/core/tests/fixtures/*.py write the .json):
//! values, gradients and refusals must agree. One test binary.

#[path = "../support/ops_nn.rs"]
mod ops_nn_support;

mod conv;
mod float32;
mod ops;
mod pools;
