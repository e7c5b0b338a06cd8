//! Laws on whole models (law 9 of `docs/design.md`): the MLP and the CNN as `Model::new` builds
//! them, tiny and in f64, with dropout, batch norm in training and in evaluation mode: law 1 on
//! the recorded tape, law 3 from intermediate activations of the lowered tape, law 4 on the
//! compiled graph, laws 5 and 6 along random directions, law 7 by the audit. The checkers are
//! `tapegrad_nn::verify`'s, which `--verify-every` runs on live steps; `check_model_laws` takes
//! any `Recorded` loss, so another model (a GPT recorded on a session) is one more call.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tapegrad_core::graph::CompiledGraph;
use tapegrad_nn::data::{Batch, BatchTargets};
use tapegrad_nn::layers::{Activation, Mode};
use tapegrad_nn::rng::dropout_rng;
use tapegrad_nn::verify::{
    directional, executed_reference, lowered_executed, saved_graph, zero_preserving, Recorded,
    TapeGraph,
};
use tapegrad_nn::{Model, ModelSpec};
use tapegrad_tensor::{Scalar, Tensor};

fn random(dims: &[usize], rng: &mut ChaCha8Rng) -> Tensor<f64> {
    let n = dims.iter().product();
    Tensor::new(dims, (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()).unwrap()
}

fn class_batch(rows: usize, width: usize, classes: usize, seed: u64) -> Batch<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let x = random(&[rows, width], &mut rng);
    let labels = (0..rows).map(|_| rng.random_range(0..classes)).collect();
    Batch {
        x,
        y: BatchTargets::Classes(labels),
    }
}

/// Which laws held, with the directional check's errors (asserted by the callers).
struct Outcome {
    adjoint_err: f64,
    derivative_err: f64,
    law3_slots: usize,
}

/// Laws 1, 3, 4, 5, 6 and 7 on `rec`; panics naming the law that failed.
fn check_model_laws<S: Scalar>(rec: &Recorded<S>, seed: u64) -> Outcome {
    zero_preserving(rec).unwrap_or_else(|f| panic!("{f}"));
    let executed = executed_reference(rec).unwrap_or_else(|f| panic!("{f}"));
    let tg = TapeGraph::new(rec).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // Law 3 from every op slot that requires grad: the model's intermediate activations, its
    // output and the loss.
    let requires = tg.graph.requires_grad();
    let n_in = tg.inputs.len();
    let mut law3_slots = 0;
    for slot in (n_in..tg.graph.slots()).filter(|&s| requires[s]) {
        let shape = tg.graph.shape(slot).unwrap().clone();
        let seed: Tensor<S> = random(shape.dims(), &mut rng).cast();
        lowered_executed(rec, &tg, slot, &seed).unwrap_or_else(|f| panic!("{f}"));
        law3_slots += 1;
    }
    // Law 4 with the loss's seed and with a random seed in every slot.
    let compiled = CompiledGraph::new(tg.graph.clone());
    let last = tg.graph.last_slot().unwrap();
    let loss_seed = tg.graph.single(last, &rec.seed().unwrap()).unwrap();
    let all_seeds: Vec<Tensor<S>> = tg
        .graph
        .shapes()
        .into_iter()
        .map(|s| random(s.dims(), &mut rng).cast())
        .collect();
    for seed in [loss_seed, all_seeds] {
        saved_graph(&compiled, &tg.inputs, seed, |s| format!("slot {s}"))
            .unwrap_or_else(|f| panic!("{f}"));
    }
    // Laws 5 and 6 along three directions.
    let (mut adjoint_err, mut derivative_err) = (0.0f64, 0.0f64);
    for _ in 0..3 {
        let (d, verdict) = directional(rec, &tg, &executed, &mut rng).unwrap();
        verdict.unwrap_or_else(|f| panic!("{f}"));
        adjoint_err = adjoint_err.max(d.adjoint_error());
        derivative_err = derivative_err.max(d.derivative_error());
    }
    Outcome {
        adjoint_err,
        derivative_err,
        law3_slots,
    }
}

fn mlp(activation: Activation, dropout: f64) -> ModelSpec {
    ModelSpec::Mlp {
        inputs: 5,
        hidden: vec![6, 4],
        outputs: 3,
        activation,
        dropout,
    }
}

fn cnn(batch_norm: bool, dropout: f64) -> ModelSpec {
    ModelSpec::Cnn {
        image: [2, 6, 6],
        channels: vec![3, 2],
        outputs: 3,
        batch_norm,
        dropout,
    }
}

fn record(spec: &ModelSpec, mode: Mode, seed: u64) -> Recorded<f64> {
    let model = Model::<f64>::new(spec, seed).unwrap();
    let batch = class_batch(4, spec.inputs(), spec.outputs(), seed + 100);
    Recorded::model(&model, &batch, mode, dropout_rng(seed, 3), 0.0).unwrap()
}

fn assert_laws(spec: &ModelSpec, mode: Mode) {
    for seed in 0..3 {
        let rec = record(spec, mode, seed);
        let out = check_model_laws(&rec, seed);
        // In f64 forward mode and the gradient agree to rounding, and central differences to
        // their truncation (h = 1e-5: about h^2).
        assert!(
            out.adjoint_err < 1e-12,
            "{spec:?}: law 5 error {}",
            out.adjoint_err
        );
        assert!(
            out.derivative_err < 1e-6,
            "{spec:?}: law 6 error {}",
            out.derivative_err
        );
        assert!(
            out.law3_slots >= 5,
            "{spec:?}: only {} law 3 slots",
            out.law3_slots
        );
    }
}

#[test]
fn mlp_with_tanh_and_dropout_keeps_every_law() {
    assert_laws(&mlp(Activation::Tanh, 0.3), Mode::Train);
}

#[test]
fn mlp_with_relu_keeps_every_law() {
    assert_laws(&mlp(Activation::Relu, 0.0), Mode::Train);
}

#[test]
fn mlp_in_evaluation_mode_keeps_every_law() {
    assert_laws(&mlp(Activation::Gelu, 0.3), Mode::Eval);
}

#[test]
fn cnn_with_batch_norm_in_training_and_dropout_keeps_every_law() {
    assert_laws(&cnn(true, 0.25), Mode::Train);
}

#[test]
fn cnn_with_batch_norm_in_evaluation_keeps_every_law() {
    assert_laws(&cnn(true, 0.25), Mode::Eval);
}

#[test]
fn cnn_without_batch_norm_keeps_every_law() {
    assert_laws(&cnn(false, 0.0), Mode::Train);
}

/// Dropout draws its masks from the step's stream, and the recorded graph carries them: the
/// same stream gives the same loss, another stream another one, and the check uses the first.
#[test]
fn the_recording_replays_the_steps_dropout_masks() {
    let spec = mlp(Activation::Tanh, 0.5);
    let a = record(&spec, Mode::Train, 1);
    let b = record(&spec, Mode::Train, 1);
    assert_eq!(a.loss_value().unwrap(), b.loss_value().unwrap());
    let model = Model::<f64>::new(&spec, 1).unwrap();
    let batch = class_batch(4, spec.inputs(), spec.outputs(), 101);
    let other = Recorded::model(&model, &batch, Mode::Train, dropout_rng(1, 4), 0.0).unwrap();
    assert_ne!(a.loss_value().unwrap(), other.loss_value().unwrap());
    // The graph made from the tape evaluates to the recorded loss, masks and all.
    let tg = TapeGraph::new(&a).unwrap();
    let values = tg.graph.eval(&tg.inputs).unwrap();
    assert_eq!(
        values.last().unwrap().item().unwrap(),
        a.loss_value().unwrap()
    );
}

/// Recording a training pass leaves the model's batch-norm running statistics alone (the
/// checks evaluate the loss many times; none of that may reach the run).
#[test]
fn recording_changes_no_running_statistics() {
    let spec = cnn(true, 0.0);
    let model = Model::<f64>::new(&spec, 2).unwrap();
    let before = model.clone();
    let batch = class_batch(4, spec.inputs(), spec.outputs(), 7);
    let rec = Recorded::model(&model, &batch, Mode::Train, dropout_rng(2, 0), 0.0).unwrap();
    check_model_laws(&rec, 2);
    for (p, q) in model.params.iter().zip(before.params.iter()) {
        assert_eq!(p.value.data(), q.value.data(), "{} changed", p.name);
    }
}
