//! The unary math functions: abs, sqrt, exp, log, safe_log, sin, cos and pow with a constant
//! exponent. One argument, an output of its shape, and a diagonal Jacobian (`Diagonal`): each
//! gives its value and its local derivative, from which `diagonal_shell!` makes the VJP and JVP.

use super::{chain, diagonal_shell, elementwise_shell, Diagonal, ElementwiseRules};
use crate::ops::{display_by_name, s, Arity, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// `|x|`; the gradient at 0 is 0, as PyTorch's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Abs;

impl ElementwiseRules for Abs {
    const VALUE_CHECKS_SHAPES: bool = true;
    fn value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>> {
        Ok(x[0].map(|a| a.abs()))
    }
}

impl Diagonal for Abs {
    const DERIVATIVE_OF_OUTPUT: bool = false;
    fn derivative<S: Scalar>(&self) -> impl Fn(S, S) -> S + Sync {
        |g, x| g * sign(x)
    }
}

impl OpRules for Abs {
    elementwise_shell!(unary);
    diagonal_shell!();
}

/// sign(x) with sign(0) = 0, as PyTorch's abs gradient.
fn sign<S: Scalar>(x: S) -> S {
    if x > S::ZERO {
        S::ONE
    } else if x < S::ZERO {
        -S::ONE
    } else {
        S::ZERO
    }
}

/// `sqrt(x)`; checked evaluation rejects `x < 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sqrt;

impl ElementwiseRules for Sqrt {
    const VALUE_CHECKS_SHAPES: bool = true;
    fn value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>> {
        Ok(x[0].map(|a| a.sqrt()))
    }
}

impl Diagonal for Sqrt {
    const DERIVATIVE_OF_OUTPUT: bool = true;
    fn derivative<S: Scalar>(&self) -> impl Fn(S, S) -> S + Sync {
        let two: S = s(2.0);
        move |g, y| g / (two * y)
    }
}

impl OpRules for Sqrt {
    elementwise_shell!(unary);
    diagonal_shell!();
    fn check_domain<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<()> {
        domain(
            self.name(),
            x[0],
            |v| v < S::ZERO || v.is_nan(),
            "is not real",
        )
    }
}

/// `e^x`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exp;

impl ElementwiseRules for Exp {
    const VALUE_CHECKS_SHAPES: bool = true;
    fn value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>> {
        Ok(x[0].map(|a| a.exp()))
    }
}

impl Diagonal for Exp {
    const DERIVATIVE_OF_OUTPUT: bool = true;
    fn derivative<S: Scalar>(&self) -> impl Fn(S, S) -> S + Sync {
        |g, y| g * y
    }
}

impl OpRules for Exp {
    elementwise_shell!(unary);
    diagonal_shell!();
}

/// Natural log; checked evaluation rejects `x <= 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Log;

impl ElementwiseRules for Log {
    const VALUE_CHECKS_SHAPES: bool = true;
    fn value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>> {
        Ok(x[0].map(|a| a.ln()))
    }
}

impl Diagonal for Log {
    const DERIVATIVE_OF_OUTPUT: bool = false;
    fn derivative<S: Scalar>(&self) -> impl Fn(S, S) -> S + Sync {
        |g, x| g / x
    }
}

impl OpRules for Log {
    elementwise_shell!(unary);
    diagonal_shell!();
    fn check_domain<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<()> {
        domain(
            self.name(),
            x[0],
            |v| v <= S::ZERO || v.is_nan(),
            "is not finite",
        )
    }
}

/// `log(max(x, eps))`: finite everywhere; the gradient is 0 where `x <= eps`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SafeLog {
    pub eps: f64,
}

impl ElementwiseRules for SafeLog {
    const VALUE_CHECKS_SHAPES: bool = true;
    fn value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>> {
        let e: S = s(self.eps);
        Ok(x[0].map(|a| if a > e { a.ln() } else { e.ln() }))
    }
}

impl Diagonal for SafeLog {
    const DERIVATIVE_OF_OUTPUT: bool = false;
    fn derivative<S: Scalar>(&self) -> impl Fn(S, S) -> S + Sync {
        let e: S = s(self.eps);
        move |g, x| if x > e { g / x } else { S::ZERO }
    }
}

impl OpRules for SafeLog {
    elementwise_shell!(unary);
    diagonal_shell!();
}

impl std::fmt::Display for SafeLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "safe_log(eps={})", self.eps)
    }
}

/// `sin(x)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sin;

impl ElementwiseRules for Sin {
    const VALUE_CHECKS_SHAPES: bool = true;
    fn value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>> {
        Ok(x[0].map(|a| a.sin()))
    }
}

impl Diagonal for Sin {
    const DERIVATIVE_OF_OUTPUT: bool = false;
    fn derivative<S: Scalar>(&self) -> impl Fn(S, S) -> S + Sync {
        |g, x| g * x.cos()
    }
}

impl OpRules for Sin {
    elementwise_shell!(unary);
    diagonal_shell!();
}

/// `cos(x)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cos;

impl ElementwiseRules for Cos {
    const VALUE_CHECKS_SHAPES: bool = true;
    fn value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>> {
        Ok(x[0].map(|a| a.cos()))
    }
}

impl Diagonal for Cos {
    const DERIVATIVE_OF_OUTPUT: bool = false;
    fn derivative<S: Scalar>(&self) -> impl Fn(S, S) -> S + Sync {
        |g, x| -(g * x.sin())
    }
}

impl OpRules for Cos {
    elementwise_shell!(unary);
    diagonal_shell!();
}

/// `x ^ exponent` for a constant exponent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pow {
    pub exponent: f64,
}

impl ElementwiseRules for Pow {
    const VALUE_CHECKS_SHAPES: bool = true;
    fn value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>> {
        let e: S = s(self.exponent);
        Ok(x[0].map(|a| a.powf(e)))
    }
}

impl Diagonal for Pow {
    const DERIVATIVE_OF_OUTPUT: bool = false;
    /// `exponent * x^(exponent - 1)`, and 0 for the exponent 0 (whose power is the constant 1,
    /// even at x = 0).
    fn derivative<S: Scalar>(&self) -> impl Fn(S, S) -> S + Sync {
        let exponent = self.exponent;
        let e: S = s(exponent);
        let e1: S = s(exponent - 1.0);
        move |g, x| {
            if exponent == 0.0 {
                S::ZERO
            } else {
                g * e * x.powf(e1)
            }
        }
    }
}

impl OpRules for Pow {
    elementwise_shell!(unary);
    diagonal_shell!();
}

impl std::fmt::Display for Pow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pow(exponent={})", self.exponent)
    }
}

/// The domain error at `x`'s first element where `bad` holds: "`op` of `v` (input shape ..)
/// `what`".
fn domain<S: Scalar>(
    op: &'static str,
    x: &Tensor<S>,
    bad: impl Fn(S) -> bool,
    what: &str,
) -> Result<()> {
    match x.data().iter().position(|&v| bad(v)) {
        Some(i) => Err(Error::Domain {
            op,
            index: i,
            message: format!("{op} of {} (input shape {}) {what}", x.data()[i], x.shape()),
        }),
        None => Ok(()),
    }
}

display_by_name!(Abs, Sqrt, Exp, Log, Sin, Cos);
