//! Shared checks for the nn-op tests: random tensors, and `laws`, which runs on one op at one point
//! the finite-difference and adjoint checks (laws 5 and 6), zero preservation of the VJP, the
//! `needs` contract, f32/f64 agreement of the forward pass and the op's `Display`; and the class
//! labels with PyTorch's options that the loss tests draw.

#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tapegrad_core::laws::{check_op, op_vjp, Tolerance};
use tapegrad_core::ops::Saved;
use tapegrad_core::{Op, Scalar, Tensor};

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// `count` class labels among `c` classes, with PyTorch's options now and then: positive class
/// weights, and an `ignore_index` in range (only with a second class left), beyond it or
/// negative (PyTorch's default -100, padding), which then marks about 40% of the labels but
/// never the first, so one stays counted and the mean is a number where the laws apply.
pub fn labels_with_options(
    r: &mut ChaCha8Rng,
    c: usize,
    count: usize,
) -> (Vec<i64>, Option<Vec<f64>>, Option<i64>) {
    let classes = i64::try_from(c).unwrap();
    let mut targets: Vec<i64> = (0..count).map(|_| r.random_range(0..classes)).collect();
    let weight = r
        .random_bool(0.6)
        .then(|| (0..c).map(|_| r.random_range(0.25..2.0)).collect());
    let ignore_index = match r.random_range(0..4) {
        0 => None,
        1 if c >= 2 => Some(r.random_range(0..classes)),
        1 => None,
        2 => Some(-100),
        _ => Some(classes + r.random_range(0..3)),
    };
    if let Some(i) = ignore_index {
        for t in targets.iter_mut().skip(1) {
            if r.random_bool(0.4) {
                *t = i;
            }
        }
        if targets[0] == i {
            targets[0] = (i + 1) % classes;
        }
    }
    (targets, weight, ignore_index)
}

pub fn t(dims: &[usize], data: &[f64]) -> Tensor<f64> {
    Tensor::from_f64(dims, data).unwrap()
}

/// Uniform in `[lo, hi)`.
pub fn uniform(rng: &mut ChaCha8Rng, dims: &[usize], lo: f64, hi: f64) -> Tensor<f64> {
    let n: usize = dims.iter().product();
    Tensor::new(dims, (0..n).map(|_| rng.random_range(lo..hi)).collect()).unwrap()
}

/// Uniform in `[-1, 1)`.
pub fn random(rng: &mut ChaCha8Rng, dims: &[usize]) -> Tensor<f64> {
    uniform(rng, dims, -1.0, 1.0)
}

pub fn fwd(op: &Op, xs: &[&Tensor<f64>]) -> Tensor<f64> {
    op.forward(xs)
        .unwrap_or_else(|e| panic!("{op}: forward failed: {e}"))
        .value
}

/// The VJP with only the arguments flagged in `needs` asked for (in f64 or f32).
pub fn vjp_with_needs<S: Scalar>(
    op: &Op,
    xs: &[&Tensor<S>],
    seed: &Tensor<S>,
    needs: Vec<bool>,
) -> Vec<Option<Tensor<S>>> {
    let fwd = op.forward(xs).unwrap();
    let saved = Saved::keep(op.saves(), xs, &fwd, needs);
    op.vjp(&saved.context(), seed)
        .unwrap_or_else(|e| panic!("{op}: vjp failed: {e}"))
        .into_vec()
}

/// Runs every per-op law at `inputs` with a random seed and random tangents.
pub fn laws(op: &Op, inputs: &[Tensor<f64>], rng: &mut ChaCha8Rng) {
    let refs: Vec<&Tensor<f64>> = inputs.iter().collect();
    let out = fwd(op, &refs);
    let seed = random(rng, out.dims());
    let tangents: Vec<Tensor<f64>> = inputs.iter().map(|x| random(rng, x.dims())).collect();
    let report = check_op(op, inputs, &seed, &tangents, 1e-6, Tolerance::default())
        .unwrap_or_else(|e| panic!("{op}: check failed to run: {e}"));
    assert!(report.passed, "{op}: {report:?}");

    // Zero-preserving: a zero cotangent gives exact zeros (saved values here are finite).
    let zero = Tensor::zeros(out.shape());
    for (i, g) in op_vjp(op, &refs, &zero).unwrap().iter().enumerate() {
        assert!(
            g.is_all_zero(),
            "{op}: zero cotangent gave {g:?} for argument {i}"
        );
    }

    // The needs contract: asking for one argument gives exactly that argument's full gradient.
    let full = op_vjp(op, &refs, &seed).unwrap();
    for i in 0..inputs.len() {
        let needs: Vec<bool> = (0..inputs.len()).map(|j| j == i).collect();
        let part = vjp_with_needs(op, &refs, &seed, needs);
        for (j, g) in part.iter().enumerate() {
            match g {
                // An unasked-for gradient is allowed, but it must still be right.
                Some(g) => assert_eq!(g, &full[j], "{op}: argument {j} when asking for {i}"),
                None => assert!(j != i, "{op}: missing gradient for argument {i}"),
            }
        }
    }

    // The same op in f32 agrees with f64 to f32 precision.
    let in32: Vec<Tensor<f32>> = inputs.iter().map(|x| x.cast()).collect();
    let refs32: Vec<&Tensor<f32>> = in32.iter().collect();
    let out32 = op.forward(&refs32).unwrap().value;
    for (a, b) in out32.data().iter().zip(out.data()) {
        assert!(
            (f64::from(*a) - b).abs() <= 1e-4 * (1.0 + b.abs()),
            "{op}: f32 {a} vs f64 {b}"
        );
    }

    assert!(op.to_string().starts_with(op.name()), "{op}");
}

/// A call PyTorch rejects (`why`, its message or reason) must be an error here that names the op.
pub fn rejects_like_pytorch(op: &Op, xs: &[&Tensor<f64>], why: &str) {
    let shapes: Vec<&[usize]> = xs.iter().map(|x| x.dims()).collect();
    match op.forward(xs) {
        Ok(_) => panic!("{op} on {shapes:?}: PyTorch rejects it ({why}), tapegrad does not"),
        Err(err) => assert!(err.to_string().contains(op.name()), "{op}: {err}"),
    }
}
