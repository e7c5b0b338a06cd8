//! Errors, never panics: every op, given hostile arguments (wrong shapes and arity, bad axes,
//! out-of-range labels, non-finite attributes, cotangents and tangents of the wrong shape, bad
//! tape ids), returns `Err` whose message names the op; named cases check that the message also
//! shows the offending shapes or values. The nn ops get zero and huge sizes (kernels, strides,
//! groups, output sizes), out-of-range and mis-shaped indices, and NaN or infinite eps, momentum,
//! p and scale, on random shapes and on the shapes of valid cases.

use crate::op_support::no_panic_and_named;
use proptest::prelude::*;
use proptest::test_runner::Config;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use tapegrad_core::laws::registry::{draft_any, variants};
use tapegrad_core::laws::{NnKind, OpKind};
use tapegrad_core::ops::activation::{Gelu, LeakyRelu, Relu, Sigmoid, Silu, Softplus, Tanh};
use tapegrad_core::ops::elementwise::{
    Abs, Add, Clamp, Cos, Div, Exp, Log, Maximum, Minimum, Mul, Neg, Pow, SafeLog, Scale, Sin,
    Sqrt, Sub, Where,
};
use tapegrad_core::ops::linalg::{Linear, Matmul, Permute, Transpose};
use tapegrad_core::ops::loss::{
    BinaryCrossEntropyWithLogits, CrossEntropy, CrossEntropyProbs, MseLoss, NllLoss,
};
use tapegrad_core::ops::nn::{
    AdaptiveAvgPool2d, AvgPool2d, BatchNorm, Conv1d, Conv2d, Dropout, Embedding, Gather, GroupNorm,
    IndexSelect, IndexTensor, LayerNorm, MaxPool2d, NamedPadding, PaddingMode, QkvAttention,
    ScaledDotProductAttention, ScatterAdd, Select,
};
use tapegrad_core::ops::reduce::{Amax, LogSoftmax, LogSumExp, Mean, Softmax, Sum};
use tapegrad_core::ops::structure::{BroadcastTo, Concat, Flatten, Reshape, Slice};
use tapegrad_core::ops::{
    ActivationOp, ElementwiseOp, GeluApproximate, LinalgOp, LossOp, Mask, ReduceOp, Reduction,
    Saved, StructureOp,
};
use tapegrad_core::{Op, Shape, Tape, Tensor};

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

const AXES: [isize; 9] = [-9, -3, -2, -1, 0, 1, 2, 3, 9];
const WEIRD: [f64; 8] = [
    0.0,
    -0.0,
    1.0,
    -2.5,
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    1e300,
];

fn pick<T: Copy>(rng: &mut ChaCha8Rng, xs: &[T]) -> T {
    xs[rng.random_range(0..xs.len())]
}

fn axis(rng: &mut ChaCha8Rng) -> isize {
    if rng.random_bool(0.05) {
        pick(rng, &[isize::MIN, isize::MAX])
    } else {
        pick(rng, &AXES)
    }
}

fn axes(rng: &mut ChaCha8Rng) -> Option<Vec<isize>> {
    rng.random_bool(0.8)
        .then(|| (0..rng.random_range(0..=3)).map(|_| axis(rng)).collect())
}

fn dim(rng: &mut ChaCha8Rng) -> usize {
    if rng.random_bool(0.02) {
        // Large enough that any product with it overflows the element-count limit.
        1 << 62
    } else {
        rng.random_range(0..=4)
    }
}

fn dims(rng: &mut ChaCha8Rng) -> Vec<usize> {
    (0..rng.random_range(0..=4)).map(|_| dim(rng)).collect()
}

fn small_shape(rng: &mut ChaCha8Rng) -> Shape {
    let d: Vec<usize> = (0..rng.random_range(0..=4))
        .map(|_| rng.random_range(0..=4))
        .collect();
    Shape::new(d).unwrap()
}

fn value(rng: &mut ChaCha8Rng) -> f64 {
    if rng.random_bool(0.2) {
        pick(rng, &WEIRD)
    } else {
        rng.random_range(-3.0..3.0)
    }
}

fn tensor(shape: &Shape, rng: &mut ChaCha8Rng) -> Tensor<f64> {
    let data = (0..shape.numel()).map(|_| value(rng)).collect();
    Tensor::from_shape(shape.clone(), data).unwrap()
}

fn reduction(rng: &mut ChaCha8Rng) -> Reduction {
    pick(rng, &[Reduction::None, Reduction::Mean, Reduction::Sum])
}

/// Class labels: mostly small, sometimes negative (PyTorch's -100 padding among them) or at
/// the ends of i64.
fn labels(rng: &mut ChaCha8Rng) -> Arc<Vec<i64>> {
    Arc::new(
        (0..rng.random_range(0..=5))
            .map(|_| {
                if rng.random_bool(0.15) {
                    pick(rng, &[i64::MAX, i64::MIN, -100, -1])
                } else {
                    rng.random_range(0..=5)
                }
            })
            .collect(),
    )
}

/// An op of `kind` with random, often invalid, attributes. Exhaustive over `OpKind`, so a new op
/// does not compile until it gets hostile attributes here.
fn hostile_op(kind: OpKind, rng: &mut ChaCha8Rng) -> Op {
    use ElementwiseOp as E;
    use OpKind as K;
    let ew = Op::Elementwise;
    match kind {
        K::Add => ew(E::Add(Add)),
        K::Sub => ew(E::Sub(Sub)),
        K::Mul => ew(E::Mul(Mul)),
        K::Div => ew(E::Div(Div)),
        K::Neg => ew(E::Neg(Neg)),
        K::Scale => ew(E::Scale(Scale { factor: value(rng) })),
        K::Abs => ew(E::Abs(Abs)),
        K::Sqrt => ew(E::Sqrt(Sqrt)),
        K::Exp => ew(E::Exp(Exp)),
        K::Log => ew(E::Log(Log)),
        K::SafeLog => ew(E::SafeLog(SafeLog { eps: value(rng) })),
        K::Sin => ew(E::Sin(Sin)),
        K::Cos => ew(E::Cos(Cos)),
        K::Pow => ew(E::Pow(Pow {
            exponent: value(rng),
        })),
        K::Clamp => ew(E::Clamp(Clamp {
            min: rng.random_bool(0.7).then(|| value(rng)),
            max: rng.random_bool(0.7).then(|| value(rng)),
        })),
        K::Maximum => ew(E::Maximum(Maximum)),
        K::Minimum => ew(E::Minimum(Minimum)),
        K::Where => {
            let shape = small_shape(rng);
            let bits = (0..shape.numel()).map(|_| rng.random_bool(0.5)).collect();
            ew(E::Where(Where {
                mask: Mask::new(shape.dims(), bits).unwrap(),
            }))
        }
        K::Relu => Op::Activation(ActivationOp::Relu(Relu)),
        K::LeakyRelu => Op::Activation(ActivationOp::LeakyRelu(LeakyRelu {
            negative_slope: value(rng),
        })),
        K::Sigmoid => Op::Activation(ActivationOp::Sigmoid(Sigmoid)),
        K::Tanh => Op::Activation(ActivationOp::Tanh(Tanh)),
        K::Gelu => Op::Activation(ActivationOp::Gelu(Gelu {
            approximate: pick(rng, &[GeluApproximate::None, GeluApproximate::Tanh]),
        })),
        K::Softplus => Op::Activation(ActivationOp::Softplus(Softplus {
            beta: value(rng),
            threshold: value(rng),
        })),
        K::Silu => Op::Activation(ActivationOp::Silu(Silu)),
        K::Sum => Op::Reduce(ReduceOp::Sum(Sum {
            axes: axes(rng),
            keepdim: rng.random_bool(0.5),
        })),
        K::Mean => Op::Reduce(ReduceOp::Mean(Mean {
            axes: axes(rng),
            keepdim: rng.random_bool(0.5),
        })),
        K::Amax => Op::Reduce(ReduceOp::Amax(Amax {
            axes: axes(rng),
            keepdim: rng.random_bool(0.5),
        })),
        K::Softmax => Op::Reduce(ReduceOp::Softmax(Softmax { axis: axis(rng) })),
        K::LogSoftmax => Op::Reduce(ReduceOp::LogSoftmax(LogSoftmax { axis: axis(rng) })),
        K::LogSumExp => Op::Reduce(ReduceOp::LogSumExp(LogSumExp {
            axes: axes(rng),
            keepdim: rng.random_bool(0.5),
        })),
        K::Matmul => Op::Linalg(LinalgOp::Matmul(Matmul)),
        K::Linear => Op::Linalg(LinalgOp::Linear(Linear {
            bias: rng.random_bool(0.5),
        })),
        K::Transpose => Op::Linalg(LinalgOp::Transpose(Transpose {
            dim0: axis(rng),
            dim1: axis(rng),
        })),
        K::Permute => Op::Linalg(LinalgOp::Permute(Permute {
            dims: (0..rng.random_range(0..=4)).map(|_| axis(rng)).collect(),
        })),
        K::Reshape => Op::Structure(StructureOp::Reshape(Reshape {
            shape: (0..rng.random_range(0..=4))
                .map(|_| {
                    if rng.random_bool(0.05) {
                        pick(rng, &[isize::MAX, isize::MIN])
                    } else {
                        rng.random_range(-2..=6i64) as isize
                    }
                })
                .collect(),
        })),
        K::Flatten => Op::Structure(StructureOp::Flatten(Flatten {
            start_dim: axis(rng),
            end_dim: axis(rng),
        })),
        K::BroadcastTo => Op::Structure(StructureOp::BroadcastTo(BroadcastTo { shape: dims(rng) })),
        K::Concat => Op::Structure(StructureOp::Concat(Concat { axis: axis(rng) })),
        K::Slice => Op::Structure(StructureOp::Slice(Slice {
            axis: axis(rng),
            start: pick(rng, &[isize::MIN, -9, -2, -1, 0, 1, 2, 9, isize::MAX]),
            end: pick(rng, &[isize::MIN, -9, -2, -1, 0, 1, 2, 9, isize::MAX]),
            step: pick(rng, &[0, 1, 2, 5, usize::MAX]),
        })),
        K::MseLoss => Op::Loss(LossOp::MseLoss(MseLoss {
            reduction: reduction(rng),
        })),
        K::CrossEntropy => Op::Loss(LossOp::CrossEntropy(CrossEntropy {
            targets: labels(rng),
            reduction: reduction(rng),
            weight: class_weights(rng),
            ignore_index: ignore_index(rng),
            label_smoothing: if rng.random_bool(0.5) {
                0.0
            } else {
                value(rng)
            },
        })),
        K::BinaryCrossEntropyWithLogits => Op::Loss(LossOp::BinaryCrossEntropyWithLogits(
            BinaryCrossEntropyWithLogits {
                reduction: reduction(rng),
                pos_weight: pos_weight(rng),
                weight: None,
            },
        )),
        K::NllLoss => Op::Loss(LossOp::NllLoss(NllLoss {
            targets: labels(rng),
            reduction: reduction(rng),
            weight: class_weights(rng),
            ignore_index: ignore_index(rng),
        })),
        K::CrossEntropyProbs => Op::Loss(LossOp::CrossEntropyProbs(CrossEntropyProbs {
            reduction: reduction(rng),
            weight: class_weights(rng),
            label_smoothing: if rng.random_bool(0.5) {
                0.0
            } else {
                value(rng)
            },
        })),
        K::WeightedBinaryCrossEntropyWithLogits => {
            let shape = small_shape(rng);
            let values = (0..shape.numel()).map(|_| value(rng)).collect();
            Op::Loss(LossOp::BinaryCrossEntropyWithLogits(
                BinaryCrossEntropyWithLogits {
                    reduction: reduction(rng),
                    pos_weight: pos_weight(rng),
                    weight: Some(Arc::new(Tensor::new(shape.dims(), values).unwrap())),
                },
            ))
        }
        K::Nn(n) => hostile_nn(n, rng),
    }
}

/// Class weights of a random length (often not the number of classes), now and then non-finite.
fn class_weights(rng: &mut ChaCha8Rng) -> Option<Arc<Vec<f64>>> {
    rng.random_bool(0.4).then(|| {
        let len = rng.random_range(0..=5);
        Arc::new((0..len).map(|_| value(rng)).collect())
    })
}

/// A hostile `pos_weight`: now and then, of any small shape (broadcastable into the input's or
/// not, 0-d, empty), with hostile values.
fn pos_weight(rng: &mut ChaCha8Rng) -> Option<Arc<Tensor<f64>>> {
    rng.random_bool(0.4).then(|| {
        let shape = small_shape(rng);
        let values = (0..shape.numel()).map(|_| value(rng)).collect();
        Arc::new(Tensor::new(shape.dims(), values).unwrap())
    })
}

/// An ignored label: in range, out of range or huge.
fn ignore_index(rng: &mut ChaCha8Rng) -> Option<i64> {
    rng.random_bool(0.4)
        .then(|| pick(rng, &[0, 1, 2, 3, 7, 1 << 40, i64::MAX, -100, -1, i64::MIN]))
}

/// A size attribute: often valid, sometimes zero or far too large to allocate or index.
fn size(rng: &mut ChaCha8Rng) -> usize {
    pick(rng, &[0, 1, 1, 2, 2, 3, 5, 1 << 40, usize::MAX])
}

fn sizes(rng: &mut ChaCha8Rng) -> [usize; 2] {
    [size(rng), size(rng)]
}

/// Indices whose data may not match their shape, with values that may be out of range.
fn hostile_index(rng: &mut ChaCha8Rng) -> IndexTensor {
    let shape = small_shape(rng);
    let len = if rng.random_bool(0.8) {
        shape.numel()
    } else {
        rng.random_range(0..=5)
    };
    let data = (0..len)
        .map(|_| {
            if rng.random_bool(0.1) {
                pick(rng, &[usize::MAX, 1 << 40, 7])
            } else {
                rng.random_range(0..=3)
            }
        })
        .collect();
    IndexTensor {
        shape,
        data: Arc::new(data),
    }
}

/// "same", "valid" or numeric padding, at random.
fn named_padding(rng: &mut ChaCha8Rng) -> Option<NamedPadding> {
    pick(
        rng,
        &[None, Some(NamedPadding::Same), Some(NamedPadding::Valid)],
    )
}

/// Any of PyTorch's four padding modes.
fn padding_mode(rng: &mut ChaCha8Rng) -> PaddingMode {
    pick(
        rng,
        &[
            PaddingMode::Zeros,
            PaddingMode::Reflect,
            PaddingMode::Replicate,
            PaddingMode::Circular,
        ],
    )
}

/// An nn op of `kind` with random, often invalid, attributes (exhaustive over `NnKind`).
fn hostile_nn(kind: NnKind, rng: &mut ChaCha8Rng) -> Op {
    use NnKind as N;
    match kind {
        N::Conv1d => Conv1d {
            stride: size(rng),
            padding: size(rng),
            dilation: size(rng),
            groups: size(rng),
            bias: rng.random_bool(0.5),
            named_padding: named_padding(rng),
            padding_mode: padding_mode(rng),
        }
        .into(),
        N::Conv2d => Conv2d {
            stride: sizes(rng),
            padding: sizes(rng),
            dilation: sizes(rng),
            groups: size(rng),
            bias: rng.random_bool(0.5),
            named_padding: named_padding(rng),
            padding_mode: padding_mode(rng),
        }
        .into(),
        N::MaxPool2d => MaxPool2d {
            kernel_size: sizes(rng),
            stride: sizes(rng),
            padding: sizes(rng),
            dilation: sizes(rng),
            ceil_mode: rng.random_bool(0.5),
        }
        .into(),
        N::AvgPool2d => AvgPool2d {
            kernel_size: sizes(rng),
            stride: sizes(rng),
            padding: sizes(rng),
            ceil_mode: rng.random_bool(0.5),
            count_include_pad: rng.random_bool(0.5),
            divisor_override: rng
                .random_bool(0.5)
                .then(|| pick(rng, &[i64::MIN, -3, -1, 0, 1, 4, i64::MAX])),
        }
        .into(),
        N::AdaptiveAvgPool2d => AdaptiveAvgPool2d {
            output_size: sizes(rng),
        }
        .into(),
        N::LayerNorm => LayerNorm {
            normalized_shape: dims(rng),
            eps: value(rng),
            weight: rng.random_bool(0.5),
            bias: rng.random_bool(0.5),
        }
        .into(),
        N::BatchNorm => BatchNorm {
            training: rng.random_bool(0.5),
            momentum: value(rng),
            eps: value(rng),
            weight: rng.random_bool(0.5),
            bias: rng.random_bool(0.5),
        }
        .into(),
        N::GroupNorm => GroupNorm {
            num_groups: size(rng),
            eps: value(rng),
            weight: rng.random_bool(0.5),
            bias: rng.random_bool(0.5),
        }
        .into(),
        N::Embedding => Embedding {
            indices: hostile_index(rng),
            padding_idx: rng
                .random_bool(0.5)
                .then(|| pick(rng, &[isize::MIN, -9, -1, 0, 1, 9, isize::MAX])),
        }
        .into(),
        N::IndexSelect => IndexSelect {
            dim: axis(rng),
            index: hostile_index(rng),
        }
        .into(),
        N::Gather => Gather {
            dim: axis(rng),
            index: hostile_index(rng),
        }
        .into(),
        N::ScatterAdd => ScatterAdd {
            dim: axis(rng),
            index: hostile_index(rng),
        }
        .into(),
        N::Select => Select {
            dim: axis(rng),
            index: pick(rng, &[isize::MIN, -9, -2, -1, 0, 1, 2, 9, isize::MAX]),
        }
        .into(),
        N::Dropout => Dropout {
            p: value(rng),
            training: rng.random_bool(0.7),
            seed: rng.random(),
        }
        .into(),
        N::ScaledDotProductAttention => {
            let attn_mask = rng.random_bool(0.3).then(|| {
                let shape = small_shape(rng);
                let bits = (0..shape.numel()).map(|_| rng.random_bool(0.5)).collect();
                Mask::new(shape.dims(), bits).unwrap()
            });
            ScaledDotProductAttention {
                is_causal: rng.random_bool(0.5),
                scale: rng.random_bool(0.5).then(|| value(rng)),
                attn_mask,
                float_mask: rng.random_bool(0.3),
                dropout_p: if rng.random_bool(0.5) {
                    0.0
                } else {
                    value(rng)
                },
                seed: rng.random(),
            }
            .into()
        }
        N::QkvAttention => QkvAttention {
            heads: size(rng),
            is_causal: rng.random_bool(0.5),
            scale: rng.random_bool(0.5).then(|| value(rng)),
            dropout_p: if rng.random_bool(0.5) {
                0.0
            } else {
                value(rng)
            },
            seed: rng.random(),
        }
        .into(),
    }
}

fn hostile_round(rng: &mut ChaCha8Rng) {
    let kind = pick(rng, OpKind::ALL);
    let op = hostile_op(kind, rng);
    // Mostly the right arity, sometimes not.
    let arity = if rng.random_bool(0.8) {
        op.arity().min() + usize::from(rng.random_bool(0.1))
    } else {
        rng.random_range(0..=4)
    };
    let mut inputs: Vec<Tensor<f64>> = (0..arity)
        .map(|_| {
            let s = small_shape(rng);
            tensor(&s, rng)
        })
        .collect();
    // Random shapes rarely suit an nn op; half the time take the shapes of a valid case of the
    // kind (with hostile values and attributes), sometimes with one dimension zeroed.
    if let (OpKind::Nn(_), true) = (kind, rng.random_bool(0.5)) {
        let variant = rng.random_range(0..variants(kind).len());
        if let Some(case) = draft_any(kind, variant, rng) {
            inputs = case
                .inputs
                .iter()
                .map(|x| {
                    let mut d = x.dims().to_vec();
                    if !d.is_empty() && rng.random_bool(0.2) {
                        let a = rng.random_range(0..d.len());
                        d[a] = 0;
                    }
                    tensor(&Shape::new(d).unwrap(), rng)
                })
                .collect();
        }
    }
    let refs: Vec<&Tensor<f64>> = inputs.iter().collect();
    let shapes: Vec<&Shape> = inputs.iter().map(|t| t.shape()).collect();

    no_panic_and_named(&op, "output_shape", || op.output_shape(&shapes));
    no_panic_and_named(&op, "check_domain", || op.check_domain(&refs));
    let forward = no_panic_and_named(&op, "forward", || op.forward(&refs));

    let mut tape = Tape::<f64>::new();
    let mut ids: Vec<usize> = inputs
        .iter()
        .map(|x| tape.leaf(x.clone(), rng.random_bool(0.7)))
        .collect();
    if rng.random_bool(0.2) {
        ids.push(rng.random_range(0..10) + tape.len());
    }
    no_panic_and_named(&op, "tape.apply", || tape.apply(op.clone(), &ids));

    let Some(forward) = forward else { return };
    let out_shape = forward.value.shape().clone();
    let cot_shape = if rng.random_bool(0.7) {
        out_shape.clone()
    } else {
        small_shape(rng)
    };
    let cot = tensor(&cot_shape, rng);
    let needs: Vec<bool> = (0..refs.len()).map(|_| rng.random_bool(0.7)).collect();
    let saved = Saved::keep(op.saves(), &refs, &forward, needs.clone());
    if let Some(grads) = no_panic_and_named(&op, "vjp", || op.vjp(&saved.context(), &cot)) {
        assert_eq!(
            cot_shape, out_shape,
            "{op}: vjp accepted a cotangent of the wrong shape"
        );
        assert_eq!(grads.len(), refs.len(), "{op}");
        for ((g, x), need) in grads.iter().zip(&refs).zip(&needs) {
            if let Some(g) = g {
                assert_eq!(g.shape(), x.shape(), "{op}");
            } else {
                assert!(
                    !need,
                    "{op}: no contribution for an argument that needs one"
                );
            }
        }
    }
    let tangents: Vec<Tensor<f64>> = refs
        .iter()
        .map(|x| {
            let s = if rng.random_bool(0.8) {
                x.shape().clone()
            } else {
                small_shape(rng)
            };
            tensor(&s, rng)
        })
        .collect();
    let trefs: Vec<&Tensor<f64>> = tangents.iter().collect();
    if let Some(t) = no_panic_and_named(&op, "jvp", || op.jvp(&refs, &forward, &trefs)) {
        assert_eq!(t.shape(), &out_shape, "{op}: jvp gave the wrong shape");
    }
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn hostile_arguments_give_errors_naming_the_op_never_panics(seed in any::<u64>()) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for _ in 0..64 {
            hostile_round(&mut rng);
        }
    }
}

fn t(dims: &[usize]) -> Tensor<f64> {
    let n: usize = dims.iter().product();
    Tensor::new(dims, (0..n).map(|i| i as f64 * 0.1 + 0.5).collect()).unwrap()
}

/// An op, arguments it must reject, and what the message must mention.
type NamedCase = (Op, Vec<Tensor<f64>>, Vec<&'static str>);

/// Named failures and what their messages must mention.
fn named_cases() -> Vec<NamedCase> {
    let ew = Op::Elementwise;
    vec![
        (
            ew(ElementwiseOp::Add(Add)),
            vec![t(&[2, 3]), t(&[4])],
            vec!["add", "[2, 3]", "[4]"],
        ),
        (
            ew(ElementwiseOp::Add(Add)),
            vec![t(&[2])],
            vec!["add", "2", "1"],
        ),
        (
            ew(ElementwiseOp::Mul(Mul)),
            vec![t(&[3]), t(&[2, 2])],
            vec!["mul", "[3]", "[2, 2]"],
        ),
        (
            ew(ElementwiseOp::Clamp(Clamp {
                min: Some(1.0),
                max: Some(0.0),
            })),
            vec![t(&[2])],
            vec!["clamp", "1", "0"],
        ),
        (
            ew(ElementwiseOp::Where(Where {
                mask: Mask::new(&[3], vec![true; 3]).unwrap(),
            })),
            vec![t(&[2]), t(&[2])],
            vec!["where", "[3]", "[2]"],
        ),
        (
            Op::Reduce(ReduceOp::Sum(Sum {
                axes: Some(vec![5]),
                keepdim: false,
            })),
            vec![t(&[2, 3])],
            vec!["sum", "5"],
        ),
        (
            Op::Reduce(ReduceOp::Amax(Amax {
                axes: Some(vec![0, 0]),
                keepdim: true,
            })),
            vec![t(&[2, 3])],
            vec!["amax", "0"],
        ),
        (
            Op::Reduce(ReduceOp::Softmax(Softmax { axis: 2 })),
            vec![t(&[3])],
            vec!["softmax", "2"],
        ),
        (
            Op::Linalg(LinalgOp::Matmul(Matmul)),
            vec![t(&[2, 3]), t(&[4, 5])],
            vec!["matmul", "[2, 3]", "[4, 5]"],
        ),
        (
            Op::Linalg(LinalgOp::Matmul(Matmul)),
            vec![t(&[]), t(&[3])],
            vec!["matmul", "[]"],
        ),
        (
            Op::Linalg(LinalgOp::Linear(Linear { bias: true })),
            vec![t(&[2, 3]), t(&[4, 5]), t(&[4])],
            vec!["linear", "[2, 3]", "[4, 5]"],
        ),
        (
            Op::Linalg(LinalgOp::Linear(Linear { bias: true })),
            vec![t(&[2, 3]), t(&[4, 3]), t(&[5])],
            vec!["linear", "[5]"],
        ),
        (
            Op::Linalg(LinalgOp::Transpose(Transpose { dim0: 0, dim1: 2 })),
            vec![t(&[2, 3])],
            vec!["transpose", "2"],
        ),
        (
            Op::Linalg(LinalgOp::Permute(Permute { dims: vec![0] })),
            vec![t(&[2, 3])],
            vec!["permute", "[2, 3]"],
        ),
        (
            Op::Structure(StructureOp::Reshape(Reshape { shape: vec![5] })),
            vec![t(&[2, 3])],
            vec!["reshape", "[2, 3]", "5"],
        ),
        (
            Op::Structure(StructureOp::Reshape(Reshape {
                shape: vec![-1, -1],
            })),
            vec![t(&[2, 3])],
            vec!["reshape", "-1"],
        ),
        (
            Op::Structure(StructureOp::BroadcastTo(BroadcastTo { shape: vec![3] })),
            vec![t(&[2])],
            vec!["broadcast_to", "[2]", "[3]"],
        ),
        (
            Op::Structure(StructureOp::Concat(Concat { axis: 0 })),
            vec![t(&[2, 3]), t(&[2, 4])],
            vec!["concat", "[2, 3]", "[2, 4]"],
        ),
        (
            Op::Structure(StructureOp::Slice(Slice {
                axis: 0,
                start: 0,
                end: 2,
                step: 0,
            })),
            vec![t(&[3])],
            vec!["slice", "step"],
        ),
        (
            Op::Structure(StructureOp::Flatten(Flatten {
                start_dim: 1,
                end_dim: 0,
            })),
            vec![t(&[2, 3])],
            vec!["flatten", "1", "0"],
        ),
        (
            Op::Loss(LossOp::MseLoss(MseLoss {
                reduction: Reduction::Mean,
            })),
            vec![t(&[2]), t(&[3])],
            vec!["mse_loss", "[2]", "[3]"],
        ),
        (
            Op::Loss(LossOp::bce_with_logits(Reduction::Sum)),
            vec![t(&[2, 2]), t(&[4])],
            vec!["binary_cross_entropy_with_logits", "[2, 2]", "[4]"],
        ),
        (
            Op::Loss(LossOp::cross_entropy(Arc::new(vec![0, 7]), Reduction::Mean)),
            vec![t(&[2, 3])],
            vec!["cross_entropy", "7", "3"],
        ),
        (
            Op::Loss(LossOp::nll_loss(Arc::new(vec![0]), Reduction::Mean)),
            vec![t(&[2, 3])],
            vec!["nll_loss", "[2, 3]", "1"],
        ),
        (
            Op::Loss(LossOp::cross_entropy(Arc::new(vec![0]), Reduction::Sum)),
            vec![t(&[2, 3, 4])],
            vec!["cross_entropy", "[2, 3, 4]"],
        ),
        (
            // A negative label other than the ignored one.
            Op::Loss(LossOp::NllLoss(NllLoss {
                targets: Arc::new(vec![-100, -2]),
                reduction: Reduction::Mean,
                weight: None,
                ignore_index: Some(-100),
            })),
            vec![t(&[2, 3])],
            vec!["nll_loss", "class label -2", "-100"],
        ),
        (
            ScaledDotProductAttention::default().into(),
            vec![t(&[2, 4, 3, 2]), t(&[2, 2, 5, 2]), t(&[2, 2, 5, 3])],
            vec![
                "scaled_dot_product_attention",
                "[2, 4, 3, 2]",
                "[2, 2, 5, 2]",
                "broadcast",
            ],
        ),
    ]
}

#[test]
fn named_failures_mention_the_op_and_what_was_wrong() {
    let mut problems = Vec::new();
    for (op, inputs, needles) in named_cases() {
        let refs: Vec<&Tensor<f64>> = inputs.iter().collect();
        let result = catch_unwind(AssertUnwindSafe(|| op.forward(&refs)));
        let msg = match result {
            Err(_) => {
                problems.push(format!("{op}: panicked"));
                continue;
            }
            Ok(Ok(_)) => {
                problems.push(format!(
                    "{op}: accepted {:?}",
                    inputs.iter().map(|x| x.shape()).collect::<Vec<_>>()
                ));
                continue;
            }
            Ok(Err(e)) => e.to_string(),
        };
        for needle in needles {
            if !msg.contains(needle) {
                problems.push(format!("{op}: message {msg:?} does not mention {needle:?}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn vjp_rejects_a_cotangent_of_the_wrong_shape_naming_op_and_shapes() {
    let op = Op::Linalg(LinalgOp::Matmul(Matmul));
    let (a, b) = (t(&[2, 3]), t(&[3, 4]));
    let fwd = op.forward(&[&a, &b]).unwrap();
    let saved = Saved::keep(op.saves(), &[&a, &b], &fwd, vec![true, true]);
    let msg = op
        .vjp(&saved.context(), &t(&[4, 2]))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("matmul") && msg.contains("[2, 4]") && msg.contains("[4, 2]"),
        "{msg}"
    );
}

#[test]
fn tape_apply_with_a_bad_id_names_the_op_and_the_id() {
    let mut tape = Tape::<f64>::new();
    let x = tape.leaf(t(&[2]), true);
    let msg = tape
        .apply(Op::Elementwise(ElementwiseOp::Add(Add)), &[x, 5])
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("add") && msg.contains('5') && msg.contains('1'),
        "{msg}"
    );
}

/// Seeds that once found a panic, replayed on every run (proptest draws fresh seeds each time).
#[test]
fn hostile_seeds_that_once_panicked_stay_fixed() {
    // conv1d with stride usize::MAX: the strided input gradient's plan allocated one phase per
    // residue of the stride.
    for seed in [17_601_932_340_281_326_570u64] {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for _ in 0..64 {
            hostile_round(&mut rng);
        }
    }
}
