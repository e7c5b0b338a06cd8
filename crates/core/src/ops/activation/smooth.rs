//! The smooth logistic-family activations: sigmoid, tanh, softplus (with PyTorch's threshold)
//! and silu. Sigmoid and tanh read their derivative from the output, softplus and silu from the
//! input; all evaluate the logistic function without overflow (`sigmoid`).

use super::{activation_shell, sigmoid, ActivationRules};
use crate::ops::{display_by_name, s, Arity, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// 1 / (1 + exp(-x)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sigmoid;

impl ActivationRules for Sigmoid {
    const DERIVATIVE_OF_OUTPUT: bool = true;
    fn value<S: Scalar>(&self, x: &Tensor<S>) -> Tensor<S> {
        x.map(sigmoid)
    }
    fn apply_derivative<S: Scalar>(&self, d: &Tensor<S>, saved: &Tensor<S>) -> Result<Tensor<S>> {
        d.zip_map(saved, self.name(), |g, y| g * (S::ONE - y) * y)
    }
}

impl OpRules for Sigmoid {
    activation_shell!();
}

/// The hyperbolic tangent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tanh;

impl ActivationRules for Tanh {
    const DERIVATIVE_OF_OUTPUT: bool = true;
    fn value<S: Scalar>(&self, x: &Tensor<S>) -> Tensor<S> {
        x.map(|v| v.tanh())
    }
    fn apply_derivative<S: Scalar>(&self, d: &Tensor<S>, saved: &Tensor<S>) -> Result<Tensor<S>> {
        d.zip_map(saved, self.name(), |g, y| g * (S::ONE - y * y))
    }
}

impl OpRules for Tanh {
    activation_shell!();
}

/// (1/beta) * log(1 + exp(beta * x)), linear above `threshold` (PyTorch's defaults: 1, 20).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Softplus {
    pub beta: f64,
    pub threshold: f64,
}

/// softplus with PyTorch's threshold: `x` where `beta * x > threshold`, else
/// `log1p(exp(beta * x)) / beta`. Where that `exp` overflows (only with a large threshold) the
/// equal, overflow-free `(bx + log1p(exp(-bx))) / beta` is used instead, so the result stays finite.
fn softplus<S: Scalar>(x: S, beta: S, threshold: S) -> S {
    let bx = x * beta;
    if bx > threshold {
        return x;
    }
    let e = bx.exp();
    if e.is_finite() {
        e.ln_1p() / beta
    } else {
        (bx + (-bx).exp().ln_1p()) / beta
    }
}

impl ActivationRules for Softplus {
    const DERIVATIVE_OF_OUTPUT: bool = false;
    fn check_attributes(&self, shape: &Shape) -> Result<()> {
        let Softplus { beta, threshold } = *self;
        if !beta.is_finite() || beta == 0.0 {
            return Err(Error::invalid(
                self.name(),
                format!("beta must be finite and non-zero, got {beta} (input shape {shape})"),
            ));
        }
        if threshold.is_nan() {
            return Err(Error::invalid(
                self.name(),
                format!("threshold must not be NaN (input shape {shape})"),
            ));
        }
        Ok(())
    }
    fn value<S: Scalar>(&self, x: &Tensor<S>) -> Tensor<S> {
        let (b, th): (S, S) = (s(self.beta), s(self.threshold));
        x.map(|v| softplus(v, b, th))
    }
    fn apply_derivative<S: Scalar>(&self, d: &Tensor<S>, saved: &Tensor<S>) -> Result<Tensor<S>> {
        let (b, th): (S, S) = (s(self.beta), s(self.threshold));
        d.zip_map(saved, self.name(), |g, x| {
            let bx = x * b;
            if bx > th {
                g
            } else {
                g * sigmoid(bx)
            }
        })
    }
}

impl OpRules for Softplus {
    activation_shell!();
}

impl std::fmt::Display for Softplus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "softplus(beta={}, threshold={})",
            self.beta, self.threshold
        )
    }
}

/// x * sigmoid(x).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Silu;

impl ActivationRules for Silu {
    const DERIVATIVE_OF_OUTPUT: bool = false;
    fn value<S: Scalar>(&self, x: &Tensor<S>) -> Tensor<S> {
        x.map(|v| v * sigmoid(v))
    }
    fn apply_derivative<S: Scalar>(&self, d: &Tensor<S>, saved: &Tensor<S>) -> Result<Tensor<S>> {
        d.zip_map(saved, self.name(), |g, x| {
            let sg = sigmoid(x);
            g * sg * (S::ONE + x * (S::ONE - sg))
        })
    }
}

impl OpRules for Silu {
    activation_shell!();
}

display_by_name!(Sigmoid, Tanh, Silu);
