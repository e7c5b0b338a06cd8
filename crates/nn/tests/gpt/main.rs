//! The GPT's tests, one test binary: the laws on the model, training on Shakespeare, gradient
//! accumulation, checkpoints, and the PyTorch round trip of its weights.

mod accumulate;
mod checkpoint;
mod laws;
mod pytorch;
mod training;
