//! The values and operand gradients of matmul, linear and attention give the same bits on 1 to 4
//! GEMM threads, at sizes where they stay on one thread, where linear's two gradients run side
//! by side (one single-threaded product each), where products are cut into bands and where many
//! small products go to the threads whole: batched and broadcast matmuls, a shared matrix folded
//! into rows, linear with and without bias, only one operand needing a gradient, causal and full
//! attention over (batch, head) products; and the norms whose groups go to the threads in bands
//! (layer norm's rows, group norm with one group), with and without their affine arguments,
//! beside one whose groups do not (group norm with several groups).

use tapegrad_core::ops::linalg::{Linear, Matmul};
use tapegrad_core::ops::nn::{GroupNorm, LayerNorm, ScaledDotProductAttention};
use tapegrad_core::ops::LinalgOp;
use tapegrad_core::{Op, Tape, Tensor};
use tapegrad_tensor::kernels::set_num_threads;

fn values(dims: &[usize], salt: usize) -> Tensor<f32> {
    let n: usize = dims.iter().product();
    let data: Vec<f64> = (0..n)
        .map(|i| ((i * 2654435761 + salt * 7919) % 1999) as f64 / 999.0 - 1.0)
        .collect();
    Tensor::from_f64(dims, &data).unwrap()
}

/// The value's bits of `op` on leaves of `dims`, then every gradient's (with `needs` saying
/// which need one) for a fixed seed, on `threads` threads.
fn value_and_grads(op: &Op, dims: &[&[usize]], needs: &[bool], threads: usize) -> Vec<u32> {
    set_num_threads(threads);
    let mut tape = Tape::<f32>::new();
    let leaves: Vec<usize> = dims
        .iter()
        .zip(needs)
        .enumerate()
        .map(|(i, (d, &need))| tape.leaf(values(d, i), need))
        .collect();
    let out = tape.apply(op.clone(), &leaves).unwrap();
    let seed = values(tape.value(out).unwrap().dims(), 9);
    let all = tape.backward_all(out, &seed).unwrap();
    set_num_threads(1);
    let value = tape.value(out).unwrap().data().iter().map(|v| v.to_bits());
    value
        .chain(
            leaves
                .iter()
                .zip(needs)
                .filter(|(_, &need)| need)
                .flat_map(|(&leaf, _)| {
                    all[leaf]
                        .data()
                        .iter()
                        .map(|v| v.to_bits())
                        .collect::<Vec<_>>()
                }),
        )
        .collect()
}

/// An op, its operands' shapes and which operands need a gradient.
type Case = (Op, Vec<&'static [usize]>, Vec<bool>);

#[test]
fn operand_gradients_are_bit_identical_on_every_thread_count() {
    let matmul = Op::Linalg(LinalgOp::Matmul(Matmul));
    let linear = |bias| Op::Linalg(LinalgOp::Linear(Linear { bias }));
    let attention = |is_causal| -> Op {
        ScaledDotProductAttention {
            is_causal,
            scale: None,
            attn_mask: None,
            float_mask: false,
            dropout_p: 0.0,
            seed: 0,
        }
        .into()
    };
    // (op, operand shapes, which need a gradient); multiply-adds per gradient in the comments.
    let cases: Vec<Case> = vec![
        (matmul.clone(), vec![&[40, 30], &[30, 20]], vec![true, true]), // 24k: one thread
        (
            matmul.clone(),
            vec![&[3, 64, 80], &[80, 70]],
            vec![true, true],
        ), // 1.1M: one thread
        (
            matmul.clone(),
            vec![&[64, 80], &[2, 80, 70]],
            vec![true, true],
        ), // broadcast a
        (
            matmul.clone(),
            vec![&[2, 300, 160], &[2, 160, 200]],
            vec![true, true],
        ), // 19M: bands
        (
            matmul.clone(),
            vec![&[3, 64, 80], &[80, 70]],
            vec![false, true],
        ), // one operand
        (
            linear(true),
            vec![&[128, 96], &[64, 96], &[64]],
            vec![true, true, true],
        ), // 0.8M per product: the two side by side on 2 to 4 threads
        (
            linear(false),
            vec![&[256, 300], &[200, 300]],
            vec![true, true],
        ), // 15M: side by side on 2 threads, bands on 3 and 4
        (
            linear(true),
            vec![&[128, 96], &[64, 96], &[64]],
            vec![false, true, true],
        ),
        (
            matmul.clone(),
            vec![&[6, 9, 48, 36], &[9, 36, 40]],
            vec![true, true],
        ), // 54 products of 69k: whole products to the threads
        (
            attention(true),
            vec![&[4, 8, 64, 32], &[4, 8, 64, 32], &[4, 8, 64, 32]],
            vec![true, true, true],
        ), // 32 heads of 131k per product, softmax rows in bands
        (
            attention(false),
            vec![&[4, 8, 64, 32], &[4, 8, 64, 32], &[4, 8, 64, 32]],
            vec![true, true, true],
        ),
    ];
    let layer_norm = |affine: bool| -> Op {
        LayerNorm {
            normalized_shape: vec![224],
            eps: 1e-5,
            weight: affine,
            bias: affine,
        }
        .into()
    };
    let group_norm = |num_groups: usize| -> Op {
        GroupNorm {
            num_groups,
            eps: 1e-5,
            weight: true,
            bias: true,
        }
        .into()
    };
    let norms: Vec<Case> = vec![
        // 301 rows of 224 (67k elements): bands of whole rows, the last one shorter, on 2 to 4
        // threads.
        (
            layer_norm(true),
            vec![&[7, 43, 224], &[224], &[224]],
            vec![true, true, true],
        ),
        (layer_norm(false), vec![&[301, 224]], vec![true]),
        (
            layer_norm(true),
            vec![&[301, 224], &[224], &[224]],
            vec![false, true, false],
        ),
        // One group per sample: samples in bands, each band's channels those of the whole.
        (
            group_norm(1),
            vec![&[9, 8, 1000], &[8], &[8]],
            vec![true, true, true],
        ),
        // Groups within a sample: one walk on every thread count.
        (
            group_norm(4),
            vec![&[9, 8, 1000], &[8], &[8]],
            vec![true, true, true],
        ),
    ];
    let cases = cases.into_iter().chain(norms);
    for (op, dims, needs) in cases {
        let one = value_and_grads(&op, &dims, &needs, 1);
        for threads in 2..=4 {
            assert!(
                value_and_grads(&op, &dims, &needs, threads) == one,
                "{op:?} on {dims:?}: {threads} threads differ from 1"
            );
        }
    }
}
