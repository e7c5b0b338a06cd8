//! `Tensor<S>`: a shape plus a shared, row-major, contiguous buffer. Cloning shares the buffer
//! (an `Arc<[S]>`: count and elements in one allocation), writing through `data_mut` copies it
//! only when it is shared.

use crate::{Error, Result, Scalar, Shape};
use std::sync::Arc;

/// A dense row-major tensor whose buffer is shared between clones (copy-on-write).
#[derive(Clone, PartialEq)]
pub struct Tensor<S> {
    shape: Shape,
    data: Arc<[S]>,
}

impl<S: Scalar> Tensor<S> {
    /// A tensor from a shape and row-major data; errors when the lengths differ.
    pub fn new(dims: &[usize], data: Vec<S>) -> Result<Self> {
        let shape = Shape::new(dims)?;
        Self::from_shape(shape, data)
    }

    /// A tensor from an already-built shape and row-major data. The elements are moved into the
    /// shared buffer (one copy); kernels on hot paths build the buffer in place with
    /// [`Tensor::from_iter_exact`] instead.
    pub fn from_shape(shape: Shape, data: Vec<S>) -> Result<Self> {
        if data.len() != shape.numel() {
            return Err(Error::DataLength {
                op: "tensor",
                len: data.len(),
                numel: shape.numel(),
                shape,
            });
        }
        Ok(Tensor {
            shape,
            data: Arc::from(data),
        })
    }

    /// A tensor whose elements are produced by an exact-size iterator, written straight into the
    /// shared buffer (a single allocation); errors when the count differs from the shape's.
    pub fn from_iter_exact<I>(shape: Shape, iter: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        I::IntoIter: ExactSizeIterator,
    {
        let iter = iter.into_iter();
        if iter.len() != shape.numel() {
            return Err(Error::DataLength {
                op: "tensor",
                len: iter.len(),
                numel: shape.numel(),
                shape,
            });
        }
        Ok(Tensor {
            shape,
            data: iter.collect(),
        })
    }

    /// Zeros whose buffer the caller fills at once through `fill` (which sees it unshared).
    pub fn zeros_with(shape: Shape, fill: impl FnOnce(&mut [S])) -> Self {
        let mut t = Self::zeros(&shape);
        fill(t.data_mut());
        t
    }

    /// A tensor from f64 values, rounded to `S`.
    pub fn from_f64(dims: &[usize], data: &[f64]) -> Result<Self> {
        Self::new(dims, data.iter().map(|&v| S::from_f64(v)).collect())
    }

    /// A 0-dimensional tensor.
    pub fn scalar(v: S) -> Self {
        Tensor {
            shape: Shape::scalar(),
            data: Arc::from([v]),
        }
    }

    /// A tensor with every element `v`.
    pub fn full(shape: &Shape, v: S) -> Self {
        Tensor {
            shape: shape.clone(),
            data: std::iter::repeat_n(v, shape.numel()).collect(),
        }
    }

    /// All zeros.
    pub fn zeros(shape: &Shape) -> Self {
        Self::full(shape, S::ZERO)
    }

    /// All ones.
    pub fn ones(shape: &Shape) -> Self {
        Self::full(shape, S::ONE)
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.rank()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }

    /// The row-major elements.
    pub fn data(&self) -> &[S] {
        &self.data
    }

    /// Mutable elements; copies the buffer first if another tensor shares it.
    pub fn data_mut(&mut self) -> &mut [S] {
        Arc::make_mut(&mut self.data)
    }

    /// The buffer as an owned vector (a copy: the shared buffer is not a `Vec`).
    pub fn into_vec(self) -> Vec<S> {
        self.data.to_vec()
    }

    /// Elements widened to f64.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        self.data.iter().map(|v| v.to_f64()).collect()
    }

    /// Converts to another element type (rounding when narrowing).
    pub fn cast<T: Scalar>(&self) -> Tensor<T> {
        Tensor {
            shape: self.shape.clone(),
            data: self.data.iter().map(|v| T::from_f64(v.to_f64())).collect(),
        }
    }

    /// The single element of a one-element tensor.
    pub fn item(&self) -> Result<S> {
        if self.numel() != 1 {
            return Err(Error::invalid(
                "item",
                format!(
                    "tensor of shape {} has {} elements, not 1",
                    self.shape,
                    self.numel()
                ),
            ));
        }
        Ok(self.data[0])
    }

    /// Same buffer, new shape with the same element count (shares the buffer).
    pub fn reshape(&self, dims: &[usize]) -> Result<Self> {
        let shape = Shape::new(dims)?;
        self.reshape_to(&shape)
    }

    /// As [`Tensor::reshape`] with a prepared shape.
    pub fn reshape_to(&self, shape: &Shape) -> Result<Self> {
        if shape.numel() != self.numel() {
            return Err(Error::invalid(
                "reshape",
                format!(
                    "cannot reshape {} ({} elements) to {} ({} elements)",
                    self.shape,
                    self.numel(),
                    shape,
                    shape.numel()
                ),
            ));
        }
        Ok(Tensor {
            shape: shape.clone(),
            data: self.data.clone(),
        })
    }

    /// Applies `f` to every element.
    pub fn map(&self, f: impl Fn(S) -> S) -> Self {
        Tensor {
            shape: self.shape.clone(),
            data: self.data.iter().map(|&v| f(v)).collect(),
        }
    }

    /// Applies `f` to corresponding elements of two same-shaped tensors.
    pub fn zip_map(&self, other: &Self, op: &'static str, f: impl Fn(S, S) -> S) -> Result<Self> {
        if self.shape != other.shape {
            return Err(Error::ShapeMismatch {
                op,
                expected: self.shape.clone(),
                found: other.shape.clone(),
            });
        }
        Ok(Tensor {
            shape: self.shape.clone(),
            data: self
                .data
                .iter()
                .zip(other.data.iter())
                .map(|(&a, &b)| f(a, b))
                .collect(),
        })
    }

    /// True when every element is exactly zero (+0 or -0).
    pub fn is_all_zero(&self) -> bool {
        self.data.iter().all(|&v| v == S::ZERO)
    }

    /// Index and value of the first element that is NaN or infinite.
    pub fn first_non_finite(&self) -> Option<(usize, S)> {
        self.data
            .iter()
            .enumerate()
            .find(|(_, v)| !v.is_finite())
            .map(|(i, &v)| (i, v))
    }

    /// True when the two tensors share one buffer (no copy was made).
    pub fn shares_buffer_with(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.data, &other.data)
    }

    /// Bytes of element storage.
    pub fn nbytes(&self) -> usize {
        self.numel() * std::mem::size_of::<S>()
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for Tensor<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const SHOWN: usize = 16;
        write!(f, "Tensor<{}>{}(", std::any::type_name::<S>(), self.shape)?;
        for (i, v) in self.data.iter().take(SHOWN).enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{v:?}")?;
        }
        if self.data.len() > SHOWN {
            write!(f, ", ... {} more", self.data.len() - SHOWN)?;
        }
        write!(f, ")")
    }
}
