//! tapegrad's float32 accuracy against PyTorch's, both measured against the exact answer: 114
//! cases (activations and elementwise functions over wide ranges, softmax/log_softmax with large
//! spreads and over rows of 2,000-5,000, the losses, also their `mean` and `sum` over 1k-20k
//! terms, layer/group/batch norm with a large common offset and long groups,
//! matmul/linear/conv2d with long inner sums, attention with a large scale, sum/mean over
//! 10^4-10^5 elements) whose float32 output and gradients PyTorch 2.15 recorded in
//! `fixtures/pytorch_f32.json`, beside the same computation in float64 on the same inputs and
//! seed (written by `fixtures/pytorch_f32.py`; for gelu a cancellation-free float64 form).
//!
//! The error of a value is |value - exact| in f32 ulps of its unit: the exact value's size, or,
//! where the computation adds or cancels terms, the size of those terms (the sum of |terms| of a
//! dot product or a sum, |x| + |max| for softmax's `x - max`, and so on; each unit is derived in
//! the fixture's `*_scale` functions from the formula, not from the errors seen). An f32
//! evaluation whose every step rounds once (libm's functions within an ulp, sums blocked or
//! pairwise) is within a few such units; that is the floor `FEW_ULPS` = 8. Above it tapegrad may
//! be at most `TIMES_PYTORCH` = 4 times as far off as PyTorch is on the same tensor: the same
//! class of algorithm, another formula or order. Each output and gradient must satisfy
//! ours <= max(4 * PyTorch's, 8). Where the f32 answer overflows (or the computation does, for
//! both), a value must equal the exact one rounded to f32 or counts as infinitely far off.
//! The test prints per family the largest errors and the largest ratio ours/PyTorch.

use crate::ops_nn_support::vjp_with_needs;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use tapegrad_core::ops::activation::{Gelu, LeakyRelu, Relu, Sigmoid, Silu, Softplus, Tanh};
use tapegrad_core::ops::elementwise::{Cos, Exp, Log, Pow, Sin, Sqrt};
use tapegrad_core::ops::linalg::{Linear, Matmul};
use tapegrad_core::ops::loss::MseLoss;
use tapegrad_core::ops::nn::{
    BatchNorm, Conv2d, GroupNorm, LayerNorm, PaddingMode, ScaledDotProductAttention,
};
use tapegrad_core::ops::reduce::{LogSoftmax, Mean, Softmax, Sum};
use tapegrad_core::ops::{
    ActivationOp, ElementwiseOp, GeluApproximate, LinalgOp, LossOp, ReduceOp, Reduction,
};
use tapegrad_core::{Op, Tensor};

const FIXTURE: &str = include_str!("../fixtures/pytorch_f32.json");

/// Errors below this many units count as meeting the bound, whatever PyTorch's (see the doc).
const FEW_ULPS: f64 = 8.0;
/// Above `FEW_ULPS`, how many times PyTorch's error tapegrad's may be.
const TIMES_PYTORCH: f64 = 4.0;

/// Whitespace-separated numbers, parsed by `str::parse` (correctly rounded, unlike serde_json's
/// float parsing).
fn parsed<T: std::str::FromStr>(v: &Value) -> Vec<T>
where
    T::Err: std::fmt::Debug,
{
    v.as_str()
        .unwrap()
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect()
}

fn dims(v: &Value) -> Vec<usize> {
    serde_json::from_value(v.clone()).unwrap()
}

/// The fixture's generator (`lcg` in pytorch_f32.py): `offset + width * (u - 1/2)` with u 24
/// random bits over 2^24; `width` is a power of two, so only adding `offset` rounds, in f32.
fn generated(seed: u64, n: usize, offset: f32, width: f32) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (state >> 40) as i64 - (1 << 23);
            offset + (u as f32) * (width / (1u32 << 24) as f32)
        })
        .collect()
}

/// An input or seed: written out, or generated (then its first values are checked).
fn tensor(a: &Value) -> Tensor<f32> {
    let shape = dims(&a["dims"]);
    let n = shape.iter().product();
    let data = match a.get("gen") {
        Some(g) => {
            let x = generated(
                g["seed"].as_u64().unwrap(),
                n,
                g["offset"].as_f64().unwrap() as f32,
                g["width"].as_f64().unwrap() as f32,
            );
            assert_eq!(x[..4.min(n)], parsed::<f32>(&a["head"])[..], "generator");
            x
        }
        None => parsed(&a["x"]),
    };
    Tensor::new(&shape, data).unwrap()
}

fn float(op: &Value, key: &str) -> f64 {
    op[key].as_f64().unwrap()
}

fn reduction(op: &Value) -> Reduction {
    match op["reduction"].as_str().unwrap() {
        "none" => Reduction::None,
        "mean" => Reduction::Mean,
        _ => Reduction::Sum,
    }
}

fn pointwise(op: &Value) -> Op {
    let act = |a: ActivationOp| Op::Activation(a);
    let elt = |e: ElementwiseOp| Op::Elementwise(e);
    match op["kind"].as_str().unwrap() {
        "relu" => act(ActivationOp::Relu(Relu)),
        "leaky_relu" => act(ActivationOp::LeakyRelu(LeakyRelu {
            negative_slope: float(op, "negative_slope"),
        })),
        "sigmoid" => act(ActivationOp::Sigmoid(Sigmoid)),
        "tanh" => act(ActivationOp::Tanh(Tanh)),
        "gelu_none" => act(ActivationOp::Gelu(Gelu {
            approximate: GeluApproximate::None,
        })),
        "gelu_tanh" => act(ActivationOp::Gelu(Gelu {
            approximate: GeluApproximate::Tanh,
        })),
        "silu" => act(ActivationOp::Silu(Silu)),
        "softplus" => act(ActivationOp::Softplus(Softplus {
            beta: float(op, "beta"),
            threshold: float(op, "threshold"),
        })),
        "exp" => elt(ElementwiseOp::Exp(Exp)),
        "log" => elt(ElementwiseOp::Log(Log)),
        "sqrt" => elt(ElementwiseOp::Sqrt(Sqrt)),
        "pow" => elt(ElementwiseOp::Pow(Pow {
            exponent: float(op, "exponent"),
        })),
        "sin" => elt(ElementwiseOp::Sin(Sin)),
        "cos" => elt(ElementwiseOp::Cos(Cos)),
        other => panic!("unknown kind {other}"),
    }
}

fn loss(op: &Value) -> Op {
    let targets = || Arc::new(dims(&op["targets"]));
    Op::Loss(match op["kind"].as_str().unwrap() {
        "cross_entropy" => LossOp::cross_entropy(targets(), reduction(op)),
        "nll_loss" => LossOp::nll_loss(targets(), reduction(op)),
        "bce_with_logits" => LossOp::bce_with_logits(reduction(op)),
        _ => LossOp::MseLoss(MseLoss {
            reduction: reduction(op),
        }),
    })
}

fn op_of(family: &str, op: &Value) -> Op {
    let flag = |key: &str| op[key].as_bool().unwrap();
    let axes = || -> Option<Vec<isize>> { serde_json::from_value(op["axes"].clone()).unwrap() };
    match family {
        "activation" | "elementwise" => pointwise(op),
        "softmax" => {
            let axis = op["axis"].as_i64().unwrap() as isize;
            Op::Reduce(match op["kind"].as_str().unwrap() {
                "softmax" => ReduceOp::Softmax(Softmax { axis }),
                _ => ReduceOp::LogSoftmax(LogSoftmax { axis }),
            })
        }
        "loss" => loss(op),
        "layer_norm" => LayerNorm {
            normalized_shape: dims(&op["normalized_shape"]),
            eps: float(op, "eps"),
            weight: flag("weight"),
            bias: flag("bias"),
        }
        .into(),
        "group_norm" => GroupNorm {
            num_groups: op["num_groups"].as_u64().unwrap() as usize,
            eps: float(op, "eps"),
            weight: flag("weight"),
            bias: flag("bias"),
        }
        .into(),
        "batch_norm" => BatchNorm {
            training: flag("training"),
            momentum: float(op, "momentum"),
            eps: float(op, "eps"),
            weight: flag("weight"),
            bias: flag("bias"),
        }
        .into(),
        "matmul" => Op::Linalg(match op["kind"].as_str().unwrap() {
            "matmul" => LinalgOp::Matmul(Matmul),
            _ => LinalgOp::Linear(Linear { bias: flag("bias") }),
        }),
        "conv2d" => {
            let p = op["padding"].as_u64().unwrap() as usize;
            Conv2d {
                stride: [1, 1],
                padding: [p, p],
                dilation: [1, 1],
                groups: 1,
                bias: true,
                named_padding: None,
                padding_mode: PaddingMode::Zeros,
            }
            .into()
        }
        "attention" => ScaledDotProductAttention {
            is_causal: flag("causal"),
            scale: op["scale"].as_f64(),
            ..Default::default()
        }
        .into(),
        "reduce" => Op::Reduce(match op["kind"].as_str().unwrap() {
            "sum" => ReduceOp::Sum(Sum {
                axes: axes(),
                keepdim: false,
            }),
            _ => ReduceOp::Mean(Mean {
                axes: axes(),
                keepdim: false,
            }),
        }),
        other => panic!("unknown family {other}"),
    }
}

/// One f32 ulp at the size `v` (subnormal spacing below f32's smallest normal).
fn ulp_f32(v: f64) -> f64 {
    let v = v.abs();
    if v < f64::from(f32::MIN_POSITIVE) {
        return f64::from(f32::from_bits(1));
    }
    let exponent = ((v.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    2f64.powi(exponent - 23)
}

/// The error of `got` against `exact` in ulps of `unit` (see the module doc). A non-finite value
/// or an exact value that overflows f32 must be matched exactly (as `exact` rounds to f32).
fn ulps(got: f32, exact: f64, unit: f64) -> f64 {
    let rounded = exact as f32;
    if !rounded.is_finite() || !got.is_finite() {
        let same = got == rounded || (got.is_nan() && rounded.is_nan());
        return if same { 0.0 } else { f64::INFINITY };
    }
    (f64::from(got) - exact).abs() / ulp_f32(exact.abs().max(unit))
}

/// The largest errors of ours and of PyTorch's over one recorded tensor.
fn errors(ours: &Tensor<f32>, record: &Value) -> (f64, f64) {
    let at: Vec<usize> = match record.get("at") {
        Some(at) => dims(at),
        None => (0..ours.numel()).collect(),
    };
    let theirs: Vec<f32> = parsed(&record["torch"]);
    let exact: Vec<f64> = parsed(&record["exact"]);
    let mut units: Vec<f64> = parsed(&record["scale"]);
    if units.len() == 1 {
        units = vec![units[0]; at.len()];
    }
    assert!(theirs.len() == at.len() && exact.len() == at.len() && units.len() == at.len());
    let (mut worst_ours, mut worst_theirs) = (0f64, 0f64);
    for (k, &i) in at.iter().enumerate() {
        worst_ours = worst_ours.max(ulps(ours.data()[i], exact[k], units[k]));
        worst_theirs = worst_theirs.max(ulps(theirs[k], exact[k], units[k]));
    }
    (worst_ours, worst_theirs)
}

/// Per family: the largest errors (ours, PyTorch's), the largest ratio of the two (each taken
/// as at least half a unit, so two correctly rounded results compare as equal) and failures.
#[derive(Default)]
struct Tally {
    tensors: usize,
    ours: f64,
    theirs: f64,
    ratio: f64,
    failures: Vec<String>,
}

impl Tally {
    fn add(&mut self, what: String, ours: f64, theirs: f64) {
        self.tensors += 1;
        self.ours = self.ours.max(ours);
        self.theirs = self.theirs.max(theirs);
        self.ratio = self.ratio.max(ours.max(0.5) / theirs.max(0.5));
        let bound = (TIMES_PYTORCH * theirs).max(FEW_ULPS);
        if ours > bound {
            self.failures.push(format!(
                "{what}: {ours:.3} ulps, PyTorch {theirs:.3} (bound {bound:.3})"
            ));
        }
    }
}

fn check(case: &Value, tally: &mut Tally) {
    let op = op_of(case["family"].as_str().unwrap(), &case["op"]);
    let xs: Vec<Tensor<f32>> = case["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(tensor)
        .collect();
    let refs: Vec<&Tensor<f32>> = xs.iter().collect();
    let name = format!(
        "{op} on {:?}",
        xs.iter().map(|x| x.dims()).collect::<Vec<_>>()
    );
    let y = op
        .forward(&refs)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .value;
    assert_eq!(y.dims(), dims(&case["output"]), "{name}");
    let (ours, theirs) = errors(&y, &case["y"]);
    tally.add(format!("{name} output"), ours, theirs);
    let seed = tensor(&case["seed"]);
    let grads = vjp_with_needs(&op, &refs, &seed, vec![true; xs.len()]);
    for (i, (g, record)) in grads
        .iter()
        .zip(case["grads"].as_array().unwrap())
        .enumerate()
    {
        let g = g
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: no gradient {i}"));
        let (ours, theirs) = errors(g, record);
        tally.add(format!("{name} gradient {i}"), ours, theirs);
    }
}

#[test]
fn f32_errors_are_within_a_few_ulps_or_pytorchs() {
    let fixture: Value = serde_json::from_str(FIXTURE).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 114);
    let mut tallies: BTreeMap<String, Tally> = BTreeMap::new();
    for case in cases {
        let family = case["family"].as_str().unwrap().to_string();
        check(case, tallies.entry(family).or_default());
    }
    for (family, t) in &tallies {
        eprintln!(
            "{family}: {} tensors, largest error ours {:.3} ulps, PyTorch {:.3}; largest ratio ours/PyTorch {:.2}",
            t.tensors, t.ours, t.theirs, t.ratio
        );
    }
    let failures: Vec<&String> = tallies.values().flat_map(|t| &t.failures).collect();
    assert!(
        failures.is_empty(),
        "{} tensors beyond the bound:\n{}",
        failures.len(),
        failures
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}
