//! GELU, x * Phi(x), in PyTorch's two forms: the exact erf form (the tensor kernel's element
//! rule, vectorised for slices: f32 within 7 ulps, f64 through libm's `erfc`) and the tanh
//! approximation (written with sigmoid, free of cancellation). The derivative is read from the
//! input.

use super::{activation_shell, sigmoid, ActivationRules};
use crate::ops::{s, Arity, Aux, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::kernels::gelu;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// Which GELU formula: PyTorch's `approximate="none"` (erf) or `"tanh"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GeluApproximate {
    None,
    Tanh,
}

impl GeluApproximate {
    /// PyTorch's spelling of the attribute.
    pub fn name(self) -> &'static str {
        match self {
            GeluApproximate::None => "none",
            GeluApproximate::Tanh => "tanh",
        }
    }
}

/// x * Phi(x) (Phi the standard normal distribution function), or its tanh approximation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gelu {
    pub approximate: GeluApproximate,
}

impl ActivationRules for Gelu {
    const DERIVATIVE_OF_OUTPUT: bool = false;
    fn value<S: Scalar>(&self, x: &Tensor<S>) -> Tensor<S> {
        match self.approximate {
            GeluApproximate::None if x.numel() > 1 => {
                Tensor::from_writer(x.shape().clone(), |out| gelu::gelu_erf(x.data(), out))
            }
            GeluApproximate::None => x.map(gelu_erf),
            GeluApproximate::Tanh => x.map(gelu_tanh),
        }
    }
    fn apply_derivative_kept<S: Scalar>(
        &self,
        d: &Tensor<S>,
        saved: &Tensor<S>,
        aux: &Aux<S>,
    ) -> Result<Tensor<S>> {
        match (self.approximate, aux) {
            (GeluApproximate::None, Aux::Tensors(kept))
                if kept.len() == 1 && kept[0].shape() == d.shape() =>
            {
                // The slope `recompute` left: the product the slice kernel forms, same bits.
                let (g, slope) = (d.data(), kept[0].data());
                Ok(Tensor::from_writer(d.shape().clone(), |out| {
                    for ((o, &g), &s) in out.iter_mut().zip(g).zip(slope) {
                        *o = g * s;
                    }
                }))
            }
            _ => self.apply_derivative(d, saved),
        }
    }
    fn apply_derivative<S: Scalar>(&self, d: &Tensor<S>, saved: &Tensor<S>) -> Result<Tensor<S>> {
        let name = self.name();
        match self.approximate {
            GeluApproximate::None => {
                if d.numel() <= 1 || d.shape() != saved.shape() {
                    return d.zip_map(saved, name, |g, x| g * gelu_erf_grad(x));
                }
                // The slice kernel: the same element rule, vectorised.
                let (g, x) = (d.data(), saved.data());
                Ok(Tensor::from_writer(d.shape().clone(), |out| {
                    gelu::gelu_erf_backward(g, x, out)
                }))
            }
            GeluApproximate::Tanh => d.zip_map(saved, name, |g, x| g * gelu_tanh_grad(x)),
        }
    }
}

impl OpRules for Gelu {
    activation_shell!();

    /// The erf form's value with its slope beside it, both from one evaluation of Phi and phi:
    /// the backward that recomputes the value for the next layer's weight gradient then needs
    /// the slope next, and reads it from the aux data instead of evaluating them again.
    fn recompute<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        match (self.approximate, x) {
            (GeluApproximate::None, [x]) if x.numel() > 1 => {
                // Both buffers written whole by the one pass (no zero fill first).
                let mut value = None;
                let slope = Tensor::from_writer(x.shape().clone(), |slope| {
                    value = Some(Tensor::from_writer(x.shape().clone(), |out| {
                        gelu::gelu_erf_with_slope(x.data(), out, slope)
                    }));
                });
                let value = value.ok_or_else(|| Error::invalid(self.name(), "no value written"))?;
                Ok(Forward {
                    value,
                    aux: Aux::Tensors(vec![slope]),
                })
            }
            _ => self.forward(x),
        }
    }
}

impl std::fmt::Display for Gelu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "gelu(approximate='{}')", self.approximate.name())
    }
}

/// sqrt(2/pi), PyTorch's `kBeta` for the tanh-approximated GELU.
const GELU_BETA: f64 = std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5;
/// PyTorch's `kKappa`.
const GELU_KAPPA: f64 = 0.044715;
/// x * Phi(x) (Phi the standard normal distribution function) by the tensor kernel's element
/// rule (see `kernels::gelu`), not `(1 + erf(x / sqrt 2)) / 2`, which cancels in the far
/// negative tail.
fn gelu_erf<S: Scalar>(x: S) -> S {
    gelu::gelu_erf_value(x)
}

/// d/dx of x * Phi(x) = Phi(x) + x * phi(x), by the kernel's element rule as the forward. Where the density underflows
/// to 0 the second term is 0 (not `inf * 0` for an infinite x), so it tends to its limits 0 and 1.
fn gelu_erf_grad<S: Scalar>(x: S) -> S {
    gelu::gelu_erf_slope(x)
}

/// beta * (x + kappa * x^3), the argument of tanh in the tanh-approximated GELU.
fn gelu_tanh_inner<S: Scalar>(x: S) -> S {
    s::<S>(GELU_BETA) * (x + s::<S>(GELU_KAPPA) * (x * x * x))
}

/// 0.5 x (1 + tanh(u)), computed as the identical x * sigmoid(2u): `1 + tanh(u)` cancels for
/// negative x (losing f32 digits), `sigmoid` does not.
fn gelu_tanh<S: Scalar>(x: S) -> S {
    x * sigmoid(s::<S>(2.0) * gelu_tanh_inner(x))
}

/// The exact derivative of the tanh form: 0.5 (1 + t) + 0.5 x (1 - t^2) beta (1 + 3 kappa x^2)
/// with t = tanh(u), written with 0.5 (1 + t) = sigmoid(2u) and 1 - t^2 = 4 sigmoid(2u)
/// sigmoid(-2u), both free of cancellation. Once that product underflows the second term is 0,
/// even where x^2 overflows.
fn gelu_tanh_grad<S: Scalar>(x: S) -> S {
    let two_u = s::<S>(2.0) * gelu_tanh_inner(x);
    let (p, q) = (sigmoid(two_u), sigmoid(-two_u));
    let pq = p * q;
    if pq == S::ZERO {
        return p;
    }
    let inner_derivative = s::<S>(GELU_BETA) * (S::ONE + s::<S>(3.0 * GELU_KAPPA) * (x * x));
    p + s::<S>(2.0) * x * pq * inner_derivative
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The far negative tail, where the textbook `1 + erf` form gives 0 or noise even in f64,
    /// keeps the f32 kernel's stated accuracy: the value within 7 ulps, the slope within 5 ulps
    /// of its larger term `x phi(x)`.
    #[test]
    fn erf_gelu_keeps_its_far_negative_tail_in_f32() {
        // (x, x Phi(x), Phi(x) + x phi(x), x phi(x)) from Python's math.erfc and math.exp,
        // correct to f64 rounding.
        let table = [
            (
                -6.0,
                -5.919525870226207e-09,
                -3.5468709453902015e-08,
                -3.645529709893972e-08,
            ),
            (
                -10.0,
                -7.619853024160593e-23,
                -7.618400096464813e-22,
                -7.694598626706419e-22,
            ),
            (
                -12.5,
                -4.6657053735972626e-35,
                -5.831668554480155e-34,
                -5.868994197468933e-34,
            ),
        ];
        // The spacing of f32s at |v|'s binade.
        let ulp = |v: f64| {
            let bits = (v as f32).abs().to_bits() & 0x7f80_0000;
            f64::from(f32::from_bits(bits)) * f64::from(f32::EPSILON)
        };
        for (x, value, slope, density_term) in table {
            let got = f64::from(gelu_erf(x as f32));
            assert!(
                (got - value).abs() <= 7.0 * ulp(value),
                "gelu({x}) = {got}, not {value}"
            );
            let got = f64::from(gelu_erf_grad(x as f32));
            assert!(
                (got - slope).abs() <= 5.0 * ulp(density_term),
                "gelu'({x}) = {got}, not {slope}"
            );
        }
    }
}
