//! The exact (erf) GELU's slice kernels on f32, single-threaded: the value, the cotangent times
//! the slope (eager backward), and value and slope in one pass (the compiled backward's
//! recomputation). Throughput is in elements; the inputs span the range a GPT's MLP sees.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use tapegrad::tensor::kernels::gelu::{gelu_erf, gelu_erf_backward, gelu_erf_with_slope};
use tapegrad::tensor::kernels::set_num_threads;

const LEN: usize = 1 << 20;

fn gelu(c: &mut Criterion) {
    set_num_threads(1);
    let x: Vec<f32> = (0..LEN)
        .map(|i| ((i * 7919) % 10_000) as f32 / 1000.0 - 5.0)
        .collect();
    let g = vec![1.0f32; LEN];
    let (mut value, mut slope) = (vec![0.0f32; LEN], vec![0.0f32; LEN]);
    let mut group = c.benchmark_group("gelu_erf_f32_1thread");
    group.sample_size(30);
    group.throughput(Throughput::Elements(LEN as u64));
    group.bench_function("value", |b| b.iter(|| gelu_erf(black_box(&x), &mut value)));
    group.bench_function("backward", |b| {
        b.iter(|| gelu_erf_backward(black_box(&g), black_box(&x), &mut slope))
    });
    group.bench_function("value_and_slope", |b| {
        b.iter(|| gelu_erf_with_slope(black_box(&x), &mut value, &mut slope))
    });
    group.finish();
}

criterion_group!(benches, gelu);
criterion_main!(benches);
