//! The losses of two arguments of one shape, element by element: mse_loss and
//! binary_cross_entropy_with_logits (the latter with PyTorch's constant `pos_weight` and
//! `weight`, see `binary.rs`). Both differentiate both arguments; `pair_loss_shell!` is their
//! shared contract, each op giving its element rules (`PairLoss`).

use super::binary::{self, Factors};
use super::{arg, input_and_tangent, s, same_shape, write_factors, Reduction};
use crate::ops::{Arity, Forward, Grads, HasKind, OpKind, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use std::sync::Arc;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// What a loss of two same-shape arguments defines per element, given its factors (`pos_weight`
/// and `weight`, read per element; none for mse).
trait PairLoss: OpRules {
    fn reduction(&self) -> Reduction;

    /// The `pos_weight` and `weight` tensors; none by default.
    fn factor_tensors(&self) -> (Option<&Tensor<f64>>, Option<&Tensor<f64>>) {
        (None, None)
    }

    /// The loss of element `i`, input `a` and target `b`.
    fn loss<S: Scalar>(f: &(Factors<'_>, Factors<'_>), i: usize, a: S, b: S) -> S;

    /// Element `i`'s contribution to the input, `w` its cotangent.
    fn grad_input<S: Scalar>(f: &(Factors<'_>, Factors<'_>), i: usize, a: S, b: S, w: S) -> S;

    /// Element `i`'s contribution to the target.
    fn grad_target<S: Scalar>(f: &(Factors<'_>, Factors<'_>), i: usize, a: S, b: S, w: S) -> S;

    /// Element `i`'s tangent from the tangents `ta` and `tb`.
    fn tangent<S: Scalar>(f: &(Factors<'_>, Factors<'_>), i: usize, ab: (S, S), t: (S, S)) -> S;

    /// The factors checked against the input's shape, ready to read per element.
    fn factors(&self, shape: &Shape) -> Result<(Factors<'_>, Factors<'_>)> {
        let (pos_weight, weight) = self.factor_tensors();
        Ok((
            Factors::new(self.name(), "pos_weight", pos_weight, shape)?,
            Factors::new(self.name(), "weight", weight, shape)?,
        ))
    }
}

/// The contract of a `PairLoss`: two arguments of one shape, both kept, the element rules
/// reduced by the op's reduction. Expands to the `OpRules` methods.
macro_rules! pair_loss_shell {
    () => {
        fn arity(&self) -> Arity {
            Arity::Exact(2)
        }

        fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
            let name = self.name();
            let x = arg(name, inputs, 0, 2)?;
            same_shape(name, x, inputs[1])?;
            let (pos_weight, weight) = self.factor_tensors();
            Factors::check(name, "pos_weight", pos_weight, x)?;
            Factors::check(name, "weight", weight, x)?;
            Ok(self.reduction().output_shape(x.clone()))
        }

        fn saves(&self) -> Saves {
            Saves::inputs(&[0, 1])
        }

        fn forward<S: Scalar>(&self, xs: &[&Tensor<S>]) -> Result<Forward<S>> {
            let name = self.name();
            let x = arg(name, xs, 0, 2)?;
            let y = xs[1];
            same_shape(name, x.shape(), y.shape())?;
            let f = self.factors(x.shape())?;
            let per: Vec<S> = x
                .data()
                .iter()
                .zip(y.data())
                .enumerate()
                .map(|(i, (&a, &b))| Self::loss(&f, i, a, b))
                .collect();
            Ok(Forward::new(self.reduction().forward(per, x.shape())?))
        }

        fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
            let name = self.name();
            if ctx.input_shapes.is_empty() {
                return Err(Error::Arity {
                    op: name,
                    expected: 2,
                    found: 0,
                });
            }
            if !ctx.needs(0) && !ctx.needs(1) {
                return Ok(smallvec![None, None]);
            }
            let (x, y) = (ctx.input(name, 0)?, ctx.input(name, 1)?);
            same_shape(name, x.shape(), y.shape())?;
            let w = self.reduction().weights(name, cot, x.shape())?;
            let pairs = x.data().iter().zip(y.data()).enumerate();
            let f = self.factors(x.shape())?;
            let gx: Option<Vec<S>> = ctx.needs(0).then(|| {
                pairs
                    .clone()
                    .map(|(i, (&a, &b))| Self::grad_input(&f, i, a, b, w.at(i)))
                    .collect()
            });
            let gy: Option<Vec<S>> = ctx.needs(1).then(|| {
                pairs
                    .map(|(i, (&a, &b))| Self::grad_target(&f, i, a, b, w.at(i)))
                    .collect()
            });
            let wrap = |g: Option<Vec<S>>| {
                g.map(|g| Tensor::from_shape(x.shape().clone(), g))
                    .transpose()
            };
            Ok(smallvec![wrap(gx)?, wrap(gy)?])
        }

        fn jvp<S: Scalar>(
            &self,
            xs: &[&Tensor<S>],
            _out: &Forward<S>,
            ts: &[&Tensor<S>],
        ) -> Result<Tensor<S>> {
            let name = self.name();
            let (x, tx) = input_and_tangent(name, xs, ts, 2)?;
            let (y, ty) = (xs[1], ts[1]);
            same_shape(name, x.shape(), y.shape())?;
            same_shape(name, x.shape(), ty.shape())?;
            let f = self.factors(x.shape())?;
            let per: Vec<S> = (0..x.numel())
                .map(|i| {
                    let ab = (x.data()[i], y.data()[i]);
                    Self::tangent(&f, i, ab, (tx.data()[i], ty.data()[i]))
                })
                .collect();
            self.reduction().tangent(per, x.shape())
        }
    };
}

/// (input - target)^2, both arguments differentiable, same shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MseLoss {
    pub reduction: Reduction,
}

impl PairLoss for MseLoss {
    fn reduction(&self) -> Reduction {
        self.reduction
    }
    fn loss<S: Scalar>(_f: &(Factors<'_>, Factors<'_>), _i: usize, a: S, b: S) -> S {
        (a - b) * (a - b)
    }
    fn grad_input<S: Scalar>(_f: &(Factors<'_>, Factors<'_>), _i: usize, a: S, b: S, w: S) -> S {
        s::<S>(2.0) * (a - b) * w
    }
    fn grad_target<S: Scalar>(_f: &(Factors<'_>, Factors<'_>), _i: usize, a: S, b: S, w: S) -> S {
        -(s::<S>(2.0) * (a - b) * w)
    }
    fn tangent<S: Scalar>(_f: &(Factors<'_>, Factors<'_>), _i: usize, ab: (S, S), t: (S, S)) -> S {
        let ((a, b), (ta, tb)) = (ab, t);
        s::<S>(2.0) * (a - b) * (ta - tb)
    }
}

impl OpRules for MseLoss {
    pair_loss_shell!();
}

impl std::fmt::Display for MseLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}(reduction='{}')", self.name(), self.reduction)
    }
}

/// Logits and targets of one shape, both differentiable; `pos_weight` (PyTorch's) weighs the
/// positive term, broadcast to the input, whose shape it must broadcast into (no more axes,
/// trailing axes equal or 1), as PyTorch requires: `[C]` per class along the last axis,
/// `[C, 1, 1]` along the third-to-last, `[1]` or 0-d one for all. `weight` (PyTorch's) multiplies
/// every element's loss (and its partials), broadcast to the input likewise; `mean` still
/// divides by the element count. Both are constant attributes, not arguments: PyTorch does not
/// differentiate them either.
#[derive(Debug, Clone, PartialEq)]
pub struct BinaryCrossEntropyWithLogits {
    pub reduction: Reduction,
    pub pos_weight: Option<Arc<Tensor<f64>>>,
    pub weight: Option<Arc<Tensor<f64>>>,
}

/// Two kinds of the list of ops: the form with a per-element `weight` is a kind of its own (its
/// attribute variants and argument generators differ).
impl HasKind for BinaryCrossEntropyWithLogits {
    #[inline]
    fn kind(&self) -> OpKind {
        match self.weight {
            None => OpKind::BinaryCrossEntropyWithLogits,
            Some(_) => OpKind::WeightedBinaryCrossEntropyWithLogits,
        }
    }
}

impl PairLoss for BinaryCrossEntropyWithLogits {
    fn reduction(&self) -> Reduction {
        self.reduction
    }
    fn factor_tensors(&self) -> (Option<&Tensor<f64>>, Option<&Tensor<f64>>) {
        (self.pos_weight.as_deref(), self.weight.as_deref())
    }
    fn loss<S: Scalar>((pw, rs): &(Factors<'_>, Factors<'_>), i: usize, a: S, b: S) -> S {
        rs.scale(i, binary::loss(a, b, pw.at(i)))
    }
    fn grad_input<S: Scalar>(
        (pw, rs): &(Factors<'_>, Factors<'_>),
        i: usize,
        a: S,
        b: S,
        w: S,
    ) -> S {
        rs.scale(i, binary::d_logit(a, b, pw.at(i))) * w
    }
    fn grad_target<S: Scalar>(
        (pw, rs): &(Factors<'_>, Factors<'_>),
        i: usize,
        a: S,
        _b: S,
        w: S,
    ) -> S {
        rs.scale(i, binary::d_target(a, pw.at(i))) * w
    }
    fn tangent<S: Scalar>(
        (pw, rs): &(Factors<'_>, Factors<'_>),
        i: usize,
        ab: (S, S),
        t: (S, S),
    ) -> S {
        let ((a, b), (ta, tb)) = (ab, t);
        let p = pw.at(i);
        let d = binary::d_logit(a, b, p) * ta + binary::d_target(a, p) * tb;
        rs.scale(i, d)
    }
}

impl OpRules for BinaryCrossEntropyWithLogits {
    pair_loss_shell!();
}

impl std::fmt::Display for BinaryCrossEntropyWithLogits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}(reduction='{}'", self.name(), self.reduction)?;
        for (key, t) in [("weight", &self.weight), ("pos_weight", &self.pos_weight)] {
            if let Some(t) = t {
                write!(f, ", {key}=")?;
                write_factors(f, t)?;
            }
        }
        write!(f, ")")
    }
}
