//! Law 3 (executed on a lowered tape): for every slot `o` (input, intermediate or last node) and
//! seed, `backward_all(lower(g, x), o, seed)` equals `backprop_all(g, x, single(o, seed))` on the
//! slots that require grad; on f64 and f32 over random graphs. Lowered tapes of finite values
//! are zero-preserving, which is what makes skipping unreached nodes exact.

use crate::graph_support::{inputs, random_like, random_program};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tapegrad_core::graph::Graph;
use tapegrad_core::ops::activation::Relu;
use tapegrad_core::ops::elementwise::{Exp, Mul};
use tapegrad_core::ops::{ActivationOp, ElementwiseOp, Op};
use tapegrad_core::{audit, Error, Scalar, Shape, Tensor};

fn check<S: Scalar>(case: u64) {
    let p = random_program(case, 1 + (case % 10) as usize);
    let g = p.to_graph().unwrap();
    let x = inputs::<S>(&p);
    let tape = g.lower(&x).unwrap();
    let report = audit(&tape);
    assert!(report.is_zero_preserving(), "case {case}: {report}");
    let rg = g.requires_grad();
    let mut rng = ChaCha8Rng::seed_from_u64(case ^ 0x3);
    for o in 0..g.slots() {
        let seed = random_like::<S>(&mut rng, g.shape(o).unwrap());
        let executed = tape.backward_all(o, &seed).unwrap();
        let reference = g.backprop_all(&x, g.single(o, &seed).unwrap()).unwrap();
        for slot in (0..g.slots()).filter(|&s| rg[s]) {
            assert_eq!(
                executed[slot], reference[slot],
                "case {case}: output slot {o}, slot {slot} of\n{g}"
            );
        }
    }
}

#[test]
fn law3_holds_on_random_graphs_f64() {
    for case in 0..192 {
        check::<f64>(case);
    }
}

#[test]
fn law3_holds_on_random_graphs_f32() {
    for case in 2000..2192 {
        check::<f32>(case);
    }
}

/// Nodes after the seeded slot and nodes beside it get zero cotangents; the executed sweep skips
/// them, the reference runs them on zeros, and both agree (here with exact values).
#[test]
fn seeding_an_intermediate_ignores_later_and_unrelated_nodes() {
    let mut g = Graph::new();
    let x = g.input("x", Shape::new([3]).unwrap(), true).unwrap();
    let y = g.input("y", Shape::new([3]).unwrap(), true).unwrap();
    let a = g
        .node("a", Op::Elementwise(ElementwiseOp::Mul(Mul)), &[x, y])
        .unwrap();
    let _b = g
        .node("b", Op::Activation(ActivationOp::Relu(Relu)), &[y])
        .unwrap();
    let _c = g
        .node("c", Op::Elementwise(ElementwiseOp::Exp(Exp)), &[a])
        .unwrap();
    let xs = [
        Tensor::new(&[3], vec![1.0, -2.0, 0.5]).unwrap(),
        Tensor::new(&[3], vec![4.0, 1.0, -1.0]).unwrap(),
    ];
    let seed = Tensor::new(&[3], vec![1.0, 2.0, 3.0]).unwrap();
    let tape = g.lower(&xs).unwrap();
    let executed = tape.backward_all(a, &seed).unwrap();
    let reference = g.backprop_all(&xs, g.single(a, &seed).unwrap()).unwrap();
    assert_eq!(executed, reference);
    assert_eq!(reference[x].data(), &[4.0, 2.0, -3.0]);
    assert_eq!(reference[y].data(), &[1.0, -4.0, 1.5]);
}

#[test]
fn a_seed_of_the_wrong_shape_is_an_error_naming_the_slot() {
    let mut g = Graph::new();
    let x = g.input("x", Shape::new([3]).unwrap(), true).unwrap();
    g.node("e", Op::Elementwise(ElementwiseOp::Exp(Exp)), &[x])
        .unwrap();
    let err = g
        .single(1, &Tensor::<f64>::zeros(&Shape::new([2]).unwrap()))
        .unwrap_err();
    assert!(matches!(err, Error::AtNode { .. }), "{err}");
    assert!(err.to_string().contains("'e'"), "{err}");
}
