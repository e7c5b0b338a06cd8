//! The compiled backend: build the model's graph once per batch shape, then run its saved graph
//! every step. It needs the graph IR of `tapegrad_core::graph`, which has not landed yet, so
//! creating it is an error that says so.
//!
//! The plan, so that adding it stays local to this file: trace one eager forward pass (a `Ctx`
//! that records even in eval mode) and turn the tape into a `Graph`: its leaves become inputs (in
//! tape order: parameters and buffers, the batch, dropout masks) and its op nodes become nodes in
//! the same order, so the backward folds contributions in the same order as the tape. The loss
//! stays outside the graph (cross entropy carries the labels as an attribute): each step runs the
//! compiled graph forward on fresh inputs (masks redrawn with `layers::dropout_mask` from the
//! step's stream, in trace order), records the loss on a small session with the output as a leaf,
//! and seeds the saved graph's backward with that leaf's gradient. By laws 3 and 4 this gives the
//! eager backend's bits. Batch norm in training mode needs its batch statistics, which a saved
//! graph does not expose; it would stay eager-only.

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
