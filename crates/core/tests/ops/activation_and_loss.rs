//! Activation and loss ops: gradient and adjoint checks at random generic points for every variant,
//! hand-computed forward values, f32 against f64, error cases, zero-preservation and overflow.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tapegrad_core::laws::{check_op, op_vjp, Tolerance};
use tapegrad_core::ops::activation::{Gelu, LeakyRelu, Relu, Sigmoid, Silu, Softplus, Tanh};
use tapegrad_core::ops::loss::MseLoss;
use tapegrad_core::ops::{ActivationOp, GeluApproximate, LossOp, OpRules, Reduction, Saved, Saves};
use tapegrad_core::{Op, OpError, Shape, Tensor};

const REDUCTIONS: [Reduction; 3] = [Reduction::None, Reduction::Mean, Reduction::Sum];

fn act(a: ActivationOp) -> Op {
    Op::Activation(a)
}

fn loss(l: LossOp) -> Op {
    Op::Loss(l)
}

fn t64(dims: &[usize], data: &[f64]) -> Tensor<f64> {
    Tensor::from_f64(dims, data).unwrap()
}

/// Every activation variant with the points where it is not differentiable (or, for softplus
/// with a small threshold, where it jumps), which random points keep clear of.
fn activations() -> Vec<(Op, Vec<f64>)> {
    vec![
        (act(ActivationOp::Relu(Relu)), vec![0.0]),
        (
            act(ActivationOp::LeakyRelu(LeakyRelu {
                negative_slope: 0.01,
            })),
            vec![0.0],
        ),
        (
            act(ActivationOp::LeakyRelu(LeakyRelu {
                negative_slope: 0.2,
            })),
            vec![0.0],
        ),
        (
            act(ActivationOp::LeakyRelu(LeakyRelu {
                negative_slope: -1.5,
            })),
            vec![0.0],
        ),
        (act(ActivationOp::Sigmoid(Sigmoid)), vec![]),
        (act(ActivationOp::Tanh(Tanh)), vec![]),
        (
            act(ActivationOp::Gelu(Gelu {
                approximate: GeluApproximate::None,
            })),
            vec![],
        ),
        (
            act(ActivationOp::Gelu(Gelu {
                approximate: GeluApproximate::Tanh,
            })),
            vec![],
        ),
        (
            act(ActivationOp::Softplus(Softplus {
                beta: 1.0,
                threshold: 20.0,
            })),
            vec![],
        ),
        // beta * x crosses the threshold at x = 0.5 inside the sampled range.
        (
            act(ActivationOp::Softplus(Softplus {
                beta: 2.0,
                threshold: 1.0,
            })),
            vec![0.5],
        ),
        (
            act(ActivationOp::Softplus(Softplus {
                beta: 0.5,
                threshold: 20.0,
            })),
            vec![],
        ),
        (
            act(ActivationOp::Softplus(Softplus {
                beta: -1.0,
                threshold: 1.0,
            })),
            vec![-1.0],
        ),
        (act(ActivationOp::Silu(Silu)), vec![]),
    ]
}

fn labelled(targets: Vec<usize>, reduction: Reduction, ce: bool) -> Op {
    let targets = Arc::new(targets);
    loss(if ce {
        LossOp::cross_entropy(targets, reduction)
    } else {
        LossOp::nll_loss(targets, reduction)
    })
}

/// Uniform values in `lo..hi`, each at least 0.01 away from every point in `avoid`.
fn random(rng: &mut ChaCha8Rng, dims: &[usize], lo: f64, hi: f64, avoid: &[f64]) -> Tensor<f64> {
    let n: usize = dims.iter().product();
    let data = (0..n)
        .map(|_| loop {
            let v = rng.random_range(lo..hi);
            if avoid.iter().all(|k| (v - k).abs() > 0.01) {
                break v;
            }
        })
        .collect::<Vec<_>>();
    t64(dims, &data)
}

/// Runs the finite-difference and adjoint checks with a random seed and random tangents.
fn assert_laws(op: &Op, inputs: &[Tensor<f64>], rng: &mut ChaCha8Rng) {
    let shapes: Vec<&Shape> = inputs.iter().map(|t| t.shape()).collect();
    let out = op.output_shape(&shapes).unwrap();
    let seed = random(rng, out.dims(), -1.0, 1.0, &[]);
    let tangents: Vec<Tensor<f64>> = inputs
        .iter()
        .map(|x| random(rng, x.dims(), -1.0, 1.0, &[]))
        .collect();
    let report = check_op(op, inputs, &seed, &tangents, 1e-6, Tolerance::default()).unwrap();
    assert!(
        report.passed,
        "{op} at {inputs:?}, seed {seed:?}: {report:?}"
    );
}

const ACT_SHAPES: [&[usize]; 7] = [&[], &[1], &[5], &[3, 4], &[2, 3, 2], &[0], &[3, 0]];
const PAIR_SHAPES: [&[usize]; 6] = [&[], &[1], &[4], &[2, 3], &[0], &[2, 0]];
/// (N, C) inputs, or (C) for a single sample; zero rows included.
const CLASS_SHAPES: [&[usize]; 8] = [
    &[4],
    &[1],
    &[3, 4],
    &[5, 2],
    &[2, 1],
    &[1, 3],
    &[0, 3],
    &[0, 0],
];

fn random_labels(rng: &mut ChaCha8Rng, dims: &[usize]) -> Vec<usize> {
    let (n, c) = match *dims {
        [c] => (1, c),
        [n, c] => (n, c),
        _ => unreachable!(),
    };
    (0..n).map(|_| rng.random_range(0..c)).collect()
}

#[test]
fn activations_pass_gradient_and_adjoint_checks() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for (op, kinks) in activations() {
        for dims in ACT_SHAPES {
            for _ in 0..3 {
                let x = random(&mut rng, dims, -3.0, 3.0, &kinks);
                assert_laws(&op, &[x], &mut rng);
            }
        }
    }
}

#[test]
fn elementwise_losses_pass_gradient_and_adjoint_checks() {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    for reduction in REDUCTIONS {
        for op in [
            loss(LossOp::MseLoss(MseLoss { reduction })),
            loss(LossOp::bce_with_logits(reduction)),
        ] {
            for dims in PAIR_SHAPES {
                for _ in 0..3 {
                    let x = random(&mut rng, dims, -3.0, 3.0, &[]);
                    let y = random(&mut rng, dims, -0.5, 1.5, &[]);
                    assert_laws(&op, &[x, y], &mut rng);
                }
            }
        }
    }
}

#[test]
fn class_losses_pass_gradient_and_adjoint_checks() {
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    for reduction in REDUCTIONS {
        for ce in [true, false] {
            for dims in CLASS_SHAPES {
                for _ in 0..3 {
                    let labels = random_labels(&mut rng, dims);
                    let op = labelled(labels, reduction, ce);
                    let lo = if ce { -3.0 } else { -6.0 };
                    let x = random(&mut rng, dims, lo, if ce { 3.0 } else { 0.0 }, &[]);
                    assert_laws(&op, &[x], &mut rng);
                }
            }
        }
    }
}

fn fwd(op: &Op, inputs: &[&Tensor<f64>]) -> Vec<f64> {
    op.forward(inputs).unwrap().value.to_f64_vec()
}

fn assert_close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-15 * w.abs().max(1.0),
            "{got:?} vs {want:?}"
        );
    }
}

#[test]
fn activation_forward_values() {
    let x = t64(&[5], &[-1.5, -1.0, 0.0, 0.5, 1.0]);
    let cases: Vec<(ActivationOp, Vec<f64>)> = vec![
        (ActivationOp::Relu(Relu), vec![0.0, 0.0, 0.0, 0.5, 1.0]),
        (
            ActivationOp::LeakyRelu(LeakyRelu {
                negative_slope: 0.1,
            }),
            vec![-0.15000000000000002, -0.1, 0.0, 0.5, 1.0],
        ),
        (
            ActivationOp::Sigmoid(Sigmoid),
            vec![
                0.18242552380635635,
                0.2689414213699951,
                0.5,
                0.6224593312018546,
                0.7310585786300049,
            ],
        ),
        (
            ActivationOp::Tanh(Tanh),
            vec![
                -0.9051482536448664,
                -0.7615941559557649,
                0.0,
                0.46211715726000974,
                0.7615941559557649,
            ],
        ),
        (
            ActivationOp::Gelu(Gelu {
                approximate: GeluApproximate::None,
            }),
            vec![
                -0.10021080190328713,
                -0.15865525393145707,
                0.0,
                0.34573123063700656,
                0.8413447460685429,
            ],
        ),
        (
            ActivationOp::Gelu(Gelu {
                approximate: GeluApproximate::Tanh,
            }),
            vec![
                -0.10042842301976707,
                -0.15880800939172324,
                0.0,
                0.34571400982514394,
                0.8411919906082768,
            ],
        ),
        (
            ActivationOp::Softplus(Softplus {
                beta: 1.0,
                threshold: 20.0,
            }),
            vec![
                0.2014132779827524,
                0.31326168751822286,
                std::f64::consts::LN_2,
                0.9740769841801067,
                1.3132616875182228,
            ],
        ),
        (
            ActivationOp::Silu(Silu),
            vec![
                -0.2736382857095345,
                -0.2689414213699951,
                0.0,
                0.3112296656009273,
                0.7310585786300049,
            ],
        ),
    ];
    for (a, want) in cases {
        let op = act(a);
        let got = fwd(&op, &[&x]);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 4e-16, "{op}: {got:?} vs {want:?}");
        }
    }
    // softplus above beta * x > threshold is the identity; below, log1p(exp(beta x)) / beta.
    let sp = act(ActivationOp::Softplus(Softplus {
        beta: 2.0,
        threshold: 1.0,
    }));
    let got = fwd(&sp, &[&t64(&[3], &[0.5, 0.75, 30.0])]);
    assert_close(&got, &[0.6566308437591114, 0.75, 30.0]);
}

#[test]
fn activation_gradient_conventions_at_kinks() {
    let x = t64(&[3], &[-2.0, 0.0, 3.0]);
    let ones = Tensor::ones(x.shape());
    let grad =
        |a: ActivationOp, x: &Tensor<f64>| op_vjp(&act(a), &[x], &ones).unwrap()[0].to_f64_vec();
    // PyTorch: relu'(0) = 0, leaky_relu'(0) = negative_slope.
    assert_eq!(grad(ActivationOp::Relu(Relu), &x), vec![0.0, 0.0, 1.0]);
    assert_eq!(
        grad(
            ActivationOp::LeakyRelu(LeakyRelu {
                negative_slope: 0.25
            }),
            &x
        ),
        vec![0.25, 0.25, 1.0]
    );
    // softplus: sigmoid(beta x) below the threshold, exactly 1 above it.
    let g = grad(
        ActivationOp::Softplus(Softplus {
            beta: 2.0,
            threshold: 1.0,
        }),
        &t64(&[3], &[0.0, 0.25, 0.75]),
    );
    assert_close(&g, &[0.5, 0.6224593312018546, 1.0]);
    // sigmoid'(0) = 1/4, tanh'(0) = 1, gelu'(0) = 1/2, silu'(0) = 1/2.
    let z = t64(&[1], &[0.0]);
    let one = Tensor::ones(z.shape());
    let at0 = |a: ActivationOp| op_vjp(&act(a), &[&z], &one).unwrap()[0].to_f64_vec()[0];
    assert_eq!(at0(ActivationOp::Sigmoid(Sigmoid)), 0.25);
    assert_eq!(at0(ActivationOp::Tanh(Tanh)), 1.0);
    assert_eq!(
        at0(ActivationOp::Gelu(Gelu {
            approximate: GeluApproximate::None
        })),
        0.5
    );
    assert_eq!(
        at0(ActivationOp::Gelu(Gelu {
            approximate: GeluApproximate::Tanh
        })),
        0.5
    );
    assert_eq!(at0(ActivationOp::Silu(Silu)), 0.5);
}

#[test]
fn loss_forward_values() {
    let x = t64(&[3], &[1.0, 2.0, 3.0]);
    let y = t64(&[3], &[1.0, 0.0, 0.0]);
    let mse = |reduction| fwd(&loss(LossOp::MseLoss(MseLoss { reduction })), &[&x, &y]);
    assert_eq!(mse(Reduction::None), vec![0.0, 4.0, 9.0]);
    assert_eq!(mse(Reduction::Sum), vec![13.0]);
    assert_eq!(mse(Reduction::Mean), vec![13.0 / 3.0]);

    // bce at x = 0 is ln 2 whatever the target; x = ln 3 with y = 1 is -ln(3/4).
    let bx = t64(&[3], &[0.0, 0.0, 3f64.ln()]);
    let by = t64(&[3], &[0.0, 0.7, 1.0]);
    let bce = |reduction| fwd(&loss(LossOp::bce_with_logits(reduction)), &[&bx, &by]);
    let ln2 = std::f64::consts::LN_2;
    let l3 = (4.0f64 / 3.0).ln();
    assert_close(&bce(Reduction::None), &[ln2, ln2, l3]);
    assert_close(&bce(Reduction::Sum), &[2.0 * ln2 + l3]);
    assert_close(&bce(Reduction::Mean), &[(2.0 * ln2 + l3) / 3.0]);

    // Uniform logits: every sample's cross entropy is ln C.
    let logits = t64(&[2, 4], &[0.5; 8]);
    let ln4 = 4f64.ln();
    let ce = |labels: Vec<usize>, reduction, x: &Tensor<f64>| {
        fwd(&labelled(labels, reduction, true), &[x])
    };
    assert_close(&ce(vec![0, 3], Reduction::None, &logits), &[ln4, ln4]);
    assert_close(&ce(vec![0, 3], Reduction::Sum, &logits), &[2.0 * ln4]);
    assert_close(&ce(vec![0, 3], Reduction::Mean, &logits), &[ln4]);
    // Logits (0, ln 3): probabilities (1/4, 3/4).
    let two = t64(&[2], &[0.0, 3f64.ln()]);
    let got = op_single(&labelled(vec![0], Reduction::None, true), &two);
    assert_eq!(got.shape(), &Shape::scalar());
    assert_close(&got.to_f64_vec(), &[ln4]);
    assert_close(&ce(vec![1], Reduction::Mean, &two), &[l3]);

    let lp = t64(&[2, 3], &[-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]);
    let nll = |reduction| fwd(&labelled(vec![2, 0], reduction, false), &[&lp]);
    assert_eq!(nll(Reduction::None), vec![3.0, 4.0]);
    assert_eq!(nll(Reduction::Sum), vec![7.0]);
    assert_eq!(nll(Reduction::Mean), vec![3.5]);
    let single = op_single(
        &labelled(vec![1], Reduction::None, false),
        &t64(&[3], &[-1.0, -2.0, -3.0]),
    );
    assert_eq!(single.shape(), &Shape::scalar());
    assert_eq!(single.to_f64_vec(), vec![2.0]);
}

fn op_single(op: &Op, x: &Tensor<f64>) -> Tensor<f64> {
    op.forward(&[x]).unwrap().value
}

#[test]
fn class_loss_gradients_match_hand_computation() {
    // Uniform logits, C = 4, N = 2, mean: (1/4 - onehot) / 2.
    let logits = t64(&[2, 4], &[0.5; 8]);
    let op = labelled(vec![1, 3], Reduction::Mean, true);
    let g = op_vjp(&op, &[&logits], &Tensor::scalar(1.0)).unwrap();
    assert_close(
        &g[0].to_f64_vec(),
        &[0.125, -0.375, 0.125, 0.125, 0.125, 0.125, 0.125, -0.375],
    );
    let op = labelled(vec![1, 3], Reduction::None, false);
    let g = op_vjp(&op, &[&logits], &t64(&[2], &[2.0, -3.0])).unwrap();
    assert_eq!(
        g[0].to_f64_vec(),
        vec![0.0, -2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0]
    );
    // mse mean: 2 (x - y) / numel; bce: (sigmoid(x) - y, -x) per element.
    let x = t64(&[2], &[1.0, 0.0]);
    let y = t64(&[2], &[0.0, 0.25]);
    let g = op_vjp(
        &loss(LossOp::MseLoss(MseLoss {
            reduction: Reduction::Mean,
        })),
        &[&x, &y],
        &Tensor::scalar(1.0),
    )
    .unwrap();
    assert_eq!(g[0].to_f64_vec(), vec![1.0, -0.25]);
    assert_eq!(g[1].to_f64_vec(), vec![-1.0, 0.25]);
    let g = op_vjp(
        &loss(LossOp::bce_with_logits(Reduction::Sum)),
        &[&x, &y],
        &Tensor::scalar(2.0),
    )
    .unwrap();
    assert_close(&g[0].to_f64_vec(), &[2.0 * 0.7310585786300049, 2.0 * 0.25]);
    assert_eq!(g[1].to_f64_vec(), vec![-2.0, 0.0]);
}

#[test]
fn empty_batches_follow_pytorch() {
    // Mean over no elements is NaN (0/0), sum is 0, none is an empty tensor.
    let empty = t64(&[0, 3], &[]);
    for ce in [true, false] {
        let mean = fwd(&labelled(vec![], Reduction::Mean, ce), &[&empty]);
        assert!(mean[0].is_nan());
        assert_eq!(
            fwd(&labelled(vec![], Reduction::Sum, ce), &[&empty]),
            vec![0.0]
        );
        let none = op_single(&labelled(vec![], Reduction::None, ce), &empty);
        assert_eq!(none.dims(), &[0]);
    }
    let e = t64(&[2, 0], &[]);
    let mean = fwd(
        &loss(LossOp::MseLoss(MseLoss {
            reduction: Reduction::Mean,
        })),
        &[&e, &e],
    );
    assert!(mean[0].is_nan());
}

/// The same random point evaluated in f32 and in f64 (from the f32 values widened).
fn assert_f32_matches_f64(op: &Op, inputs: &[Tensor<f32>]) {
    let wide: Vec<Tensor<f64>> = inputs.iter().map(|t| t.cast()).collect();
    let narrow_refs: Vec<&Tensor<f32>> = inputs.iter().collect();
    let wide_refs: Vec<&Tensor<f64>> = wide.iter().collect();
    let a = op.forward(&narrow_refs).unwrap().value;
    let b = op.forward(&wide_refs).unwrap().value;
    for (x, y) in a.data().iter().zip(b.data()) {
        let (x, y) = (*x as f64, *y);
        assert!(
            (x - y).abs() <= 1e-5 * y.abs(),
            "{op}: f32 {x} vs f64 {y} at {inputs:?}"
        );
    }
}

#[test]
fn f32_forward_agrees_with_f64() {
    let mut rng = ChaCha8Rng::seed_from_u64(14);
    let r32 = |rng: &mut ChaCha8Rng, dims: &[usize], lo: f64, hi: f64, avoid: &[f64]| {
        random(rng, dims, lo, hi, avoid).cast::<f32>()
    };
    for (op, kinks) in activations() {
        for _ in 0..4 {
            let x = r32(&mut rng, &[3, 5], -4.0, 4.0, &kinks);
            assert_f32_matches_f64(&op, &[x]);
        }
    }
    for reduction in REDUCTIONS {
        for _ in 0..4 {
            let x = r32(&mut rng, &[4, 3], -4.0, 4.0, &[]);
            let y = r32(&mut rng, &[4, 3], -4.0, 4.0, &[]);
            assert_f32_matches_f64(
                &loss(LossOp::MseLoss(MseLoss { reduction })),
                &[x.clone(), y],
            );
            let p = r32(&mut rng, &[4, 3], 0.0, 1.0, &[]);
            assert_f32_matches_f64(&loss(LossOp::bce_with_logits(reduction)), &[x, p]);
            for ce in [true, false] {
                let labels = random_labels(&mut rng, &[4, 5]);
                let x = r32(&mut rng, &[4, 5], -3.0, 3.0, &[]);
                assert_f32_matches_f64(&labelled(labels, reduction, ce), &[x]);
            }
        }
    }
}

fn message(e: impl std::fmt::Display) -> String {
    e.to_string()
}

#[test]
fn shape_errors_name_the_op_and_shapes() {
    let a = t64(&[2, 3], &[0.0; 6]);
    let b = t64(&[3, 2], &[0.0; 6]);
    for reduction in REDUCTIONS {
        for op in [
            loss(LossOp::MseLoss(MseLoss { reduction })),
            loss(LossOp::bce_with_logits(reduction)),
        ] {
            let msg = message(op.forward(&[&a, &b]).unwrap_err());
            assert!(msg.contains(op.name()), "{msg}");
            assert!(msg.contains("[2, 3]") && msg.contains("[3, 2]"), "{msg}");
            // Broadcastable shapes are refused too.
            let row = t64(&[3], &[0.0; 3]);
            let msg = message(op.forward(&[&a, &row]).unwrap_err());
            assert!(msg.contains(op.name()) && msg.contains("[3]"), "{msg}");
            // Wrong arity is an error, not a panic.
            assert!(matches!(
                op.forward(&[&a]),
                Err(OpError::Arity {
                    expected: 2,
                    found: 1,
                    ..
                })
            ));
        }
    }
    for ce in [true, false] {
        let name = if ce { "cross_entropy" } else { "nll_loss" };
        for dims in [&[][..], &[2, 3, 4][..]] {
            let n: usize = dims.iter().product();
            let x = t64(dims, &vec![0.0; n]);
            let msg = message(
                labelled(vec![0], Reduction::Mean, ce)
                    .forward(&[&x])
                    .unwrap_err(),
            );
            assert!(msg.contains(name), "{msg}");
            assert!(
                msg.contains(&Shape::new(dims).unwrap().to_string()),
                "{msg}"
            );
        }
        let x = t64(&[3, 4], &[0.0; 12]);
        let msg = message(
            labelled(vec![0, 1], Reduction::Mean, ce)
                .forward(&[&x])
                .unwrap_err(),
        );
        assert!(msg.contains(name) && msg.contains("[3, 4]"), "{msg}");
        assert!(msg.contains("needs 3 class labels, found 2"), "{msg}");
        let single = t64(&[4], &[0.0; 4]);
        let msg = message(
            labelled(vec![0, 1], Reduction::None, ce)
                .forward(&[&single])
                .unwrap_err(),
        );
        assert!(msg.contains("needs 1 class labels, found 2"), "{msg}");
        for (label, index) in [(4usize, 4i64), (usize::MAX, i64::MAX)] {
            let err = labelled(vec![0, label, 1], Reduction::Sum, ce)
                .forward(&[&x])
                .unwrap_err();
            assert_eq!(
                err,
                OpError::Index {
                    op: name,
                    what: "class label",
                    index,
                    bound: 4
                }
            );
        }
        // No class at all: any label is out of range.
        let none = t64(&[1, 0], &[]);
        assert!(matches!(
            labelled(vec![0], Reduction::Mean, ce).forward(&[&none]),
            Err(OpError::Index { bound: 0, .. })
        ));
        assert!(matches!(
            labelled(vec![0], Reduction::Mean, ce).forward(&[&x, &x]),
            Err(OpError::Arity { .. })
        ));
    }
}

#[test]
fn invalid_attributes_and_direct_rule_calls_are_errors() {
    let x = t64(&[2], &[1.0, -1.0]);
    for a in [
        ActivationOp::Softplus(Softplus {
            beta: 0.0,
            threshold: 20.0,
        }),
        ActivationOp::Softplus(Softplus {
            beta: f64::INFINITY,
            threshold: 20.0,
        }),
        ActivationOp::Softplus(Softplus {
            beta: 1.0,
            threshold: f64::NAN,
        }),
        ActivationOp::LeakyRelu(LeakyRelu {
            negative_slope: f64::NAN,
        }),
    ] {
        let op = act(a);
        let msg = message(op.forward(&[&x]).unwrap_err());
        assert!(msg.contains(op.name()) && msg.contains("[2]"), "{msg}");
    }
    // The family rules called directly, bypassing the dispatcher's checks, still never panic.
    let relu = ActivationOp::Relu(Relu);
    assert!(relu.forward::<f64>(&[]).is_err());
    assert!(relu.output_shape(&[]).is_err());
    let mse = LossOp::MseLoss(MseLoss {
        reduction: Reduction::Sum,
    });
    assert!(mse.forward(&[&x]).is_err());
    assert!(mse.output_shape(&[x.shape()]).is_err());
    let y = t64(&[3], &[0.0; 3]);
    assert!(mse
        .jvp(&[&x, &x], &mse.forward(&[&x, &x]).unwrap(), &[&x, &y])
        .is_err());
    let nll = LossOp::nll_loss(Arc::new(vec![5]), Reduction::Sum);
    assert!(nll.forward(&[&x]).is_err());
    assert!(nll
        .jvp(
            &[&x],
            &tapegrad_core::ops::Forward::new(Tensor::scalar(0.0)),
            &[&x]
        )
        .is_err());
    // A cotangent of the wrong shape is an error at the family level too.
    let ce = LossOp::cross_entropy(Arc::new(vec![0]), Reduction::Mean);
    let fwd = ce.forward(&[&x]).unwrap();
    let saved = Saved::keep(ce.saves(), &[&x], &fwd, vec![true]);
    assert!(ce.vjp(&saved.context(), &y).is_err());
    let mse_op = loss(mse);
    let fwd = mse_op.forward(&[&x, &x]).unwrap();
    let saved = Saved::keep(mse_op.saves(), &[&x, &x], &fwd, vec![true, true]);
    assert!(mse_op.vjp(&saved.context(), &y).is_err());
}

/// The VJP with a zero cotangent, every argument needing a gradient.
fn zero_cotangent_grads(op: &Op, inputs: &[&Tensor<f64>]) -> Vec<Tensor<f64>> {
    let out = op.forward(inputs).unwrap().value;
    op_vjp(op, inputs, &Tensor::zeros(out.shape())).unwrap()
}

#[test]
fn zero_cotangents_give_exact_zeros() {
    let mut rng = ChaCha8Rng::seed_from_u64(15);
    let extreme = t64(&[6], &[-1000.0, -30.0, 0.0, 1e-300, 30.0, 1000.0]);
    for (op, _) in activations() {
        let x = random(&mut rng, &[3, 4], -3.0, 3.0, &[]);
        for x in [&x, &extreme] {
            for g in zero_cotangent_grads(&op, &[x]) {
                assert!(g.is_all_zero(), "{op} at {x:?}: {g:?}");
            }
        }
    }
    for reduction in REDUCTIONS {
        for op in [
            loss(LossOp::MseLoss(MseLoss { reduction })),
            loss(LossOp::bce_with_logits(reduction)),
        ] {
            let y = t64(&[6], &[1.0, 0.0, 0.5, 1.0, 0.0, 1.0]);
            for g in zero_cotangent_grads(&op, &[&extreme, &y]) {
                assert!(g.is_all_zero(), "{op}: {g:?}");
            }
        }
        for ce in [true, false] {
            let x = t64(&[2, 3], &[-1000.0, 0.0, 1000.0, 5.0, -5.0, 0.5]);
            let op = labelled(vec![0, 2], reduction, ce);
            for g in zero_cotangent_grads(&op, &[&x]) {
                assert!(g.is_all_zero(), "{op}: {g:?}");
            }
        }
    }
}

#[test]
fn extreme_inputs_stay_finite() {
    let x = t64(&[2], &[-1000.0, 1000.0]);
    let ones = Tensor::ones(x.shape());
    for (op, _) in activations() {
        let y = fwd(&op, &[&x]);
        assert!(y.iter().all(|v| v.is_finite()), "{op}: {y:?}");
        let g = op_vjp(&op, &[&x], &ones).unwrap();
        assert!(g[0].data().iter().all(|v| v.is_finite()), "{op}: {g:?}");
        let y32 = op.forward(&[&x.cast::<f32>()]).unwrap().value;
        assert!(y32.data().iter().all(|v| v.is_finite()), "{op}: {y32:?}");
    }
    assert_eq!(
        fwd(&act(ActivationOp::Sigmoid(Sigmoid)), &[&x]),
        vec![0.0, 1.0]
    );
    let sp = act(ActivationOp::Softplus(Softplus {
        beta: 1.0,
        threshold: 20.0,
    }));
    assert_eq!(fwd(&sp, &[&x]), vec![0.0, 1000.0]);
    // A threshold so high that exp(beta x) overflows below it: still finite and exact.
    let high = act(ActivationOp::Softplus(Softplus {
        beta: 1.0,
        threshold: 1e6,
    }));
    assert_eq!(fwd(&high, &[&x]), vec![0.0, 1000.0]);
    let g = op_vjp(&high, &[&x], &ones).unwrap();
    assert_eq!(g[0].to_f64_vec(), vec![0.0, 1.0]);

    let bce = loss(LossOp::bce_with_logits(Reduction::None));
    for y in [[0.0, 0.0], [1.0, 1.0], [0.3, 0.7]] {
        let y = t64(&[2], &y);
        let l = fwd(&bce, &[&x, &y]);
        assert!(l.iter().all(|v| v.is_finite()), "{l:?}");
        let g = op_vjp(&bce, &[&x, &y], &ones).unwrap();
        assert!(g.iter().all(|g| g.data().iter().all(|v| v.is_finite())));
        let l32 = bce
            .forward(&[&x.cast::<f32>(), &y.cast::<f32>()])
            .unwrap()
            .value;
        assert!(l32.data().iter().all(|v| v.is_finite()), "{l32:?}");
    }
    // Confidently right costs nothing, confidently wrong costs |x|.
    assert_eq!(fwd(&bce, &[&x, &t64(&[2], &[0.0, 1.0])]), vec![0.0, 0.0]);
    assert_eq!(
        fwd(&bce, &[&x, &t64(&[2], &[1.0, 0.0])]),
        vec![1000.0, 1000.0]
    );
    let ce = labelled(vec![0], Reduction::Sum, true);
    let l = fwd(&ce, &[&t64(&[1, 2], &[-1000.0, 1000.0])]);
    assert_eq!(l, vec![2000.0]);
}

#[test]
fn only_arguments_that_need_a_gradient_get_one() {
    let x = t64(&[2], &[0.5, -0.25]);
    let y = t64(&[2], &[1.0, 0.0]);
    for reduction in REDUCTIONS {
        for op in [
            loss(LossOp::MseLoss(MseLoss { reduction })),
            loss(LossOp::bce_with_logits(reduction)),
        ] {
            let fwd = op.forward(&[&x, &y]).unwrap();
            let cot = Tensor::ones(fwd.value.shape());
            for needs in [[true, false], [false, true], [false, false], [true, true]] {
                let saved = Saved::keep(op.saves(), &[&x, &y], &fwd, needs.to_vec());
                let g = op.vjp(&saved.context(), &cot).unwrap();
                assert_eq!(g.iter().map(Option::is_some).collect::<Vec<_>>(), needs);
            }
        }
    }
    let op = act(ActivationOp::Silu(Silu));
    let fwd = op.forward(&[&x]).unwrap();
    let saved = Saved::keep(op.saves(), &[&x], &fwd, vec![false]);
    assert_eq!(op.vjp(&saved.context(), &x).unwrap().into_vec(), vec![None]);
}

#[test]
fn saves_are_minimal() {
    for a in [
        ActivationOp::Relu(Relu),
        ActivationOp::Sigmoid(Sigmoid),
        ActivationOp::Tanh(Tanh),
    ] {
        assert_eq!(act(a).saves(), Saves::OUTPUT);
    }
    assert_eq!(act(ActivationOp::Silu(Silu)).saves(), Saves::inputs(&[0]));
    assert_eq!(
        loss(LossOp::MseLoss(MseLoss {
            reduction: Reduction::Mean
        }))
        .saves(),
        Saves::inputs(&[0, 1])
    );
    for ce in [true, false] {
        assert_eq!(
            labelled(vec![0], Reduction::Mean, ce).saves(),
            Saves::NOTHING
        );
    }
    // cross_entropy's VJP runs from its saved probabilities alone.
    let x = t64(&[2, 3], &[0.1, 0.2, 0.3, -1.0, 0.0, 1.0]);
    let op = labelled(vec![2, 0], Reduction::Sum, true);
    let fwd = op.forward(&[&x]).unwrap();
    let saved = Saved::keep(op.saves(), &[&x], &fwd, vec![true]);
    assert!(saved.inputs[0].is_none() && saved.output.is_none());
    assert_eq!(saved.nbytes(), 6 * 8);
    let g = op.vjp(&saved.context(), &Tensor::scalar(1.0)).unwrap();
    let rows: Vec<f64> = g[0]
        .as_ref()
        .unwrap()
        .to_f64_vec()
        .chunks(3)
        .map(|r| r.iter().sum())
        .collect();
    for r in rows {
        assert!(r.abs() < 1e-15, "softmax gradient rows sum to 0: {r}");
    }
}

#[test]
fn display_shows_attributes() {
    let cases = [
        (act(ActivationOp::Relu(Relu)), "relu"),
        (
            act(ActivationOp::LeakyRelu(LeakyRelu {
                negative_slope: 0.01,
            })),
            "leaky_relu(negative_slope=0.01)",
        ),
        (
            act(ActivationOp::Gelu(Gelu {
                approximate: GeluApproximate::Tanh,
            })),
            "gelu(approximate='tanh')",
        ),
        (
            act(ActivationOp::Softplus(Softplus {
                beta: 1.0,
                threshold: 20.0,
            })),
            "softplus(beta=1, threshold=20)",
        ),
        (
            loss(LossOp::MseLoss(MseLoss {
                reduction: Reduction::Mean,
            })),
            "mse_loss(reduction='mean')",
        ),
        (
            loss(LossOp::bce_with_logits(Reduction::None)),
            "binary_cross_entropy_with_logits(reduction='none')",
        ),
        (
            labelled(vec![2, 0, 1], Reduction::Sum, true),
            "cross_entropy(targets=[2, 0, 1], reduction='sum')",
        ),
        (
            labelled((0..10).collect(), Reduction::Mean, false),
            "nll_loss(targets=[0, 1, 2, 3, 4, 5, 6, 7, ... 10 labels], reduction='mean')",
        ),
    ];
    for (op, want) in cases {
        assert_eq!(op.to_string(), want);
    }
}
