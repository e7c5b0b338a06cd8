//! Elementwise operations with broadcasting: arithmetic, the unary math functions, and the
//! selections (clamp, maximum/minimum, `where`). Each op is a struct implementing `OpRules` in a
//! file of this folder; `ElementwiseOp` dispatches to them, and the helpers here serve them all.

mod arithmetic;
mod math;
mod select;

pub use arithmetic::{Add, Div, Mul, Neg, Scale, Sub};
pub use math::{Abs, Cos, Exp, Log, Pow, SafeLog, Sin, Sqrt};
pub use select::{Clamp, Maximum, Minimum, Where};

use super::{op_family, Arity, Forward, Grads, LinearVjp, OpRules, Saves, VjpContext};
use tapegrad_tensor::kernels::sum_to;
use tapegrad_tensor::{Result, Scalar, Shape, Tensor};

op_family!($
/// Elementwise operations, each variant holding its op's struct. Binary ones broadcast under
/// NumPy/PyTorch rules.
pub enum ElementwiseOp {
    Add,
    Sub,
    Mul,
    Div,
    Neg,
    Scale,
    Abs,
    Sqrt,
    Exp,
    Log,
    SafeLog,
    Sin,
    Cos,
    Pow,
    Clamp,
    Maximum,
    Minimum,
    Where,
});

/// What an elementwise op adds to the op contract: its forward's value alone (elementwise ops
/// have no auxiliary data), which the hot path of `Op::forward` calls without the wrapper.
pub(crate) trait ElementwiseRules: OpRules {
    /// Whether `value` itself rejects every shape list `output_shape` rejects (arity aside),
    /// with the same error, and always makes a value of the output shape: `Op::forward` then
    /// skips its separate shape rule. False for an op with a shape rule of its own.
    const VALUE_CHECKS_SHAPES: bool;

    /// The forward's value; `forward` is `Forward::new(value)`.
    fn value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>>;
}

/// The shape rule and forward of an op whose kernels check its shapes themselves (so it sets
/// `VALUE_CHECKS_SHAPES`): one argument of the output's shape (`unary`), or two broadcast
/// together (`binary`). Expands to those `OpRules` methods, in the op's `impl OpRules`.
macro_rules! elementwise_shell {
    (unary) => {
        fn arity(&self) -> Arity {
            Arity::Exact(1)
        }
        fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
            Ok(inputs[0].clone())
        }
        elementwise_shell!(forward);
    };
    (binary) => {
        fn arity(&self) -> Arity {
            Arity::Exact(2)
        }
        fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
            broadcast_shape(self.name(), inputs[0], inputs[1])
        }
        elementwise_shell!(forward);
    };
    (forward) => {
        fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
            Ok(Forward::new(self.value(x)?))
        }
    };
}
use elementwise_shell;

/// A one-argument op whose Jacobian is diagonal: its VJP and JVP multiply the cotangent or the
/// tangent by one local derivative, read from the input or the output, so the two are exactly
/// adjoint. `diagonal_shell!` makes those rules from it.
pub(crate) trait Diagonal: OpRules {
    /// Whether the derivative is read from the output (sqrt, exp), which the VJP then keeps,
    /// rather than from the input.
    const DERIVATIVE_OF_OUTPUT: bool;

    /// The local derivative applied to one element `d` of a cotangent or tangent, `v` the
    /// input's or the output's element: `(d, v) -> d * f'(..)`.
    fn derivative<S: Scalar>(&self) -> impl Fn(S, S) -> S + Sync;
}

/// The saves, VJP and JVP of a `Diagonal` op. Expands to those `OpRules` methods, in the op's
/// `impl OpRules`.
macro_rules! diagonal_shell {
    () => {
        fn saves(&self) -> Saves {
            if Self::DERIVATIVE_OF_OUTPUT {
                Saves::OUTPUT
            } else {
                Saves::inputs(&[0])
            }
        }
        fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
            let name = self.name();
            let saved = if Self::DERIVATIVE_OF_OUTPUT {
                ctx.output(name)?
            } else {
                ctx.input(name, 0)?
            };
            Ok(smallvec![Some(chain(cot, saved, self.derivative())?)])
        }
        fn jvp<S: Scalar>(
            &self,
            x: &[&Tensor<S>],
            out: &Forward<S>,
            t: &[&Tensor<S>],
        ) -> Result<Tensor<S>> {
            let saved = if Self::DERIVATIVE_OF_OUTPUT {
                &out.value
            } else {
                x[0]
            };
            t[0].zip_map(saved, self.name(), self.derivative())
        }
    };
}
use diagonal_shell;

impl ElementwiseOp {
    /// Whether `forward` itself rejects every shape list `output_shape` rejects (see
    /// `ElementwiseRules::VALUE_CHECKS_SHAPES`): `Op::forward` then skips its separate shape rule.
    #[inline]
    pub(crate) fn forward_checks_shapes(&self) -> bool {
        fn checks<T: ElementwiseRules>(_: &T) -> bool {
            T::VALUE_CHECKS_SHAPES
        }
        each!(self, op => checks(op))
    }

    /// Whether this op holds no heap data, so that forgetting it frees nothing that dropping it
    /// would (`Tape::clear` skips the drop glue of such nodes): decided by each op's type.
    #[inline]
    pub(crate) fn holds_no_heap(&self) -> bool {
        fn no_drop_glue<T>(_: &T) -> bool {
            !std::mem::needs_drop::<T>()
        }
        each!(self, op => no_drop_glue(op))
    }

    /// The forward's value (elementwise ops have no auxiliary data); `forward` wraps it.
    #[inline]
    pub(crate) fn forward_value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>> {
        each!(self, op => op.value(x))
    }
}

/// Applies a per-element derivative: `cot * d(x)` for a unary op.
fn chain<S: Scalar>(
    cot: &Tensor<S>,
    x: &Tensor<S>,
    d: impl Fn(S, S) -> S + Sync,
) -> Result<Tensor<S>> {
    cot.zip_map(x, "vjp", d)
}

/// Argument `i`'s contribution from `g` (of the output's shape): `None` unless it needs one,
/// else `g` summed down to the argument's shape where it was broadcast.
fn reduced<S: Scalar>(
    ctx: &VjpContext<'_, S>,
    i: usize,
    g: Tensor<S>,
) -> Result<Option<Tensor<S>>> {
    let shape = &ctx.input_shapes[i];
    if !ctx.needs(i) {
        Ok(None)
    } else if g.shape() == shape {
        Ok(Some(g)) // not broadcast: pass the buffer on without another clone
    } else {
        sum_to(&g, shape).map(Some)
    }
}

/// Argument `i`'s contribution made by `g()`, called only when the argument needs one.
fn when_needed<S: Scalar>(
    ctx: &VjpContext<'_, S>,
    i: usize,
    g: impl FnOnce() -> Result<Tensor<S>>,
) -> Result<Option<Tensor<S>>> {
    if ctx.needs(i) {
        reduced(ctx, i, g()?)
    } else {
        Ok(None)
    }
}

/// The cotangent itself as argument `i`'s contribution (not cloned for one that needs none).
fn pass<S: Scalar>(
    ctx: &VjpContext<'_, S>,
    i: usize,
    cot: &Tensor<S>,
) -> Result<Option<Tensor<S>>> {
    when_needed(ctx, i, || Ok(cot.clone()))
}
