//! Tests of the `Scalar` helpers that kernels rely on: NaN-propagating `max_nan` / `min_nan`
//! (PyTorch's `maximum` / `minimum`) for f32 and f64, and exact conversions.

mod common;

use common::config;
use proptest::prelude::*;
use tapegrad_tensor::{DType, Scalar};

fn special() -> impl Strategy<Value = f64> {
    prop_oneof![
        -1e6f64..1e6,
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(0.0),
        Just(-0.0),
    ]
}

fn check<S: Scalar>(a: f64, b: f64) -> Result<(), TestCaseError> {
    let (x, y) = (S::from_f64(a), S::from_f64(b));
    for (name, got, want) in [
        ("max", x.max_nan(y), if x > y { x } else { y }),
        ("min", x.min_nan(y), if x < y { x } else { y }),
    ] {
        if x.is_nan() || y.is_nan() {
            prop_assert!(got.is_nan(), "{}({}, {}) = {}", name, x, y, got);
        } else {
            // `==` so that the choice between -0 and +0 is left open.
            prop_assert!(got == want, "{}({}, {}) = {}", name, x, y, got);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn max_and_min_propagate_nan_from_either_side(a in special(), b in special()) {
        check::<f64>(a, b)?;
        check::<f64>(b, a)?;
        check::<f32>(a, b)?;
        check::<f32>(b, a)?;
    }

    #[test]
    fn f64_round_trips_and_counts_are_exact(v in any::<f64>(), n in 0usize..(1 << 24)) {
        prop_assert_eq!(f64::from_f64(v).to_bits(), v.to_bits());
        prop_assert_eq!(f32::from_usize(n).to_f64(), n as f64);
        prop_assert_eq!(f64::from_usize(n), n as f64);
    }
}

#[test]
fn dtype_names() {
    assert_eq!(
        (f32::DTYPE.name(), f64::DTYPE.to_string()),
        ("f32", "f64".to_string())
    );
    assert_eq!(DType::F32, <f32 as Scalar>::DTYPE);
}
