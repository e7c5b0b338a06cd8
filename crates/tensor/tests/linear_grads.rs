//! `linear_grads`, which runs a linear layer's input and weight gradients side by side on two
//! threads where that pays: every gradient it returns has the bits of the separate kernels on one
//! thread, on 1 to 4 threads, for each subset of gradients asked for, at shapes on both sides of
//! each of its thresholds (one row, too little work for a hand-off, split-sized work, depths too
//! far apart); the two outputs come from and go back to the calling thread's buffer pool; and
//! operands that do not fit are the separate kernels' errors, not a panic.

mod common;

use common::*;
use std::sync::{Mutex, MutexGuard};
use tapegrad_tensor::kernels::linear::{
    grads_side_by_side, linear_bias_grad, linear_grads, linear_input_grad, linear_weight_grad,
};
use tapegrad_tensor::kernels::set_num_threads;
use tapegrad_tensor::{pool, Scalar, Tensor};

/// The thread count is process-wide and the tests of this file run concurrently: each test that
/// sets it holds this lock, so a run meant for one thread count is not run on another's.
fn thread_count_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `(rows, out, in)`: one row (the matrix-vector paths), a few hundred multiply-adds, one short
/// of 2^18 and 2^18 (the hand-off threshold), the MLP's batch-32 and batch-256 hidden layers and
/// its 10-wide last layer, a split-sized pair of balanced depths (side by side on two threads,
/// bands on more) and one whose depths are 32x apart (bands).
const SHAPES: [(usize, usize, usize); 9] = [
    (1, 37, 29),
    (5, 7, 9),
    (63, 64, 64),
    (64, 64, 64),
    (32, 128, 256),
    (256, 128, 256),
    (256, 10, 128),
    (130, 300, 90),
    (512, 16, 300),
];

type Grads<S> = (Option<Tensor<S>>, Option<Tensor<S>>, Option<Tensor<S>>);

fn bits<S: Scalar>(t: &Option<Tensor<S>>) -> Option<Vec<u64>> {
    t.as_ref()
        .map(|t| t.data().iter().map(|v| v.to_f64().to_bits()).collect())
}

fn same<S: Scalar>(a: &Grads<S>, b: &Grads<S>) -> bool {
    bits(&a.0) == bits(&b.0) && bits(&a.1) == bits(&b.1) && bits(&a.2) == bits(&b.2)
}

fn every_subset_on_every_thread_count<S: Scalar>() {
    let _turn = thread_count_lock();
    for (i, &(rows, out, inn)) in SHAPES.iter().enumerate() {
        let seed = 10 * i as u64;
        let g = tensor::<S>(&[rows, out], &floats(rows * out, seed, 1.0));
        let w = tensor::<S>(&[out, inn], &floats(out * inn, seed + 1, 1.0));
        let x = tensor::<S>(&[rows, inn], &floats(rows * inn, seed + 2, 1.0));
        set_num_threads(1);
        let reference: Grads<S> = (
            Some(linear_input_grad(&g, &w).unwrap()),
            Some(linear_weight_grad(&g, &x).unwrap()),
            Some(linear_bias_grad(&g).unwrap()),
        );
        for threads in 1..=4 {
            set_num_threads(threads);
            for (want_dx, want_dw, want_db) in [
                (true, true, true),
                (true, true, false),
                (true, false, true),
                (false, true, false),
                (false, false, true),
            ] {
                let got = linear_grads(&g, want_dx.then_some(&w), want_dw.then_some(&x), want_db)
                    .unwrap();
                let want = (
                    reference.0.clone().filter(|_| want_dx),
                    reference.1.clone().filter(|_| want_dw),
                    reference.2.clone().filter(|_| want_db),
                );
                assert!(
                    same(&got, &want),
                    "{}, ({rows}, {out}, {inn}) on {threads} threads, dx {want_dx} dw {want_dw} db {want_db}: \
                     differs from the separate kernels on one thread",
                    S::DTYPE
                );
            }
        }
    }
    set_num_threads(1);
}

#[test]
#[cfg_attr(miri, ignore = "products of up to 2 * 10^7 multiply-adds")]
fn f32_gradients_match_the_separate_kernels_on_one_thread() {
    every_subset_on_every_thread_count::<f32>();
}

#[test]
#[cfg_attr(miri, ignore = "products of up to 2 * 10^7 multiply-adds")]
fn f64_gradients_match_the_separate_kernels_on_one_thread() {
    every_subset_on_every_thread_count::<f64>();
}

#[test]
fn the_shapes_cover_both_paths_on_two_threads() {
    let _turn = thread_count_lock();
    set_num_threads(2);
    let side_by_side: Vec<bool> = SHAPES
        .iter()
        .map(|&(rows, out, inn)| grads_side_by_side(rows, out, inn))
        .collect();
    set_num_threads(1);
    let one_thread = SHAPES
        .iter()
        .any(|&(rows, out, inn)| grads_side_by_side(rows, out, inn));
    assert!(!one_thread, "one thread never runs two jobs");
    assert!(
        side_by_side.iter().any(|&s| s) && side_by_side.iter().skip(1).any(|&s| !s),
        "two threads: side by side {side_by_side:?} must include both paths past one row"
    );
    assert!(!side_by_side[0], "one row stays on the matrix-vector paths");
}

#[test]
fn operands_that_do_not_fit_are_errors() {
    let _turn = thread_count_lock();
    let g = Tensor::new(&[300, 200], vec![1.0f32; 60_000]).unwrap();
    let w = Tensor::new(&[200, 100], vec![1.0f32; 20_000]).unwrap();
    let x = Tensor::new(&[300, 100], vec![1.0f32; 30_000]).unwrap();
    let short_x = Tensor::new(&[299, 100], vec![1.0f32; 29_900]).unwrap();
    let wide_w = Tensor::new(&[201, 100], vec![1.0f32; 20_100]).unwrap();
    let flat = Tensor::new(&[60_000], vec![1.0f32; 60_000]).unwrap();
    for threads in [1, 2] {
        set_num_threads(threads);
        assert!(linear_grads(&g, Some(&w), Some(&x), true).is_ok());
        for (g, w, x, says) in [
            (&g, &w, &short_x, "[299, 100]"),
            (&g, &wide_w, &x, "[201, 100]"),
            (&flat, &w, &x, "[60000]"),
        ] {
            let err = linear_grads(g, Some(w), Some(x), true)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(says),
                "{threads} threads: {err} should name {says}"
            );
        }
    }
    set_num_threads(1);
}

#[test]
fn side_by_side_outputs_come_from_and_return_to_the_callers_pool() {
    // The pool is per thread: an output made inside a job on a helper would miss the helper's
    // pool on every call and fill this thread's when dropped here.
    let _turn = thread_count_lock();
    set_num_threads(2);
    let (rows, out, inn) = (256, 128, 256);
    assert!(grads_side_by_side(rows, out, inn));
    let g = tensor::<f32>(&[rows, out], &floats(rows * out, 1, 1.0));
    let w = tensor::<f32>(&[out, inn], &floats(out * inn, 2, 1.0));
    let x = tensor::<f32>(&[rows, inn], &floats(rows * inn, 3, 1.0));
    let call = || drop(linear_grads(&g, Some(&w), Some(&x), false).unwrap());
    (0..3).for_each(|_| call());
    let before = pool::stats::<f32>();
    const CALLS: u64 = 5;
    (0..CALLS).for_each(|_| call());
    let after = pool::stats::<f32>();
    set_num_threads(1);
    assert_eq!(
        after.allocated, before.allocated,
        "no fresh buffer once warm"
    );
    assert_eq!(
        after.reused - before.reused,
        2 * CALLS,
        "both outputs reused"
    );
    assert_eq!(after.returned - before.returned, 2 * CALLS, "both returned");
}
