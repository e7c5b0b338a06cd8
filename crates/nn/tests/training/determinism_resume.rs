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
        label_smoothing: 0.0,
        accumulate: 1,
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
        // Plain SGD without clipping: the trainer's factored gradients and fused GEMM update.
        TrainConfig {
            optimizer: plain_sgd(0.05),
            clip_norm: None,
            ..config(DataSource::Digits, "sgd", 0.05, 0.1, 5)
        },
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
    // The checkpoint keeps the label smoothing: the resumed steps smooth as the straight run's.
    resume_case::<f32>(
        TrainConfig {
            label_smoothing: 0.1,
            ..config(DataSource::Digits, "adam", 1e-3, 0.0, 16)
        },
        17,
        20,
    );
}

#[test]
fn label_smoothing_changes_the_run_and_is_checked() {
    let plain = config(DataSource::Digits, "adam", 1e-3, 0.0, 31);
    let smoothed = TrainConfig {
        label_smoothing: 0.1,
        ..plain.clone()
    };
    let (mut a, mut b) = (trainer::<f32>(&plain), trainer::<f32>(&smoothed));
    let (la, lb) = (a.train_step().unwrap().loss, b.train_step().unwrap().loss);
    // The same initial parameters and batch: smoothing adds (e / C) sum_c -lp_c - e (-lp_y).
    assert_ne!(la, lb, "label smoothing left the loss at {la}");
    steps(&mut a, 10);
    steps(&mut b, 10);
    assert_ne!(
        bits(&a),
        bits(&b),
        "label smoothing left the parameters as they were"
    );
    for (e, data, want) in [
        (1.5, DataSource::Digits, "between 0 and 1"),
        (f64::NAN, DataSource::Digits, "between 0 and 1"),
        (0.1, DataSource::AutoMpg, "classification"),
    ] {
        let cfg = TrainConfig {
            label_smoothing: e,
            ..config(data, "adam", 1e-3, 0.0, 32)
        };
        let prepared =
            Prepared::<f32>::new(&cfg.data.load().unwrap(), cfg.val_fraction, cfg.seed).unwrap();
        let err = Trainer::new(
            cfg,
            prepared,
            make_backend::<f32>(BackendKind::Eager).unwrap(),
        )
        .err()
        .expect("a bad label smoothing is an error")
        .to_string();
        assert!(
            err.contains("label smoothing") && err.contains(want),
            "{err}"
        );
    }
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
        // Plain SGD without clipping: factored first-layer gradients, applied by the fused GEMM
        // update (batches of 50 and the short last one), in both element types.
        (
            TrainConfig {
                optimizer: plain_sgd(0.05),
                clip_norm: None,
                ..config(DataSource::Digits, "sgd", 0.05, 0.1, 26)
            },
            false,
        ),
        (
            TrainConfig {
                optimizer: plain_sgd(0.05),
                clip_norm: None,
                ..config(DataSource::AutoMpg, "sgd", 0.05, 0.0, 27)
            },
            true,
        ),
        // Label smoothing: the loss run outside the compiled graph smooths the same way.
        (
            TrainConfig {
                label_smoothing: 0.2,
                ..config(DataSource::Digits, "adam", 1e-3, 0.1, 28)
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
        // Batch norm in training mode: the running statistics the compiled backend redoes from
        // its saved pass equal the eager tape's (`bits` covers the buffers), in both types.
        (
            TrainConfig {
                model: ModelSpec::Cnn {
                    image: [1, 8, 8],
                    channels: vec![4, 6],
                    outputs: 10,
                    batch_norm: true,
                    dropout: 0.1,
                },
                ..config(DataSource::Digits, "adam", 1e-3, 0.0, 29)
            },
            false,
        ),
        (
            TrainConfig {
                model: ModelSpec::Cnn {
                    image: [1, 8, 8],
                    channels: vec![3],
                    outputs: 10,
                    batch_norm: true,
                    dropout: 0.0,
                },
                ..config(DataSource::Digits, "sgd", 0.05, 0.0, 30)
            },
            true,
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
    sgd_run_checked::<S>(kind, rows, optimizer, factored, false)
}

/// [`sgd_run`], in anomaly mode when `anomaly`.
fn sgd_run_checked<S: Scalar>(
    kind: BackendKind,
    rows: usize,
    optimizer: OptimizerConfig,
    factored: bool,
    anomaly: bool,
) -> (Vec<Vec<u64>>, usize, Vec<Vec<u64>>) {
    use tapegrad_nn::data::{Batch, BatchTargets};
    use tapegrad_nn::{Grad, Optimizer};
    let spec = look_alike_mlp();
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
    backend.set_detect_anomaly(anomaly);
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

fn plain_sgd(lr: f64) -> OptimizerConfig {
    OptimizerConfig::Sgd {
        lr,
        momentum: 0.0,
        dampening: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    }
}

#[test]
fn factored_gradients_multiply_out_to_the_dense_ones_and_step_alike_on_both_backends() {
    fn check<S: Scalar>() {
        let plain = plain_sgd(0.05);
        let momentum = OptimizerConfig::by_name("sgd", 0.05).unwrap();
        let mut fused_by_backend = Vec::new();
        for kind in [BackendKind::Eager, BackendKind::Compiled] {
            // More than one row: plain SGD applies the factors as one GEMM into the weight.
            for (rows, optimizer) in [
                (1, plain),
                (1, momentum),
                (3, plain),
                (3, momentum),
                (40, plain),
            ] {
                let what = format!(
                    "{} {} {rows} rows {}",
                    S::DTYPE,
                    kind.name(),
                    optimizer.name()
                );
                let (dense, none, dense_first) = sgd_run::<S>(kind, rows, optimizer, false);
                let (fused, outer, fused_first) = sgd_run::<S>(kind, rows, optimizer, true);
                assert_eq!(none, 0, "{what}: factored gradients though not asked for");
                // The first layer's weight (it reads the batch) every step, no other.
                assert_eq!(outer, 6, "{what}");
                // Multiplied out with linear's own kernel: the dense gradient's bits.
                assert_eq!(fused_first, dense_first, "{what}: first gradients differ");
                // One row, or a rule that multiplies the factors out: the dense step's bits.
                // (More rows under plain SGD: the fused GEMM update, checked against the dense
                // step within its rounding bound in `fused_sgd_update_is_the_dense_step_within_rounding`.)
                if rows == 1 || optimizer != plain {
                    assert_eq!(fused, dense, "{what}: parameters differ");
                } else {
                    fused_by_backend.push((rows, fused.clone()));
                }
                let (start, _, _) = sgd_run::<S>(kind, rows, optimizer, false);
                assert_eq!(start, dense, "{what}: dense runs are not repeatable");
                let (again, _, _) = sgd_run::<S>(kind, rows, optimizer, true);
                assert_eq!(again, fused, "{what}: factored runs are not repeatable");
                // Anomaly mode checks the factored gradients but steps as without it.
                let (checked, outer, _) = sgd_run_checked::<S>(kind, rows, optimizer, true, true);
                assert_eq!(
                    (checked, outer),
                    (fused, 6),
                    "{what}: anomaly mode changed the run"
                );
            }
        }
        // The fused GEMM update takes the same path on both backends: the same bits.
        let (eager, compiled) = fused_by_backend.split_at(fused_by_backend.len() / 2);
        assert_eq!(eager.len(), 2);
        for ((rows, e), (_, c)) in eager.iter().zip(compiled) {
            assert!(
                e == c,
                "{} {rows} rows: eager and compiled fused steps differ",
                S::DTYPE
            );
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
        let first_weight: Vec<u64> = untouched
            .params
            .iter()
            .next()
            .unwrap()
            .value
            .data()
            .iter()
            .map(|v| v.to_f64().to_bits())
            .collect();
        for rows in [1, 3] {
            let (fused, _, _) = sgd_run::<S>(BackendKind::Eager, rows, plain, true);
            assert_ne!(
                fused[0], first_weight,
                "{rows} rows: the fused step left the first weight as it was"
            );
        }
    }
    check::<f32>();
    check::<f64>();
}

/// `gamma(n) = n u / (1 - n u)`, u the unit roundoff (half the machine epsilon): the relative
/// error bound of a sum whose terms each went through at most `n` roundings (Higham, Accuracy
/// and Stability of Numerical Algorithms, 3.1 and 3.5).
fn gamma<S: Scalar>(n: usize) -> f64 {
    let u = match S::DTYPE {
        tapegrad_tensor::DType::F32 => f32::EPSILON as f64 / 2.0,
        tapegrad_tensor::DType::F64 => f64::EPSILON / 2.0,
    };
    let nu = n as f64 * u;
    nu / (1.0 - nu)
}

/// Plain SGD applies a factored gradient of `B > 1` rows as one GEMM into the weight, which
/// rounds differently from the dense step `fl(p + fl(fl(-lr) * g))`; this checks the difference
/// against the bound below, on random shapes (around gemm's kernel paths: depth 2, one output
/// row or column, small and blocked products) and values, so a wrong transposition, sign or
/// scale fails by far.
///
/// The bound. Write `a = fl(-lr)` (both steps use it) and `t_b = rows[b, i] * cols[b, j]`. The
/// dense step computes `g = sum_b t_b` with every term rounded at most `B` times (its product and
/// up to `B - 1` additions, or fused multiply-adds), then rounds `a * g` and `p + a g`: each term
/// `a t_b` of `p + sum_b a t_b` reaches the result through at most `B + 2` roundings, `p` through
/// one. The fused step rounds each term at most `B + 2` times on every gemm 0.19 path too: the
/// blocked and small-product kernels sum a depth block of `k_1` terms (`k_1` roundings), store
/// `fma(a, acc, p)` (one; two where the store is not fused) and add the later blocks on top
/// (one each, with `k_1 + blocks - 1 <= B`); the depth-2 and vector kernels scale the rhs element
/// first (one) and fold each term in with a fused multiply-add (at most `B`); `p` itself goes
/// through at most `B` roundings. So both results are within `gamma(B + 2) * (|p| + |a| *
/// sum_b |t_b|)` of the exact `p + a sum_b t_b`, and within twice that of each other. The same
/// bound holds between the fused step and the exact value computed in f64 (exact for f32 factors;
/// for f64 the reference's own rounding is within the same `gamma(B + 2)` bound).
#[test]
fn fused_sgd_update_is_the_dense_step_within_rounding() {
    use rand::{Rng, SeedableRng};
    use tapegrad_nn::{Grad, Optimizer, ParamKind, ParamSet};
    use tapegrad_tensor::Tensor;
    fn check<S: Scalar>(rng: &mut rand_chacha::ChaCha8Rng) {
        // (B, out, in): depth 2 (gemm's gevv), one output row or column (its gemv), both sides
        // <= 64 with m * n <= 256 or not (small-product kernels), and the blocked kernel.
        let mut shapes = vec![
            (2, 7, 9),
            (5, 1, 33),
            (6, 40, 1),
            (9, 12, 20),
            (33, 64, 70),
            (70, 130, 90),
        ];
        for _ in 0..10 {
            shapes.push((
                rng.random_range(2..=80),
                rng.random_range(1..=150),
                rng.random_range(1..=150),
            ));
        }
        for (batch, out, inn) in shapes {
            let mut uniform = |n: usize| -> Vec<S> {
                (0..n)
                    .map(|_| S::from_f64(rng.random_range(-1.0..1.0)))
                    .collect()
            };
            let (p0, rows, cols) = (
                uniform(out * inn),
                uniform(batch * out),
                uniform(batch * inn),
            );
            let lr = rng.random_range(0.05..2.0);
            let what = format!("{} B {batch} out {out} in {inn} lr {lr}", S::DTYPE);
            let tensor = |dims: &[usize], v: &[S]| Tensor::new(dims, v.to_vec()).unwrap();
            let grad = Grad::Outer {
                rows: tensor(&[batch, out], &rows),
                cols: tensor(&[batch, inn], &cols),
            };
            let stepped = |grad: Option<Grad<S>>| -> Vec<S> {
                let mut params = ParamSet::new();
                params
                    .add("w", tensor(&[out, inn], &p0), ParamKind::Trainable)
                    .unwrap();
                let mut opt = Optimizer::new(plain_sgd(lr), &params).unwrap();
                match grad {
                    Some(g) => opt.step_grads(&mut params, vec![g], lr).unwrap(),
                    None => {
                        let dense = Grad::Outer {
                            rows: tensor(&[batch, out], &rows),
                            cols: tensor(&[batch, inn], &cols),
                        };
                        opt.step(&mut params, &[dense.into_dense().unwrap()], lr)
                            .unwrap()
                    }
                }
                let stepped = params.trainable().next().unwrap().value.data().to_vec();
                stepped
            };
            let fused = stepped(Some(grad));
            let dense = stepped(None);
            let a = S::from_f64(-lr).to_f64();
            let bound = 2.0 * gamma::<S>(batch + 2);
            let mut moved = 0;
            for i in 0..out {
                for j in 0..inn {
                    let e = i * inn + j;
                    let terms =
                        (0..batch).map(|b| rows[b * out + i].to_f64() * cols[b * inn + j].to_f64());
                    let magnitude: f64 = terms.clone().map(f64::abs).sum();
                    let exact = p0[e].to_f64() + a * terms.sum::<f64>();
                    let size = p0[e].to_f64().abs() + a.abs() * magnitude;
                    let (f, d) = (fused[e].to_f64(), dense[e].to_f64());
                    assert!(
                        (f - d).abs() <= bound * size,
                        "{what}: ({i}, {j}) fused {f} dense {d}"
                    );
                    assert!(
                        (f - exact).abs() <= bound * size,
                        "{what}: ({i}, {j}) fused {f} exact {exact}"
                    );
                    moved += usize::from(d != p0[e].to_f64());
                }
            }
            // The steps did something for the bound to be about.
            assert!(moved * 2 > out * inn, "{what}: {moved} elements moved");
        }
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    check::<f32>(&mut rng);
    check::<f64>(&mut rng);
}

/// Anomaly mode with factored gradients still finds a weight gradient that overflows, though the
/// tape never makes it: a zero first weight keeps the forward pass finite on a batch of huge
/// values, but the weight's gradient sums 40 rows of (large) cotangent times 3e38.
#[test]
fn anomaly_mode_finds_an_overflowing_factored_gradient() {
    use tapegrad_nn::data::{Batch, BatchTargets};
    use tapegrad_tensor::Tensor;
    let spec = look_alike_mlp();
    let mut model = Model::<f32>::new(&spec, 11).unwrap();
    let weights: Vec<(String, Vec<usize>)> = model
        .params
        .iter()
        .filter(|p| p.value.rank() == 2)
        .map(|p| (p.name.clone(), p.value.dims().to_vec()))
        .collect();
    assert_eq!(weights[0].1, [20, 20]);
    let first_bias = model.params.iter().find(|p| p.value.rank() == 1).unwrap();
    let first_bias = (first_bias.name.clone(), vec![20]);
    // A zero first weight, a small positive first bias (the relu passes it) and a large second
    // weight: every value finite, the first layer's cotangents large.
    let fills = [(&weights[0], 0.0), (&first_bias, 1e-3), (&weights[1], 50.0)];
    for ((name, dims), fill) in fills {
        let id = model.params.find(name).unwrap();
        let shape = tapegrad_tensor::Shape::new(dims.clone()).unwrap();
        model.params.set(id, Tensor::full(&shape, fill)).unwrap();
    }
    let batch = Batch {
        x: Tensor::full(&tapegrad_tensor::Shape::new([40, 20]).unwrap(), 3e38),
        y: BatchTargets::Classes(vec![0; 40]),
    };
    for kind in [BackendKind::Eager, BackendKind::Compiled] {
        let mut backend = make_backend::<f32>(kind).unwrap();
        backend.set_factored_grads(true);
        let step = |backend: &mut Box<dyn tapegrad_nn::Backend<f32>>| {
            backend.train_step(&model, &batch, tapegrad_nn::rng::dropout_rng(0, 0))
        };
        // Without the flag the step goes through; its first weight's gradient is infinite.
        let out = step(&mut backend).unwrap();
        let dense = tapegrad_nn::Grad::all_dense(out.grads).unwrap();
        assert!(
            dense[0].first_non_finite().is_some(),
            "{}: no overflow to find",
            kind.name()
        );
        assert!(dense[1..].iter().all(|g| g.first_non_finite().is_none()));
        backend.set_detect_anomaly(true);
        let err = step(&mut backend).unwrap_err().to_string();
        assert!(
            err.contains("anomaly") && err.contains("linear"),
            "{}: {err}",
            kind.name()
        );
    }
}

/// A 20-20-8-5 MLP: the batch (20 wide) feeds the first weight, and the second weight (8 x 20)
/// has 20 columns too, so it looks like one the batch could be multiplied by; the eager backend
/// must find out that it is not.
fn look_alike_mlp() -> ModelSpec {
    ModelSpec::Mlp {
        inputs: 20,
        hidden: vec![20, 8],
        outputs: 5,
        activation: Activation::Relu,
        dropout: 0.0,
    }
}
