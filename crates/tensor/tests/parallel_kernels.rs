//! The kernels that spread element loops over the GEMM threads (elementwise maps, reductions over
//! leading axes, column sums, softmax bands) give the same bits on 1 to 4 threads, on ragged sizes
//! around their split thresholds, and equal plain serial loops. Maps split anywhere (each element
//! on its own); reductions split by output column only, so each output keeps its one order of
//! additions; softmax (and cross entropy's fused softmax) splits between whole rows.

mod common;

use common::*;
use tapegrad_tensor::kernels::par_map::{map_in_place, zip_in_place, MIN_MAP_PER_THREAD};
use tapegrad_tensor::kernels::{
    column_sums, cross_entropy_rows, log_softmax, max_axes, set_num_threads, softmax, sum_axes,
};
use tapegrad_tensor::{Scalar, Tensor};

/// Lengths on both sides of where a map starts to split, odd tails included.
fn map_lengths() -> Vec<usize> {
    let m = MIN_MAP_PER_THREAD;
    vec![0, 1, 17, 2 * m - 1, 2 * m, 2 * m + 17, 3 * m + 5, 5 * m + 3]
}

fn bits<S: Scalar>(t: &[S]) -> Vec<u64> {
    t.iter().map(|v| v.to_f64().to_bits()).collect()
}

/// `run()` on 1, 2, 3 and 4 threads; asserts every result has the bits of the first and returns it.
fn same_on_every_thread_count<S: Scalar>(what: &str, run: impl Fn() -> Vec<S>) -> Vec<S> {
    // The thread count is process-wide and this file's tests run concurrently: they take turns,
    // so a run meant for one count is never made on another test's.
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    set_num_threads(1);
    let one = run();
    for threads in 2..=4 {
        set_num_threads(threads);
        let got = run();
        assert!(
            bits(&got) == bits(&one),
            "{what}: {threads} threads differ from 1"
        );
    }
    set_num_threads(1);
    one
}

fn f32s(n: usize, seed: u64) -> Vec<f32> {
    floats(n, seed, 3.0).into_iter().map(|v| v as f32).collect()
}

#[test]
fn maps_and_zip_maps_equal_the_plain_loop_on_every_thread_count() {
    for len in map_lengths() {
        let a = Tensor::new(&[len], f32s(len, 1)).unwrap();
        let b = Tensor::new(&[len], f32s(len, 2)).unwrap();
        let relu = |v: f32| if v <= 0.0 { 0.0 } else { v };
        let got =
            same_on_every_thread_count(&format!("map relu, {len}"), || a.map(relu).into_vec());
        let want: Vec<f32> = a.data().iter().map(|&v| relu(v)).collect();
        assert_eq!(bits(&got), bits(&want), "map relu, {len}");

        let got = same_on_every_thread_count(&format!("map exp, {len}"), || {
            a.map(|v| v.exp()).into_vec()
        });
        let want: Vec<f32> = a.data().iter().map(|v| v.exp()).collect();
        assert_eq!(bits(&got), bits(&want), "map exp, {len}");

        let f = |x: f32, y: f32| x * y - 0.5 * x;
        let got = same_on_every_thread_count(&format!("zip_map, {len}"), || {
            a.zip_map(&b, "test", f).unwrap().into_vec()
        });
        let want: Vec<f32> = a
            .data()
            .iter()
            .zip(b.data())
            .map(|(&x, &y)| f(x, y))
            .collect();
        assert_eq!(bits(&got), bits(&want), "zip_map, {len}");

        let got = same_on_every_thread_count(&format!("map_in_place, {len}"), || {
            let mut v = a.data().to_vec();
            map_in_place(&mut v, |x| x * 1.5 + 0.25);
            v
        });
        let want: Vec<f32> = a.data().iter().map(|&x| x * 1.5 + 0.25).collect();
        assert_eq!(bits(&got), bits(&want), "map_in_place, {len}");

        let got = same_on_every_thread_count(&format!("zip_in_place, {len}"), || {
            let mut v = a.data().to_vec();
            zip_in_place(&mut v, b.data(), |g, y| if y <= 0.0 { 0.0 } else { g });
            v
        });
        let want: Vec<f32> = a
            .data()
            .iter()
            .zip(b.data())
            .map(|(&g, &y)| if y <= 0.0 { 0.0 } else { g })
            .collect();
        assert_eq!(bits(&got), bits(&want), "zip_in_place, {len}");
    }
}

/// One column's sum in the reductions' order, written out independently: runs of 32 added
/// left to right from zero, a longer run split after half its 32-blocks (rounded up) and the two
/// halves' sums added.
fn pairwise_sum<S: Scalar>(xs: &[S]) -> S {
    if xs.len() <= 32 {
        return xs.iter().fold(S::ZERO, |a, &v| a + v);
    }
    let mid = xs.len().div_ceil(32).div_ceil(2) * 32;
    pairwise_sum(&xs[..mid]) + pairwise_sum(&xs[mid..])
}

/// Column sums in the reductions' order (`pairwise_sum` of each column).
fn column_sums_serial<S: Scalar>(data: &[S], cols: usize) -> Vec<S> {
    let rows = data.len() / cols.max(1);
    (0..cols)
        .map(|j| {
            let column: Vec<S> = (0..rows).map(|i| data[i * cols + j]).collect();
            pairwise_sum(&column)
        })
        .collect()
}

#[test]
fn leading_axis_reductions_keep_one_order_per_column_on_every_thread_count() {
    // (rows, cols): below and above the split, ragged column counts, more columns than rows.
    let shapes = [
        (1, 1),
        (7, 5),
        (256, 10),
        (256, 128),
        (300, 257),
        (1000, 33),
        (33, 4099),
    ];
    for (rows, cols) in shapes {
        let data = f32s(rows * cols, (rows * 31 + cols) as u64);
        let t = Tensor::new(&[rows, cols], data.clone()).unwrap();
        let want = column_sums_serial(&data, cols);
        let got = same_on_every_thread_count(&format!("sum_axes [0], {rows}x{cols}"), || {
            sum_axes(&t, &[0], false).unwrap().into_vec()
        });
        assert_eq!(bits(&got), bits(&want), "sum_axes [0], {rows}x{cols}");
        let got = same_on_every_thread_count(&format!("column_sums, {rows}x{cols}"), || {
            column_sums(&t).unwrap().into_vec()
        });
        assert_eq!(bits(&got), bits(&want), "column_sums, {rows}x{cols}");

        let max = same_on_every_thread_count(&format!("max_axes [0], {rows}x{cols}"), || {
            max_axes(&t, &[0], true).unwrap().into_vec()
        });
        let want_max: Vec<f32> = (0..cols)
            .map(|j| {
                (0..rows)
                    .map(|i| data[i * cols + j])
                    .fold(f32::NEG_INFINITY, f32::max)
            })
            .collect();
        assert_eq!(max, want_max, "max_axes [0], {rows}x{cols}");
    }
    // Two leading axes of a rank-3 tensor reduce like one axis of their product.
    let data = f32s(6 * 70 * 129, 9);
    let t = Tensor::new(&[6, 70, 129], data.clone()).unwrap();
    let got = same_on_every_thread_count("sum_axes [0, 1], 6x70x129", || {
        sum_axes(&t, &[0, 1], false).unwrap().into_vec()
    });
    assert_eq!(bits(&got), bits(&column_sums_serial(&data, 129)));
    assert!(column_sums(&t).is_err(), "column_sums takes matrices only");
}

#[test]
fn softmax_bands_are_whole_rows_on_every_thread_count() {
    // (dims, axis): the MLP's logits, ragged rows, a middle axis (lines with a stride).
    let cases: [(&[usize], usize); 5] = [
        (&[256, 10], 1),
        (&[513, 7], 1),
        (&[3, 700, 5], 1),
        (&[40, 3, 17], 0),
        (&[0, 10], 1),
    ];
    for (dims, axis) in cases {
        let n = numel(dims);
        let t = Tensor::new(dims, f32s(n, n as u64)).unwrap();
        let sm = same_on_every_thread_count(&format!("softmax {dims:?} axis {axis}"), || {
            softmax(&t, axis).unwrap().into_vec()
        });
        let lsm = same_on_every_thread_count(&format!("log_softmax {dims:?} axis {axis}"), || {
            log_softmax(&t, axis).unwrap().into_vec()
        });
        // Against an f64 softmax of each line.
        let len = dims[axis];
        let inner: usize = dims[axis + 1..].iter().product();
        let outer: usize = dims[..axis].iter().product();
        for o in 0..outer {
            for i in 0..inner {
                let at = |j: usize| o * len * inner + j * inner + i;
                let m = (0..len)
                    .map(|j| t.data()[at(j)] as f64)
                    .fold(f64::MIN, f64::max);
                let total: f64 = (0..len).map(|j| (t.data()[at(j)] as f64 - m).exp()).sum();
                for j in 0..len {
                    let p = (t.data()[at(j)] as f64 - m).exp() / total;
                    assert!(
                        (sm[at(j)] as f64 - p).abs() <= 1e-6,
                        "softmax {dims:?} at {}",
                        at(j)
                    );
                    assert!(
                        (lsm[at(j)] as f64 - p.ln()).abs() <= 1e-5 * (1.0 + p.ln().abs()),
                        "log_softmax {dims:?} at {}",
                        at(j)
                    );
                }
            }
        }
    }
}

/// Cross entropy's one-pass kernel on `(rows, classes)` logits: its probabilities are `softmax`'s
/// bits and its losses are `-log_softmax` at the label, bit for bit, on 1 to 4 threads, on sizes
/// on both sides of where it splits, with labels anywhere in the row and logits of +-1000.
#[test]
fn cross_entropy_rows_is_softmax_and_picked_log_softmax_bit_for_bit() {
    fn check<S: Scalar>(rows: usize, classes: usize, shift: f64) {
        let n = rows * classes;
        let values: Vec<f64> = floats(n, n as u64 + 7, 4.0)
            .into_iter()
            .map(|v| v + shift)
            .collect();
        let x = tensor::<S>(&[rows, classes], &values);
        let targets: Vec<usize> = (0..rows).map(|i| (i * 7 + 3) % classes).collect();
        let run = || {
            let (mut probs, mut losses) = (vec![S::ZERO; n], vec![S::ZERO; rows]);
            cross_entropy_rows(x.data(), classes, &targets, &mut probs, &mut losses).unwrap();
            probs.extend(losses);
            probs
        };
        let what = format!("cross entropy {rows} x {classes}, shift {shift}");
        let got = same_on_every_thread_count(&what, run);
        let sm = softmax(&x, 1).unwrap();
        let lsm = log_softmax(&x, 1).unwrap();
        assert_eq!(bits(&got[..n]), bits(sm.data()), "{what}: probabilities");
        let picked: Vec<S> = (0..rows)
            .map(|i| -lsm.data()[i * classes + targets[i]])
            .collect();
        assert_eq!(bits(&got[n..]), bits(&picked), "{what}: losses");
    }
    for (rows, classes) in [
        (1, 1),
        (1, 10),
        (3, 5),
        (101, 10),
        (256, 10),
        (257, 9),
        (64, 1000),
    ] {
        for shift in [0.0, 1000.0, -1000.0] {
            check::<f32>(rows, classes, shift);
            check::<f64>(rows, classes, shift);
        }
    }
}

/// What cross entropy's kernel is handed must fit: a wrong count or a label past the classes is
/// an error naming the op, never an out-of-bounds index.
#[test]
fn cross_entropy_rows_rejects_what_does_not_fit() {
    let x = [0.0f32; 6];
    let (mut p, mut l) = ([0.0f32; 6], [0.0f32; 2]);
    for (classes, targets) in [(3, vec![0, 3]), (3, vec![0]), (4, vec![0, 1])] {
        let err = cross_entropy_rows(&x, classes, &targets, &mut p, &mut l).unwrap_err();
        assert!(err.to_string().contains("cross_entropy"), "{err}");
    }
    let mut short = [0.0f32; 5];
    let err = cross_entropy_rows(&x, 3, &[0, 1], &mut short, &mut l).unwrap_err();
    assert!(err.to_string().contains("5 probabilities"), "{err}");
}
