//! The class-label losses: cross_entropy from logits and nll_loss from log-probabilities, one
//! integer label per position of a (C), (N, C) or (N, C, d1, ..., dk) input, with PyTorch's
//! options (class weights, an ignored label, label smoothing). `ClassLoss` is what they share.

use super::class_options::{class_of, Weighting};
use super::layout::Classes;
use super::{arg, input_and_tangent, probabilities, write_list, Reduction, Weights};
use crate::ops::{Arity, Aux, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use std::sync::Arc;
use tapegrad_tensor::kernels::{cross_entropy_rows, pairwise_sum_by};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// What a class-label loss holds: its labels and options.
trait ClassLoss: OpRules {
    fn targets(&self) -> &[i64];
    fn reduction(&self) -> Reduction;
    /// The class weights, the ignored label and the label smoothing.
    fn options(&self) -> (&Option<Arc<Vec<f64>>>, Option<i64>, f64);

    /// The loss's classes and options, checked against its input's shape.
    fn class_loss(&self, shape: &Shape) -> Result<(Classes, Weighting<'_>)> {
        let (weight, ignore_index, smoothing) = self.options();
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

    /// The per-sample losses `per` reduced: a mean divides by the counted samples' total weight
    /// where an option is set.
    fn reduce_losses<S: Scalar>(
        &self,
        per: Vec<S>,
        cl: &Classes,
        weighting: &Weighting<'_>,
    ) -> Result<Tensor<S>> {
        if weighting.is_plain() {
            return self.reduction().forward(per, &cl.per_sample);
        }
        let total = weighting.total_weight(self.targets());
        self.reduction().forward_by(per, &cl.per_sample, total)
    }

    /// Each sample's cotangent (see `reduce_losses`).
    fn sample_cotangents<'a, S: Scalar>(
        &self,
        cot: &'a Tensor<S>,
        cl: &Classes,
        weighting: &Weighting<'_>,
    ) -> Result<Weights<'a, S>> {
        if weighting.is_plain() {
            return self.reduction().weights(self.name(), cot, &cl.per_sample);
        }
        let total = weighting.total_weight(self.targets());
        self.reduction()
            .weights_by(self.name(), cot, &cl.per_sample, total)
    }

    /// The per-sample tangents `per` reduced as `reduce_losses` (an ignored sample's 0 left out
    /// of the mean, which would be 0/0 when nothing is counted).
    fn reduce_tangents<S: Scalar>(
        &self,
        per: Vec<S>,
        cl: &Classes,
        weighting: &Weighting<'_>,
    ) -> Result<Tensor<S>> {
        if weighting.is_plain() {
            return self.reduction().tangent(per, &cl.per_sample);
        }
        let targets = self.targets();
        let total = weighting.total_weight(targets);
        self.reduction()
            .tangent_by(per, &cl.per_sample, total, |i| {
                !weighting.ignored(targets[i])
            })
    }

    /// `name(targets=[..], reduction='..'` and the options set, then `)`.
    fn write(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}(targets=", self.name())?;
        write_list(f, self.targets(), "labels")?;
        write!(f, ", reduction='{}'", self.reduction())?;
        let (weight, ignore_index, smoothing) = self.options();
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

/// The rules a class-label loss shares: one argument, its shape rule, nothing kept as an
/// argument. Expands to those `OpRules` methods.
macro_rules! class_loss_shell {
    () => {
        fn arity(&self) -> Arity {
            Arity::Exact(1)
        }
        fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
            let x = arg(self.name(), inputs, 0, 1)?;
            Ok(self
                .reduction()
                .output_shape(self.class_loss(x)?.0.per_sample))
        }
    };
}

/// The input's shape in a VJP, or the error for none.
fn input_shape<'a, S: Scalar>(name: &'static str, ctx: &'a VjpContext<'_, S>) -> Result<&'a Shape> {
    ctx.input_shapes.first().ok_or(Error::Arity {
        op: name,
        expected: 1,
        found: 0,
    })
}

/// Logits (C), (N, C) or (N, C, d1, ..., dk) (classes along axis 1) and one class label per
/// position, row-major over (N, d1, ..., dk); `none` gives that shape. The options are
/// PyTorch's, applied per position: `weight`
/// (one per class; the mean divides by the counted samples' label weights), `ignore_index`
/// (such samples give 0 and do not count in the mean; the label may be out of range) and
/// `label_smoothing` in [0, 1] (the target is `1 - e` on the label plus `e / C` everywhere).
#[derive(Debug, Clone, PartialEq)]
pub struct CrossEntropy {
    pub targets: Arc<Vec<i64>>,
    pub reduction: Reduction,
    pub weight: Option<Arc<Vec<f64>>>,
    pub ignore_index: Option<i64>,
    pub label_smoothing: f64,
}

impl ClassLoss for CrossEntropy {
    fn targets(&self) -> &[i64] {
        &self.targets
    }
    fn reduction(&self) -> Reduction {
        self.reduction
    }
    fn options(&self) -> (&Option<Arc<Vec<f64>>>, Option<i64>, f64) {
        (&self.weight, self.ignore_index, self.label_smoothing)
    }
}

impl OpRules for CrossEntropy {
    class_loss_shell!();

    /// The softmax probabilities are kept in the aux data.
    fn saves(&self) -> Saves {
        Saves::NOTHING
    }

    fn forward<S: Scalar>(&self, xs: &[&Tensor<S>]) -> Result<Forward<S>> {
        let (name, targets) = (self.name(), &self.targets);
        let x = arg(name, xs, 0, 1)?;
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
                failed = cross_entropy_rows(x.data(), cl.c, &kernel_labels, p, &mut per).err();
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
        if !weighting.is_plain() {
            per = weighting.cross_entropy_losses(x.data(), targets);
        }
        let value = self.reduce_losses(per, &cl, &weighting)?;
        Ok(Forward {
            value,
            aux: Aux::Tensors(vec![probs]),
        })
    }

    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let (name, targets) = (self.name(), &self.targets);
        let in_shape = input_shape(name, ctx)?;
        if !ctx.needs(0) {
            return Ok(smallvec![None]);
        }
        let (cl, weighting) = self.class_loss(in_shape)?;
        let w = self.sample_cotangents(cot, &cl, &weighting)?;
        let probs = probabilities(name, ctx.aux, &cl.rows_shape)?;
        let c = cl.c;
        // Written straight into the gradient's (pooled) buffer.
        let grad = Tensor::from_writer(cl.rows_shape.clone(), |g| {
            if !weighting.is_plain() {
                for (i, row) in g.chunks_mut(c.max(1)).take(cl.n).enumerate() {
                    let p = &probs.data()[i * c..(i + 1) * c];
                    weighting.cross_entropy_row_grad(p, targets[i], w.at(i), row);
                }
                return;
            }
            // (p - onehot) * g: p * g everywhere, then the label entry adjusted.
            g.copy_from_slice(probs.data());
            for (i, row) in g.chunks_mut(c.max(1)).take(cl.n).enumerate() {
                let wi = w.at(i);
                for p in row.iter_mut() {
                    *p *= wi;
                }
                let t = class_of(targets[i]);
                row[t] = (probs.data()[i * c + t] - S::ONE) * wi;
            }
        });
        Ok(smallvec![Some(cl.rows_to_input(grad, in_shape)?)])
    }

    fn jvp<S: Scalar>(
        &self,
        xs: &[&Tensor<S>],
        out: &Forward<S>,
        ts: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        let (name, targets) = (self.name(), &self.targets);
        let (x, tx) = input_and_tangent(name, xs, ts, 1)?;
        let (cl, weighting) = self.class_loss(x.shape())?;
        let tx = cl.to_rows(tx)?;
        let t = tx.data();
        let probs = probabilities(name, &out.aux, &cl.rows_shape)?;
        let c = cl.c;
        let per: Vec<S> = targets
            .iter()
            .enumerate()
            .map(|(i, &label)| {
                let row = i * c..(i + 1) * c;
                let (p, d) = (&probs.data()[row.clone()], &t[row]);
                if !weighting.is_plain() {
                    return weighting.cross_entropy_row_tangent(p, label, d);
                }
                // d(-log_softmax(x)[t]) = sum_c p_c dx_c - dx_t.
                let dot = pairwise_sum_by(p.len(), |j| p[j] * d[j]);
                dot - t[i * c + class_of(label)]
            })
            .collect();
        self.reduce_tangents(per, &cl, &weighting)
    }
}

impl std::fmt::Display for CrossEntropy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.write(f)
    }
}

/// Log-probabilities (C), (N, C) or (N, C, d1, ..., dk) and one class label per position, as
/// cross_entropy: `-weight[t] input[n, t, ...]` with `t` the position's label, `weight` and
/// `ignore_index` as in cross_entropy.
#[derive(Debug, Clone, PartialEq)]
pub struct NllLoss {
    pub targets: Arc<Vec<i64>>,
    pub reduction: Reduction,
    pub weight: Option<Arc<Vec<f64>>>,
    pub ignore_index: Option<i64>,
}

impl ClassLoss for NllLoss {
    fn targets(&self) -> &[i64] {
        &self.targets
    }
    fn reduction(&self) -> Reduction {
        self.reduction
    }
    fn options(&self) -> (&Option<Arc<Vec<f64>>>, Option<i64>, f64) {
        (&self.weight, self.ignore_index, 0.0)
    }
}

impl OpRules for NllLoss {
    class_loss_shell!();

    /// The gradient depends only on the labels and the input's shape.
    fn saves(&self) -> Saves {
        Saves::NOTHING
    }

    // With mean and N = 0 this is 0/0 = NaN, as PyTorch's nll_loss (total weight 0).
    fn forward<S: Scalar>(&self, xs: &[&Tensor<S>]) -> Result<Forward<S>> {
        let (name, targets) = (self.name(), &self.targets);
        let x = arg(name, xs, 0, 1)?;
        let (cl, weighting) = self.class_loss(x.shape())?;
        let x = cl.to_rows(x)?;
        let per: Vec<S> = if weighting.is_plain() {
            targets
                .iter()
                .enumerate()
                .map(|(i, &t)| -x.data()[i * cl.c + class_of(t)])
                .collect()
        } else {
            weighting.nll_losses(x.data(), targets)
        };
        Ok(Forward::new(self.reduce_losses(per, &cl, &weighting)?))
    }

    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let (name, targets) = (self.name(), &self.targets);
        let in_shape = input_shape(name, ctx)?;
        if !ctx.needs(0) {
            return Ok(smallvec![None]);
        }
        let (cl, weighting) = self.class_loss(in_shape)?;
        let w = self.sample_cotangents(cot, &cl, &weighting)?;
        let c = cl.c;
        // Written straight into the gradient's (pooled) buffer.
        let grad = Tensor::zeros_with(cl.rows_shape.clone(), |g| {
            for (i, &t) in targets.iter().enumerate() {
                if weighting.is_plain() {
                    g[i * c + class_of(t)] = -w.at(i);
                } else if !weighting.ignored(t) {
                    g[i * c + class_of(t)] = weighting.nll_partial::<S>(t) * w.at(i);
                }
            }
        });
        Ok(smallvec![Some(cl.rows_to_input(grad, in_shape)?)])
    }

    fn jvp<S: Scalar>(
        &self,
        xs: &[&Tensor<S>],
        _out: &Forward<S>,
        ts: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        let (name, targets) = (self.name(), &self.targets);
        let (x, tx) = input_and_tangent(name, xs, ts, 1)?;
        let (cl, weighting) = self.class_loss(x.shape())?;
        let tx = cl.to_rows(tx)?;
        let t = tx.data();
        let per: Vec<S> = targets
            .iter()
            .enumerate()
            .map(|(i, &label)| {
                if weighting.is_plain() {
                    -t[i * cl.c + class_of(label)]
                } else if weighting.ignored(label) {
                    S::ZERO
                } else {
                    t[i * cl.c + class_of(label)] * weighting.nll_partial::<S>(label)
                }
            })
            .collect();
        self.reduce_tangents(per, &cl, &weighting)
    }
}

impl std::fmt::Display for NllLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.write(f)
    }
}

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
