//! Structural ops that move or copy elements: reshape (one -1 inferred), flatten, broadcast_to,
//! concat along an axis and slice with Python semantics (negative bounds count from the end).
//! All are linear, so none keeps a tensor: their VJPs and JVPs need only shapes and attributes.

use super::{Arity, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::kernels::layout::concat_shape;
use tapegrad_tensor::kernels::softmax::split_at_axis;
use tapegrad_tensor::kernels::{broadcast_shape, broadcast_to, concat, slice, sum_to};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// Shape-changing and copying ops.
#[derive(Debug, Clone, PartialEq)]
pub enum StructureOp {
    /// New shape with the same element count; at most one -1, which is inferred.
    Reshape { shape: Vec<isize> },
    /// Merges axes start_dim..=end_dim into one (torch.flatten).
    Flatten { start_dim: isize, end_dim: isize },
    /// Broadcasts to a shape (torch.broadcast_to).
    BroadcastTo { shape: Vec<usize> },
    /// Concatenates its arguments along `axis` (torch.cat).
    Concat { axis: isize },
    /// Elements start, start + step, ... below end along `axis`, Python slice semantics.
    Slice {
        axis: isize,
        start: isize,
        end: isize,
        step: usize,
    },
}

use StructureOp as St;

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

/// Normalises a signed axis; a rank-0 shape accepts 0 and -1 when `scalar_ok` (torch.flatten).
fn resolve_axis(
    op: &'static str,
    what: &str,
    axis: isize,
    shape: &Shape,
    scalar_ok: bool,
) -> Result<usize> {
    let rank = if scalar_ok {
        shape.rank().max(1)
    } else {
        shape.rank()
    };
    let r = rank as isize;
    let a = if axis < 0 {
        axis.saturating_add(r)
    } else {
        axis
    };
    if a < 0 || a >= r {
        return Err(Error::invalid(
            op,
            format!("{what} {axis} is out of range for input of shape {shape}"),
        ));
    }
    Ok(a as usize)
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

/// A slice resolved against a concrete axis length: the first index, element count and step.
#[derive(Debug, Clone, Copy)]
struct Span {
    axis: usize,
    start: usize,
    count: usize,
    step: usize,
}

impl Span {
    /// Python's `range(len)[start:end:step]` for `step >= 1`: negative bounds count from the end
    /// and out-of-range bounds clamp.
    fn resolve(axis: isize, start: isize, end: isize, step: usize, shape: &Shape) -> Result<Span> {
        if step == 0 {
            return Err(Error::invalid(
                "slice",
                format!("step must be at least 1 (input shape {shape})"),
            ));
        }
        if shape.rank() == 0 {
            return Err(Error::invalid(
                "slice",
                format!("cannot slice a rank-0 tensor (input shape {shape})"),
            ));
        }
        let axis = resolve_axis("slice", "axis", axis, shape, false)?;
        let len = shape.dim(axis) as isize;
        let clamp = |b: isize| {
            let b = if b < 0 { b.saturating_add(len) } else { b };
            b.clamp(0, len) as usize
        };
        let (s, e) = (clamp(start), clamp(end));
        let count = if e > s { (e - s).div_ceil(step) } else { 0 };
        Ok(Span {
            axis,
            start: s,
            count,
            // With fewer than two elements the step is immaterial; 1 keeps the kernel's strides small.
            step: if count > 1 { step } else { 1 },
        })
    }

    fn output_shape(&self, shape: &Shape) -> Result<Shape> {
        let mut dims = shape.dims().to_vec();
        dims[self.axis] = self.count;
        Shape::new(dims)
    }

    fn take<S: Scalar>(&self, t: &Tensor<S>) -> Result<Tensor<S>> {
        let end = if self.count == 0 {
            self.start
        } else {
            self.start + (self.count - 1) * self.step + 1
        };
        slice(t, self.axis, self.start, end, self.step)
    }

    /// The adjoint of `take`: `g` scattered into zeros of `shape`.
    fn scatter<S: Scalar>(&self, g: &Tensor<S>, shape: &Shape) -> Result<Tensor<S>> {
        let (outer, len, inner) = split_at_axis(shape.dims(), self.axis);
        let mut out = vec![S::ZERO; shape.numel()];
        // A zero-size input has nothing to scatter, but may have 2^40 (empty) outer blocks.
        if out.is_empty() {
            return Tensor::from_shape(shape.clone(), out);
        }
        let src = g.data();
        for o in 0..outer {
            for j in 0..self.count {
                let from = (o * self.count + j) * inner;
                let to = (o * len + self.start + j * self.step) * inner;
                out[to..to + inner].copy_from_slice(&src[from..from + inner]);
            }
        }
        Tensor::from_shape(shape.clone(), out)
    }
}

impl OpRules for StructureOp {
    fn arity(&self) -> Arity {
        match self {
            St::Concat { .. } => Arity::AtLeast(1),
            _ => Arity::Exact(1),
        }
    }

    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        let x = inputs[0];
        match self {
            St::Reshape { shape } => reshape_target(shape, x),
            St::Flatten { start_dim, end_dim } => {
                let (s, e) = flatten_range(*start_dim, *end_dim, x)?;
                if x.rank() == 0 {
                    return Shape::new([1]);
                }
                let mut dims = x.dims()[..s].to_vec();
                dims.push(x.dims()[s..=e].iter().product());
                dims.extend_from_slice(&x.dims()[e + 1..]);
                Shape::new(dims)
            }
            St::BroadcastTo { shape } => {
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
            St::Concat { axis } => Ok(concat_shape(inputs, *axis)?.0),
            St::Slice {
                axis,
                start,
                end,
                step,
            } => Span::resolve(*axis, *start, *end, *step, x)?.output_shape(x),
        }
    }

    fn saves(&self) -> Saves {
        Saves::NOTHING
    }

    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        let out = match self {
            St::Reshape { .. } | St::Flatten { .. } => {
                let shape = self.output_shape(&[x[0].shape()])?;
                x[0].reshape_to(&shape)?
            }
            St::BroadcastTo { shape } => {
                broadcast_to(x[0], &Shape::for_op("broadcast_to", shape)?)?
            }
            St::Concat { axis } => concat(x, *axis)?,
            St::Slice {
                axis,
                start,
                end,
                step,
            } => Span::resolve(*axis, *start, *end, *step, x[0].shape())?.take(x[0])?,
        };
        Ok(Forward::new(out))
    }

    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let shapes = ctx.input_shapes;
        let x = &shapes[0];
        let grad = match self {
            St::Concat { axis } => {
                let refs: Vec<&Shape> = shapes.iter().collect();
                let (_, ax) = concat_shape(&refs, *axis)?;
                let mut offset = 0;
                let mut grads = Grads::with_capacity(shapes.len());
                for (i, s) in shapes.iter().enumerate() {
                    let len = s.dim(ax);
                    grads.push(if !ctx.needs(i) {
                        None
                    } else if len == cot.dims()[ax] {
                        Some(cot.clone())
                    } else {
                        Some(slice(cot, ax, offset, offset + len, 1)?)
                    });
                    offset += len;
                }
                return Ok(grads);
            }
            _ if !ctx.needs(0) => return Ok(smallvec![None]),
            St::Reshape { .. } | St::Flatten { .. } => cot.reshape_to(x)?,
            St::BroadcastTo { .. } => sum_to(cot, x)?,
            St::Slice {
                axis,
                start,
                end,
                step,
            } => Span::resolve(*axis, *start, *end, *step, x)?.scatter(cot, x)?,
        };
        Ok(smallvec![Some(grad)])
    }

    fn jvp<S: Scalar>(
        &self,
        _x: &[&Tensor<S>],
        _out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        // Every structural op is linear: its JVP is the op applied to the tangents.
        Ok(self.forward(t)?.value)
    }
}

impl std::fmt::Display for StructureOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            St::Reshape { shape } => write!(f, "reshape(shape={shape:?})"),
            St::Flatten { start_dim, end_dim } => {
                write!(f, "flatten(start_dim={start_dim}, end_dim={end_dim})")
            }
            St::BroadcastTo { shape } => write!(f, "broadcast_to(shape={shape:?})"),
            St::Concat { axis } => write!(f, "concat(axis={axis})"),
            St::Slice {
                axis,
                start,
                end,
                step,
            } => write!(
                f,
                "slice(axis={axis}, start={start}, end={end}, step={step})"
            ),
        }
    }
}
