//! The registry of every op for the law checks: each kind of the list of ops (`OpKind`, from
//! `ops/list.rs`) has named attribute variants and a generator of f64 arguments at generic points
//! (away from kinks, ties and domain edges). `is_generic` decides whether arbitrary arguments are
//! such a point. The matches over `OpKind` are exhaustive, so a new op does not compile until it
//! has its variants, generator and condition here (the nn family's are in `nn.rs`).

pub use crate::ops::{NnKind, OpKind};

use crate::ops::{
    ActivationOp, ElementwiseOp, GeluApproximate, LinalgOp, LossOp, Mask, Op, ReduceOp, Reduction,
    StructureOp,
};
use rand::Rng;
use std::sync::Arc;
use tapegrad_tensor::kernels::broadcast_to;
use tapegrad_tensor::{normalize_axes, Shape, Tensor};

mod nn;

/// Distance a generic point keeps from a kink (relu at 0, clamp bounds, max ties, ...). Finite
/// differences with steps around 1e-6 never cross a kink this far away.
pub const KINK_MARGIN: f64 = 1e-2;
/// Distance a generic point keeps from a domain edge (log, sqrt, pow at 0, division by 0), where
/// derivatives blow up and central differences lose their accuracy.
pub const DOMAIN_MARGIN: f64 = 0.1;
/// Largest magnitude of any argument or result at a generic point, so that the rounding error of
/// an objective stays far below the finite-difference tolerance.
pub const VALUE_BOUND: f64 = 100.0;
/// Largest element count of any argument or result the generators produce.
pub const MAX_NUMEL: usize = 256;

/// One op with attributes and arguments at a generic point.
#[derive(Debug, Clone, PartialEq)]
pub struct OpCase {
    /// `op (variant)`, stable across draws, e.g. `sum (axis 0)`.
    pub label: String,
    pub op: Op,
    pub inputs: Vec<Tensor<f64>>,
}

use crate::ops::activation::{Gelu, LeakyRelu, Relu, Sigmoid, Silu, Softplus, Tanh};
use crate::ops::elementwise::{
    Abs, Add, Clamp, Cos, Div, Exp, Log, Maximum, Minimum, Mul, Neg, Pow, SafeLog, Scale, Sin,
    Sqrt, Sub, Where,
};
use crate::ops::linalg::{Linear, Matmul, Permute, Transpose};
use crate::ops::loss::{
    BinaryCrossEntropyWithLogits, CrossEntropy, CrossEntropyProbs, MseLoss, NllLoss,
};
use crate::ops::reduce::{Amax, LogSoftmax, LogSumExp, Mean, Softmax, Sum};
use crate::ops::structure::{BroadcastTo, Concat, Flatten, Reshape, Slice};
use ActivationOp as A;
use ElementwiseOp as E;
use LinalgOp as L;
use LossOp as Lo;
use OpKind as K;
use ReduceOp as Red;
use StructureOp as St;

const BINARY: &[&str] = &["same shape", "broadcast both"];
const REDUCTION: &[&str] = &["mean", "sum", "none"];
const AXES: &[&str] = &[
    "all",
    "all keepdim",
    "no axes",
    "axis 0",
    "last axis keepdim",
    "two axes",
];
const CROSS_ENTROPY: &[&str] = &[
    "batch mean",
    "batch sum",
    "batch none",
    "single",
    "class weights mean",
    "ignore_index out of range, smoothing, sum",
    "weights, ignore_index, smoothing, none",
    "spatial mean",
    "spatial weights, ignore_index, smoothing, none",
    "ignore_index -100 padding, smoothing, mean",
];
const NLL: &[&str] = &[
    "batch mean",
    "batch sum",
    "batch none",
    "single",
    "class weights mean",
    "ignore_index out of range, sum",
    "weights, ignore_index, none",
    "spatial sum",
    "spatial weights, ignore_index out of range, mean",
    "ignore_index -100 padding, mean",
];

/// The named attribute variants of a kind; the generator takes an index into this list.
pub fn variants(kind: OpKind) -> &'static [&'static str] {
    match kind {
        K::Add | K::Sub | K::Mul | K::Div | K::Maximum | K::Minimum | K::Where => BINARY,
        K::Neg | K::Abs | K::Sqrt | K::Exp | K::Log | K::Sin | K::Cos => &["generic"],
        K::Scale => &["factor 2.5", "factor -0.5", "factor 0"],
        K::SafeLog => &["eps 1e-3", "eps 0.5 both sides"],
        K::Pow => &[
            "exponent 2",
            "exponent 3 signed base",
            "exponent 0.5",
            "exponent -1.5",
            "exponent 0",
        ],
        K::Clamp => &["min and max", "min only", "max only"],
        K::Relu | K::Sigmoid | K::Tanh | K::Silu => &["generic"],
        K::LeakyRelu => &["slope 0.01", "slope 0.2"],
        K::Gelu => &["erf", "tanh"],
        K::Softplus => &["beta 1 threshold 20", "beta 2 threshold 1"],
        K::Sum | K::Mean | K::Amax | K::LogSumExp => AXES,
        K::Softmax | K::LogSoftmax => &["last axis", "axis 0"],
        K::Matmul => &[
            "vector vector",
            "matrix vector",
            "vector matrix",
            "matrix matrix",
            "batched broadcast",
        ],
        K::Linear => &["bias", "no bias"],
        K::Transpose => &["last two", "negative axes", "same axis"],
        K::Permute => &["random", "negative"],
        K::Reshape => &["flatten -1", "split -1", "explicit"],
        K::Flatten => &["all", "inner"],
        K::BroadcastTo => &["new leading axis", "expand ones"],
        K::Concat => &["one part", "two parts axis 0", "three parts last axis"],
        K::Slice => &["prefix", "negative bounds step 2", "clamped end"],
        K::MseLoss => REDUCTION,
        K::BinaryCrossEntropyWithLogits => &[
            "mean",
            "sum",
            "none",
            "pos_weight per class, mean",
            "one pos_weight, none",
            "pos_weight [C, 1, 1] style, sum",
        ],
        K::CrossEntropy => CROSS_ENTROPY,
        K::NllLoss => NLL,
        K::CrossEntropyProbs => &[
            "mean",
            "sum",
            "none",
            "single",
            "weights, smoothing, mean",
            "spatial weights, smoothing, none",
        ],
        K::WeightedBinaryCrossEntropyWithLogits => &[
            "weight same shape, mean",
            "weight broadcast, sum",
            "weight broadcast, pos_weight, none",
        ],
        K::Nn(n) => nn::variants(n),
    }
}

/// `kind (variant)`, or the bare kind when it has a single variant.
pub fn case_label(kind: OpKind, variant: usize) -> String {
    let names = variants(kind);
    if names.len() == 1 {
        kind.label().to_string()
    } else {
        format!("{} ({})", kind.label(), names[variant])
    }
}

/// One case per kind and variant, each at a fresh random generic point.
pub fn op_cases<R: Rng + ?Sized>(rng: &mut R) -> Vec<OpCase> {
    let mut cases = Vec::new();
    for &kind in OpKind::ALL {
        for variant in 0..variants(kind).len() {
            if let Some(case) = draft_any(kind, variant, rng) {
                cases.push(case);
            }
        }
    }
    cases
}

/// A case of `kind`/`variant` at a random shape that suits it.
pub fn draft_any<R: Rng + ?Sized>(kind: OpKind, variant: usize, rng: &mut R) -> Option<OpCase> {
    (0..256).find_map(|_| {
        let shape = match kind {
            K::Nn(n) => nn::random_first_shape(n, rng),
            _ => random_shape(rng),
        };
        draft(kind, variant, &shape, rng)
    })
}

/// A case of `kind`/`variant` whose first argument has shape `first`, with every argument at a
/// generic point; `None` when the variant does not accept that shape.
pub fn draft<R: Rng + ?Sized>(
    kind: OpKind,
    variant: usize,
    first: &Shape,
    rng: &mut R,
) -> Option<OpCase> {
    if variant >= variants(kind).len() {
        return None;
    }
    let (op, inputs) = generate(kind, variant, first, rng)?;
    if inputs.iter().any(|t| t.numel() > MAX_NUMEL) {
        return None;
    }
    Some(OpCase {
        label: case_label(kind, variant),
        op,
        inputs,
    })
}

// ---------------------------------------------------------------------------------------------
// Random shapes and values.

/// A small random shape: rank 0 to 3, dimensions 1 to 4 with 1 favoured (for broadcasting).
pub fn random_shape<R: Rng + ?Sized>(rng: &mut R) -> Shape {
    let rank = rng.random_range(0..=3usize);
    let dims: Vec<usize> = (0..rank).map(|_| random_dim(rng)).collect();
    shape(&dims)
}

/// A tensor of a random small shape with values in [-2, 2).
pub fn random_values<R: Rng + ?Sized>(rng: &mut R) -> Tensor<f64> {
    let dims = random_shape(rng);
    uniform(&dims, rng, -2.0, 2.0)
}

fn random_dim<R: Rng + ?Sized>(rng: &mut R) -> usize {
    if rng.random_bool(0.3) {
        1
    } else {
        rng.random_range(2..=4)
    }
}

fn shape(dims: &[usize]) -> Shape {
    // Dimensions here are at most a few units, so the element count cannot overflow.
    Shape::new(dims).expect("small shapes never overflow")
}

fn tensor_with<R: Rng + ?Sized>(
    dims: &Shape,
    rng: &mut R,
    mut f: impl FnMut(&mut R) -> f64,
) -> Tensor<f64> {
    let data = (0..dims.numel()).map(|_| f(rng)).collect();
    Tensor::from_shape(dims.clone(), data).expect("data has the shape's length")
}

/// Uniform values in `[lo, hi)`.
fn uniform<R: Rng + ?Sized>(dims: &Shape, rng: &mut R, lo: f64, hi: f64) -> Tensor<f64> {
    tensor_with(dims, rng, |r| r.random_range(lo..hi))
}

/// Uniform values in `[lo, hi)` at least `KINK_MARGIN * 5` away from every point of `kinks`.
fn away_from<R: Rng + ?Sized>(
    dims: &Shape,
    rng: &mut R,
    lo: f64,
    hi: f64,
    kinks: &[f64],
) -> Tensor<f64> {
    tensor_with(dims, rng, |r| loop {
        let v = r.random_range(lo..hi);
        if kinks.iter().all(|k| (v - k).abs() > 5.0 * KINK_MARGIN) {
            return v;
        }
    })
}

/// Magnitudes in `[lo, hi)` with random signs.
fn signed<R: Rng + ?Sized>(dims: &Shape, rng: &mut R, lo: f64, hi: f64) -> Tensor<f64> {
    tensor_with(dims, rng, |r| {
        let m = r.random_range(lo..hi);
        if r.random_bool(0.5) {
            m
        } else {
            -m
        }
    })
}

/// Pairwise distinct values at least 0.2 apart, in random order (no ties anywhere).
fn distinct<R: Rng + ?Sized>(dims: &Shape, rng: &mut R) -> Tensor<f64> {
    let n = dims.numel();
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.random_range(0..=i));
    }
    let data = order
        .into_iter()
        .map(|k| (k as f64 - n as f64 / 2.0) * 0.25 + rng.random_range(0.0..0.05))
        .collect();
    Tensor::from_shape(dims.clone(), data).expect("data has the shape's length")
}

/// Values on one of two interleaved grids (even or odd integers plus a fraction in [0.1, 0.9)), so
/// a value of one grid is at least 0.2 from every value of the other: no ties under max/min.
fn grid<R: Rng + ?Sized>(dims: &Shape, rng: &mut R, odd: bool) -> Tensor<f64> {
    tensor_with(dims, rng, |r| {
        let k = 2 * r.random_range(-2..=1i32) + i32::from(odd);
        f64::from(k) + r.random_range(0.1..0.9)
    })
}

/// A shape that broadcasts with `x`: each axis keeps its size or becomes 1, an axis of size 1 may
/// grow, and a leading axis may be added; so both operands can stretch.
fn broadcast_partner<R: Rng + ?Sized>(x: &Shape, rng: &mut R) -> Shape {
    let mut dims: Vec<usize> = x
        .dims()
        .iter()
        .map(|&d| {
            if d == 1 {
                rng.random_range(1..=3)
            } else if rng.random_bool(0.4) {
                1
            } else {
                d
            }
        })
        .collect();
    if rng.random_bool(0.3) {
        dims.insert(0, rng.random_range(1..=3));
    }
    shape(&dims)
}

/// `x`'s dimensions with a few trailing ones replaced by 1 and leading ones dropped: a shape that
/// broadcasts to `x` without enlarging it.
fn broadcast_into<R: Rng + ?Sized>(x: &Shape, rng: &mut R) -> Shape {
    let drop = rng.random_range(0..=x.rank());
    let dims: Vec<usize> = x.dims()[drop..]
        .iter()
        .map(|&d| if rng.random_bool(0.3) { 1 } else { d })
        .collect();
    shape(&dims)
}

/// A pos_weight shape that weighs one axis of `x`, PyTorch's [C, 1, 1] for a [C, H, W] target:
/// `x`'s dims from a random axis on, all but that axis 1 (0-d for a 0-d `x`).
fn class_axis<R: Rng + ?Sized>(x: &Shape, rng: &mut R) -> Shape {
    if x.rank() == 0 {
        return shape(&[]);
    }
    let from = rng.random_range(0..x.rank());
    let dims: Vec<usize> = (from..x.rank())
        .map(|a| if a == from { x.dims()[a] } else { 1 })
        .collect();
    shape(&dims)
}

/// A one-axis tensor of `values`.
fn vector(values: Vec<f64>) -> Tensor<f64> {
    let n = values.len();
    Tensor::new(&[n], values).expect("one axis of the values' count")
}

fn labels<R: Rng + ?Sized>(n: usize, classes: usize, rng: &mut R) -> Arc<Vec<i64>> {
    let classes = i64::try_from(classes).unwrap_or(i64::MAX);
    Arc::new((0..n).map(|_| rng.random_range(0..classes)).collect())
}

fn with_dim(x: &Shape, axis: usize, d: usize) -> Shape {
    let mut dims = x.dims().to_vec();
    dims[axis] = d;
    shape(&dims)
}

// ---------------------------------------------------------------------------------------------
// Generators, one arm per kind.

type Draft = (Op, Vec<Tensor<f64>>);

fn binary<R: Rng + ?Sized>(variant: usize, x: &Shape, rng: &mut R) -> Shape {
    if variant == 0 {
        x.clone()
    } else {
        broadcast_partner(x, rng)
    }
}

fn generate<R: Rng + ?Sized>(
    kind: OpKind,
    variant: usize,
    x: &Shape,
    rng: &mut R,
) -> Option<Draft> {
    let ew = |e: ElementwiseOp| Op::Elementwise(e);
    let act = |a: ActivationOp| Op::Activation(a);
    let rank = x.rank();
    Some(match kind {
        K::Add | K::Sub | K::Mul => {
            let op = match kind {
                K::Add => E::Add(Add),
                K::Sub => E::Sub(Sub),
                _ => E::Mul(Mul),
            };
            let y = binary(variant, x, rng);
            (
                ew(op),
                vec![uniform(x, rng, -2.0, 2.0), uniform(&y, rng, -2.0, 2.0)],
            )
        }
        K::Div => {
            let y = binary(variant, x, rng);
            (
                ew(E::Div(Div)),
                vec![uniform(x, rng, -2.0, 2.0), signed(&y, rng, 0.5, 2.0)],
            )
        }
        K::Maximum | K::Minimum => {
            let op = if kind == K::Maximum {
                E::Maximum(Maximum)
            } else {
                E::Minimum(Minimum)
            };
            let y = binary(variant, x, rng);
            let odd = rng.random_bool(0.5);
            (ew(op), vec![grid(x, rng, odd), grid(&y, rng, !odd)])
        }
        K::Where => {
            let y = binary(variant, x, rng);
            let ab = tapegrad_tensor::kernels::broadcast_shape("where", x, &y).ok()?;
            let m = if variant == 0 {
                ab.clone()
            } else {
                broadcast_into(&ab, rng)
            };
            let bits = (0..m.numel()).map(|_| rng.random_bool(0.5)).collect();
            let mask = Mask::new(m.dims(), bits).ok()?;
            (
                ew(E::Where(Where { mask })),
                vec![uniform(x, rng, -2.0, 2.0), uniform(&y, rng, -2.0, 2.0)],
            )
        }
        K::Neg => (ew(E::Neg(Neg)), vec![uniform(x, rng, -2.0, 2.0)]),
        K::Scale => {
            let factor = [2.5, -0.5, 0.0][variant];
            (
                ew(E::Scale(Scale { factor })),
                vec![uniform(x, rng, -2.0, 2.0)],
            )
        }
        K::Abs => (ew(E::Abs(Abs)), vec![signed(x, rng, 0.1, 2.0)]),
        K::Sqrt => (ew(E::Sqrt(Sqrt)), vec![uniform(x, rng, 0.2, 3.0)]),
        K::Exp => (ew(E::Exp(Exp)), vec![uniform(x, rng, -2.0, 2.0)]),
        K::Log => (ew(E::Log(Log)), vec![uniform(x, rng, 0.2, 3.0)]),
        K::SafeLog => {
            let (eps, lo) = [(1e-3, 0.2), (0.5, -1.0)][variant];
            (
                ew(E::SafeLog(SafeLog { eps })),
                vec![away_from(x, rng, lo, 3.0, &[eps])],
            )
        }
        K::Sin => (ew(E::Sin(Sin)), vec![uniform(x, rng, -3.0, 3.0)]),
        K::Cos => (ew(E::Cos(Cos)), vec![uniform(x, rng, -3.0, 3.0)]),
        K::Pow => {
            let exponent = [2.0, 3.0, 0.5, -1.5, 0.0][variant];
            let base = if variant == 1 {
                uniform(x, rng, -2.0, 2.0)
            } else {
                uniform(x, rng, 0.2, 2.0)
            };
            (ew(E::Pow(Pow { exponent })), vec![base])
        }
        K::Clamp => {
            let (min, max) = [
                (Some(-0.5), Some(0.5)),
                (Some(0.0), None),
                (None, Some(1.0)),
            ][variant];
            let kinks: Vec<f64> = min.into_iter().chain(max).collect();
            (
                ew(E::Clamp(Clamp { min, max })),
                vec![away_from(x, rng, -2.0, 2.0, &kinks)],
            )
        }
        K::Relu => (
            act(A::Relu(Relu)),
            vec![away_from(x, rng, -2.0, 2.0, &[0.0])],
        ),
        K::LeakyRelu => {
            let negative_slope = [0.01, 0.2][variant];
            (
                act(A::LeakyRelu(LeakyRelu { negative_slope })),
                vec![away_from(x, rng, -2.0, 2.0, &[0.0])],
            )
        }
        K::Sigmoid => (act(A::Sigmoid(Sigmoid)), vec![uniform(x, rng, -4.0, 4.0)]),
        K::Tanh => (act(A::Tanh(Tanh)), vec![uniform(x, rng, -3.0, 3.0)]),
        K::Gelu => {
            let approximate = [GeluApproximate::None, GeluApproximate::Tanh][variant];
            (
                act(A::Gelu(Gelu { approximate })),
                vec![uniform(x, rng, -3.0, 3.0)],
            )
        }
        K::Softplus => {
            let (beta, threshold) = [(1.0, 20.0), (2.0, 1.0)][variant];
            (
                act(A::Softplus(Softplus { beta, threshold })),
                vec![away_from(x, rng, -3.0, 3.0, &[threshold / beta])],
            )
        }
        K::Silu => (act(A::Silu(Silu)), vec![uniform(x, rng, -3.0, 3.0)]),
        K::Sum | K::Mean | K::Amax | K::LogSumExp => {
            let (axes, keepdim) = match variant {
                0 => (None, false),
                1 => (None, true),
                2 => (Some(vec![]), false),
                3 if rank >= 1 => (Some(vec![0]), false),
                4 if rank >= 1 => (Some(vec![-1]), true),
                5 if rank >= 2 => (Some(vec![0, -1]), false),
                _ => return None,
            };
            let (op, value) = match kind {
                K::Sum => (Red::Sum(Sum { axes, keepdim }), uniform(x, rng, -2.0, 2.0)),
                K::Mean => (
                    Red::Mean(Mean { axes, keepdim }),
                    uniform(x, rng, -2.0, 2.0),
                ),
                K::LogSumExp => (
                    Red::LogSumExp(LogSumExp { axes, keepdim }),
                    uniform(x, rng, -3.0, 3.0),
                ),
                _ => (Red::Amax(Amax { axes, keepdim }), distinct(x, rng)),
            };
            (Op::Reduce(op), vec![value])
        }
        K::Softmax | K::LogSoftmax => {
            if rank == 0 {
                return None;
            }
            let axis = if variant == 0 { -1 } else { 0 };
            let op = if kind == K::Softmax {
                Red::Softmax(Softmax { axis })
            } else {
                Red::LogSoftmax(LogSoftmax { axis })
            };
            (Op::Reduce(op), vec![uniform(x, rng, -3.0, 3.0)])
        }
        K::Matmul => {
            let d = x.dims();
            let n = random_dim(rng);
            let y = match variant {
                0 if rank == 1 => shape(&[d[0]]),
                1 if rank >= 2 => shape(&[d[rank - 1]]),
                2 if rank == 1 => shape(&[d[0], n]),
                3 if rank == 2 => shape(&[d[1], n]),
                4 if rank >= 3 => {
                    let batch = broadcast_partner(&shape(&d[..rank - 2]), rng);
                    let mut dims = batch.dims().to_vec();
                    dims.extend([d[rank - 1], n]);
                    shape(&dims)
                }
                _ => return None,
            };
            (
                Op::Linalg(L::Matmul(Matmul)),
                vec![uniform(x, rng, -2.0, 2.0), uniform(&y, rng, -2.0, 2.0)],
            )
        }
        K::Linear => {
            if rank == 0 {
                return None;
            }
            let bias = variant == 0;
            let (outs, ins) = (random_dim(rng), x.dims()[rank - 1]);
            let mut inputs = vec![
                uniform(x, rng, -2.0, 2.0),
                uniform(&shape(&[outs, ins]), rng, -1.0, 1.0),
            ];
            if bias {
                inputs.push(uniform(&shape(&[outs]), rng, -1.0, 1.0));
            }
            (Op::Linalg(L::Linear(Linear { bias })), inputs)
        }
        K::Transpose => {
            let r = rank as isize;
            let (dim0, dim1) = match variant {
                0 if rank >= 2 => (r - 2, r - 1),
                1 if rank >= 2 => (-1, -r),
                2 if rank >= 1 => (0, 0),
                _ => return None,
            };
            (
                Op::Linalg(L::Transpose(Transpose { dim0, dim1 })),
                vec![uniform(x, rng, -2.0, 2.0)],
            )
        }
        K::Permute => {
            if variant == 1 && rank == 0 {
                return None;
            }
            let mut dims: Vec<isize> = (0..rank as isize).collect();
            for i in (1..rank).rev() {
                dims.swap(i, rng.random_range(0..=i));
            }
            if variant == 1 {
                dims.iter_mut().for_each(|a| *a -= rank as isize);
            }
            (
                Op::Linalg(L::Permute(Permute { dims })),
                vec![uniform(x, rng, -2.0, 2.0)],
            )
        }
        K::Reshape => {
            let n = x.numel();
            let divisors: Vec<usize> = (1..=n).filter(|d| n % d == 0).collect();
            let d = divisors[rng.random_range(0..divisors.len())];
            let target: Vec<isize> = match variant {
                0 => vec![-1],
                1 => vec![d as isize, -1],
                _ => vec![(n / d) as isize, 1, d as isize],
            };
            (
                Op::Structure(St::Reshape(Reshape { shape: target })),
                vec![uniform(x, rng, -2.0, 2.0)],
            )
        }
        K::Flatten => {
            let (start_dim, end_dim) = match variant {
                0 if rank >= 1 => (0, -1),
                1 if rank >= 2 => (1, -1),
                _ => return None,
            };
            (
                Op::Structure(St::Flatten(Flatten { start_dim, end_dim })),
                vec![uniform(x, rng, -2.0, 2.0)],
            )
        }
        K::BroadcastTo => {
            let mut dims: Vec<usize> = x.dims().to_vec();
            if variant == 0 {
                dims.insert(0, rng.random_range(2..=3));
            } else {
                if !dims.contains(&1) {
                    return None;
                }
                dims.iter_mut()
                    .filter(|d| **d == 1)
                    .for_each(|d| *d = rng.random_range(2..=3));
            }
            (
                Op::Structure(St::BroadcastTo(BroadcastTo { shape: dims })),
                vec![uniform(x, rng, -2.0, 2.0)],
            )
        }
        K::Concat => {
            if rank == 0 {
                return None;
            }
            let (parts, axis) = [(1, 0), (2, 0), (3, -1)][variant];
            let ax = if axis < 0 { rank - 1 } else { 0 };
            let mut inputs = vec![uniform(x, rng, -2.0, 2.0)];
            for _ in 1..parts {
                let other = with_dim(x, ax, rng.random_range(1..=3));
                inputs.push(uniform(&other, rng, -2.0, 2.0));
            }
            (Op::Structure(St::Concat(Concat { axis })), inputs)
        }
        K::Slice => {
            if rank == 0 {
                return None;
            }
            let (axis, start, end, step) = match variant {
                0 => {
                    let len = x.dims()[0];
                    (0, 0, rng.random_range(1..=len) as isize, 1)
                }
                1 => {
                    let len = x.dims()[rank - 1] as isize;
                    if len < 2 {
                        return None;
                    }
                    (-1, -len, -1, 2)
                }
                _ => {
                    let axis = rng.random_range(0..rank);
                    let len = x.dims()[axis];
                    let start = rng.random_range(0..len) as isize;
                    (
                        axis as isize,
                        start,
                        len as isize + 5,
                        rng.random_range(1..=2),
                    )
                }
            };
            (
                Op::Structure(St::Slice(Slice {
                    axis,
                    start,
                    end,
                    step,
                })),
                vec![uniform(x, rng, -2.0, 2.0)],
            )
        }
        K::MseLoss | K::BinaryCrossEntropyWithLogits => {
            if (variant == 3 || variant == 4) && x.rank() == 0 {
                return None; // a one-axis pos_weight needs a class axis
            }
            let reduction = [Reduction::Mean, Reduction::Sum, Reduction::None][variant % 3];
            let (op, target) = if kind == K::MseLoss {
                (
                    Lo::MseLoss(MseLoss { reduction }),
                    uniform(x, rng, -2.0, 2.0),
                )
            } else {
                let classes = if variant == 3 {
                    x.dims().last().copied().unwrap_or(1)
                } else {
                    1
                };
                let pos_weight = match variant {
                    3 | 4 => Some(Arc::new(vector(
                        (0..classes).map(|_| rng.random_range(0.25..4.0)).collect(),
                    ))),
                    5 => Some(Arc::new(uniform(&class_axis(x, rng), rng, 0.25, 4.0))),
                    _ => None,
                };
                let reduction = if variant == 5 {
                    Reduction::Sum
                } else {
                    reduction
                };
                (
                    Lo::BinaryCrossEntropyWithLogits(BinaryCrossEntropyWithLogits {
                        reduction,
                        pos_weight,
                        weight: None,
                    }),
                    uniform(x, rng, 0.0, 1.0),
                )
            };
            (Op::Loss(op), vec![uniform(x, rng, -3.0, 3.0), target])
        }
        K::CrossEntropy | K::NllLoss => {
            let (n, classes, reduction) = match (variant, x.dims()) {
                (0..=2, &[n, c]) => (
                    n,
                    c,
                    [Reduction::Mean, Reduction::Sum, Reduction::None][variant],
                ),
                (3, &[c]) => (1, c, Reduction::Sum),
                // The options need a second sample, counted while the first may be ignored.
                (4..=6, &[n, c]) if n >= 2 && c >= 1 => (
                    n,
                    c,
                    [Reduction::Mean, Reduction::Sum, Reduction::None][variant - 4],
                ),
                (9, &[n, c]) if n >= 2 && c >= 1 => (n, c, Reduction::Mean),
                // (N, C, d1, ..., dk): one label per position, two positions or more.
                (7 | 8, &[n, c, ref rest @ ..])
                    if !rest.is_empty() && n * rest.iter().product::<usize>() >= 2 && c >= 1 =>
                {
                    let spatial = if kind == K::CrossEntropy {
                        [Reduction::Mean, Reduction::None]
                    } else {
                        [Reduction::Sum, Reduction::Mean]
                    };
                    (n * rest.iter().product::<usize>(), c, spatial[variant - 7])
                }
                _ => return None,
            };
            let mut targets = labels(n, classes, rng);
            let weights = |rng: &mut R| {
                Some(Arc::new(
                    (0..classes).map(|_| rng.random_range(0.5..2.0)).collect(),
                ))
            };
            let (weight, ignore_index, label_smoothing) = match variant {
                4 => (weights(rng), None, 0.0),
                5 => {
                    // An ignored label needs no class: it may be out of range.
                    let ignored = i64::try_from(classes).unwrap_or(i64::MAX) + 3;
                    Arc::make_mut(&mut targets)[0] = ignored;
                    (None, Some(ignored), 0.1)
                }
                6 => (weights(rng), Some(targets[0]), 0.25),
                8 if kind == K::CrossEntropy => (weights(rng), Some(targets[0]), 0.25),
                8 => {
                    // The mean needs a counted position: only the first carries the ignored label.
                    let ignored = i64::try_from(classes).unwrap_or(i64::MAX) + 3;
                    Arc::make_mut(&mut targets)[0] = ignored;
                    (weights(rng), Some(ignored), 0.0)
                }
                9 => {
                    // PyTorch's default ignore_index on padding: the last sample is counted, the
                    // others are padding half the time.
                    let padded = Arc::make_mut(&mut targets);
                    let last = padded.len() - 1;
                    for t in &mut padded[..last] {
                        if rng.random_bool(0.5) {
                            *t = -100;
                        }
                    }
                    let smoothing = if kind == K::CrossEntropy { 0.1 } else { 0.0 };
                    (None, Some(-100), smoothing)
                }
                _ => (None, None, 0.0),
            };
            let op = if kind == K::CrossEntropy {
                Lo::CrossEntropy(CrossEntropy {
                    targets,
                    reduction,
                    weight,
                    ignore_index,
                    label_smoothing,
                })
            } else {
                Lo::NllLoss(NllLoss {
                    targets,
                    reduction,
                    weight,
                    ignore_index,
                })
            };
            (Op::Loss(op), vec![uniform(x, rng, -3.0, 3.0)])
        }
        K::CrossEntropyProbs => {
            let (reduction, options) = match (variant, rank) {
                (0..=2, 2) => (
                    [Reduction::Mean, Reduction::Sum, Reduction::None][variant],
                    false,
                ),
                (3, 1) => (Reduction::Sum, false),
                (4, 2) => (Reduction::Mean, true),
                (5, r) if r >= 3 => (Reduction::None, true),
                _ => return None,
            };
            let classes = x.dims()[usize::from(rank >= 2)];
            let (weight, label_smoothing) = if options {
                let w = (0..classes).map(|_| rng.random_range(0.5..2.0)).collect();
                (Some(Arc::new(w)), 0.2)
            } else {
                (None, 0.0)
            };
            let op = Lo::CrossEntropyProbs(CrossEntropyProbs {
                reduction,
                weight,
                label_smoothing,
            });
            // Targets need not sum to 1 (PyTorch does not ask it); the loss is smooth in both.
            (
                Op::Loss(op),
                vec![uniform(x, rng, -3.0, 3.0), uniform(x, rng, 0.0, 1.0)],
            )
        }
        K::WeightedBinaryCrossEntropyWithLogits => {
            let pos_weight = match (variant, x.dims().last()) {
                (2, None) => return None, // pos_weight needs a class axis
                (2, Some(&classes)) => Some(Arc::new(vector(
                    (0..classes).map(|_| rng.random_range(0.25..4.0)).collect(),
                ))),
                _ => None,
            };
            let w_shape = if variant == 0 {
                x.clone()
            } else {
                broadcast_into(x, rng)
            };
            let op = Lo::BinaryCrossEntropyWithLogits(BinaryCrossEntropyWithLogits {
                reduction: [Reduction::Mean, Reduction::Sum, Reduction::None][variant],
                pos_weight,
                weight: Some(Arc::new(uniform(&w_shape, rng, 0.25, 2.0))),
            });
            (
                Op::Loss(op),
                vec![uniform(x, rng, -3.0, 3.0), uniform(x, rng, 0.0, 1.0)],
            )
        }
        K::Nn(n) => return nn::generate(n, variant, x, rng),
    })
}

// ---------------------------------------------------------------------------------------------
// Generic points.

/// Whether `inputs` is a generic point of `op`: the forward pass succeeds, every argument and
/// result is finite and within `VALUE_BOUND`, and no element sits within `KINK_MARGIN` of a kink
/// or tie, nor within `DOMAIN_MARGIN` of a domain edge. Finite differences are exact to their
/// truncation error only at such points.
pub fn is_generic(op: &Op, inputs: &[&Tensor<f64>]) -> bool {
    let Ok(out) = op.forward(inputs) else {
        return false;
    };
    let bounded = |t: &Tensor<f64>| t.data().iter().all(|v| v.abs() <= VALUE_BOUND);
    if !inputs.iter().all(|t| bounded(t)) || !bounded(&out.value) {
        return false;
    }
    if out.value.numel() > MAX_NUMEL {
        return false;
    }
    let kind = op.kind();
    let all = |t: &Tensor<f64>, ok: &dyn Fn(f64) -> bool| t.data().iter().all(|&v| ok(v));
    let away = |t: &Tensor<f64>, k: f64| all(t, &|v| (v - k).abs() > KINK_MARGIN);
    let positive = |t: &Tensor<f64>| all(t, &|v| v > DOMAIN_MARGIN);
    match (kind, op) {
        (K::Div, _) => all(inputs[1], &|v| v.abs() > DOMAIN_MARGIN),
        (K::Abs | K::Relu | K::LeakyRelu, _) => away(inputs[0], 0.0),
        (K::Sqrt | K::Log, _) => positive(inputs[0]),
        (K::SafeLog, Op::Elementwise(E::SafeLog(SafeLog { eps }))) => {
            away(inputs[0], *eps) && all(inputs[0], &|v| v <= *eps || v > DOMAIN_MARGIN)
        }
        (K::Pow, Op::Elementwise(E::Pow(Pow { exponent }))) => {
            let whole = exponent.fract() == 0.0 && *exponent >= 0.0;
            whole || positive(inputs[0])
        }
        (K::Clamp, Op::Elementwise(E::Clamp(Clamp { min, max }))) => {
            min.is_none_or(|m| away(inputs[0], m)) && max.is_none_or(|m| away(inputs[0], m))
        }
        (K::Softplus, Op::Activation(A::Softplus(Softplus { beta, threshold }))) => {
            all(inputs[0], &|v| (v * beta - threshold).abs() > KINK_MARGIN)
        }
        (K::Maximum | K::Minimum, _) => {
            let shape = out.value.shape();
            match (
                broadcast_to(inputs[0], shape),
                broadcast_to(inputs[1], shape),
            ) {
                (Ok(a), Ok(b)) => a
                    .data()
                    .iter()
                    .zip(b.data())
                    .all(|(p, q)| (p - q).abs() > KINK_MARGIN),
                _ => false,
            }
        }
        (K::Amax, Op::Reduce(Red::Amax(Amax { axes, .. }))) => {
            no_near_ties(inputs[0], axes.as_deref())
        }
        (K::Nn(_), Op::Nn(op)) => nn::is_generic_nn(op, inputs),
        (
            K::Add
            | K::Sub
            | K::Mul
            | K::Neg
            | K::Scale
            | K::Exp
            | K::Sin
            | K::Cos
            | K::Where
            | K::Sigmoid
            | K::Tanh
            | K::Gelu
            | K::Silu
            | K::Sum
            | K::Mean
            | K::Softmax
            | K::LogSoftmax
            | K::LogSumExp
            | K::Matmul
            | K::Linear
            | K::Transpose
            | K::Permute
            | K::Reshape
            | K::Flatten
            | K::BroadcastTo
            | K::Concat
            | K::Slice
            | K::MseLoss
            | K::CrossEntropy
            | K::BinaryCrossEntropyWithLogits
            | K::NllLoss
            | K::CrossEntropyProbs
            | K::WeightedBinaryCrossEntropyWithLogits,
            _,
        ) => true,
        // A kind paired with an op of another kind cannot come from `Op::kind`.
        (K::SafeLog | K::Pow | K::Clamp | K::Softplus | K::Amax | K::Nn(_), _) => false,
    }
}

/// Whether, in every group `amax` reduces, the largest element beats the runner-up by more than
/// `KINK_MARGIN` (so the gradient does not jump between tied maxima under a small step).
fn no_near_ties(x: &Tensor<f64>, axes: Option<&[isize]>) -> bool {
    let rank = x.rank();
    let reduced: Vec<usize> = match axes {
        None => (0..rank).collect(),
        Some(a) => match normalize_axes("amax", a, rank) {
            Ok(a) => a,
            Err(_) => return false,
        },
    };
    let dims = x.dims();
    let strides = x.shape().strides();
    let mut groups: std::collections::HashMap<Vec<usize>, Vec<f64>> = Default::default();
    for (lin, &v) in x.data().iter().enumerate() {
        let key: Vec<usize> = (0..rank)
            .filter(|a| !reduced.contains(a))
            .map(|a| (lin / strides[a]) % dims[a])
            .collect();
        groups.entry(key).or_default().push(v);
    }
    groups.values().all(|vals| {
        let top = vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        vals.iter().filter(|&&v| v > top - KINK_MARGIN).count() == 1
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn every_kind_and_variant_has_a_case_with_its_label() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let cases = op_cases(&mut rng);
        for &kind in OpKind::ALL {
            for v in 0..variants(kind).len() {
                let label = case_label(kind, v);
                let case = cases.iter().find(|c| c.label == label);
                let case = case.unwrap_or_else(|| panic!("no case for {label}"));
                assert_eq!(case.op.kind(), kind, "{label}");
                assert_eq!(case.op.name(), kind.label(), "{label}");
            }
        }
    }

    #[test]
    fn no_near_ties_sees_ties_only_inside_reduced_groups() {
        // Rows [1, 2] and [0, 2]: the two 2s tie over everything and down the last column.
        let x = Tensor::from_f64(&[2, 2], &[1.0, 2.0, 0.0, 2.0]).unwrap();
        assert!(!no_near_ties(&x, None));
        assert!(!no_near_ties(&x, Some(&[0])));
        assert!(no_near_ties(&x, Some(&[1])));
        assert!(no_near_ties(&x, Some(&[])));
    }
}
