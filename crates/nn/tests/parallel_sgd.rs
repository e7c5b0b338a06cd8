//! SGD spreads one step's element loops over the GEMM threads, cutting tensors wherever a
//! thread's run ends: on tensors of ragged sizes (one past the split threshold, some tiny, one
//! empty, a buffer in between that is not trained), every configuration (plain, weight decay,
//! momentum with and without Nesterov and dampening) gives the bits of the scalar formula, applied
//! tensor by tensor, on 1 to 4 threads, over steps that create and then reuse the momentum buffer.

use tapegrad_nn::params::ParamKind;
use tapegrad_nn::{Optimizer, OptimizerConfig, ParamSet};
use tapegrad_tensor::kernels::set_num_threads;
use tapegrad_tensor::Tensor;

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
