//! The ops that keep every element and change only the shape: reshape (one -1 inferred),
//! flatten (torch.flatten) and broadcast_to. Reshape and flatten are views of the same data,
//! their VJP the cotangent reshaped back; broadcast_to's VJP sums the broadcast axes back.

use super::resolve_axis;
use crate::ops::{linear_shell, Arity, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::kernels::{broadcast_shape, broadcast_to, sum_to};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// New shape with the same element count; at most one -1, which is inferred.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reshape {
    pub shape: Vec<isize>,
}

impl OpRules for Reshape {
    fn arity(&self) -> Arity {
        Arity::Exact(1)
    }
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        reshape_target(&self.shape, inputs[0])
    }
    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        reshape_forward(self, x[0])
    }
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        reshape_vjp(ctx, cot)
    }
    linear_shell!();
}

impl std::fmt::Display for Reshape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "reshape(shape={:?})", self.shape)
    }
}

/// The target of `reshape(spec)` for an input of shape `input`.
fn reshape_target(spec: &[isize], input: &Shape) -> Result<Shape> {
    let fail = |why: &str| {
        Error::invalid(
            "reshape",
            format!(
                "cannot reshape {input} ({} elements) to {spec:?}: {why}",
                input.numel()
            ),
        )
    };
    let mut inferred = None;
    let mut known: usize = 1;
    let mut dims = Vec::with_capacity(spec.len());
    for (i, &d) in spec.iter().enumerate() {
        if d == -1 {
            if inferred.is_some() {
                return Err(fail("only one dimension may be -1"));
            }
            inferred = Some(i);
            dims.push(0);
        } else if d < 0 {
            return Err(fail("dimensions must be non-negative or -1"));
        } else {
            known = known
                .checked_mul(d as usize)
                .ok_or_else(|| fail("the shape has too many elements"))?;
            dims.push(d as usize);
        }
    }
    match inferred {
        Some(i) => {
            if known == 0 {
                return Err(fail(
                    "the -1 is ambiguous when the other dimensions hold zero elements",
                ));
            }
            if input.numel() % known != 0 {
                return Err(fail(
                    "the element count is not divisible by the given dimensions",
                ));
            }
            dims[i] = input.numel() / known;
        }
        None if known != input.numel() => return Err(fail("the element counts differ")),
        None => {}
    }
    Shape::new(dims).map_err(|_| fail("the shape has too many elements"))
}

/// Merges axes start_dim..=end_dim into one (torch.flatten).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flatten {
    pub start_dim: isize,
    pub end_dim: isize,
}

impl OpRules for Flatten {
    fn arity(&self) -> Arity {
        Arity::Exact(1)
    }
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        let x = inputs[0];
        let (s, e) = flatten_range(self.start_dim, self.end_dim, x)?;
        if x.rank() == 0 {
            return Shape::new([1]);
        }
        let mut dims = x.dims()[..s].to_vec();
        dims.push(x.dims()[s..=e].iter().product());
        dims.extend_from_slice(&x.dims()[e + 1..]);
        Shape::new(dims)
    }
    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        reshape_forward(self, x[0])
    }
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        reshape_vjp(ctx, cot)
    }
    linear_shell!();
}

impl std::fmt::Display for Flatten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "flatten(start_dim={}, end_dim={})",
            self.start_dim, self.end_dim
        )
    }
}

/// The normalised (start, end) of a flatten, checked.
fn flatten_range(start_dim: isize, end_dim: isize, shape: &Shape) -> Result<(usize, usize)> {
    let s = resolve_axis("flatten", "start_dim", start_dim, shape, true)?;
    let e = resolve_axis("flatten", "end_dim", end_dim, shape, true)?;
    if s > e {
        return Err(Error::invalid(
            "flatten",
            format!("start_dim {start_dim} comes after end_dim {end_dim} (input shape {shape})"),
        ));
    }
    Ok((s, e))
}

/// The forward of reshape and flatten: `x`'s data under the op's output shape.
fn reshape_forward<S: Scalar>(op: &impl OpRules, x: &Tensor<S>) -> Result<Forward<S>> {
    let shape = op.output_shape(&[x.shape()])?;
    Ok(Forward::new(x.reshape_to(&shape)?))
}

/// The VJP of reshape and flatten: the cotangent under the input's shape.
fn reshape_vjp<S: Scalar>(ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
    if !ctx.needs(0) {
        return Ok(smallvec![None]);
    }
    Ok(smallvec![Some(cot.reshape_to(&ctx.input_shapes[0])?)])
}

/// Broadcasts to a shape (torch.broadcast_to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BroadcastTo {
    pub shape: Vec<usize>,
}

impl OpRules for BroadcastTo {
    fn arity(&self) -> Arity {
        Arity::Exact(1)
    }
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        let (x, shape) = (inputs[0], &self.shape);
        let fail = || {
            Error::invalid(
                "broadcast_to",
                format!("cannot broadcast shape {x} to {shape:?}"),
            )
        };
        let target = Shape::new(shape.clone()).map_err(|_| fail())?;
        match broadcast_shape("broadcast_to", x, &target) {
            Ok(out) if out == target => Ok(target),
            _ => Err(fail()),
        }
    }
    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        let target = Shape::for_op("broadcast_to", &self.shape)?;
        Ok(Forward::new(broadcast_to(x[0], &target)?))
    }
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        if !ctx.needs(0) {
            return Ok(smallvec![None]);
        }
        Ok(smallvec![Some(sum_to(cot, &ctx.input_shapes[0])?)])
    }
    linear_shell!();
}

impl std::fmt::Display for BroadcastTo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "broadcast_to(shape={:?})", self.shape)
    }
}
