//! layer_norm, batch_norm (training) and group_norm forward + backward (input, weight and bias
//! gradients) on f32, single-threaded: the normalisations' per-group sums (pairwise, for
//! accuracy) dominate. Throughput is in elements of the input.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use tapegrad::ops::nn::{BatchNorm, GroupNorm, LayerNorm};
use tapegrad::ops::Saved;
use tapegrad::tensor::kernels::set_num_threads;
use tapegrad::{Op, Tensor};

fn filled(dims: &[usize]) -> Tensor<f32> {
    let n: usize = dims.iter().product();
    let data = (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    Tensor::new(dims, data).unwrap()
}

fn forward_backward(c: &mut Criterion, name: &str, op: Op, x: &[usize], channels: usize) {
    let (x, w, b) = (filled(x), filled(&[channels]), filled(&[channels]));
    let inputs = [&x, &w, &b];
    let seed = filled(x.dims());
    let mut group = c.benchmark_group("norms_1thread");
    group.sample_size(20);
    group.throughput(Throughput::Elements(x.numel() as u64));
    group.bench_function(name, |bench| {
        bench.iter(|| {
            let fwd = op.forward(&inputs).unwrap();
            let saved = Saved::keep(op.saves(), &inputs, &fwd, vec![true; 3]);
            black_box(op.vjp(&saved.context(), &seed).unwrap())
        });
    });
    group.finish();
}

fn norms(c: &mut Criterion) {
    set_num_threads(1);
    let affine = |normalized_shape: Vec<usize>| -> Op {
        LayerNorm {
            normalized_shape,
            eps: 1e-5,
            weight: true,
            bias: true,
        }
        .into()
    };
    forward_backward(
        c,
        "layer_norm_64x4096",
        affine(vec![4096]),
        &[64, 4096],
        4096,
    );
    // The GPT preset's shape: batch 32 x context 64 rows of width 128.
    forward_backward(
        c,
        "layer_norm_2048x128",
        affine(vec![128]),
        &[2048, 128],
        128,
    );
    let batch: Op = BatchNorm {
        training: true,
        momentum: 0.1,
        eps: 1e-5,
        weight: true,
        bias: true,
    }
    .into();
    forward_backward(c, "batch_norm_16x64x16x16", batch, &[16, 64, 16, 16], 64);
    let group: Op = GroupNorm {
        num_groups: 8,
        eps: 1e-5,
        weight: true,
        bias: true,
    }
    .into();
    forward_backward(c, "group_norm_16x64x16x16", group, &[16, 64, 16, 16], 64);
}

criterion_group!(benches, norms);
criterion_main!(benches);
