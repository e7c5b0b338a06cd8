//! `Grad`: a trainable tensor's gradient as a training step hands it to the optimizer. Either a
//! dense tensor, or, for the weight of a linear layer whose input is one row, the two factors of
//! that gradient's outer product, which plain SGD applies without ever writing the gradient.

use tapegrad_tensor::kernels::outer_product;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// One trainable tensor's gradient.
#[derive(Debug, Clone)]
pub enum Grad<S> {
    /// The gradient itself.
    Dense(Tensor<S>),
    /// `rows^T cols`, element `(i, j)` the single rounded product `rows[i] * cols[j]`: what
    /// linear's weight VJP computes for a one-row input (`rows` the output's cotangent, `cols`
    /// the input), so materialising it gives the dense gradient's bits.
    Outer { rows: Tensor<S>, cols: Tensor<S> },
}

impl<S: Scalar> Grad<S> {
    /// The gradient's shape: `[rows, cols]` (element counts) for the factored form.
    pub fn shape(&self) -> Result<Shape> {
        match self {
            Grad::Dense(t) => Ok(t.shape().clone()),
            Grad::Outer { rows, cols } => Shape::new([rows.numel(), cols.numel()]),
        }
    }

    /// The dense gradient (the factored form is multiplied out with linear's own kernel).
    pub fn into_dense(self) -> Result<Tensor<S>> {
        match self {
            Grad::Dense(t) => Ok(t),
            Grad::Outer { rows, cols } => {
                let shape = Shape::new([rows.numel(), cols.numel()])?;
                Ok(Tensor::from_writer(shape, |d| {
                    outer_product(rows.data(), cols.data(), d)
                }))
            }
        }
    }

    /// Every gradient dense, in order.
    pub fn all_dense(grads: Vec<Grad<S>>) -> Result<Vec<Tensor<S>>> {
        grads.into_iter().map(Grad::into_dense).collect()
    }
}

/// The error for a factored gradient whose factors do not match the parameter's shape.
pub(crate) fn outer_mismatch(param: &Shape, rows: usize, cols: usize) -> Error {
    Error::invalid(
        "optimizer",
        format!("an outer-product gradient of {rows} x {cols} elements for a parameter of shape {param}"),
    )
}
