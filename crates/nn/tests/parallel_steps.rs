//! A whole training step gives the same bits on 1 to 4 GEMM threads: loss, gradients and updated
//! parameters, on both backends, with dense and factored gradients. The layer sizes put the
//! step's products on both thread paths: products cut into bands over the threads, and products
//! too small to split, next to element loops and bias sums that split or not by their length.

use std::sync::{Mutex, MutexGuard};
use tapegrad_nn::data::{Batch, BatchTargets};
use tapegrad_nn::layers::Activation;
use tapegrad_nn::rng::dropout_rng;
use tapegrad_nn::{make_backend, BackendKind, Model, ModelSpec, Optimizer, OptimizerConfig};
use tapegrad_tensor::kernels::set_num_threads;
use tapegrad_tensor::{Scalar, Tensor};

/// The thread count is process-wide and the tests of this file run concurrently: each test that
/// sets it holds this lock, so a run meant for one thread count is not run on another's.
fn thread_count_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// 200-160-112-24 at 128 rows: 4.1M multiply-adds in the first layer's products and 2.3M in the
/// second's (cut into bands on 2+ threads, from 2^21), 0.34M in the last layer's (one thread),
/// and the last layer's 24-wide bias sums below any split.
const INPUTS: usize = 200;
const ROWS: usize = 128;

fn spec() -> ModelSpec {
    ModelSpec::Mlp {
        inputs: INPUTS,
        hidden: vec![160, 112],
        outputs: 24,
        activation: Activation::Relu,
        dropout: 0.0,
    }
}

/// Two steps from the same start on `threads` threads; returns the two losses' bits, then every
/// parameter's bits after the second step.
fn two_steps<S: Scalar>(kind: BackendKind, factored: bool, threads: usize) -> Vec<u64> {
    set_num_threads(threads);
    let mut model = Model::<S>::new(&spec(), 11).unwrap();
    let x: Vec<f64> = (0..ROWS * INPUTS)
        .map(|i| ((i * 7919) % 4001) as f64 / 2000.0 - 1.0)
        .collect();
    let batch = Batch {
        x: Tensor::from_f64(&[ROWS, INPUTS], &x).unwrap(),
        y: BatchTargets::Classes((0..ROWS).map(|i| (i * 5) % 24).collect()),
    };
    let config = OptimizerConfig::by_name("sgd", 0.05).unwrap();
    let mut optimizer = Optimizer::new(config, &model.params).unwrap();
    let mut backend = make_backend::<S>(kind).unwrap();
    backend.set_factored_grads(factored);
    let mut bits = Vec::new();
    for _ in 0..2 {
        let out = backend
            .train_step(&model, &batch, dropout_rng(0, 0))
            .unwrap();
        bits.push(out.loss.to_bits());
        optimizer
            .step_grads(&mut model.params, out.grads, 0.05)
            .unwrap();
    }
    for p in model.params.trainable() {
        bits.extend(p.value.data().iter().map(|v| v.to_f64().to_bits()));
    }
    set_num_threads(1);
    bits
}

fn same_on_every_thread_count<S: Scalar>() {
    let _turn = thread_count_lock();
    for kind in [BackendKind::Eager, BackendKind::Compiled] {
        for factored in [false, true] {
            let one = two_steps::<S>(kind, factored, 1);
            for threads in 2..=4 {
                let got = two_steps::<S>(kind, factored, threads);
                let first_difference = one.iter().zip(&got).position(|(a, b)| a != b);
                assert!(
                    got.len() == one.len() && first_difference.is_none(),
                    "{} backend, factored {factored}, {}: {threads} threads differ from 1 at {first_difference:?}",
                    kind.name(),
                    S::DTYPE,
                );
            }
        }
    }
}

#[test]
fn f32_training_steps_are_bit_identical_on_every_thread_count() {
    same_on_every_thread_count::<f32>();
}

#[test]
fn f64_training_steps_are_bit_identical_on_every_thread_count() {
    same_on_every_thread_count::<f64>();
}
