//! layer_norm, batch_norm, group_norm, scaled_dot_product_attention, the losses (cross_entropy and
//! nll_loss also with class weights, ignore_index and label_smoothing and on (N, C, d1, ..., dk)
//! inputs, cross_entropy with probability targets, bce_with_logits also with pos_weight), the
//! activations, softmax/log_softmax, amax and maximum/minimum (with ties) against PyTorch itself:
//! small random cases whose output and argument gradients PyTorch 2.15 recorded in float64 in
//! `fixtures/pytorch_ops.json` (written by `fixtures/pytorch_ops.py`), including the calls it
//! rejects, which must be errors naming the op here too; the last families are bce_with_logits
//! with `weight` (`bce_weight`) and with a pos_weight of any shape broadcastable with the target
//! (`bce_pos_weight_broadcast`, PyTorch's [C, 1, 1] for a [C, H, W] target among them),
//! cross_entropy and nll_loss with a negative ignore_index on padding labels (`negative_ignore`)
//! and attention whose query, key and value leading dimensions broadcast
//! (`attention_broadcast`, multi-query attention among them), then logsumexp (with -inf, +inf and
//! NaN entries and values near ±800).

use crate::ops_nn_support::{fwd, vjp_with_needs};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use tapegrad_core::ops::activation::{Gelu, LeakyRelu, Relu, Sigmoid, Silu, Softplus, Tanh};
use tapegrad_core::ops::elementwise::{Maximum, Minimum};
use tapegrad_core::ops::loss::{
    BinaryCrossEntropyWithLogits, CrossEntropy, CrossEntropyProbs, MseLoss, NllLoss,
};
use tapegrad_core::ops::nn::{BatchNorm, GroupNorm, LayerNorm, ScaledDotProductAttention};
use tapegrad_core::ops::reduce::{Amax, LogSoftmax, LogSumExp, Softmax};
use tapegrad_core::ops::{
    ActivationOp, ElementwiseOp, GeluApproximate, LossOp, Mask, ReduceOp, Reduction,
};
use tapegrad_core::{Op, Tensor};

const FIXTURE: &str = include_str!("../fixtures/pytorch_ops.json");

/// Float64 values written as one string of shortest round-trip decimals ("-inf" for a masked
/// float-mask entry): `str::parse` rounds them correctly, where serde_json's default float
/// parsing can be an ulp off.
fn numbers(v: &Value) -> Vec<f64> {
    v.as_str()
        .unwrap()
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect()
}

fn dims(v: &Value) -> Vec<usize> {
    serde_json::from_value(v.clone()).unwrap()
}

fn flag(case: &Value, key: &str) -> bool {
    case[key].as_bool().unwrap()
}

fn float(case: &Value, key: &str) -> f64 {
    case[key].as_f64().unwrap()
}

fn args(case: &Value) -> Vec<Tensor<f64>> {
    case["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| Tensor::new(&dims(&a["dims"]), numbers(&a["x"])).unwrap())
        .collect()
}

fn reduction(case: &Value) -> Reduction {
    match case["reduction"].as_str().unwrap() {
        "none" => Reduction::None,
        "mean" => Reduction::Mean,
        _ => Reduction::Sum,
    }
}

fn activation(case: &Value) -> ActivationOp {
    match case["kind"].as_str().unwrap() {
        "gelu_none" => ActivationOp::Gelu(Gelu {
            approximate: GeluApproximate::None,
        }),
        "gelu_tanh" => ActivationOp::Gelu(Gelu {
            approximate: GeluApproximate::Tanh,
        }),
        "softplus" => ActivationOp::Softplus(Softplus {
            beta: float(case, "beta"),
            threshold: float(case, "threshold"),
        }),
        "leaky_relu" => ActivationOp::LeakyRelu(LeakyRelu {
            negative_slope: float(case, "negative_slope"),
        }),
        "silu" => ActivationOp::Silu(Silu),
        "sigmoid" => ActivationOp::Sigmoid(Sigmoid),
        "tanh" => ActivationOp::Tanh(Tanh),
        _ => ActivationOp::Relu(Relu),
    }
}

fn attention(case: &Value) -> ScaledDotProductAttention {
    let mask = case["mask"].as_str().unwrap();
    let attn_mask = case.get("bool_mask").map(|m| {
        let data = m["x"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_bool().unwrap())
            .collect();
        Mask::new(&dims(&m["dims"]), data).unwrap()
    });
    ScaledDotProductAttention {
        is_causal: mask.starts_with("causal"),
        scale: case["scale"].as_f64(),
        attn_mask,
        float_mask: mask == "float",
        ..Default::default()
    }
}

/// Class labels as recorded: any integers (negative ones for a negative ignore_index).
fn labels(case: &Value) -> Arc<Vec<i64>> {
    Arc::new(serde_json::from_value(case["targets"].clone()).unwrap())
}

/// cross_entropy or nll_loss with the keyword arguments the case sets.
fn class_options(case: &Value, targets: Arc<Vec<i64>>) -> LossOp {
    let weight = case.get("weight").map(|w| Arc::new(numbers(w)));
    let ignore_index = case.get("ignore_index").map(|i| i.as_i64().unwrap());
    match case["kind"].as_str().unwrap() {
        "cross_entropy" => LossOp::CrossEntropy(CrossEntropy {
            targets,
            reduction: reduction(case),
            weight,
            ignore_index,
            label_smoothing: case
                .get("label_smoothing")
                .map_or(0.0, |_| float(case, "label_smoothing")),
        }),
        _ => LossOp::NllLoss(NllLoss {
            targets,
            reduction: reduction(case),
            weight,
            ignore_index,
        }),
    }
}

fn op_of(case: &Value) -> Op {
    let targets = || Arc::new(dims(&case["targets"]));
    match case["family"].as_str().unwrap() {
        "layer_norm" => LayerNorm {
            normalized_shape: dims(&case["normalized_shape"]),
            eps: float(case, "eps"),
            weight: flag(case, "weight"),
            bias: flag(case, "bias"),
        }
        .into(),
        "batch_norm" => BatchNorm {
            training: flag(case, "training"),
            momentum: float(case, "momentum"),
            eps: float(case, "eps"),
            weight: flag(case, "weight"),
            bias: flag(case, "bias"),
        }
        .into(),
        "group_norm" => GroupNorm {
            num_groups: case["num_groups"].as_u64().unwrap() as usize,
            eps: float(case, "eps"),
            weight: flag(case, "weight"),
            bias: flag(case, "bias"),
        }
        .into(),
        "attention" | "attention_broadcast" => attention(case).into(),
        "loss" => Op::Loss(match case["kind"].as_str().unwrap() {
            "cross_entropy" => LossOp::cross_entropy(targets(), reduction(case)),
            "nll_loss" => LossOp::nll_loss(targets(), reduction(case)),
            "bce_with_logits" => LossOp::bce_with_logits(reduction(case)),
            _ => LossOp::MseLoss(MseLoss {
                reduction: reduction(case),
            }),
        }),
        "class_options" | "spatial" | "negative_ignore" => {
            Op::Loss(class_options(case, labels(case)))
        }
        "prob_targets" => Op::Loss(LossOp::CrossEntropyProbs(CrossEntropyProbs {
            reduction: reduction(case),
            weight: case.get("weight").map(|w| Arc::new(numbers(w))),
            label_smoothing: case
                .get("label_smoothing")
                .map_or(0.0, |_| float(case, "label_smoothing")),
        })),
        "bce_weight" => Op::Loss(LossOp::bce_with_logits_weighted(
            reduction(case),
            Tensor::new(&dims(&case["weight_shape"]), numbers(&case["weight"])).unwrap(),
            case.get("pos_weight").map(|p| {
                let p = numbers(p);
                Tensor::new(&[p.len()], p).unwrap()
            }),
        )),
        "bce_pos_weight" => Op::Loss(LossOp::BinaryCrossEntropyWithLogits(
            BinaryCrossEntropyWithLogits {
                reduction: reduction(case),
                pos_weight: Some(Arc::new({
                    let p = numbers(&case["pos_weight"]);
                    Tensor::new(&[p.len()], p).unwrap()
                })),
                weight: None,
            },
        )),
        "bce_pos_weight_broadcast" => Op::Loss(LossOp::BinaryCrossEntropyWithLogits(
            BinaryCrossEntropyWithLogits {
                reduction: reduction(case),
                pos_weight: Some(Arc::new(
                    Tensor::new(
                        &dims(&case["pos_weight_shape"]),
                        numbers(&case["pos_weight"]),
                    )
                    .unwrap(),
                )),
                weight: None,
            },
        )),
        "activation" => Op::Activation(activation(case)),
        "softmax" => {
            let axis = case["axis"].as_i64().unwrap() as isize;
            Op::Reduce(match case["kind"].as_str().unwrap() {
                "softmax" => ReduceOp::Softmax(Softmax { axis }),
                _ => ReduceOp::LogSoftmax(LogSoftmax { axis }),
            })
        }
        "amax" => Op::Reduce(ReduceOp::Amax(Amax {
            axes: Some(serde_json::from_value(case["axes"].clone()).unwrap()),
            keepdim: flag(case, "keepdim"),
        })),
        "logsumexp" => Op::Reduce(ReduceOp::LogSumExp(LogSumExp {
            axes: Some(serde_json::from_value(case["axes"].clone()).unwrap()),
            keepdim: flag(case, "keepdim"),
        })),
        _ => Op::Elementwise(match case["kind"].as_str().unwrap() {
            "maximum" => ElementwiseOp::Maximum(Maximum),
            _ => ElementwiseOp::Minimum(Minimum),
        }),
    }
}

/// The relative tolerance of one case, against max(|PyTorch's value|, 1) (for the
/// normalisations' gradients, against the size of the terms that cancel: see `grad_scale` in
/// pytorch_ops.py).
///
/// - Exact (0): amax and maximum/minimum pick values and halve or split cotangents (exact on
///   these quarters and small seeds); relu and leaky_relu are one correctly rounded product;
///   mse_loss `none`/`sum` on quarters is exact arithmetic (its `mean` divides, 1e-13).
/// - 1e-13 for the other elementwise ops, softmax, the losses and attention: exp, log1p, tanh
///   and erf may differ from PyTorch's by an ulp or two and short sums run in another order
///   (the largest error seen is 4e-15).
/// - 1e-12 for the normalisations, whose statistics are sums of up to 256 values taken in
///   another order and whose gradients cancel (the largest error seen is 3e-14).
fn tolerance(case: &Value) -> f64 {
    let kind = case["kind"].as_str().unwrap_or("");
    match case["family"].as_str().unwrap() {
        "amax" | "maximum" => 0.0,
        "activation" if kind == "relu" || kind == "leaky_relu" => 0.0,
        "loss" if kind == "mse_loss" && case["reduction"] != "mean" => 0.0,
        "layer_norm" | "batch_norm" | "group_norm" => 1e-12,
        _ => 1e-13,
    }
}

/// The largest error relative to max(|want|, floor), floor at least 1. Infinite or NaN entries
/// must be identical.
fn error(got: &[f64], want: &[f64], floor: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "length");
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            if !w.is_finite() || !g.is_finite() {
                if g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()) {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else {
                (g - w).abs() / w.abs().max(floor).max(1.0)
            }
        })
        .fold(0.0, f64::max)
}

/// Records, per family, the cases computed and rejected and the largest relative error.
#[derive(Default, Debug)]
struct Tally {
    computed: usize,
    rejected: usize,
    /// Cases where tapegrad documents a behaviour other than PyTorch's, checked as documented.
    deliberate: usize,
    worst: f64,
    failures: Vec<String>,
}

fn check(case: &Value, tally: &mut Tally) {
    let op = op_of(case);
    let xs = args(case);
    let refs: Vec<&Tensor<f64>> = xs.iter().collect();
    let shapes: Vec<_> = xs.iter().map(|x| x.dims().to_vec()).collect();
    let deliberate = case["deliberate"].as_str();
    let rejected_here =
        |why: &&str| why.starts_with("mse_loss") || why.starts_with("label_smoothing");
    if let Some(why) = deliberate.filter(rejected_here) {
        // PyTorch broadcasts mse_loss's target (with a warning), and takes a negative
        // label_smoothing as none; tapegrad's losses take one shape, and a smoothing in [0, 1].
        match op.forward(&refs) {
            Err(err) if err.to_string().contains(op.name()) => tally.deliberate += 1,
            other => tally
                .failures
                .push(format!("{op} on {shapes:?}: {why}, but got {other:?}")),
        }
        return;
    }
    if let Some(why) = deliberate.filter(|why| why.starts_with("targets are flat")) {
        // A target of another shape but as many labels as the input has positions (a zero-size
        // dim): PyTorch rejects its shape; tapegrad's labels are flat and their count fits.
        match op.forward(&refs) {
            Ok(_) => tally.deliberate += 1,
            Err(err) => tally
                .failures
                .push(format!("{op} on {shapes:?}: {why}, but got {err}")),
        }
        return;
    }
    if case.get("error").is_some() {
        match op.forward(&refs) {
            Err(err) if err.to_string().contains(op.name()) => tally.rejected += 1,
            Err(err) => tally
                .failures
                .push(format!("{op}: {err} does not name the op")),
            Ok(_) => tally.failures.push(format!(
                "{op} on {shapes:?}: PyTorch rejects it ({}), tapegrad does not",
                case["error"]
            )),
        }
        return;
    }
    let y = fwd(&op, &refs);
    let tol = tolerance(case);
    // The normalisations' gradients cancel terms of size `grad_scale` (see pytorch_ops.py), so
    // their errors are measured against it; outputs and every other family use max(|want|, 1).
    let grad_floor = case["grad_scale"].as_f64().unwrap_or(1.0);
    let mut compare = |what: &str, got: &[f64], want: &[f64]| {
        let floor = if what.starts_with("gradient") {
            grad_floor
        } else {
            1.0
        };
        let e = error(got, want, floor);
        if e > tol {
            tally.failures.push(format!(
                "{op} on {shapes:?}: {what} is {got:?}, PyTorch {want:?} (relative error {e:e} > {tol:e})"
            ));
        }
        tally.worst = tally.worst.max(e);
    };
    if deliberate.is_some() {
        // amax with an empty axis list: the identity in tapegrad (PyTorch reduces every axis).
        assert_eq!(y.dims(), xs[0].dims(), "{op}");
        compare("output", y.data(), xs[0].data());
        let seed = Tensor::new(y.dims(), (0..y.numel()).map(|i| i as f64).collect()).unwrap();
        let grads = vjp_with_needs(&op, &refs, &seed, vec![true]);
        compare("gradient", grads[0].as_ref().unwrap().data(), seed.data());
        tally.deliberate += 1;
        return;
    }
    assert_eq!(y.dims(), dims(&case["output"]), "{op} on {shapes:?}");
    compare("output", y.data(), &numbers(&case["y"]));
    let seed = Tensor::new(y.dims(), numbers(&case["seed"])).unwrap();
    let grads = case["grads"].as_array().unwrap();
    let got = vjp_with_needs(&op, &refs, &seed, vec![true; xs.len()]);
    for (i, (g, want)) in got.iter().zip(grads).enumerate() {
        if want.is_null() {
            continue;
        }
        let g = g
            .as_ref()
            .unwrap_or_else(|| panic!("{op}: no gradient for argument {i}"));
        compare(&format!("gradient {i}"), g.data(), &numbers(want));
    }
    if case.get("new_running_mean").is_some() {
        // PyTorch's running-statistics update (momentum, unbiased batch variance).
        let Op::Nn(nn) = &op else { unreachable!() };
        let bn = match &**nn {
            tapegrad_core::ops::NnOp::BatchNorm(bn) => bn.clone(),
            other => panic!("not batch_norm: {other:?}"),
        };
        let out = op.forward(&refs).unwrap();
        let stats = bn.stats_from_aux(&out.aux, xs[0].shape()).unwrap();
        let c = [stats.mean.numel()];
        let old_mean = Tensor::new(&c, numbers(&case["running_mean"])).unwrap();
        let old_var = Tensor::new(&c, numbers(&case["running_var"])).unwrap();
        let (m, v) = bn.running_update(&old_mean, &old_var, &stats).unwrap();
        compare(
            "running mean",
            m.data(),
            &numbers(&case["new_running_mean"]),
        );
        compare("running var", v.data(), &numbers(&case["new_running_var"]));
    }
    tally.computed += 1;
}

#[test]
fn ops_match_pytorch_on_random_cases() {
    let fixture: Value = serde_json::from_str(FIXTURE).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    let mut tallies: BTreeMap<String, Tally> = BTreeMap::new();
    for case in cases {
        let family = case["family"].as_str().unwrap().to_string();
        check(case, tallies.entry(family).or_default());
    }
    for (family, t) in &tallies {
        eprintln!(
            "{family}: {} computed, {} rejected, {} deliberately different, largest relative error {:e}",
            t.computed, t.rejected, t.deliberate, t.worst
        );
    }
    let failures: Vec<&String> = tallies.values().flat_map(|t| &t.failures).collect();
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(cases.len(), 1340);
    // Every family is checked in earnest, and the rejections too (see pytorch_ops.py).
    for (family, t) in &tallies {
        assert!(t.computed >= 20, "{family}: only {} computed", t.computed);
    }
    let rejected: usize = tallies.values().map(|t| t.rejected).sum();
    assert!(rejected >= 30, "{rejected} rejected");
}
