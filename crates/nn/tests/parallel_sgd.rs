//! SGD spreads one step's element loops over the GEMM threads, cutting tensors wherever a
//! thread's run ends: on tensors of ragged sizes (one past the split threshold, some tiny, one
//! empty, a buffer in between that is not trained), every configuration (plain, weight decay,
//! momentum with and without Nesterov and dampening) gives the bits of the scalar formula, applied
//! tensor by tensor, on 1 to 4 threads, over steps that create and then reuse the momentum buffer;
//! plain SGD's fused update by factored gradients gives the same bits on every thread count.

use std::sync::{Mutex, MutexGuard};
use tapegrad_nn::params::ParamKind;
use tapegrad_nn::{Grad, Optimizer, OptimizerConfig, ParamSet};
use tapegrad_tensor::kernels::set_num_threads;
use tapegrad_tensor::Tensor;

/// The thread count is process-wide and the tests of this file run concurrently: each test that
/// sets it holds this lock, so a run meant for one thread count is not run on another's.
fn thread_count_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

const LENS: [usize; 6] = [70_001, 5, 0, 33_000, 1, 4_099];

fn value(i: usize, salt: usize) -> f32 {
    ((i * 2654435761 + salt * 97) % 2001) as f32 / 1000.0 - 1.0
}

fn params() -> ParamSet<f32> {
    let mut set = ParamSet::new();
    for (t, &len) in LENS.iter().enumerate() {
        let v = Tensor::new(&[len], (0..len).map(|i| value(i, t)).collect()).unwrap();
        set.add(format!("p{t}"), v, ParamKind::Trainable).unwrap();
        if t == 2 {
            let frozen = Tensor::new(&[3], vec![1.0, 2.0, 3.0]).unwrap();
            set.add("frozen", frozen, ParamKind::Buffer).unwrap();
        }
    }
    set
}

fn grads(step: usize) -> Vec<Tensor<f32>> {
    LENS.iter()
        .enumerate()
        .map(|(t, &len)| {
            let g = (0..len).map(|i| value(i, 10 * step + t) * 0.5).collect();
            Tensor::new(&[len], g).unwrap()
        })
        .collect()
}

/// PyTorch's single-tensor SGD, element by element.
fn reference(config: OptimizerConfig, steps: usize) -> Vec<Vec<f32>> {
    let OptimizerConfig::Sgd {
        lr,
        momentum,
        dampening,
        nesterov,
        weight_decay,
    } = config
    else {
        unreachable!()
    };
    let (neg_lr, wd, m, keep) = (
        -lr as f32,
        weight_decay as f32,
        momentum as f32,
        (1.0 - dampening) as f32,
    );
    let mut ps: Vec<Vec<f32>> = LENS
        .iter()
        .enumerate()
        .map(|(t, &len)| (0..len).map(|i| value(i, t)).collect())
        .collect();
    let mut bufs: Vec<Vec<f32>> = LENS.iter().map(|&len| vec![0.0; len]).collect();
    for step in 0..steps {
        for ((p, b), g) in ps.iter_mut().zip(&mut bufs).zip(grads(step)) {
            for ((p, b), &g) in p.iter_mut().zip(b.iter_mut()).zip(g.data()) {
                let g = if weight_decay != 0.0 { g + wd * *p } else { g };
                let d = if momentum == 0.0 {
                    g
                } else {
                    *b = if step == 0 { g } else { *b * m + keep * g };
                    if nesterov {
                        g + m * *b
                    } else {
                        *b
                    }
                };
                *p += neg_lr * d;
            }
        }
    }
    ps
}

#[test]
fn sgd_gives_the_formula_bits_on_every_thread_count() {
    let _threads = thread_count_lock();
    let sgd = |momentum, dampening, nesterov, weight_decay| OptimizerConfig::Sgd {
        lr: 0.05,
        momentum,
        dampening,
        nesterov,
        weight_decay,
    };
    let configs = [
        sgd(0.0, 0.0, false, 0.0),
        sgd(0.0, 0.0, false, 0.01),
        sgd(0.9, 0.0, false, 0.0),
        sgd(0.9, 0.1, false, 0.01),
        sgd(0.9, 0.0, true, 0.01),
    ];
    for config in configs {
        let want = reference(config, 3);
        for threads in 1..=4 {
            set_num_threads(threads);
            let mut set = params();
            let mut opt = Optimizer::new(config, &set).unwrap();
            for step in 0..3 {
                opt.step(&mut set, &grads(step), config.lr()).unwrap();
            }
            let got: Vec<&Tensor<f32>> = set.trainable().map(|p| &p.value).collect();
            for (t, (got, want)) in got.iter().zip(&want).enumerate() {
                let same = got
                    .data()
                    .iter()
                    .zip(want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same && got.numel() == want.len(),
                    "{config:?} on {threads} threads: tensor {t} differs from the formula"
                );
            }
            let frozen = set.iter().find(|p| p.name == "frozen").unwrap();
            assert_eq!(
                frozen.value.data(),
                &[1.0, 2.0, 3.0],
                "buffers are not trained"
            );
        }
    }
    set_num_threads(1);
}

#[test]
fn a_wrong_gradient_shape_changes_no_tensor() {
    let mut set = params();
    let before: Vec<Vec<f32>> = set.trainable().map(|p| p.value.data().to_vec()).collect();
    let config = OptimizerConfig::Sgd {
        lr: 0.1,
        momentum: 0.0,
        dampening: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    };
    let mut opt = Optimizer::new(config, &set).unwrap();
    let mut g = grads(0);
    g[4] = Tensor::new(&[2], vec![1.0, 1.0]).unwrap();
    let err = opt.step(&mut set, &g, 0.1).unwrap_err().to_string();
    assert!(err.contains("optimizer"), "{err}");
    let after: Vec<Vec<f32>> = set.trainable().map(|p| p.value.data().to_vec()).collect();
    assert!(after == before, "no tensor changed");
    assert_eq!(opt.steps(), 0, "the failed step is not counted");
}

/// A factored gradient `rows^T cols` of `(batch, out)` and `(batch, in)` factors for an
/// `(out, in)` parameter.
fn factored(batch: usize, out: usize, inn: usize, salt: usize) -> Grad<f32> {
    let t = |rows: usize, cols: usize, salt: usize| {
        let v = (0..rows * cols).map(|i| value(i, salt)).collect();
        Tensor::new(&[rows, cols], v).unwrap()
    };
    Grad::Outer {
        rows: t(batch, out, salt),
        cols: t(batch, inn, salt + 1),
    }
}

#[test]
fn fused_factored_update_gives_the_same_bits_on_every_thread_count() {
    let _threads = thread_count_lock();
    // The MLP's first layer at batch 32 (a product large enough to be cut into bands on 2 or
    // more threads), next to a dense gradient, a one-row factored one, and a one-row factored
    // one large enough for its outer-product update to be cut into bands of rows.
    let config = OptimizerConfig::Sgd {
        lr: 0.05,
        momentum: 0.0,
        dampening: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    };
    let run = |threads: usize| -> Vec<Vec<u32>> {
        set_num_threads(threads);
        let mut set = ParamSet::new();
        let shapes = [
            ("w1", [256, 784]),
            ("w2", [10, 40]),
            ("w3", [16, 9]),
            ("w4", [1024, 1030]),
        ];
        for (name, dims) in shapes {
            let v = (0..dims[0] * dims[1]).map(|i| value(i, 3)).collect();
            set.add(name, Tensor::new(&dims, v).unwrap(), ParamKind::Trainable)
                .unwrap();
        }
        let mut opt = Optimizer::new(config, &set).unwrap();
        for step in 0..2 {
            let dense = Tensor::new(&[10, 40], (0..400).map(|i| value(i, step)).collect());
            let grads = vec![
                factored(32, 256, 784, step),
                Grad::Dense(dense.unwrap()),
                factored(1, 16, 9, step),
                factored(1, 1024, 1030, step),
            ];
            opt.step_grads(&mut set, grads, 0.05).unwrap();
        }
        set.trainable()
            .map(|p| p.value.data().iter().map(|v| v.to_bits()).collect())
            .collect()
    };
    let one = run(1);
    for threads in 2..=4 {
        assert!(run(threads) == one, "{threads} threads differ from one");
    }
    set_num_threads(1);
}

#[test]
fn a_factored_gradient_of_the_wrong_shape_changes_no_tensor() {
    let plain = OptimizerConfig::Sgd {
        lr: 0.1,
        momentum: 0.0,
        dampening: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    };
    for config in [plain, OptimizerConfig::by_name("adam", 0.1).unwrap()] {
        for (bad, says) in [
            // Its product is 5 x 9, the parameter 16 x 9.
            (factored(4, 5, 9, 0), "[16, 9]"),
            // Factors with 4 and 3 rows have no product.
            (
                Grad::Outer {
                    rows: Tensor::new(&[4, 16], vec![1.0; 64]).unwrap(),
                    cols: Tensor::new(&[3, 9], vec![1.0; 27]).unwrap(),
                },
                "[3, 9]",
            ),
        ] {
            let mut set = ParamSet::new();
            for (name, dims) in [("a", [8, 8]), ("w", [16, 9])] {
                let v = (0..dims[0] * dims[1]).map(|i| value(i, 5)).collect();
                set.add(name, Tensor::new(&dims, v).unwrap(), ParamKind::Trainable)
                    .unwrap();
            }
            let before: Vec<Vec<f32>> = set.trainable().map(|p| p.value.data().to_vec()).collect();
            let mut opt = Optimizer::new(config, &set).unwrap();
            let grads = vec![factored(3, 8, 8, 1), bad];
            let err = opt
                .step_grads(&mut set, grads, 0.1)
                .unwrap_err()
                .to_string();
            assert!(err.contains("optimizer") && err.contains(says), "{err}");
            let after: Vec<Vec<f32>> = set.trainable().map(|p| p.value.data().to_vec()).collect();
            assert!(after == before, "{}: no tensor changed", config.name());
            assert_eq!(opt.steps(), 0, "the failed step is not counted");
        }
    }
}
