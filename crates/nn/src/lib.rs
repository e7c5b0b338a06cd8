//! The training layer of tapegrad: named parameters and seeded initialisers, layers and the MLP
//! builder, optimizers with PyTorch's update rules, learning-rate schedules and gradient clipping,
//! data loading (CSV, embedded tables, standardisation, seeded split and batches), backends, the
//! trainer, metrics, atomic safetensors checkpoints, and SVG loss plots.

#![forbid(unsafe_code)]

pub mod backend;
pub mod benchmarking;
pub mod checkpoint;
pub mod clip;
pub mod data;
mod error;
pub mod exchange;
pub mod gpt;
mod grad;
pub mod init;
pub mod layers;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod params;
pub mod plot;
pub mod presets;
pub mod rng;
pub mod runlog;
pub mod schedule;
pub mod summary;
pub mod trainer;
mod update;
pub mod verify;

pub use backend::{make_backend, Backend, BackendKind};
pub use error::{NnError, NnResult};
pub use grad::Grad;
pub use model::{Model, ModelSpec};
pub use optim::{Optimizer, OptimizerConfig};
pub use params::{Param, ParamId, ParamKind, ParamSet};
pub use schedule::{Decay, Schedule};
pub use trainer::{Evaluation, StepRecord, TrainConfig, Trainer, Which};
