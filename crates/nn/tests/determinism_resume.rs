//! Determinism: one seed gives bit-identical parameters; N steps, save, resume, M steps ends with
//! the same bits (parameters, optimizer state, data position, file bytes) as N + M steps straight,
//! for several optimizers, with dropout active, in f32 and f64; the eager and compiled backends
//! give the same bits.

use tapegrad_nn::checkpoint::{self, Checkpoint};
use tapegrad_nn::data::{DataSource, Prepared};
use tapegrad_nn::layers::Activation;
use tapegrad_nn::{
    make_backend, BackendKind, Decay, Model, ModelSpec, OptimizerConfig, Schedule, TrainConfig,
    Trainer,
};
use tapegrad_tensor::Scalar;

fn config(data: DataSource, optimizer: &str, lr: f64, dropout: f64, seed: u64) -> TrainConfig {
    let (inputs, outputs) = match data {
        DataSource::Digits => (64, 10),
        _ => (7, 1),
    };
    TrainConfig {
        preset: "test".into(),
        data,
        model: ModelSpec::Mlp {
            inputs,
            hidden: vec![16],
            outputs,
            activation: Activation::Relu,
            dropout,
        },
        optimizer: OptimizerConfig::by_name(optimizer, lr).unwrap(),
        schedule: Schedule {
            warmup: 3,
            decay: Decay::Step {
                step_size: 7,
                gamma: 0.5,
            },
        },
        clip_norm: Some(1.0),
        batch_size: 50,
        val_fraction: 0.2,
        seed,
    }
}

fn trainer<S: Scalar>(cfg: &TrainConfig) -> Trainer<S> {
    let data = Prepared::<S>::new(&cfg.data.load().unwrap(), cfg.val_fraction, cfg.seed).unwrap();
    Trainer::new(
        cfg.clone(),
        data,
        make_backend::<S>(BackendKind::Eager).unwrap(),
    )
    .unwrap()
}

fn bits<S: Scalar>(t: &Trainer<S>) -> Vec<(String, Vec<u64>)> {
    t.model
        .params
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                p.value
                    .data()
                    .iter()
                    .map(|v| v.to_f64().to_bits())
                    .collect(),
            )
        })
        .collect()
}

fn steps<S: Scalar>(t: &mut Trainer<S>, n: usize) {
    for _ in 0..n {
        t.train_step().unwrap();
    }
}

#[test]
fn same_seed_gives_identical_bits_and_other_seeds_differ() {
    for cfg in [
        config(DataSource::Digits, "adam", 1e-3, 0.2, 5),
        config(DataSource::AutoMpg, "sgd", 0.05, 0.0, 5),
    ] {
        let mut a = trainer::<f32>(&cfg);
        let mut b = trainer::<f32>(&cfg);
        steps(&mut a, 40);
        steps(&mut b, 40);
        assert_eq!(bits(&a), bits(&b));
        let mut c = trainer::<f32>(&TrainConfig {
            seed: 6,
            ..cfg.clone()
        });
        steps(&mut c, 40);
        assert_ne!(
            bits(&a),
            bits(&c),
            "a different seed must give a different run"
        );
        // The parameters moved: the test would be vacuous if training did nothing.
        assert_ne!(bits(&a), bits(&trainer::<f32>(&cfg)));
    }
}

fn resume_case<S: Scalar>(cfg: TrainConfig, n: usize, m: usize) {
    let dir = tempdir();
    let mut first = trainer::<S>(&cfg);
    steps(&mut first, n);
    let saved = dir.join("n.safetensors");
    checkpoint::save(&saved, &first).unwrap();
    drop(first);
    let ckpt = Checkpoint::read(&saved).unwrap();
    let mut resumed: Trainer<S> = ckpt
        .resume(make_backend::<S>(BackendKind::Eager).unwrap())
        .unwrap();
    assert_eq!(resumed.step, n as u64);
    steps(&mut resumed, m);

    let mut straight = trainer::<S>(&cfg);
    steps(&mut straight, n + m);
    assert_eq!(
        bits(&resumed),
        bits(&straight),
        "{} {}: parameters differ",
        cfg.optimizer.name(),
        S::DTYPE
    );
    assert_eq!(
        resumed.optimizer, straight.optimizer,
        "optimizer state differs"
    );
    assert_eq!(resumed.order, straight.order, "data position differs");
    let (a, b) = (dir.join("a.safetensors"), dir.join("b.safetensors"));
    checkpoint::save(&a, &resumed).unwrap();
    checkpoint::save(&b, &straight).unwrap();
    assert_eq!(
        std::fs::read(&a).unwrap(),
        std::fs::read(&b).unwrap(),
        "checkpoint files differ"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn resume_equals_straight_run() {
    // Digits has 29 batches per epoch (1438 training rows / 50): 17 steps stop mid-epoch and 40
    // more cross the epoch boundary, the warm-up and several step decays; 29 stop exactly at the
    // boundary. Auto MPG has 7 batches per epoch.
    resume_case::<f32>(config(DataSource::Digits, "adam", 1e-3, 0.3, 11), 17, 40);
    resume_case::<f64>(config(DataSource::Digits, "adamw", 1e-3, 0.0, 12), 29, 31);
    resume_case::<f32>(config(DataSource::AutoMpg, "sgd", 0.05, 0.1, 13), 9, 20);
    resume_case::<f64>(config(DataSource::AutoMpg, "rmsprop", 1e-3, 0.0, 14), 6, 10);
    resume_case::<f32>(config(DataSource::AutoMpg, "adagrad", 0.05, 0.0, 15), 7, 8);
}

#[test]
fn resume_at_step_zero_is_a_fresh_run() {
    resume_case::<f32>(config(DataSource::AutoMpg, "adam", 1e-2, 0.0, 3), 0, 12);
}

#[test]
fn eager_and_compiled_backends_give_identical_bits() {
    for (cfg, dtype_f64) in [
        (config(DataSource::Digits, "adam", 1e-3, 0.3, 21), false),
        (config(DataSource::AutoMpg, "sgd", 0.05, 0.0, 22), true),
        (config(DataSource::AutoMpg, "rmsprop", 1e-3, 0.2, 23), false),
        // Batches of one take linear's outer-product weight gradient; plain SGD its vectorised
        // update; relu runs in place in the compiled backend.
        (
            TrainConfig {
                batch_size: 1,
                ..config(DataSource::Digits, "sgd", 0.05, 0.0, 24)
            },
            false,
        ),
        // Fewer rows than outputs: linear runs as the transposed product (W x^T)^T.
        (
            TrainConfig {
                batch_size: 8,
                model: ModelSpec::Mlp {
                    inputs: 64,
                    hidden: vec![40, 24],
                    outputs: 10,
                    activation: Activation::Relu,
                    dropout: 0.1,
                },
                ..config(DataSource::Digits, "sgd", 0.05, 0.0, 25)
            },
            false,
        ),
    ] {
        if dtype_f64 {
            compare_backends::<f64>(&cfg);
        } else {
            compare_backends::<f32>(&cfg);
        }
    }
}

fn compare_backends<S: Scalar>(cfg: &TrainConfig) {
    let mut eager = trainer::<S>(cfg);
    let mut compiled = trainer::<S>(cfg);
    compiled.set_backend(make_backend::<S>(BackendKind::Compiled).unwrap());
    // 35 steps cross an epoch end, so the short last batch gets its own compiled plan.
    for _ in 0..35 {
        let a = eager.train_step().unwrap();
        let b = compiled.train_step().unwrap();
        assert_eq!(
            a.loss.to_bits(),
            b.loss.to_bits(),
            "{}: losses differ",
            cfg.optimizer.name()
        );
    }
    assert_eq!(
        bits(&eager),
        bits(&compiled),
        "{}: parameters differ",
        cfg.optimizer.name()
    );
    assert_ne!(
        bits(&eager),
        bits(&trainer::<S>(cfg)),
        "training moved the parameters"
    );
    let a = eager.evaluate(tapegrad_nn::Which::Validation).unwrap();
    let b = compiled.evaluate(tapegrad_nn::Which::Validation).unwrap();
    assert_eq!(
        (a.loss.to_bits(), a.metric.to_bits()),
        (b.loss.to_bits(), b.metric.to_bits())
    );
}

fn tempdir() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "tapegrad-nn-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Parameter bits after `steps` steps of one batch of `rows` rows, gradients factored (and
/// applied by `step_grads`) or dense (and applied by `step`), with the number of factored
/// gradients the backend handed over and the first step's gradients, multiplied out.
fn sgd_run<S: Scalar>(
    kind: BackendKind,
    rows: usize,
    optimizer: OptimizerConfig,
    factored: bool,
) -> (Vec<Vec<u64>>, usize, Vec<Vec<u64>>) {
    use tapegrad_nn::data::{Batch, BatchTargets};
    use tapegrad_nn::{Grad, Optimizer};
    // The second weight is 8 x 20 too, so it looks like one the batch could be multiplied by;
    // the eager backend must find out that it is not.
    let spec = ModelSpec::Mlp {
        inputs: 20,
        hidden: vec![20, 8],
        outputs: 5,
        activation: Activation::Relu,
        dropout: 0.0,
    };
    let mut model = Model::<S>::new(&spec, 11).unwrap();
    // Zeros of both signs in the batch, so a product's sign of zero is checked too.
    let x: Vec<f64> = (0..rows * 20)
        .map(|i| match i % 9 {
            0 => 0.0,
            4 => -0.0,
            k => (k as f64 - 4.5) / 1.7,
        })
        .collect();
    let batch = Batch {
        x: tapegrad_tensor::Tensor::from_f64(&[rows, 20], &x).unwrap(),
        y: BatchTargets::Classes((0..rows).map(|i| (i * 3 + 1) % 5).collect()),
    };
    let mut backend = make_backend::<S>(kind).unwrap();
    backend.set_factored_grads(factored);
    let mut opt = Optimizer::new(optimizer, &model.params).unwrap();
    let bits =
        |t: &tapegrad_tensor::Tensor<S>| t.data().iter().map(|v| v.to_f64().to_bits()).collect();
    let (mut outer, mut first) = (0, Vec::new());
    for step in 0..6 {
        let out = backend
            .train_step(&model, &batch, tapegrad_nn::rng::dropout_rng(0, step))
            .unwrap();
        outer += out
            .grads
            .iter()
            .filter(|g| matches!(g, Grad::Outer { .. }))
            .count();
        if step == 0 {
            first = Grad::all_dense(out.grads.clone())
                .unwrap()
                .iter()
                .map(bits)
                .collect();
        }
        if factored {
            opt.step_grads(&mut model.params, out.grads, 0.05).unwrap();
        } else {
            let dense = Grad::all_dense(out.grads).unwrap();
            opt.step(&mut model.params, &dense, 0.05).unwrap();
        }
    }
    let params = model.params.iter().map(|p| bits(&p.value)).collect();
    (params, outer, first)
}

#[test]
fn factored_gradients_give_the_dense_steps_bits() {
    fn check<S: Scalar>() {
        let plain = OptimizerConfig::Sgd {
            lr: 0.05,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        };
        let momentum = OptimizerConfig::by_name("sgd", 0.05).unwrap();
        for kind in [BackendKind::Eager, BackendKind::Compiled] {
            for (rows, optimizer) in [(1, plain), (1, momentum), (3, plain)] {
                let what = format!("{} {rows} rows {}", kind.name(), optimizer.name());
                let (dense, none, dense_first) = sgd_run::<S>(kind, rows, optimizer, false);
                let (fused, outer, fused_first) = sgd_run::<S>(kind, rows, optimizer, true);
                assert_eq!(none, 0, "{what}: factored gradients though not asked for");
                // One row: the first layer's weight (it reads the batch) every step, no other.
                assert_eq!(outer, if rows == 1 { 6 } else { 0 }, "{what}");
                assert_eq!(fused_first, dense_first, "{what}: first gradients differ");
                assert_eq!(fused, dense, "{what}: parameters differ");
                let (start, _, _) = sgd_run::<S>(kind, rows, optimizer, false);
                assert_eq!(start, dense, "{what}: runs are not repeatable");
            }
        }
        // The fused steps moved the first weight.
        let untouched = Model::<S>::new(
            &ModelSpec::Mlp {
                inputs: 20,
                hidden: vec![20, 8],
                outputs: 5,
                activation: Activation::Relu,
                dropout: 0.0,
            },
            11,
        )
        .unwrap();
        let (fused, _, _) = sgd_run::<S>(BackendKind::Eager, 1, plain, true);
        assert_ne!(
            fused[0],
            untouched
                .params
                .iter()
                .next()
                .unwrap()
                .value
                .data()
                .iter()
                .map(|v| v.to_f64().to_bits())
                .collect::<Vec<_>>(),
            "the fused step left the first weight as it was"
        );
    }
    check::<f32>();
    check::<f64>();
}
