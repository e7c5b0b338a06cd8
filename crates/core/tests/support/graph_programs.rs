//! Shared helpers of the graph law tests: random straight-line programs over every implemented op,
//! random full seeds, and bit-level comparison of tensors.
//!
//! Programs come from two generators, alternating by case: the shared `laws::random_program`
//! (generic points, away from kinks and ties) and a local one that proposes an op with arguments
//! picked from earlier slots and keeps it when its forward gives finite, moderate values. The local
//! one does not avoid ties and kinks (`maximum(x, x)`, amax over broadcast or concatenated copies,
//! relu, abs and clamp anywhere), which the equality laws and adjointness must survive too; an op
//! family that is still a stub is skipped by both.

#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tapegrad_core::laws::{
    random_program as laws_random_program, Program, ProgramConfig, ProgramNode,
};
use tapegrad_core::ops::activation::{Gelu, LeakyRelu, Relu, Sigmoid, Silu, Softplus, Tanh};
use tapegrad_core::ops::elementwise::{
    Abs, Add, Clamp, Cos, Div, Exp, Log, Maximum, Minimum, Mul, Neg, Pow, SafeLog, Scale, Sin,
    Sqrt, Sub, Where,
};
use tapegrad_core::ops::linalg::{Linear, Matmul, Permute, Transpose};
use tapegrad_core::ops::loss::{BinaryCrossEntropyWithLogits, CrossEntropy, MseLoss, NllLoss};
use tapegrad_core::ops::reduce::{Amax, LogSoftmax, LogSumExp, Mean, Softmax, Sum};
use tapegrad_core::ops::structure::{BroadcastTo, Concat, Flatten, Reshape, Slice};
use tapegrad_core::ops::{
    ActivationOp, ElementwiseOp, GeluApproximate, LinalgOp, LossOp, Mask, Op, ReduceOp, Reduction,
    StructureOp,
};
use tapegrad_core::{Scalar, Shape, Tensor};
use tapegrad_tensor::kernels::broadcast_shape;

const INPUT_SHAPES: &[&[usize]] = &[&[2, 3], &[3], &[2, 1], &[1, 3], &[3, 2], &[], &[2, 3], &[4]];

fn random_tensor(rng: &mut ChaCha8Rng, dims: &[usize], lo: f64, hi: f64) -> Tensor<f64> {
    let n: usize = dims.iter().product();
    let data = (0..n).map(|_| rng.random_range(lo..hi)).collect();
    Tensor::new(dims, data).unwrap()
}

/// A random tensor of `shape` with elements in [-1, 1).
pub fn random_like<S: Scalar>(rng: &mut ChaCha8Rng, shape: &Shape) -> Tensor<S> {
    random_tensor(rng, shape.dims(), -1.0, 1.0).cast()
}

fn pick(
    rng: &mut ChaCha8Rng,
    vals: &[Tensor<f64>],
    ok: impl Fn(&Tensor<f64>) -> bool,
) -> Option<usize> {
    let candidates: Vec<usize> = (0..vals.len()).filter(|&i| ok(&vals[i])).collect();
    if candidates.is_empty() {
        None
    } else {
        Some(candidates[rng.random_range(0..candidates.len())])
    }
}

fn broadcasts(a: &Shape, b: &Shape) -> bool {
    broadcast_shape("test", a, b).is_ok()
}

fn all(t: &Tensor<f64>, p: impl Fn(f64) -> bool) -> bool {
    t.data().iter().all(|&v| p(v))
}

fn reduction(rng: &mut ChaCha8Rng) -> Reduction {
    [Reduction::Mean, Reduction::Sum, Reduction::None][rng.random_range(0..3)]
}

fn axes(rng: &mut ChaCha8Rng, rank: usize) -> Option<Vec<isize>> {
    if rng.random_bool(0.25) {
        return None;
    }
    let mut axes: Vec<isize> = (0..rank as isize)
        .filter(|_| rng.random_bool(0.5))
        .collect();
    if rng.random_bool(0.3) {
        axes = axes.into_iter().map(|a| a - rank as isize).collect();
    }
    Some(axes)
}

/// One proposed node: an op and its arguments, or `None` when no slot fits.
fn propose(rng: &mut ChaCha8Rng, v: &[Tensor<f64>]) -> Option<(Op, Vec<usize>)> {
    use ElementwiseOp as E;
    let any = |_: &Tensor<f64>| true;
    let ew = Op::Elementwise;
    // The unary kind holds 17 ops, so it is drawn more often than the others.
    let kind = rng.random_range(0..24);
    Some(match if kind >= 18 { 3 } else { kind } {
        0 => {
            let a = pick(rng, v, any)?;
            let b = pick(rng, v, |t| broadcasts(v[a].shape(), t.shape()))?;
            let op = [
                E::Add(Add),
                E::Sub(Sub),
                E::Mul(Mul),
                E::Maximum(Maximum),
                E::Minimum(Minimum),
            ][rng.random_range(0..5)]
            .clone();
            (ew(op), vec![a, b])
        }
        1 => {
            let a = pick(rng, v, any)?;
            let b = pick(rng, v, |t| {
                broadcasts(v[a].shape(), t.shape()) && all(t, |x| x.abs() > 0.2)
            })?;
            (ew(E::Div(Div)), vec![a, b])
        }
        2 => {
            let a = pick(rng, v, any)?;
            let b = pick(rng, v, |t| broadcasts(v[a].shape(), t.shape()))?;
            let base = if rng.random_bool(0.5) {
                v[a].shape()
            } else {
                v[b].shape()
            };
            let data = (0..base.numel()).map(|_| rng.random_bool(0.5)).collect();
            let mask = Mask::new(base.dims(), data).unwrap();
            (ew(E::Where(Where { mask })), vec![a, b])
        }
        3 => {
            let a = pick(rng, v, any)?;
            let lo = rng.random_range(-1.0..0.0);
            let op = match rng.random_range(0..17) {
                0 => ew(E::Neg(Neg)),
                1 => ew(E::Scale(Scale {
                    factor: rng.random_range(-2.0..2.0),
                })),
                2 => ew(E::Abs(Abs)),
                3 => ew(E::Sin(Sin)),
                4 => ew(E::Cos(Cos)),
                5 => ew(E::Clamp(Clamp {
                    min: Some(lo),
                    max: Some(lo + rng.random_range(0.1..1.5)),
                })),
                6 => ew(E::SafeLog(SafeLog { eps: 1e-3 })),
                7 => ew(E::Pow(Pow {
                    exponent: [2.0, 3.0][rng.random_range(0..2)],
                })),
                8 => Op::Activation(ActivationOp::Relu(Relu)),
                9 => Op::Activation(ActivationOp::LeakyRelu(LeakyRelu {
                    negative_slope: 0.1,
                })),
                10 => Op::Activation(ActivationOp::Sigmoid(Sigmoid)),
                11 => Op::Activation(ActivationOp::Tanh(Tanh)),
                12 => Op::Activation(ActivationOp::Gelu(Gelu {
                    approximate: GeluApproximate::None,
                })),
                13 => Op::Activation(ActivationOp::Gelu(Gelu {
                    approximate: GeluApproximate::Tanh,
                })),
                14 => Op::Activation(ActivationOp::Softplus(Softplus {
                    beta: 1.0,
                    threshold: 20.0,
                })),
                15 => Op::Activation(ActivationOp::Silu(Silu)),
                _ => ew(E::Clamp(Clamp {
                    min: None,
                    max: Some(lo),
                })),
            };
            (op, vec![a])
        }
        4 => {
            let a = pick(rng, v, |t| all(t, |x| x > 0.05))?;
            let op = [
                E::Sqrt(Sqrt),
                E::Log(Log),
                E::Pow(Pow { exponent: 0.5 }),
                E::Pow(Pow { exponent: 1.5 }),
            ][rng.random_range(0..4)]
            .clone();
            (ew(op), vec![a])
        }
        5 => (
            ew(E::Exp(Exp)),
            vec![pick(rng, v, |t| all(t, |x| x.abs() < 3.0))?],
        ),
        6 => (
            ew(E::Pow(Pow { exponent: -1.0 })),
            vec![pick(rng, v, |t| all(t, |x| x.abs() > 0.2))?],
        ),
        7 => {
            let a = pick(rng, v, any)?;
            let (axes, keepdim) = (axes(rng, v[a].rank()), rng.random_bool(0.5));
            let op = match rng.random_range(0..4) {
                0 => ReduceOp::Sum(Sum { axes, keepdim }),
                1 => ReduceOp::Mean(Mean { axes, keepdim }),
                2 => ReduceOp::Amax(Amax { axes, keepdim }),
                _ => ReduceOp::LogSumExp(LogSumExp { axes, keepdim }),
            };
            (Op::Reduce(op), vec![a])
        }
        8 => {
            let a = pick(rng, v, |t| t.rank() >= 1)?;
            let r = v[a].rank() as i64;
            let axis = rng.random_range(-r..r) as isize;
            let op = if rng.random_bool(0.5) {
                ReduceOp::Softmax(Softmax { axis })
            } else {
                ReduceOp::LogSoftmax(LogSoftmax { axis })
            };
            (Op::Reduce(op), vec![a])
        }
        9 => {
            let a = pick(rng, v, |t| (1..=2).contains(&t.rank()))?;
            let k = *v[a].dims().last()?;
            let b = pick(rng, v, |t| (1..=2).contains(&t.rank()) && t.dims()[0] == k)?;
            (Op::Linalg(LinalgOp::Matmul(Matmul)), vec![a, b])
        }
        10 => {
            let x = pick(rng, v, |t| t.rank() == 2)?;
            let k = v[x].dims()[1];
            let w = pick(rng, v, |t| t.rank() == 2 && t.dims()[1] == k)?;
            let m = v[w].dims()[0];
            match pick(rng, v, |t| t.dims() == [m]) {
                Some(b) if rng.random_bool(0.7) => (
                    Op::Linalg(LinalgOp::Linear(Linear { bias: true })),
                    vec![x, w, b],
                ),
                _ => (
                    Op::Linalg(LinalgOp::Linear(Linear { bias: false })),
                    vec![x, w],
                ),
            }
        }
        11 => {
            let a = pick(rng, v, |t| t.rank() >= 2)?;
            let r = v[a].rank();
            let op = if rng.random_bool(0.5) {
                LinalgOp::Transpose(Transpose {
                    dim0: 0,
                    dim1: (r - 1) as isize,
                })
            } else {
                let mut dims: Vec<isize> = (0..r as isize).collect();
                dims.reverse();
                LinalgOp::Permute(Permute { dims })
            };
            (Op::Linalg(op), vec![a])
        }
        12 => {
            let a = pick(rng, v, |t| t.rank() >= 1)?;
            let n = v[a].numel() as isize;
            let op = match rng.random_range(0..3) {
                0 => StructureOp::Reshape(Reshape { shape: vec![-1] }),
                1 => StructureOp::Reshape(Reshape { shape: vec![1, n] }),
                _ => StructureOp::Flatten(Flatten {
                    start_dim: 0,
                    end_dim: -1,
                }),
            };
            (Op::Structure(op), vec![a])
        }
        13 => {
            let a = pick(rng, v, any)?;
            let mut shape: Vec<usize> = v[a]
                .dims()
                .iter()
                .map(|&d| if d == 1 { 2 } else { d })
                .collect();
            if rng.random_bool(0.5) {
                shape.insert(0, 2);
            }
            (
                Op::Structure(StructureOp::BroadcastTo(BroadcastTo { shape })),
                vec![a],
            )
        }
        14 => {
            let a = pick(rng, v, |t| t.rank() >= 1)?;
            let b = pick(rng, v, |t| t.shape() == v[a].shape())?;
            (
                Op::Structure(StructureOp::Concat(Concat { axis: 0 })),
                vec![a, b, a],
            )
        }
        15 => {
            let a = pick(rng, v, |t| t.rank() >= 1 && t.dims()[0] >= 2)?;
            let d = v[a].dims()[0] as isize;
            let start = rng.random_range(0..d as i64 - 1) as isize;
            let op = StructureOp::Slice(Slice {
                axis: 0,
                start,
                end: d,
                step: rng.random_range(1..3),
            });
            (Op::Structure(op), vec![a])
        }
        16 => {
            let a = pick(rng, v, any)?;
            let b = pick(rng, v, |t| t.shape() == v[a].shape())?;
            let op = if rng.random_bool(0.5) {
                LossOp::MseLoss(MseLoss {
                    reduction: reduction(rng),
                })
            } else {
                // Now and then PyTorch's pos_weight and weight, of any shape that broadcasts into
                // the input's ([C] along the last axis, [C, 1, 1], 0-d, ...).
                let dims = v[a].dims().to_vec();
                LossOp::BinaryCrossEntropyWithLogits(BinaryCrossEntropyWithLogits {
                    reduction: reduction(rng),
                    pos_weight: rng.random_bool(0.3).then(|| broadcast_factor(rng, &dims)),
                    weight: rng.random_bool(0.3).then(|| broadcast_factor(rng, &dims)),
                })
            };
            (Op::Loss(op), vec![a, b])
        }
        _ => {
            let a = pick(rng, v, |t| t.rank() == 2)?;
            let (n, c) = (v[a].dims()[0], v[a].dims()[1]);
            let c = i64::try_from(c).ok()?;
            let mut targets: Vec<i64> = (0..n).map(|_| rng.random_range(0..c)).collect();
            // PyTorch's options now and then: positive class weights, and the first of two or
            // more samples ignored under a label out of range (so one is still counted).
            let weight = rng
                .random_bool(0.3)
                .then(|| Arc::new((0..c).map(|_| rng.random_range(0.5..2.0)).collect()));
            let ignore_index = (n >= 2 && rng.random_bool(0.3)).then(|| {
                targets[0] = c + 1;
                c + 1
            });
            let targets = Arc::new(targets);
            let op = if rng.random_bool(0.5) {
                LossOp::CrossEntropy(CrossEntropy {
                    targets,
                    reduction: reduction(rng),
                    weight,
                    ignore_index,
                    label_smoothing: if rng.random_bool(0.3) { 0.2 } else { 0.0 },
                })
            } else {
                LossOp::NllLoss(NllLoss {
                    targets,
                    reduction: reduction(rng),
                    weight,
                    ignore_index,
                })
            };
            (Op::Loss(op), vec![a])
        }
    })
}

/// A loss factor whose shape broadcasts into `dims`: a random number of trailing axes, each
/// either the input's or 1, with values in [0.5, 3).
fn broadcast_factor(rng: &mut ChaCha8Rng, dims: &[usize]) -> Arc<Tensor<f64>> {
    let rank = rng.random_range(0..=dims.len());
    let shape: Vec<usize> = dims[dims.len() - rank..]
        .iter()
        .map(|&d| if rng.random_bool(0.5) { d } else { 1 })
        .collect();
    let values = (0..shape.iter().product::<usize>())
        .map(|_| rng.random_range(0.5..3.0))
        .collect();
    Arc::new(Tensor::new(&shape, values).unwrap())
}

/// The program of test case `case`: from the shared generator for even cases (at most `nodes`
/// nodes), from the local one (with ties and kinks, exactly `nodes` nodes) for odd ones.
pub fn random_program(case: u64, nodes: usize) -> Program {
    if case % 2 == 0 {
        generic_program(case, nodes)
    } else {
        program_with_ties(case, nodes)
    }
}

/// A program at a generic point of every node, from `laws::random_program`.
pub fn generic_program(case: u64, nodes: usize) -> Program {
    let mut rng = ChaCha8Rng::seed_from_u64(case);
    let config = ProgramConfig {
        max_nodes: nodes,
        ..ProgramConfig::default()
    };
    laws_random_program(&mut rng, &config)
}

/// A program with `nodes` nodes (fewer only if proposals keep failing), its inputs in
/// [-1.5, 1.5) and every value finite and below 1e4 in magnitude.
pub fn program_with_ties(seed: u64, nodes: usize) -> Program {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n_inputs = rng.random_range(2..=4);
    let mut inputs = Vec::new();
    let mut requires_grad = Vec::new();
    for i in 0..n_inputs {
        let dims = INPUT_SHAPES[rng.random_range(0..INPUT_SHAPES.len())];
        inputs.push(random_tensor(&mut rng, dims, -1.5, 1.5));
        requires_grad.push(i == 0 || rng.random_bool(0.75));
    }
    let mut values = inputs.clone();
    let mut program_nodes = Vec::new();
    for _ in 0..nodes * 20 {
        if program_nodes.len() == nodes {
            break;
        }
        let Some((op, args)) = propose(&mut rng, &values) else {
            continue;
        };
        let refs: Vec<&Tensor<f64>> = args.iter().map(|&a| &values[a]).collect();
        match op.forward(&refs) {
            Ok(f) if f.value.numel() > 0 && all(&f.value, |x| x.is_finite() && x.abs() < 1e4) => {
                values.push(f.value);
                program_nodes.push(ProgramNode { op, args });
            }
            _ => {}
        }
    }
    Program {
        inputs,
        requires_grad,
        nodes: program_nodes,
    }
}

/// The program's inputs in `S`.
pub fn inputs<S: Scalar>(p: &Program) -> Vec<Tensor<S>> {
    p.inputs.iter().map(|t| t.cast()).collect()
}

/// A random seed for every slot of shapes `shapes`, some slots zero.
pub fn random_seed<S: Scalar>(rng: &mut ChaCha8Rng, shapes: &[&Shape]) -> Vec<Tensor<S>> {
    shapes
        .iter()
        .map(|s| {
            if rng.random_bool(0.3) {
                Tensor::zeros(s)
            } else {
                random_like(rng, s)
            }
        })
        .collect()
}

/// Whether two tensors have the same shape and identical element bits.
pub fn same_bits<S: Scalar>(a: &Tensor<S>, b: &Tensor<S>) -> bool {
    a.shape() == b.shape()
        && a.data()
            .iter()
            .zip(b.data())
            .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
}

/// Every op name that appears in the programs of seeds `0..n` (to show the tests' coverage).
pub fn ops_covered(n: u64, nodes: usize) -> std::collections::BTreeSet<&'static str> {
    (0..n)
        .flat_map(|s| {
            random_program(s, nodes)
                .nodes
                .into_iter()
                .map(|n| n.op.name())
        })
        .collect()
}
