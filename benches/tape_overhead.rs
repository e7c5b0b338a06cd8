//! Tape overhead: a chain of 1,000 iterations of `x = x * 1.0001 + 0.0001` (2,000 recorded ops) on
//! 1- and 16-element f32 tensors, forward plus backward. Per-op time = reported time / 2,000.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use tapegrad::{Session, Tensor};

const ITERATIONS: usize = 1_000;

fn chain(c: &mut Criterion) {
    let mut group = c.benchmark_group("tape_chain_1000x(mul_add)");
    for numel in [1usize, 16] {
        group.throughput(Throughput::Elements(2 * ITERATIONS as u64));
        group.bench_with_input(BenchmarkId::from_parameter(numel), &numel, |b, &numel| {
            let x0 = Tensor::<f32>::full(&tapegrad::Shape::new([numel]).unwrap(), 1.0);
            let bias = Tensor::<f32>::scalar(0.0001);
            let mut s = Session::<f32>::new();
            b.iter(|| {
                s.reset();
                let mut x = s.parameter("x", x0.clone()).unwrap();
                let c = s.constant(bias.clone());
                for _ in 0..ITERATIONS {
                    let y = s.scale(x, 1.0001).unwrap();
                    x = s.add(y, c).unwrap();
                }
                let seed = Tensor::<f32>::full(s.value(x).unwrap().shape(), 1.0);
                black_box(s.backward_with(x, &seed).unwrap());
            });
        });
    }
    group.finish();
}

criterion_group!(benches, chain);
criterion_main!(benches);
