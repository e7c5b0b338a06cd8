//! Reductions over chosen axes (sum, mean, amax, logsumexp with keepdim or not) and the softmax
//! family along one axis, each a struct of this folder; `ReduceOp` dispatches to them. `axes:
//! None` reduces every axis; an empty list reduces none. A rank-0 input accepts axis 0 and -1 as
//! PyTorch does (reducing it is the identity; its softmax is 1).

mod maxima;
mod softmax;
mod sums;

pub use maxima::{Amax, LogSumExp};
pub use softmax::{LogSoftmax, Softmax};
pub use sums::{Mean, Sum};

use super::{op_family, Arity, Forward, Grads, LinearVjp, OpKind, OpRules, Saves, VjpContext};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

op_family!($
/// Reductions and softmax-like ops (one argument), each variant holding its op's struct.
pub enum ReduceOp {
    Sum,
    Mean,
    Amax,
    LogSumExp,
    Softmax,
    LogSoftmax,
});

impl ReduceOp {
    /// The reduction over axes of this kind (sum, mean, amax, logsumexp), `None` for any other
    /// kind. The reductions over axes share their attributes, so the graph file reads them alike.
    pub fn over_axes(kind: OpKind, axes: Option<Vec<isize>>, keepdim: bool) -> Option<ReduceOp> {
        Some(match kind {
            OpKind::Sum => ReduceOp::Sum(Sum { axes, keepdim }),
            OpKind::Mean => ReduceOp::Mean(Mean { axes, keepdim }),
            OpKind::Amax => ReduceOp::Amax(Amax { axes, keepdim }),
            OpKind::LogSumExp => ReduceOp::LogSumExp(LogSumExp { axes, keepdim }),
            _ => return None,
        })
    }

    /// The axes (`None`: every axis) and `keepdim` of a reduction over axes; `None` for the
    /// softmax family, which works along one axis.
    pub fn axes_and_keepdim(&self) -> Option<(Option<&[isize]>, bool)> {
        match self {
            ReduceOp::Sum(Sum { axes, keepdim })
            | ReduceOp::Mean(Mean { axes, keepdim })
            | ReduceOp::Amax(Amax { axes, keepdim })
            | ReduceOp::LogSumExp(LogSumExp { axes, keepdim }) => Some((axes.as_deref(), *keepdim)),
            ReduceOp::Softmax(_) | ReduceOp::LogSoftmax(_) => None,
        }
    }
}

/// What a reduction over axes (sum, mean, amax, logsumexp) defines; `over_axes_shell!` makes its
/// contract from it, except the saves.
trait OverAxes: OpRules {
    /// Whether the derivative over no axis is the identity. Not for logsumexp, whose derivative
    /// there is exp(x - y): 1, but NaN at an infinite x, as PyTorch's.
    const IDENTITY_OVER_NO_AXIS: bool = true;

    /// The op's attributes: the axes (`None`: every axis) and `keepdim`.
    fn axes(&self) -> (&Option<Vec<isize>>, bool);

    /// Rejects resolved axes the op cannot reduce (amax over an axis of length 0); none by
    /// default.
    fn check_axes(&self, _ax: &[usize], _shape: &Shape) -> Result<()> {
        Ok(())
    }

    /// The reduction over `ax` (resolved, not empty), with the op's `keepdim`.
    fn reduce<S: Scalar>(&self, x: &Tensor<S>, ax: &[usize]) -> Result<Tensor<S>>;

    /// The input's contribution, asked for, from `cot` over the resolved axes `ax` (not empty
    /// where the derivative over no axis is the identity).
    fn reduce_vjp<S: Scalar>(
        &self,
        ctx: &VjpContext<'_, S>,
        cot: &Tensor<S>,
        ax: &[usize],
    ) -> Result<Tensor<S>>;

    /// The output tangent from the tangent `t` of the input `x` (output `y`) over `ax`, as
    /// `reduce_vjp`'s.
    fn reduce_jvp<S: Scalar>(
        &self,
        x: &Tensor<S>,
        y: &Tensor<S>,
        t: &Tensor<S>,
        ax: &[usize],
    ) -> Result<Tensor<S>>;

    /// The reduced axes, resolved against `shape`.
    fn resolve(&self, shape: &Shape) -> Result<Vec<usize>> {
        resolve_axes(self.name(), self.axes().0, shape)
    }
}

/// The contract of a reduction over axes (`OverAxes`) but its saves: one argument, its axes
/// resolved against the input's shape, the identity over no axis, else the op's rules over them.
/// Expands to those `OpRules` methods, in the op's `impl OpRules`.
macro_rules! over_axes_shell {
    () => {
        fn arity(&self) -> Arity {
            Arity::Exact(1)
        }
        fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
            let shape = inputs[0];
            let ax = self.resolve(shape)?;
            self.check_axes(&ax, shape)?;
            reduced_shape(shape, &ax, self.axes().1)
        }
        fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
            let x = x[0];
            let ax = self.resolve(x.shape())?;
            let out = if ax.is_empty() {
                x.clone()
            } else {
                self.reduce(x, &ax)?
            };
            Ok(Forward::new(out))
        }
        fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
            if !ctx.needs(0) {
                return Ok(smallvec![None]);
            }
            let ax = self.resolve(&ctx.input_shapes[0])?;
            if ax.is_empty() && Self::IDENTITY_OVER_NO_AXIS {
                return Ok(smallvec![Some(cot.clone())]);
            }
            Ok(smallvec![Some(self.reduce_vjp(ctx, cot, &ax)?)])
        }
        fn jvp<S: Scalar>(
            &self,
            x: &[&Tensor<S>],
            out: &Forward<S>,
            t: &[&Tensor<S>],
        ) -> Result<Tensor<S>> {
            let ax = self.resolve(x[0].shape())?;
            if ax.is_empty() && Self::IDENTITY_OVER_NO_AXIS {
                return Ok(t[0].clone());
            }
            self.reduce_jvp(x[0], &out.value, t[0], &ax)
        }
    };
}
use over_axes_shell;

/// `Display` of the reductions over axes: `name(axes=[..] or None, keepdim=..)`.
macro_rules! display_over_axes {
    ($($op:ty),*) => {
        $(
            impl std::fmt::Display for $op {
                fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    let axes = match &self.axes {
                        Some(a) => format!("{a:?}"),
                        None => "None".to_string(),
                    };
                    write!(f, "{}(axes={axes}, keepdim={})", self.name(), self.keepdim)
                }
            }
        )*
    };
}

display_over_axes!(Sum, Mean, Amax, LogSumExp);

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
