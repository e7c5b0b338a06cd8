//! The axis reorderings: transpose (swap two axes) and permute. Both are linear and keep
//! nothing: the forward and JVP apply the reordering (`Reorder`), the VJP its inverse.

use crate::ops::{Arity, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::kernels::layout::inverse_permutation;
use tapegrad_tensor::kernels::{permute, transpose};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// An axis reordering; `reorder_shell!` makes its rules from it.
trait Reorder {
    /// Applies the reordering to `t`, or its inverse.
    fn reorder<S: Scalar>(&self, t: &Tensor<S>, inverse: bool) -> Result<Tensor<S>>;
}

/// The rules of a `Reorder` op but its shape rule: one argument, nothing kept, the reordering
/// as forward and JVP and its inverse as VJP. Expands to those `OpRules` methods.
macro_rules! reorder_shell {
    () => {
        fn arity(&self) -> Arity {
            Arity::Exact(1)
        }
        fn saves(&self) -> Saves {
            Saves::NOTHING
        }
        fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
            Ok(Forward::new(self.reorder(x[0], false)?))
        }
        fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
            Ok(smallvec![if ctx.needs(0) {
                Some(self.reorder(cot, true)?)
            } else {
                None
            }])
        }
        fn jvp<S: Scalar>(
            &self,
            _x: &[&Tensor<S>],
            _out: &Forward<S>,
            t: &[&Tensor<S>],
        ) -> Result<Tensor<S>> {
            self.reorder(t[0], false)
        }
    };
}

/// Swaps two axes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transpose {
    pub dim0: isize,
    pub dim1: isize,
}

impl Transpose {
    /// The two axes, resolved against `shape`.
    fn resolve(&self, shape: &Shape) -> Result<(usize, usize)> {
        let a = resolve_dim("transpose", "dim0", self.dim0, shape)?;
        let b = resolve_dim("transpose", "dim1", self.dim1, shape)?;
        Ok((a, b))
    }
}

impl Reorder for Transpose {
    /// A swap is its own inverse.
    fn reorder<S: Scalar>(&self, t: &Tensor<S>, _inverse: bool) -> Result<Tensor<S>> {
        let (a, b) = self.resolve(t.shape())?;
        if t.rank() == 0 || a == b {
            Ok(t.clone())
        } else {
            transpose(t, a, b)
        }
    }
}

impl OpRules for Transpose {
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        let s = inputs[0];
        let (a, b) = self.resolve(s)?;
        let mut dims = s.dims().to_vec();
        if s.rank() > 0 {
            dims.swap(a, b);
        }
        Shape::new(dims)
    }
    reorder_shell!();
}

impl std::fmt::Display for Transpose {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "transpose(dim0={}, dim1={})", self.dim0, self.dim1)
    }
}

/// Normalises one signed dimension against `shape` (a rank-0 shape accepts 0 and -1, as PyTorch).
fn resolve_dim(op: &'static str, what: &str, d: isize, shape: &Shape) -> Result<usize> {
    let r = shape.rank().max(1) as isize;
    let a = if d < 0 { d.saturating_add(r) } else { d };
    if a < 0 || a >= r {
        return Err(Error::invalid(
            op,
            format!("{what} {d} is out of range for input of shape {shape}"),
        ));
    }
    Ok(a as usize)
}

/// Output axis `i` is input axis `dims[i]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permute {
    pub dims: Vec<isize>,
}

impl Reorder for Permute {
    fn reorder<S: Scalar>(&self, t: &Tensor<S>, inverse: bool) -> Result<Tensor<S>> {
        let p = resolve_permutation(&self.dims, t.shape())?;
        if inverse {
            permute(t, &inverse_permutation(&p))
        } else {
            permute(t, &p)
        }
    }
}

impl OpRules for Permute {
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        let s = inputs[0];
        let p = resolve_permutation(&self.dims, s)?;
        Shape::new(p.iter().map(|&d| s.dim(d)).collect::<Vec<_>>())
    }
    reorder_shell!();
}

impl std::fmt::Display for Permute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "permute(dims={:?})", self.dims)
    }
}

/// The normalised permutation, checked to be one.
fn resolve_permutation(dims: &[isize], shape: &Shape) -> Result<Vec<usize>> {
    let rank = shape.rank();
    let fail = || {
        Error::invalid(
            "permute",
            format!("dims {dims:?} is not a permutation of the axes of shape {shape}"),
        )
    };
    if dims.len() != rank {
        return Err(fail());
    }
    let mut seen = vec![false; rank];
    let mut out = Vec::with_capacity(rank);
    for &d in dims {
        let r = rank as isize;
        let a = if d < 0 { d.saturating_add(r) } else { d };
        if a < 0 || a >= r || seen[a as usize] {
            return Err(fail());
        }
        seen[a as usize] = true;
        out.push(a as usize);
    }
    Ok(out)
}
