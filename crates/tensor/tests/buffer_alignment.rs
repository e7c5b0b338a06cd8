//! Every tensor buffer of two or more elements starts on a 64-byte boundary, whichever way it was
//! made (from a vector, an iterator, a writer, a fill, a cast, a copy-on-write copy, a recycled
//! buffer from the pool), and holds the values it should; clones share it until one is written.

use proptest::prelude::*;
use tapegrad_tensor::{pool, Scalar, Shape, Tensor, BUFFER_ALIGN};

/// The `i`-th test value of a run (distinct, exact in f32, never zero).
fn value<S: Scalar>(seed: u32, i: usize) -> S {
    S::from_f64(f64::from(seed % 1000) + (i % 4096) as f64 * 0.25 + 0.5)
}

/// Asserts `t` holds `want` in a buffer aligned as promised.
fn check<S: Scalar>(what: &str, t: &Tensor<S>, want: &[S]) -> Result<(), TestCaseError> {
    let addr = t.data().as_ptr() as usize;
    if want.len() >= 2 {
        prop_assert_eq!(
            addr % BUFFER_ALIGN,
            0,
            "{}: {} elements at {:#x}",
            what,
            want.len(),
            addr
        );
    }
    prop_assert!(t.data() == want, "{}: wrong values", what);
    prop_assert_eq!(t.nbytes(), std::mem::size_of_val(want), "{}", what);
    Ok(())
}

/// Every constructor path at `len` elements of `S`.
fn every_path<S: Scalar>(len: usize, seed: u32) -> Result<(), TestCaseError> {
    let shape = Shape::new([len]).unwrap();
    let want: Vec<S> = (0..len).map(|i| value(seed, i)).collect();
    let half = S::from_f64(0.5);

    check("new", &Tensor::new(&[len], want.clone()).unwrap(), &want)?;
    check(
        "from_shape",
        &Tensor::from_shape(shape.clone(), want.clone()).unwrap(),
        &want,
    )?;
    let wide: Vec<f64> = want.iter().map(|v| v.to_f64()).collect();
    check(
        "from_f64",
        &Tensor::<S>::from_f64(&[len], &wide).unwrap(),
        &want,
    )?;
    check(
        "from_iter_exact",
        &Tensor::from_iter_exact(shape.clone(), want.iter().copied()).unwrap(),
        &want,
    )?;
    check(
        "from_writer",
        &Tensor::from_writer(shape.clone(), |d| d.copy_from_slice(&want)),
        &want,
    )?;
    check(
        "zeros_with",
        &Tensor::zeros_with(shape.clone(), |d| {
            for (d, &v) in d.iter_mut().zip(&want) {
                *d += v;
            }
        }),
        &want,
    )?;
    check("full", &Tensor::full(&shape, half), &vec![half; len])?;
    check("zeros", &Tensor::<S>::zeros(&shape), &vec![S::ZERO; len])?;
    check("ones", &Tensor::<S>::ones(&shape), &vec![S::ONE; len])?;

    let x = Tensor::new(&[len], want.clone()).unwrap();
    // The values are exact in f32, so a round trip through either type keeps them.
    check(
        "cast to f32",
        &x.cast::<f32>(),
        &x.to_f64_vec().iter().map(|&v| v as f32).collect::<Vec<_>>(),
    )?;
    check("cast to f64", &x.cast::<f64>(), &x.to_f64_vec())?;
    let doubled: Vec<S> = want.iter().map(|&v| v + v).collect();
    check("map", &x.map(|v| v + v), &doubled)?;
    check(
        "zip_map",
        &x.zip_map(&x, "add", |a, b| a + b).unwrap(),
        &doubled,
    )?;

    // A clone shares the buffer; writing it copies it first, to an aligned buffer of its own.
    let mut copy = x.clone();
    prop_assert_eq!(copy.shares_buffer_with(&x), len >= 2);
    copy.data_mut()[len - 1] = half;
    prop_assert!(!copy.shares_buffer_with(&x));
    let mut written = want.clone();
    written[len - 1] = half;
    check("copy-on-write copy", &copy, &written)?;
    check("original after the copy's write", &x, &want)?;
    let reshaped = x.reshape(&[1, len]).unwrap();
    prop_assert_eq!(reshaped.shares_buffer_with(&x), len >= 2);
    check("reshape", &reshaped, &want)?;
    prop_assert_eq!(x.clone().into_vec(), want.clone());
    drop((x, copy, reshaped));

    // Recycled buffers: each constructor after a drop of its length takes one from the pool.
    let recycled = |what: &str, make: &dyn Fn() -> Tensor<S>, want: &[S]| {
        drop(Tensor::<S>::full(&shape, S::from_f64(f64::NAN)));
        let before = pool::stats::<S>();
        let t = make();
        let after = pool::stats::<S>();
        if len >= 2 {
            let reused = after.reused + after.small_reused;
            prop_assert_eq!(
                reused,
                before.reused + before.small_reused + 1,
                "{}: not recycled",
                what
            );
        }
        check(what, &t, want)
    };
    recycled(
        "recycled new",
        &|| Tensor::new(&[len], want.clone()).unwrap(),
        &want,
    )?;
    recycled(
        "recycled from_iter_exact",
        &|| Tensor::from_iter_exact(shape.clone(), want.iter().copied()).unwrap(),
        &want,
    )?;
    recycled(
        "recycled from_writer",
        &|| Tensor::from_writer(shape.clone(), |d| d.copy_from_slice(&want)),
        &want,
    )?;
    recycled(
        "recycled full",
        &|| Tensor::full(&shape, half),
        &vec![half; len],
    )?;
    recycled(
        "recycled zeros",
        &|| Tensor::zeros(&shape),
        &vec![S::ZERO; len],
    )?;
    let shared = Tensor::new(&[len], want.clone()).unwrap();
    recycled(
        "recycled copy-on-write copy",
        &|| {
            let mut c = shared.clone();
            c.data_mut();
            c
        },
        &want,
    )?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_buffer_of_two_or_more_elements_is_64_byte_aligned(len in 1usize..10_000, seed: u32) {
        every_path::<f32>(len, seed)?;
        every_path::<f64>(len, seed)?;
    }
}

/// Short lengths, each of them, where the small size classes and the inline element meet.
#[test]
fn every_short_length_is_aligned_too() {
    for len in 1..=300 {
        every_path::<f32>(len, 7).unwrap();
        every_path::<f64>(len, 11).unwrap();
    }
}

#[test]
fn clones_share_until_one_is_written() {
    let a = Tensor::<f32>::new(&[3, 5], (0..15).map(|i| i as f32).collect()).unwrap();
    let b = a.clone();
    let mut c = b.clone();
    assert!(a.shares_buffer_with(&b) && b.shares_buffer_with(&c));
    assert_eq!(a.data().as_ptr(), c.data().as_ptr());
    c.data_mut()[4] = -1.0;
    assert!(!c.shares_buffer_with(&a));
    assert!(a.shares_buffer_with(&b), "the other holders keep sharing");
    assert_eq!(a.data()[4], 4.0);
    assert_eq!(c.data()[4], -1.0);
    assert_eq!(c.data().as_ptr() as usize % BUFFER_ALIGN, 0);
    // The sole holder now writes in place.
    let addr = c.data().as_ptr();
    c.data_mut()[0] = 9.0;
    assert_eq!(c.data().as_ptr(), addr);
    drop(a);
    // One holder left: written in place too.
    let mut b = b;
    let addr = b.data().as_ptr();
    b.data_mut()[1] = 8.0;
    assert_eq!(b.data().as_ptr(), addr);
    assert_eq!(&b.data()[..3], &[0.0, 8.0, 2.0]);
}

#[test]
fn a_tensor_is_still_72_bytes() {
    assert_eq!(std::mem::size_of::<Tensor<f32>>(), 72);
    assert_eq!(std::mem::size_of::<Tensor<f64>>(), 72);
}

/// A clone read and dropped on another thread while this one writes: each write either copies
/// the buffer (still shared) or, once the other holder is gone, writes it in place, which the
/// count's release and acquire must order after the other thread's reads (Miri's race detector
/// checks that ordering when it runs this).
#[test]
fn a_clone_dropped_on_another_thread_is_ordered_before_the_last_holders_write() {
    let mut a = Tensor::<f32>::new(&[64], (0..64).map(|i| i as f32).collect()).unwrap();
    let b = a.clone();
    std::thread::scope(|s| {
        s.spawn(move || {
            let sum: f32 = b.data().iter().sum();
            assert_eq!(sum, 2016.0);
            drop(b);
        });
        for _ in 0..20 {
            a.data_mut()[0] += 1.0;
        }
    });
    assert_eq!(a.data()[0], 20.0);
    assert_eq!(a.data()[63], 63.0);
    assert_eq!(a.data().as_ptr() as usize % BUFFER_ALIGN, 0);
}
