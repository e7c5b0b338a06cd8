//! A whole MLP training step on two threads gives the bits of one thread (loss, every gradient,
//! the parameters after two steps), on both backends, with dense and factored gradients: for a
//! model whose hidden layers run their input and weight gradients side by side as two jobs
//! (`linear_grads`), and for models where no layer does (products too small for a hand-off, and
//! products cut into bands over both threads because their depths are too far apart). Each case
//! first checks that its layers take the path it is meant to cover.

use std::sync::{Mutex, MutexGuard};
use tapegrad_nn::data::{Batch, BatchTargets};
use tapegrad_nn::layers::Activation;
use tapegrad_nn::rng::dropout_rng;
use tapegrad_nn::{make_backend, BackendKind, Model, ModelSpec, Optimizer, OptimizerConfig};
use tapegrad_tensor::kernels::linear::grads_side_by_side;
use tapegrad_tensor::kernels::set_num_threads;
use tapegrad_tensor::{Scalar, Tensor};

/// The thread count is process-wide and the tests of this file run concurrently: each test that
/// sets it holds this lock, so a run meant for one thread count is not run on another's.
fn thread_count_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An MLP's widths (inputs, hidden..., outputs) and the batch's rows.
struct Net {
    widths: &'static [usize],
    rows: usize,
}

impl Net {
    fn spec(&self) -> ModelSpec {
        let n = self.widths.len();
        ModelSpec::Mlp {
            inputs: self.widths[0],
            hidden: self.widths[1..n - 1].to_vec(),
            outputs: self.widths[n - 1],
            activation: Activation::Relu,
            dropout: 0.0,
        }
    }

    /// For each layer past the first (the first needs no input gradient), whether two threads
    /// run its two gradients side by side.
    fn side_by_side(&self) -> Vec<bool> {
        set_num_threads(2);
        let paths = self
            .widths
            .windows(2)
            .skip(1)
            .map(|w| grads_side_by_side(self.rows, w[1], w[0]))
            .collect();
        set_num_threads(1);
        paths
    }
}

/// Two steps of plain SGD from the same start on `threads` threads: the bits of each step's loss
/// and gradients, then of every parameter after the second step.
fn two_steps<S: Scalar>(net: &Net, kind: BackendKind, factored: bool, threads: usize) -> Vec<u64> {
    set_num_threads(threads);
    let inputs = net.widths[0];
    let classes = net.widths[net.widths.len() - 1];
    let mut model = Model::<S>::new(&net.spec(), 5).unwrap();
    let x: Vec<f64> = (0..net.rows * inputs)
        .map(|i| ((i * 7919) % 4001) as f64 / 2000.0 - 1.0)
        .collect();
    let batch = Batch {
        x: Tensor::from_f64(&[net.rows, inputs], &x).unwrap(),
        y: BatchTargets::Classes((0..net.rows).map(|i| (i * 5) % classes).collect()),
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
        for g in &out.grads {
            let dense = g.clone().into_dense().unwrap();
            bits.extend(dense.data().iter().map(|v| v.to_f64().to_bits()));
        }
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

fn two_threads_match_one<S: Scalar>(net: &Net) {
    for kind in [BackendKind::Eager, BackendKind::Compiled] {
        for factored in [false, true] {
            let one = two_steps::<S>(net, kind, factored, 1);
            let two = two_steps::<S>(net, kind, factored, 2);
            let first_difference = one.iter().zip(&two).position(|(a, b)| a != b);
            assert!(
                two.len() == one.len() && first_difference.is_none(),
                "{:?} at {} rows, {} backend, factored {factored}, {}: 2 threads differ from 1 at {first_difference:?}",
                net.widths,
                net.rows,
                kind.name(),
                S::DTYPE,
            );
        }
    }
}

/// 96-160-112-48 at 64 rows: the second layer's gradients are 1.1M multiply-adds each, the last
/// layer's 0.34M: above the hand-off, too few to cut into bands.
const SIDE_BY_SIDE: Net = Net {
    widths: &[96, 160, 112, 48],
    rows: 64,
};

/// 40-48-10 at 8 rows: 3.8k multiply-adds per gradient of the last layer, below the hand-off.
const TOO_SMALL: Net = Net {
    widths: &[40, 48, 10],
    rows: 8,
};

/// 64-640-16 at 256 rows: 2.6M multiply-adds per gradient of the last layer, enough to cut into
/// bands, with depths 16 (input gradient) and 256 (weight gradient): cut into bands over both
/// threads instead.
const BANDS: Net = Net {
    widths: &[64, 640, 16],
    rows: 256,
};

#[test]
fn a_step_with_gradients_side_by_side_has_the_bits_of_one_thread() {
    let _turn = thread_count_lock();
    assert_eq!(SIDE_BY_SIDE.side_by_side(), vec![true, true]);
    two_threads_match_one::<f32>(&SIDE_BY_SIDE);
    two_threads_match_one::<f64>(&SIDE_BY_SIDE);
}

#[test]
fn steps_without_gradients_side_by_side_have_the_bits_of_one_thread() {
    let _turn = thread_count_lock();
    for net in [TOO_SMALL, BANDS] {
        assert_eq!(net.side_by_side(), vec![false], "{:?}", net.widths);
        two_threads_match_one::<f32>(&net);
        two_threads_match_one::<f64>(&net);
    }
}
