//! Reductions over chosen axes (sum, mean, amax, logsumexp with keepdim or not) and the softmax
//! family along one axis. `axes: None` reduces every axis; an empty list reduces none. A rank-0
//! input accepts axis 0 and -1 as PyTorch does (reducing it is the identity; its softmax is 1).

use super::{Arity, Forward, Grads, OpKind, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::kernels::softmax::split_at_axis;
use tapegrad_tensor::kernels::{
    binary_map, expand_reduced, log_softmax, max_axes, mean_axes, reduced_shape, softmax, sum_axes,
};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// Reductions and softmax-like ops (one argument).
#[derive(Debug, Clone, PartialEq)]
pub enum ReduceOp {
    Sum {
        axes: Option<Vec<isize>>,
        keepdim: bool,
    },
    /// Mean over axes; the mean of zero elements is NaN (PyTorch).
    Mean {
        axes: Option<Vec<isize>>,
        keepdim: bool,
    },
    /// Maximum over axes; tied maxima share the gradient equally.
    Amax {
        axes: Option<Vec<isize>>,
        keepdim: bool,
    },
    /// `log(sum(exp(x)))` over axes (torch.logsumexp), shifted by the maximum so that large
    /// values neither overflow nor lose the small ones; over zero elements it is -inf.
    LogSumExp {
        axes: Option<Vec<isize>>,
        keepdim: bool,
    },
    Softmax {
        axis: isize,
    },
    LogSoftmax {
        axis: isize,
    },
}

use ReduceOp as R;

impl ReduceOp {
    /// The reduction over axes of this kind (sum, mean, amax, logsumexp), `None` for any other
    /// kind. The reductions over axes share their attributes, so the graph file reads them alike.
    pub fn over_axes(kind: OpKind, axes: Option<Vec<isize>>, keepdim: bool) -> Option<ReduceOp> {
        Some(match kind {
            OpKind::Sum => R::Sum { axes, keepdim },
            OpKind::Mean => R::Mean { axes, keepdim },
            OpKind::Amax => R::Amax { axes, keepdim },
            OpKind::LogSumExp => R::LogSumExp { axes, keepdim },
            _ => return None,
        })
    }

    /// The axes (`None`: every axis) and `keepdim` of a reduction over axes; `None` for the
    /// softmax family, which works along one axis.
    pub fn axes_and_keepdim(&self) -> Option<(Option<&[isize]>, bool)> {
        match self {
            R::Sum { axes, keepdim }
            | R::Mean { axes, keepdim }
            | R::Amax { axes, keepdim }
            | R::LogSumExp { axes, keepdim } => Some((axes.as_deref(), *keepdim)),
            R::Softmax { .. } | R::LogSoftmax { .. } => None,
        }
    }
}

/// Normalises one signed axis. A rank-0 tensor is treated as having one axis, as PyTorch does.
fn resolve_axis(op: &'static str, axis: isize, shape: &Shape) -> Result<usize> {
    let r = shape.rank().max(1) as isize;
    let a = if axis < 0 {
        axis.saturating_add(r)
    } else {
        axis
    };
    if a < 0 || a >= r {
        return Err(Error::invalid(
            op,
            format!(
                "axis {axis} is out of range for input of shape {shape} (rank {})",
                shape.rank()
            ),
        ));
    }
    Ok(a as usize)
}

/// The reduced axes, normalised and sorted. `None` means every axis; on a rank-0 input the
/// (validated) axes reduce nothing.
fn resolve_axes(op: &'static str, axes: &Option<Vec<isize>>, shape: &Shape) -> Result<Vec<usize>> {
    let Some(list) = axes else {
        return Ok((0..shape.rank()).collect());
    };
    let mut out = list
        .iter()
        .map(|&a| resolve_axis(op, a, shape))
        .collect::<Result<Vec<_>>>()?;
    out.sort_unstable();
    if let Some(w) = out.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::invalid(
            op,
            format!(
                "axis {} is repeated in {list:?} (input shape {shape})",
                w[0]
            ),
        ));
    }
    if shape.rank() == 0 {
        out.clear();
    }
    Ok(out)
}

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

/// Whether `x` is one of the maxima `m` of its slice; a NaN maximum is matched by NaN elements.
fn is_max<S: Scalar>(x: S, m: S) -> bool {
    x == m || (x.is_nan() && m.is_nan())
}

/// 1 where `x` attains the maximum of its slice, 0 elsewhere (input shape).
fn max_mask<S: Scalar>(x: &Tensor<S>, y: &Tensor<S>, axes: &[usize]) -> Result<Tensor<S>> {
    let kept = reduced_shape(x.shape(), axes, true)?;
    let y = y.reshape_to(&kept)?;
    binary_map(
        "amax",
        x,
        &y,
        |x, m| if is_max(x, m) { S::ONE } else { S::ZERO },
    )
}

/// logsumexp over `ax` (normalised, not empty): `ln(sum(exp(x - s))) + m` with `m` the maximum
/// (NaN propagates) and `s` the shift, `m` where finite and 0 otherwise, as PyTorch computes it:
/// a slice of -inf gives -inf, one holding +inf gives +inf. The sum is pairwise, like softmax's
/// denominator.
fn logsumexp<S: Scalar>(x: &Tensor<S>, ax: &[usize], keepdim: bool) -> Result<Tensor<S>> {
    let name = "logsumexp";
    let out_shape = reduced_shape(x.shape(), ax, keepdim)?;
    if ax.iter().any(|&a| x.dims()[a] == 0) {
        // The log of an empty sum.
        let n = out_shape.numel();
        return Tensor::from_shape(out_shape, vec![S::NEG_INFINITY; n]);
    }
    let m = max_axes(x, ax, true)?;
    let shift = |m: S| if m.is_finite() { m } else { S::ZERO };
    let terms = binary_map(name, x, &m, |x, m| (x - shift(m)).exp())?;
    let total = sum_axes(&terms, ax, true)?;
    binary_map(name, &total, &m, |t, m| t.ln() + m)?.reshape_to(&out_shape)
}

/// `exp(x - y)` with `y` (a logsumexp over `ax`) broadcast back: the softmax over the reduced
/// axes, which is logsumexp's derivative (over no axis, 1 where `x` is finite).
fn softmax_over<S: Scalar>(x: &Tensor<S>, y: &Tensor<S>, ax: &[usize]) -> Result<Tensor<S>> {
    let kept = reduced_shape(x.shape(), ax, true)?;
    binary_map("logsumexp", x, &y.reshape_to(&kept)?, |x, y| (x - y).exp())
}

impl OpRules for ReduceOp {
    fn arity(&self) -> Arity {
        Arity::Exact(1)
    }

    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        let (name, shape) = (self.name(), inputs[0]);
        match self {
            R::Sum { axes, keepdim }
            | R::Mean { axes, keepdim }
            | R::Amax { axes, keepdim }
            | R::LogSumExp { axes, keepdim } => {
                let ax = resolve_axes(name, axes, shape)?;
                if matches!(self, R::Amax { .. }) {
                    if let Some(&a) = ax.iter().find(|&&a| shape.dim(a) == 0) {
                        return Err(Error::invalid(
                            name,
                            format!(
                                "cannot take the max over axis {a} of length 0 (input shape {shape})"
                            ),
                        ));
                    }
                }
                reduced_shape(shape, &ax, *keepdim)
            }
            R::Softmax { axis } | R::LogSoftmax { axis } => {
                resolve_axis(name, *axis, shape)?;
                Ok(shape.clone())
            }
        }
    }

    fn saves(&self) -> Saves {
        match self {
            R::Sum { .. } | R::Mean { .. } => Saves::NOTHING,
            // The VJP is `cot * exp(x - y)`: both the input and the output.
            R::Amax { .. } | R::LogSumExp { .. } => Saves::inputs(&[0]).with_output(),
            R::Softmax { .. } | R::LogSoftmax { .. } => Saves::OUTPUT,
        }
    }

    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        let (name, x) = (self.name(), x[0]);
        let out = match self {
            R::Sum { axes, keepdim }
            | R::Mean { axes, keepdim }
            | R::Amax { axes, keepdim }
            | R::LogSumExp { axes, keepdim } => {
                let ax = resolve_axes(name, axes, x.shape())?;
                if ax.is_empty() {
                    x.clone()
                } else {
                    match self {
                        R::Sum { .. } => sum_axes(x, &ax, *keepdim)?,
                        R::Mean { .. } => mean_axes(x, &ax, *keepdim)?,
                        R::LogSumExp { .. } => logsumexp(x, &ax, *keepdim)?,
                        _ => max_axes(x, &ax, *keepdim)?,
                    }
                }
            }
            R::Softmax { axis } | R::LogSoftmax { axis } => {
                let ax = resolve_axis(name, *axis, x.shape())?;
                // A scalar is one row of length 1.
                let x1 = if x.rank() == 0 {
                    x.reshape(&[1])?
                } else {
                    x.clone()
                };
                let y = if matches!(self, R::Softmax { .. }) {
                    softmax(&x1, ax)?
                } else {
                    log_softmax(&x1, ax)?
                };
                y.reshape_to(x.shape())?
            }
        };
        Ok(Forward::new(out))
    }

    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        if !ctx.needs(0) {
            return Ok(smallvec![None]);
        }
        let name = self.name();
        let in_shape = &ctx.input_shapes[0];
        let grad = match self {
            R::Sum { axes, keepdim }
            | R::Mean { axes, keepdim }
            | R::Amax { axes, keepdim }
            | R::LogSumExp { axes, keepdim } => {
                let ax = resolve_axes(name, axes, in_shape)?;
                if let R::LogSumExp { .. } = self {
                    // Over no axis (a rank-0 input, an empty list) too, where the derivative is
                    // exp(x - y) = 1 but NaN at an infinite x, as PyTorch's.
                    let (x, y) = (ctx.input(name, 0)?, ctx.output(name)?);
                    let g = if ax.is_empty() {
                        cot.clone()
                    } else {
                        expand_reduced(cot, in_shape, &ax, *keepdim)?
                    };
                    let grad = binary_map(name, &g, &softmax_over(x, y, &ax)?, |g, p| g * p)?;
                    return Ok(smallvec![Some(grad)]);
                }
                if ax.is_empty() {
                    return Ok(smallvec![Some(cot.clone())]);
                }
                match self {
                    R::Sum { .. } => expand_reduced(cot, in_shape, &ax, *keepdim)?,
                    R::Mean { .. } => {
                        // A zero count means an empty input, so the division never runs.
                        let count = S::from_usize(ax.iter().map(|&a| in_shape.dim(a)).product());
                        expand_reduced(cot, in_shape, &ax, *keepdim)?.map(|g| g / count)
                    }
                    _ => {
                        let (x, y) = (ctx.input(name, 0)?, ctx.output(name)?);
                        let mask = max_mask(x, y, &ax)?;
                        let count = sum_axes(&mask, &ax, true)?;
                        let kept = count.shape().clone();
                        let share =
                            binary_map(name, &cot.reshape_to(&kept)?, &count, |g, k| g / k)?;
                        // Select rather than multiply, so an infinite share meets no 0 * inf.
                        binary_map(
                            name,
                            &mask,
                            &share,
                            |m, s| {
                                if m != S::ZERO {
                                    s
                                } else {
                                    S::ZERO
                                }
                            },
                        )?
                    }
                }
            }
            R::Softmax { axis } => {
                let y = ctx.output(name)?;
                let ax = resolve_axis(name, *axis, in_shape)?;
                with_row_sums(name, cot, y, ax, |g, y| g * y, |g, y, s| y * (g - s))?
            }
            R::LogSoftmax { axis } => {
                let y = ctx.output(name)?;
                let ax = resolve_axis(name, *axis, in_shape)?;
                with_row_sums(name, cot, y, ax, |g, _| g, |g, y, s| g - y.exp() * s)?
            }
        };
        Ok(smallvec![Some(grad)])
    }

    fn jvp<S: Scalar>(
        &self,
        x: &[&Tensor<S>],
        out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        let (name, x, t, y) = (self.name(), x[0], t[0], &out.value);
        Ok(match self {
            R::Sum { axes, keepdim }
            | R::Mean { axes, keepdim }
            | R::Amax { axes, keepdim }
            | R::LogSumExp { axes, keepdim } => {
                let ax = resolve_axes(name, axes, x.shape())?;
                if let R::LogSumExp { .. } = self {
                    let terms = binary_map(name, t, &softmax_over(x, y, &ax)?, |t, p| t * p)?;
                    return if ax.is_empty() {
                        Ok(terms)
                    } else {
                        sum_axes(&terms, &ax, *keepdim)
                    };
                }
                if ax.is_empty() {
                    return Ok(t.clone());
                }
                match self {
                    R::Sum { .. } => sum_axes(t, &ax, *keepdim)?,
                    // Over zero elements the output is a constant NaN, whose derivative is 0.
                    R::Mean { .. } if ax.iter().any(|&a| x.dims()[a] == 0) => {
                        Tensor::zeros(y.shape())
                    }
                    R::Mean { .. } => mean_axes(t, &ax, *keepdim)?,
                    _ => {
                        // At ties the derivative is the mean of the tied tangents (adjoint to the VJP).
                        let mask = max_mask(x, y, &ax)?;
                        let picked =
                            mask.zip_map(t, name, |m, t| if m != S::ZERO { t } else { S::ZERO })?;
                        let total = sum_axes(&picked, &ax, *keepdim)?;
                        let count = sum_axes(&mask, &ax, *keepdim)?;
                        total.zip_map(&count, name, |s, k| s / k)?
                    }
                }
            }
            R::Softmax { axis } => {
                let ax = resolve_axis(name, *axis, x.shape())?;
                with_row_sums(name, t, y, ax, |t, y| t * y, |t, y, s| y * (t - s))?
            }
            R::LogSoftmax { axis } => {
                let ax = resolve_axis(name, *axis, x.shape())?;
                with_row_sums(name, t, y, ax, |t, y| y.exp() * t, |t, _, s| t - s)?
            }
        })
    }
}

impl std::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            R::Sum { axes, keepdim }
            | R::Mean { axes, keepdim }
            | R::Amax { axes, keepdim }
            | R::LogSumExp { axes, keepdim } => {
                let axes = match axes {
                    Some(a) => format!("{a:?}"),
                    None => "None".to_string(),
                };
                write!(f, "{}(axes={axes}, keepdim={keepdim})", self.name())
            }
            R::Softmax { axis } | R::LogSoftmax { axis } => {
                write!(f, "{}(axis={axis})", self.name())
            }
        }
    }
}
