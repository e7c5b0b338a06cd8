//! The sweep hands a cotangent it no longer needs to the linear elementwise VJPs (add, sub, neg,
//! scale), which reuse its buffer. Pinned down with readable values: broadcast arguments get the
//! cotangent summed down, a cotangent shared by two arguments is copied before it is negated,
//! and the seed the caller passed is never written.

use tapegrad_core::ops::elementwise::{Add, Neg, Scale, Sub};
use tapegrad_core::ops::ElementwiseOp as E;
use tapegrad_core::{Op, Tape, Tensor};

fn t(dims: &[usize], data: &[f64]) -> Tensor<f64> {
    Tensor::from_f64(dims, data).unwrap()
}

#[test]
fn linear_vjps_on_owned_cotangents_match_the_executed_sweep() {
    let mut tape = Tape::<f64>::new();
    let a = tape.leaf(t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]), true);
    let b = tape.leaf(t(&[2], &[10.0, 20.0]), true);
    // d = a - b (b broadcast), e = a + d (both arguments need the cotangent),
    // f = -(e) * 3, g = f - f (one cotangent feeds both sides of a sub).
    let d = tape.apply(Op::Elementwise(E::Sub(Sub)), &[a, b]).unwrap();
    let e = tape.apply(Op::Elementwise(E::Add(Add)), &[a, d]).unwrap();
    let n = tape.apply(Op::Elementwise(E::Neg(Neg)), &[e]).unwrap();
    let f = tape
        .apply(Op::Elementwise(E::Scale(Scale { factor: 3.0 })), &[n])
        .unwrap();
    let g = tape.apply(Op::Elementwise(E::Sub(Sub)), &[f, f]).unwrap();
    let h = tape.apply(Op::Elementwise(E::Add(Add)), &[g, f]).unwrap();
    let seed = t(&[2, 2], &[1.0, -1.0, 0.5, 2.0]);
    let seed_before = seed.clone().into_vec();

    // Only the leaves are read, so every op node's cotangent is owned by its VJP.
    let picked = tape.backward_at(h, &seed, &[a, b]).unwrap();
    let all = tape.backward_all(h, &seed).unwrap();
    assert_eq!(picked[0].data(), all[a].data());
    assert_eq!(picked[1].data(), all[b].data());
    // h = (f - f) + f = f = -3 (a + a - b): da = -6 seed, db = 3 * (column sums of seed).
    assert_eq!(picked[0].data(), &[-6.0, 6.0, -3.0, -12.0]);
    assert_eq!(picked[1].data(), &[3.0 * 1.5, 3.0 * 1.0]);
    assert_eq!(
        seed.into_vec(),
        seed_before,
        "the caller's seed was written"
    );
}

#[test]
fn an_owned_cotangent_that_is_still_shared_is_copied_before_it_is_changed() {
    let mut tape = Tape::<f32>::new();
    let x = tape.leaf(Tensor::from_f64(&[3], &[1.0, 2.0, 3.0]).unwrap(), true);
    let y = tape
        .apply(Op::Elementwise(E::Scale(Scale { factor: 2.0 })), &[x])
        .unwrap();
    let z = tape.apply(Op::Elementwise(E::Neg(Neg)), &[y]).unwrap();
    let seed = Tensor::<f32>::from_f64(&[3], &[1.0, 2.0, 4.0]).unwrap();
    // The seed's buffer is shared with the caller's tensor all along the chain.
    let kept = seed.clone();
    let grads = tape.backward_at(z, &seed, &[x]).unwrap();
    assert_eq!(grads[0].data(), &[-2.0, -4.0, -8.0]);
    assert_eq!(kept.data(), &[1.0, 2.0, 4.0]);
    assert_eq!(seed.data(), &[1.0, 2.0, 4.0]);
}
