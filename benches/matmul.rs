//! f32 square matmul through `tapegrad::tensor::kernels::matmul` (the `gemm` crate underneath), at
//! 256, 512 and 1024, single-threaded. Throughput is reported in FLOP/s (2 n^3 per product).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use tapegrad::tensor::kernels::{matmul, set_num_threads};
use tapegrad::Tensor;

fn square(c: &mut Criterion) {
    set_num_threads(1);
    let mut group = c.benchmark_group("sgemm_1thread");
    group.sample_size(20);
    for n in [256usize, 512, 1024] {
        let data: Vec<f32> = (0..n * n)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let a = Tensor::new(&[n, n], data.clone()).unwrap();
        let b = Tensor::new(&[n, n], data).unwrap();
        group.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |bench, _| {
            bench.iter(|| black_box(matmul(&a, &b).unwrap()));
        });
    }
    group.finish();
}

criterion_group!(benches, square);
criterion_main!(benches);
