//! The observed sweeps (`Tape::backward_at_observed`, `SavedGraph::backward_keeping_observed`),
//! which tell each leaf's gradient as soon as it is final while the backward goes on: the
//! result holds the bits of the unobserved sweep, every leaf asked for is told exactly once, and
//! what it is told is its final gradient, bit for bit (so nothing changed it afterwards). On
//! random recorded programs and random graphs over every op, f64 and f32.

use crate::graph_support::{inputs, random_like, random_program as random_graph, same_bits};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tapegrad_core::graph::CompiledGraph;
use tapegrad_core::laws::{random_program, ProgramConfig};
use tapegrad_core::tape::Rule;
use tapegrad_core::{Scalar, Tape, Tensor};

/// What an observed sweep told: per reported index, the gradient (`None` for zeros) and how
/// often it was told.
type Told<S> = Vec<(Option<Tensor<S>>, usize)>;

fn tell<S: Scalar>(told: &mut Told<S>) -> impl FnMut(usize, Option<&Tensor<S>>) + '_ {
    |i, g| {
        told[i].0 = g.cloned();
        told[i].1 += 1;
    }
}

/// The told gradient `got` against the final one `want`: the same bits, zeros for `None`.
fn same_final<S: Scalar>(got: &Option<Tensor<S>>, want: &Tensor<S>) -> bool {
    match got {
        Some(g) => same_bits(g, want),
        None => want.data().iter().all(|&v| v == S::ZERO),
    }
}

fn check_tape<S: Scalar>(case: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(case);
    let config = ProgramConfig {
        max_nodes: 12,
        ..ProgramConfig::default()
    };
    let p = random_program(&mut rng, &config);
    let xs: Vec<Tensor<S>> = p.inputs.iter().map(|t| t.cast()).collect();
    let tape: Tape<S> = p.record(&xs).unwrap();
    let n = tape.len();
    for out in 0..n {
        let seed = random_like::<S>(&mut rng, tape.value(out).unwrap().shape());
        let ids: Vec<usize> = (0..rng.random_range(1..=n + 2))
            .map(|_| rng.random_range(0..n))
            .collect();
        let plain = tape.backward_at(out, &seed, &ids).unwrap();
        let mut told: Told<S> = vec![(None, 0); ids.len()];
        let observed = tape
            .backward_at_observed(out, &seed, &ids, &mut tell(&mut told))
            .unwrap();
        let what = format!("case {case}, out {out}, ids {ids:?}\n{tape}");
        for (i, &id) in ids.iter().enumerate() {
            assert!(same_bits(&observed[i], &plain[i]), "{what}: id {id}");
            let leaf = matches!(tape.nodes()[id].rule, Rule::Leaf);
            assert_eq!(told[i].1, usize::from(leaf), "{what}: id {id} told");
            if leaf {
                assert!(same_final(&told[i].0, &plain[i]), "{what}: id {id}");
            }
        }
    }
}

fn check_saved<S: Scalar>(case: u64) {
    let p = random_graph(case, 1 + (case % 10) as usize);
    let g = p.to_graph().unwrap();
    let x = inputs::<S>(&p);
    let compiled = CompiledGraph::new(g.clone());
    let mut rng = ChaCha8Rng::seed_from_u64(case ^ 0x0b5);
    let last = g.last_slot().unwrap();
    let seed = random_like::<S>(&mut rng, g.shape(last).unwrap());
    let needs = g.requires_grad();
    let n_in = g.inputs().len();
    let keep: Vec<usize> = (n_in..g.slots()).filter(|&k| needs[k]).collect();
    let what = format!("case {case} on\n{g}");
    let (grads, kept) = compiled
        .forward_for_input_grads(&x)
        .unwrap()
        .backward_keeping(&seed, &keep)
        .unwrap();
    let mut told: Told<S> = vec![(None, 0); n_in];
    let (observed, kept_observed) = compiled
        .forward_for_input_grads(&x)
        .unwrap()
        .backward_keeping_observed(&seed, &keep, &mut tell(&mut told))
        .unwrap();
    for (a, b) in kept.iter().zip(&kept_observed) {
        assert!(same_bits(a, b), "{what}");
    }
    for i in 0..n_in {
        match (&grads[i], &observed[i]) {
            (Some(a), Some(b)) => {
                assert!(same_bits(a, b), "{what}: input {i}");
                assert_eq!(told[i].1, 1, "{what}: input {i} told");
                assert!(same_final(&told[i].0, a), "{what}: input {i}");
            }
            (None, None) => assert_eq!(told[i].1, 0, "{what}: input {i} told"),
            other => panic!("{what}: input {i}: {other:?}"),
        }
    }
}

#[test]
fn observed_sweeps_tell_each_final_gradient_once_and_change_no_bit_f64() {
    for case in 0..64 {
        check_tape::<f64>(case);
        check_saved::<f64>(case);
    }
}

#[test]
fn observed_sweeps_tell_each_final_gradient_once_and_change_no_bit_f32() {
    for case in 700..764 {
        check_tape::<f32>(case);
        check_saved::<f32>(case);
    }
}
