//! cross_entropy with probability targets: logits and targets of one shape, both differentiable,
//! with PyTorch's class weights and label smoothing. The forward keeps the log-softmax of the
//! logits in its aux data; the element rules are in `soft_targets.rs`.

use super::class_options::Weighting;
use super::layout::Classes;
use super::{
    arg, input_and_tangent, probabilities, s, same_shape, soft_targets, write_list, Reduction,
};
use crate::ops::{Arity, Aux, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use std::sync::Arc;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// PyTorch's cross_entropy with a probability target: logits and targets of one shape, (C),
/// (N, C) or (N, C, d1, ..., dk) (classes along axis 1), both differentiable. Per position
/// `-sum_c w_c y'_c log_softmax(x)_c` with `y' = (1 - e) y + e / C`; `mean` divides by the
/// number of positions (not by the weights, as PyTorch), NaN when the input is empty.
#[derive(Debug, Clone, PartialEq)]
pub struct CrossEntropyProbs {
    pub reduction: Reduction,
    pub weight: Option<Arc<Vec<f64>>>,
    pub label_smoothing: f64,
}

impl CrossEntropyProbs {
    /// The layout and options, checked against the logits' and targets' shapes, and the mean's
    /// divisor: the positions, or 0 (a NaN mean) for an empty input.
    fn soft_targets(&self, x: &Shape, y: &Shape) -> Result<(Classes, Weighting<'_>, f64)> {
        let name = self.name();
        same_shape(name, x, y)?;
        let cl = Classes::of(name, x)?;
        let weighting =
            Weighting::new(name, &self.weight, (None, &[]), self.label_smoothing, cl.c)?;
        // PyTorch divides by numel / C, and takes an empty input's mean as NaN.
        let divisor = if x.numel() == 0 { 0.0 } else { cl.n as f64 };
        Ok((cl, weighting, divisor))
    }
}

impl OpRules for CrossEntropyProbs {
    fn arity(&self) -> Arity {
        Arity::Exact(2)
    }

    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        let x = arg(self.name(), inputs, 0, 2)?;
        let (cl, _, _) = self.soft_targets(x, inputs[1])?;
        Ok(self.reduction.output_shape(cl.per_sample))
    }

    /// The targets, and the log-softmax of the logits in the aux data.
    fn saves(&self) -> Saves {
        Saves::inputs(&[1])
    }

    fn forward<S: Scalar>(&self, xs: &[&Tensor<S>]) -> Result<Forward<S>> {
        let x = arg(self.name(), xs, 0, 2)?;
        let y = xs[1];
        let (cl, weighting, divisor) = self.soft_targets(x.shape(), y.shape())?;
        let (x, y) = (cl.to_rows(x)?, cl.to_rows(y)?);
        let (per, lsm) = soft_targets::losses(&weighting, x.data(), y.data(), cl.c, cl.n);
        let value = self
            .reduction
            .forward_by(per, &cl.per_sample, s::<S>(divisor))?;
        let lsm = Tensor::from_shape(cl.rows_shape.clone(), lsm)?;
        Ok(Forward {
            value,
            aux: Aux::Tensors(vec![lsm]),
        })
    }

    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let name = self.name();
        let in_shape = ctx.input_shapes.first().ok_or(Error::Arity {
            op: name,
            expected: 2,
            found: 0,
        })?;
        let (needs_x, needs_y) = (ctx.needs(0), ctx.needs(1));
        if !needs_x && !needs_y {
            return Ok(smallvec![None, None]);
        }
        let y_shape = ctx.input_shapes.get(1).ok_or(Error::Arity {
            op: name,
            expected: 2,
            found: 1,
        })?;
        let (cl, weighting, divisor) = self.soft_targets(in_shape, y_shape)?;
        let w = self
            .reduction
            .weights_by(name, cot, &cl.per_sample, s::<S>(divisor))?;
        let lsm = probabilities(name, ctx.aux, &cl.rows_shape)?;
        let gx = if needs_x {
            let y = cl.to_rows(ctx.input(name, 1)?)?;
            let g = Tensor::from_writer(cl.rows_shape.clone(), |g| {
                soft_targets::grad_logits(&weighting, lsm.data(), y.data(), cl.c, &w, g)
            });
            Some(cl.rows_to_input(g, in_shape)?)
        } else {
            None
        };
        let gy = needs_y
            .then(|| {
                let g = Tensor::from_writer(cl.rows_shape.clone(), |g| {
                    soft_targets::grad_targets(&weighting, lsm.data(), cl.c, &w, g)
                });
                cl.rows_to_input(g, y_shape)
            })
            .transpose()?;
        Ok(smallvec![gx, gy])
    }

    fn jvp<S: Scalar>(
        &self,
        xs: &[&Tensor<S>],
        out: &Forward<S>,
        ts: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        let name = self.name();
        let (x, tx) = input_and_tangent(name, xs, ts, 2)?;
        let (y, ty) = (xs[1], ts[1]);
        same_shape(name, y.shape(), ty.shape())?;
        let (cl, weighting, divisor) = self.soft_targets(x.shape(), y.shape())?;
        let lsm = probabilities(name, &out.aux, &cl.rows_shape)?;
        let (y, tx, ty) = (cl.to_rows(y)?, cl.to_rows(tx)?, cl.to_rows(ty)?);
        let per = soft_targets::tangents(
            &weighting,
            lsm.data(),
            y.data(),
            (tx.data(), ty.data()),
            cl.c,
            cl.n,
        );
        // An empty input's mean is the constant NaN: its tangent is 0, not 0/0.
        let counted = x.numel() > 0;
        self.reduction
            .tangent_by(per, &cl.per_sample, s::<S>(divisor), |_| counted)
    }
}

impl std::fmt::Display for CrossEntropyProbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}(reduction='{}'", self.name(), self.reduction)?;
        if let Some(w) = &self.weight {
            write!(f, ", weight=")?;
            write_list(f, w, "weights")?;
        }
        if self.label_smoothing != 0.0 {
            write!(f, ", label_smoothing={}", self.label_smoothing)?;
        }
        write!(f, ")")
    }
}
