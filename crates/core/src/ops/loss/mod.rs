//! Loss functions with PyTorch's definitions and reductions: mse_loss, cross_entropy from logits
//! with integer class labels, binary_cross_entropy_with_logits (with PyTorch's `pos_weight` and
//! per-element `weight`, constant attributes) and nll_loss. Class labels are
//! attributes (not differentiable), one per position of a (C), (N, C) or (N, C, d1, ..., dk)
//! input; an out-of-range label is an error naming it and the bound. cross_entropy_probs is
//! PyTorch's cross_entropy with a probability target, a second differentiable argument.

mod binary;
mod class_options;
mod layout;
mod soft_targets;

use super::{Arity, Aux, Forward, Grads, OpRules, Saves, VjpContext};
use binary::Factors;
use class_options::{class_of, Weighting};
use layout::Classes;
use smallvec::smallvec;
use std::sync::Arc;
use tapegrad_tensor::kernels::{cross_entropy_rows, pairwise_sum, pairwise_sum_by};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// How a loss reduces over elements: PyTorch's `reduction` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    None,
    Mean,
    Sum,
}

impl Reduction {
    /// PyTorch's spelling of the attribute.
    pub fn name(self) -> &'static str {
        match self {
            Reduction::None => "none",
            Reduction::Mean => "mean",
            Reduction::Sum => "sum",
        }
    }

    /// The loss's shape: the per-element (or per-sample) shape for `none`, a scalar otherwise.
    fn output_shape(self, unreduced: Shape) -> Shape {
        match self {
            Reduction::None => unreduced,
            Reduction::Mean | Reduction::Sum => Shape::scalar(),
        }
    }

    /// Reduces per-element losses. The mean of no elements is NaN (0/0), as in PyTorch. `sum`
    /// and `mean` add the terms in `sum`'s blocked pairwise order (a float32 mean of 20k squared
    /// errors is then within an ulp or two, where one running total is 8-33 ulps off).
    fn forward<S: Scalar>(self, per: Vec<S>, unreduced: &Shape) -> Result<Tensor<S>> {
        let count = S::from_usize(per.len());
        self.forward_by(per, unreduced, count)
    }

    /// As `forward`, with the mean's divisor given (a class-label loss's total weight).
    fn forward_by<S: Scalar>(
        self,
        per: Vec<S>,
        unreduced: &Shape,
        divisor: S,
    ) -> Result<Tensor<S>> {
        match self {
            Reduction::None => Tensor::from_shape(unreduced.clone(), per),
            Reduction::Sum => Ok(Tensor::scalar(pairwise_sum(&per))),
            Reduction::Mean => Ok(Tensor::scalar(pairwise_sum(&per) / divisor)),
        }
    }

    /// Reduces per-element tangents. The mean divides each term before summing, so the tangent of
    /// an empty mean is 0 (an empty sum) rather than 0/0: the output is the constant NaN whatever
    /// the input, and 0 keeps the JVP adjoint to the VJP, which has no element to give.
    fn tangent<S: Scalar>(self, per: Vec<S>, unreduced: &Shape) -> Result<Tensor<S>> {
        let n = S::from_usize(per.len());
        self.tangent_by(per, unreduced, n, |_| true)
    }

    /// As `tangent`, with the mean's divisor given and only the `counted` elements in the mean
    /// (an ignored sample's 0 would be 0/0 when nothing is counted).
    fn tangent_by<S: Scalar>(
        self,
        per: Vec<S>,
        unreduced: &Shape,
        divisor: S,
        counted: impl Fn(usize) -> bool,
    ) -> Result<Tensor<S>> {
        match self {
            Reduction::None => Tensor::from_shape(unreduced.clone(), per),
            Reduction::Sum => Ok(Tensor::scalar(pairwise_sum(&per))),
            Reduction::Mean => {
                let terms: Vec<S> = per
                    .into_iter()
                    .enumerate()
                    .filter(|&(i, _)| counted(i))
                    .map(|(_, c)| c / divisor)
                    .collect();
                Ok(Tensor::scalar(pairwise_sum(&terms)))
            }
        }
    }

    /// The cotangent each of `count` elements receives: its own entry for `none`, the scalar for
    /// `sum`, the scalar divided by `count` for `mean`.
    fn weights<'a, S: Scalar>(
        self,
        op: &'static str,
        cot: &'a Tensor<S>,
        unreduced: &Shape,
    ) -> Result<Weights<'a, S>> {
        self.weights_by(op, cot, unreduced, S::from_usize(unreduced.numel()))
    }

    /// As `weights`, with the mean's divisor given.
    fn weights_by<'a, S: Scalar>(
        self,
        op: &'static str,
        cot: &'a Tensor<S>,
        unreduced: &Shape,
        divisor: S,
    ) -> Result<Weights<'a, S>> {
        let expected = self.output_shape(unreduced.clone());
        if *cot.shape() != expected {
            return Err(Error::ShapeMismatch {
                op,
                expected: Box::new(expected),
                found: Box::new(cot.shape().clone()),
            });
        }
        Ok(match self {
            Reduction::None => Weights::Each(cot.data()),
            Reduction::Sum => Weights::All(cot.data()[0]),
            Reduction::Mean => Weights::All(cot.data()[0] / divisor),
        })
    }
}

impl std::fmt::Display for Reduction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// PyTorch's keyword arguments of `cross_entropy` and `nll_loss`, for the session's
/// `cross_entropy_with` and `nll_loss_with`. The default is PyTorch's: mean, no class weights, no
/// ignored label, no smoothing.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassLossOptions {
    pub reduction: Reduction,
    /// One weight per class.
    pub weight: Option<Vec<f64>>,
    /// Samples with this label give 0 and do not count in the mean. Any integer, as PyTorch's
    /// (whose default, -100, marks padding); `None` ignores nothing, so a negative label is then
    /// an error.
    pub ignore_index: Option<i64>,
    /// cross_entropy only, in [0, 1].
    pub label_smoothing: f64,
}

impl Default for ClassLossOptions {
    fn default() -> Self {
        ClassLossOptions {
            reduction: Reduction::Mean,
            weight: None,
            ignore_index: None,
            label_smoothing: 0.0,
        }
    }
}

/// Per-element cotangents: a slice for `none`, one shared value otherwise.
enum Weights<'a, S> {
    Each(&'a [S]),
    All(S),
}

impl<S: Scalar> Weights<'_, S> {
    fn at(&self, i: usize) -> S {
        match self {
            Weights::Each(w) => w[i],
            Weights::All(w) => *w,
        }
    }
}

/// Loss functions.
#[derive(Debug, Clone, PartialEq)]
pub enum LossOp {
    /// (input - target)^2, both arguments differentiable, same shape.
    MseLoss { reduction: Reduction },
    /// Logits (C), (N, C) or (N, C, d1, ..., dk) (classes along axis 1) and one class label per
    /// position, row-major over (N, d1, ..., dk); `none` gives that shape. The options are
    /// PyTorch's, applied per position: `weight`
    /// (one per class; the mean divides by the counted samples' label weights), `ignore_index`
    /// (such samples give 0 and do not count in the mean; the label may be out of range) and
    /// `label_smoothing` in [0, 1] (the target is `1 - e` on the label plus `e / C` everywhere).
    CrossEntropy {
        targets: Arc<Vec<i64>>,
        reduction: Reduction,
        weight: Option<Arc<Vec<f64>>>,
        ignore_index: Option<i64>,
        label_smoothing: f64,
    },
    /// Logits and targets of one shape, both differentiable; `pos_weight` (PyTorch's) weighs the
    /// positive term, broadcast to the input, whose shape it must broadcast into (no more axes,
    /// trailing axes equal or 1), as PyTorch requires: [C] per class along the last axis,
    /// [C, 1, 1] along the third-to-last, [1] or 0-d one for all. `weight` (PyTorch's) multiplies
    /// every element's loss (and its partials), broadcast to the input likewise; `mean` still
    /// divides by the element count. Both are constant attributes, not arguments: PyTorch does not
    /// differentiate them either.
    BinaryCrossEntropyWithLogits {
        reduction: Reduction,
        pos_weight: Option<Arc<Tensor<f64>>>,
        weight: Option<Arc<Tensor<f64>>>,
    },
    /// Log-probabilities (C), (N, C) or (N, C, d1, ..., dk) and one class label per position, as
    /// cross_entropy: -weight[t] input[n, t, ...] with t the position's label, `weight` and
    /// `ignore_index` as in cross_entropy.
    NllLoss {
        targets: Arc<Vec<i64>>,
        reduction: Reduction,
        weight: Option<Arc<Vec<f64>>>,
        ignore_index: Option<i64>,
    },
    /// PyTorch's cross_entropy with a probability target: logits and targets of one shape, (C),
    /// (N, C) or (N, C, d1, ..., dk) (classes along axis 1), both differentiable. Per position
    /// `-sum_c w_c y'_c log_softmax(x)_c` with `y' = (1 - e) y + e / C`; `mean` divides by the
    /// number of positions (not by the weights, as PyTorch), NaN when the input is empty.
    CrossEntropyProbs {
        reduction: Reduction,
        weight: Option<Arc<Vec<f64>>>,
        label_smoothing: f64,
    },
}

use LossOp as Lo;

/// The rows and classes of a class-label loss's input, after checking its rank, the number of
/// labels (one per position) and each label's range: in `0..C` or the ignored one (which may be
/// any integer, negative or out of range).
fn classes(
    op: &'static str,
    shape: &Shape,
    targets: &[i64],
    ignore_index: Option<i64>,
) -> Result<Classes> {
    let cl = Classes::new(op, shape, targets.len(), "class labels")?;
    let c = cl.c;
    if c == 0 && cl.n > 0 && cl.is_spatial() {
        // PyTorch 2.15 rejects it too ("size mismatch"), even with every label ignored, though
        // it takes an (N, 0) input whose labels are all ignored.
        return Err(Error::invalid(
            op,
            format!(
                "an input of shape {shape} has {} positions and no class (C = 0)",
                cl.n
            ),
        ));
    }
    let in_range = |t: i64| usize::try_from(t).is_ok_and(|t| t < c);
    let Some(&bad) = targets
        .iter()
        .find(|&&t| !in_range(t) && Some(t) != ignore_index)
    else {
        return Ok(cl);
    };
    if bad >= 0 {
        return Err(Error::Index {
            op,
            what: "class label",
            index: bad,
            bound: c,
        });
    }
    let ignored = match ignore_index {
        Some(i) => format!("the ignore_index is {i}"),
        // PyTorch's default: a user's padding label is most likely -100.
        None => "no ignore_index is set (PyTorch's default is -100)".to_string(),
    };
    Err(Error::invalid(
        op,
        format!("class label {bad} is negative and not the ignored label: {ignored}"),
    ))
}

/// Class labels as PyTorch's int64 targets hold them, from any integer type a caller has.
pub trait ClassLabel: Copy {
    /// The label as an `i64`; a `usize` beyond `i64::MAX` becomes `i64::MAX` (out of range for
    /// any input, so still an error naming it).
    fn label(self) -> i64;
}

impl ClassLabel for i64 {
    fn label(self) -> i64 {
        self
    }
}

impl ClassLabel for i32 {
    fn label(self) -> i64 {
        i64::from(self)
    }
}

impl ClassLabel for usize {
    fn label(self) -> i64 {
        i64::try_from(self).unwrap_or(i64::MAX)
    }
}

impl ClassLabel for u32 {
    fn label(self) -> i64 {
        i64::from(self)
    }
}

/// `labels` as the class-label losses store them.
pub fn class_labels<L: ClassLabel>(labels: &[L]) -> Arc<Vec<i64>> {
    Arc::new(labels.iter().map(|&l| l.label()).collect())
}

/// Two arguments that must have one shape (PyTorch broadcasts with a warning; we refuse).
fn same_shape(op: &'static str, a: &Shape, b: &Shape) -> Result<()> {
    if a == b {
        Ok(())
    } else {
        Err(Error::ShapeMismatch {
            op,
            expected: Box::new(a.clone()),
            found: Box::new(b.clone()),
        })
    }
}

fn arg<'a, T>(op: &'static str, args: &[&'a T], i: usize, arity: usize) -> Result<&'a T> {
    if args.len() != arity {
        return Err(Error::Arity {
            op,
            expected: arity,
            found: args.len(),
        });
    }
    Ok(args[i])
}

impl LossOp {
    /// cross_entropy with none of PyTorch's options (no class weights, no ignored label, no
    /// smoothing): every label a class index.
    pub fn cross_entropy(targets: Arc<Vec<usize>>, reduction: Reduction) -> LossOp {
        Lo::CrossEntropy {
            targets: class_labels(&targets),
            reduction,
            weight: None,
            ignore_index: None,
            label_smoothing: 0.0,
        }
    }

    /// nll_loss with no class weights and no ignored label.
    pub fn nll_loss(targets: Arc<Vec<usize>>, reduction: Reduction) -> LossOp {
        Lo::NllLoss {
            targets: class_labels(&targets),
            reduction,
            weight: None,
            ignore_index: None,
        }
    }

    /// binary_cross_entropy_with_logits with PyTorch's `weight` (its shape must broadcast into
    /// the input's) and optional `pos_weight`.
    pub fn bce_with_logits_weighted(
        reduction: Reduction,
        weight: Tensor<f64>,
        pos_weight: Option<Tensor<f64>>,
    ) -> LossOp {
        Lo::BinaryCrossEntropyWithLogits {
            reduction,
            pos_weight: pos_weight.map(Arc::new),
            weight: Some(Arc::new(weight)),
        }
    }

    /// binary_cross_entropy_with_logits without a positive weight.
    pub fn bce_with_logits(reduction: Reduction) -> LossOp {
        Lo::BinaryCrossEntropyWithLogits {
            reduction,
            pos_weight: None,
            weight: None,
        }
    }

    /// binary_cross_entropy_with_logits's `pos_weight` and `weight`, if any.
    fn bce_factors(&self) -> (Option<&Tensor<f64>>, Option<&Tensor<f64>>) {
        match self {
            Lo::BinaryCrossEntropyWithLogits {
                pos_weight, weight, ..
            } => (pos_weight.as_deref(), weight.as_deref()),
            _ => (None, None),
        }
    }

    /// binary_cross_entropy_with_logits's `pos_weight` and `weight`, checked against its input,
    /// ready to read per element.
    fn factors(&self, shape: &Shape) -> Result<(Factors<'_>, Factors<'_>)> {
        let (pos_weight, weight) = self.bce_factors();
        Ok((
            Factors::new(self.name(), "pos_weight", pos_weight, shape)?,
            Factors::new(self.name(), "weight", weight, shape)?,
        ))
    }

    fn reduction(&self) -> Reduction {
        match self {
            Lo::MseLoss { reduction }
            | Lo::CrossEntropy { reduction, .. }
            | Lo::BinaryCrossEntropyWithLogits { reduction, .. }
            | Lo::NllLoss { reduction, .. }
            | Lo::CrossEntropyProbs { reduction, .. } => *reduction,
        }
    }

    fn targets(&self) -> &[i64] {
        match self {
            Lo::CrossEntropy { targets, .. } | Lo::NllLoss { targets, .. } => targets,
            Lo::MseLoss { .. }
            | Lo::BinaryCrossEntropyWithLogits { .. }
            | Lo::CrossEntropyProbs { .. } => &[],
        }
    }

    /// A class-label loss's classes and options, checked against its input's shape.
    fn class_loss(&self, shape: &Shape) -> Result<(Classes, Weighting<'_>)> {
        let (weight, ignore_index, smoothing) = match self {
            Lo::CrossEntropy {
                weight,
                ignore_index,
                label_smoothing,
                ..
            } => (weight, *ignore_index, *label_smoothing),
            Lo::NllLoss {
                weight,
                ignore_index,
                ..
            } => (weight, *ignore_index, 0.0),
            Lo::MseLoss { .. }
            | Lo::BinaryCrossEntropyWithLogits { .. }
            | Lo::CrossEntropyProbs { .. } => {
                return Err(Error::invalid(self.name(), "not a class-label loss"))
            }
        };
        let targets = self.targets();
        let cl = classes(self.name(), shape, targets, ignore_index)?;
        let weighting = Weighting::new(
            self.name(),
            weight,
            (ignore_index, targets),
            smoothing,
            cl.c,
        )?;
        Ok((cl, weighting))
    }

    /// cross_entropy_probs's layout and options, checked against its logits' and targets'
    /// shapes, and the mean's divisor: the positions, or 0 (a NaN mean) for an empty input.
    fn soft_targets(&self, x: &Shape, y: &Shape) -> Result<(Classes, Weighting<'_>, f64)> {
        let name = self.name();
        let Lo::CrossEntropyProbs {
            weight,
            label_smoothing,
            ..
        } = self
        else {
            return Err(Error::invalid(
                name,
                "not cross_entropy with probability targets",
            ));
        };
        same_shape(name, x, y)?;
        let cl = Classes::of(name, x)?;
        let weighting = Weighting::new(name, weight, (None, &[]), *label_smoothing, cl.c)?;
        // PyTorch divides by numel / C, and takes an empty input's mean as NaN.
        let divisor = if x.numel() == 0 { 0.0 } else { cl.n as f64 };
        Ok((cl, weighting, divisor))
    }

    /// The input gradient of a class-label loss with an option set; `w` holds each sample's
    /// cotangent (already divided by the total weight for a mean).
    fn weighted_grad<S: Scalar>(
        &self,
        ctx: &VjpContext<'_, S>,
        cl: &Classes,
        weighting: &Weighting<'_>,
        shape: &Shape,
        w: &Weights<'_, S>,
    ) -> Result<Tensor<S>> {
        let targets = self.targets();
        let c = cl.c;
        match self {
            Lo::CrossEntropy { .. } => {
                let probs = self.probabilities(ctx.aux, shape)?;
                Ok(Tensor::from_writer(shape.clone(), |g| {
                    for (i, row) in g.chunks_mut(c.max(1)).take(cl.n).enumerate() {
                        let p = &probs.data()[i * c..(i + 1) * c];
                        weighting.cross_entropy_row_grad(p, targets[i], w.at(i), row);
                    }
                }))
            }
            _ => Ok(Tensor::zeros_with(shape.clone(), |g| {
                for (i, &t) in targets.iter().enumerate() {
                    if !weighting.ignored(t) {
                        g[i * c + class_of(t)] = weighting.nll_partial::<S>(t) * w.at(i);
                    }
                }
            })),
        }
    }

    /// The rows cross_entropy's forward leaves in its aux data: the softmax for class labels, the
    /// log-softmax for probability targets.
    fn probabilities<'a, S: Scalar>(
        &self,
        aux: &'a Aux<S>,
        shape: &Shape,
    ) -> Result<&'a Tensor<S>> {
        match aux {
            Aux::Tensors(ts) if ts.len() == 1 && ts[0].shape() == shape => Ok(&ts[0]),
            _ => Err(Error::invalid(
                self.name(),
                format!("the softmax rows of the input (shape {shape}) were not saved"),
            )),
        }
    }
}

impl OpRules for LossOp {
    fn arity(&self) -> Arity {
        match self {
            Lo::MseLoss { .. }
            | Lo::BinaryCrossEntropyWithLogits { .. }
            | Lo::CrossEntropyProbs { .. } => Arity::Exact(2),
            Lo::CrossEntropy { .. } | Lo::NllLoss { .. } => Arity::Exact(1),
        }
    }

    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        let name = self.name();
        let arity = self.arity().min();
        let x = arg(name, inputs, 0, arity)?;
        match self {
            Lo::MseLoss { reduction } | Lo::BinaryCrossEntropyWithLogits { reduction, .. } => {
                same_shape(name, x, inputs[1])?;
                let (pos_weight, weight) = self.bce_factors();
                Factors::check(name, "pos_weight", pos_weight, x)?;
                Factors::check(name, "weight", weight, x)?;
                Ok(reduction.output_shape(x.clone()))
            }
            Lo::CrossEntropy { reduction, .. } | Lo::NllLoss { reduction, .. } => {
                Ok(reduction.output_shape(self.class_loss(x)?.0.per_sample))
            }
            Lo::CrossEntropyProbs { reduction, .. } => {
                let (cl, _, _) = self.soft_targets(x, inputs[1])?;
                Ok(reduction.output_shape(cl.per_sample))
            }
        }
    }

    fn saves(&self) -> Saves {
        match self {
            Lo::MseLoss { .. } | Lo::BinaryCrossEntropyWithLogits { .. } => Saves::inputs(&[0, 1]),
            // cross_entropy keeps its softmax probabilities in the aux data; nll_loss's gradient
            // depends only on the labels and the input's shape.
            Lo::CrossEntropy { .. } | Lo::NllLoss { .. } => Saves::NOTHING,
            // The targets, and the log-softmax of the logits in the aux data.
            Lo::CrossEntropyProbs { .. } => Saves::inputs(&[1]),
        }
    }

    fn forward<S: Scalar>(&self, xs: &[&Tensor<S>]) -> Result<Forward<S>> {
        let name = self.name();
        let x = arg(name, xs, 0, self.arity().min())?;
        let reduction = self.reduction();
        match self {
            Lo::MseLoss { .. } | Lo::BinaryCrossEntropyWithLogits { .. } => {
                let y = xs[1];
                same_shape(name, x.shape(), y.shape())?;
                let pairs = x.data().iter().zip(y.data());
                let per: Vec<S> = if matches!(self, Lo::MseLoss { .. }) {
                    pairs.map(|(&a, &b)| (a - b) * (a - b)).collect()
                } else {
                    let (pw, rs) = self.factors(x.shape())?;
                    pairs
                        .enumerate()
                        .map(|(i, (&a, &b))| rs.scale(i, binary::loss(a, b, pw.at(i))))
                        .collect()
                };
                Ok(Forward::new(reduction.forward(per, x.shape())?))
            }
            Lo::CrossEntropyProbs { .. } => {
                let y = xs[1];
                let (cl, weighting, divisor) = self.soft_targets(x.shape(), y.shape())?;
                let (x, y) = (cl.to_rows(x)?, cl.to_rows(y)?);
                let (per, lsm) = soft_targets::losses(&weighting, x.data(), y.data(), cl.c, cl.n);
                let value = reduction.forward_by(per, &cl.per_sample, s::<S>(divisor))?;
                let lsm = Tensor::from_shape(cl.rows_shape.clone(), lsm)?;
                Ok(Forward {
                    value,
                    aux: Aux::Tensors(vec![lsm]),
                })
            }
            Lo::CrossEntropy { targets, .. } => {
                let (cl, weighting) = self.class_loss(x.shape())?;
                let x = cl.to_rows(x)?;
                // The VJP is (softmax - onehot) * g: keep the softmax, made in the same pass as
                // the losses (one `exp` per logit).
                let mut per = vec![S::ZERO; cl.n];
                let mut failed = None;
                let kernel_labels: Vec<usize> =
                    targets.iter().map(|&t| weighting.kernel_label(t)).collect();
                let probs = Tensor::from_writer(cl.rows_shape.clone(), |p| {
                    // With no class every label is ignored (any other is out of range): there is
                    // no probability to make, and no label the kernel would take.
                    if cl.c > 0 || weighting.is_plain() {
                        failed =
                            cross_entropy_rows(x.data(), cl.c, &kernel_labels, p, &mut per).err();
                    }
                });
                if let Some(e) = failed {
                    return Err(e);
                }
                let value = if weighting.is_plain() {
                    reduction.forward(per, &cl.per_sample)?
                } else {
                    let per = weighting.cross_entropy_losses(x.data(), targets);
                    let total = weighting.total_weight(targets);
                    reduction.forward_by(per, &cl.per_sample, total)?
                };
                Ok(Forward {
                    value,
                    aux: Aux::Tensors(vec![probs]),
                })
            }
            // With mean and N = 0 this is 0/0 = NaN, as PyTorch's nll_loss (total weight 0).
            Lo::NllLoss { targets, .. } => {
                let (cl, weighting) = self.class_loss(x.shape())?;
                let x = cl.to_rows(x)?;
                if !weighting.is_plain() {
                    let per = weighting.nll_losses(x.data(), targets);
                    let total = weighting.total_weight(targets);
                    return Ok(Forward::new(reduction.forward_by(
                        per,
                        &cl.per_sample,
                        total,
                    )?));
                }
                let per: Vec<S> = targets
                    .iter()
                    .enumerate()
                    .map(|(i, &t)| -x.data()[i * cl.c + class_of(t)])
                    .collect();
                Ok(Forward::new(reduction.forward(per, &cl.per_sample)?))
            }
        }
    }

    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let name = self.name();
        let reduction = self.reduction();
        let in_shape = ctx.input_shapes.first().ok_or_else(|| Error::Arity {
            op: name,
            expected: self.arity().min(),
            found: 0,
        })?;
        match self {
            Lo::MseLoss { .. } | Lo::BinaryCrossEntropyWithLogits { .. } => {
                if !ctx.needs(0) && !ctx.needs(1) {
                    return Ok(smallvec![None, None]);
                }
                let (x, y) = (ctx.input(name, 0)?, ctx.input(name, 1)?);
                same_shape(name, x.shape(), y.shape())?;
                let w = reduction.weights(name, cot, x.shape())?;
                let pairs = x.data().iter().zip(y.data()).enumerate();
                let mse = matches!(self, Lo::MseLoss { .. });
                let (pw, rs) = self.factors(x.shape())?;
                let gx: Option<Vec<S>> = ctx.needs(0).then(|| {
                    pairs
                        .clone()
                        .map(|(i, (&a, &b))| {
                            if mse {
                                s::<S>(2.0) * (a - b) * w.at(i)
                            } else {
                                rs.scale(i, binary::d_logit(a, b, pw.at(i))) * w.at(i)
                            }
                        })
                        .collect()
                });
                let gy: Option<Vec<S>> = ctx.needs(1).then(|| {
                    pairs
                        .map(|(i, (&a, &b))| {
                            if mse {
                                -(s::<S>(2.0) * (a - b) * w.at(i))
                            } else {
                                rs.scale(i, binary::d_target(a, pw.at(i))) * w.at(i)
                            }
                        })
                        .collect()
                });
                let wrap = |g: Option<Vec<S>>| {
                    g.map(|g| Tensor::from_shape(x.shape().clone(), g))
                        .transpose()
                };
                Ok(smallvec![wrap(gx)?, wrap(gy)?])
            }
            Lo::CrossEntropyProbs { .. } => {
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
                let w = reduction.weights_by(name, cot, &cl.per_sample, s::<S>(divisor))?;
                let lsm = self.probabilities(ctx.aux, &cl.rows_shape)?;
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
            Lo::CrossEntropy { targets, .. } | Lo::NllLoss { targets, .. } => {
                if !ctx.needs(0) {
                    return Ok(smallvec![None]);
                }
                let (cl, weighting) = self.class_loss(in_shape)?;
                let rows_shape = &cl.rows_shape;
                if !weighting.is_plain() {
                    let total = weighting.total_weight(targets);
                    let w = reduction.weights_by(name, cot, &cl.per_sample, total)?;
                    let grad = self.weighted_grad(ctx, &cl, &weighting, rows_shape, &w)?;
                    return Ok(smallvec![Some(cl.rows_to_input(grad, in_shape)?)]);
                }
                let w = reduction.weights(name, cot, &cl.per_sample)?;
                // Written straight into the gradient's (pooled) buffer.
                let grad = match self {
                    Lo::CrossEntropy { .. } => {
                        // (p - onehot) * g: p * g everywhere, then the label entry adjusted.
                        let probs = self.probabilities(ctx.aux, rows_shape)?;
                        Tensor::from_writer(rows_shape.clone(), |g| {
                            g.copy_from_slice(probs.data());
                            for (i, row) in g.chunks_mut(cl.c.max(1)).take(cl.n).enumerate() {
                                let wi = w.at(i);
                                for p in row.iter_mut() {
                                    *p *= wi;
                                }
                                let t = class_of(targets[i]);
                                row[t] = (probs.data()[i * cl.c + t] - S::ONE) * wi;
                            }
                        })
                    }
                    _ => Tensor::zeros_with(rows_shape.clone(), |g| {
                        for (i, &t) in targets.iter().enumerate() {
                            g[i * cl.c + class_of(t)] = -w.at(i);
                        }
                    }),
                };
                Ok(smallvec![Some(cl.rows_to_input(grad, in_shape)?)])
            }
        }
    }

    fn jvp<S: Scalar>(
        &self,
        xs: &[&Tensor<S>],
        out: &Forward<S>,
        ts: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        let name = self.name();
        let arity = self.arity().min();
        let x = arg(name, xs, 0, arity)?;
        let tx = arg(name, ts, 0, arity)?;
        same_shape(name, x.shape(), tx.shape())?;
        let reduction = self.reduction();
        match self {
            Lo::MseLoss { .. } | Lo::BinaryCrossEntropyWithLogits { .. } => {
                let (y, ty) = (xs[1], ts[1]);
                same_shape(name, x.shape(), y.shape())?;
                same_shape(name, x.shape(), ty.shape())?;
                let mse = matches!(self, Lo::MseLoss { .. });
                let (pw, rs) = self.factors(x.shape())?;
                let per: Vec<S> = (0..x.numel())
                    .map(|i| {
                        let (a, b) = (x.data()[i], y.data()[i]);
                        let (ta, tb) = (tx.data()[i], ty.data()[i]);
                        if mse {
                            s::<S>(2.0) * (a - b) * (ta - tb)
                        } else {
                            let p = pw.at(i);
                            let d = binary::d_logit(a, b, p) * ta + binary::d_target(a, p) * tb;
                            rs.scale(i, d)
                        }
                    })
                    .collect();
                reduction.tangent(per, x.shape())
            }
            Lo::CrossEntropyProbs { .. } => {
                let (y, ty) = (xs[1], ts[1]);
                same_shape(name, y.shape(), ty.shape())?;
                let (cl, weighting, divisor) = self.soft_targets(x.shape(), y.shape())?;
                let lsm = self.probabilities(&out.aux, &cl.rows_shape)?;
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
                reduction.tangent_by(per, &cl.per_sample, s::<S>(divisor), |_| counted)
            }
            Lo::CrossEntropy { .. } | Lo::NllLoss { .. } => {
                let targets = self.targets();
                let (cl, weighting) = self.class_loss(x.shape())?;
                let tx = cl.to_rows(tx)?;
                let t = tx.data();
                if !weighting.is_plain() {
                    let per: Vec<S> = match self {
                        Lo::CrossEntropy { .. } => {
                            let probs = self.probabilities(&out.aux, &cl.rows_shape)?;
                            let c = cl.c;
                            targets
                                .iter()
                                .enumerate()
                                .map(|(i, &label)| {
                                    let row = i * c..(i + 1) * c;
                                    weighting.cross_entropy_row_tangent(
                                        &probs.data()[row.clone()],
                                        label,
                                        &t[row],
                                    )
                                })
                                .collect()
                        }
                        _ => targets
                            .iter()
                            .enumerate()
                            .map(|(i, &label)| {
                                if weighting.ignored(label) {
                                    S::ZERO
                                } else {
                                    t[i * cl.c + class_of(label)]
                                        * weighting.nll_partial::<S>(label)
                                }
                            })
                            .collect(),
                    };
                    let total = weighting.total_weight(targets);
                    return reduction.tangent_by(per, &cl.per_sample, total, |i| {
                        !weighting.ignored(targets[i])
                    });
                }
                let per: Vec<S> = match self {
                    // d(-log_softmax(x)[t]) = sum_c p_c dx_c - dx_t.
                    Lo::CrossEntropy { .. } => {
                        let probs = self.probabilities(&out.aux, &cl.rows_shape)?;
                        targets
                            .iter()
                            .enumerate()
                            .map(|(i, &label)| {
                                let row = i * cl.c..(i + 1) * cl.c;
                                let (p, d) = (&probs.data()[row.clone()], &t[row]);
                                let dot = pairwise_sum_by(p.len(), |j| p[j] * d[j]);
                                dot - t[i * cl.c + class_of(label)]
                            })
                            .collect()
                    }
                    _ => targets
                        .iter()
                        .enumerate()
                        .map(|(i, &label)| -t[i * cl.c + class_of(label)])
                        .collect(),
                };
                reduction.tangent(per, &cl.per_sample)
            }
        }
    }
}

fn s<S: Scalar>(v: f64) -> S {
    S::from_f64(v)
}

/// `[a, b, ...]`, the first eight items and then the count (`[1, 2, ... 40 labels]`).
fn write_list<T: std::fmt::Display>(
    f: &mut std::fmt::Formatter<'_>,
    items: &[T],
    what: &str,
) -> std::fmt::Result {
    const SHOWN: usize = 8;
    write!(f, "[")?;
    for (i, v) in items.iter().take(SHOWN).enumerate() {
        if i > 0 {
            write!(f, ", ")?;
        }
        write!(f, "{v}")?;
    }
    if items.len() > SHOWN {
        write!(f, ", ... {} {what}", items.len())?;
    }
    write!(f, "]")
}

/// A factor tensor (`pos_weight`, `weight`): its values, and its shape unless it has one axis.
fn write_factors(f: &mut std::fmt::Formatter<'_>, w: &Tensor<f64>) -> std::fmt::Result {
    write_list(f, w.data(), "weights")?;
    if w.rank() != 1 {
        write!(f, " of shape {}", w.shape())?;
    }
    Ok(())
}

impl std::fmt::Display for LossOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lo::MseLoss { reduction }
            | Lo::BinaryCrossEntropyWithLogits {
                reduction,
                pos_weight: None,
                weight: None,
            } => write!(f, "{}(reduction='{reduction}')", self.name()),
            Lo::BinaryCrossEntropyWithLogits {
                reduction,
                pos_weight,
                weight,
            } => {
                write!(f, "{}(reduction='{reduction}'", self.name())?;
                for (key, t) in [("weight", weight), ("pos_weight", pos_weight)] {
                    if let Some(t) = t {
                        write!(f, ", {key}=")?;
                        write_factors(f, t)?;
                    }
                }
                write!(f, ")")
            }
            Lo::CrossEntropyProbs {
                reduction,
                weight,
                label_smoothing,
            } => {
                write!(f, "{}(reduction='{reduction}'", self.name())?;
                if let Some(w) = weight {
                    write!(f, ", weight=")?;
                    write_list(f, w, "weights")?;
                }
                if *label_smoothing != 0.0 {
                    write!(f, ", label_smoothing={label_smoothing}")?;
                }
                write!(f, ")")
            }
            Lo::CrossEntropy {
                targets, reduction, ..
            }
            | Lo::NllLoss {
                targets, reduction, ..
            } => {
                write!(f, "{}(targets=", self.name())?;
                write_list(f, targets, "labels")?;
                write!(f, ", reduction='{reduction}'")?;
                let (weight, ignore_index, smoothing) = match self {
                    Lo::CrossEntropy {
                        weight,
                        ignore_index,
                        label_smoothing,
                        ..
                    } => (weight, ignore_index, *label_smoothing),
                    Lo::NllLoss {
                        weight,
                        ignore_index,
                        ..
                    } => (weight, ignore_index, 0.0),
                    _ => (&None, &None, 0.0),
                };
                if let Some(w) = weight {
                    write!(f, ", weight=")?;
                    write_list(f, w, "weights")?;
                }
                if let Some(i) = ignore_index {
                    write!(f, ", ignore_index={i}")?;
                }
                if smoothing != 0.0 {
                    write!(f, ", label_smoothing={smoothing}")?;
                }
                write!(f, ")")
            }
        }
    }
}
