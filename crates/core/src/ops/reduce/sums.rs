//! The linear reductions over axes: sum and mean. Their VJP spreads the cotangent back over the
//! reduced axes (divided by the count for mean) and reads no value; their JVP is the same
//! reduction of the tangent.

use super::{over_axes_shell, OverAxes};
use crate::ops::{Arity, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::kernels::{expand_reduced, mean_axes, reduced_shape, sum_axes};
use tapegrad_tensor::{Result, Scalar, Shape, Tensor};

/// Sum over axes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sum {
    pub axes: Option<Vec<isize>>,
    pub keepdim: bool,
}

impl OverAxes for Sum {
    fn axes(&self) -> (&Option<Vec<isize>>, bool) {
        (&self.axes, self.keepdim)
    }
    fn reduce<S: Scalar>(&self, x: &Tensor<S>, ax: &[usize]) -> Result<Tensor<S>> {
        sum_axes(x, ax, self.keepdim)
    }
    fn reduce_vjp<S: Scalar>(
        &self,
        ctx: &VjpContext<'_, S>,
        cot: &Tensor<S>,
        ax: &[usize],
    ) -> Result<Tensor<S>> {
        expand_reduced(cot, &ctx.input_shapes[0], ax, self.keepdim)
    }
    fn reduce_jvp<S: Scalar>(
        &self,
        _x: &Tensor<S>,
        _y: &Tensor<S>,
        t: &Tensor<S>,
        ax: &[usize],
    ) -> Result<Tensor<S>> {
        sum_axes(t, ax, self.keepdim)
    }
}

impl OpRules for Sum {
    over_axes_shell!();
    fn saves(&self) -> Saves {
        Saves::NOTHING
    }
}

/// Mean over axes; the mean of zero elements is NaN (PyTorch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mean {
    pub axes: Option<Vec<isize>>,
    pub keepdim: bool,
}

impl OverAxes for Mean {
    fn axes(&self) -> (&Option<Vec<isize>>, bool) {
        (&self.axes, self.keepdim)
    }
    fn reduce<S: Scalar>(&self, x: &Tensor<S>, ax: &[usize]) -> Result<Tensor<S>> {
        mean_axes(x, ax, self.keepdim)
    }
    fn reduce_vjp<S: Scalar>(
        &self,
        ctx: &VjpContext<'_, S>,
        cot: &Tensor<S>,
        ax: &[usize],
    ) -> Result<Tensor<S>> {
        let in_shape = &ctx.input_shapes[0];
        // A zero count means an empty input, so the division never runs.
        let count = S::from_usize(ax.iter().map(|&a| in_shape.dim(a)).product());
        Ok(expand_reduced(cot, in_shape, ax, self.keepdim)?.map(|g| g / count))
    }
    fn reduce_jvp<S: Scalar>(
        &self,
        x: &Tensor<S>,
        y: &Tensor<S>,
        t: &Tensor<S>,
        ax: &[usize],
    ) -> Result<Tensor<S>> {
        // Over zero elements the output is a constant NaN, whose derivative is 0.
        if ax.iter().any(|&a| x.dims()[a] == 0) {
            return Ok(Tensor::zeros(y.shape()));
        }
        mean_axes(t, ax, self.keepdim)
    }
}

impl OpRules for Mean {
    over_axes_shell!();
    fn saves(&self) -> Saves {
        Saves::NOTHING
    }
}
