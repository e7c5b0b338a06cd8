//! Law 1 (executed = reference): on a zero-preserving tape, `backward_all(out, seed)` equals
//! `backward_from(one_hot(out, seed))` slot for slot, error cases included. Tapes are recorded from
//! random programs over every registered op, at generic points and at rounded points (ties, kinks,
//! domain edges); zero preservation is checked with the audit before the law is asserted.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use tapegrad_core::laws::registry::random_shape;
use tapegrad_core::laws::{random_program, OpKind, Program, ProgramConfig};
use tapegrad_core::{audit, Error, Op, Result, Tape, Tensor};

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

fn uniform(shape: &tapegrad_core::Shape, rng: &mut ChaCha8Rng) -> Tensor<f64> {
    let data = (0..shape.numel())
        .map(|_| rng.random_range(-2.0..2.0))
        .collect();
    Tensor::from_shape(shape.clone(), data).unwrap()
}

/// Rounds every input to a multiple of 0.5, so relu meets 0, max meets ties, log meets 0, ...:
/// points where the tape may stop being zero-preserving, which the audit must then report.
fn rounded(program: &Program) -> Program {
    let inputs = program
        .inputs
        .iter()
        .map(|x| x.map(|v| (v * 2.0).round() / 2.0))
        .collect();
    program.with_inputs(inputs)
}

/// Equality of two sweep results: the same error, or the same values slot for slot under `==`
/// (so +0 equals -0). A NaN matches a NaN in the same place: a zero-preserving tape can still
/// carry NaN from real contributions, and then both sweeps carry it identically.
fn same_sweep(a: &Result<Vec<Tensor<f64>>>, b: &Result<Vec<Tensor<f64>>>) -> bool {
    match (a, b) {
        (Err(x), Err(y)) => x == y,
        (Ok(x), Ok(y)) => {
            x.len() == y.len()
                && x.iter().zip(y).all(|(p, q)| {
                    p.shape() == q.shape()
                        && p.data()
                            .iter()
                            .zip(q.data())
                            .all(|(u, v)| u == v || (u.is_nan() && v.is_nan()))
                })
        }
        _ => false,
    }
}

/// The law at several outputs and seeds of one tape, including a bad id and a wrongly shaped seed.
fn check_law(tape: &Tape<f64>, rng: &mut ChaCha8Rng) -> std::result::Result<(), String> {
    for _ in 0..4 {
        let out = rng.random_range(0..tape.len() + 2);
        let seed = match tape.value(out) {
            Ok(v) if rng.random_bool(0.8) => uniform(v.shape(), rng),
            _ => uniform(&random_shape(rng), rng),
        };
        let executed = tape.backward_all(out, &seed);
        let reference = tape.one_hot(out, &seed).and_then(|g| tape.backward_from(g));
        if !same_sweep(&executed, &reference) {
            return Err(format!(
                "out {out}, seed {seed:?}\nexecuted: {executed:?}\nreference: {reference:?}\ntape:\n{tape}"
            ));
        }
        let wrong_len = out >= tape.len();
        let wrong_shape = !wrong_len && tape.value(out).unwrap().shape() != seed.shape();
        match &executed {
            Err(Error::BadId { id, .. }) if wrong_len => assert_eq!(*id, out),
            Err(Error::GradShape { id, .. }) if wrong_shape => assert_eq!(*id, out),
            Ok(grads) if !wrong_len && !wrong_shape => assert_eq!(grads.len(), tape.len()),
            other => return Err(format!("unexpected result for out {out}: {other:?}")),
        }
    }
    Ok(())
}

#[test]
fn executed_sweep_equals_reference_sweep_on_zero_preserving_tapes() {
    let tapes = AtomicUsize::new(0);
    let zero_preserving = AtomicUsize::new(0);
    let mut runner = TestRunner::new(config(256));
    runner
        .run(&any::<u64>(), |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut program = random_program(&mut rng, &ProgramConfig::default());
            if rng.random_bool(0.5) {
                program = rounded(&program);
            }
            // Rounding changes values, never shapes, and forward passes are unchecked, so every
            // program records.
            let tape = match program.record_f64() {
                Ok(t) => t,
                Err(e) => return Err(TestCaseError::fail(format!("record failed: {e}"))),
            };
            tapes.fetch_add(1, Ordering::Relaxed);
            if !audit(&tape).is_zero_preserving() {
                return Ok(());
            }
            zero_preserving.fetch_add(1, Ordering::Relaxed);
            check_law(&tape, &mut rng).map_err(TestCaseError::fail)
        })
        .unwrap();
    let (n, z) = (tapes.into_inner(), zero_preserving.into_inner());
    // Generic programs are always zero-preserving and rounded ones usually are, so the law must
    // have been exercised on most tapes (not vacuously skipped).
    assert!(
        z * 10 >= n * 8,
        "only {z} of {n} tapes were zero-preserving"
    );
}

#[test]
fn random_programs_mix_every_op_with_fan_out_broadcasting_and_frozen_inputs() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut seen: BTreeMap<OpKind, usize> = BTreeMap::new();
    let (mut fan_out_input, mut same_arg_twice, mut broadcast_both, mut frozen, mut nodes) =
        (0, 0, 0, 0, 0);
    // nn ops reading another node (a chained sub-program), and core ops reading an nn op's output.
    let (mut nn_on_node, mut nn_on_nn, mut core_on_nn) = (0, 0, 0);
    for _ in 0..300 {
        let p = random_program(&mut rng, &ProgramConfig::default());
        nodes += p.nodes.len();
        frozen += p.requires_grad.iter().filter(|&&r| !r).count();
        let mut readers = vec![BTreeSet::new(); p.slots()];
        for (k, node) in p.nodes.iter().enumerate() {
            *seen.entry(node.op.kind()).or_default() += 1;
            let is_nn = |op: &Op| matches!(op, Op::Nn(_));
            let read_nodes: Vec<&Op> = node
                .args
                .iter()
                .filter(|&&a| a >= p.inputs.len())
                .map(|&a| &p.nodes[a - p.inputs.len()].op)
                .collect();
            if is_nn(&node.op) {
                nn_on_node += usize::from(!read_nodes.is_empty());
                nn_on_nn += usize::from(read_nodes.iter().any(|op| is_nn(op)));
            } else {
                core_on_nn += usize::from(read_nodes.iter().any(|op| is_nn(op)));
            }
            for &a in &node.args {
                assert!(a < p.inputs.len() + k, "node {k} reads a later slot {a}");
                readers[a].insert(k);
            }
            let unique: BTreeSet<_> = node.args.iter().collect();
            same_arg_twice += usize::from(unique.len() < node.args.len());
            if node.args.len() == 2 {
                let ctx = p.eval(&p.inputs).unwrap();
                let (a, b) = (ctx[node.args[0]].dims(), ctx[node.args[1]].dims());
                let stretches = |x: &[usize], y: &[usize]| {
                    x.len() < y.len()
                        || x.iter()
                            .rev()
                            .zip(y.iter().rev())
                            .any(|(&p, &q)| p == 1 && q > 1)
                };
                broadcast_both += usize::from(stretches(a, b) && stretches(b, a));
            }
        }
        fan_out_input += (0..p.inputs.len())
            .filter(|&i| readers[i].len() >= 2)
            .count();
        // Every program records and stays finite.
        let tape = p.record_f64().unwrap();
        for node in tape.nodes() {
            assert!(node.value.first_non_finite().is_none(), "{tape}");
        }
    }
    let missing: Vec<&str> = OpKind::ALL
        .iter()
        .filter(|k| !seen.contains_key(k))
        .map(|k| k.label())
        .collect();
    assert!(
        missing.is_empty(),
        "ops never placed in 300 programs: {missing:?}"
    );
    assert!(nodes >= 300 * 3, "programs are too short: {nodes} nodes");
    assert!(
        fan_out_input >= 30,
        "inputs read by two nodes: {fan_out_input}"
    );
    assert!(
        same_arg_twice >= 5,
        "nodes reading one slot twice: {same_arg_twice}"
    );
    assert!(
        broadcast_both >= 10,
        "binary nodes broadcasting both sides: {broadcast_both}"
    );
    assert!(frozen >= 30, "inputs not requiring grad: {frozen}");
    assert!(nn_on_node >= 60, "nn ops reading a node: {nn_on_node}");
    assert!(nn_on_nn >= 10, "nn ops reading an nn op: {nn_on_nn}");
    assert!(core_on_nn >= 60, "core ops reading an nn op: {core_on_nn}");
}
