//! The reductions over axes that follow the maximum: amax (tied maxima share the gradient
//! equally) and logsumexp (shifted by the maximum, its derivative the softmax over the reduced
//! axes). Both keep the input and the output for the VJP.

use super::{over_axes_shell, OverAxes};
use crate::ops::{Arity, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::kernels::{binary_map, expand_reduced, max_axes, reduced_shape, sum_axes};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// Maximum over axes; tied maxima share the gradient equally.
#[derive(Debug, Clone, PartialEq)]
pub struct Amax {
    pub axes: Option<Vec<isize>>,
    pub keepdim: bool,
}

impl OverAxes for Amax {
    fn axes(&self) -> (&Option<Vec<isize>>, bool) {
        (&self.axes, self.keepdim)
    }
    fn check_axes(&self, ax: &[usize], shape: &Shape) -> Result<()> {
        match ax.iter().find(|&&a| shape.dim(a) == 0) {
            Some(&a) => Err(Error::invalid(
                self.name(),
                format!("cannot take the max over axis {a} of length 0 (input shape {shape})"),
            )),
            None => Ok(()),
        }
    }
    fn reduce<S: Scalar>(&self, x: &Tensor<S>, ax: &[usize]) -> Result<Tensor<S>> {
        max_axes(x, ax, self.keepdim)
    }
    fn reduce_vjp<S: Scalar>(
        &self,
        ctx: &VjpContext<'_, S>,
        cot: &Tensor<S>,
        ax: &[usize],
    ) -> Result<Tensor<S>> {
        let name = self.name();
        let (x, y) = (ctx.input(name, 0)?, ctx.output(name)?);
        let mask = max_mask(x, y, ax)?;
        let count = sum_axes(&mask, ax, true)?;
        let kept = count.shape().clone();
        let share = binary_map(name, &cot.reshape_to(&kept)?, &count, |g, k| g / k)?;
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
        )
    }
    fn reduce_jvp<S: Scalar>(
        &self,
        x: &Tensor<S>,
        y: &Tensor<S>,
        t: &Tensor<S>,
        ax: &[usize],
    ) -> Result<Tensor<S>> {
        let name = self.name();
        // At ties the derivative is the mean of the tied tangents (adjoint to the VJP).
        let mask = max_mask(x, y, ax)?;
        let picked = mask.zip_map(t, name, |m, t| if m != S::ZERO { t } else { S::ZERO })?;
        let total = sum_axes(&picked, ax, self.keepdim)?;
        let count = sum_axes(&mask, ax, self.keepdim)?;
        total.zip_map(&count, name, |s, k| s / k)
    }
}

impl OpRules for Amax {
    over_axes_shell!();
    fn saves(&self) -> Saves {
        Saves::inputs(&[0]).with_output()
    }
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

/// `log(sum(exp(x)))` over axes (torch.logsumexp), shifted by the maximum so that large
/// values neither overflow nor lose the small ones; over zero elements it is -inf.
#[derive(Debug, Clone, PartialEq)]
pub struct LogSumExp {
    pub axes: Option<Vec<isize>>,
    pub keepdim: bool,
}

impl OverAxes for LogSumExp {
    const IDENTITY_OVER_NO_AXIS: bool = false;
    fn axes(&self) -> (&Option<Vec<isize>>, bool) {
        (&self.axes, self.keepdim)
    }
    fn reduce<S: Scalar>(&self, x: &Tensor<S>, ax: &[usize]) -> Result<Tensor<S>> {
        logsumexp(x, ax, self.keepdim)
    }
    fn reduce_vjp<S: Scalar>(
        &self,
        ctx: &VjpContext<'_, S>,
        cot: &Tensor<S>,
        ax: &[usize],
    ) -> Result<Tensor<S>> {
        let name = self.name();
        let (x, y) = (ctx.input(name, 0)?, ctx.output(name)?);
        let g = if ax.is_empty() {
            cot.clone()
        } else {
            expand_reduced(cot, &ctx.input_shapes[0], ax, self.keepdim)?
        };
        binary_map(name, &g, &softmax_over(x, y, ax)?, |g, p| g * p)
    }
    fn reduce_jvp<S: Scalar>(
        &self,
        x: &Tensor<S>,
        y: &Tensor<S>,
        t: &Tensor<S>,
        ax: &[usize],
    ) -> Result<Tensor<S>> {
        let terms = binary_map(self.name(), t, &softmax_over(x, y, ax)?, |t, p| t * p)?;
        if ax.is_empty() {
            Ok(terms)
        } else {
            sum_axes(&terms, ax, self.keepdim)
        }
    }
}

impl OpRules for LogSumExp {
    over_axes_shell!();
    fn saves(&self) -> Saves {
        // The VJP is `cot * exp(x - y)`: both the input and the output.
        Saves::inputs(&[0]).with_output()
    }
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
