//! The compiled backend: build the model's graph once per batch shape, then run its saved graph
//! every step. It needs the graph IR of `tapegrad_core::graph`, which has not landed yet, so
//! creating it is an error that says so.

use super::{Backend, BackendKind, StepOutput};
use crate::data::Batch;
use crate::error::{NnError, NnResult};
use crate::model::Model;
use rand_chacha::ChaCha8Rng;
use tapegrad_tensor::{Scalar, Tensor};

/// Runs a saved graph each step (not available yet).
pub struct Compiled;

const NOT_AVAILABLE: &str =
    "the compiled backend is not available yet: it runs the saved graph of \
tapegrad_core::graph, which this build does not have; use --backend eager";

impl Compiled {
    /// Fails until the graph IR exists.
    pub fn new() -> NnResult<Self> {
        Err(NnError::Config(NOT_AVAILABLE.into()))
    }
}

impl<S: Scalar> Backend<S> for Compiled {
    fn kind(&self) -> BackendKind {
        BackendKind::Compiled
    }

    fn train_step(
        &mut self,
        _model: &Model<S>,
        _batch: &Batch<S>,
        _rng: ChaCha8Rng,
    ) -> NnResult<StepOutput<S>> {
        Err(NnError::Config(NOT_AVAILABLE.into()))
    }

    fn infer(&mut self, _model: &Model<S>, _x: &Tensor<S>) -> NnResult<Tensor<S>> {
        Err(NnError::Config(NOT_AVAILABLE.into()))
    }
}
