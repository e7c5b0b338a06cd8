//! The softmax family along one axis: softmax and log_softmax. Both keep only their output; the
//! VJP and JVP are row sums along the axis (`with_row_sums`). A rank-0 input is one row of
//! length 1.

use super::resolve_axis;
use crate::ops::{Arity, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::kernels::softmax::split_at_axis;
use tapegrad_tensor::kernels::{log_softmax, softmax};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// What an op of the softmax family defines; `along_axis_shell!` makes its contract from it.
trait AlongAxis: OpRules {
    /// The op's axis attribute.
    fn axis(&self) -> isize;

    /// The kernel along the resolved axis `ax`, on a tensor of rank at least 1.
    fn kernel<S: Scalar>(&self, x: &Tensor<S>, ax: usize) -> Result<Tensor<S>>;

    /// The input's contribution from `cot`, read from the output `y`, along `ax`.
    fn rows_vjp<S: Scalar>(&self, cot: &Tensor<S>, y: &Tensor<S>, ax: usize) -> Result<Tensor<S>>;

    /// The output tangent from the input's tangent `t` and the output `y`, along `ax`.
    fn rows_jvp<S: Scalar>(&self, t: &Tensor<S>, y: &Tensor<S>, ax: usize) -> Result<Tensor<S>>;

    /// The axis, resolved against `shape`.
    fn resolve(&self, shape: &Shape) -> Result<usize> {
        resolve_axis(self.name(), self.axis(), shape)
    }
}

/// The contract of an `AlongAxis` op: one argument, its output kept, the kernel along the
/// resolved axis (a scalar is one row of length 1). Expands to the `OpRules` methods.
macro_rules! along_axis_shell {
    () => {
        fn arity(&self) -> Arity {
            Arity::Exact(1)
        }
        fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
            self.resolve(inputs[0])?;
            Ok(inputs[0].clone())
        }
        fn saves(&self) -> Saves {
            Saves::OUTPUT
        }
        fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
            let x = x[0];
            let ax = self.resolve(x.shape())?;
            // A scalar is one row of length 1.
            let x1 = if x.rank() == 0 {
                x.reshape(&[1])?
            } else {
                x.clone()
            };
            Ok(Forward::new(self.kernel(&x1, ax)?.reshape_to(x.shape())?))
        }
        fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
            if !ctx.needs(0) {
                return Ok(smallvec![None]);
            }
            let y = ctx.output(self.name())?;
            let ax = self.resolve(&ctx.input_shapes[0])?;
            Ok(smallvec![Some(self.rows_vjp(cot, y, ax)?)])
        }
        fn jvp<S: Scalar>(
            &self,
            x: &[&Tensor<S>],
            out: &Forward<S>,
            t: &[&Tensor<S>],
        ) -> Result<Tensor<S>> {
            let ax = self.resolve(x[0].shape())?;
            self.rows_jvp(t[0], &out.value, ax)
        }
    };
}

/// `exp(x) / sum(exp(x))` along `axis`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Softmax {
    pub axis: isize,
}

impl AlongAxis for Softmax {
    fn axis(&self) -> isize {
        self.axis
    }
    fn kernel<S: Scalar>(&self, x: &Tensor<S>, ax: usize) -> Result<Tensor<S>> {
        softmax(x, ax)
    }
    fn rows_vjp<S: Scalar>(&self, cot: &Tensor<S>, y: &Tensor<S>, ax: usize) -> Result<Tensor<S>> {
        with_row_sums(self.name(), cot, y, ax, |g, y| g * y, |g, y, s| y * (g - s))
    }
    fn rows_jvp<S: Scalar>(&self, t: &Tensor<S>, y: &Tensor<S>, ax: usize) -> Result<Tensor<S>> {
        with_row_sums(self.name(), t, y, ax, |t, y| t * y, |t, y, s| y * (t - s))
    }
}

impl OpRules for Softmax {
    along_axis_shell!();
}

/// `x - log(sum(exp(x)))` along `axis`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSoftmax {
    pub axis: isize,
}

impl AlongAxis for LogSoftmax {
    fn axis(&self) -> isize {
        self.axis
    }
    fn kernel<S: Scalar>(&self, x: &Tensor<S>, ax: usize) -> Result<Tensor<S>> {
        log_softmax(x, ax)
    }
    fn rows_vjp<S: Scalar>(&self, cot: &Tensor<S>, y: &Tensor<S>, ax: usize) -> Result<Tensor<S>> {
        with_row_sums(self.name(), cot, y, ax, |g, _| g, |g, y, s| g - y.exp() * s)
    }
    fn rows_jvp<S: Scalar>(&self, t: &Tensor<S>, y: &Tensor<S>, ax: usize) -> Result<Tensor<S>> {
        with_row_sums(self.name(), t, y, ax, |t, y| y.exp() * t, |t, _, s| t - s)
    }
}

impl OpRules for LogSoftmax {
    along_axis_shell!();
}

/// `Display` of the softmax family: `name(axis=..)`.
macro_rules! display_along_axis {
    ($($op:ty),*) => {
        $(
            impl std::fmt::Display for $op {
                fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    write!(f, "{}(axis={})", self.name(), self.axis)
                }
            }
        )*
    };
}

display_along_axis!(Softmax, LogSoftmax);

/// Runs `f(a, b, s)` over every element, where `s` is the sum of `h(a, b)` along `axis` of the
/// element's row. Both tensors have the same shape; a rank-0 shape counts as one row of length 1.
fn with_row_sums<S: Scalar>(
    op: &'static str,
    a: &Tensor<S>,
    b: &Tensor<S>,
    axis: usize,
    h: impl Fn(S, S) -> S,
    f: impl Fn(S, S, S) -> S,
) -> Result<Tensor<S>> {
    if a.shape() != b.shape() {
        return Err(Error::ShapeMismatch {
            op,
            expected: Box::new(a.shape().clone()),
            found: Box::new(b.shape().clone()),
        });
    }
    // Nothing to compute; the row sums below are sized (and walked) by the dims off the axis,
    // which a zero-size tensor may have huge ([3, 2^40, 0] along its last axis: 3 * 2^40 sums).
    if a.numel() == 0 {
        return Tensor::from_shape(a.shape().clone(), Vec::new());
    }
    let dims: &[usize] = if a.rank() == 0 { &[1] } else { a.dims() };
    let (outer, len, inner) = split_at_axis(dims, axis);
    let (ad, bd) = (a.data(), b.data());
    let mut sums = vec![S::ZERO; outer * inner];
    for o in 0..outer {
        let row = &mut sums[o * inner..(o + 1) * inner];
        for j in 0..len {
            let base = (o * len + j) * inner;
            for (i, s) in row.iter_mut().enumerate() {
                *s += h(ad[base + i], bd[base + i]);
            }
        }
    }
    let mut out = Vec::with_capacity(a.numel());
    for o in 0..outer {
        let row = &sums[o * inner..(o + 1) * inner];
        for j in 0..len {
            let base = (o * len + j) * inner;
            for (i, &s) in row.iter().enumerate() {
                out.push(f(ad[base + i], bd[base + i], s));
            }
        }
    }
    Tensor::from_shape(a.shape().clone(), out)
}
