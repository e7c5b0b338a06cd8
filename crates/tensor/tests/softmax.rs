//! Property tests of `softmax` and `log_softmax` along every axis: a naive per-row reference,
//! rows summing to one, `exp(log_softmax) == softmax`, finiteness at logits of ±1000, and invariance
//! under adding a constant to every logit; wide f32 rows within a few ulps; a row with a masked
//! (-inf) tail with the bits of the row cut there.

mod common;

use common::*;
use proptest::prelude::*;
use tapegrad_tensor::kernels::{cross_entropy_rows, log_softmax, softmax};
use tapegrad_tensor::{Error, Scalar, Tensor};

/// The positions of every row along `axis`, each row in order.
fn rows(dims: &[usize], axis: usize) -> Vec<Vec<usize>> {
    let mut outer = dims.to_vec();
    outer[axis] = 1;
    indices(&outer)
        .into_iter()
        .map(|start| {
            (0..dims[axis])
                .map(|j| {
                    let mut idx = start.clone();
                    idx[axis] = j;
                    ravel(&idx, dims)
                })
                .collect()
        })
        .collect()
}

/// Naive f64 softmax of one row, written as the textbook formula with the max subtracted.
fn reference_softmax(row: &[f64]) -> Vec<f64> {
    let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = row.iter().map(|v| (v - m).exp()).collect();
    let total: f64 = e.iter().sum();
    e.iter().map(|v| v / total).collect()
}

/// A few ulps of `S` at the magnitude of `v` (at least 1).
fn ulps<S: Scalar>(v: f64, n: f64) -> f64 {
    let eps = if S::DTYPE == tapegrad_tensor::DType::F32 {
        f32::EPSILON as f64
    } else {
        f64::EPSILON
    };
    n * eps * v.abs().max(1.0)
}

fn check_axis<S: Scalar>(dims: &[usize], values: &[f64], axis: usize) -> Result<(), TestCaseError> {
    let x = tensor::<S>(dims, values);
    let sm = softmax(&x, axis).unwrap();
    let lsm = log_softmax(&x, axis).unwrap();
    prop_assert_eq!(sm.dims(), dims);
    prop_assert_eq!(lsm.dims(), dims);
    let xs = x.to_f64_vec();
    let (sm, lsm) = (sm.to_f64_vec(), lsm.to_f64_vec());
    for row in rows(dims, axis).into_iter().filter(|r| !r.is_empty()) {
        let logits: Vec<f64> = row.iter().map(|&i| xs[i]).collect();
        let want = reference_softmax(&logits);
        let total: f64 = row.iter().map(|&i| sm[i]).sum();
        prop_assert!(
            (total - 1.0).abs() <= ulps::<S>(1.0, 4.0 * row.len() as f64),
            "row sum {}",
            total
        );
        for (&i, &w) in row.iter().zip(&want) {
            prop_assert!(
                sm[i].is_finite() && lsm[i].is_finite(),
                "{} {}",
                sm[i],
                lsm[i]
            );
            prop_assert!(
                (sm[i] - w).abs() <= ulps::<S>(w, 16.0),
                "softmax {} vs {}",
                sm[i],
                w
            );
            prop_assert!(
                (lsm[i].exp() - sm[i]).abs() <= ulps::<S>(sm[i], 32.0),
                "exp(log_softmax) {} vs softmax {}",
                lsm[i].exp(),
                sm[i]
            );
            prop_assert!(
                (lsm[i] - w.ln()).abs() <= ulps::<S>(w.ln(), 16.0),
                "log_softmax {} vs {}",
                lsm[i],
                w.ln()
            );
        }
    }
    Ok(())
}

/// Logits that are small integers plus `shift` (exact in f32 and f64 for |shift| <= 1000).
fn shifted(values: &[f64], shift: f64) -> Vec<f64> {
    values.iter().map(|v| v + shift).collect()
}

fn check_shift<S: Scalar>(
    dims: &[usize],
    values: &[f64],
    axis: usize,
    shift: f64,
) -> Result<(), TestCaseError> {
    let x = tensor::<S>(dims, values);
    let xs = tensor::<S>(dims, &shifted(values, shift));
    let (a, b) = (softmax(&x, axis).unwrap(), softmax(&xs, axis).unwrap());
    // x + c - max(x + c) == x - max(x) exactly here, so the results agree to the bit.
    prop_assert!(
        same_bits(a.data(), b.data()),
        "softmax {:?} vs shifted {:?}",
        a,
        b
    );
    let (a, b) = (
        log_softmax(&x, axis).unwrap(),
        log_softmax(&xs, axis).unwrap(),
    );
    for (p, q) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
        prop_assert!(
            (p - q).abs() <= ulps::<S>(*p, 2.0),
            "log_softmax {} vs shifted {} (shift {})",
            p,
            q,
            shift
        );
    }
    Ok(())
}

fn input() -> impl Strategy<Value = (Vec<usize>, usize, u64)> {
    dims(4, 4)
        .prop_filter("needs an axis", |d| !d.is_empty())
        .prop_flat_map(|d| {
            let rank = d.len();
            (Just(d), 0..rank, any::<u64>())
        })
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn softmax_matches_reference_along_every_axis((dims, axis, seed) in input(), scale in prop_oneof![Just(1.0), Just(30.0)]) {
        let values = floats(numel(&dims), seed, scale);
        check_axis::<f64>(&dims, &values, axis)?;
        check_axis::<f32>(&dims, &values, axis)?;
    }

    #[test]
    fn softmax_is_stable_at_huge_logits((dims, axis, seed) in input(), sign in prop_oneof![Just(1.0), Just(-1.0)]) {
        let values = shifted(&small_ints(numel(&dims), seed), 1000.0 * sign);
        check_axis::<f64>(&dims, &values, axis)?;
        check_axis::<f32>(&dims, &values, axis)?;
    }

    #[test]
    fn softmax_is_invariant_under_a_shift(
        (dims, axis, seed) in input(),
        shift in prop_oneof![Just(1000.0), Just(-1000.0), Just(37.5), Just(-0.25)],
    ) {
        let values = small_ints(numel(&dims), seed);
        check_shift::<f64>(&dims, &values, axis, shift)?;
        check_shift::<f32>(&dims, &values, axis, shift)?;
    }
}

#[test]
fn softmax_by_example() {
    let x = tensor::<f64>(&[2, 2], &[0.0, 0.0, 1000.0, -1000.0]);
    let y = softmax(&x, 1).unwrap();
    assert_eq!(y.data(), &[0.5, 0.5, 1.0, 0.0]);
    let y = log_softmax(&x, 1).unwrap();
    assert_eq!(
        y.data(),
        &[
            -std::f64::consts::LN_2,
            -std::f64::consts::LN_2,
            0.0,
            -2000.0
        ]
    );
    // Along axis 0 the rows are the columns.
    let y = softmax(&x, 0).unwrap();
    assert_eq!(y.data(), &[0.0, 1.0, 1.0, 0.0]);
}

#[test]
fn softmax_with_infinities_follows_pytorch() {
    let x = tensor::<f64>(&[3], &[f64::NEG_INFINITY, 0.0, f64::NEG_INFINITY]);
    assert_eq!(softmax(&x, 0).unwrap().data(), &[0.0, 1.0, 0.0]);
    assert_eq!(
        log_softmax(&x, 0).unwrap().data(),
        &[f64::NEG_INFINITY, 0.0, f64::NEG_INFINITY]
    );
    // A row of only -inf has no distribution: NaN, as in PyTorch.
    let x = tensor::<f64>(&[2], &[f64::NEG_INFINITY; 2]);
    assert!(softmax(&x, 0).unwrap().data().iter().all(|v| v.is_nan()));
    assert!(log_softmax(&x, 0)
        .unwrap()
        .data()
        .iter()
        .all(|v| v.is_nan()));
}

#[test]
fn softmax_of_empty_tensors_keeps_the_shape() {
    for (dims, axis) in [(&[0usize][..], 0), (&[2, 0], 0), (&[2, 0], 1), (&[0, 3], 1)] {
        let x = Tensor::<f32>::from_f64(dims, &[]).unwrap();
        assert_eq!(softmax(&x, axis).unwrap().dims(), dims);
        assert_eq!(log_softmax(&x, axis).unwrap().dims(), dims);
    }
}

#[test]
fn softmax_axis_out_of_range_is_an_error_not_a_panic() {
    let x = tensor::<f64>(&[2, 3], &[0.0; 6]);
    let err = softmax(&x, 2).unwrap_err();
    assert_eq!(
        err,
        Error::Axis {
            op: "softmax",
            axis: 2,
            rank: 2
        }
    );
    assert!(log_softmax(&Tensor::scalar(1.0f32), 0).is_err());
}

/// Rows of 2,000 to 5,000 logits in f32: every softmax entry within a few ulps of the f64 answer
/// and every log_softmax entry within a few ulps of its terms' size (one running total over the
/// row is 22 ulps off at 2,000).
#[test]
fn wide_f32_rows_stay_within_a_few_ulps() {
    for (n, width) in [(2000, 2.0), (2048, 16.0), (5000, 4.0)] {
        let x64: Tensor<f64> = tensor(&[2, n], &floats(2 * n, n as u64, width));
        let x32 = x64.cast::<f32>();
        let exact = softmax(&x32.cast::<f64>(), 1).unwrap();
        let exact_log = log_softmax(&x32.cast::<f64>(), 1).unwrap();
        let got = softmax(&x32, 1).unwrap();
        let got_log = log_softmax(&x32, 1).unwrap();
        let unit = |v: f64| f64::from(f32::EPSILON) * v.abs();
        for i in 0..2 * n {
            let (e, g) = (exact.data()[i], f64::from(got.data()[i]));
            // The rounding of x - max carries |x| + |max| into exp's argument.
            let spread = 1.0 + 2.0 * width;
            assert!(
                (g - e).abs() <= 4.0 * spread * unit(e),
                "softmax {n}: {g} vs {e}"
            );
            let (e, g) = (exact_log.data()[i], f64::from(got_log.data()[i]));
            assert!(
                (g - e).abs() <= 4.0 * unit(spread + e.abs()),
                "log_softmax {n}: {g} vs {e}"
            );
        }
    }
}

/// A causally masked row (its tail -inf) has the bits of the row cut after its last visible
/// logit, as a generation step with a key/value cache computes it, in softmax, log_softmax and
/// cross entropy alike.
#[test]
fn a_masked_tail_leaves_the_bits_of_the_cut_row() {
    let n = 300;
    let values = floats(n, 9, 8.0);
    for visible in [1, 31, 33, 64, 97, 129, 200, 299] {
        let mut masked = values.clone();
        for v in &mut masked[visible..] {
            *v = f64::NEG_INFINITY;
        }
        let full: Tensor<f32> = tensor(&[1, n], &masked);
        let cut: Tensor<f32> = tensor(&[1, visible], &values[..visible]);
        let (a, b) = (softmax(&full, 1).unwrap(), softmax(&cut, 1).unwrap());
        assert_eq!(&a.data()[..visible], b.data(), "softmax, {visible} visible");
        assert!(a.data()[visible..].iter().all(|&p| p == 0.0));
        let (a, b) = (
            log_softmax(&full, 1).unwrap(),
            log_softmax(&cut, 1).unwrap(),
        );
        assert_eq!(
            &a.data()[..visible],
            b.data(),
            "log_softmax, {visible} visible"
        );
        let (mut p, mut l) = (vec![0f32; n], [0f32]);
        cross_entropy_rows(full.data(), n, &[0], &mut p, &mut l).unwrap();
        assert_eq!(-l[0], b.data()[0], "cross entropy, {visible} visible");
    }
}
