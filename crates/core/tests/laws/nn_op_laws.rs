//! The tape laws on programs that mix the nn ops with the core ops (a small CNN and a small
//! transformer block, with fan-out): executed = reference (law 1), the lowered tape is
//! zero-preserving (law 7), the whole program's gradient matches central differences (law 6),
//! and the same program runs in f32.

use crate::ops_nn_support::{random, rng, uniform};
use rand_chacha::ChaCha8Rng;
use tapegrad_core::laws::{Program, ProgramNode};
use tapegrad_core::ops::activation::Silu;
use tapegrad_core::ops::elementwise::{Add, Mul};
use tapegrad_core::ops::linalg::Linear;
use tapegrad_core::ops::nn::{
    BatchNorm, Conv2d, Dropout, Embedding, IndexTensor, LayerNorm, MaxPool2d,
    ScaledDotProductAttention,
};
use tapegrad_core::ops::reduce::Mean;
use tapegrad_core::ops::structure::{Flatten, Reshape};
use tapegrad_core::ops::{
    ActivationOp, ElementwiseOp, LinalgOp, LossOp, ReduceOp, Reduction, StructureOp,
};
use tapegrad_core::{audit, Op, Tensor};

fn node(op: impl Into<Op>, args: &[usize]) -> ProgramNode {
    ProgramNode {
        op: op.into(),
        args: args.to_vec(),
    }
}

fn el(op: ElementwiseOp) -> Op {
    Op::Elementwise(op)
}

/// x (2, 2, 6, 6), w (3, 2, 3, 3), b (3), gamma (3), beta (3), fc (4, 12):
/// conv -> relu -> conv * conv (fan-out) -> max_pool -> batch_norm -> flatten -> linear -> CE.
fn cnn(r: &mut ChaCha8Rng) -> Program {
    let inputs = vec![
        random(r, &[2, 2, 6, 6]),
        random(r, &[3, 2, 3, 3]),
        random(r, &[3]),
        uniform(r, &[3], 0.5, 1.5),
        random(r, &[3]),
        random(r, &[4, 12]),
    ];
    let conv = Conv2d {
        stride: [2, 2],
        padding: [1, 1],
        bias: true,
        ..Conv2d::default()
    };
    let pool = MaxPool2d {
        stride: [1, 1],
        ..MaxPool2d::new([2, 2])
    };
    let nodes = vec![
        node(conv, &[0, 1, 2]),                               // 6: (2, 3, 3, 3)
        node(Op::Activation(ActivationOp::Silu(Silu)), &[6]), // 7
        node(el(ElementwiseOp::Mul(Mul)), &[7, 6]),           // 8: fan-out of 6
        node(pool, &[8]),                                     // 9: (2, 3, 2, 2)
        node(BatchNorm::new(true), &[9, 3, 4]),               // 10
        node(
            Op::Structure(StructureOp::Flatten(Flatten {
                start_dim: 1,
                end_dim: -1,
            })),
            &[10],
        ), // 11: (2, 12)
        node(
            Op::Linalg(LinalgOp::Linear(Linear { bias: false })),
            &[11, 5],
        ), // 12: (2, 4)
        node(
            Op::Loss(LossOp::cross_entropy(vec![1, 3].into(), Reduction::Mean)),
            &[12],
        ),
    ];
    Program {
        requires_grad: vec![true; inputs.len()],
        inputs,
        nodes,
    }
}

/// table (7, 4), gamma (4), q/k/v projections (4, 4) each:
/// embedding -> layer_norm -> three projections -> causal attention -> residual -> dropout -> mean.
fn transformer(r: &mut ChaCha8Rng) -> Program {
    let inputs = vec![
        random(r, &[7, 4]),
        uniform(r, &[4], 0.5, 1.5),
        random(r, &[4, 4]),
        random(r, &[4, 4]),
        random(r, &[4, 4]),
    ];
    let tokens = IndexTensor::new(&[2, 5], vec![3, 1, 3, 0, 6, 2, 2, 5, 1, 3]).unwrap();
    let linear = || Op::Linalg(LinalgOp::Linear(Linear { bias: false }));
    let heads = Op::Structure(StructureOp::Reshape(Reshape {
        shape: vec![2, 1, 5, 4],
    }));
    let nodes = vec![
        node(Embedding::new(tokens), &[0]), // 5: (2, 5, 4)
        node(
            LayerNorm {
                normalized_shape: vec![4],
                eps: 1e-5,
                weight: true,
                bias: false,
            },
            &[5, 1],
        ), // 6
        node(linear(), &[6, 2]),            // 7: q
        node(linear(), &[6, 3]),            // 8: k
        node(linear(), &[6, 4]),            // 9: v
        node(heads.clone(), &[7]),          // 10
        node(heads.clone(), &[8]),          // 11
        node(heads, &[9]),                  // 12
        node(
            ScaledDotProductAttention {
                is_causal: true,
                ..Default::default()
            },
            &[10, 11, 12],
        ), // 13: (2, 1, 5, 4)
        node(
            Op::Structure(StructureOp::Reshape(Reshape {
                shape: vec![2, 5, 4],
            })),
            &[13],
        ), // 14
        node(el(ElementwiseOp::Add(Add)), &[14, 6]), // 15: residual, fan-out of 6
        node(
            Dropout {
                p: 0.2,
                training: true,
                seed: 5,
            },
            &[15],
        ), // 16
        node(el(ElementwiseOp::Mul(Mul)), &[16, 16]), // 17
        node(
            Op::Reduce(ReduceOp::Mean(Mean {
                axes: None,
                keepdim: false,
            })),
            &[17],
        ),
    ];
    Program {
        requires_grad: vec![true; inputs.len()],
        inputs,
        nodes,
    }
}

fn check_program(program: &Program, r: &mut ChaCha8Rng) {
    let tape = program.record_f64().unwrap();
    // Law 1 from every slot, with a random seed.
    for out in 0..tape.len() {
        let seed = random(r, tape.value(out).unwrap().dims());
        let executed = tape.backward_all(out, &seed).unwrap();
        let reference = tape
            .backward_from(tape.one_hot(out, &seed).unwrap())
            .unwrap();
        assert_eq!(executed, reference, "law 1 from slot {out}");
    }
    // Law 7.
    let report = audit(&tape);
    assert!(report.is_zero_preserving(), "{:?}", report.findings);
    // Law 6 for the whole program: d out / d input against central differences.
    let last = tape.len() - 1;
    let seed = Tensor::ones(tape.value(last).unwrap().shape());
    let grads = tape.backward_all(last, &seed).unwrap();
    let h = 1e-6;
    let value = |inputs: &[Tensor<f64>]| -> f64 {
        let tape = program.record(inputs).unwrap();
        tape.value(tape.len() - 1).unwrap().data()[0]
    };
    for (i, x) in program.inputs.iter().enumerate() {
        for j in 0..x.numel() {
            let mut plus = program.inputs.clone();
            plus[i].data_mut()[j] += h;
            let mut minus = program.inputs.clone();
            minus[i].data_mut()[j] -= h;
            let fd = (value(&plus) - value(&minus)) / (2.0 * h);
            let got = grads[i].data()[j];
            assert!(
                (got - fd).abs() <= 1e-6 + 1e-5 * fd.abs(),
                "input {i} element {j}: tape {got} vs finite difference {fd}"
            );
        }
    }
    // The same program in f32 records and differentiates to finite values.
    let in32: Vec<Tensor<f32>> = program.inputs.iter().map(|x| x.cast()).collect();
    let tape32 = program.record(&in32).unwrap();
    let last = tape32.len() - 1;
    let g32 = tape32
        .backward_all(last, &Tensor::ones(tape32.value(last).unwrap().shape()))
        .unwrap();
    assert!(g32.iter().all(|g| g.first_non_finite().is_none()));
}

#[test]
fn laws_hold_on_a_small_cnn() {
    for seed in 0..4 {
        let mut r = rng(100 + seed);
        check_program(&cnn(&mut r), &mut r);
    }
}

#[test]
fn laws_hold_on_a_small_transformer_block() {
    for seed in 0..4 {
        let mut r = rng(200 + seed);
        check_program(&transformer(&mut r), &mut r);
    }
}
