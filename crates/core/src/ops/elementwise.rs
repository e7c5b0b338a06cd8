//! Elementwise operations with broadcasting: arithmetic, the unary math functions, clamp,
//! maximum/minimum (ties split the gradient half/half) and `where` with a fixed mask.
//! Each op's forward, VJP and JVP sit side by side; VJPs sum broadcast axes back with `sum_to`.

use super::{Arity, Forward, Grads, LinearPart, LinearVjp, Mask, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::kernels::alloc::ensure_allocatable;
use tapegrad_tensor::kernels::{binary_map, broadcast_shape, broadcast_to, sum_to};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// Elementwise operations. Binary ones broadcast under NumPy/PyTorch rules.
#[derive(Debug, Clone, PartialEq)]
pub enum ElementwiseOp {
    Add,
    Sub,
    Mul,
    Div,
    Neg,
    /// Multiplication by a constant `factor`.
    Scale {
        factor: f64,
    },
    Abs,
    Sqrt,
    Exp,
    /// Natural log; checked evaluation rejects `x <= 0`.
    Log,
    /// `log(max(x, eps))`: finite everywhere; the gradient is 0 where `x <= eps`.
    SafeLog {
        eps: f64,
    },
    Sin,
    Cos,
    /// `x ^ exponent` for a constant exponent.
    Pow {
        exponent: f64,
    },
    /// Clamp into `[min, max]`; either bound may be absent. Gradient passes where `min <= x <= max`.
    Clamp {
        min: Option<f64>,
        max: Option<f64>,
    },
    /// Elementwise maximum; at ties each argument gets half the gradient.
    Maximum,
    /// Elementwise minimum; at ties each argument gets half the gradient.
    Minimum,
    /// `mask ? a : b`, with the mask broadcast against both.
    Where {
        mask: Mask,
    },
}

use ElementwiseOp as E;

impl ElementwiseOp {
    fn is_binary(&self) -> bool {
        matches!(
            self,
            E::Add | E::Sub | E::Mul | E::Div | E::Maximum | E::Minimum | E::Where { .. }
        )
    }
}

impl ElementwiseOp {
    /// Whether `forward` itself rejects every shape list `output_shape` rejects (arity aside),
    /// with the same error, and always makes a value of the output shape: `Op::forward` then
    /// skips its separate shape rule. `where` and `clamp` have rules of their own.
    pub(crate) fn forward_checks_shapes(&self) -> bool {
        !matches!(self, E::Where { .. } | E::Clamp { .. })
    }

    /// Whether this op holds no heap data, so that forgetting it frees nothing that dropping it
    /// would (`Tape::clear` skips the drop glue of such nodes). Every variant is named, so a
    /// new one must be decided here.
    pub(crate) fn holds_no_heap(&self) -> bool {
        match self {
            E::Add | E::Sub | E::Mul | E::Div | E::Neg | E::Scale { .. } | E::Abs | E::Sqrt => true,
            E::Exp | E::Log | E::SafeLog { .. } | E::Sin | E::Cos | E::Pow { .. } => true,
            E::Clamp { .. } | E::Maximum | E::Minimum => true,
            E::Where { .. } => false,
        }
    }
}

impl ElementwiseOp {
    /// The forward's value (elementwise ops have no auxiliary data); `forward` wraps it.
    pub(crate) fn forward_value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>> {
        let name = self.name();
        // The binary ops return their kernel's result as it is (no unwrap and re-wrap).
        let out = match self {
            E::Add => return binary_map(name, x[0], x[1], |a, b| a + b),
            E::Sub => return binary_map(name, x[0], x[1], |a, b| a - b),
            E::Mul => return binary_map(name, x[0], x[1], |a, b| a * b),
            E::Div => return binary_map(name, x[0], x[1], |a, b| a / b),
            E::Maximum => return binary_map(name, x[0], x[1], |a, b| a.max_nan(b)),
            E::Minimum => return binary_map(name, x[0], x[1], |a, b| a.min_nan(b)),
            E::Neg => x[0].map(|a| -a),
            E::Scale { factor } => {
                let f: S = s(*factor);
                x[0].map(|a| a * f)
            }
            E::Abs => x[0].map(|a| a.abs()),
            E::Sqrt => x[0].map(|a| a.sqrt()),
            E::Exp => x[0].map(|a| a.exp()),
            E::Log => x[0].map(|a| a.ln()),
            E::SafeLog { eps } => {
                let e: S = s(*eps);
                x[0].map(|a| if a > e { a.ln() } else { e.ln() })
            }
            E::Sin => x[0].map(|a| a.sin()),
            E::Cos => x[0].map(|a| a.cos()),
            E::Pow { exponent } => {
                let e: S = s(*exponent);
                x[0].map(|a| a.powf(e))
            }
            E::Clamp { min, max } => {
                let (lo, hi) = bounds::<S>(*min, *max);
                x[0].map(|a| {
                    if a < lo {
                        lo
                    } else if a > hi {
                        hi
                    } else {
                        a
                    }
                })
            }
            E::Where { mask } => return where_select(mask, x[0], x[1]),
        };
        Ok(out)
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

fn s<S: Scalar>(v: f64) -> S {
    S::from_f64(v)
}

impl OpRules for ElementwiseOp {
    fn arity(&self) -> Arity {
        Arity::Exact(if self.is_binary() { 2 } else { 1 })
    }

    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        match self {
            E::Where { mask } => {
                let ab = broadcast_shape("where", inputs[0], inputs[1])?;
                broadcast_shape("where", &mask.shape, &ab).map_err(|_| Error::Broadcast {
                    op: "where",
                    lhs: Box::new(mask.shape.clone()),
                    rhs: Box::new(ab),
                })
            }
            E::Clamp {
                min: Some(lo),
                max: Some(hi),
            } if lo > hi || lo.is_nan() || hi.is_nan() => Err(Error::invalid(
                "clamp",
                format!(
                    "min {lo} must not exceed max {hi} (input shape {})",
                    inputs[0]
                ),
            )),
            _ if self.is_binary() => broadcast_shape(self.name(), inputs[0], inputs[1]),
            _ => Ok(inputs[0].clone()),
        }
    }

    fn saves(&self) -> Saves {
        match self {
            E::Add | E::Sub | E::Neg | E::Scale { .. } | E::Where { .. } => Saves::NOTHING,
            E::Mul | E::Div | E::Maximum | E::Minimum => Saves::inputs(&[0, 1]),
            E::Sqrt | E::Exp => Saves::OUTPUT,
            E::Abs
            | E::Log
            | E::SafeLog { .. }
            | E::Sin
            | E::Cos
            | E::Pow { .. }
            | E::Clamp { .. } => Saves::inputs(&[0]),
        }
    }

    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        Ok(Forward::new(self.forward_value(x)?))
    }

    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let name = self.name();
        let shapes = ctx.input_shapes;
        let reduce = |g: Tensor<S>, i: usize| -> Result<Option<Tensor<S>>> {
            if !ctx.needs(i) {
                Ok(None)
            } else if *g.shape() == shapes[i] {
                Ok(Some(g)) // not broadcast: pass the buffer on without another clone
            } else {
                sum_to(&g, &shapes[i]).map(Some)
            }
        };
        // The cotangent itself, for an argument that needs it (no clone for one that does not).
        let pass = |i: usize| -> Result<Option<Tensor<S>>> {
            if ctx.needs(i) {
                reduce(cot.clone(), i)
            } else {
                Ok(None)
            }
        };
        Ok(match self {
            E::Add => smallvec![pass(0)?, pass(1)?],
            E::Sub => smallvec![
                pass(0)?,
                if ctx.needs(1) {
                    reduce(cot.map(|g| -g), 1)?
                } else {
                    None
                }
            ],
            E::Mul => {
                let (a, b) = (ctx.input(name, 0)?, ctx.input(name, 1)?);
                smallvec![
                    if ctx.needs(0) {
                        reduce(binary_map(name, cot, b, |g, b| g * b)?, 0)?
                    } else {
                        None
                    },
                    if ctx.needs(1) {
                        reduce(binary_map(name, cot, a, |g, a| g * a)?, 1)?
                    } else {
                        None
                    },
                ]
            }
            E::Div => {
                let (a, b) = (ctx.input(name, 0)?, ctx.input(name, 1)?);
                let ga = binary_map(name, cot, b, |g, b| g / b)?;
                let gb = if ctx.needs(1) {
                    // d(a/b)/db = -a/b^2, written as -(g/b)*(a/b) to match PyTorch's rounding order.
                    let ab = binary_map(name, a, b, |a, b| a / b)?;
                    Some(binary_map(name, &ga, &ab, |gb, ab| -(gb * ab))?)
                } else {
                    None
                };
                smallvec![
                    reduce(ga, 0)?,
                    match gb {
                        Some(g) => reduce(g, 1)?,
                        None => None,
                    },
                ]
            }
            E::Maximum | E::Minimum => {
                let (a, b) = (ctx.input(name, 0)?, ctx.input(name, 1)?);
                let wins_a = matches!(self, E::Maximum);
                let share = |first: bool| -> Result<Tensor<S>> {
                    let out_shape = ctx.output_shape;
                    let a = broadcast_to(a, out_shape)?;
                    let b = broadcast_to(b, out_shape)?;
                    let half: S = s(0.5);
                    let data = cot
                        .data()
                        .iter()
                        .zip(a.data().iter().zip(b.data()))
                        .map(|(&g, (&x, &y))| {
                            let a_wins = if wins_a { x > y } else { x < y };
                            let b_wins = if wins_a { y > x } else { y < x };
                            if x == y {
                                g * half
                            } else if (first && a_wins) || (!first && b_wins) {
                                g
                            } else {
                                S::ZERO
                            }
                        })
                        .collect();
                    Tensor::from_shape(out_shape.clone(), data)
                };
                smallvec![
                    if ctx.needs(0) {
                        reduce(share(true)?, 0)?
                    } else {
                        None
                    },
                    if ctx.needs(1) {
                        reduce(share(false)?, 1)?
                    } else {
                        None
                    },
                ]
            }
            E::Where { mask } => {
                let m = broadcast_mask(mask, ctx.output_shape)?;
                let pick = |keep_when: bool| -> Result<Tensor<S>> {
                    let data = cot
                        .data()
                        .iter()
                        .zip(m.iter())
                        .map(|(&g, &c)| if c == keep_when { g } else { S::ZERO })
                        .collect();
                    Tensor::from_shape(ctx.output_shape.clone(), data)
                };
                smallvec![
                    if ctx.needs(0) {
                        reduce(pick(true)?, 0)?
                    } else {
                        None
                    },
                    if ctx.needs(1) {
                        reduce(pick(false)?, 1)?
                    } else {
                        None
                    },
                ]
            }
            E::Neg => smallvec![Some(cot.map(|g| -g))],
            E::Scale { factor } => {
                let f: S = s(*factor);
                smallvec![Some(cot.map(|g| g * f))]
            }
            E::Sqrt => {
                let y = ctx.output(name)?;
                let two: S = s(2.0);
                smallvec![Some(chain(cot, y, |g, y| g / (two * y))?)]
            }
            E::Exp => smallvec![Some(chain(cot, ctx.output(name)?, |g, y| g * y)?)],
            E::Abs => smallvec![Some(chain(cot, ctx.input(name, 0)?, |g, x| g * sign(x))?)],
            E::Log => smallvec![Some(chain(cot, ctx.input(name, 0)?, |g, x| g / x)?)],
            E::SafeLog { eps } => {
                let e: S = s(*eps);
                smallvec![Some(chain(cot, ctx.input(name, 0)?, |g, x| {
                    if x > e {
                        g / x
                    } else {
                        S::ZERO
                    }
                })?)]
            }
            E::Sin => smallvec![Some(chain(cot, ctx.input(name, 0)?, |g, x| g * x.cos())?)],
            E::Cos => smallvec![Some(chain(cot, ctx.input(name, 0)?, |g, x| {
                -(g * x.sin())
            })?)],
            E::Pow { exponent } => {
                let e: S = s(*exponent);
                let e1: S = s(*exponent - 1.0);
                smallvec![Some(chain(cot, ctx.input(name, 0)?, |g, x| {
                    if *exponent == 0.0 {
                        S::ZERO
                    } else {
                        g * e * x.powf(e1)
                    }
                })?)]
            }
            E::Clamp { min, max } => {
                let (lo, hi) = bounds::<S>(*min, *max);
                smallvec![Some(chain(cot, ctx.input(name, 0)?, |g, x| {
                    if x >= lo && x <= hi {
                        g
                    } else {
                        S::ZERO
                    }
                })?)]
            }
        })
    }

    /// Add, sub, neg and scale read no value: their VJP is a linear map of the cotangent, which
    /// the executed sweep may apply to the cotangent's own buffer.
    #[inline]
    fn linear_vjp(&self) -> Option<LinearVjp> {
        use LinearPart::{Negate, Pass};
        Some(match self {
            E::Add => LinearVjp::Binary(Pass, Pass),
            E::Sub => LinearVjp::Binary(Pass, Negate),
            E::Neg => LinearVjp::Unary(Negate),
            E::Scale { factor } => LinearVjp::Unary(LinearPart::Scale(*factor)),
            _ => return None,
        })
    }

    fn jvp<S: Scalar>(
        &self,
        x: &[&Tensor<S>],
        out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        let name = self.name();
        let y = &out.value;
        Ok(match self {
            E::Add => binary_map(name, t[0], t[1], |a, b| a + b)?,
            E::Sub => binary_map(name, t[0], t[1], |a, b| a - b)?,
            E::Mul => {
                let l = binary_map(name, t[0], x[1], |ta, b| ta * b)?;
                let r = binary_map(name, x[0], t[1], |a, tb| a * tb)?;
                binary_map(name, &l, &r, |l, r| l + r)?
            }
            E::Div => {
                let l = binary_map(name, t[0], x[1], |ta, b| ta / b)?;
                let ab = binary_map(name, x[0], x[1], |a, b| a / b)?;
                let tb_b = binary_map(name, t[1], x[1], |tb, b| tb / b)?;
                let r = binary_map(name, &ab, &tb_b, |ab, tbb| ab * tbb)?;
                binary_map(name, &l, &r, |l, r| l - r)?
            }
            E::Maximum | E::Minimum => {
                let shape = y.shape();
                let (a, b) = (broadcast_to(x[0], shape)?, broadcast_to(x[1], shape)?);
                let (ta, tb) = (broadcast_to(t[0], shape)?, broadcast_to(t[1], shape)?);
                let wins_a = matches!(self, E::Maximum);
                let half: S = s(0.5);
                let data = (0..shape.numel())
                    .map(|i| {
                        let (p, q) = (a.data()[i], b.data()[i]);
                        if p == q {
                            half * (ta.data()[i] + tb.data()[i])
                        } else if (p > q) == wins_a {
                            ta.data()[i]
                        } else {
                            tb.data()[i]
                        }
                    })
                    .collect();
                Tensor::from_shape(shape.clone(), data)?
            }
            E::Where { mask } => where_select(mask, t[0], t[1])?,
            E::Neg => t[0].map(|v| -v),
            E::Scale { factor } => {
                let f: S = s(*factor);
                t[0].map(|v| v * f)
            }
            E::Sqrt => {
                let two: S = s(2.0);
                t[0].zip_map(y, name, |t, y| t / (two * y))?
            }
            E::Exp => t[0].zip_map(y, name, |t, y| t * y)?,
            E::Abs => t[0].zip_map(x[0], name, |t, x| t * sign(x))?,
            E::Log => t[0].zip_map(x[0], name, |t, x| t / x)?,
            E::SafeLog { eps } => {
                let e: S = s(*eps);
                t[0].zip_map(x[0], name, |t, x| if x > e { t / x } else { S::ZERO })?
            }
            E::Sin => t[0].zip_map(x[0], name, |t, x| t * x.cos())?,
            E::Cos => t[0].zip_map(x[0], name, |t, x| -(t * x.sin()))?,
            E::Pow { exponent } => {
                let e: S = s(*exponent);
                let e1: S = s(*exponent - 1.0);
                t[0].zip_map(x[0], name, |t, x| {
                    if *exponent == 0.0 {
                        S::ZERO
                    } else {
                        t * e * x.powf(e1)
                    }
                })?
            }
            E::Clamp { min, max } => {
                let (lo, hi) = bounds::<S>(*min, *max);
                t[0].zip_map(
                    x[0],
                    name,
                    |t, x| if x >= lo && x <= hi { t } else { S::ZERO },
                )?
            }
        })
    }

    fn check_domain<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<()> {
        let name = self.name();
        let first_bad =
            |t: &Tensor<S>, bad: &dyn Fn(S) -> bool| t.data().iter().position(|&v| bad(v));
        match self {
            E::Log => {
                if let Some(i) = first_bad(x[0], &|v| v <= S::ZERO || v.is_nan()) {
                    return Err(Error::Domain {
                        op: name,
                        index: i,
                        message: format!(
                            "log of {} (input shape {}) is not finite",
                            x[0].data()[i],
                            x[0].shape()
                        ),
                    });
                }
            }
            E::Sqrt => {
                if let Some(i) = first_bad(x[0], &|v| v < S::ZERO || v.is_nan()) {
                    return Err(Error::Domain {
                        op: name,
                        index: i,
                        message: format!(
                            "sqrt of {} (input shape {}) is not real",
                            x[0].data()[i],
                            x[0].shape()
                        ),
                    });
                }
            }
            E::Div => {
                let b = broadcast_to(x[1], &broadcast_shape(name, x[0].shape(), x[1].shape())?)?;
                if let Some(i) = first_bad(&b, &|v| v == S::ZERO) {
                    return Err(Error::Domain {
                        op: name,
                        index: i,
                        message: format!("division by zero (divisor shape {})", x[1].shape()),
                    });
                }
            }
            _ => {}
        }
        Ok(())
    }
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

fn bounds<S: Scalar>(min: Option<f64>, max: Option<f64>) -> (S, S) {
    (
        min.map_or(S::NEG_INFINITY, S::from_f64),
        max.map_or(S::INFINITY, S::from_f64),
    )
}

fn broadcast_mask(mask: &Mask, shape: &Shape) -> Result<Vec<bool>> {
    let as_tensor = Tensor::<f32>::from_shape(
        mask.shape.clone(),
        mask.data
            .iter()
            .map(|&b| if b { 1.0 } else { 0.0 })
            .collect(),
    )?;
    Ok(broadcast_to(&as_tensor, shape)?
        .data()
        .iter()
        .map(|&v| v != 0.0)
        .collect())
}

fn where_select<S: Scalar>(mask: &Mask, a: &Tensor<S>, b: &Tensor<S>) -> Result<Tensor<S>> {
    let ab = broadcast_shape("where", a.shape(), b.shape())?;
    let shape = broadcast_shape("where", &mask.shape, &ab)?;
    ensure_allocatable::<S>("where", &shape)?;
    let m = broadcast_mask(mask, &shape)?;
    let (a, b) = (broadcast_to(a, &shape)?, broadcast_to(b, &shape)?);
    let data = m
        .iter()
        .zip(a.data().iter().zip(b.data()))
        .map(|(&c, (&x, &y))| if c { x } else { y })
        .collect();
    Tensor::from_shape(shape, data)
}

impl std::fmt::Display for ElementwiseOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            E::Scale { factor } => write!(f, "scale(factor={factor})"),
            E::SafeLog { eps } => write!(f, "safe_log(eps={eps})"),
            E::Pow { exponent } => write!(f, "pow(exponent={exponent})"),
            E::Clamp { min, max } => write!(f, "clamp(min={min:?}, max={max:?})"),
            E::Where { mask } => write!(f, "where(mask={})", mask.shape),
            _ => f.write_str(self.name()),
        }
    }
}
