//! Adam and AdamW spread one step's element loops over the GEMM threads, cutting tensors wherever
//! a thread's run ends: on tensors of ragged sizes (one long enough for four threads, some tiny,
//! one empty), with and without weight decay, over steps that create and then reuse the moments,
//! 2 to 4 threads give the bits of one.

use std::sync::{Mutex, MutexGuard};
use tapegrad_nn::params::ParamKind;
use tapegrad_nn::{Optimizer, OptimizerConfig, ParamSet};
use tapegrad_tensor::kernels::set_num_threads;
use tapegrad_tensor::Tensor;

/// The thread count is process-wide and the tests of this file run concurrently: each test that
/// sets it holds this lock.
fn thread_count_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

const LENS: [usize; 5] = [140_003, 5, 0, 33_000, 1];

fn value(i: usize, salt: usize) -> f32 {
    ((i * 2654435761 + salt * 97) % 2001) as f32 / 1000.0 - 1.0
}

/// Every trained element's bits after three steps on `threads` threads.
fn three_steps(config: OptimizerConfig, threads: usize) -> Vec<u32> {
    set_num_threads(threads);
    let mut set = ParamSet::new();
    for (t, &len) in LENS.iter().enumerate() {
        let v = Tensor::new(&[len], (0..len).map(|i| value(i, t)).collect()).unwrap();
        set.add(format!("p{t}"), v, ParamKind::Trainable).unwrap();
    }
    let mut opt = Optimizer::new(config, &set).unwrap();
    for step in 0..3 {
        let grads: Vec<Tensor<f32>> = LENS
            .iter()
            .enumerate()
            .map(|(t, &len)| {
                let g = (0..len).map(|i| value(i, 10 * step + t) * 0.5).collect();
                Tensor::new(&[len], g).unwrap()
            })
            .collect();
        opt.step(&mut set, &grads, config.lr()).unwrap();
    }
    set_num_threads(1);
    set.trainable()
        .flat_map(|p| {
            p.value
                .data()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn adam_and_adamw_give_the_bits_of_one_thread_on_every_thread_count() {
    let _threads = thread_count_lock();
    let adam_with_decay = match OptimizerConfig::by_name("adam", 0.01).unwrap() {
        OptimizerConfig::Adam {
            lr,
            beta1,
            beta2,
            eps,
            ..
        } => OptimizerConfig::Adam {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay: 0.05,
        },
        other => other,
    };
    for config in [
        OptimizerConfig::by_name("adam", 0.01).unwrap(),
        adam_with_decay,
        OptimizerConfig::by_name("adamw", 0.01).unwrap(),
    ] {
        let one = three_steps(config, 1);
        assert_eq!(one.len(), LENS.iter().sum::<usize>());
        for threads in 2..=4 {
            assert!(
                three_steps(config, threads) == one,
                "{config:?}: {threads} threads differ from one"
            );
        }
    }
}
