//! Property tests of `matmul` (PyTorch semantics: 1-D promotion on either side, batch broadcasting)
//! and `batched_matmul` (all four transpose flags) against a naive triple loop, in f32 and f64,
//! with zero-size m, n, k and batches; and bit-identical results for one, two and three GEMM
//! threads, for products cut into bands and for many small products spread whole.

mod common;

use common::*;
use proptest::prelude::*;
use tapegrad_tensor::kernels::{batched_matmul, matmul, num_threads, set_num_threads};
use tapegrad_tensor::{Error, Scalar, Shape, Tensor};

/// Naive `op(a) @ op(b)` over broadcast batches; `None` when the shapes do not multiply.
fn reference_batched(
    a: &Tensor<f64>,
    trans_a: bool,
    b: &Tensor<f64>,
    trans_b: bool,
) -> Option<(Vec<usize>, Vec<f64>)> {
    let (ad, bd) = (a.dims(), b.dims());
    let (ra, rb) = (ad.len(), bd.len());
    if ra < 2 || rb < 2 {
        return None;
    }
    let (m, k) = if trans_a {
        (ad[ra - 1], ad[ra - 2])
    } else {
        (ad[ra - 2], ad[ra - 1])
    };
    let (k2, n) = if trans_b {
        (bd[rb - 1], bd[rb - 2])
    } else {
        (bd[rb - 2], bd[rb - 1])
    };
    if k != k2 {
        return None;
    }
    let batch = numpy_broadcast(&ad[..ra - 2], &bd[..rb - 2])?;
    let element = |t: &Tensor<f64>, batch_idx: &[usize], r: usize, c: usize, trans: bool| {
        let mut idx = broadcast_source_index(batch_idx, &t.dims()[..t.rank() - 2]);
        idx.extend(if trans { [c, r] } else { [r, c] });
        t.data()[ravel(&idx, t.dims())]
    };
    let mut out = Vec::new();
    for bi in indices(&batch) {
        for i in 0..m {
            for j in 0..n {
                let mut total = 0.0;
                for p in 0..k {
                    total += element(a, &bi, i, p, trans_a) * element(b, &bi, p, j, trans_b);
                }
                out.push(total);
            }
        }
    }
    let mut dims = batch;
    dims.extend([m, n]);
    Some((dims, out))
}

/// PyTorch's `matmul`: promote 1-D operands, multiply, then drop the promoted axes.
fn reference_matmul(a: &Tensor<f64>, b: &Tensor<f64>) -> Option<(Vec<usize>, Vec<f64>)> {
    if a.rank() == 0 || b.rank() == 0 {
        return None;
    }
    let a2 = if a.rank() == 1 {
        a.reshape(&[1, a.dims()[0]]).unwrap()
    } else {
        a.clone()
    };
    let b2 = if b.rank() == 1 {
        b.reshape(&[b.dims()[0], 1]).unwrap()
    } else {
        b.clone()
    };
    let (mut dims, data) = reference_batched(&a2, false, &b2, false)?;
    let n = dims.pop().unwrap();
    let m = dims.pop().unwrap();
    if a.rank() > 1 {
        dims.push(m);
    }
    if b.rank() > 1 {
        dims.push(n);
    }
    Some((dims, data))
}

/// Operands for `matmul`: each side a vector `[k]` or a batch (broadcastable to a common one)
/// followed by a matrix; m, n, k and batch dims may be zero.
fn matmul_operands() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (
        dims(3, 3),
        0usize..=4,
        0usize..=4,
        0usize..=4,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_flat_map(|(batch, m, k, n, a_vec, b_vec)| {
            let (ab, bb) = (broadcastable_to(batch.clone()), broadcastable_to(batch));
            (ab, bb).prop_map(move |(mut ad, mut bd)| {
                if a_vec {
                    ad = vec![k];
                } else {
                    ad.extend([m, k]);
                }
                if b_vec {
                    bd = vec![k];
                } else {
                    bd.extend([k, n]);
                }
                (ad, bd)
            })
        })
}

fn check_matmul<S: Scalar>(ad: &[usize], bd: &[usize], seed: u64) -> Result<(), TestCaseError> {
    let (av, bv) = (small_ints(numel(ad), seed), small_ints(numel(bd), !seed));
    let want = reference_matmul(&tensor(ad, &av), &tensor(bd, &bv));
    let got = matmul(&tensor::<S>(ad, &av), &tensor::<S>(bd, &bv));
    match want {
        Some((dims, data)) => {
            let got = got.unwrap();
            prop_assert_eq!(got.dims(), &dims[..]);
            // Small integers with k <= 4: exact in f32 and f64 whatever the summation order.
            prop_assert_eq!(got.to_f64_vec(), data);
        }
        None => {
            let err = got.unwrap_err();
            prop_assert!(
                matches!(
                    err,
                    Error::Broadcast { op: "matmul", .. } | Error::Invalid { op: "matmul", .. }
                ),
                "{:?}",
                err
            );
            if let Error::Broadcast { lhs, rhs, .. } = &err {
                // The error names the shapes the caller passed, not the promoted ones.
                prop_assert_eq!((lhs.dims(), rhs.dims()), (ad, bd));
            }
        }
    }
    Ok(())
}

fn check_batched<S: Scalar>(
    ad: &[usize],
    trans_a: bool,
    bd: &[usize],
    trans_b: bool,
    seed: u64,
) -> Result<(), TestCaseError> {
    let (av, bv) = (small_ints(numel(ad), seed), small_ints(numel(bd), !seed));
    let (dims, data) = reference_batched(&tensor(ad, &av), trans_a, &tensor(bd, &bv), trans_b)
        .expect("compatible by construction");
    let got = batched_matmul(
        &tensor::<S>(ad, &av),
        trans_a,
        &tensor::<S>(bd, &bv),
        trans_b,
    )
    .unwrap();
    prop_assert_eq!(got.dims(), &dims[..]);
    prop_assert_eq!(got.to_f64_vec(), data);
    Ok(())
}

proptest! {
    #![proptest_config(config(192))]

    #[test]
    fn matmul_matches_pytorch_semantics((ad, bd) in matmul_operands(), seed in any::<u64>()) {
        check_matmul::<f64>(&ad, &bd, seed)?;
        check_matmul::<f32>(&ad, &bd, seed)?;
    }

    #[test]
    fn matmul_of_arbitrary_shapes_agrees_or_errors(ad in dims(4, 3), bd in dims(4, 3), seed in any::<u64>()) {
        check_matmul::<f64>(&ad, &bd, seed)?;
    }

    #[test]
    fn batched_matmul_all_transpose_flags(
        (batch, ab, bb) in dims(3, 3).prop_flat_map(|b| (Just(b.clone()), broadcastable_to(b.clone()), broadcastable_to(b))),
        (m, k, n) in (0usize..=4, 0usize..=4, 0usize..=4),
        (trans_a, trans_b) in (any::<bool>(), any::<bool>()),
        seed in any::<u64>(),
    ) {
        let _ = batch;
        let mut ad = ab;
        ad.extend(if trans_a { [k, m] } else { [m, k] });
        let mut bd = bb;
        bd.extend(if trans_b { [n, k] } else { [k, n] });
        check_batched::<f64>(&ad, trans_a, &bd, trans_b, seed)?;
        check_batched::<f32>(&ad, trans_a, &bd, trans_b, seed)?;
    }
}

#[test]
fn matmul_broadcasts_batches_like_pytorch() {
    let (ad, bd) = ([2usize, 1, 3, 4], [5usize, 4, 2]);
    let a = tensor::<f64>(&ad, &small_ints(numel(&ad), 1));
    let b = tensor::<f64>(&bd, &small_ints(numel(&bd), 2));
    let got = matmul(&a, &b).unwrap();
    assert_eq!(got.dims(), &[2, 5, 3, 2]);
    let (dims, want) = reference_matmul(&a, &b).unwrap();
    assert_eq!((got.dims(), got.data()), (&dims[..], &want[..]));
    // One spot value by hand: out[1, 3, 2, 1] = sum_p a[1, 0, 2, p] * b[3, p, 1].
    let by_hand: f64 = (0..4)
        .map(|p| a.data()[ravel(&[1, 0, 2, p], &ad)] * b.data()[ravel(&[3, p, 1], &bd)])
        .sum();
    assert_eq!(got.data()[ravel(&[1, 3, 2, 1], &[2, 5, 3, 2])], by_hand);
}

#[test]
fn matmul_errors_name_the_callers_shapes() {
    let a = Tensor::<f64>::zeros(&Shape::new(vec![2, 3]).unwrap());
    let b = Tensor::<f64>::zeros(&Shape::new(vec![4]).unwrap());
    assert_eq!(
        matmul(&a, &b).unwrap_err().to_string(),
        "matmul: shapes [2, 3] and [4] do not broadcast"
    );
    let s = Tensor::scalar(1.0f64);
    assert!(matches!(
        matmul(&s, &a),
        Err(Error::Invalid { op: "matmul", .. })
    ));
    assert!(matches!(
        batched_matmul(&b, false, &a, false),
        Err(Error::Invalid { op: "matmul", .. })
    ));
    let x = Tensor::<f64>::zeros(&Shape::new(vec![2, 2, 3]).unwrap());
    let y = Tensor::<f64>::zeros(&Shape::new(vec![3, 3, 2]).unwrap());
    assert!(matches!(
        matmul(&x, &y),
        Err(Error::Broadcast { op: "matmul", .. })
    ));
}

/// Large enough (m * n * k >= 128^3) that two threads really split the product.
fn threaded_case<S: Scalar>(trans_a: bool, trans_b: bool) -> (Vec<S>, Vec<S>) {
    let (m, k, n) = (197, 83, 171);
    let ad = if trans_a { [2, k, m] } else { [2, m, k] };
    let bd = if trans_b { [n, k] } else { [k, n] };
    let a = tensor::<S>(&ad, &floats(numel(&ad), 11, 1.0));
    let b = tensor::<S>(&bd, &floats(numel(&bd), 12, 1.0));
    set_num_threads(1);
    let one = batched_matmul(&a, trans_a, &b, trans_b).unwrap();
    set_num_threads(2);
    let two = batched_matmul(&a, trans_a, &b, trans_b);
    set_num_threads(1);
    let two = two.unwrap();
    // Both also agree with a naive loop (flat indices: this size is too slow for the general
    // reference) to rounding.
    assert_eq!(one.dims(), &[2, m, n]);
    let (av, bv, got) = (a.to_f64_vec(), b.to_f64_vec(), one.to_f64_vec());
    let tol = if S::DTYPE == tapegrad_tensor::DType::F32 {
        1e-4
    } else {
        1e-12
    };
    for batch in 0..2 {
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|p| {
                        let x = if trans_a {
                            av[(batch * k + p) * m + i]
                        } else {
                            av[(batch * m + i) * k + p]
                        };
                        let y = if trans_b {
                            bv[j * k + p]
                        } else {
                            bv[p * n + j]
                        };
                        x * y
                    })
                    .sum();
                let g = got[(batch * m + i) * n + j];
                assert!((g - want).abs() <= tol, "{g} vs {want}");
            }
        }
    }
    (one.into_vec(), two.into_vec())
}

/// 36 products of 40 x 33 x 50, each too small to split but together enough for two threads:
/// whole products go to the threads. On 1, 2 and 3 threads the bits agree, and on 2 they equal
/// the naive loop (small integers, so exactly).
fn many_small_products_case<S: Scalar>(trans_a: bool, trans_b: bool) -> [Vec<S>; 3] {
    let (m, k, n) = (40, 33, 50);
    let ad = if trans_a { [4, 9, k, m] } else { [4, 9, m, k] };
    let bd = if trans_b { [9, n, k] } else { [9, k, n] };
    let (av, bv) = (small_ints(numel(&ad), 5), small_ints(numel(&bd), 6));
    let (a, b) = (tensor::<S>(&ad, &av), tensor::<S>(&bd, &bv));
    let on = |threads| {
        set_num_threads(threads);
        let out = batched_matmul(&a, trans_a, &b, trans_b);
        set_num_threads(1);
        out.unwrap()
    };
    let (one, two, three) = (on(1), on(2), on(3));
    let (dims, want) =
        reference_batched(&tensor(&ad, &av), trans_a, &tensor(&bd, &bv), trans_b).unwrap();
    assert_eq!(two.dims(), &dims[..]);
    assert_eq!(two.to_f64_vec(), want, "trans {trans_a} {trans_b}");
    [one.into_vec(), two.into_vec(), three.into_vec()]
}

/// The only test that changes the thread count; it restores 1 before returning.
#[test]
#[cfg_attr(
    miri,
    ignore = "threaded GEMM needs >= 128^3 multiply-adds per product; under Miri this test ran over 13 minutes at 48^3"
)]
fn one_and_two_threads_give_identical_bits() {
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let (one, two) = threaded_case::<f64>(ta, tb);
        assert!(same_bits(&one, &two), "f64 trans {ta} {tb}");
        let (one, two) = threaded_case::<f32>(ta, tb);
        assert!(same_bits(&one, &two), "f32 trans {ta} {tb}");
        let [one, two, three] = many_small_products_case::<f64>(ta, tb);
        assert!(
            same_bits(&one, &two) && same_bits(&one, &three),
            "f64 products {ta} {tb}"
        );
        let [one, two, three] = many_small_products_case::<f32>(ta, tb);
        assert!(
            same_bits(&one, &two) && same_bits(&one, &three),
            "f32 products {ta} {tb}"
        );
    }
    assert_eq!(num_threads(), 1);
    set_num_threads(0);
    assert_eq!(num_threads(), 1, "0 threads means 1");
}
