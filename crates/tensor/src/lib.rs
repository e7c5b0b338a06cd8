//! The tensor layer of tapegrad: shapes, the `Scalar` trait (f32 and f64), shared row-major tensors
//! (their buffers 64-byte aligned), and the numeric kernels (broadcasting elementwise maps,
//! reductions, softmax, matmul on `gemm`).
//! Nothing here knows about gradients; the ops layer builds on these kernels.

pub mod benchmarking;
mod buffer;
mod error;
pub mod kernels;
pub mod pool;
mod scalar;
mod shape;
mod tensor;

pub use buffer::BUFFER_ALIGN;
pub use error::{Error, Result};
pub use scalar::{DType, Scalar};
pub use shape::{normalize_axes, normalize_axis, Shape};
pub use tensor::Tensor;
