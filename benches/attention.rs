//! Causal scaled dot-product attention at the `train gpt` preset's shape (batch 32, 4 heads,
//! 64 positions, head width 32) on f32, single-threaded: the forward alone, and forward plus
//! VJP (which recomputes the weights); and `qkv_attention`, the GPT layer's form, on the packed
//! `[32, 64, 384]` projection. Throughput is in attention weights (scores) per call. Then one
//! head's products on their own: `gemm` against `head_product`, whole and causal.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use tapegrad::ops::nn::{QkvAttention, ScaledDotProductAttention};
use tapegrad::ops::Saved;
use tapegrad::tensor::kernels::head_product::{head_product, Extent};
use tapegrad::tensor::kernels::set_num_threads;
use tapegrad::Scalar;
use tapegrad::{Op, Tensor};

const DIMS: [usize; 4] = [32, 4, 64, 32];

fn filled(dims: &[usize], salt: usize) -> Tensor<f32> {
    let n: usize = dims.iter().product();
    let data = (0..n)
        .map(|i| (((i + salt) * 7919) % 1000) as f32 / 250.0 - 2.0)
        .collect();
    Tensor::new(dims, data).unwrap()
}

fn attention(c: &mut Criterion) {
    set_num_threads(1);
    let op: Op = ScaledDotProductAttention {
        is_causal: true,
        ..Default::default()
    }
    .into();
    let (q, k, v) = (filled(&DIMS, 0), filled(&DIMS, 1), filled(&DIMS, 2));
    let inputs = [&q, &k, &v];
    let seed = filled(&DIMS, 3);
    let scores = (DIMS[0] * DIMS[1] * DIMS[2] * DIMS[2]) as u64;
    let mut group = c.benchmark_group("causal_attention_f32_1thread");
    group.sample_size(30);
    group.throughput(Throughput::Elements(scores));
    group.bench_function("forward", |b| {
        b.iter(|| black_box(op.forward(&inputs).unwrap()))
    });
    group.bench_function("forward_and_vjp", |b| {
        b.iter(|| {
            let fwd = op.forward(&inputs).unwrap();
            let saved = Saved::keep(op.saves(), &inputs, &fwd, vec![true; 3]);
            black_box(op.vjp(&saved.context(), &seed).unwrap())
        })
    });
    let packed: Op = QkvAttention {
        heads: DIMS[1],
        is_causal: true,
        ..Default::default()
    }
    .into();
    let width = DIMS[1] * DIMS[3];
    let qkv = filled(&[DIMS[0], DIMS[2], 3 * width], 0);
    let packed_seed = filled(&[DIMS[0], DIMS[2], width], 3);
    group.bench_function("qkv_forward_and_vjp", |b| {
        b.iter(|| {
            let fwd = packed.forward(&[&qkv]).unwrap();
            let saved = Saved::keep(packed.saves(), &[&qkv], &fwd, vec![true]);
            black_box(packed.vjp(&saved.context(), &packed_seed).unwrap())
        })
    });
    group.finish();
}

/// One head's two kinds of product at the preset's shape (64 positions, head width 32): the
/// scores `q k^T` (64 x 64 x 32, `k` given transposed to `head_product`) and weights times
/// values (64 x 32 x 64).
fn head_products(c: &mut Criterion) {
    let (t, d) = (DIMS[2], DIMS[3]);
    let (q, k) = (filled(&[t, d], 0), filled(&[t, d], 1));
    let kt = filled(&[d, t], 1);
    let (w, v) = (filled(&[t, t], 2), filled(&[t, d], 3));
    let mut scores = vec![0.0f32; t * t];
    let mut out = vec![0.0f32; t * d];
    let mut group = c.benchmark_group("one_head_f32");
    group.bench_function("scores_gemm", |b| {
        b.iter(|| {
            f32::gemm(
                t,
                t,
                d,
                &mut scores,
                t,
                q.data(),
                d,
                1,
                k.data(),
                1,
                d,
                false,
                1.0,
                1,
            );
            black_box(&scores);
        })
    });
    for (name, extent) in [("full", Extent::Full), ("causal", Extent::LowerColumns)] {
        group.bench_function(format!("scores_head_product_{name}"), |b| {
            b.iter(|| {
                head_product(&mut scores, (t, t, d), (q.data(), d, 1), kt.data(), extent);
                black_box(&scores);
            })
        });
    }
    group.bench_function("weights_times_gemm", |b| {
        b.iter(|| {
            f32::gemm(
                t,
                d,
                t,
                &mut out,
                d,
                w.data(),
                t,
                1,
                v.data(),
                d,
                1,
                false,
                1.0,
                1,
            );
            black_box(&out);
        })
    });
    for (name, extent) in [("full", Extent::Full), ("causal", Extent::LowerWeights)] {
        group.bench_function(format!("weights_times_head_product_{name}"), |b| {
            b.iter(|| {
                head_product(&mut out, (t, d, t), (w.data(), t, 1), v.data(), extent);
                black_box(&out);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, attention, head_products);
criterion_main!(benches);
