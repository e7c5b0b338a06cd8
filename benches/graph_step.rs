//! One training step (forward + backward) of an MLP 784-256-128-10 with cross entropy, f32, at
//! batch 1 and 64: the eager tape (`Tape::apply` per op, then `backward_all`) against the compiled
//! graph (`CompiledGraph::forward`, then the inputs-only `backward` that frees as it goes). Before
//! timing, prints the bytes each keeps for backward after the forward pass.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::hint::black_box;
use std::sync::Arc;
use tapegrad::core::graph::{tape_kept_bytes, CompiledGraph, Graph};
use tapegrad::ops::activation::Relu;
use tapegrad::ops::linalg::Linear;
use tapegrad::ops::{ActivationOp, LinalgOp, LossOp, Op, Reduction};
use tapegrad::{Shape, Tape, Tensor};

const LAYERS: [usize; 4] = [784, 256, 128, 10];

struct Mlp {
    graph: Graph,
    inputs: Vec<Tensor<f32>>,
    ops: Vec<(Op, Vec<usize>)>,
    requires_grad: Vec<bool>,
}

fn random(rng: &mut ChaCha8Rng, dims: &[usize], scale: f32) -> Tensor<f32> {
    let n = dims.iter().product();
    Tensor::new(
        dims,
        (0..n).map(|_| rng.random_range(-scale..scale)).collect(),
    )
    .unwrap()
}

fn mlp(batch: usize) -> Mlp {
    let mut rng = ChaCha8Rng::seed_from_u64(batch as u64);
    let mut g = Graph::new();
    let mut inputs = vec![random(&mut rng, &[batch, LAYERS[0]], 1.0)];
    let mut requires_grad = vec![false];
    g.input("x", Shape::new([batch, LAYERS[0]]).unwrap(), false)
        .unwrap();
    for (l, w) in LAYERS.windows(2).enumerate() {
        let bound = 1.0 / (w[0] as f32).sqrt();
        g.input(format!("w{l}"), Shape::new([w[1], w[0]]).unwrap(), true)
            .unwrap();
        g.input(format!("b{l}"), Shape::new([w[1]]).unwrap(), true)
            .unwrap();
        inputs.push(random(&mut rng, &[w[1], w[0]], bound));
        inputs.push(random(&mut rng, &[w[1]], bound));
        requires_grad.extend([true, true]);
    }
    let targets = Arc::new((0..batch).map(|_| rng.random_range(0..10)).collect());
    let linear = Op::Linalg(LinalgOp::Linear(Linear { bias: true }));
    let relu = Op::Activation(ActivationOp::Relu(Relu));
    let loss = Op::Loss(LossOp::cross_entropy(targets, Reduction::Mean));
    let ops = vec![
        (linear.clone(), vec![0, 1, 2]),
        (relu.clone(), vec![7]),
        (linear.clone(), vec![8, 3, 4]),
        (relu, vec![9]),
        (linear, vec![10, 5, 6]),
        (loss, vec![11]),
    ];
    for (op, args) in &ops {
        g.push(op.clone(), args).unwrap();
    }
    Mlp {
        graph: g,
        inputs,
        ops,
        requires_grad,
    }
}

/// The eager forward: one leaf per input, one `apply` per op.
fn eager_forward(m: &Mlp) -> Tape<f32> {
    let mut tape = Tape::with_capacity(m.graph.slots());
    for (x, &rg) in m.inputs.iter().zip(&m.requires_grad) {
        tape.leaf(x.clone(), rg);
    }
    for (op, args) in &m.ops {
        tape.apply(op.clone(), args).unwrap();
    }
    tape
}

fn report_memory() {
    for batch in [1, 64] {
        let m = mlp(batch);
        let tape = eager_forward(&m);
        let saved = CompiledGraph::new(m.graph.clone())
            .forward(&m.inputs)
            .unwrap();
        let params: usize = m.inputs[1..].iter().map(|t| t.nbytes()).sum();
        println!(
            "mlp 784-256-128-10 f32 batch {batch}: kept after forward: eager tape {} bytes, saved graph {} bytes (parameters {} bytes, input batch {} bytes)",
            tape_kept_bytes(&tape),
            saved.kept_bytes(),
            params,
            m.inputs[0].nbytes()
        );
    }
}

fn step(c: &mut Criterion) {
    report_memory();
    let mut group = c.benchmark_group("mlp_784_256_128_10_f32_step");
    group.sample_size(30);
    for batch in [1usize, 64] {
        let m = mlp(batch);
        let loss = m.graph.last_slot().unwrap();
        let seed = Tensor::<f32>::ones(&Shape::scalar());
        group.bench_with_input(BenchmarkId::new("eager", batch), &m, |b, m| {
            b.iter(|| {
                let tape = eager_forward(m);
                black_box(tape.backward_all(loss, &seed).unwrap());
            });
        });
        let compiled = CompiledGraph::new(m.graph.clone());
        group.bench_with_input(BenchmarkId::new("compiled", batch), &m, |b, m| {
            b.iter(|| {
                let saved = compiled.forward(&m.inputs).unwrap();
                black_box(saved.backward(&seed).unwrap());
            });
        });
    }
    group.finish();
}

criterion_group!(benches, step);
criterion_main!(benches);
