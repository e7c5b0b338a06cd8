//! `Builder`: what a layer constructor needs: the `ParamSet` to add its tensors to, a name prefix
//! (PyTorch's `state_dict` naming) and the seeded stream that initialisers draw from.

use crate::init::Init;
use crate::params::{ParamId, ParamKind, ParamSet};
use rand_chacha::ChaCha8Rng;
use tapegrad_core::Result;
use tapegrad_tensor::{Scalar, Shape};

/// Adds initialised tensors to a model's `ParamSet`, in a fixed order, from one seeded stream.
pub struct Builder<'a, S> {
    params: &'a mut ParamSet<S>,
    rng: &'a mut ChaCha8Rng,
}

impl<'a, S: Scalar> Builder<'a, S> {
    /// A builder adding to `params`, drawing from `rng`.
    pub fn new(params: &'a mut ParamSet<S>, rng: &'a mut ChaCha8Rng) -> Self {
        Builder { params, rng }
    }

    /// Adds a trainable tensor `prefix.name` of `dims`, filled by `init`.
    pub fn trainable(
        &mut self,
        prefix: &str,
        name: &str,
        dims: &[usize],
        init: Init,
    ) -> Result<ParamId> {
        self.add(prefix, name, dims, init, ParamKind::Trainable)
    }

    /// Adds a buffer `prefix.name` of `dims`, filled by `init`.
    pub fn buffer(
        &mut self,
        prefix: &str,
        name: &str,
        dims: &[usize],
        init: Init,
    ) -> Result<ParamId> {
        self.add(prefix, name, dims, init, ParamKind::Buffer)
    }

    /// The current value of a tensor this builder added.
    pub fn value(&self, id: ParamId) -> &tapegrad_tensor::Tensor<S> {
        &self.params.get(id).value
    }

    /// Replaces a tensor's value after initialisation (same shape), e.g. to zero an embedding's
    /// padding row as PyTorch does.
    pub fn set(&mut self, id: ParamId, value: tapegrad_tensor::Tensor<S>) -> Result<()> {
        self.params.set(id, value)
    }

    fn add(
        &mut self,
        prefix: &str,
        name: &str,
        dims: &[usize],
        init: Init,
        kind: ParamKind,
    ) -> Result<ParamId> {
        let shape = Shape::for_op("parameter", dims)?;
        let value = init.tensor(&shape, self.rng)?;
        let full = if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}.{name}")
        };
        self.params.add(full, value, kind)
    }
}
