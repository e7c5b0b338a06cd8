//! Law 2 (tape = graph): for every full seed, the reference sweep on the lowered tape equals the
//! graph's `backprop_all`, slot for slot on the slots that require grad; on f64 and f32, over
//! random graphs of every implemented op, nn ops included (broadcasting, fan-out, intermediate seeds).

use crate::graph_support::{inputs, ops_covered, random_program, random_seed};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tapegrad_core::graph::Graph;
use tapegrad_core::ops::elementwise::{Add, Mul};
use tapegrad_core::ops::{ElementwiseOp, Op, OpKind};
use tapegrad_core::{Scalar, Shape, Tensor};

fn check<S: Scalar>(case: u64) {
    let p = random_program(case, 1 + (case % 10) as usize);
    let g = p.to_graph().unwrap();
    let x = inputs::<S>(&p);
    let tape = g.lower(&x).unwrap();
    assert_eq!(tape.len(), g.slots(), "case {case}");
    let values = g.eval(&x).unwrap();
    for (slot, v) in values.iter().enumerate() {
        assert_eq!(
            tape.value(slot).unwrap(),
            v,
            "case {case}: value of slot {slot}"
        );
    }
    let mut rng = ChaCha8Rng::seed_from_u64(case ^ 0x5eed);
    let seed = random_seed::<S>(&mut rng, &g.shapes());
    let from_tape = tape.backward_from(seed.clone()).unwrap();
    let from_graph = g.backprop_all(&x, seed).unwrap();
    assert_eq!(from_graph.len(), g.slots());
    for (slot, rg) in g.requires_grad().into_iter().enumerate() {
        if rg {
            assert_eq!(
                from_tape[slot], from_graph[slot],
                "case {case}: slot {slot} of\n{g}"
            );
        }
    }
}

#[test]
fn law2_holds_on_random_graphs_f64() {
    for case in 0..256 {
        check::<f64>(case);
    }
}

#[test]
fn law2_holds_on_random_graphs_f32() {
    for case in 1000..1256 {
        check::<f32>(case);
    }
}

#[test]
fn random_graphs_cover_every_implemented_op() {
    let covered = ops_covered(256, 10);
    for op in OpKind::ALL.iter().map(|k| k.label()) {
        assert!(
            covered.contains(op),
            "{op} never appears; covered: {covered:?}"
        );
    }
}

/// A value read by three nodes, with a seed on an intermediate: every path's contribution arrives.
#[test]
fn fan_out_with_an_intermediate_seed_matches_by_hand() {
    let mut g = Graph::new();
    let x = g.input("x", Shape::new([2]).unwrap(), true).unwrap();
    let sq = g
        .node("sq", Op::Elementwise(ElementwiseOp::Mul(Mul)), &[x, x])
        .unwrap();
    let s = g
        .node("s", Op::Elementwise(ElementwiseOp::Add(Add)), &[sq, x])
        .unwrap();
    let xs = [Tensor::new(&[2], vec![3.0, -1.0]).unwrap()];
    let seed = vec![
        Tensor::new(&[2], vec![0.5, 0.0]).unwrap(),
        Tensor::new(&[2], vec![1.0, 1.0]).unwrap(),
        Tensor::new(&[2], vec![2.0, 3.0]).unwrap(),
    ];
    let all = g.backprop_all(&xs, seed.clone()).unwrap();
    // slot s: its seed; slot sq: 1 + seed(s); x: 0.5 + seed(s) + 2x * (1 + seed(s)).
    assert_eq!(all[s].data(), &[2.0, 3.0]);
    assert_eq!(all[sq].data(), &[3.0, 4.0]);
    assert_eq!(all[x].data(), &[0.5 + 2.0 + 6.0 * 3.0, 3.0 - 2.0 * 4.0]);
    let tape = g.lower(&xs).unwrap();
    assert_eq!(tape.backward_from(seed).unwrap(), all);
}
