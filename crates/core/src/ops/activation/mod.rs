//! Activation functions: relu, leaky_relu, sigmoid, tanh, gelu (exact erf form and tanh
//! approximation), softplus and silu, with PyTorch's definitions and gradient conventions. Each is
//! a struct of this folder; `ActivationOp` dispatches to them, and `activation_shell!` is their
//! shared contract.

mod gelu;
mod rectifiers;
mod smooth;

pub use gelu::{Gelu, GeluApproximate};
pub use rectifiers::{LeakyRelu, Relu};
pub use smooth::{Sigmoid, Silu, Softplus, Tanh};

use super::{op_family, Arity, Aux, Forward, Grads, LinearVjp, OpRules, Saves, VjpContext};
use tapegrad_tensor::{Result, Scalar, Shape, Tensor};

op_family!($
/// Elementwise activation functions (one argument, output of the same shape), each variant
/// holding its op's struct.
pub enum ActivationOp {
    Relu,
    LeakyRelu,
    Sigmoid,
    Tanh,
    Gelu,
    Softplus,
    Silu,
});

/// What an activation defines; `activation_shell!` makes the op contract from it. The Jacobian
/// is diagonal, so one local-derivative rule serves as both the VJP and the JVP, which makes the
/// two exactly adjoint.
trait ActivationRules {
    /// Whether the derivative is a function of the output (relu, sigmoid, tanh), which is then
    /// what the VJP keeps, rather than of the input.
    const DERIVATIVE_OF_OUTPUT: bool;

    /// Rejects attributes PyTorch would accept but that make the function undefined (NaN or inf
    /// for every input), rather than silently producing NaN. None by default.
    fn check_attributes(&self, _shape: &Shape) -> Result<()> {
        Ok(())
    }

    /// The forward's value.
    fn value<S: Scalar>(&self, x: &Tensor<S>) -> Tensor<S>;

    /// Multiplies `d` (a cotangent or a tangent) elementwise by the local derivative, read from
    /// `saved` (the output or the input, see `DERIVATIVE_OF_OUTPUT`).
    fn apply_derivative<S: Scalar>(&self, d: &Tensor<S>, saved: &Tensor<S>) -> Result<Tensor<S>>;

    /// As `apply_derivative`, in a VJP whose record holds `aux`: what a recomputation of the
    /// value left there (`OpRules::recompute`), which an activation may read instead of
    /// evaluating its derivative again, with the same bits. `apply_derivative` by default.
    fn apply_derivative_kept<S: Scalar>(
        &self,
        d: &Tensor<S>,
        saved: &Tensor<S>,
        _aux: &Aux<S>,
    ) -> Result<Tensor<S>> {
        self.apply_derivative(d, saved)
    }
}

/// The op contract of an activation from its `ActivationRules`: one argument, an output of its
/// shape; the VJP keeps what the derivative reads. Expands to those `OpRules` methods, in the
/// op's `impl OpRules` (beside any hooks of its own).
macro_rules! activation_shell {
    () => {
        fn arity(&self) -> Arity {
            Arity::Exact(1)
        }

        fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
            let shape = inputs
                .first()
                .ok_or_else(|| Error::Arity {
                    op: self.name(),
                    expected: 1,
                    found: 0,
                })?
                .to_owned();
            self.check_attributes(shape)?;
            Ok(shape.clone())
        }

        fn saves(&self) -> Saves {
            if Self::DERIVATIVE_OF_OUTPUT {
                Saves::OUTPUT
            } else {
                Saves::inputs(&[0])
            }
        }

        /// An activation read from its input keeps that input, from which its value is one
        /// elementwise pass: cheaper to redo in the backward than to keep.
        fn recomputable(&self) -> bool {
            !Self::DERIVATIVE_OF_OUTPUT
        }

        fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
            let x = x.first().ok_or_else(|| Error::Arity {
                op: self.name(),
                expected: 1,
                found: 0,
            })?;
            Ok(Forward::new(self.value(x)))
        }

        fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
            if !ctx.needs(0) {
                return Ok(smallvec![None]);
            }
            let name = self.name();
            let saved = if Self::DERIVATIVE_OF_OUTPUT {
                ctx.output(name)?
            } else {
                ctx.input(name, 0)?
            };
            Ok(smallvec![Some(
                self.apply_derivative_kept(cot, saved, ctx.aux)?
            )])
        }

        fn jvp<S: Scalar>(
            &self,
            x: &[&Tensor<S>],
            out: &Forward<S>,
            t: &[&Tensor<S>],
        ) -> Result<Tensor<S>> {
            let missing = |found| Error::Arity {
                op: self.name(),
                expected: 1,
                found,
            };
            let x = x.first().ok_or_else(|| missing(0))?;
            let t = t.first().ok_or_else(|| missing(0))?;
            let saved = if Self::DERIVATIVE_OF_OUTPUT {
                &out.value
            } else {
                x
            };
            self.apply_derivative(t, saved)
        }
    };
}
use activation_shell;

/// The logistic function without overflow: `exp` only ever sees a non-positive argument, so
/// sigmoid(-1000) is 0 and sigmoid(1000) is 1 rather than NaN.
fn sigmoid<S: Scalar>(x: S) -> S {
    if x >= S::ZERO {
        S::ONE / (S::ONE + (-x).exp())
    } else {
        let e = x.exp();
        e / (S::ONE + e)
    }
}
