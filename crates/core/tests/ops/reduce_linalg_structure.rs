//! Reductions, linear algebra and structural ops: shape rules, forward values, errors that name the
//! op and the shapes, finite-difference and adjoint checks at random points, tie handling of amax,
//! zero-preservation of every VJP, and respect for which arguments need a gradient.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tapegrad_core::laws::{check_op, op_vjp, Tolerance};
use tapegrad_core::ops::linalg::{Linear, Matmul, Permute, Transpose};
use tapegrad_core::ops::reduce::{Amax, LogSoftmax, Mean, Softmax, Sum};
use tapegrad_core::ops::structure::{BroadcastTo, Concat, Flatten, Reshape, Slice};
use tapegrad_core::ops::{LinalgOp, ReduceOp, Saved, Saves, StructureOp};
use tapegrad_core::{Op, Shape, Tensor};

fn t(dims: &[usize], data: &[f64]) -> Tensor<f64> {
    Tensor::from_f64(dims, data).unwrap()
}

fn random(rng: &mut ChaCha8Rng, dims: &[usize]) -> Tensor<f64> {
    let n: usize = dims.iter().product();
    let data: Vec<f64> = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
    Tensor::new(dims, data).unwrap()
}

fn sum(axes: Option<Vec<isize>>, keepdim: bool) -> Op {
    Op::Reduce(ReduceOp::Sum(Sum { axes, keepdim }))
}
fn mean(axes: Option<Vec<isize>>, keepdim: bool) -> Op {
    Op::Reduce(ReduceOp::Mean(Mean { axes, keepdim }))
}
fn amax(axes: Option<Vec<isize>>, keepdim: bool) -> Op {
    Op::Reduce(ReduceOp::Amax(Amax { axes, keepdim }))
}
fn softmax(axis: isize) -> Op {
    Op::Reduce(ReduceOp::Softmax(Softmax { axis }))
}
fn log_softmax(axis: isize) -> Op {
    Op::Reduce(ReduceOp::LogSoftmax(LogSoftmax { axis }))
}
fn matmul() -> Op {
    Op::Linalg(LinalgOp::Matmul(Matmul))
}
fn linear(bias: bool) -> Op {
    Op::Linalg(LinalgOp::Linear(Linear { bias }))
}
fn transpose(dim0: isize, dim1: isize) -> Op {
    Op::Linalg(LinalgOp::Transpose(Transpose { dim0, dim1 }))
}
fn permute(dims: &[isize]) -> Op {
    Op::Linalg(LinalgOp::Permute(Permute {
        dims: dims.to_vec(),
    }))
}
fn reshape(shape: &[isize]) -> Op {
    Op::Structure(StructureOp::Reshape(Reshape {
        shape: shape.to_vec(),
    }))
}
fn flatten(start_dim: isize, end_dim: isize) -> Op {
    Op::Structure(StructureOp::Flatten(Flatten { start_dim, end_dim }))
}
fn broadcast_to(shape: &[usize]) -> Op {
    Op::Structure(StructureOp::BroadcastTo(BroadcastTo {
        shape: shape.to_vec(),
    }))
}
fn concat(axis: isize) -> Op {
    Op::Structure(StructureOp::Concat(Concat { axis }))
}
fn slice(axis: isize, start: isize, end: isize, step: usize) -> Op {
    Op::Structure(StructureOp::Slice(Slice {
        axis,
        start,
        end,
        step,
    }))
}

fn fwd(op: &Op, xs: &[&Tensor<f64>]) -> Tensor<f64> {
    op.forward(xs)
        .unwrap_or_else(|e| panic!("{op}: forward failed: {e}"))
        .value
}

fn assert_close(got: &Tensor<f64>, dims: &[usize], want: &[f64]) {
    assert_eq!(got.dims(), dims, "shape of {got:?}");
    assert_eq!(got.numel(), want.len());
    for (i, (&g, &w)) in got.data().iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-12 * w.abs().max(1.0) || (g.is_nan() && w.is_nan()),
            "element {i}: got {g}, want {w} (all: {got:?})"
        );
    }
}

/// Finite differences and the JVP/VJP adjoint identity at a random point.
fn gradcheck(op: &Op, dims: &[&[usize]], rng: &mut ChaCha8Rng) {
    let inputs: Vec<Tensor<f64>> = dims.iter().map(|d| random(rng, d)).collect();
    gradcheck_at(op, &inputs, rng);
}

fn gradcheck_at(op: &Op, inputs: &[Tensor<f64>], rng: &mut ChaCha8Rng) {
    let refs: Vec<&Tensor<f64>> = inputs.iter().collect();
    let out = fwd(op, &refs);
    let seed = random(rng, out.dims());
    let tangents: Vec<Tensor<f64>> = inputs.iter().map(|x| random(rng, x.dims())).collect();
    let report = check_op(op, inputs, &seed, &tangents, 1e-6, Tolerance::default())
        .unwrap_or_else(|e| panic!("{op}: check failed to run: {e}"));
    let shapes: Vec<&Shape> = inputs.iter().map(|x| x.shape()).collect();
    assert!(report.passed, "{op} at shapes {shapes:?}: {report:?}");
}

/// The VJP with an exact-zero cotangent: every contribution must be exact zeros.
fn assert_zero_preserving(op: &Op, inputs: &[&Tensor<f64>]) {
    let out = op.forward(inputs).unwrap();
    let saved = Saved::keep(op.saves(), inputs, &out, vec![true; inputs.len()]);
    let zero = Tensor::zeros(out.value.shape());
    let grads = op.vjp(&saved.context(), &zero).unwrap();
    for (i, g) in grads.iter().enumerate() {
        let g = g
            .as_ref()
            .unwrap_or_else(|| panic!("{op}: no gradient for {i}"));
        assert_eq!(g.shape(), inputs[i].shape());
        assert!(g.is_all_zero(), "{op}: argument {i} got {g:?}");
    }
}

fn vjp_with_needs(op: &Op, inputs: &[&Tensor<f64>], needs: Vec<bool>) -> Vec<Option<Tensor<f64>>> {
    let out = op.forward(inputs).unwrap();
    let saved = Saved::keep(op.saves(), inputs, &out, needs);
    let seed = Tensor::ones(out.value.shape());
    op.vjp(&saved.context(), &seed).unwrap().into_vec()
}

// ---------------------------------------------------------------------------------------------
// Forward values

#[test]
fn reductions_forward_values() {
    let x = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    assert_close(&fwd(&sum(Some(vec![0]), false), &[&x]), &[3], &[5., 7., 9.]);
    assert_close(&fwd(&sum(Some(vec![-1]), true), &[&x]), &[2, 1], &[6., 15.]);
    assert_close(&fwd(&sum(None, false), &[&x]), &[], &[21.]);
    assert_close(&fwd(&sum(None, true), &[&x]), &[1, 1], &[21.]);
    assert_close(
        &fwd(&sum(Some(vec![]), false), &[&x]),
        &[2, 3],
        &[1., 2., 3., 4., 5., 6.],
    );
    assert_close(&fwd(&sum(Some(vec![1, 0]), false), &[&x]), &[], &[21.]);
    assert_close(&fwd(&mean(Some(vec![1]), false), &[&x]), &[2], &[2., 5.]);
    assert_close(
        &fwd(&mean(Some(vec![-2]), true), &[&x]),
        &[1, 3],
        &[2.5, 3.5, 4.5],
    );
    assert_close(&fwd(&mean(None, false), &[&x]), &[], &[3.5]);

    let y = t(&[2, 3], &[1., 5., 3., 4., 2., 6.]);
    assert_close(&fwd(&amax(Some(vec![1]), false), &[&y]), &[2], &[5., 6.]);
    assert_close(
        &fwd(&amax(Some(vec![0]), true), &[&y]),
        &[1, 3],
        &[4., 5., 6.],
    );
    assert_close(&fwd(&amax(None, false), &[&y]), &[], &[6.]);

    // Rank-0 inputs: axis 0 and -1 are accepted and reduce nothing (PyTorch).
    let s = Tensor::scalar(2.5);
    for op in [
        sum(Some(vec![0]), false),
        sum(Some(vec![-1]), true),
        sum(None, false),
        mean(Some(vec![0]), true),
        amax(Some(vec![-1]), false),
        amax(None, true),
    ] {
        assert_close(&fwd(&op, &[&s]), &[], &[2.5]);
    }

    // Mean over zero elements is NaN; sum over them is 0.
    let e = t(&[0, 3], &[]);
    assert_close(
        &fwd(&mean(Some(vec![0]), false), &[&e]),
        &[3],
        &[f64::NAN; 3],
    );
    assert_close(&fwd(&sum(Some(vec![0]), false), &[&e]), &[3], &[0.; 3]);
    assert_close(&fwd(&mean(None, false), &[&e]), &[], &[f64::NAN]);
    assert_close(&fwd(&mean(Some(vec![1]), true), &[&e]), &[0, 1], &[]);
    assert_close(&fwd(&amax(Some(vec![1]), false), &[&e]), &[0], &[]);
}

#[test]
fn softmax_forward_values() {
    let x = t(&[2, 2], &[0., 3f64.ln(), 1., 1.]);
    assert_close(&fwd(&softmax(1), &[&x]), &[2, 2], &[0.25, 0.75, 0.5, 0.5]);
    assert_close(
        &fwd(&log_softmax(-1), &[&x]),
        &[2, 2],
        &[0.25f64.ln(), 0.75f64.ln(), 0.5f64.ln(), 0.5f64.ln()],
    );
    // Along axis 0: columns [0, 1] and [ln 3, 1].
    let e = std::f64::consts::E;
    assert_close(
        &fwd(&softmax(0), &[&x]),
        &[2, 2],
        &[1. / (1. + e), 3. / (3. + e), e / (1. + e), e / (3. + e)],
    );
    // Large logits do not overflow.
    let big = t(&[3], &[1000., 1000., 1000.]);
    assert_close(&fwd(&softmax(0), &[&big]), &[3], &[1. / 3.; 3]);
    // A scalar's softmax is 1 and its log_softmax 0 (PyTorch).
    let s = Tensor::scalar(-7.0);
    assert_close(&fwd(&softmax(0), &[&s]), &[], &[1.]);
    assert_close(&fwd(&log_softmax(-1), &[&s]), &[], &[0.]);
}

#[test]
fn linalg_forward_values() {
    let a = t(&[2, 2], &[1., 2., 3., 4.]);
    let b = t(&[2, 2], &[5., 6., 7., 8.]);
    assert_close(&fwd(&matmul(), &[&a, &b]), &[2, 2], &[19., 22., 43., 50.]);
    let v = t(&[2], &[1., 2.]);
    let w = t(&[2], &[3., 4.]);
    assert_close(&fwd(&matmul(), &[&v, &w]), &[], &[11.]);
    assert_close(&fwd(&matmul(), &[&v, &b]), &[2], &[19., 22.]);
    assert_close(&fwd(&matmul(), &[&a, &w]), &[2], &[11., 25.]);
    // Batch broadcasting: [2, 1, 2] @ [2, 2] -> [2, 1, 2].
    let ab = t(&[2, 1, 2], &[1., 0., 0., 1.]);
    assert_close(&fwd(&matmul(), &[&ab, &b]), &[2, 1, 2], &[5., 6., 7., 8.]);

    let x = t(&[1, 2], &[1., 2.]);
    let wt = t(&[3, 2], &[1., 0., 0., 1., 1., 1.]);
    let bias = t(&[3], &[10., 20., 30.]);
    assert_close(
        &fwd(&linear(true), &[&x, &wt, &bias]),
        &[1, 3],
        &[11., 22., 33.],
    );
    assert_close(&fwd(&linear(false), &[&x, &wt]), &[1, 3], &[1., 2., 3.]);
    assert_close(&fwd(&linear(false), &[&v, &wt]), &[3], &[1., 2., 3.]);
    let x3 = t(&[2, 1, 2], &[1., 2., 3., 4.]);
    assert_close(
        &fwd(&linear(true), &[&x3, &wt, &bias]),
        &[2, 1, 3],
        &[11., 22., 33., 13., 24., 37.],
    );

    let m = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    assert_close(
        &fwd(&transpose(0, 1), &[&m]),
        &[3, 2],
        &[1., 4., 2., 5., 3., 6.],
    );
    assert_close(
        &fwd(&transpose(-1, -2), &[&m]),
        &[3, 2],
        &[1., 4., 2., 5., 3., 6.],
    );
    assert_close(
        &fwd(&transpose(1, 1), &[&m]),
        &[2, 3],
        &[1., 2., 3., 4., 5., 6.],
    );
    assert_close(&fwd(&transpose(0, -1), &[&Tensor::scalar(3.)]), &[], &[3.]);
    let c = t(&[1, 2, 3], &[1., 2., 3., 4., 5., 6.]);
    assert_close(
        &fwd(&permute(&[2, 0, 1]), &[&c]),
        &[3, 1, 2],
        &[1., 4., 2., 5., 3., 6.],
    );
    assert_close(
        &fwd(&permute(&[-1, 1, 0]), &[&c]),
        &[3, 2, 1],
        &[1., 4., 2., 5., 3., 6.],
    );
    assert_close(&fwd(&permute(&[]), &[&Tensor::scalar(3.)]), &[], &[3.]);
}

#[test]
fn structure_forward_values() {
    let x = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let r = fwd(&reshape(&[3, -1]), &[&x]);
    assert_close(&r, &[3, 2], &[1., 2., 3., 4., 5., 6.]);
    assert!(r.shares_buffer_with(&x), "reshape must not copy");
    assert_close(
        &fwd(&reshape(&[-1]), &[&x]),
        &[6],
        &[1., 2., 3., 4., 5., 6.],
    );
    assert_close(&fwd(&reshape(&[]), &[&t(&[1, 1], &[4.])]), &[], &[4.]);
    assert_close(&fwd(&reshape(&[3, 0]), &[&t(&[0, 5], &[])]), &[3, 0], &[]);

    let c = t(&[2, 1, 2, 1], &[1., 2., 3., 4.]);
    assert_close(&fwd(&flatten(0, -1), &[&c]), &[4], &[1., 2., 3., 4.]);
    assert_close(&fwd(&flatten(1, 2), &[&c]), &[2, 2, 1], &[1., 2., 3., 4.]);
    assert_close(&fwd(&flatten(-2, -1), &[&c]), &[2, 1, 2], &[1., 2., 3., 4.]);
    assert_close(
        &fwd(&flatten(2, 2), &[&c]),
        &[2, 1, 2, 1],
        &[1., 2., 3., 4.],
    );
    assert_close(&fwd(&flatten(0, -1), &[&Tensor::scalar(5.)]), &[1], &[5.]);
    assert_close(&fwd(&flatten(-1, 0), &[&Tensor::scalar(5.)]), &[1], &[5.]);

    let b = t(&[1, 2], &[1., 2.]);
    assert_close(
        &fwd(&broadcast_to(&[2, 2, 2]), &[&b]),
        &[2, 2, 2],
        &[1., 2., 1., 2., 1., 2., 1., 2.],
    );
    assert_close(
        &fwd(&broadcast_to(&[3]), &[&Tensor::scalar(7.)]),
        &[3],
        &[7.; 3],
    );
    assert_close(&fwd(&broadcast_to(&[0, 2]), &[&b]), &[0, 2], &[]);

    let p = t(&[2, 1], &[1., 2.]);
    let q = t(&[2, 2], &[3., 4., 5., 6.]);
    assert_close(
        &fwd(&concat(1), &[&p, &q]),
        &[2, 3],
        &[1., 3., 4., 2., 5., 6.],
    );
    assert_close(
        &fwd(&concat(-1), &[&q, &p, &t(&[2, 0], &[])]),
        &[2, 3],
        &[3., 4., 1., 5., 6., 2.],
    );
    assert_close(&fwd(&concat(0), &[&q]), &[2, 2], &[3., 4., 5., 6.]);
    assert_close(
        &fwd(&concat(0), &[&q, &t(&[1, 2], &[7., 8.])]),
        &[3, 2],
        &[3., 4., 5., 6., 7., 8.],
    );

    let r: Vec<f64> = (0..10).map(f64::from).collect();
    let v = t(&[10], &r);
    assert_close(&fwd(&slice(0, -3, 100, 1), &[&v]), &[3], &[7., 8., 9.]);
    assert_close(&fwd(&slice(0, 1, -1, 3), &[&v]), &[3], &[1., 4., 7.]);
    assert_close(
        &fwd(&slice(0, -100, 100, 2), &[&v]),
        &[5],
        &[0., 2., 4., 6., 8.],
    );
    assert_close(&fwd(&slice(-1, 5, 2, 1), &[&v]), &[0], &[]);
    assert_close(&fwd(&slice(0, 10, 20, 1), &[&v]), &[0], &[]);
    assert_close(&fwd(&slice(0, 3, 4, usize::MAX), &[&v]), &[1], &[3.]);
    assert_close(
        &fwd(&slice(0, isize::MIN, isize::MAX, usize::MAX), &[&v]),
        &[1],
        &[0.],
    );
    assert_close(&fwd(&slice(0, 9, 10, 4), &[&v]), &[1], &[9.]);
    let m = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    assert_close(&fwd(&slice(1, 1, 3, 1), &[&m]), &[2, 2], &[2., 3., 5., 6.]);
    assert_close(&fwd(&slice(-1, 0, 3, 2), &[&m]), &[2, 2], &[1., 3., 4., 6.]);
    assert_close(&fwd(&slice(0, -1, 2, 1), &[&m]), &[1, 3], &[4., 5., 6.]);
}

#[test]
fn forward_in_f32() {
    let x = Tensor::<f32>::from_f64(&[2, 2], &[1., 2., 3., 4.]).unwrap();
    let y = Op::Reduce(ReduceOp::Sum(Sum {
        axes: Some(vec![0]),
        keepdim: false,
    }))
    .forward(&[&x])
    .unwrap()
    .value;
    assert_eq!(y.data(), &[4.0f32, 6.0]);
    let z = Op::Linalg(LinalgOp::Matmul(Matmul))
        .forward(&[&x, &x])
        .unwrap()
        .value;
    assert_eq!(z.data(), &[7.0f32, 10.0, 15.0, 22.0]);
}

// ---------------------------------------------------------------------------------------------
// Derivatives: finite differences and adjointness

#[test]
fn reductions_gradcheck() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
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
    for axes in &axes_variants {
        for keepdim in [false, true] {
            for make in [sum, mean, amax] {
                let op = make(axes.clone(), keepdim);
                gradcheck(&op, &[&[2, 3, 4]], &mut rng);
            }
        }
    }
    for make in [sum, mean, amax] {
        for keepdim in [false, true] {
            gradcheck(&make(Some(vec![-1]), keepdim), &[&[5]], &mut rng);
            gradcheck(&make(Some(vec![0]), keepdim), &[&[]], &mut rng);
            gradcheck(&make(None, keepdim), &[&[]], &mut rng);
            gradcheck(&make(Some(vec![1]), keepdim), &[&[3, 1, 2]], &mut rng);
        }
    }
}

#[test]
fn softmax_gradcheck() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for axis in [0, 1, 2, -1, -2, -3] {
        gradcheck(&softmax(axis), &[&[2, 3, 4]], &mut rng);
        gradcheck(&log_softmax(axis), &[&[2, 3, 4]], &mut rng);
    }
    for op in [softmax(0), log_softmax(-1)] {
        gradcheck(&op, &[&[5]], &mut rng);
        gradcheck(&op, &[&[]], &mut rng);
        gradcheck(&op, &[&[1]], &mut rng);
    }
}

#[test]
fn matmul_gradcheck() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let cases: &[(&[usize], &[usize])] = &[
        (&[3], &[3]),
        (&[3], &[3, 4]),
        (&[2, 3], &[3]),
        (&[2, 3], &[3, 4]),
        (&[4, 2, 3], &[3, 5]),
        (&[4, 2, 3], &[3]),
        (&[2, 3], &[4, 3, 5]),
        (&[3], &[2, 3, 4]),
        (&[2, 1, 2, 3], &[5, 3, 4]),
        (&[1, 2, 3], &[4, 3, 2]),
        (&[4, 2, 3], &[4, 3, 2]),
        (&[2, 1, 2, 3], &[3, 2]),
    ];
    for (a, b) in cases {
        gradcheck(&matmul(), &[a, b], &mut rng);
    }
}

#[test]
fn linear_gradcheck() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    for x in [&[5usize, 3][..], &[2, 5, 3], &[3], &[2, 2, 2, 3]] {
        gradcheck(&linear(false), &[x, &[4, 3]], &mut rng);
        gradcheck(&linear(true), &[x, &[4, 3], &[4]], &mut rng);
    }
}

#[test]
fn reorder_gradcheck() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for (d0, d1) in [(0, 1), (1, 2), (-1, 0), (2, 2), (-3, -1)] {
        gradcheck(&transpose(d0, d1), &[&[2, 3, 4]], &mut rng);
    }
    gradcheck(&transpose(0, -1), &[&[]], &mut rng);
    for dims in [&[0isize, 1, 2][..], &[2, 0, 1], &[-1, -3, -2], &[1, 2, 0]] {
        gradcheck(&permute(dims), &[&[2, 3, 4]], &mut rng);
    }
    gradcheck(&permute(&[]), &[&[]], &mut rng);
}

#[test]
fn structure_gradcheck() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    for shape in [&[4isize, -1][..], &[24], &[2, -1, 2], &[-1], &[1, 2, 3, 4]] {
        gradcheck(&reshape(shape), &[&[2, 3, 4]], &mut rng);
    }
    for (s, e) in [(0, -1), (1, 2), (-2, -1), (0, 0), (0, 1)] {
        gradcheck(&flatten(s, e), &[&[2, 3, 4]], &mut rng);
    }
    gradcheck(&flatten(0, -1), &[&[]], &mut rng);
    for (from, to) in [
        (&[3usize, 1][..], &[2usize, 3, 4][..]),
        (&[], &[2, 2]),
        (&[1], &[3]),
        (&[2, 1, 4], &[3, 2, 5, 4]),
        (&[2, 3], &[2, 3]),
    ] {
        gradcheck(&broadcast_to(to), &[from], &mut rng);
    }
    gradcheck(&concat(0), &[&[2, 3]], &mut rng);
    gradcheck(&concat(0), &[&[2, 3], &[1, 3], &[4, 3]], &mut rng);
    gradcheck(&concat(1), &[&[2, 3], &[2, 1]], &mut rng);
    gradcheck(&concat(-1), &[&[2, 3, 1], &[2, 3, 2], &[2, 3, 0]], &mut rng);
    gradcheck(&concat(-2), &[&[2, 1, 2], &[2, 3, 2]], &mut rng);
    for (axis, start, end, step) in [
        (0, 0, 10, 1),
        (0, 1, -1, 2),
        (0, -3, 100, 1),
        (0, -100, 100, 3),
        (0, 5, 2, 1),
        (0, 2, 3, usize::MAX),
    ] {
        gradcheck(&slice(axis, start, end, step), &[&[10]], &mut rng);
    }
    for (axis, start, end, step) in [(1, 1, 4, 2), (-1, 0, 3, 1), (0, -1, 2, 1), (2, 0, -1, 2)] {
        gradcheck(&slice(axis, start, end, step), &[&[2, 5, 3]], &mut rng);
    }
}

// ---------------------------------------------------------------------------------------------
// amax ties

#[test]
fn amax_ties_share_the_gradient() {
    let x = t(&[3], &[1., 3., 3.]);
    let op = amax(None, false);
    let g = op_vjp(&op, &[&x], &Tensor::scalar(1.0)).unwrap();
    assert_close(&g[0], &[3], &[0., 0.5, 0.5]);
    // JVP at a tie: the mean of the tied tangents.
    let fwd_out = op.forward(&[&x]).unwrap();
    let dx = t(&[3], &[10., 2., 4.]);
    let jvp = op.jvp(&[&x], &fwd_out, &[&dx]).unwrap();
    assert_close(&jvp, &[], &[3.]);
    // Adjointness still holds at the tie.
    assert_eq!(
        jvp.data()[0],
        g[0].data()
            .iter()
            .zip(dx.data())
            .map(|(g, t)| g * t)
            .sum::<f64>()
    );

    // Per-slice ties along one axis, with keepdim.
    let y = t(&[2, 3], &[2., 2., 2., 5., 1., 5.]);
    let op = amax(Some(vec![1]), true);
    let seed = t(&[2, 1], &[3., 4.]);
    let g = op_vjp(&op, &[&y], &seed).unwrap();
    assert_close(&g[0], &[2, 3], &[1., 1., 1., 2., 0., 2.]);
    let fwd_out = op.forward(&[&y]).unwrap();
    let dy = t(&[2, 3], &[1., 2., 6., 7., 100., 1.]);
    assert_close(
        &op.jvp(&[&y], &fwd_out, &[&dy]).unwrap(),
        &[2, 1],
        &[3., 4.],
    );

    // A NaN maximum takes the gradient (the NaN elements tie among themselves).
    let n = t(&[3], &[1., f64::NAN, 2.]);
    let g = op_vjp(&amax(Some(vec![0]), false), &[&n], &Tensor::scalar(1.0)).unwrap();
    assert_close(&g[0], &[3], &[0., 1., 0.]);
}

// ---------------------------------------------------------------------------------------------
// VJP details

#[test]
fn vjp_values() {
    // sum/mean VJP broadcast the cotangent back; mean divides by the count.
    let x = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let g = op_vjp(&mean(Some(vec![1]), false), &[&x], &t(&[2], &[3., 6.])).unwrap();
    assert_close(&g[0], &[2, 3], &[1., 1., 1., 2., 2., 2.]);
    let g = op_vjp(&sum(Some(vec![0]), true), &[&x], &t(&[1, 3], &[1., 2., 3.])).unwrap();
    assert_close(&g[0], &[2, 3], &[1., 2., 3., 1., 2., 3.]);
    // Slice scatters into zeros.
    let v = t(&[5], &[0.; 5]);
    let g = op_vjp(&slice(0, 1, 5, 2), &[&v], &t(&[2], &[7., 8.])).unwrap();
    assert_close(&g[0], &[5], &[0., 7., 0., 8., 0.]);
    // Concat splits the cotangent.
    let (p, q) = (t(&[1], &[0.]), t(&[2], &[0., 0.]));
    let g = op_vjp(&concat(0), &[&p, &q], &t(&[3], &[1., 2., 3.])).unwrap();
    assert_close(&g[0], &[1], &[1.]);
    assert_close(&g[1], &[2], &[2., 3.]);
    // broadcast_to sums back.
    let g = op_vjp(
        &broadcast_to(&[2, 2]),
        &[&t(&[2], &[0., 0.])],
        &t(&[2, 2], &[1., 2., 3., 4.]),
    )
    .unwrap();
    assert_close(&g[0], &[2], &[4., 6.]);
    // Linear: db sums g over the leading dimensions, dw = g^T x.
    let x = t(&[2, 1, 2], &[1., 2., 3., 4.]);
    let w = t(&[1, 2], &[1., 1.]);
    let b = t(&[1], &[0.]);
    let g = op_vjp(&linear(true), &[&x, &w, &b], &t(&[2, 1, 1], &[1., 2.])).unwrap();
    assert_close(&g[0], &[2, 1, 2], &[1., 1., 2., 2.]);
    assert_close(&g[1], &[1, 2], &[7., 10.]);
    assert_close(&g[2], &[1], &[3.]);
}

fn all_ops_with_inputs(rng: &mut ChaCha8Rng) -> Vec<(Op, Vec<Tensor<f64>>)> {
    let mut cases: Vec<(Op, Vec<&[usize]>)> = vec![];
    for keepdim in [false, true] {
        for axes in [None, Some(vec![]), Some(vec![1]), Some(vec![-1, 0])] {
            cases.push((sum(axes.clone(), keepdim), vec![&[2, 3]]));
            cases.push((mean(axes.clone(), keepdim), vec![&[2, 3]]));
            cases.push((amax(axes, keepdim), vec![&[2, 3]]));
        }
    }
    cases.extend([
        (softmax(1), vec![&[2, 3][..]]),
        (log_softmax(0), vec![&[2, 3]]),
        (softmax(0), vec![&[]]),
        (matmul(), vec![&[2, 3], &[3, 4]]),
        (matmul(), vec![&[3], &[2, 3, 4]]),
        (matmul(), vec![&[2, 2, 3], &[3]]),
        (matmul(), vec![&[2, 1, 2, 3], &[5, 3, 4]]),
        (linear(true), vec![&[2, 5, 3], &[4, 3], &[4]]),
        (linear(false), vec![&[3], &[4, 3]]),
        (transpose(0, -1), vec![&[2, 3, 4]]),
        (permute(&[2, 0, 1]), vec![&[2, 3, 4]]),
        (reshape(&[-1, 2]), vec![&[2, 3, 4]]),
        (flatten(1, -1), vec![&[2, 3, 4]]),
        (broadcast_to(&[3, 2, 4]), vec![&[2, 1]]),
        (concat(1), vec![&[2, 3], &[2, 1], &[2, 0]]),
        (slice(1, -2, 100, 1), vec![&[2, 3, 4]]),
        (slice(2, 0, 4, 3), vec![&[2, 3, 4]]),
    ]);
    let mut out: Vec<(Op, Vec<Tensor<f64>>)> = cases
        .into_iter()
        .map(|(op, dims)| {
            let xs = dims.iter().map(|d| random(rng, d)).collect();
            (op, xs)
        })
        .collect();
    // amax with ties, softmax of huge logits.
    out.push((
        amax(Some(vec![1]), false),
        vec![t(&[2, 3], &[1., 3., 3., 2., 2., 2.])],
    ));
    out.push((softmax(-1), vec![t(&[3], &[1000., -1000., 0.])]));
    out.push((log_softmax(-1), vec![t(&[3], &[1000., -1000., 0.])]));
    out
}

#[test]
fn zero_cotangent_gives_exact_zeros() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for (op, xs) in all_ops_with_inputs(&mut rng) {
        let refs: Vec<&Tensor<f64>> = xs.iter().collect();
        assert_zero_preserving(&op, &refs);
    }
}

#[test]
fn vjp_respects_needs() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    for (op, xs) in all_ops_with_inputs(&mut rng) {
        let refs: Vec<&Tensor<f64>> = xs.iter().collect();
        let n = xs.len();
        let full = vjp_with_needs(&op, &refs, vec![true; n]);
        for skip in 0..n {
            let needs: Vec<bool> = (0..n).map(|i| i != skip).collect();
            let grads = vjp_with_needs(&op, &refs, needs.clone());
            for (i, g) in grads.iter().enumerate() {
                if needs[i] {
                    assert_eq!(
                        g, &full[i],
                        "{op}: argument {i} changed when {skip} was skipped"
                    );
                } else {
                    assert!(g.is_none(), "{op}: argument {i} needs no gradient");
                }
            }
        }
    }
}

#[test]
fn saves_are_minimal() {
    let nothing = [
        sum(None, false),
        mean(Some(vec![0]), true),
        transpose(0, 1),
        permute(&[1, 0]),
        reshape(&[-1]),
        flatten(0, -1),
        broadcast_to(&[2]),
        concat(0),
        slice(0, 0, 1, 1),
    ];
    for op in nothing {
        assert_eq!(op.saves(), Saves::NOTHING, "{op}");
    }
    assert_eq!(softmax(0).saves(), Saves::OUTPUT);
    assert_eq!(log_softmax(0).saves(), Saves::OUTPUT);
    assert_eq!(amax(None, false).saves(), Saves::inputs(&[0]).with_output());
    assert_eq!(matmul().saves(), Saves::inputs(&[0, 1]));
    assert_eq!(linear(true).saves(), Saves::inputs(&[0, 1]));
    assert_eq!(linear(false).saves(), Saves::inputs(&[0, 1]));
}

#[test]
fn display_shows_attributes() {
    assert_eq!(
        sum(None, false).to_string(),
        "sum(axes=None, keepdim=false)"
    );
    assert_eq!(
        mean(Some(vec![0, -1]), true).to_string(),
        "mean(axes=[0, -1], keepdim=true)"
    );
    assert_eq!(
        amax(Some(vec![]), false).to_string(),
        "amax(axes=[], keepdim=false)"
    );
    assert_eq!(softmax(-1).to_string(), "softmax(axis=-1)");
    assert_eq!(log_softmax(0).to_string(), "log_softmax(axis=0)");
    assert_eq!(matmul().to_string(), "matmul");
    assert_eq!(linear(true).to_string(), "linear(bias=true)");
    assert_eq!(transpose(0, -1).to_string(), "transpose(dim0=0, dim1=-1)");
    assert_eq!(permute(&[1, 0]).to_string(), "permute(dims=[1, 0])");
    assert_eq!(reshape(&[2, -1]).to_string(), "reshape(shape=[2, -1])");
    assert_eq!(
        flatten(1, -1).to_string(),
        "flatten(start_dim=1, end_dim=-1)"
    );
    assert_eq!(
        broadcast_to(&[2, 3]).to_string(),
        "broadcast_to(shape=[2, 3])"
    );
    assert_eq!(concat(1).to_string(), "concat(axis=1)");
    assert_eq!(
        slice(0, -1, 5, 2).to_string(),
        "slice(axis=0, start=-1, end=5, step=2)"
    );
}

// ---------------------------------------------------------------------------------------------
// Errors: never panic, always name the op and the shapes

fn shape_str(dims: &[usize]) -> String {
    Shape::new(dims).unwrap().to_string()
}

fn assert_rejects(op: &Op, dims: &[&[usize]]) {
    let xs: Vec<Tensor<f64>> = dims
        .iter()
        .map(|d| Tensor::zeros(&Shape::new(*d).unwrap()))
        .collect();
    let refs: Vec<&Tensor<f64>> = xs.iter().collect();
    let shapes: Vec<&Shape> = xs.iter().map(|x| x.shape()).collect();
    let by_shape = op.output_shape(&shapes);
    let by_forward = op.forward(&refs);
    let err = match (by_shape, by_forward) {
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "{op}: output_shape and forward disagree");
            a
        }
        (s, f) => panic!("{op} accepted {dims:?}: {s:?}, {:?}", f.map(|f| f.value)),
    };
    let msg = err.to_string();
    assert!(
        msg.starts_with(op.name()),
        "{op}: message {msg:?} does not name the op"
    );
    for d in dims.iter().take(2) {
        assert!(
            msg.contains(&shape_str(d)),
            "{op}: message {msg:?} does not name shape {}",
            shape_str(d)
        );
    }
}

#[test]
fn hostile_inputs_are_errors() {
    let reduce_axes: Vec<Option<Vec<isize>>> = vec![
        Some(vec![2]),
        Some(vec![-3]),
        Some(vec![0, 0]),
        Some(vec![1, -1]),
        Some(vec![isize::MAX]),
        Some(vec![isize::MIN]),
    ];
    for axes in &reduce_axes {
        for keepdim in [false, true] {
            for make in [sum, mean, amax] {
                assert_rejects(&make(axes.clone(), keepdim), &[&[2, 3]]);
            }
        }
    }
    for make in [sum, mean, amax] {
        assert_rejects(&make(Some(vec![1]), false), &[&[]]);
        assert_rejects(&make(Some(vec![-2]), false), &[&[]]);
        assert_rejects(&make(Some(vec![0, -1]), false), &[&[]]);
    }
    // amax over an empty axis.
    assert_rejects(&amax(None, false), &[&[0]]);
    assert_rejects(&amax(Some(vec![0]), true), &[&[0, 3]]);
    assert_rejects(&amax(Some(vec![-1]), false), &[&[2, 0]]);
    for axis in [2, -3, isize::MAX, isize::MIN] {
        assert_rejects(&softmax(axis), &[&[2, 3]]);
        assert_rejects(&log_softmax(axis), &[&[2, 3]]);
    }
    assert_rejects(&softmax(1), &[&[]]);
    assert_rejects(&log_softmax(-2), &[&[]]);

    let matmul_bad: &[(&[usize], &[usize])] = &[
        (&[], &[3]),
        (&[3], &[]),
        (&[], &[]),
        (&[3], &[4]),
        (&[2, 3], &[2, 3]),
        (&[3], &[2, 4, 5]),
        (&[2, 2, 3], &[3, 3, 4]),
        (&[2, 3, 2, 3], &[4, 3, 4]),
        (&[0, 3], &[2, 5]),
    ];
    for (a, b) in matmul_bad {
        assert_rejects(&matmul(), &[a, b]);
    }
    let linear_bad: &[(&[usize], &[usize])] = &[
        (&[], &[4, 3]),
        (&[2, 3], &[3, 4]),
        (&[2, 3], &[3]),
        (&[2, 3], &[2, 4, 3]),
        (&[2, 3], &[]),
    ];
    for (x, w) in linear_bad {
        assert_rejects(&linear(false), &[x, w]);
        assert_rejects(&linear(true), &[x, w, &[w.first().copied().unwrap_or(1)]]);
    }
    for b in [&[3usize][..], &[], &[4, 1], &[1, 4]] {
        assert_rejects(&linear(true), &[&[2, 3], &[4, 3], b]);
    }

    for (d0, d1) in [(2, 0), (0, -3), (isize::MIN, 0), (0, isize::MAX)] {
        assert_rejects(&transpose(d0, d1), &[&[2, 3]]);
    }
    assert_rejects(&transpose(1, 0), &[&[]]);
    for dims in [
        &[0isize][..],
        &[0, 0],
        &[0, 2],
        &[0, 1, 2],
        &[-3, 0],
        &[isize::MIN, 0],
    ] {
        assert_rejects(&permute(dims), &[&[2, 3]]);
    }
    assert_rejects(&permute(&[0]), &[&[]]);

    for shape in [
        &[-1isize, -1][..],
        &[5],
        &[-2, 3],
        &[4, -1],
        &[isize::MIN],
        &[isize::MAX, isize::MAX],
        &[isize::MAX, 4],
        &[],
    ] {
        assert_rejects(&reshape(shape), &[&[2, 3]]);
    }
    assert_rejects(&reshape(&[0, -1]), &[&[0, 3]]);
    for (s, e) in [(1, 0), (3, 3), (0, 3), (-4, 0), (isize::MIN, 0), (-1, 0)] {
        assert_rejects(&flatten(s, e), &[&[2, 3, 4]]);
    }
    assert_rejects(&flatten(1, 1), &[&[]]);
    for shape in [
        &[3usize][..],
        &[2],
        &[2, 3, 2],
        &[0, 3],
        &[usize::MAX, 2, 3],
    ] {
        assert_rejects(&broadcast_to(shape), &[&[2, 3]]);
    }
    assert_rejects(&broadcast_to(&[]), &[&[2]]);

    assert_rejects(&concat(0), &[&[], &[]]);
    assert_rejects(&concat(2), &[&[2, 3], &[2, 3]]);
    assert_rejects(&concat(isize::MIN), &[&[2, 3], &[2, 3]]);
    assert_rejects(&concat(0), &[&[2, 3], &[2, 4]]);
    assert_rejects(&concat(1), &[&[2, 3], &[3, 3]]);
    assert_rejects(&concat(0), &[&[2, 3], &[2, 3, 1]]);
    assert_rejects(&concat(0), &[&[2, 3], &[3]]);

    assert_rejects(&slice(0, 0, 1, 0), &[&[4]]);
    assert_rejects(&slice(0, 0, 1, 1), &[&[]]);
    assert_rejects(&slice(1, 0, 1, 1), &[&[4]]);
    assert_rejects(&slice(-2, 0, 1, 1), &[&[4]]);
    assert_rejects(&slice(isize::MIN, 0, 1, 1), &[&[4]]);
}

#[test]
fn zero_size_inputs_run_everywhere() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let cases: Vec<(Op, Vec<&[usize]>)> = vec![
        (sum(Some(vec![0]), false), vec![&[0, 3]]),
        (sum(None, true), vec![&[2, 0]]),
        (mean(Some(vec![1]), false), vec![&[2, 0]]),
        (mean(Some(vec![0]), true), vec![&[2, 0]]),
        (amax(Some(vec![0]), false), vec![&[2, 0]]),
        (softmax(1), vec![&[2, 0]]),
        (log_softmax(0), vec![&[0, 3]]),
        (matmul(), vec![&[2, 0], &[0, 3]]),
        (matmul(), vec![&[0, 2, 3], &[3, 4]]),
        (matmul(), vec![&[0], &[0]]),
        (matmul(), vec![&[2, 3], &[3, 0]]),
        (linear(true), vec![&[0, 3], &[4, 3], &[4]]),
        (linear(true), vec![&[2, 0], &[4, 0], &[4]]),
        (linear(false), vec![&[2, 3], &[0, 3]]),
        (transpose(0, 1), vec![&[0, 3]]),
        (permute(&[1, 0]), vec![&[3, 0]]),
        (reshape(&[3, 0, 2]), vec![&[0, 3, 2]]),
        (reshape(&[-1]), vec![&[3, 0]]),
        (flatten(0, 1), vec![&[0, 3]]),
        (broadcast_to(&[0, 3]), vec![&[1, 3]]),
        (concat(0), vec![&[0, 3], &[0, 3]]),
        (slice(0, 0, 0, 1), vec![&[0, 3]]),
        (slice(1, 1, 2, 1), vec![&[0, 3]]),
    ];
    for (op, dims) in cases {
        let xs: Vec<Tensor<f64>> = dims.iter().map(|d| random(&mut rng, d)).collect();
        gradcheck_at(&op, &xs, &mut rng);
        let refs: Vec<&Tensor<f64>> = xs.iter().collect();
        assert_zero_preserving(&op, &refs);
    }
    // Gradients through an empty contraction are zeros of the right shapes.
    let (a, b) = (t(&[2, 0], &[]), t(&[0, 3], &[]));
    let g = op_vjp(
        &matmul(),
        &[&a, &b],
        &Tensor::ones(&Shape::new([2, 3]).unwrap()),
    )
    .unwrap();
    assert_eq!(g[0].dims(), &[2, 0]);
    assert_eq!(g[1].dims(), &[0, 3]);
    let (x, w, bias) = (
        t(&[0, 3], &[]),
        random(&mut rng, &[4, 3]),
        t(&[4], &[0.; 4]),
    );
    let g = op_vjp(&linear(true), &[&x, &w, &bias], &t(&[0, 4], &[])).unwrap();
    assert_close(&g[1], &[4, 3], &[0.; 12]);
    assert_close(&g[2], &[4], &[0.; 4]);
}
