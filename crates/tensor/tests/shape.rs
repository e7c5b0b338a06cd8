//! Tests of `Shape` (element count, strides, overflow), the axis helpers, and the `Tensor`
//! constructors and reshapes whose errors must name what was expected and what was found.

mod common;

use common::*;
use proptest::prelude::*;
use tapegrad_tensor::kernels::permute;
use tapegrad_tensor::{normalize_axes, normalize_axis, Error, Shape, Tensor};

/// Dimensions that mix small, zero and enormous sizes, so products overflow in some orders.
fn wild_dims() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(
        prop_oneof![
            0usize..=3,
            Just(1 << 20),
            Just(1 << 32),
            Just(usize::MAX / 3),
            Just(usize::MAX),
        ],
        0..=5,
    )
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn numel_and_strides_match_reference(d in dims(5, 4)) {
        let s = Shape::new(d.clone()).unwrap();
        prop_assert_eq!(s.dims(), &d[..]);
        prop_assert_eq!(s.rank(), d.len());
        prop_assert_eq!(s.numel(), numel(&d));
        let want: Vec<usize> = (0..d.len()).map(|i| numel(&d[i + 1..])).collect();
        prop_assert_eq!(s.strides(), want);
    }

    #[test]
    fn shape_validity_does_not_depend_on_dim_order_and_strides_never_overflow(
        (d, perm) in wild_dims().prop_flat_map(|d| {
            let r = d.len();
            (Just(d), Just((0..r).collect::<Vec<usize>>()).prop_shuffle())
        })
    ) {
        let shuffled: Vec<usize> = perm.iter().map(|&p| d[p]).collect();
        let (a, b) = (Shape::new(d.clone()), Shape::new(shuffled.clone()));
        prop_assert_eq!(a.is_ok(), b.is_ok(), "{:?} vs {:?}", a, b);
        // The product of the non-zero dims bounds every stride; it must fit with headroom.
        let nonzero = d.iter().filter(|&&x| x > 0).try_fold(1u128, |acc, &x| acc.checked_mul(x as u128));
        let fits = matches!(nonzero, Some(n) if n <= (isize::MAX as u128) / 16);
        prop_assert_eq!(a.is_ok(), fits, "{:?}", d);
        match a {
            Ok(s) => {
                // Exercises the stride products (would overflow-panic if new() let them through).
                let want: Vec<usize> = (0..d.len()).map(|i| d[i + 1..].iter().product()).collect();
                prop_assert_eq!(s.strides(), want);
                prop_assert_eq!(s.numel(), d.iter().product::<usize>());
            }
            Err(e) => prop_assert_eq!(e, Error::Overflow { op: "Shape::new", dims: d.clone() }),
        }
    }

    #[test]
    fn normalize_axis_matches_pytorch(axis in -7isize..7, rank in 0usize..5) {
        let got = normalize_axis("op", axis, rank);
        let r = rank as isize;
        if (-r..r).contains(&axis) {
            prop_assert_eq!(got.unwrap() as isize, if axis < 0 { axis + r } else { axis });
        } else {
            prop_assert_eq!(got.unwrap_err(), Error::Axis { op: "op", axis, rank });
        }
    }

    #[test]
    fn normalize_axes_sorts_and_rejects_repeats(axes in prop::collection::vec(-4isize..4, 0..5)) {
        let got = normalize_axes("op", &axes, 4);
        let mut want: Vec<usize> = axes.iter().map(|&a| (a + 4) as usize % 4).collect();
        want.sort_unstable();
        let repeated = want.windows(2).any(|w| w[0] == w[1]);
        if repeated {
            prop_assert!(matches!(got, Err(Error::Invalid { op: "op", .. })), "{:?}", got);
        } else {
            prop_assert_eq!(got.unwrap(), want);
        }
    }

    #[test]
    fn reshape_keeps_data_and_errors_on_count(from in dims(4, 3), to in dims(4, 3), seed in any::<u64>()) {
        let x = tensor::<f64>(&from, &small_ints(numel(&from), seed));
        let got = x.reshape(&to);
        if numel(&from) == numel(&to) {
            let y = got.unwrap();
            prop_assert_eq!(y.dims(), &to[..]);
            // A one-element tensor holds its element itself: a reshape copies it.
            prop_assert_eq!(y.shares_buffer_with(&x), numel(&from) != 1);
            prop_assert_eq!(y.data(), x.data());
        } else {
            let message = format!(
                "reshape: cannot reshape {:?} ({} elements) to {:?} ({} elements)",
                x.shape(), numel(&from), Shape::new(to.clone()).unwrap(), numel(&to)
            );
            prop_assert_eq!(got.unwrap_err().to_string(), message);
        }
    }
}

#[test]
fn shape_overflow_is_an_error() {
    for dims in [
        vec![usize::MAX, 2],
        vec![1 << 32, 1 << 32],
        vec![(isize::MAX as usize) / 16 + 1],
        // Zero elements, but the other dims alone overflow: their strides would too.
        vec![0, usize::MAX, 2],
        vec![usize::MAX, 2, 0],
    ] {
        assert_eq!(
            Shape::new(dims.clone()),
            Err(Error::Overflow {
                op: "Shape::new",
                dims: dims.clone()
            }),
            "{dims:?}"
        );
    }
    assert_eq!(
        Shape::new(vec![usize::MAX, 2]).unwrap_err().to_string(),
        format!(
            "Shape::new: shape [{}, 2] has too many elements",
            usize::MAX
        )
    );
    assert!(Shape::new(vec![(isize::MAX as usize) / 16]).is_ok());
    assert_eq!(Shape::new(vec![0, 1 << 40]).unwrap().numel(), 0);
}

#[test]
fn permute_of_an_empty_tensor_with_huge_dims_does_not_panic() {
    // Accepted shapes must have computable strides; permute walks them.
    let x = Tensor::<f32>::new(&[0, 1 << 30, 4], vec![]).unwrap();
    let y = permute(&x, &[2, 1, 0]).unwrap();
    assert_eq!(y.dims(), &[4, 1 << 30, 0]);
    // Strides of this one overflow, so it must be refused up front (accepted, it would make
    // permute panic computing `strides()`).
    assert!(matches!(
        Tensor::<f32>::new(&[0, usize::MAX, 2], vec![]),
        Err(Error::Overflow { .. })
    ));
}

#[test]
fn shape_display() {
    assert_eq!(Shape::scalar().to_string(), "[]");
    assert_eq!(Shape::new(vec![2, 0, 3]).unwrap().to_string(), "[2, 0, 3]");
    assert_eq!(format!("{:?}", Shape::new(vec![4]).unwrap()), "[4]");
    assert_eq!(Shape::scalar(), Shape::new(vec![]).unwrap());
    assert_eq!(Shape::default(), Shape::scalar());
    assert_eq!(Shape::default().numel(), 1);
}

#[test]
fn tensor_data_length_mismatch_names_both_counts() {
    let err = Tensor::<f64>::new(&[2, 3], vec![0.0; 5]).unwrap_err();
    assert_eq!(
        err,
        Error::DataLength {
            op: "tensor",
            len: 5,
            shape: Box::new(Shape::new(vec![2, 3]).unwrap()),
            numel: 6
        }
    );
    assert_eq!(
        err.to_string(),
        "tensor: data has 5 elements but shape [2, 3] needs 6"
    );
    assert!(Tensor::<f32>::new(&[], vec![]).is_err());
    assert!(Tensor::<f32>::new(&[0], vec![1.0]).is_err());
    let err = Tensor::<f32>::new(&[usize::MAX, 2], vec![]).unwrap_err();
    assert_eq!(
        err,
        Error::Overflow {
            op: "Tensor::new",
            dims: vec![usize::MAX, 2]
        }
    );
    assert_eq!(
        err.to_string(),
        format!(
            "Tensor::new: shape [{}, 2] has too many elements",
            usize::MAX
        )
    );
}

#[test]
fn reshape_to_an_overflowing_shape_is_an_error() {
    let x = tensor::<f64>(&[0], &[]);
    assert!(matches!(
        x.reshape(&[usize::MAX, 2, 0]),
        Err(Error::Overflow { op: "reshape", .. })
    ));
}

#[test]
fn item_needs_exactly_one_element() {
    assert_eq!(tensor::<f64>(&[1, 1], &[3.0]).item().unwrap(), 3.0);
    assert_eq!(
        tensor::<f64>(&[2], &[1.0, 2.0])
            .item()
            .unwrap_err()
            .to_string(),
        "item: tensor of shape [2] has 2 elements, not 1"
    );
}

#[test]
fn clones_share_until_written() {
    let x = tensor::<f64>(&[3], &[1.0, 2.0, 3.0]);
    let mut y = x.clone();
    assert!(y.shares_buffer_with(&x));
    y.data_mut()[0] = 9.0;
    assert!(!y.shares_buffer_with(&x));
    assert_eq!((x.data()[0], y.data()[0]), (1.0, 9.0));
}
