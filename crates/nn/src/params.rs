//! `ParamSet`: every named tensor a model owns, in registration order: trainable parameters (which
//! get gradients and optimizer updates) and buffers (running statistics, saved but not trained).
//! Names follow PyTorch's `state_dict` convention (`0.weight`, `3.running_mean`).

use tapegrad_core::{Error, Result};
use tapegrad_tensor::{Scalar, Tensor};

/// Index of a tensor in its `ParamSet`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ParamId(pub(crate) usize);

impl ParamId {
    /// Position in registration order.
    pub fn index(self) -> usize {
        self.0
    }
}

/// Whether a tensor is trained or only carried along.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// Gets a gradient and an optimizer update.
    Trainable,
    /// Updated by the forward pass in training mode (running statistics), never by an optimizer.
    Buffer,
}

/// One named tensor of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct Param<S> {
    pub name: String,
    pub value: Tensor<S>,
    pub kind: ParamKind,
}

/// The named tensors of a model, in registration order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParamSet<S> {
    params: Vec<Param<S>>,
}

impl<S: Scalar> ParamSet<S> {
    /// An empty set.
    pub fn new() -> Self {
        ParamSet { params: Vec::new() }
    }

    /// Adds a tensor; a repeated name is an error.
    pub fn add(
        &mut self,
        name: impl Into<String>,
        value: Tensor<S>,
        kind: ParamKind,
    ) -> Result<ParamId> {
        let name = name.into();
        if self.params.iter().any(|p| p.name == name) {
            return Err(Error::invalid(
                "param_set",
                format!("a parameter named '{name}' already exists"),
            ));
        }
        self.params.push(Param { name, value, kind });
        Ok(ParamId(self.params.len() - 1))
    }

    /// The tensor with id `id`.
    pub fn get(&self, id: ParamId) -> &Param<S> {
        &self.params[id.0]
    }

    /// Replaces the value of `id`; its shape must not change.
    pub fn set(&mut self, id: ParamId, value: Tensor<S>) -> Result<()> {
        let p = &mut self.params[id.0];
        if p.value.shape() != value.shape() {
            return Err(Error::from(tapegrad_core::OpError::ShapeMismatch {
                op: "param_set",
                expected: Box::new(p.value.shape().clone()),
                found: Box::new(value.shape().clone()),
            }));
        }
        p.value = value;
        Ok(())
    }

    /// The tensor called `name`.
    pub fn find(&self, name: &str) -> Option<ParamId> {
        self.params.iter().position(|p| p.name == name).map(ParamId)
    }

    /// Every tensor in registration order.
    pub fn iter(&self) -> impl Iterator<Item = &Param<S>> {
        self.params.iter()
    }

    /// Every tensor, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Param<S>> {
        self.params.iter_mut()
    }

    /// The trainable tensors in registration order.
    pub fn trainable(&self) -> impl Iterator<Item = &Param<S>> {
        self.params
            .iter()
            .filter(|p| p.kind == ParamKind::Trainable)
    }

    /// The trainable tensors, mutably.
    pub fn trainable_mut(&mut self) -> impl Iterator<Item = &mut Param<S>> {
        self.params
            .iter_mut()
            .filter(|p| p.kind == ParamKind::Trainable)
    }

    /// Number of tensors (trainable and buffers).
    pub fn len(&self) -> usize {
        self.params.len()
    }

    /// True when the set holds nothing.
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// Number of trainable scalars.
    pub fn trainable_count(&self) -> usize {
        self.trainable().map(|p| p.value.numel()).sum()
    }
}
