//! Property tests of broadcasting: `broadcast_shape` against the NumPy rule written out by hand,
//! `binary_map` (every fast path and the general strided walk) against an index-by-index reference,
//! and `broadcast_to` / `sum_to` as an adjoint pair.

mod common;

use common::*;
use proptest::prelude::*;
use tapegrad_tensor::kernels::{binary_map, broadcast_shape, broadcast_to, sum_to};
use tapegrad_tensor::{Error, Scalar, Shape, Tensor};

fn shape(dims: &[usize]) -> Shape {
    Shape::new(dims).unwrap()
}

/// Index-by-index reference of `f(a, b)` over the broadcast shape.
fn reference_map(
    a: &Tensor<f64>,
    b: &Tensor<f64>,
    f: impl Fn(f64, f64) -> f64,
) -> Option<(Vec<usize>, Vec<f64>)> {
    let out = numpy_broadcast(a.dims(), b.dims())?;
    let data = indices(&out)
        .iter()
        .map(|idx| {
            let ia = ravel(&broadcast_source_index(idx, a.dims()), a.dims());
            let ib = ravel(&broadcast_source_index(idx, b.dims()), b.dims());
            f(a.data()[ia], b.data()[ib])
        })
        .collect();
    Some((out, data))
}

/// Not commutative, so swapped operands are caught.
fn combine<S: Scalar>(x: S, y: S) -> S {
    x * S::from_f64(3.0) - y
}

/// A pair of shapes that both broadcast to a common shape.
fn compatible_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    dims(5, 3).prop_flat_map(|out| (broadcastable_to(out.clone()), broadcastable_to(out)))
}

fn check_binary_map(a_dims: &[usize], b_dims: &[usize], seed: u64) -> Result<(), TestCaseError> {
    let a = tensor::<f64>(a_dims, &floats(numel(a_dims), seed, 4.0));
    let b = tensor::<f64>(b_dims, &floats(numel(b_dims), seed ^ 1, 4.0));
    let (want_dims, want) = reference_map(&a, &b, combine).expect("compatible by construction");
    let got = binary_map("test", &a, &b, combine).unwrap();
    prop_assert_eq!(got.dims(), &want_dims[..]);
    // The same f on the same pair of elements: equal to the last bit.
    prop_assert!(same_bits(got.data(), &want), "{:?} vs {:?}", got, want);
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn broadcast_shape_follows_numpy_and_is_symmetric(a in dims(5, 3), b in dims(5, 3)) {
        let (sa, sb) = (shape(&a), shape(&b));
        let ab = broadcast_shape("add", &sa, &sb);
        let ba = broadcast_shape("add", &sb, &sa);
        match numpy_broadcast(&a, &b) {
            Some(want) => {
                prop_assert_eq!(ab.unwrap().dims().to_vec(), want.clone());
                prop_assert_eq!(ba.unwrap().dims().to_vec(), want);
            }
            None => {
                prop_assert_eq!(ab, Err(Error::Broadcast { op: "add", lhs: Box::new(sa.clone()), rhs: Box::new(sb.clone()) }));
                prop_assert_eq!(ba, Err(Error::Broadcast { op: "add", lhs: Box::new(sb), rhs: Box::new(sa) }));
            }
        }
    }

    #[test]
    fn broadcast_shape_of_compatible_pairs((a, b) in compatible_pair()) {
        let want = numpy_broadcast(&a, &b).unwrap();
        prop_assert_eq!(broadcast_shape("add", &shape(&a), &shape(&b)).unwrap().dims().to_vec(), want.clone());
        prop_assert_eq!(broadcast_shape("add", &shape(&b), &shape(&a)).unwrap().dims().to_vec(), want);
    }

    #[test]
    fn binary_map_equals_reference_on_every_path((a, b) in compatible_pair(), seed in any::<u64>()) {
        check_binary_map(&a, &b, seed)?;
        check_binary_map(&b, &a, seed)?;
    }

    #[test]
    fn binary_map_of_incompatible_shapes_errors(a in dims(4, 3), b in dims(4, 3)) {
        prop_assume!(numpy_broadcast(&a, &b).is_none());
        let x = Tensor::<f32>::zeros(&shape(&a));
        let y = Tensor::<f32>::zeros(&shape(&b));
        prop_assert_eq!(
            binary_map("mul", &x, &y, |p, q| p * q).unwrap_err(),
            Error::Broadcast { op: "mul", lhs: Box::new(shape(&a)), rhs: Box::new(shape(&b)) }
        );
    }

    #[test]
    fn broadcast_to_matches_reference_and_sum_to_is_its_adjoint(
        (small, big) in dims(5, 3).prop_flat_map(|out| (broadcastable_to(out.clone()), Just(out))),
        seed in any::<u64>(),
    ) {
        let x = tensor::<f64>(&small, &small_ints(numel(&small), seed));
        let y = tensor::<f64>(&big, &small_ints(numel(&big), seed ^ 7));
        let bx = broadcast_to(&x, &shape(&big)).unwrap();
        prop_assert_eq!(bx.dims(), &big[..]);
        for (lin, idx) in indices(&big).iter().enumerate() {
            let src = ravel(&broadcast_source_index(idx, &small), &small);
            prop_assert_eq!(bx.data()[lin], x.data()[src]);
        }
        let sy = sum_to(&y, &shape(&small)).unwrap();
        prop_assert_eq!(sy.dims(), &small[..]);
        // <broadcast_to(x), y> == <x, sum_to(y)>, exact on small integers.
        let lhs: f64 = bx.data().iter().zip(y.data()).map(|(p, q)| p * q).sum();
        let rhs: f64 = x.data().iter().zip(sy.data()).map(|(p, q)| p * q).sum();
        prop_assert_eq!(lhs, rhs);
    }

    #[test]
    fn sum_to_errors_exactly_when_target_does_not_broadcast_to_the_gradient(
        target in dims(4, 3),
        grad in dims(4, 3),
        seed in any::<u64>(),
    ) {
        let g = tensor::<f64>(&grad, &small_ints(numel(&grad), seed));
        let got = sum_to(&g, &shape(&target));
        if numpy_broadcast(&target, &grad).as_deref() == Some(&grad[..]) {
            let got = got.unwrap();
            prop_assert_eq!(got.dims(), &target[..]);
            // Reference: scatter-add every gradient element into the slot it was broadcast from.
            let mut want = vec![0.0; numel(&target)];
            for (lin, idx) in indices(&grad).iter().enumerate() {
                want[ravel(&broadcast_source_index(idx, &target), &target)] += g.data()[lin];
            }
            prop_assert_eq!(got.data(), &want[..]);
        } else {
            prop_assert!(matches!(got, Err(Error::Broadcast { op: "sum_to", .. })), "{:?}", got);
            let to = broadcast_to(&Tensor::<f64>::zeros(&shape(&target)), &shape(&grad));
            prop_assert!(matches!(to, Err(Error::Broadcast { op: "broadcast_to", .. })), "{:?}", to);
        }
    }
}

/// Each named fast path of `binary_map`, pinned down once with readable values.
#[test]
fn binary_map_fast_paths_by_example() {
    let m = tensor::<f64>(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let row = tensor::<f64>(&[3], &[10.0, 20.0, 30.0]);
    let sub = |x: f64, y: f64| x - y;
    // Trailing suffix on the right.
    let got = binary_map("sub", &m, &row, sub).unwrap();
    assert_eq!(got.data(), &[-9.0, -18.0, -27.0, -6.0, -15.0, -24.0]);
    // Suffix on the left goes through the general walk; same values negated.
    let got = binary_map("sub", &row, &m, sub).unwrap();
    assert_eq!(got.data(), &[9.0, 18.0, 27.0, 6.0, 15.0, 24.0]);
    // Scalar either side, including an all-ones shape of the same rank.
    let s = Tensor::scalar(1.0);
    assert_eq!(
        binary_map("sub", &m, &s, sub).unwrap().data(),
        &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    );
    let ones = tensor::<f64>(&[1, 1], &[1.0]);
    assert_eq!(
        binary_map("sub", &ones, &m, sub).unwrap().data(),
        &[0.0, -1.0, -2.0, -3.0, -4.0, -5.0]
    );
    // A one-element operand of higher rank widens the output instead of taking the scalar path.
    let got = binary_map("sub", &m, &tensor::<f64>(&[1, 1, 1], &[1.0]), sub).unwrap();
    assert_eq!(got.dims(), &[1, 2, 3]);
    // A column broadcasts along rows.
    let col = tensor::<f64>(&[2, 1], &[100.0, 200.0]);
    assert_eq!(
        binary_map("sub", &m, &col, sub).unwrap().data(),
        &[-99.0, -98.0, -97.0, -196.0, -195.0, -194.0]
    );
    // Zero-size operands broadcast against size-1 dims and give empty results.
    let empty = Tensor::<f64>::zeros(&shape(&[0, 3]));
    let got = binary_map(
        "sub",
        &empty,
        &tensor::<f64>(&[1, 3], &[1.0, 2.0, 3.0]),
        sub,
    )
    .unwrap();
    assert_eq!((got.dims(), got.numel()), (&[0usize, 3][..], 0));
}

#[test]
fn broadcast_error_message_names_the_op_and_both_shapes() {
    let err = broadcast_shape("add", &shape(&[2, 3]), &shape(&[4])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "add: shapes [2, 3] and [4] do not broadcast"
    );
}

#[test]
fn broadcast_shape_overflow_is_an_error_not_a_panic() {
    let big = 1usize << 32;
    let got = broadcast_shape("add", &shape(&[big, 1]), &shape(&[1, big]));
    // The error names the op that broadcast, not the shape constructor.
    assert!(
        matches!(got, Err(Error::Overflow { op: "add", .. })),
        "{got:?}"
    );
}
