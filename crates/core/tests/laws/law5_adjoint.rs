//! Law 5 (adjointness): `<jvp(x, dx), s> = <dx, backprop(x, s)>` summed over the whole context,
//! for random tangents `dx` and full seeds `s`, to a relative tolerance scaled by the sizes; exact
//! for ops that are exact on small integers. On f64 and f32 over random graphs.

use crate::graph_support::{inputs, random_like, random_program, random_seed};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tapegrad_core::graph::Graph;
use tapegrad_core::ops::elementwise::{Add, Mul, Neg, Scale, Sub};
use tapegrad_core::ops::{ElementwiseOp, Op};
use tapegrad_core::{Scalar, Shape, Tensor};

/// `sum a*b` and `sum |a*b|` in f64.
fn dot<S: Scalar>(a: &Tensor<S>, b: &Tensor<S>) -> (f64, f64) {
    a.data()
        .iter()
        .zip(b.data())
        .fold((0.0, 0.0), |(s, m), (&x, &y)| {
            let p = x.to_f64() * y.to_f64();
            (s + p, m + p.abs())
        })
}

/// Both sides of the identity and the sum of the magnitudes of their terms.
fn sides<S: Scalar>(
    g: &Graph,
    x: &[Tensor<S>],
    dx: &[Tensor<S>],
    s: Vec<Tensor<S>>,
) -> (f64, f64, f64) {
    let tangents = g.jvp(x, dx).unwrap();
    let grads = g.backprop(x, s.clone()).unwrap();
    let (mut lhs, mut rhs, mut scale) = (0.0, 0.0, 0.0);
    for (t, si) in tangents.iter().zip(&s) {
        let (v, m) = dot(t, si);
        lhs += v;
        scale += m;
    }
    for (d, gi) in dx.iter().zip(&grads) {
        let (v, m) = dot(d, gi);
        rhs += v;
        scale += m;
    }
    (lhs, rhs, scale)
}

fn check<S: Scalar>(case: u64, unit_roundoff: f64) {
    let p = random_program(case, 1 + (case % 10) as usize);
    let g = p.to_graph().unwrap();
    let x = inputs::<S>(&p);
    let mut rng = ChaCha8Rng::seed_from_u64(case ^ 0x5);
    let dx: Vec<Tensor<S>> = g
        .inputs()
        .iter()
        .map(|i| random_like(&mut rng, &i.shape))
        .collect();
    let s = random_seed::<S>(&mut rng, &g.shapes());
    let (lhs, rhs, scale) = sides(&g, &x, &dx, s);
    // Each side is a sum of terms computed through at most `nodes` rounded steps.
    let elements: usize = g.shapes().iter().map(|s| s.numel()).sum();
    let tol = unit_roundoff * 64.0 * (g.nodes().len() + elements) as f64 * scale;
    assert!(
        (lhs - rhs).abs() <= tol,
        "case {case}: <jvp, s> = {lhs}, <dx, vjp> = {rhs}, tolerance {tol}, graph\n{g}"
    );
}

#[test]
fn law5_holds_on_random_graphs_f64() {
    for case in 0..256 {
        check::<f64>(case, f64::EPSILON / 2.0);
    }
}

#[test]
fn law5_holds_on_random_graphs_f32() {
    for case in 4000..4256 {
        check::<f32>(case, f32::EPSILON as f64 / 2.0);
    }
}

/// Ops that are exact on small integers make the identity exact.
#[test]
fn adjointness_is_exact_on_small_integers() {
    use ElementwiseOp as E;
    let mut g = Graph::new();
    let x = g.input("x", Shape::new([2, 3]).unwrap(), true).unwrap();
    let y = g.input("y", Shape::new([3]).unwrap(), true).unwrap();
    let a = g.node("a", Op::Elementwise(E::Mul(Mul)), &[x, y]).unwrap();
    let b = g.node("b", Op::Elementwise(E::Add(Add)), &[a, x]).unwrap();
    let c = g.node("c", Op::Elementwise(E::Sub(Sub)), &[b, y]).unwrap();
    let d = g
        .node("d", Op::Elementwise(E::Scale(Scale { factor: 2.0 })), &[c])
        .unwrap();
    g.node("e", Op::Elementwise(E::Neg(Neg)), &[d]).unwrap();
    let int = |dims: &[usize], v: &[i32]| {
        Tensor::<f64>::new(dims, v.iter().map(|&i| i as f64).collect()).unwrap()
    };
    let xs = [int(&[2, 3], &[1, -2, 3, 0, 4, -1]), int(&[3], &[2, -3, 1])];
    let dx = [int(&[2, 3], &[1, 1, -1, 2, 0, 3]), int(&[3], &[-2, 1, 4])];
    let s: Vec<Tensor<f64>> = g
        .shapes()
        .iter()
        .enumerate()
        .map(|(i, sh)| {
            let v: Vec<f64> = (0..sh.numel())
                .map(|j| ((i * 7 + j * 3) % 5) as f64 - 2.0)
                .collect();
            Tensor::from_shape((*sh).clone(), v).unwrap()
        })
        .collect();
    let (lhs, rhs, _) = sides(&g, &xs, &dx, s);
    assert_eq!(lhs, rhs);
    assert_ne!(lhs, 0.0, "a trivially zero identity would test nothing");
}
