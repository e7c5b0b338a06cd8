//! The ops that join or pick along one axis: concat (torch.cat) and slice with Python semantics
//! (`Span`: negative bounds count from the end, out-of-range bounds clamp). The VJP of each
//! takes back its arguments' parts: concat slices the cotangent, slice scatters it into zeros.

use super::resolve_axis;
use crate::ops::{linear_shell, Arity, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::kernels::layout::concat_shape;
use tapegrad_tensor::kernels::softmax::split_at_axis;
use tapegrad_tensor::kernels::{concat, slice};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// Concatenates its arguments along `axis` (torch.cat).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concat {
    pub axis: isize,
}

impl OpRules for Concat {
    fn arity(&self) -> Arity {
        Arity::AtLeast(1)
    }
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        Ok(concat_shape(inputs, self.axis)?.0)
    }
    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        Ok(Forward::new(concat(x, self.axis)?))
    }
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let shapes = ctx.input_shapes;
        let refs: Vec<&Shape> = shapes.iter().collect();
        let (_, ax) = concat_shape(&refs, self.axis)?;
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
        Ok(grads)
    }
    linear_shell!();
}

impl std::fmt::Display for Concat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "concat(axis={})", self.axis)
    }
}

/// Elements start, start + step, ... below end along `axis`, Python slice semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    pub axis: isize,
    pub start: isize,
    pub end: isize,
    pub step: usize,
}

impl Slice {
    /// The slice resolved against `shape`.
    fn span(&self, shape: &Shape) -> Result<Span> {
        Span::resolve(self.axis, self.start, self.end, self.step, shape)
    }
}

impl OpRules for Slice {
    fn arity(&self) -> Arity {
        Arity::Exact(1)
    }
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        self.span(inputs[0])?.output_shape(inputs[0])
    }
    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        Ok(Forward::new(self.span(x[0].shape())?.take(x[0])?))
    }
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        if !ctx.needs(0) {
            return Ok(smallvec![None]);
        }
        let x = &ctx.input_shapes[0];
        Ok(smallvec![Some(self.span(x)?.scatter(cot, x)?)])
    }
    linear_shell!();
}

impl std::fmt::Display for Slice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Slice {
            axis,
            start,
            end,
            step,
        } = self;
        write!(
            f,
            "slice(axis={axis}, start={start}, end={end}, step={step})"
        )
    }
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
