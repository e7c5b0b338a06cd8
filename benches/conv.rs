//! conv2d forward + backward (input, weight and bias gradients) for a (32, 16, 28, 28) f32 input
//! with 32 3x3 filters and padding 1, single-threaded, next to the plain f32 GEMMs it is made of
//! (32 x 144 by 144 x 784, once per sample) and a 512^3 GEMM. Throughput is in FLOP/s.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use tapegrad::ops::nn::Conv2d;
use tapegrad::ops::Saved;
use tapegrad::tensor::kernels::conv::{conv2d_grad_input, conv2d_grad_weight, Conv2dGeometry};
use tapegrad::tensor::kernels::{matmul, set_num_threads};
use tapegrad::{Op, Tensor};

const N: usize = 32;
const C: usize = 16;
const HW: usize = 28;
const O: usize = 32;
const K: usize = 3;

fn filled(dims: &[usize]) -> Tensor<f32> {
    let n: usize = dims.iter().product();
    let data = (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    Tensor::new(dims, data).unwrap()
}

/// Multiply-adds of one forward pass: each of N * O * 28 * 28 outputs sums C * 3 * 3 products.
fn forward_flops() -> u64 {
    2 * (N * O * HW * HW * C * K * K) as u64
}

fn conv(c: &mut Criterion) {
    set_num_threads(1);
    let op: Op = Conv2d {
        padding: [1, 1],
        bias: true,
        ..Conv2d::default()
    }
    .into();
    let (x, w, b) = (filled(&[N, C, HW, HW]), filled(&[O, C, K, K]), filled(&[O]));
    let inputs = [&x, &w, &b];
    let seed = filled(&[N, O, HW, HW]);
    let mut group = c.benchmark_group("conv2d_32x16x28x28_32x3x3_1thread");
    group.sample_size(10);
    group.throughput(Throughput::Elements(forward_flops()));
    group.bench_function("forward", |bench| {
        bench.iter(|| black_box(op.forward(&inputs).unwrap()));
    });
    // The backward pass runs two products of the forward's size (input and weight gradients).
    group.throughput(Throughput::Elements(3 * forward_flops()));
    group.bench_function("forward_backward", |bench| {
        bench.iter(|| {
            let fwd = op.forward(&inputs).unwrap();
            let saved = Saved::keep(op.saves(), &inputs, &fwd, vec![true; 3]);
            black_box(op.vjp(&saved.context(), &seed).unwrap())
        });
    });
    // Each gradient alone, straight on the kernels (no op dispatch, no forward).
    let geo = Conv2dGeometry::new(
        "conv2d",
        [N, C, HW, HW],
        [O, C, K, K],
        [1, 1],
        [1, 1],
        [1, 1],
        1,
    )
    .unwrap();
    group.throughput(Throughput::Elements(forward_flops()));
    group.bench_function("grad_input", |bench| {
        bench.iter(|| black_box(conv2d_grad_input(&geo, &seed, &w).unwrap()));
    });
    group.bench_function("grad_weight", |bench| {
        bench.iter(|| black_box(conv2d_grad_weight(&geo, &seed, &x).unwrap()));
    });
    group.finish();

    let mut group = c.benchmark_group("sgemm_reference_1thread");
    group.sample_size(10);
    // The forward's GEMM shape: weight (32 x 144) by columns (144 x 784), once per sample.
    let (a, cols) = (filled(&[O, C * K * K]), filled(&[C * K * K, HW * HW]));
    group.throughput(Throughput::Elements(2 * (O * C * K * K * HW * HW) as u64));
    group.bench_function("32x144x784", |bench| {
        bench.iter(|| black_box(matmul(&a, &cols).unwrap()));
    });
    let sq = filled(&[512, 512]);
    group.throughput(Throughput::Elements(2 * 512u64.pow(3)));
    group.bench_function("512x512x512", |bench| {
        bench.iter(|| black_box(matmul(&sq, &sq).unwrap()));
    });
    group.finish();
}

criterion_group!(benches, conv);
criterion_main!(benches);
