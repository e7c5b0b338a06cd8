//! The rectifiers: relu and leaky_relu, piecewise linear with the kink at 0. Relu keeps only its
//! output and its value and derivative are elementwise selections, so it also has the in-place
//! hooks, which overwrite a buffer nothing reads again.

use super::{activation_shell, ActivationRules};
use crate::ops::{display_by_name, s, Arity, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::kernels::par_map::{map_in_place, zip_in_place};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// max(x, 0); gradient 0 at x = 0 (PyTorch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relu;

/// relu of one element: `x <= 0 ? 0 : x` (`x <= 0` is false for NaN, so NaN propagates as in
/// PyTorch). The forward and its in-place hook both map it, so they give the same bits.
#[inline(always)]
fn relu_value<S: Scalar>(x: S) -> S {
    if x <= S::ZERO {
        S::ZERO
    } else {
        x
    }
}

/// relu's derivative applied to one cotangent element `g`, read from the output `y`: PyTorch's
/// threshold_backward `y <= 0 ? 0 : g` (a selection, so never `inf * 0`). The VJP and its
/// in-place hook both map it, so they give the same bits.
#[inline(always)]
fn relu_grad<S: Scalar>(g: S, y: S) -> S {
    if y <= S::ZERO {
        S::ZERO
    } else {
        g
    }
}

impl ActivationRules for Relu {
    const DERIVATIVE_OF_OUTPUT: bool = true;
    fn value<S: Scalar>(&self, x: &Tensor<S>) -> Tensor<S> {
        x.map(relu_value)
    }
    fn apply_derivative<S: Scalar>(&self, d: &Tensor<S>, saved: &Tensor<S>) -> Result<Tensor<S>> {
        d.zip_map(saved, self.name(), relu_grad)
    }
}

impl OpRules for Relu {
    activation_shell!();

    #[inline]
    fn forward_in_place<S: Scalar>(&self, x: &mut Tensor<S>) -> bool {
        map_in_place(x.data_mut(), relu_value);
        true
    }

    #[inline]
    fn vjp_in_place<S: Scalar>(&self, y: &Tensor<S>, cot: &mut Tensor<S>) -> bool {
        if y.shape() != cot.shape() {
            return false;
        }
        zip_in_place(cot.data_mut(), y.data(), relu_grad);
        true
    }
}

/// x for x > 0, negative_slope * x otherwise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeakyRelu {
    pub negative_slope: f64,
}

impl ActivationRules for LeakyRelu {
    const DERIVATIVE_OF_OUTPUT: bool = false;
    fn check_attributes(&self, shape: &Shape) -> Result<()> {
        let negative_slope = self.negative_slope;
        if negative_slope.is_finite() {
            return Ok(());
        }
        Err(Error::invalid(
            self.name(),
            format!("negative_slope must be finite, got {negative_slope} (input shape {shape})"),
        ))
    }
    fn value<S: Scalar>(&self, x: &Tensor<S>) -> Tensor<S> {
        let slope: S = s(self.negative_slope);
        x.map(|v| if v > S::ZERO { v } else { v * slope })
    }
    fn apply_derivative<S: Scalar>(&self, d: &Tensor<S>, saved: &Tensor<S>) -> Result<Tensor<S>> {
        let slope: S = s(self.negative_slope);
        d.zip_map(
            saved,
            self.name(),
            |g, x| if x > S::ZERO { g } else { g * slope },
        )
    }
}

impl OpRules for LeakyRelu {
    activation_shell!();
}

impl std::fmt::Display for LeakyRelu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "leaky_relu(negative_slope={})", self.negative_slope)
    }
}

display_by_name!(Relu);
