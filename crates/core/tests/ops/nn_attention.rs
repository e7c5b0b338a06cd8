//! scaled_dot_product_attention: values against an explicit softmax, laws 5 and 6 with and without
//! causal or boolean masks, the documented result of fully masked rows (output 0, gradient 0), no
//! NaN under masks even with huge scores, and shape errors.

use crate::ops_nn_support::{fwd, laws, random, rng, t, uniform, vjp_with_needs};
use tapegrad_core::laws::op_vjp;
use tapegrad_core::ops::nn::ScaledDotProductAttention;
use tapegrad_core::ops::Mask;
use tapegrad_core::{Op, Session, Shape, Tensor};

fn sdpa(is_causal: bool, scale: Option<f64>, attn_mask: Option<Mask>) -> Op {
    ScaledDotProductAttention {
        is_causal,
        scale,
        attn_mask,
        ..Default::default()
    }
    .into()
}

fn all_finite(t: &Tensor<f64>) -> bool {
    t.first_non_finite().is_none()
}

#[test]
fn attention_matches_an_explicit_softmax() {
    // One query against two keys with E = 4: scores q.k / 2.
    let q = t(&[1, 1, 1, 4], &[1., 0., 1., 0.]);
    let k = t(&[1, 1, 2, 4], &[1., 1., 1., 1., 0., 2., 0., 2.]);
    let v = t(&[1, 1, 2, 2], &[1., 10., 3., 30.]);
    let y = fwd(&sdpa(false, None, None), &[&q, &k, &v]);
    let (s0, s1): (f64, f64) = (2.0 / 2.0, 0.0);
    let (p0, p1) = (
        s0.exp() / (s0.exp() + s1.exp()),
        s1.exp() / (s0.exp() + s1.exp()),
    );
    let want = [p0 * 1. + p1 * 3., p0 * 10. + p1 * 30.];
    for (a, b) in y.data().iter().zip(want) {
        assert!((a - b).abs() < 1e-12, "{y:?} vs {want:?}");
    }
    // Causal: the first query sees only the first key, so its output is the first value.
    let q2 = t(&[1, 2, 1], &[5., -3.]);
    let k2 = t(&[1, 2, 1], &[1., 2.]);
    let v2 = t(&[1, 2, 1], &[7., 9.]);
    let y = fwd(&sdpa(true, None, None), &[&q2, &k2, &v2]);
    assert_eq!(y.data()[0], 7.);
}

#[test]
fn attention_laws_with_and_without_masks() {
    let mut r = rng(31);
    let mask = |dims: &[usize], r: &mut rand_chacha::ChaCha8Rng| {
        let m = uniform(r, dims, 0.0, 1.0);
        Mask::from_tensor(&m, |v| v > 0.3)
    };
    let cases: Vec<(Op, [Vec<usize>; 3])> = vec![
        (
            sdpa(false, None, None),
            [vec![2, 2, 3, 4], vec![2, 2, 5, 4], vec![2, 2, 5, 3]],
        ),
        (
            sdpa(true, None, None),
            [vec![1, 2, 4, 3], vec![1, 2, 4, 3], vec![1, 2, 4, 2]],
        ),
        (
            sdpa(true, None, None),
            [vec![1, 1, 3, 2], vec![1, 1, 5, 2], vec![1, 1, 5, 2]],
        ),
        (
            sdpa(true, Some(0.7), None),
            [vec![2, 1, 5, 2], vec![2, 1, 3, 2], vec![2, 1, 3, 4]],
        ),
        (
            sdpa(false, None, Some(mask(&[3, 4], &mut r))),
            [vec![2, 2, 3, 2], vec![2, 2, 4, 2], vec![2, 2, 4, 3]],
        ),
        (
            sdpa(false, Some(2.0), Some(mask(&[2, 1, 3, 4], &mut r))),
            [vec![2, 3, 3, 2], vec![2, 3, 4, 2], vec![2, 3, 4, 1]],
        ),
        (
            sdpa(false, None, None),
            [vec![4, 3], vec![2, 3], vec![2, 5]],
        ),
        (
            sdpa(false, None, None),
            [vec![2, 3, 2], vec![2, 0, 2], vec![2, 0, 3]],
        ),
    ];
    for (op, [qd, kd, vd]) in cases {
        let inputs = [
            random(&mut r, &qd),
            random(&mut r, &kd),
            random(&mut r, &vd),
        ];
        laws(&op, &inputs, &mut r);
    }
}

#[test]
fn a_fully_masked_row_gives_zero_output_and_zero_gradient() {
    let mut r = rng(32);
    // Query 1 may attend no key; queries 0 and 2 attend some.
    let mask = Mask::new(
        &[3, 4],
        vec![
            true, false, true, false, //
            false, false, false, false, //
            true, true, true, true,
        ],
    )
    .unwrap();
    let op = sdpa(false, None, Some(mask));
    let (q, k, v) = (
        random(&mut r, &[1, 2, 3, 2]),
        random(&mut r, &[1, 2, 4, 2]),
        random(&mut r, &[1, 2, 4, 3]),
    );
    let y = fwd(&op, &[&q, &k, &v]);
    assert!(all_finite(&y));
    for head in 0..2 {
        let row = &y.data()[head * 9 + 3..head * 9 + 6];
        assert_eq!(row, &[0., 0., 0.], "head {head}");
    }
    let seed = random(&mut r, y.dims());
    let g = op_vjp(&op, &[&q, &k, &v], &seed).unwrap();
    assert!(g.iter().all(all_finite));
    // The masked query row gets no gradient.
    for head in 0..2 {
        assert_eq!(&g[0].data()[head * 6 + 2..head * 6 + 4], &[0., 0.]);
    }
    // Masked keys (key 3 is seen only by query 2) still get gradient from the rows that see them;
    // the laws hold on the whole op, fully masked row included.
    laws(&op, &[q, k, v], &mut r);
}

#[test]
fn masked_positions_produce_no_nan_even_with_huge_scores() {
    let mut r = rng(33);
    let big = |r: &mut rand_chacha::ChaCha8Rng, d: &[usize]| uniform(r, d, 300.0, 1000.0);
    let (q, k, v) = (
        big(&mut r, &[1, 1, 4, 8]),
        big(&mut r, &[1, 1, 4, 8]),
        random(&mut r, &[1, 1, 4, 2]),
    );
    for op in [sdpa(true, None, None), sdpa(false, None, None)] {
        let out = op.forward(&[&q, &k, &v]).unwrap();
        assert!(all_finite(&out.value), "{op}");
        let seed = random(&mut r, out.value.dims());
        let g = op_vjp(&op, &[&q, &k, &v], &seed).unwrap();
        assert!(g.iter().all(all_finite), "{op}");
        let tangents: Vec<Tensor<f64>> = [&q, &k, &v]
            .iter()
            .map(|x| random(&mut r, x.dims()))
            .collect();
        let tr: Vec<&Tensor<f64>> = tangents.iter().collect();
        assert!(
            all_finite(&op.jvp(&[&q, &k, &v], &out, &tr).unwrap()),
            "{op}"
        );
    }
}

#[test]
fn attention_rejects_bad_shapes_and_attributes() {
    let s = |d: &[usize]| Shape::new(d).unwrap();
    let (q, k, v) = (s(&[2, 3, 4]), s(&[2, 5, 4]), s(&[2, 5, 6]));
    assert_eq!(
        sdpa(false, None, None).output_shape(&[&q, &k, &v]).unwrap(),
        s(&[2, 3, 6])
    );
    for (q2, k2, v2) in [
        (s(&[2, 3, 3]), k.clone(), v.clone()),
        (q.clone(), k.clone(), s(&[2, 4, 6])),
        (s(&[3, 3, 4]), k.clone(), v.clone()),
        (s(&[4]), s(&[4]), s(&[4])),
        // Leading dimensions that do not broadcast (PyTorch's matmul rejects them too).
        (q.clone(), s(&[3, 5, 4]), s(&[3, 5, 6])),
    ] {
        let e = sdpa(false, None, None)
            .output_shape(&[&q2, &k2, &v2])
            .unwrap_err();
        assert!(
            e.to_string().contains("scaled_dot_product_attention"),
            "{e}"
        );
    }
    let m = Mask::new(&[3, 5], vec![true; 15]).unwrap();
    assert!(sdpa(true, None, Some(m))
        .output_shape(&[&q, &k, &v])
        .is_err());
    let wrong = Mask::new(&[5, 3], vec![true; 15]).unwrap();
    assert!(sdpa(false, None, Some(wrong))
        .output_shape(&[&q, &k, &v])
        .is_err());
    assert!(sdpa(false, Some(f64::INFINITY), None)
        .output_shape(&[&q, &k, &v])
        .is_err());
}

#[test]
fn session_attention_backpropagates_to_all_three() {
    let mut r = rng(34);
    let mut s = Session::<f64>::new();
    let q = s.parameter("q", random(&mut r, &[1, 2, 3, 4])).unwrap();
    let k = s.parameter("k", random(&mut r, &[1, 2, 3, 4])).unwrap();
    let v = s.parameter("v", random(&mut r, &[1, 2, 3, 4])).unwrap();
    let opts = ScaledDotProductAttention {
        is_causal: true,
        ..Default::default()
    };
    let y = s.scaled_dot_product_attention(q, k, v, opts).unwrap();
    let l = s.sum(y).unwrap();
    let g = s.backward(l).unwrap();
    // Each of the 2 x 3 output rows puts total weight 1 on the value rows, in each of 4 columns.
    let dv: f64 = g.get("v").unwrap().data().iter().sum();
    assert!((dv - 2.0 * 3.0 * 4.0).abs() < 1e-12, "{dv}");
    // Under a causal mask the last key is seen only by the last query.
    assert!(g.get("k").unwrap().data().iter().all(|v| v.is_finite()));
}

/// The causal path (loop bounds, no mask) gives the bits of the general masked path under the
/// same lower-triangular boolean mask, forward and VJP, with more queries than keys and fewer,
/// in f64 and f32.
#[test]
fn causal_rows_equal_the_explicit_lower_triangular_mask_bit_for_bit() {
    let mut r = rng(23);
    for (l, s) in [(5, 5), (6, 4), (3, 7), (1, 1)] {
        let tril: Vec<bool> = (0..l * s).map(|i| i % s <= i / s).collect();
        let mask = Mask::new(&[l, s], tril).unwrap();
        let q = random(&mut r, &[2, 3, l, 4]);
        let k = random(&mut r, &[2, 3, s, 4]);
        let v = random(&mut r, &[2, 3, s, 2]);
        let seed = random(&mut r, &[2, 3, l, 2]);
        let causal = sdpa(true, None, None);
        let masked = sdpa(false, None, Some(mask));
        let bits64 = |t: &Tensor<f64>| t.data().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits64(&fwd(&causal, &[&q, &k, &v])),
            bits64(&fwd(&masked, &[&q, &k, &v])),
            "f64 forward, L {l}, S {s}"
        );
        let needs = vec![true; 3];
        let a = vjp_with_needs(&causal, &[&q, &k, &v], &seed, needs.clone());
        let b = vjp_with_needs(&masked, &[&q, &k, &v], &seed, needs.clone());
        for (a, b) in a.iter().zip(&b) {
            assert_eq!(bits64(a.as_ref().unwrap()), bits64(b.as_ref().unwrap()));
        }
        let f32s = |t: &Tensor<f64>| -> Tensor<f32> {
            Tensor::new(t.dims(), t.data().iter().map(|&v| v as f32).collect()).unwrap()
        };
        let (q, k, v, seed) = (f32s(&q), f32s(&k), f32s(&v), f32s(&seed));
        let bits32 = |t: &Tensor<f32>| t.data().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let a = vjp_with_needs(&causal, &[&q, &k, &v], &seed, needs.clone());
        let b = vjp_with_needs(&masked, &[&q, &k, &v], &seed, needs);
        for (a, b) in a.iter().zip(&b) {
            assert_eq!(bits32(a.as_ref().unwrap()), bits32(b.as_ref().unwrap()));
        }
        let ya = causal.forward(&[&q, &k, &v]).unwrap().value;
        let yb = masked.forward(&[&q, &k, &v]).unwrap().value;
        assert_eq!(bits32(&ya), bits32(&yb), "f32 forward, L {l}, S {s}");
    }
}
