//! logsumexp (torch.logsumexp): values worked out by hand, stability far from 0, PyTorch's
//! non-finite cases (an all -inf slice gives -inf, +inf gives +inf, NaN propagates), zero-size
//! reductions, f32 against f64, laws 5 and 6 for every axis variant, the VJP (the softmax over the
//! reduced axes), saves, display and errors that name the op.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tapegrad_core::laws::{check_op, op_vjp, Tolerance};
use tapegrad_core::ops::reduce::LogSumExp;
use tapegrad_core::ops::{ReduceOp, Saves};
use tapegrad_core::{Op, Shape, Tensor};

fn t(dims: &[usize], data: &[f64]) -> Tensor<f64> {
    Tensor::from_f64(dims, data).unwrap()
}

fn lse(axes: Option<Vec<isize>>, keepdim: bool) -> Op {
    Op::Reduce(ReduceOp::LogSumExp(LogSumExp { axes, keepdim }))
}

fn fwd(op: &Op, x: &Tensor<f64>) -> Tensor<f64> {
    op.forward(&[x])
        .unwrap_or_else(|e| panic!("{op}: forward failed: {e}"))
        .value
}

/// Equal shapes; finite elements within 1e-14 relative (an ulp or two), non-finite ones equal.
fn assert_close(got: &Tensor<f64>, dims: &[usize], want: &[f64]) {
    assert_eq!(got.dims(), dims, "shape of {got:?}");
    assert_eq!(got.numel(), want.len());
    for (i, (&g, &w)) in got.data().iter().zip(want).enumerate() {
        let same = if w.is_finite() {
            (g - w).abs() <= 1e-14 * w.abs().max(1.0)
        } else {
            g == w || (g.is_nan() && w.is_nan())
        };
        assert!(same, "element {i}: got {g}, want {w} (all: {got:?})");
    }
}

#[test]
fn forward_values_by_hand() {
    // Rows [0, ln 3] and [1, 1]: ln(1 + 3) and 1 + ln 2.
    let x = t(&[2, 2], &[0., 3f64.ln(), 1., 1.]);
    let (ln2, ln4) = (2f64.ln(), 4f64.ln());
    assert_close(&fwd(&lse(Some(vec![1]), false), &x), &[2], &[ln4, 1. + ln2]);
    assert_close(
        &fwd(&lse(Some(vec![-1]), true), &x),
        &[2, 1],
        &[ln4, 1. + ln2],
    );
    // Columns [0, 1] and [ln 3, 1].
    let e = std::f64::consts::E;
    assert_close(
        &fwd(&lse(Some(vec![0]), false), &x),
        &[2],
        &[(1. + e).ln(), (3. + e).ln()],
    );
    // Every axis: ln(1 + 3 + 2e), with and without keepdim, in either axis order.
    let all = (4. + 2. * e).ln();
    assert_close(&fwd(&lse(None, false), &x), &[], &[all]);
    assert_close(&fwd(&lse(None, true), &x), &[1, 1], &[all]);
    assert_close(&fwd(&lse(Some(vec![1, 0]), false), &x), &[], &[all]);
    // No axis, and a rank-0 input (axis 0 or -1, as PyTorch): the identity.
    assert_close(
        &fwd(&lse(Some(vec![]), false), &x),
        &[2, 2],
        &[0., 3f64.ln(), 1., 1.],
    );
    let s = Tensor::scalar(-2.5);
    for op in [
        lse(Some(vec![0]), false),
        lse(Some(vec![-1]), true),
        lse(None, false),
    ] {
        assert_close(&fwd(&op, &s), &[], &[-2.5]);
    }
}

#[test]
fn large_and_small_values_neither_overflow_nor_vanish() {
    // exp(1000) overflows and exp(-1000) underflows; the shift by the maximum keeps both exact.
    let big = t(&[3], &[1000., 1000., 1000.]);
    assert_close(&fwd(&lse(None, false), &big), &[], &[1000. + 3f64.ln()]);
    let small = t(&[2], &[-1000., -1000.]);
    assert_close(&fwd(&lse(None, false), &small), &[], &[-1000. + 2f64.ln()]);
    // A term 1000 below the maximum adds nothing representable.
    let mixed = t(&[2], &[-1000., 0.]);
    assert_close(&fwd(&lse(None, false), &mixed), &[], &[0.]);
}

#[test]
fn non_finite_slices_follow_pytorch() {
    let (inf, nan) = (f64::INFINITY, f64::NAN);
    let x = t(
        &[5, 3],
        &[
            -inf, -inf, -inf, // all -inf: -inf
            1., inf, 2., // +inf: +inf
            -inf, inf, 0., // +inf beside -inf: +inf
            1., nan, 0., // NaN: NaN
            -inf, 0., -inf, // -inf terms add nothing: 0
        ],
    );
    assert_close(
        &fwd(&lse(Some(vec![1]), false), &x),
        &[5],
        &[-inf, inf, inf, nan, 0.],
    );
    // The gradient is exp(x - y) per element, as PyTorch's: NaN where x and y are both infinite
    // (or y is NaN), 0 for a finite element beside +inf, the softmax elsewhere.
    let g = op_vjp(&lse(Some(vec![1]), false), &[&x], &t(&[5], &[1.; 5])).unwrap();
    assert_close(
        &g[0],
        &[5, 3],
        &[
            nan, nan, nan, 0., nan, 0., 0., nan, 0., nan, nan, nan, 0., 1., 0.,
        ],
    );
    // Over no axis too (a rank-0 input): the value is x, its derivative exp(x - x), NaN at
    // an infinite x, as PyTorch's.
    let op = lse(Some(vec![0]), true);
    for (x, d) in [(2.5, 3.), (-inf, nan), (inf, nan)] {
        let g = op_vjp(&op, &[&Tensor::scalar(x)], &Tensor::scalar(3.)).unwrap();
        assert_close(&fwd(&op, &Tensor::scalar(x)), &[], &[x]);
        assert_close(&g[0], &[], &[d]);
    }
}

#[test]
fn zero_size_reductions() {
    // The log of an empty sum is -inf; reducing a non-empty axis of an empty tensor gives an
    // empty result.
    let e = t(&[0, 3], &[]);
    assert_close(
        &fwd(&lse(Some(vec![0]), false), &e),
        &[3],
        &[f64::NEG_INFINITY; 3],
    );
    assert_close(&fwd(&lse(None, true), &e), &[1, 1], &[f64::NEG_INFINITY]);
    assert_close(&fwd(&lse(Some(vec![1]), false), &e), &[0], &[]);
    let g = op_vjp(&lse(Some(vec![0]), false), &[&e], &t(&[3], &[1., 2., 3.])).unwrap();
    assert_eq!(g[0].dims(), &[0, 3]);
}

#[test]
fn f32_agrees_with_f64() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let data: Vec<f64> = (0..24).map(|_| rng.random_range(-30.0..30.0)).collect();
    let x64 = t(&[2, 3, 4], &data);
    let x32 = Tensor::<f32>::from_f64(&[2, 3, 4], &data).unwrap();
    for axes in [None, Some(vec![0]), Some(vec![-1]), Some(vec![0, 2])] {
        let op = lse(axes, false);
        let want = fwd(&op, &x64);
        let got = op.forward(&[&x32]).unwrap().value;
        for (&g, &w) in got.data().iter().zip(want.data()) {
            let err = (f64::from(g) - w).abs() / w.abs().max(1.0);
            assert!(err < 4.0 * f64::from(f32::EPSILON), "{op}: {g} against {w}");
        }
    }
}

#[test]
fn laws_5_and_6_for_every_axis_variant() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let axes_variants: Vec<Option<Vec<isize>>> = vec![
        None,
        Some(vec![]),
        Some(vec![0]),
        Some(vec![-1]),
        Some(vec![1]),
        Some(vec![0, 2]),
        Some(vec![-1, 0]),
        Some(vec![2, 1, 0]),
    ];
    let mut random = |dims: &[usize]| {
        let n: usize = dims.iter().product();
        let data = (0..n).map(|_| rng.random_range(-3.0..3.0)).collect();
        Tensor::new(dims, data).unwrap()
    };
    let mut cases: Vec<(Op, &[usize])> = Vec::new();
    for axes in &axes_variants {
        for keepdim in [false, true] {
            cases.push((lse(axes.clone(), keepdim), &[2, 3, 4]));
        }
    }
    for keepdim in [false, true] {
        cases.push((lse(Some(vec![-1]), keepdim), &[5]));
        cases.push((lse(Some(vec![0]), keepdim), &[]));
        cases.push((lse(Some(vec![1]), keepdim), &[3, 1, 2]));
    }
    for (op, dims) in cases {
        let x = random(dims);
        let y = fwd(&op, &x);
        let (seed, tangent) = (random(y.dims()), random(dims));
        let report = check_op(&op, &[x], &seed, &[tangent], 1e-6, Tolerance::default()).unwrap();
        assert!(report.passed, "{op} at {dims:?}: {report:?}");
    }
}

#[test]
fn vjp_is_the_softmax_over_the_reduced_axes() {
    // d/dx ln(e^0 + e^ln3) = (1/4, 3/4); a zero cotangent gives exact zeros.
    let x = t(&[1, 2], &[0., 3f64.ln()]);
    let op = lse(Some(vec![1]), true);
    let g = op_vjp(&op, &[&x], &t(&[1, 1], &[2.])).unwrap();
    assert_close(&g[0], &[1, 2], &[0.5, 1.5]);
    let g = op_vjp(&op, &[&x], &t(&[1, 1], &[0.])).unwrap();
    assert!(g[0].is_all_zero(), "{:?}", g[0]);
    // Over every axis of [[0, 0], [0, 0]]: a quarter each.
    let z = t(&[2, 2], &[0.; 4]);
    let g = op_vjp(&lse(None, false), &[&z], &Tensor::scalar(1.)).unwrap();
    assert_close(&g[0], &[2, 2], &[0.25; 4]);
}

#[test]
fn saves_the_input_and_the_output_and_displays_its_attributes() {
    assert_eq!(lse(None, false).saves(), Saves::inputs(&[0]).with_output());
    assert_eq!(lse(None, false).name(), "logsumexp");
    assert_eq!(
        lse(Some(vec![0, -1]), true).to_string(),
        "logsumexp(axes=[0, -1], keepdim=true)"
    );
}

#[test]
fn bad_axes_are_errors_naming_the_op_and_the_shape() {
    for axes in [
        vec![2],
        vec![-3],
        vec![0, 0],
        vec![1, -1],
        vec![isize::MAX],
        vec![isize::MIN],
    ] {
        for keepdim in [false, true] {
            let op = lse(Some(axes.clone()), keepdim);
            let x = Tensor::<f64>::zeros(&Shape::new([2, 3]).unwrap());
            let by_shape = op.output_shape(&[x.shape()]).err().unwrap();
            let by_forward = op.forward(&[&x]).err().unwrap();
            assert_eq!(by_shape, by_forward, "{op}");
            let msg = by_forward.to_string();
            assert!(
                msg.starts_with("logsumexp") && msg.contains("[2, 3]"),
                "{msg}"
            );
        }
    }
}
