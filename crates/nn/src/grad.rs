//! `Grad`: a trainable tensor's gradient as a training step hands it to the optimizer. Either a
//! dense tensor, or, for the weight of a linear layer that reads the batch, the two factors whose
//! product `rows^T cols` is that gradient, which plain SGD applies without writing the gradient.

use tapegrad_tensor::kernels::linear::linear_weight_grad;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// One trainable tensor's gradient.
///
/// Multiplied out ([`Grad::into_dense`]) a factored gradient has the dense gradient's bits. Plain
/// SGD applies a one-row one with those bits too, but a factored gradient of `B > 1` rows goes
/// into the weight as one GEMM, `p + (-lr) * (rows^T cols)`, rounded once per GEMM depth block
/// (see `Optimizer::step_grads`), so that step is within a few roundings of the dense step, not
/// bit-equal to it; both backends hand over the same factors, so they still agree bit for bit.
#[derive(Debug, Clone)]
pub enum Grad<S> {
    /// The gradient itself.
    Dense(Tensor<S>),
    /// `rows^T cols`: `rows` is a linear layer's output cotangent seen as `(B, out)` (its last
    /// axis is `out`, the others are flattened into `B`), `cols` the layer's input seen as
    /// `(B, in)`, and the gradient is the `(out, in)` matrix linear's weight VJP would have
    /// computed from them (for `B = 1`, the outer product, `rows[i] * cols[j]`).
    Outer { rows: Tensor<S>, cols: Tensor<S> },
}

/// A factored gradient's sizes: the rows `B` its product sums over, and its `(out, in)` shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OuterDims {
    pub batch: usize,
    pub out: usize,
    pub inn: usize,
}

/// A tensor seen as a matrix `(product of the leading axes, last axis)`, a scalar as `(1, 1)`.
fn as_rows<S: Scalar>(t: &Tensor<S>) -> (usize, usize) {
    match t.dims().split_last() {
        Some((&last, lead)) => (lead.iter().product(), last),
        None => (1, 1),
    }
}

impl OuterDims {
    /// The sizes of `rows^T cols`, or an error when the two factors have different row counts.
    pub(crate) fn of<S: Scalar>(rows: &Tensor<S>, cols: &Tensor<S>) -> Result<OuterDims> {
        let ((batch, out), (cols_batch, inn)) = (as_rows(rows), as_rows(cols));
        if batch != cols_batch {
            return Err(Error::invalid(
                "optimizer",
                format!(
                    "a factored gradient needs factors with as many rows, found {} and {}",
                    rows.shape(),
                    cols.shape()
                ),
            ));
        }
        Ok(OuterDims { batch, out, inn })
    }
}

impl<S: Scalar> Grad<S> {
    /// The gradient's shape: `[out, in]` for the factored form.
    pub fn shape(&self) -> Result<Shape> {
        match self {
            Grad::Dense(t) => Ok(t.shape().clone()),
            Grad::Outer { rows, cols } => {
                let d = OuterDims::of(rows, cols)?;
                Shape::new([d.out, d.inn])
            }
        }
    }

    /// The dense gradient. The factored form is multiplied out by linear's own weight-gradient
    /// kernel (`tapegrad_tensor::kernels::linear::linear_weight_grad`), so it has the bits the dense
    /// step's gradient has.
    pub fn into_dense(self) -> Result<Tensor<S>> {
        match self {
            Grad::Dense(t) => Ok(t),
            Grad::Outer { rows, cols } => {
                let d = OuterDims::of(&rows, &cols)?;
                let rows = rows.reshape(&[d.batch, d.out])?;
                let cols = cols.reshape(&[d.batch, d.inn])?;
                linear_weight_grad(&rows, &cols)
            }
        }
    }

    /// Every gradient dense, in order.
    pub fn all_dense(grads: Vec<Grad<S>>) -> Result<Vec<Tensor<S>>> {
        grads.into_iter().map(Grad::into_dense).collect()
    }
}

/// The error for a factored gradient whose product does not match the parameter's shape.
pub(crate) fn outer_mismatch(param: &Shape, d: OuterDims) -> Error {
    Error::invalid(
        "optimizer",
        format!(
            "a factored gradient of {} x {} elements for a parameter of shape {param}",
            d.out, d.inn
        ),
    )
}
