//! Property tests of the layout kernels against index-by-index references: `permute` (and
//! `inverse_permutation`, `transpose`, whose last-two-axes swap has a blocked kernel of its
//! own), `slice` with any step including huge ones and empty ranges, and `concat`, with the
//! errors each must give instead of panicking.

mod common;

use common::*;
use proptest::prelude::*;
use tapegrad_tensor::kernels::layout::inverse_permutation;
use tapegrad_tensor::kernels::{concat, permute, slice, transpose};
use tapegrad_tensor::{Error, Shape, Tensor};

/// A tensor whose elements are their own linear positions, so a wrong index shows as a wrong value.
fn iota(dims: &[usize]) -> Tensor<f64> {
    let values: Vec<f64> = (0..numel(dims)).map(|i| i as f64).collect();
    tensor(dims, &values)
}

fn permutation(rank: usize) -> impl Strategy<Value = Vec<usize>> {
    Just((0..rank).collect::<Vec<usize>>()).prop_shuffle()
}

fn reference_permute(x: &Tensor<f64>, perm: &[usize]) -> (Vec<usize>, Vec<f64>) {
    let out_dims: Vec<usize> = perm.iter().map(|&p| x.dims()[p]).collect();
    let data = indices(&out_dims)
        .iter()
        .map(|out_idx| {
            let mut idx = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                idx[p] = out_idx[i];
            }
            x.data()[ravel(&idx, x.dims())]
        })
        .collect();
    (out_dims, data)
}

/// A valid slice of `dims` along some axis: `start <= end <= len`, any positive step.
fn slice_args() -> impl Strategy<Value = (Vec<usize>, usize, usize, usize, usize)> {
    dims(4, 5)
        .prop_filter("needs an axis", |d| !d.is_empty())
        .prop_flat_map(|d| {
            let rank = d.len();
            (Just(d), 0..rank).prop_flat_map(|(d, axis)| {
                let len = d[axis];
                (0..=len).prop_flat_map(move |end| {
                    let d = d.clone();
                    (
                        Just(d),
                        Just(axis),
                        0..=end,
                        Just(end),
                        prop_oneof![1usize..=4, Just(usize::MAX), (usize::MAX / 2)..=usize::MAX,],
                    )
                })
            })
        })
}

fn concat_args() -> impl Strategy<Value = (Vec<usize>, usize, Vec<usize>)> {
    nonempty_dims(4, 3)
        .prop_filter("needs an axis", |d| !d.is_empty())
        .prop_flat_map(|d| {
            let rank = d.len();
            (Just(d), 0..rank, prop::collection::vec(0usize..=3, 1..=4))
        })
}

proptest! {
    #![proptest_config(config(160))]

    #[test]
    fn permute_matches_reference_and_inverts(
        (d, perm) in dims(5, 3).prop_flat_map(|d| { let r = d.len(); (Just(d), permutation(r)) })
    ) {
        let x = iota(&d);
        let (want_dims, want) = reference_permute(&x, &perm);
        let y = permute(&x, &perm).unwrap();
        prop_assert_eq!(y.dims(), &want_dims[..]);
        prop_assert_eq!(y.data(), &want[..]);
        let inv = inverse_permutation(&perm);
        for (i, &p) in perm.iter().enumerate() {
            prop_assert_eq!(inv[p], i);
        }
        let back = permute(&y, &inv).unwrap();
        prop_assert_eq!(back, x);
    }

    #[test]
    fn transpose_matches_reference(
        (d, a, b) in dims(5, 3)
            .prop_filter("needs an axis", |d| !d.is_empty())
            .prop_flat_map(|d| { let r = d.len(); (Just(d), 0..r, 0..r) })
    ) {
        let x = iota(&d);
        let mut perm: Vec<usize> = (0..d.len()).collect();
        perm.swap(a, b);
        let (want_dims, want) = reference_permute(&x, &perm);
        let y = transpose(&x, a, b).unwrap();
        prop_assert_eq!(y.dims(), &want_dims[..]);
        prop_assert_eq!(y.data(), &want[..]);
        prop_assert!(transpose(&x, a, d.len()).is_err());
    }

    #[test]
    fn swapping_the_last_two_axes_matches_reference(
        batch in dims(2, 3),
        r in 0usize..=20,
        c in 0usize..=20,
    ) {
        // Matrices up to 20 x 20, so the blocked transpose's 8-row tiles and ragged edges both
        // run, behind any batch of leading axes.
        let d: Vec<usize> = batch.iter().copied().chain([r, c]).collect();
        let x = iota(&d);
        let rank = d.len();
        let (want_dims, want) = reference_permute(&x, &{
            let mut perm: Vec<usize> = (0..rank).collect();
            perm.swap(rank - 2, rank - 1);
            perm
        });
        for y in [transpose(&x, rank - 2, rank - 1).unwrap(), transpose(&x, rank - 1, rank - 2).unwrap()] {
            prop_assert_eq!(y.dims(), &want_dims[..]);
            prop_assert_eq!(y.data(), &want[..]);
        }
    }

    #[test]
    fn permute_rejects_non_permutations(d in dims(4, 3), perm in prop::collection::vec(0usize..5, 0..=5)) {
        let mut sorted = perm.clone();
        sorted.sort_unstable();
        prop_assume!(sorted != (0..d.len()).collect::<Vec<_>>());
        let got = permute(&iota(&d), &perm);
        prop_assert!(matches!(got, Err(Error::Invalid { op: "permute", .. })), "{:?}", got);
    }

    #[test]
    fn slice_matches_reference((d, axis, start, end, step) in slice_args()) {
        let x = iota(&d);
        let y = slice(&x, axis, start, end, step).unwrap();
        let picked: Vec<usize> = (start..end).step_by(step).collect();
        let mut want_dims = d.clone();
        want_dims[axis] = picked.len();
        prop_assert_eq!(y.dims(), &want_dims[..]);
        let want: Vec<f64> = indices(&want_dims)
            .iter()
            .map(|out_idx| {
                let mut idx = out_idx.clone();
                idx[axis] = picked[out_idx[axis]];
                x.data()[ravel(&idx, &d)]
            })
            .collect();
        prop_assert_eq!(y.data(), &want[..]);
    }

    #[test]
    fn slice_rejects_bad_ranges(
        d in dims(3, 4).prop_filter("needs an axis", |d| !d.is_empty()),
        axis in 0usize..4,
        start in 0usize..8,
        end in 0usize..8,
        step in 0usize..3,
    ) {
        let x = iota(&d);
        let valid = axis < d.len() && step > 0 && start <= end && end <= d[axis];
        let got = slice(&x, axis, start, end, step);
        prop_assert_eq!(got.is_ok(), valid, "{:?}", got);
    }

    #[test]
    fn concat_matches_reference((d, axis, sizes) in concat_args(), negative in any::<bool>()) {
        let parts: Vec<Tensor<f64>> = sizes
            .iter()
            .enumerate()
            .map(|(p, &s)| {
                let mut pd = d.clone();
                pd[axis] = s;
                let values: Vec<f64> = (0..numel(&pd)).map(|i| (100 * p + i) as f64).collect();
                tensor(&pd, &values)
            })
            .collect();
        let refs: Vec<&Tensor<f64>> = parts.iter().collect();
        let signed = if negative { axis as isize - d.len() as isize } else { axis as isize };
        let y = concat(&refs, signed).unwrap();
        let mut want_dims = d.clone();
        want_dims[axis] = sizes.iter().sum();
        prop_assert_eq!(y.dims(), &want_dims[..]);
        let want: Vec<f64> = indices(&want_dims)
            .iter()
            .map(|out_idx| {
                // Find the part that covers this position along the axis.
                let mut at = out_idx[axis];
                let mut p = 0;
                while at >= sizes[p] {
                    at -= sizes[p];
                    p += 1;
                }
                let mut idx = out_idx.clone();
                idx[axis] = at;
                parts[p].data()[ravel(&idx, parts[p].dims())]
            })
            .collect();
        prop_assert_eq!(y.data(), &want[..]);
    }

    #[test]
    fn concat_rejects_mismatched_dims((d, axis, sizes) in concat_args(), other in 0usize..4, bump in 1usize..3) {
        prop_assume!(d.len() > 1 && sizes.len() > 1);
        let other = (axis + 1 + other % (d.len() - 1)) % d.len();
        let a = Tensor::<f32>::zeros(&Shape::new(d.clone()).unwrap());
        let mut bd = d.clone();
        bd[other] += bump;
        let b = Tensor::<f32>::zeros(&Shape::new(bd.clone()).unwrap());
        let got = concat(&[&a, &b], axis as isize).unwrap_err();
        prop_assert_eq!(
            got,
            Error::ShapeMismatch { op: "concat", expected: Box::new(a.shape().clone()), found: Box::new(b.shape().clone()) }
        );
    }
}

#[test]
fn slice_by_example() {
    let x = iota(&[2, 5]);
    let y = slice(&x, 1, 1, 5, 2).unwrap();
    assert_eq!(
        (y.dims(), y.data()),
        (&[2usize, 2][..], &[1.0, 3.0, 6.0, 8.0][..])
    );
    // A huge step takes only the start; an empty range at the very end is fine.
    let y = slice(&x, 1, 4, 5, usize::MAX).unwrap();
    assert_eq!(y.data(), &[4.0, 9.0]);
    let y = slice(&x, 1, 5, 5, usize::MAX).unwrap();
    assert_eq!(y.dims(), &[2, 0]);
    let err = slice(&x, 1, 3, 6, 1).unwrap_err();
    assert_eq!(
        err.to_string(),
        "slice: range 3..6 step 1 is invalid for axis 1 of length 5 (shape [2, 5])"
    );
}

#[test]
fn slice_axis_out_of_range_is_an_error_not_a_panic() {
    let x = iota(&[2, 3]);
    assert_eq!(
        slice(&x, 2, 0, 0, 1).unwrap_err(),
        Error::Axis {
            op: "slice",
            axis: 2,
            rank: 2
        }
    );
    assert!(slice(&Tensor::scalar(1.0f64), 0, 0, 1, 1).is_err());
}

#[test]
fn concat_by_example_and_its_errors() {
    let a = iota(&[2, 1]);
    let b = tensor::<f64>(&[2, 2], &[10.0, 11.0, 12.0, 13.0]);
    let y = concat(&[&a, &b], -1).unwrap();
    assert_eq!(
        (y.dims(), y.data()),
        (&[2usize, 3][..], &[0.0, 10.0, 11.0, 1.0, 12.0, 13.0][..])
    );
    assert!(matches!(
        concat::<f64>(&[], 0),
        Err(Error::Invalid { op: "concat", .. })
    ));
    assert_eq!(
        concat(&[&a, &b], 2).unwrap_err().to_string(),
        "concat: axis 2 is out of range for input of shape [2, 1]"
    );
    // A rank mismatch is a shape mismatch too.
    let v = iota(&[2]);
    assert!(matches!(
        concat(&[&a, &v], 0),
        Err(Error::ShapeMismatch { op: "concat", .. })
    ));
    // Concatenating along an axis whose outer extent is zero stays empty.
    let e = iota(&[0, 2]);
    assert_eq!(concat(&[&e, &e], 1).unwrap().dims(), &[0, 4]);
}

#[test]
fn permute_identity_shares_the_buffer() {
    let x = iota(&[2, 3]);
    assert!(permute(&x, &[0, 1]).unwrap().shares_buffer_with(&x));
    let t = transpose(&x, 0, 1).unwrap();
    assert_eq!(t.data(), &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
}
