//! The selections: clamp into bounds, maximum and minimum (ties split the gradient half/half)
//! and `where` with a fixed mask. Each passes every element's derivative from the argument it
//! selected; clamp and `where` have shape rules of their own.

use super::{chain, diagonal_shell, elementwise_shell, when_needed, Diagonal, ElementwiseRules};
use crate::ops::{display_by_name, s, Arity, Forward, Grads, Mask, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::kernels::alloc::ensure_allocatable;
use tapegrad_tensor::kernels::{binary_map, broadcast_shape, broadcast_to};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// Clamp into `[min, max]`; either bound may be absent. Gradient passes where `min <= x <= max`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clamp {
    pub min: Option<f64>,
    pub max: Option<f64>,
}

impl Clamp {
    /// The bounds in the element type, an absent one infinite.
    fn bounds<S: Scalar>(&self) -> (S, S) {
        (
            self.min.map_or(S::NEG_INFINITY, S::from_f64),
            self.max.map_or(S::INFINITY, S::from_f64),
        )
    }
}

impl Diagonal for Clamp {
    const DERIVATIVE_OF_OUTPUT: bool = false;
    fn derivative<S: Scalar>(&self) -> impl Fn(S, S) -> S + Sync {
        let (lo, hi) = self.bounds::<S>();
        move |g, x| if x >= lo && x <= hi { g } else { S::ZERO }
    }
}

impl ElementwiseRules for Clamp {
    const VALUE_CHECKS_SHAPES: bool = false;
    fn value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>> {
        let (lo, hi) = self.bounds::<S>();
        Ok(x[0].map(|a| {
            if a < lo {
                lo
            } else if a > hi {
                hi
            } else {
                a
            }
        }))
    }
}

impl OpRules for Clamp {
    fn arity(&self) -> Arity {
        Arity::Exact(1)
    }
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        match (self.min, self.max) {
            (Some(lo), Some(hi)) if lo > hi || lo.is_nan() || hi.is_nan() => Err(Error::invalid(
                "clamp",
                format!(
                    "min {lo} must not exceed max {hi} (input shape {})",
                    inputs[0]
                ),
            )),
            _ => Ok(inputs[0].clone()),
        }
    }
    elementwise_shell!(forward);
    diagonal_shell!();
}

impl std::fmt::Display for Clamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "clamp(min={:?}, max={:?})", self.min, self.max)
    }
}

/// Elementwise maximum; at ties each argument gets half the gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Maximum;

/// Elementwise minimum; at ties each argument gets half the gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Minimum;

/// The contract of maximum or minimum: the value of `$pick` per element pair (broadcast), the
/// derivative passed from the selected argument, `$wins_a` saying whether that is the larger.
macro_rules! extremum_rules {
    ($op:ty, $wins_a:literal, $pick:expr) => {
        impl ElementwiseRules for $op {
            const VALUE_CHECKS_SHAPES: bool = true;
            fn value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>> {
                binary_map(self.name(), x[0], x[1], $pick)
            }
        }

        impl OpRules for $op {
            elementwise_shell!(binary);
            fn saves(&self) -> Saves {
                Saves::inputs(&[0, 1])
            }
            fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
                tie_split_vjp(self.name(), $wins_a, ctx, cot)
            }
            fn jvp<S: Scalar>(
                &self,
                x: &[&Tensor<S>],
                out: &Forward<S>,
                t: &[&Tensor<S>],
            ) -> Result<Tensor<S>> {
                tie_split_jvp($wins_a, x, out, t)
            }
        }
    };
}

extremum_rules!(Maximum, true, |a: S, b: S| a.max_nan(b));
extremum_rules!(Minimum, false, |a: S, b: S| a.min_nan(b));

/// The VJP of maximum (`wins_a`: the larger argument is selected) or minimum: the cotangent to
/// the selected argument, half to each at a tie.
fn tie_split_vjp<S: Scalar>(
    name: &'static str,
    wins_a: bool,
    ctx: &VjpContext<'_, S>,
    cot: &Tensor<S>,
) -> Result<Grads<S>> {
    let (a, b) = (ctx.input(name, 0)?, ctx.input(name, 1)?);
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
    Ok(smallvec![
        when_needed(ctx, 0, || share(true))?,
        when_needed(ctx, 1, || share(false))?,
    ])
}

/// The JVP of maximum or minimum (see `tie_split_vjp`): the selected argument's tangent, their
/// mean at a tie.
fn tie_split_jvp<S: Scalar>(
    wins_a: bool,
    x: &[&Tensor<S>],
    out: &Forward<S>,
    t: &[&Tensor<S>],
) -> Result<Tensor<S>> {
    let shape = out.value.shape();
    let (a, b) = (broadcast_to(x[0], shape)?, broadcast_to(x[1], shape)?);
    let (ta, tb) = (broadcast_to(t[0], shape)?, broadcast_to(t[1], shape)?);
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
    Tensor::from_shape(shape.clone(), data)
}

/// `mask ? a : b`, with the mask broadcast against both.
#[derive(Debug, Clone, PartialEq)]
pub struct Where {
    pub mask: Mask,
}

impl Where {
    /// The mask broadcast to `shape`, one flag per element.
    fn mask_to(&self, shape: &Shape) -> Result<Vec<bool>> {
        let mask = &self.mask;
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
}

impl ElementwiseRules for Where {
    const VALUE_CHECKS_SHAPES: bool = false;
    fn value<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Tensor<S>> {
        let (a, b) = (x[0], x[1]);
        let ab = broadcast_shape("where", a.shape(), b.shape())?;
        let shape = broadcast_shape("where", &self.mask.shape, &ab)?;
        ensure_allocatable::<S>("where", &shape)?;
        let m = self.mask_to(&shape)?;
        let (a, b) = (broadcast_to(a, &shape)?, broadcast_to(b, &shape)?);
        let data = m
            .iter()
            .zip(a.data().iter().zip(b.data()))
            .map(|(&c, (&x, &y))| if c { x } else { y })
            .collect();
        Tensor::from_shape(shape, data)
    }
}

impl OpRules for Where {
    fn arity(&self) -> Arity {
        Arity::Exact(2)
    }
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        let ab = broadcast_shape("where", inputs[0], inputs[1])?;
        broadcast_shape("where", &self.mask.shape, &ab).map_err(|_| Error::Broadcast {
            op: "where",
            lhs: Box::new(self.mask.shape.clone()),
            rhs: Box::new(ab),
        })
    }
    elementwise_shell!(forward);
    fn saves(&self) -> Saves {
        Saves::NOTHING
    }
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let m = self.mask_to(ctx.output_shape)?;
        let pick = |keep_when: bool| -> Result<Tensor<S>> {
            let data = cot
                .data()
                .iter()
                .zip(m.iter())
                .map(|(&g, &c)| if c == keep_when { g } else { S::ZERO })
                .collect();
            Tensor::from_shape(ctx.output_shape.clone(), data)
        };
        Ok(smallvec![
            when_needed(ctx, 0, || pick(true))?,
            when_needed(ctx, 1, || pick(false))?,
        ])
    }
    fn jvp<S: Scalar>(
        &self,
        _x: &[&Tensor<S>],
        _out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        self.value(t)
    }
}

impl std::fmt::Display for Where {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "where(mask={})", self.mask.shape)
    }
}

display_by_name!(Maximum, Minimum);
