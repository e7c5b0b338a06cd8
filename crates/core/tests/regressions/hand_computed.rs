//! Named regression cases with hand-computed gradients: a tensor used twice (`x * x`, `x @ x^T`,
//! `x @ x`), broadcasting on both operands, reductions with and without keepdim, and tied maxima
//! sharing the gradient; and the nn regressions of issue #4 (repeated embedding indices, pooling
//! ties, batch norm at batch size 1, a fully masked attention row, strides and paddings that do
//! not divide the input). Values are small integers or halves, so every expected value is exact.
//! (The million-node chain lives in crates/core/tests/tape_regressions.rs.)

use tapegrad_core::ops::elementwise::{Add, Maximum, Minimum, Mul, Scale, Sin, Sub};
use tapegrad_core::ops::linalg::{Matmul, Transpose};
use tapegrad_core::ops::nn::{
    AvgPool2d, BatchNorm, Conv2d, Embedding, IndexTensor, MaxPool2d, ScaledDotProductAttention,
};
use tapegrad_core::ops::reduce::{Amax, Mean, Sum};
use tapegrad_core::ops::{ElementwiseOp, LinalgOp, Mask, ReduceOp};
use tapegrad_core::{Op, Tape, Tensor};

fn t(dims: &[usize], v: &[f64]) -> Tensor<f64> {
    Tensor::from_f64(dims, v).unwrap()
}

fn ew(e: ElementwiseOp) -> Op {
    Op::Elementwise(e)
}

/// Gradients of every leaf of `build`'s tape for `out` seeded with `seed`, from both the executed
/// and the reference sweep (which must agree on these zero-preserving tapes).
fn grads(tape: &Tape<f64>, out: usize, seed: &Tensor<f64>) -> Vec<Tensor<f64>> {
    let executed = tape.backward_all(out, seed).unwrap();
    let reference = tape
        .backward_from(tape.one_hot(out, seed).unwrap())
        .unwrap();
    assert_eq!(executed, reference);
    executed
}

#[test]
fn x_times_x_gets_both_paths() {
    let mut tape = Tape::new();
    let x = tape.leaf(t(&[3], &[1.0, -2.0, 3.0]), true);
    let y = tape.apply(ew(ElementwiseOp::Mul(Mul)), &[x, x]).unwrap();
    assert_eq!(tape.value(y).unwrap().data(), &[1.0, 4.0, 9.0]);
    let g = grads(&tape, y, &t(&[3], &[1.0, 0.5, -2.0]));
    // d(x²) = 2x, times the seed.
    assert_eq!(g[x].data(), &[2.0, -2.0, -12.0]);
}

#[test]
fn x_matmul_x_transposed_gets_both_paths() {
    let mut tape = Tape::new();
    let x = tape.leaf(t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), true);
    let xt = tape
        .apply(
            Op::Linalg(LinalgOp::Transpose(Transpose { dim0: 0, dim1: 1 })),
            &[x],
        )
        .unwrap();
    let y = tape
        .apply(Op::Linalg(LinalgOp::Matmul(Matmul)), &[x, xt])
        .unwrap();
    assert_eq!(tape.value(y).unwrap().data(), &[14.0, 32.0, 32.0, 77.0]);
    // With seed G, d<G, x xᵀ>/dx = G x + Gᵀ x; for G = ones(2, 2) that is 2 · ones · x.
    let g = grads(&tape, y, &t(&[2, 2], &[1.0; 4]));
    assert_eq!(g[x].data(), &[10.0, 14.0, 18.0, 10.0, 14.0, 18.0]);
    // An asymmetric seed separates the two paths: G = [[1, 0], [0, 0]] gives row 0 = 2 x[0].
    let g = grads(&tape, y, &t(&[2, 2], &[1.0, 0.0, 0.0, 0.0]));
    assert_eq!(g[x].data(), &[2.0, 4.0, 6.0, 0.0, 0.0, 0.0]);
    // G = [[0, 1], [0, 0]]: d(x0·x1) puts x1 on row 0 and x0 on row 1.
    let g = grads(&tape, y, &t(&[2, 2], &[0.0, 1.0, 0.0, 0.0]));
    assert_eq!(g[x].data(), &[4.0, 5.0, 6.0, 1.0, 2.0, 3.0]);
}

#[test]
fn square_matrix_times_itself_gets_both_paths() {
    let mut tape = Tape::new();
    let x = tape.leaf(t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]), true);
    let y = tape
        .apply(Op::Linalg(LinalgOp::Matmul(Matmul)), &[x, x])
        .unwrap();
    assert_eq!(tape.value(y).unwrap().data(), &[7.0, 10.0, 15.0, 22.0]);
    // d<G, x x>/dx = G xᵀ + xᵀ G; with G = ones: [[3, 7], [3, 7]] + [[4, 4], [6, 6]].
    let g = grads(&tape, y, &t(&[2, 2], &[1.0; 4]));
    assert_eq!(g[x].data(), &[7.0, 11.0, 9.0, 13.0]);
}

#[test]
fn broadcasting_on_both_operands_sums_back_each_side() {
    let mut tape = Tape::new();
    let a = tape.leaf(t(&[3, 1], &[1.0, 2.0, 3.0]), true);
    let b = tape.leaf(t(&[1, 4], &[10.0, 20.0, 30.0, 40.0]), true);
    let sum = tape.apply(ew(ElementwiseOp::Add(Add)), &[a, b]).unwrap();
    assert_eq!(tape.value(sum).unwrap().dims(), &[3, 4]);
    assert_eq!(
        tape.value(sum).unwrap().data()[4..8],
        [12.0, 22.0, 32.0, 42.0]
    );
    // Seed S[i][j] = 4i + j: a gets row sums 16i + 6, b gets column sums 12 + 3j.
    let seed = t(&[3, 4], &(0..12).map(f64::from).collect::<Vec<_>>());
    let g = grads(&tape, sum, &seed);
    assert_eq!(g[a].data(), &[6.0, 22.0, 38.0]);
    assert_eq!(g[a].dims(), &[3, 1]);
    assert_eq!(g[b].data(), &[12.0, 15.0, 18.0, 21.0]);
    assert_eq!(g[b].dims(), &[1, 4]);

    let prod = tape.apply(ew(ElementwiseOp::Mul(Mul)), &[a, b]).unwrap();
    let g = grads(&tape, prod, &seed);
    // a[i] gets Σ_j S[i][j] b[j]; b[j] gets Σ_i S[i][j] a[i].
    assert_eq!(g[a].data(), &[200.0, 600.0, 1000.0]);
    assert_eq!(g[b].data(), &[32.0, 38.0, 44.0, 50.0]);
}

#[test]
fn a_rank_one_operand_broadcasts_against_a_matrix_on_the_left() {
    let mut tape = Tape::new();
    let v = tape.leaf(t(&[2], &[1.0, 2.0]), true);
    let m = tape.leaf(t(&[3, 1], &[1.0, 2.0, 3.0]), true);
    let y = tape.apply(ew(ElementwiseOp::Sub(Sub)), &[v, m]).unwrap();
    assert_eq!(tape.value(y).unwrap().dims(), &[3, 2]);
    let g = grads(&tape, y, &t(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
    assert_eq!(g[v].data(), &[9.0, 12.0]);
    assert_eq!(g[m].data(), &[-3.0, -7.0, -11.0]);
}

#[test]
fn keepdim_and_not_give_the_same_gradient() {
    let x_value = t(&[2, 3], &[1.0, 5.0, 2.0, 4.0, 0.0, 3.0]);
    for (op, per_element) in [
        ("sum", [1.0, 1.0, 1.0]),
        ("mean", [1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0]),
        ("amax", [0.0, 1.0, 0.0]),
    ] {
        let mut out = Vec::new();
        for keepdim in [false, true] {
            let axes = Some(vec![1]);
            let reduce = match op {
                "sum" => ReduceOp::Sum(Sum { axes, keepdim }),
                "mean" => ReduceOp::Mean(Mean { axes, keepdim }),
                _ => ReduceOp::Amax(Amax { axes, keepdim }),
            };
            let mut tape = Tape::new();
            let x = tape.leaf(x_value.clone(), true);
            let y = tape.apply(Op::Reduce(reduce), &[x]).unwrap();
            let dims: &[usize] = if keepdim { &[2, 1] } else { &[2] };
            assert_eq!(tape.value(y).unwrap().dims(), dims, "{op}");
            let g = grads(&tape, y, &t(dims, &[1.0, 2.0]));
            out.push(g[x].clone());
        }
        assert_eq!(out[0], out[1], "{op}");
        // Row 0 scaled by seed 1, row 1 by seed 2; amax picks 5 in row 0 and 4 in row 1.
        let expected: Vec<f64> = match op {
            "amax" => vec![0.0, 1.0, 0.0, 2.0, 0.0, 0.0],
            _ => per_element
                .iter()
                .copied()
                .chain(per_element.iter().map(|v| 2.0 * v))
                .collect(),
        };
        assert_eq!(out[0].data(), expected.as_slice(), "{op}");
    }
}

#[test]
fn tied_maxima_share_the_gradient() {
    let mut tape = Tape::new();
    let x = tape.leaf(t(&[2, 3], &[1.0, 3.0, 3.0, 2.0, 2.0, 2.0]), true);
    let rows = tape
        .apply(
            Op::Reduce(ReduceOp::Amax(Amax {
                axes: Some(vec![-1]),
                keepdim: false,
            })),
            &[x],
        )
        .unwrap();
    assert_eq!(tape.value(rows).unwrap().data(), &[3.0, 2.0]);
    let g = grads(&tape, rows, &t(&[2], &[1.0, 3.0]));
    assert_eq!(g[x].data(), &[0.0, 0.5, 0.5, 1.0, 1.0, 1.0]);

    let all = tape
        .apply(
            Op::Reduce(ReduceOp::Amax(Amax {
                axes: None,
                keepdim: false,
            })),
            &[x],
        )
        .unwrap();
    let g = grads(&tape, all, &t(&[], &[2.0]));
    assert_eq!(g[x].data(), &[0.0, 1.0, 1.0, 0.0, 0.0, 0.0]);
}

#[test]
fn elementwise_maximum_and_minimum_split_ties_half_and_half() {
    let mut tape = Tape::new();
    let a = tape.leaf(t(&[3], &[1.0, 2.0, 5.0]), true);
    let b = tape.leaf(t(&[3], &[1.0, 3.0, 4.0]), true);
    let seed = t(&[3], &[2.0, 2.0, 2.0]);
    let hi = tape
        .apply(ew(ElementwiseOp::Maximum(Maximum)), &[a, b])
        .unwrap();
    let g = grads(&tape, hi, &seed);
    assert_eq!(g[a].data(), &[1.0, 0.0, 2.0]);
    assert_eq!(g[b].data(), &[1.0, 2.0, 0.0]);
    let lo = tape
        .apply(ew(ElementwiseOp::Minimum(Minimum)), &[a, b])
        .unwrap();
    let g = grads(&tape, lo, &seed);
    assert_eq!(g[a].data(), &[1.0, 2.0, 0.0]);
    assert_eq!(g[b].data(), &[1.0, 0.0, 2.0]);
    // maximum(x, x): every element is a tie, and both halves land on x.
    let both = tape
        .apply(ew(ElementwiseOp::Maximum(Maximum)), &[a, a])
        .unwrap();
    let g = grads(&tape, both, &seed);
    assert_eq!(g[a].data(), &[2.0, 2.0, 2.0]);
}

#[test]
fn a_value_feeding_three_nodes_accumulates_all_of_them() {
    // y = x·x + sin(x) + 3x through separate nodes that all read x; the gradient is the sum.
    let mut tape = Tape::new();
    let x = tape.leaf(t(&[2], &[0.5, -1.0]), true);
    let sq = tape.apply(ew(ElementwiseOp::Mul(Mul)), &[x, x]).unwrap();
    let s = tape.apply(ew(ElementwiseOp::Sin(Sin)), &[x]).unwrap();
    let k = tape
        .apply(ew(ElementwiseOp::Scale(Scale { factor: 3.0 })), &[x])
        .unwrap();
    let a = tape.apply(ew(ElementwiseOp::Add(Add)), &[sq, s]).unwrap();
    let y = tape.apply(ew(ElementwiseOp::Add(Add)), &[a, k]).unwrap();
    let g = grads(&tape, y, &t(&[2], &[1.0, 1.0]));
    for (i, &v) in [0.5f64, -1.0].iter().enumerate() {
        let want = 2.0 * v + v.cos() + 3.0;
        assert!((g[x].data()[i] - want).abs() <= 4.0 * f64::EPSILON * want.abs());
    }
}

// ---------------------------------------------------------------------------------------------
// The nn regressions of issue #4, end to end on the tape (op-level versions with more variants
// live in crates/core/tests/ops_nn*.rs).

#[test]
fn embedding_gradients_of_repeated_indices_accumulate() {
    let mut tape = Tape::new();
    let w = tape.leaf(t(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), true);
    let indices = IndexTensor::vector(vec![2, 0, 2]);
    let e = tape.apply(Embedding::new(indices).into(), &[w]).unwrap();
    assert_eq!(
        tape.value(e).unwrap().data(),
        &[5.0, 6.0, 1.0, 2.0, 5.0, 6.0]
    );
    let g = grads(&tape, e, &t(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 0.5, 0.25]));
    // Row 2 is picked twice: it receives both seed rows; row 1 is never picked.
    assert_eq!(g[w].data(), &[3.0, 4.0, 0.0, 0.0, 1.5, 2.25]);
}

#[test]
fn max_pool2d_ties_give_the_gradient_to_the_first_maximum_in_row_major_order() {
    let mut tape = Tape::new();
    let x = tape.leaf(t(&[1, 2, 2], &[1.0, 3.0, 3.0, 3.0]), true);
    let y = tape.apply(MaxPool2d::new([2, 2]).into(), &[x]).unwrap();
    assert_eq!(tape.value(y).unwrap().data(), &[3.0]);
    let g = grads(&tape, y, &t(&[1, 1, 1], &[2.0]));
    assert_eq!(g[x].data(), &[0.0, 2.0, 0.0, 0.0]);
}

#[test]
fn batch_norm_at_batch_size_one_is_an_error_in_training_only() {
    let mut tape = Tape::new();
    let x = tape.leaf(t(&[1, 3], &[1.0, 2.0, 3.0]), true);
    let plain = |training| BatchNorm {
        weight: false,
        bias: false,
        ..BatchNorm::new(training)
    };
    let msg = tape
        .apply(plain(true).into(), &[x])
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("batch_norm") && msg.contains("more than 1 value per channel"),
        "{msg}"
    );
    assert!(msg.contains("[1, 3]"), "{msg}");
    // Evaluation mode normalises with the running statistics: (x - 1) / sqrt(4 + 0).
    let mean = tape.leaf(t(&[3], &[1.0, 1.0, 1.0]), false);
    let var = tape.leaf(t(&[3], &[4.0, 4.0, 4.0]), false);
    let eval = BatchNorm {
        eps: 0.0,
        ..plain(false)
    };
    let y = tape.apply(eval.into(), &[x, mean, var]).unwrap();
    assert_eq!(tape.value(y).unwrap().data(), &[0.0, 0.5, 1.0]);
}

#[test]
fn a_fully_masked_attention_row_outputs_zero_and_passes_no_gradient() {
    let mut tape = Tape::new();
    let q = tape.leaf(t(&[2, 2], &[1.0, 2.0, -1.0, 0.5]), true);
    let k = tape.leaf(t(&[2, 2], &[0.5, -1.0, 2.0, 1.0]), true);
    let v = tape.leaf(t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]), true);
    // Query 0 may attend no key; query 1 attends key 1 only, so its output is v's row 1.
    let mask = Mask::new(&[2, 2], vec![false, false, false, true]).unwrap();
    let op = ScaledDotProductAttention {
        attn_mask: Some(mask),
        ..Default::default()
    };
    let y = tape.apply(op.into(), &[q, k, v]).unwrap();
    assert_eq!(tape.value(y).unwrap().data(), &[0.0, 0.0, 3.0, 4.0]);
    let g = grads(&tape, y, &t(&[2, 2], &[1.0, -2.0, 0.5, 1.0]));
    // A single allowed key has weight 1 whatever the scores: only v's row 1 gets a gradient.
    assert_eq!(g[q].data(), &[0.0; 4]);
    assert_eq!(g[k].data(), &[0.0; 4]);
    assert_eq!(g[v].data(), &[0.0, 0.0, 0.5, 1.0]);
}

#[test]
fn conv_and_pooling_on_sizes_the_stride_does_not_divide() {
    // x is 4x3 holding 1..=12; a 3x3 window with stride 2 and padding 1 sees rows {0,1}, {1,2,3}
    // and columns {0,1}, {1,2}: the last window overhangs the bottom and right edges.
    let mut tape = Tape::new();
    let data: Vec<f64> = (1..=12).map(f64::from).collect();
    let x = tape.leaf(t(&[1, 1, 4, 3], &data), true);
    let w = tape.leaf(t(&[1, 1, 3, 3], &[1.0; 9]), true);
    let conv = Conv2d {
        stride: [2, 2],
        padding: [1, 1],
        ..Conv2d::default()
    };
    let y = tape.apply(conv.into(), &[x, w]).unwrap();
    assert_eq!(tape.value(y).unwrap().dims(), &[1, 1, 2, 2]);
    assert_eq!(tape.value(y).unwrap().data(), &[12.0, 16.0, 45.0, 51.0]);
    let g = grads(&tape, y, &t(&[1, 1, 2, 2], &[1.0; 4]));
    // How many windows read each element: (rows 1, 2, 1, 1) times (columns 1, 2, 1).
    let expected = [1.0, 2.0, 1.0, 2.0, 4.0, 2.0, 1.0, 2.0, 1.0, 1.0, 2.0, 1.0];
    assert_eq!(g[x].data(), &expected);

    let avg = |count_include_pad| AvgPool2d {
        stride: [2, 2],
        padding: [1, 1],
        count_include_pad,
        ..AvgPool2d::new([3, 3])
    };
    let skip = tape.apply(avg(false).into(), &[x]).unwrap();
    assert_eq!(tape.value(skip).unwrap().data(), &[3.0, 4.0, 7.5, 8.5]);
    let with_pad = tape.apply(avg(true).into(), &[x]).unwrap();
    assert_eq!(tape.value(with_pad).unwrap().data()[2], 5.0);
    // ceil_mode keeps the partial last window of a 3x3 input pooled 2x2 with stride 2.
    let small = tape.leaf(t(&[1, 3, 3], &data[..9]), true);
    let ceil = MaxPool2d {
        ceil_mode: true,
        ..MaxPool2d::new([2, 2])
    };
    let m = tape.apply(ceil.into(), &[small]).unwrap();
    assert_eq!(tape.value(m).unwrap().data(), &[5.0, 6.0, 8.0, 9.0]);
    let g = grads(&tape, m, &t(&[1, 2, 2], &[1.0, 2.0, 3.0, 4.0]));
    assert_eq!(
        g[small].data(),
        &[0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 0.0, 3.0, 4.0]
    );
}
