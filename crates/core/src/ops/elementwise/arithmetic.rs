//! Arithmetic: add, sub, mul and div (broadcasting), neg and scale by a constant. Add, sub, neg
//! and scale read no value: their VJP is also given as a linear map of the cotangent
//! (`linear_vjp`), which the executed sweep may apply to the cotangent's own buffer.

use super::{elementwise_shell, pass, reduced, when_needed, ElementwiseRules};
use crate::ops::{
    display_by_name, s, Arity, Forward, Grads, LinearPart, LinearVjp, OpRules, Saves, VjpContext,
};
use smallvec::smallvec;
use tapegrad_tensor::kernels::{binary_map, broadcast_shape, broadcast_to};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// `a + b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Add;

impl ElementwiseRules for Add {
    const VALUE_CHECKS_SHAPES: bool = true;
    fn value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>> {
        binary_map(self.name(), x[0], x[1], |a, b| a + b)
    }
}

impl OpRules for Add {
    elementwise_shell!(binary);
    fn saves(&self) -> Saves {
        Saves::NOTHING
    }
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        Ok(smallvec![pass(ctx, 0, cot)?, pass(ctx, 1, cot)?])
    }
    #[inline]
    fn linear_vjp(&self) -> Option<LinearVjp> {
        Some(LinearVjp::Binary(LinearPart::Pass, LinearPart::Pass))
    }
    fn jvp<S: Scalar>(
        &self,
        _x: &[&Tensor<S>],
        _out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        binary_map(self.name(), t[0], t[1], |a, b| a + b)
    }
}

/// `a - b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sub;

impl ElementwiseRules for Sub {
    const VALUE_CHECKS_SHAPES: bool = true;
    fn value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>> {
        binary_map(self.name(), x[0], x[1], |a, b| a - b)
    }
}

impl OpRules for Sub {
    elementwise_shell!(binary);
    fn saves(&self) -> Saves {
        Saves::NOTHING
    }
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        Ok(smallvec![
            pass(ctx, 0, cot)?,
            when_needed(ctx, 1, || Ok(cot.map(|g| -g)))?
        ])
    }
    #[inline]
    fn linear_vjp(&self) -> Option<LinearVjp> {
        Some(LinearVjp::Binary(LinearPart::Pass, LinearPart::Negate))
    }
    fn jvp<S: Scalar>(
        &self,
        _x: &[&Tensor<S>],
        _out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        binary_map(self.name(), t[0], t[1], |a, b| a - b)
    }
}

/// `a * b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mul;

impl ElementwiseRules for Mul {
    const VALUE_CHECKS_SHAPES: bool = true;
    fn value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>> {
        binary_map(self.name(), x[0], x[1], |a, b| a * b)
    }
}

impl OpRules for Mul {
    elementwise_shell!(binary);
    fn saves(&self) -> Saves {
        Saves::inputs(&[0, 1])
    }
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let name = self.name();
        let (a, b) = (ctx.input(name, 0)?, ctx.input(name, 1)?);
        Ok(smallvec![
            when_needed(ctx, 0, || binary_map(name, cot, b, |g, b| g * b))?,
            when_needed(ctx, 1, || binary_map(name, cot, a, |g, a| g * a))?,
        ])
    }
    fn jvp<S: Scalar>(
        &self,
        x: &[&Tensor<S>],
        _out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        let name = self.name();
        let l = binary_map(name, t[0], x[1], |ta, b| ta * b)?;
        let r = binary_map(name, x[0], t[1], |a, tb| a * tb)?;
        binary_map(name, &l, &r, |l, r| l + r)
    }
}

/// `a / b`; checked evaluation rejects a zero divisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Div;

impl ElementwiseRules for Div {
    const VALUE_CHECKS_SHAPES: bool = true;
    fn value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>> {
        binary_map(self.name(), x[0], x[1], |a, b| a / b)
    }
}

impl OpRules for Div {
    elementwise_shell!(binary);
    fn saves(&self) -> Saves {
        Saves::inputs(&[0, 1])
    }
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let name = self.name();
        let (a, b) = (ctx.input(name, 0)?, ctx.input(name, 1)?);
        let ga = binary_map(name, cot, b, |g, b| g / b)?;
        let gb = if ctx.needs(1) {
            // d(a/b)/db = -a/b^2, written as -(g/b)*(a/b) to match PyTorch's rounding order.
            let ab = binary_map(name, a, b, |a, b| a / b)?;
            Some(binary_map(name, &ga, &ab, |gb, ab| -(gb * ab))?)
        } else {
            None
        };
        Ok(smallvec![
            reduced(ctx, 0, ga)?,
            match gb {
                Some(g) => reduced(ctx, 1, g)?,
                None => None,
            },
        ])
    }
    fn jvp<S: Scalar>(
        &self,
        x: &[&Tensor<S>],
        _out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        let name = self.name();
        let l = binary_map(name, t[0], x[1], |ta, b| ta / b)?;
        let ab = binary_map(name, x[0], x[1], |a, b| a / b)?;
        let tb_b = binary_map(name, t[1], x[1], |tb, b| tb / b)?;
        let r = binary_map(name, &ab, &tb_b, |ab, tbb| ab * tbb)?;
        binary_map(name, &l, &r, |l, r| l - r)
    }
    fn check_domain<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<()> {
        let name = self.name();
        let b = broadcast_to(x[1], &broadcast_shape(name, x[0].shape(), x[1].shape())?)?;
        match b.data().iter().position(|&v| v == S::ZERO) {
            Some(i) => Err(Error::Domain {
                op: name,
                index: i,
                message: format!("division by zero (divisor shape {})", x[1].shape()),
            }),
            None => Ok(()),
        }
    }
}

/// `-x`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neg;

impl ElementwiseRules for Neg {
    const VALUE_CHECKS_SHAPES: bool = true;
    fn value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>> {
        Ok(x[0].map(|a| -a))
    }
}

impl OpRules for Neg {
    elementwise_shell!(unary);
    fn saves(&self) -> Saves {
        Saves::NOTHING
    }
    fn vjp<S: Scalar>(&self, _ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        Ok(smallvec![Some(cot.map(|g| -g))])
    }
    #[inline]
    fn linear_vjp(&self) -> Option<LinearVjp> {
        Some(LinearVjp::Unary(LinearPart::Negate))
    }
    fn jvp<S: Scalar>(
        &self,
        _x: &[&Tensor<S>],
        _out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        Ok(t[0].map(|v| -v))
    }
}

/// Multiplication by a constant `factor`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scale {
    pub factor: f64,
}

impl ElementwiseRules for Scale {
    const VALUE_CHECKS_SHAPES: bool = true;
    fn value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>> {
        let f: S = s(self.factor);
        Ok(x[0].map(|a| a * f))
    }
}

impl OpRules for Scale {
    elementwise_shell!(unary);
    fn saves(&self) -> Saves {
        Saves::NOTHING
    }
    fn vjp<S: Scalar>(&self, _ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let f: S = s(self.factor);
        Ok(smallvec![Some(cot.map(|g| g * f))])
    }
    #[inline]
    fn linear_vjp(&self) -> Option<LinearVjp> {
        Some(LinearVjp::Unary(LinearPart::Scale(self.factor)))
    }
    fn jvp<S: Scalar>(
        &self,
        _x: &[&Tensor<S>],
        _out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        let f: S = s(self.factor);
        Ok(t[0].map(|v| v * f))
    }
}

impl std::fmt::Display for Scale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "scale(factor={})", self.factor)
    }
}

display_by_name!(Add, Sub, Mul, Div, Neg);
