//! Graph-file form of the losses: `reduction` ("mean", the default, "sum" or "none") and, for
//! cross_entropy and nll_loss, `targets` (one class label per position of (N, d1, ..., dk), flat)
//! and the optional `weight`
//! (one number per class), `ignore_index` (any integer; a negative label must equal it) and
//! (cross_entropy) `label_smoothing`; for
//! binary_cross_entropy_with_logits the optional `pos_weight` and `weight` (each its values
//! row-major, and `pos_weight_shape` / `weight_shape`, by default one axis of their count); cross_entropy_probs (also read from
//! `cross_entropy` with two arguments, PyTorch's probability target) takes `reduction`, `weight`
//! and `label_smoothing`.

use super::super::attrs::{not_writable, AttrWriter, Attrs};
use crate::ops::loss::{
    BinaryCrossEntropyWithLogits, CrossEntropy, CrossEntropyProbs, MseLoss, NllLoss,
};
use crate::ops::{LossOp as Lo, Op, OpKind as K, Reduction};
use crate::{Error, Result};
use std::sync::Arc;
use tapegrad_tensor::Tensor;

fn reduction(a: &mut Attrs) -> Result<Reduction> {
    Ok(
        match a.choice("reduction", &["mean", "sum", "none"], "mean")? {
            "sum" => Reduction::Sum,
            "none" => Reduction::None,
            _ => Reduction::Mean,
        },
    )
}

/// binary_cross_entropy_with_logits's factor tensors (`pos_weight`, `weight`), each attribute
/// `key` (its values row-major) beside its shape `key_shape`.
const FACTORS: [(&str, &str); 2] = [
    ("pos_weight", "pos_weight_shape"),
    ("weight", "weight_shape"),
];

/// A factor tensor: its values and shape, by default one axis of their count (pos_weight's older
/// form, one per class along the last axis).
fn factors(
    name: &'static str,
    a: &mut Attrs,
    (key, shape_key): (&'static str, &'static str),
) -> Result<Option<Arc<Tensor<f64>>>> {
    let shape = a.usizes(shape_key)?;
    match (a.f64s(key)?, shape) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(Error::invalid(
            name,
            format!("attribute '{shape_key}' without '{key}'"),
        )),
        (Some(values), shape) => {
            let dims = shape.unwrap_or(vec![values.len()]);
            Tensor::new(&dims, values)
                .map(|t| Some(Arc::new(t)))
                .map_err(|e| Error::invalid(name, format!("attribute '{key}': {e}")))
        }
    }
}

/// A factor's values, and its shape unless it has one axis.
fn write_factors(
    w: &mut AttrWriter,
    (key, shape_key): (&'static str, &'static str),
    t: &Tensor<f64>,
) {
    w.floats(key, t.data());
    if t.rank() != 1 {
        w.ints(shape_key, t.dims());
    }
}

/// The class labels: any integers (a negative one must be the `ignore_index`, which the op
/// checks). Files written before negative labels were allowed hold non-negative ones, read the
/// same.
fn labels(a: &mut Attrs) -> Result<Arc<Vec<i64>>> {
    let labels = a.isizes_req("targets")?;
    Ok(Arc::new(labels.into_iter().map(i64_of).collect()))
}

/// `ignore_index`: any integer, PyTorch's -100 among them.
fn ignore_index(a: &mut Attrs) -> Result<Option<i64>> {
    Ok(a.isize("ignore_index")?.map(i64_of))
}

fn i64_of(v: isize) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(super) fn parse(kind: K, args: usize, a: &mut Attrs) -> Result<Op> {
    let op = match kind {
        // PyTorch's cross_entropy with a probability target: two arguments, no `targets`.
        K::CrossEntropyProbs | K::CrossEntropy if args == 2 || kind == K::CrossEntropyProbs => {
            Lo::CrossEntropyProbs(CrossEntropyProbs {
                reduction: reduction(a)?,
                weight: a.f64s("weight")?.map(Arc::new),
                label_smoothing: a.f64_or("label_smoothing", 0.0)?,
            })
        }
        K::MseLoss => Lo::MseLoss(MseLoss {
            reduction: reduction(a)?,
        }),
        K::CrossEntropy => Lo::CrossEntropy(CrossEntropy {
            targets: labels(a)?,
            reduction: reduction(a)?,
            weight: a.f64s("weight")?.map(Arc::new),
            ignore_index: ignore_index(a)?,
            label_smoothing: a.f64_or("label_smoothing", 0.0)?,
        }),
        K::BinaryCrossEntropyWithLogits | K::WeightedBinaryCrossEntropyWithLogits => {
            Lo::BinaryCrossEntropyWithLogits(BinaryCrossEntropyWithLogits {
                reduction: reduction(a)?,
                pos_weight: factors(kind.label(), a, FACTORS[0])?,
                weight: factors(kind.label(), a, FACTORS[1])?,
            })
        }
        K::NllLoss => Lo::NllLoss(NllLoss {
            targets: labels(a)?,
            reduction: reduction(a)?,
            weight: a.f64s("weight")?.map(Arc::new),
            ignore_index: ignore_index(a)?,
        }),
        other => return Err(not_writable(other.label())),
    };
    Ok(Op::Loss(op))
}

pub(super) fn write(op: &Lo, w: &mut AttrWriter) -> Result<()> {
    #[allow(unreachable_patterns)]
    match op {
        Lo::MseLoss(MseLoss { reduction }) => w.str("reduction", reduction.name()),
        Lo::BinaryCrossEntropyWithLogits(BinaryCrossEntropyWithLogits {
            reduction,
            pos_weight,
            weight,
        }) => {
            w.str("reduction", reduction.name());
            for (keys, t) in FACTORS.into_iter().zip([pos_weight, weight]) {
                if let Some(t) = t {
                    write_factors(w, keys, t);
                }
            }
        }
        Lo::CrossEntropy(CrossEntropy {
            targets,
            reduction,
            weight,
            ignore_index,
            label_smoothing,
        }) => {
            class_labels(w, targets, *reduction, weight, *ignore_index);
            if *label_smoothing != 0.0 {
                w.f64("label_smoothing", *label_smoothing);
            }
        }
        Lo::NllLoss(NllLoss {
            targets,
            reduction,
            weight,
            ignore_index,
        }) => class_labels(w, targets, *reduction, weight, *ignore_index),
        Lo::CrossEntropyProbs(CrossEntropyProbs {
            reduction,
            weight,
            label_smoothing,
        }) => {
            w.str("reduction", reduction.name());
            if let Some(weight) = weight {
                w.floats("weight", weight);
            }
            if *label_smoothing != 0.0 {
                w.f64("label_smoothing", *label_smoothing);
            }
        }
        other => return Err(not_writable(crate::ops::OpRules::name(other))),
    }
    Ok(())
}

/// The attributes cross_entropy and nll_loss share; the options only when set.
fn class_labels(
    w: &mut AttrWriter,
    targets: &[i64],
    reduction: Reduction,
    weight: &Option<Arc<Vec<f64>>>,
    ignore_index: Option<i64>,
) {
    w.ints("targets", targets);
    w.str("reduction", reduction.name());
    if let Some(weight) = weight {
        w.floats("weight", weight);
    }
    if let Some(i) = ignore_index {
        w.int("ignore_index", i);
    }
}
