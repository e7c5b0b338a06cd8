//! Layers and the context they run in. A layer holds only its configuration and the ids of its
//! tensors in the model's `ParamSet`; `forward` records ops on a `Session` through a `Ctx`, which
//! registers every parameter once per step, carries the train/eval mode and the dropout stream,
//! and collects buffer updates (running statistics) to apply after the step.

mod activation;
mod attention;
mod builder;
mod conv;
mod ctx;
mod dropout;
mod embedding;
mod linear;
mod norm;
mod position;
mod residual;
mod sequential;

pub use activation::Activation;
pub use attention::CausalSelfAttention;
pub use builder::Builder;
pub use conv::{Conv2d, MaxPool2d};
pub use ctx::{Ctx, Mode};
pub use dropout::{dropout_mask, Dropout};
pub use embedding::Embedding;
pub use linear::Linear;
pub use norm::{BatchNorm2d, LayerNorm, RunningStats};
pub use position::TokenPosition;
pub use residual::Residual;
pub use sequential::{Layer, Sequential};
