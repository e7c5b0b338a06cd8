//! `--verify-every` on the trainer: every law holds on live steps of the MLP and the CNN (batch
//! norm, dropout) on both backends and both dtypes; verifying leaves the trained bits unchanged;
//! and a wrong VJP planted with core's test-only `fault-injection` feature stops the run with
//! an error naming the law, the step and the node (or, with warnings, is logged and passed).

use tapegrad_core::fault::plant_wrong_vjp;
use tapegrad_nn::data::{DataSource, Prepared};
use tapegrad_nn::layers::Activation;
use tapegrad_nn::verify::{Law, Verifier};
use tapegrad_nn::{
    make_backend, BackendKind, Decay, ModelSpec, NnError, OptimizerConfig, Schedule, TrainConfig,
    Trainer,
};
use tapegrad_tensor::Scalar;

fn config(model: ModelSpec, optimizer: &str, clip: Option<f64>) -> TrainConfig {
    TrainConfig {
        preset: "test".into(),
        data: DataSource::Digits,
        model,
        optimizer: OptimizerConfig::by_name(optimizer, 0.05).unwrap(),
        schedule: Schedule {
            warmup: 0,
            decay: Decay::Constant,
        },
        clip_norm: clip,
        batch_size: 16,
        val_fraction: 0.2,
        seed: 5,
        label_smoothing: 0.0,
        accumulate: 1,
    }
}

fn mlp() -> ModelSpec {
    ModelSpec::Mlp {
        inputs: 64,
        hidden: vec![24],
        outputs: 10,
        activation: Activation::Relu,
        dropout: 0.2,
    }
}

fn cnn() -> ModelSpec {
    ModelSpec::Cnn {
        image: [1, 8, 8],
        channels: vec![4],
        outputs: 10,
        batch_norm: true,
        dropout: 0.25,
    }
}

fn trainer<S: Scalar>(cfg: &TrainConfig, backend: BackendKind) -> Trainer<S> {
    let data = Prepared::<S>::new(&cfg.data.load().unwrap(), cfg.val_fraction, cfg.seed).unwrap();
    Trainer::new(cfg.clone(), data, make_backend::<S>(backend).unwrap()).unwrap()
}

/// Every parameter's and buffer's bits.
fn bits<S: Scalar>(t: &Trainer<S>) -> Vec<Vec<u64>> {
    t.model
        .params
        .iter()
        .map(|p| {
            p.value
                .data()
                .iter()
                .map(|v| v.to_f64().to_bits())
                .collect()
        })
        .collect()
}

/// Runs `steps` steps verifying every `every`-th; returns the bits and the verifier's counts.
fn run<S: Scalar>(cfg: &TrainConfig, backend: BackendKind, every: Option<u64>) -> Vec<Vec<u64>> {
    let mut t = trainer::<S>(cfg, backend);
    t.set_verify(every.map(|n| Verifier::new(n, false).unwrap()));
    for _ in 0..6 {
        t.train_step()
            .unwrap_or_else(|e| panic!("{cfg:?} {backend:?}: {e}"));
    }
    if let Some(n) = every {
        let s = t.verifier().unwrap().stats();
        let laws = if backend == BackendKind::Compiled {
            5
        } else {
            4
        };
        assert_eq!(s.steps, 6 / n);
        assert_eq!((s.checks, s.passed), (laws * s.steps, laws * s.steps));
        assert!(
            s.worst_rel_err < 1e-3,
            "worst relative error {}",
            s.worst_rel_err
        );
    }
    bits(&t)
}

#[test]
fn every_law_holds_on_live_steps_and_the_bits_are_unchanged() {
    // Plain SGD takes factored gradients; clipping and Adam take dense ones.
    for (model, optimizer, clip) in [
        (mlp(), "sgd", None),
        (mlp(), "adam", Some(1.0)),
        (cnn(), "sgd", None),
        (cnn(), "adamw", None),
    ] {
        let cfg = config(model, optimizer, clip);
        for backend in [BackendKind::Eager, BackendKind::Compiled] {
            let plain = run::<f32>(&cfg, backend, None);
            assert_eq!(
                plain,
                run::<f32>(&cfg, backend, Some(2)),
                "{cfg:?} {backend:?}"
            );
        }
        let plain = run::<f64>(&cfg, BackendKind::Compiled, None);
        assert_eq!(plain, run::<f64>(&cfg, BackendKind::Compiled, Some(3)));
    }
}

/// The failure a planted fault on `op` makes at the first verified step.
fn planted_failure(op: &str, factor: f64, backend: BackendKind, model: ModelSpec) -> NnError {
    let mut t = trainer::<f32>(&config(model, "sgd", None), backend);
    t.set_verify(Some(Verifier::new(2, false).unwrap()));
    t.train_step().expect("step 1 is not verified");
    let _fault = plant_wrong_vjp(op, factor);
    t.train_step()
        .expect_err("step 2 is verified and the vjp is wrong")
}

#[test]
fn a_wrong_vjp_fails_law_5_naming_the_step_and_the_node() {
    let NnError::Verify(f) = planted_failure("relu", 1.01, BackendKind::Eager, mlp()) else {
        panic!("not a verification failure");
    };
    assert_eq!(f.law, Law::Adjoint, "{f}");
    assert_eq!(f.step, Some(2));
    let node = f.node.clone().expect("the node is named");
    assert!(node.contains("(relu"), "{node}");
    assert!(node.contains("parameter 0.weight"), "{node}");
    let text = f.to_string();
    let head = "verify: law 5 (jvp = <grad, v>) failed at step 2 at node";
    assert!(text.starts_with(head), "{text}");
    // conv2d's VJP is the op's on every path of the compiled backend too.
    let NnError::Verify(f) = planted_failure("conv2d", 0.95, BackendKind::Compiled, cnn()) else {
        panic!("not a verification failure");
    };
    assert_eq!(f.law, Law::Adjoint, "{f}");
    assert!(f.node.as_deref().unwrap().contains("(conv2d"), "{f}");
}

/// The compiled backend applies relu's VJP in place (its own fast path), so a fault planted in
/// relu's op VJP makes the compiled step disagree with the eager sweep: law 4, naming the
/// parameter whose gradient differs.
#[test]
fn a_fast_path_that_disagrees_with_the_op_fails_law_4() {
    let NnError::Verify(f) = planted_failure("relu", 1.01, BackendKind::Compiled, mlp()) else {
        panic!("not a verification failure");
    };
    assert_eq!(f.law, Law::SavedGraph, "{f}");
    assert_eq!(f.step, Some(2));
    assert!(
        f.node.as_deref().unwrap().contains("parameter 0.weight"),
        "{f}"
    );
    assert!(
        f.message.contains("differs from the tape's executed sweep"),
        "{f}"
    );
}

#[test]
fn a_vjp_that_turns_zero_into_nan_fails_law_7_naming_the_node() {
    let e = planted_failure("max_pool2d", f64::NAN, BackendKind::Eager, cnn());
    let NnError::Verify(f) = e else {
        panic!("not a verification failure: {e}");
    };
    assert_eq!(f.law, Law::ZeroPreserving, "{f}");
    assert_eq!(f.step, Some(2));
    let node = f.node.clone().unwrap();
    assert!(node.contains("max_pool2d"), "{node}");
    assert!(f.message.contains("NaN"), "{f}");
}

#[test]
fn with_warnings_a_failure_is_reported_and_the_run_goes_on() {
    let mut t = trainer::<f32>(&config(mlp(), "sgd", None), BackendKind::Eager);
    t.set_verify(Some(Verifier::new(1, true).unwrap()));
    let _fault = plant_wrong_vjp("relu", 1.5);
    t.train_step().unwrap();
    let v = t.take_verification().unwrap();
    assert!(!v.passed());
    let json = v.to_json();
    assert_eq!(json["split"], "verify");
    assert_eq!(json["step"], 1);
    let failed: Vec<u64> = json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["passed"] == false)
        .map(|c| c["law"].as_u64().unwrap())
        .collect();
    assert_eq!(failed, [5]);
    t.train_step().unwrap();
    let s = t.verifier().unwrap().stats();
    assert_eq!((s.steps, s.checks, s.passed), (2, 8, 6));
}

#[test]
fn verify_every_zero_is_an_error() {
    assert!(Verifier::new(0, false).is_err());
}
