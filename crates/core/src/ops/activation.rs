//! Activation functions: relu, leaky_relu, sigmoid, tanh, gelu (exact erf form and tanh
//! approximation), softplus and silu, with PyTorch's definitions and gradient conventions.
//! Each is elementwise, so one local-derivative rule serves as both the VJP and the JVP.

use super::{Arity, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::kernels::gelu;
use tapegrad_tensor::kernels::par_map::{map_in_place, zip_in_place};
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

/// Elementwise activation functions (one argument, output of the same shape).
#[derive(Debug, Clone, PartialEq)]
pub enum ActivationOp {
    /// max(x, 0); gradient 0 at x = 0 (PyTorch).
    Relu,
    /// x for x > 0, negative_slope * x otherwise.
    LeakyRelu {
        negative_slope: f64,
    },
    Sigmoid,
    Tanh,
    Gelu {
        approximate: GeluApproximate,
    },
    /// (1/beta) * log(1 + exp(beta * x)), linear above `threshold` (PyTorch's defaults: 1, 20).
    Softplus {
        beta: f64,
        threshold: f64,
    },
    /// x * sigmoid(x).
    Silu,
}

use ActivationOp as A;

fn s<S: Scalar>(v: f64) -> S {
    S::from_f64(v)
}

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

/// sqrt(2/pi), PyTorch's `kBeta` for the tanh-approximated GELU.
const GELU_BETA: f64 = std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5;
/// PyTorch's `kKappa`.
const GELU_KAPPA: f64 = 0.044715;
/// x * Phi(x) (Phi the standard normal distribution function), evaluated in f64 and rounded to
/// `S`, so that the f32 result is within its own rounding: the tensor kernel's element rule (see
/// `kernels::gelu`), not `(1 + erf(x / sqrt 2)) / 2`, which cancels in the far negative tail.
fn gelu_erf<S: Scalar>(x: S) -> S {
    gelu::gelu_erf_value(x)
}

/// d/dx of x * Phi(x) = Phi(x) + x * phi(x), in f64 as the forward. Where the density underflows
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

impl ActivationOp {
    /// The tensor the derivative is a function of: the output for relu, sigmoid and tanh (their
    /// derivatives are functions of it), the input for the others.
    fn derivative_of_output(&self) -> bool {
        matches!(self, A::Relu | A::Sigmoid | A::Tanh)
    }

    /// Multiplies `d` (a cotangent or a tangent) elementwise by the local derivative, read from
    /// `saved` (the output or the input, see `derivative_of_output`). The Jacobian is diagonal, so
    /// this one map is both the VJP and the JVP, which makes the two exactly adjoint.
    fn apply_derivative<S: Scalar>(&self, d: &Tensor<S>, saved: &Tensor<S>) -> Result<Tensor<S>> {
        let name = self.name();
        match self {
            A::Relu => d.zip_map(saved, name, relu_grad),
            A::LeakyRelu { negative_slope } => {
                let slope: S = s(*negative_slope);
                d.zip_map(saved, name, |g, x| if x > S::ZERO { g } else { g * slope })
            }
            A::Sigmoid => d.zip_map(saved, name, |g, y| g * (S::ONE - y) * y),
            A::Tanh => d.zip_map(saved, name, |g, y| g * (S::ONE - y * y)),
            A::Gelu {
                approximate: GeluApproximate::None,
            } => {
                if d.numel() <= 1 || d.shape() != saved.shape() {
                    return d.zip_map(saved, name, |g, x| g * gelu_erf_grad(x));
                }
                // The slice kernel: the same element rule, vectorised.
                let (g, x) = (d.data(), saved.data());
                Ok(Tensor::from_writer(d.shape().clone(), |out| {
                    gelu::gelu_erf_backward(g, x, out)
                }))
            }
            A::Gelu {
                approximate: GeluApproximate::Tanh,
            } => d.zip_map(saved, name, |g, x| g * gelu_tanh_grad(x)),
            A::Softplus { beta, threshold } => {
                let (b, th): (S, S) = (s(*beta), s(*threshold));
                d.zip_map(saved, name, |g, x| {
                    let bx = x * b;
                    if bx > th {
                        g
                    } else {
                        g * sigmoid(bx)
                    }
                })
            }
            A::Silu => d.zip_map(saved, name, |g, x| {
                let sg = sigmoid(x);
                g * sg * (S::ONE + x * (S::ONE - sg))
            }),
        }
    }
}

impl OpRules for ActivationOp {
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
        // Attributes PyTorch would accept but that make the function undefined (NaN or inf for
        // every input) are rejected here rather than silently producing NaN.
        match self {
            A::LeakyRelu { negative_slope } if !negative_slope.is_finite() => Err(Error::invalid(
                self.name(),
                format!(
                    "negative_slope must be finite, got {negative_slope} (input shape {shape})"
                ),
            )),
            A::Softplus { beta, .. } if !beta.is_finite() || *beta == 0.0 => Err(Error::invalid(
                self.name(),
                format!("beta must be finite and non-zero, got {beta} (input shape {shape})"),
            )),
            A::Softplus { threshold, .. } if threshold.is_nan() => Err(Error::invalid(
                self.name(),
                format!("threshold must not be NaN (input shape {shape})"),
            )),
            _ => Ok(shape.clone()),
        }
    }

    fn saves(&self) -> Saves {
        if self.derivative_of_output() {
            Saves::OUTPUT
        } else {
            Saves::inputs(&[0])
        }
    }

    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        let x = x.first().ok_or_else(|| Error::Arity {
            op: self.name(),
            expected: 1,
            found: 0,
        })?;
        let out = match self {
            A::Relu => x.map(relu_value),
            A::LeakyRelu { negative_slope } => {
                let slope: S = s(*negative_slope);
                x.map(|v| if v > S::ZERO { v } else { v * slope })
            }
            A::Sigmoid => x.map(sigmoid),
            A::Tanh => x.map(|v| v.tanh()),
            A::Gelu {
                approximate: GeluApproximate::None,
            } if x.numel() > 1 => {
                Tensor::from_writer(x.shape().clone(), |out| gelu::gelu_erf(x.data(), out))
            }
            A::Gelu {
                approximate: GeluApproximate::None,
            } => x.map(gelu_erf),
            A::Gelu {
                approximate: GeluApproximate::Tanh,
            } => x.map(gelu_tanh),
            A::Softplus { beta, threshold } => {
                let (b, th): (S, S) = (s(*beta), s(*threshold));
                x.map(|v| softplus(v, b, th))
            }
            A::Silu => x.map(|v| v * sigmoid(v)),
        };
        Ok(Forward::new(out))
    }

    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        if !ctx.needs(0) {
            return Ok(smallvec![None]);
        }
        let name = self.name();
        let saved = if self.derivative_of_output() {
            ctx.output(name)?
        } else {
            ctx.input(name, 0)?
        };
        Ok(smallvec![Some(self.apply_derivative(cot, saved)?)])
    }

    /// relu keeps only its output, and its value and derivative are elementwise selections:
    /// both can overwrite a buffer nothing reads again (its producer's output, the cotangent).
    #[inline]
    fn forward_in_place<S: Scalar>(&self, x: &mut Tensor<S>) -> bool {
        match self {
            A::Relu => {
                map_in_place(x.data_mut(), relu_value);
                true
            }
            _ => false,
        }
    }

    #[inline]
    fn vjp_in_place<S: Scalar>(&self, y: &Tensor<S>, cot: &mut Tensor<S>) -> bool {
        match self {
            A::Relu if y.shape() == cot.shape() => {
                zip_in_place(cot.data_mut(), y.data(), relu_grad);
                true
            }
            _ => false,
        }
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
        let saved = if self.derivative_of_output() {
            &out.value
        } else {
            x
        };
        self.apply_derivative(t, saved)
    }
}

impl std::fmt::Display for ActivationOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            A::LeakyRelu { negative_slope } => {
                write!(f, "leaky_relu(negative_slope={negative_slope})")
            }
            A::Gelu { approximate } => write!(f, "gelu(approximate='{}')", approximate.name()),
            A::Softplus { beta, threshold } => {
                write!(f, "softplus(beta={beta}, threshold={threshold})")
            }
            _ => f.write_str(self.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_gelu_keeps_its_far_negative_tail_in_f32() {
        // (x, x Phi(x), Phi(x) + x phi(x)) from Python's math.erfc, correct to f64 rounding.
        // The far negative tail, where the textbook `1 + erf` form gives 0 or noise in f64.
        let table = [
            (-6.0, -5.919525870226207e-09, -3.5468709453902015e-08),
            (-10.0, -7.619853024160593e-23, -7.618400096464813e-22),
            (-12.5, -4.6657053735972626e-35, -5.831668554480155e-34),
        ];
        for (x, value, slope) in table {
            let ulp = |v: f64| f64::from((v as f32).abs()) * f64::from(f32::EPSILON);
            let got = f64::from(gelu_erf(x as f32));
            assert!(
                (got - value).abs() <= ulp(value),
                "gelu({x}) = {got}, not {value}"
            );
            let got = f64::from(gelu_erf_grad(x as f32));
            assert!(
                (got - slope).abs() <= ulp(slope),
                "gelu'({x}) = {got}, not {slope}"
            );
        }
    }
}
