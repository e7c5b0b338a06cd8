//! Cases that kill the mutants the law tests let live (docs/mutation-testing.md): the executed
//! sweep's general path (custom rules, anomaly mode), the tape's accounting and display, the
//! audit's report, and the saved graph's byte counts and aux data. Each asserts a value a mutated
//! engine gets wrong.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tapegrad_core::graph::{distinct_bytes, CompiledGraph, Graph};
use tapegrad_core::laws::{random_program, ProgramConfig};
use tapegrad_core::ops::elementwise::{Add, Exp, Neg, Scale, Sin, Where};
use tapegrad_core::ops::loss::CrossEntropyProbs;
use tapegrad_core::ops::nn::{LayerNorm, MaxPool2d};
use tapegrad_core::ops::{Aux, ElementwiseOp, LossOp, Mask, Reduction, Saved};
use tapegrad_core::tape::{CustomVjp, FindingKind};
use tapegrad_core::{audit, Error, Op, Shape, Tape, Tensor};

fn t(dims: &[usize], v: &[f64]) -> Tensor<f64> {
    Tensor::from_f64(dims, v).unwrap()
}

fn rule(
    f: impl Fn(&Tensor<f64>) -> Vec<(usize, Tensor<f64>)> + Send + Sync + 'static,
) -> CustomVjp<f64> {
    Arc::new(move |g: &Tensor<f64>| Ok(f(g)))
}

fn same_bits(a: &Tensor<f64>, b: &Tensor<f64>) -> bool {
    a.shape() == b.shape()
        && a.data()
            .iter()
            .zip(b.data())
            .all(|(x, y)| x.to_bits() == y.to_bits())
}

/// A custom rule runs on the sweep's general path: its contribution to a parent that requires
/// grad is added in (`2 g`), one to a frozen parent is dropped, in both sweeps.
#[test]
fn a_custom_rule_feeds_parents_that_require_grad_only() {
    let mut tape = Tape::<f64>::new();
    let x = tape.leaf(t(&[2], &[1.0, 2.0]), true);
    let c = tape.leaf(t(&[2], &[5.0, 6.0]), false);
    let y = tape
        .custom(
            "twice",
            t(&[2], &[2.0, 4.0]),
            &[x, c],
            rule(move |g| vec![(x, g.map(|v| 2.0 * v)), (c, g.map(|v| 3.0 * v))]),
        )
        .unwrap();
    assert_eq!(y, 2);
    assert!(tape.nodes()[y].requires_grad);
    assert_eq!(tape.nodes()[y].op_name(), "twice");
    let seed = t(&[2], &[1.0, -1.0]);
    let executed = tape.backward_all(y, &seed).unwrap();
    let reference = tape.backward_from(tape.one_hot(y, &seed).unwrap()).unwrap();
    for grads in [&executed, &reference] {
        assert_eq!(grads[x].data(), &[2.0, -2.0]);
        assert_eq!(grads[c].data(), &[0.0, 0.0]);
        assert_eq!(grads[y].data(), &[1.0, -1.0]);
    }
    // A custom node over frozen parents does not require grad.
    let frozen = tape
        .custom("frozen", t(&[2], &[0.0, 0.0]), &[c], rule(|_| vec![]))
        .unwrap();
    assert!(!tape.nodes()[frozen].requires_grad);
    assert!(tape
        .custom("bad", t(&[1], &[0.0]), &[9], rule(|_| vec![]))
        .is_err());
}

/// A rule may feed its own id: the cotangent is back in its slot before the contributions are
/// added, so the slot ends as `seed + contribution` in both sweeps.
#[test]
fn a_custom_rule_feeding_its_own_id_adds_onto_its_cotangent() {
    let mut tape = Tape::<f64>::new();
    let x = tape.leaf(t(&[2], &[1.0, 2.0]), true);
    let y = tape
        .custom(
            "self",
            t(&[2], &[1.0, 2.0]),
            &[x],
            rule(move |g| vec![(x + 1, g.map(|v| 0.5 * v)), (x, g.clone())]),
        )
        .unwrap();
    let seed = t(&[2], &[2.0, 4.0]);
    let executed = tape.backward_all(y, &seed).unwrap();
    let reference = tape.backward_from(tape.one_hot(y, &seed).unwrap()).unwrap();
    for grads in [&executed, &reference] {
        assert_eq!(grads[y].data(), &[3.0, 6.0]);
        assert_eq!(grads[x].data(), &[2.0, 4.0]);
    }
}

/// A leaf `x` of shape [2] and one custom node over it with rule `vjp`.
fn one_custom(label: &str, vjp: CustomVjp<f64>) -> (Tape<f64>, usize) {
    let mut tape = Tape::<f64>::new();
    let x = tape.leaf(t(&[2], &[1.0, 2.0]), true);
    let y = tape.custom(label, t(&[2], &[0.0, 0.0]), &[x], vjp).unwrap();
    (tape, y)
}

fn both_sweeps(tape: &Tape<f64>, out: usize) -> [tapegrad_core::Result<Vec<Tensor<f64>>>; 2] {
    let seed = t(&[2], &[1.0, 1.0]);
    [
        tape.backward_all(out, &seed),
        tape.backward_from(tape.one_hot(out, &seed).unwrap()),
    ]
}

/// Contributions to an id that is not a node, or of the wrong shape, and a failing rule, are
/// errors of both sweeps naming the id (never a panic), and the audit names each node.
#[test]
fn a_custom_rule_with_a_bad_contribution_is_an_error_and_a_finding() {
    let bad_id = || rule(|g| vec![(7, g.clone())]);
    let bad_shape = || rule(|_| vec![(0, t(&[3], &[0.0; 3]))]);
    let failing =
        || -> CustomVjp<f64> { Arc::new(|_| Err(Error::invalid("failing", "no gradient"))) };
    let nonzero = || rule(|g| vec![(0, g.map(|v| v + 1.0))]);

    let (tape, y) = one_custom("bad_id", bad_id());
    for sweep in both_sweeps(&tape, y) {
        let want = Error::BadId {
            context: "backward",
            id: 7,
            len: 2,
        };
        assert_eq!(sweep.unwrap_err(), want);
    }
    let (tape, y) = one_custom("bad_shape", bad_shape());
    for sweep in both_sweeps(&tape, y) {
        match sweep.unwrap_err() {
            Error::GradShape { id, found, .. } => assert_eq!((id, found.dims()), (0, &[3][..])),
            other => panic!("{other}"),
        }
    }
    let (tape, y) = one_custom("failing", failing());
    for sweep in both_sweeps(&tape, y) {
        assert_eq!(sweep.unwrap_err().to_string(), "failing: no gradient");
    }
    let (tape, y) = one_custom("nonzero", nonzero());
    for sweep in both_sweeps(&tape, y) {
        assert_eq!(sweep.unwrap()[0].data(), &[2.0, 2.0]);
    }

    let mut tape = Tape::<f64>::new();
    let x = tape.leaf(t(&[2], &[1.0, 2.0]), true);
    let zero = || t(&[2], &[0.0, 0.0]);
    let ids: Vec<usize> = [
        ("bad_id", bad_id()),
        ("bad_shape", bad_shape()),
        ("failing", failing()),
        ("nonzero", nonzero()),
    ]
    .into_iter()
    .map(|(label, vjp)| tape.custom(label, zero(), &[x], vjp).unwrap())
    .collect();
    let report = audit(&tape);
    let found: Vec<(usize, &str)> = report
        .findings
        .iter()
        .map(|f| (f.node, f.op.as_str()))
        .collect();
    let labels = ["bad_id", "bad_shape", "failing", "nonzero"];
    assert_eq!(
        found,
        ids.iter().copied().zip(labels).collect::<Vec<_>>(),
        "{report}"
    );
    let kinds: Vec<&FindingKind> = report.findings.iter().map(|f| &f.kind).collect();
    assert_eq!(kinds[0], &FindingKind::BadParent { parent: 7 });
    assert!(matches!(
        kinds[1],
        FindingKind::WrongShape { parent: 0, .. }
    ));
    assert!(matches!(kinds[2], FindingKind::VjpError(_)));
    let one = FindingKind::NonZero {
        parent: 0,
        index: 0,
        value: 1.0,
    };
    assert_eq!(kinds[3], &one);
    assert_eq!(
        report.to_string(),
        "node 1 (bad_id): emits a contribution to id 7, which is not a node\n\
         node 2 (bad_shape): emits a contribution of shape [3] to parent 0, whose value has shape [2]\n\
         node 3 (failing): the vjp fails on a zero cotangent: failing: no gradient\n\
         node 4 (nonzero): a zero cotangent gives 1 at element 0 of the contribution to parent 0\n"
    );
    assert!(!report.is_zero_preserving());
}

#[test]
fn a_clean_audit_report_says_so() {
    let mut tape = Tape::<f64>::new();
    let x = tape.leaf(t(&[2], &[1.0, 2.0]), true);
    tape.apply(Op::Elementwise(ElementwiseOp::Exp(Exp)), &[x])
        .unwrap();
    let report = audit(&tape);
    assert!(report.is_zero_preserving());
    assert_eq!(
        report.to_string(),
        "zero-preserving: every node maps a zero cotangent to zeros\n"
    );
}

/// Anomaly mode takes the sweep's general path (each contribution checked, then added); on
/// finite tapes it gives the executed sweep's bits, for `backward` and `backward_at` alike.
#[test]
fn anomaly_mode_gives_the_same_gradients_on_finite_tapes() {
    let (mut compared, mut finite) = (0, 0);
    for case in 0..64u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(case);
        let program = random_program(&mut rng, &ProgramConfig::default());
        let tape = program.record_f64().unwrap();
        let mut watched = tape.clone();
        watched.set_detect_anomaly(true);
        assert!(watched.detect_anomaly() && !tape.detect_anomaly());
        let out = tape.len() - 1;
        let shape = tape.value(out).unwrap().shape().clone();
        let data = (0..shape.numel())
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let seed = Tensor::from_shape(shape, data).unwrap();
        let plain = tape.backward_all(out, &seed).unwrap();
        compared += 1;
        let Ok(checked) = watched.backward_all(out, &seed) else {
            continue; // a contribution overflowed: anomaly mode rightly stops
        };
        finite += 1;
        for (id, (a, b)) in plain.iter().zip(&checked).enumerate() {
            assert!(same_bits(a, b), "case {case}, id {id}\n{tape}");
        }
        let ids: Vec<usize> = (0..tape.len()).collect();
        let at = watched.backward_at(out, &seed, &ids).unwrap();
        for (id, (a, b)) in plain.iter().zip(&at).enumerate() {
            assert!(
                same_bits(a, b),
                "case {case}, id {id} (backward_at)\n{tape}"
            );
        }
    }
    assert!(finite * 10 >= compared * 9, "{finite} of {compared}");
    // And it is on: an infinity made in forward is an error naming the node.
    let mut tape = Tape::<f64>::new();
    tape.set_detect_anomaly(true);
    let x = tape.leaf(t(&[1], &[1000.0]), true);
    let err = tape
        .apply(Op::Elementwise(ElementwiseOp::Exp(Exp)), &[x])
        .unwrap_err();
    assert!(err.to_string().contains("exp"), "{err}");
}

/// Bytes held for backward: exp keeps its output (its own value, not counted), sin its input,
/// cross_entropy_probs its targets and its log-softmax (aux data); a frozen node keeps nothing.
#[test]
fn saved_and_value_bytes_count_what_each_vjp_reads() {
    let mut tape = Tape::<f64>::new();
    let x = tape.leaf(t(&[2, 3], &[0.5, -1.0, 2.0, 0.0, 1.5, -0.5]), true);
    let p = tape.leaf(t(&[2, 3], &[0.2, 0.3, 0.5, 1.0, 0.0, 0.0]), false);
    let e = tape
        .apply(Op::Elementwise(ElementwiseOp::Exp(Exp)), &[x])
        .unwrap();
    let s = tape
        .apply(Op::Elementwise(ElementwiseOp::Sin(Sin)), &[e])
        .unwrap();
    let frozen = tape
        .apply(Op::Elementwise(ElementwiseOp::Sin(Sin)), &[p])
        .unwrap();
    let probs = Op::Loss(LossOp::CrossEntropyProbs(CrossEntropyProbs {
        reduction: Reduction::Sum,
        weight: None,
        label_smoothing: 0.0,
    }));
    let loss = tape.apply(probs.clone(), &[s, p]).unwrap();
    let frozen_loss = tape.apply(probs, &[frozen, p]).unwrap();
    let per: Vec<usize> = (0..tape.len())
        .map(|id| tape.node_saved_bytes(id))
        .collect();
    assert_eq!(per, vec![0, 0, 0, 48, 0, 96, 0], "{tape}");
    assert_eq!((x, e, s, frozen, loss, frozen_loss), (0, 2, 3, 4, 5, 6));
    assert_eq!(tape.node_saved_bytes(99), 0);
    assert_eq!(tape.saved_bytes(), 144);
    assert_eq!(tape.value_bytes(), 5 * 48 + 2 * 8);
}

/// The tape's listing names each node, its op with attributes, parents, shape and grad flag.
#[test]
fn the_tape_lists_its_nodes() {
    let mut tape = Tape::<f64>::new();
    assert!(tape.is_empty());
    let x = tape.leaf_named("x", t(&[2], &[1.0, 2.0]), true);
    let c = tape.leaf(t(&[2], &[3.0, 4.0]), false);
    let y = tape
        .apply(
            Op::Elementwise(ElementwiseOp::Scale(Scale { factor: 2.5 })),
            &[x],
        )
        .unwrap();
    tape.set_name(y, "scaled").unwrap();
    tape.apply(Op::Elementwise(ElementwiseOp::Neg(Neg)), &[c])
        .unwrap();
    assert!(!tape.is_empty());
    assert_eq!(tape.name(x), Some("x"));
    assert_eq!(tape.name(c), None);
    assert_eq!(tape.name(9), None);
    assert!(matches!(
        tape.set_name(9, "nine"),
        Err(Error::BadId {
            context: "set_name",
            id: 9,
            len: 4
        })
    ));
    let scale = Op::Elementwise(ElementwiseOp::Scale(Scale { factor: 2.5 })).to_string();
    assert_eq!(
        tape.to_string(),
        format!(
            "%0 'x' = leaf[] : [2]\n%1 = leaf[] : [2] (no grad)\n%2 'scaled' = {scale}[0] : [2]\n\
             %3 = neg[1] : [2] (no grad)\n"
        )
    );
    assert_ne!(scale, "scale", "the listing shows the attributes");
    let debug = format!("{:?}", tape.nodes()[y]);
    assert!(
        debug.starts_with("Node {") && debug.contains("scaled"),
        "{debug}"
    );
}

/// `clear` empties the tape and drops every rule, including the ones holding heap data (a
/// `where` node's mask).
#[test]
fn clear_drops_every_node() {
    let mut tape = Tape::<f64>::new();
    let x = tape.leaf(t(&[2], &[1.0, 2.0]), true);
    let c = tape.leaf(t(&[2], &[3.0, 4.0]), false);
    let bits = Arc::new(vec![true, false]);
    let mask = Mask {
        shape: tape.value(x).unwrap().shape().clone(),
        data: bits.clone(),
    };
    tape.apply(
        Op::Elementwise(ElementwiseOp::Where(Where { mask })),
        &[x, c],
    )
    .unwrap();
    tape.apply(Op::Elementwise(ElementwiseOp::Exp(Exp)), &[x])
        .unwrap();
    assert!(Arc::strong_count(&bits) >= 2);
    tape.clear();
    assert_eq!(tape.len(), 0);
    assert!(tape.is_empty());
    assert_eq!(
        Arc::strong_count(&bits),
        1,
        "the where node's mask was not dropped"
    );
}

/// Distinct buffers count once: a clone shares its buffer, equal one-element tensors (which hold
/// their element inline) are told apart by value, and an empty tensor holds nothing.
#[test]
fn distinct_bytes_counts_each_buffer_once() {
    let a = t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let b = t(&[3], &[1.0, 2.0, 3.0]);
    assert_eq!(distinct_bytes([&a, &a.clone(), &b]), 32 + 24);
    let (one, also_one, two) = (t(&[1], &[1.0]), t(&[1], &[1.0]), t(&[1], &[2.0]));
    assert_eq!(distinct_bytes([&one, &also_one, &two]), 16);
    assert_eq!(distinct_bytes([&t(&[0], &[])]), 0);
}

/// A saved pass of `max_pool2d` keeps its output and its argmax indices (aux data, 8 bytes each);
/// `aux(k)` hands them out and refuses a node that is not there; a record of an op run on the
/// output outside the graph adds only the buffers it does not share with the pass.
#[test]
fn a_saved_pass_counts_its_aux_data_and_what_more_keeps() {
    let mut g = Graph::new();
    let x = g
        .input("x", Shape::new([1, 1, 4, 4]).unwrap(), true)
        .unwrap();
    let pool = Op::Nn(Box::new(MaxPool2d::new([2, 2]).into()));
    g.node("pool", pool, &[x]).unwrap();
    let compiled = CompiledGraph::new(g.clone());
    assert_eq!(compiled.graph(), &g);
    let xs: [Tensor<f64>; 1] =
        [Tensor::from_f64(&[1, 1, 4, 4], &(0..16).map(f64::from).collect::<Vec<_>>()).unwrap()];
    let saved = compiled.forward(&xs).unwrap();
    assert_eq!(saved.graph(), &g);
    assert_eq!(saved.output().data(), &[5.0, 7.0, 13.0, 15.0]);
    match saved.aux(0).unwrap() {
        Aux::Indices(ix) => assert_eq!(ix.len(), 4),
        other => panic!("{other:?}"),
    }
    assert!(saved.aux(1).unwrap_err().to_string().contains("no node 1"));
    assert_eq!(saved.kept_bytes(), 4 * 8 + 4 * 8);

    let y = saved.output();
    let keep = |op: Op| {
        let forward = op.forward(&[y]).unwrap();
        Saved::keep(op.saves(), &[y], &forward, [true])
    };
    // sin keeps its input, the pass's own output: nothing new.
    let sin = keep(Op::Elementwise(ElementwiseOp::Sin(Sin)));
    assert_eq!(saved.kept_bytes_with(Some(&sin)), saved.kept_bytes());
    // exp keeps its own output, a new buffer.
    let exp = keep(Op::Elementwise(ElementwiseOp::Exp(Exp)));
    assert_eq!(
        saved.kept_bytes_with(Some(&exp)),
        saved.kept_bytes() + 4 * 8
    );
}

/// A node of three arguments, applied or recorded (as lowering records), requires grad exactly
/// when one of its arguments does: over constants alone it is a node the sweeps skip, and it
/// keeps no auxiliary data for a backward that never comes.
#[test]
fn a_node_of_three_arguments_requires_grad_only_through_an_argument() {
    let norm = Op::from(LayerNorm {
        normalized_shape: vec![3],
        eps: 1e-5,
        weight: true,
        bias: true,
    });
    let x = t(&[2, 3], &[1.0, 2.0, 4.0, -1.0, 0.5, 3.0]);
    let (w, b) = (t(&[3], &[1.0, 2.0, 3.0]), t(&[3], &[0.5, 0.0, -0.5]));
    for weight_requires_grad in [false, true] {
        let mut tape = Tape::<f64>::new();
        let ids = [
            tape.leaf(x.clone(), false),
            tape.leaf(w.clone(), weight_requires_grad),
            tape.leaf(b.clone(), false),
        ];
        let applied = tape.apply(norm.clone(), &ids).unwrap();
        let forward = norm.forward(&[&x, &w, &b]).unwrap();
        let recorded = tape.record(norm.clone(), &ids, forward).unwrap();
        for id in [applied, recorded] {
            assert_eq!(
                tape.nodes()[id].requires_grad,
                weight_requires_grad,
                "node {id}"
            );
        }
        assert_eq!(
            tape.node_saved_bytes(applied) > 0,
            weight_requires_grad,
            "{}",
            tape.node_saved_bytes(applied)
        );
    }
}

/// `backward_keeping` keeps the cotangent of a node that requires grad and refuses, with an
/// error naming the slot rather than a panic, an input, a node that requires no grad and a slot
/// past the graph.
#[test]
fn keeping_a_cotangent_is_refused_for_inputs_frozen_nodes_and_slots_past_the_graph() {
    let mut g = Graph::new();
    let shape = Shape::new([2]).unwrap();
    let x = g.input("x", shape.clone(), true).unwrap();
    let c = g.input("c", shape, false).unwrap();
    let a = g.node("a", Op::from(Exp), &[x]).unwrap();
    let b = g.node("b", Op::from(Exp), &[c]).unwrap();
    let out = g.node("out", Op::from(Add), &[a, b]).unwrap();
    let compiled = CompiledGraph::new(g);
    let xs = [t(&[2], &[0.0, 1.0]), t(&[2], &[2.0, 3.0])];
    let seed = t(&[2], &[1.0, -1.0]);
    let saved = compiled.forward(&xs).unwrap();
    let (grads, kept) = saved.backward_keeping(&seed, &[a, out]).unwrap();
    assert_eq!(kept.len(), 2);
    for cot in &kept {
        assert!(same_bits(cot, &seed), "{cot:?}");
    }
    let want = t(&[2], &[1.0, -(1.0f64.exp())]);
    assert!(same_bits(grads[x].as_ref().unwrap(), &want));
    assert!(grads[c].is_none());
    for slot in [x, c, b, out + 1, usize::MAX] {
        let e = compiled
            .forward(&xs)
            .unwrap()
            .backward_keeping(&seed, &[slot])
            .unwrap_err();
        assert!(e.to_string().contains(&format!("slot {slot} ")), "{e}");
    }
}
