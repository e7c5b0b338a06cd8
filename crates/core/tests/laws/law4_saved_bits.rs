//! Law 4 (saved = graph, bit for bit): the saved graph's forward values equal `eval`; its dense
//! backward equals `backprop_all` with identical bits; its inputs-only backward, which frees as it
//! goes, equals `backprop` on the inputs that require grad (bit for bit on every non-zero element;
//! a zero may differ in sign); checked lowering equals unchecked lowering when it succeeds. On f64
//! and f32 over random graphs.

use crate::graph_support::{inputs, random_like, random_program, random_seed, same_bits};

/// Equal with `==` (so +0 == -0), and identical bits on every non-zero element.
fn same_up_to_zero_sign<S: Scalar>(a: &Tensor<S>, b: &Tensor<S>) -> bool {
    a == b
        && a.data()
            .iter()
            .zip(b.data())
            .all(|(x, y)| *x == S::ZERO || x.to_f64().to_bits() == y.to_f64().to_bits())
}
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tapegrad_core::graph::{tape_kept_bytes, CompiledGraph, Graph};
use tapegrad_core::laws::Program;
use tapegrad_core::ops::activation::Relu;
use tapegrad_core::ops::elementwise::{Add, Exp, Log, Mul, Neg, Scale, Sin};
use tapegrad_core::ops::linalg::{Linear, Matmul};
use tapegrad_core::ops::{ActivationOp, ElementwiseOp, LinalgOp, Op};
use tapegrad_core::tape::Rule;
use tapegrad_core::{Error, Scalar, Shape, Tape, Tensor};

fn assert_bits<S: Scalar>(a: &[Tensor<S>], b: &[Tensor<S>], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (slot, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(same_bits(x, y), "{what}: slot {slot}: {x:?} vs {y:?}");
    }
}

fn check<S: Scalar>(case: u64) {
    let p = random_program(case, 1 + (case % 10) as usize);
    let g = p.to_graph().unwrap();
    let x = inputs::<S>(&p);
    let compiled = CompiledGraph::new(g.clone());
    let what = format!("case {case} on\n{g}");

    let (saved, context) = compiled.forward_with_context(&x).unwrap();
    assert_bits(&context, &g.eval(&x).unwrap(), &what);
    assert!(same_bits(saved.output(), context.last().unwrap()), "{what}");
    // The plain forward (which frees values and runs relu in place on a dead input) too.
    let plain = compiled.forward(&x).unwrap();
    assert!(same_bits(plain.output(), context.last().unwrap()), "{what}");

    let mut rng = ChaCha8Rng::seed_from_u64(case ^ 0x4);
    let seed = random_seed::<S>(&mut rng, &g.shapes());
    let reference = g.backprop_all(&x, seed.clone()).unwrap();
    assert_bits(
        &saved.backward_all(seed.clone()).unwrap(),
        &reference,
        &what,
    );

    // Inputs-only, with the zero seeds passed as "absent".
    let sparse: Vec<Option<Tensor<S>>> = seed
        .iter()
        .map(|s| (!s.is_all_zero()).then(|| s.clone()))
        .collect();
    let only = compiled
        .forward(&x)
        .unwrap()
        .backward_seeded(sparse)
        .unwrap();
    for (i, input) in g.inputs().iter().enumerate() {
        match &only[i] {
            Some(grad) => {
                assert!(input.requires_grad, "{what}");
                assert!(
                    same_up_to_zero_sign(grad, &reference[i]),
                    "{what}: input {i}"
                );
            }
            None => assert!(!input.requires_grad, "{what}: input {i}"),
        }
    }

    // Inputs-only from a seed at the last slot.
    let last = g.last_slot().unwrap();
    let out_seed = random_like::<S>(&mut rng, g.shape(last).unwrap());
    let one_hot = g.backprop(&x, g.single(last, &out_seed).unwrap()).unwrap();
    let grads = compiled.forward(&x).unwrap().backward(&out_seed).unwrap();
    for (i, grad) in grads.iter().enumerate() {
        if let Some(grad) = grad {
            assert!(same_up_to_zero_sign(grad, &one_hot[i]), "{what}: input {i}");
        }
    }

    // A pass that keeps only what the inputs-only backward reads: the same gradients, bit for
    // bit, from no more kept bytes; the dense backward refuses it.
    let lean = compiled.forward_for_input_grads(&x).unwrap();
    assert!(same_bits(lean.output(), context.last().unwrap()), "{what}");
    assert!(lean.kept_bytes() <= plain.kept_bytes(), "{what}");
    assert!(lean.backward_all(seed.clone()).is_err(), "{what}");
    let lean_grads = lean.backward(&out_seed).unwrap();
    assert_eq!(lean_grads.len(), grads.len(), "{what}");
    for (i, (a, b)) in lean_grads.iter().zip(&grads).enumerate() {
        match (a, b) {
            (Some(a), Some(b)) => assert!(same_bits(a, b), "{what}: input {i}"),
            (None, None) => {}
            _ => panic!("{what}: input {i}: {a:?} vs {b:?}"),
        }
    }

    // The same backward keeping node cotangents: each kept one is the final cotangent of its
    // slot, which `backprop_all` returns for that slot; inputs and slots that need no gradient
    // have none to keep (an error).
    let every = g
        .backprop_all(&x, g.single(last, &out_seed).unwrap())
        .unwrap();
    let needs = g.requires_grad();
    let n_in = g.inputs().len();
    let keep: Vec<usize> = (n_in..g.slots()).filter(|&k| needs[k]).collect();
    let (kept_grads, kept) = compiled
        .forward(&x)
        .unwrap()
        .backward_keeping(&out_seed, &keep)
        .unwrap();
    assert_eq!(kept_grads.len(), grads.len(), "{what}");
    for (&slot, cot) in keep.iter().zip(&kept) {
        assert!(
            same_up_to_zero_sign(cot, &every[slot]),
            "{what}: kept slot {slot}"
        );
    }
    for slot in (0..g.slots()).filter(|&k| k < n_in || !needs[k]) {
        let refused = compiled
            .forward(&x)
            .unwrap()
            .backward_keeping(&out_seed, &[slot]);
        assert!(
            refused.is_err(),
            "{what}: slot {slot} has no cotangent to keep"
        );
    }

    // The saved pass keeps no more than an eager tape that differentiates every slot, as its
    // dense backward does. (A tape of frozen inputs may keep less: an op with auxiliary
    // statistics, such as group_norm's mean and rstd, keeps none when no argument needs grad.)
    let tape = g.lower(&x).unwrap();
    let every_slot = Program {
        requires_grad: vec![true; p.inputs.len()],
        ..p.clone()
    };
    let dense_tape = every_slot.to_graph().unwrap().lower(&x).unwrap();
    assert!(saved.kept_bytes() <= tape_kept_bytes(&dense_tape), "{what}");

    // Checked lowering equals unchecked lowering when it succeeds.
    if let Ok(checked) = g.lower_checked(&x) {
        assert_same_tape(&checked, &tape, &what);
        // So does checked evaluation: the whole context, bit for bit.
        assert_bits(&g.eval_checked(&x).unwrap(), &g.eval(&x).unwrap(), &what);
        let checked_saved = compiled.forward_checked(&x).unwrap();
        assert_bits(
            &checked_saved.backward_all(seed.clone()).unwrap(),
            &reference,
            &what,
        );
    }
}

fn assert_same_tape<S: Scalar>(a: &Tape<S>, b: &Tape<S>, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (m, n) in a.nodes().iter().zip(b.nodes()) {
        assert!(same_bits(&m.value, &n.value), "{what}");
        assert_eq!(m.name, n.name, "{what}");
        assert_eq!(m.requires_grad, n.requires_grad, "{what}");
        assert_eq!(m.parents, n.parents, "{what}");
        match (&m.rule, &n.rule) {
            (Rule::Leaf, Rule::Leaf) => {}
            (Rule::Op { op: p, saved: s }, Rule::Op { op: q, saved: t }) => {
                assert_eq!(p, q, "{what}");
                // Which arguments need a gradient is not stored: it is the parents'
                // `requires_grad`, compared above for every node.
                assert_eq!(s.nbytes(), t.nbytes(), "{what}");
            }
            _ => panic!("{what}: different rules"),
        }
    }
    let last = a.len() - 1;
    let ones = Tensor::ones(a.value(last).unwrap().shape());
    assert_bits(
        &a.backward_all(last, &ones).unwrap(),
        &b.backward_all(last, &ones).unwrap(),
        what,
    );
}

#[test]
fn law4_holds_bit_for_bit_on_random_graphs_f64() {
    for case in 0..256 {
        check::<f64>(case);
    }
}

#[test]
fn law4_holds_bit_for_bit_on_random_graphs_f32() {
    for case in 3000..3256 {
        check::<f32>(case);
    }
}

fn t(dims: &[usize], v: &[f64]) -> Tensor<f64> {
    Tensor::new(dims, v.to_vec()).unwrap()
}

/// exp keeps its output, add nothing, sin its input, neg nothing: the saved pass keeps exp's
/// output, sin's input and the final value; the tape keeps all five values.
#[test]
fn the_saved_graph_keeps_only_what_each_vjp_declared() {
    let mut g = Graph::new();
    let x = g.input("x", Shape::new([100]).unwrap(), true).unwrap();
    let a = g
        .node("a", Op::Elementwise(ElementwiseOp::Exp(Exp)), &[x])
        .unwrap();
    let b = g
        .node("b", Op::Elementwise(ElementwiseOp::Add(Add)), &[a, x])
        .unwrap();
    let c = g
        .node("c", Op::Elementwise(ElementwiseOp::Sin(Sin)), &[b])
        .unwrap();
    g.node("d", Op::Elementwise(ElementwiseOp::Neg(Neg)), &[c])
        .unwrap();
    let xs = [Tensor::<f64>::full(&Shape::new([100]).unwrap(), 0.25)];
    let saved = CompiledGraph::new(g.clone()).forward(&xs).unwrap();
    assert_eq!(saved.kept_bytes(), 3 * 800);
    assert_eq!(tape_kept_bytes(&g.lower(&xs).unwrap()), 5 * 800);
}

/// A first linear layer whose input needs no gradient: the dense pass keeps the input and the
/// weight; the pass for the inputs' gradients keeps the input only (what the weight's gradient
/// reads, as PyTorch's autograd saves it), and the next layer, whose input requires grad, keeps
/// its weight too. Both passes give the same weight gradients.
#[test]
fn a_pass_for_input_gradients_keeps_only_what_they_read() {
    let mut g = Graph::new();
    let x = g.input("x", Shape::new([4, 30]).unwrap(), false).unwrap();
    let w1 = g.input("w1", Shape::new([20, 30]).unwrap(), true).unwrap();
    let w2 = g.input("w2", Shape::new([10, 20]).unwrap(), true).unwrap();
    let linear = Op::Linalg(LinalgOp::Linear(Linear { bias: false }));
    let h = g.node("h", linear.clone(), &[x, w1]).unwrap();
    g.node("y", linear, &[h, w2]).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let xs: Vec<Tensor<f64>> = [[4, 30], [20, 30], [10, 20]]
        .iter()
        .map(|d| random_like(&mut rng, &Shape::new(*d).unwrap()))
        .collect();
    let compiled = CompiledGraph::new(g);
    let (x_bytes, w1_bytes, w2_bytes, h_bytes, y_bytes) =
        (4 * 30, 20 * 30, 10 * 20, 4 * 20, 4 * 10);
    let dense = compiled.forward(&xs).unwrap();
    assert_eq!(
        dense.kept_bytes(),
        8 * (x_bytes + w1_bytes + h_bytes + w2_bytes + y_bytes)
    );
    let lean = compiled.forward_for_input_grads(&xs).unwrap();
    assert_eq!(
        lean.kept_bytes(),
        8 * (x_bytes + h_bytes + w2_bytes + y_bytes)
    );
    let seed = random_like(&mut rng, &Shape::new([4, 10]).unwrap());
    let a = dense.backward(&seed).unwrap();
    let b = lean.backward(&seed).unwrap();
    assert!(a[0].is_none() && b[0].is_none());
    for i in 1..3 {
        assert!(
            same_bits(a[i].as_ref().unwrap(), b[i].as_ref().unwrap()),
            "input {i}"
        );
    }
}

/// Matmul likewise keeps each operand only for the other's gradient, 1-D operands included:
/// `v @ W` with only W requiring grad keeps v; `A @ u` with only A requiring grad keeps u.
#[test]
fn a_pass_for_input_gradients_keeps_each_matmul_operand_only_for_the_other() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for (left, right, left_grad) in [
        (&[30][..], &[30, 20][..], false),
        (&[5, 3, 30], &[30], true),
    ] {
        let mut g = Graph::new();
        let a = g.input("a", Shape::new(left).unwrap(), left_grad).unwrap();
        let b = g
            .input("b", Shape::new(right).unwrap(), !left_grad)
            .unwrap();
        g.node("y", Op::Linalg(LinalgOp::Matmul(Matmul)), &[a, b])
            .unwrap();
        let xs: Vec<Tensor<f64>> = [left, right]
            .iter()
            .map(|d| random_like(&mut rng, &Shape::new(*d).unwrap()))
            .collect();
        let compiled = CompiledGraph::new(g.clone());
        let dense = compiled.forward(&xs).unwrap();
        let lean = compiled.forward_for_input_grads(&xs).unwrap();
        let kept_operand = &xs[usize::from(left_grad)];
        let out = dense.output();
        assert_eq!(
            lean.kept_bytes(),
            kept_operand.nbytes() + out.nbytes(),
            "{g}"
        );
        assert_eq!(
            dense.kept_bytes(),
            xs[0].nbytes() + xs[1].nbytes() + out.nbytes(),
            "{g}"
        );
        let seed = random_like(&mut rng, out.shape());
        let (d, l) = (
            dense.backward(&seed).unwrap(),
            lean.backward(&seed).unwrap(),
        );
        let i = usize::from(!left_grad);
        assert!(
            same_bits(d[i].as_ref().unwrap(), l[i].as_ref().unwrap()),
            "{g}"
        );
        assert!(d[1 - i].is_none() && l[1 - i].is_none(), "{g}");
    }
}

/// A -0 contribution into a zero slot: the dense passes compute `0 + (-0) = +0`, bit for bit alike;
/// the inputs-only pass stores the contribution, equal with `==`.
#[test]
fn negative_zero_contributions() {
    let mut g = Graph::new();
    let x = g.input("x", Shape::new([2]).unwrap(), true).unwrap();
    g.node(
        "y",
        Op::Elementwise(ElementwiseOp::Scale(Scale { factor: -1.0 })),
        &[x],
    )
    .unwrap();
    let xs = [t(&[2], &[1.0, 2.0])];
    let seed = t(&[2], &[0.0, 1.0]);
    let dense = g.backprop_all(&xs, g.single(1, &seed).unwrap()).unwrap();
    assert!(dense[0].data()[0].is_sign_positive());
    let compiled = CompiledGraph::new(g.clone());
    let saved = compiled.forward(&xs).unwrap();
    let saved_dense = saved.backward_all(g.single(1, &seed).unwrap()).unwrap();
    assert!(same_bits(&saved_dense[0], &dense[0]));
    let only = saved.backward(&seed).unwrap();
    let grad = only[0].as_ref().unwrap();
    assert_eq!(grad.data(), &[-0.0, -1.0]);
    assert!(same_up_to_zero_sign(grad, &dense[0]));
}

/// The compiled graph is built once and run for many batches; each run is independent.
#[test]
fn one_compiled_graph_serves_many_batches() {
    let mut g = Graph::new();
    let x = g.input("x", Shape::new([3]).unwrap(), false).unwrap();
    let w = g.input("w", Shape::new([3]).unwrap(), true).unwrap();
    let p = g
        .node("p", Op::Elementwise(ElementwiseOp::Mul(Mul)), &[x, w])
        .unwrap();
    g.node("q", Op::Elementwise(ElementwiseOp::Mul(Mul)), &[p, p])
        .unwrap();
    let compiled = CompiledGraph::new(g);
    let w0 = t(&[3], &[1.0, -1.0, 2.0]);
    for step in 0..5 {
        let xb = t(&[3], &[step as f64, 1.0, -0.5 * step as f64]);
        let grads = compiled
            .forward(&[xb.clone(), w0.clone()])
            .unwrap()
            .backward(&t(&[3], &[1.0, 1.0, 1.0]))
            .unwrap();
        assert!(grads[0].is_none(), "x does not require grad");
        // q = (x w)^2, dq/dw = 2 x^2 w.
        let want: Vec<f64> = (0..3)
            .map(|i| 2.0 * xb.data()[i].powi(2) * w0.data()[i])
            .collect();
        assert_eq!(grads[1].as_ref().unwrap().data(), &want[..]);
    }
}

#[test]
fn checked_lowering_names_the_node_that_leaves_the_domain() {
    let mut g = Graph::new();
    let x = g.input("x", Shape::new([3]).unwrap(), true).unwrap();
    let e = g
        .node("shift", Op::Elementwise(ElementwiseOp::Neg(Neg)), &[x])
        .unwrap();
    g.node("bad_log", Op::Elementwise(ElementwiseOp::Log(Log)), &[e])
        .unwrap();
    let xs = [t(&[3], &[-1.0, 0.5, -2.0])];
    let err = g.lower_checked(&xs).map(|_| ()).unwrap_err();
    assert!(matches!(&err, Error::AtNode { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("'bad_log' (log)") && text.contains("element 1"),
        "{text}"
    );
    assert!(CompiledGraph::new(g.clone()).forward_checked(&xs).is_err());
    // Unchecked lowering evaluates log(-0.5) to NaN without complaint.
    let tape = g.lower(&xs).unwrap();
    assert!(tape.value(2).unwrap().data()[1].is_nan());
}

/// New class labels for each batch: the compiled graph swaps the loss's attributes, nothing else.
#[test]
fn a_compiled_graph_takes_new_attributes_between_batches() {
    use std::sync::Arc;
    use tapegrad_core::ops::{LossOp, Reduction};
    let ce = |t: Vec<usize>| Op::Loss(LossOp::cross_entropy(Arc::new(t), Reduction::Sum));
    let mut g = Graph::new();
    let z = g.input("z", Shape::new([2, 3]).unwrap(), true).unwrap();
    let loss = g.node("loss", ce(vec![0, 0]), &[z]).unwrap();
    let mut compiled = CompiledGraph::new(g.clone());
    let zs = [t(&[2, 3], &[0.0; 6])];
    let one = Tensor::scalar(1.0);
    for labels in [vec![0, 1], vec![2, 2]] {
        compiled.set_op(loss, ce(labels.clone())).unwrap();
        let grad = compiled.forward(&zs).unwrap().backward(&one).unwrap()[0]
            .clone()
            .unwrap();
        // Uniform softmax: 1/3 everywhere, minus 1 at each row's label.
        for (row, &label) in labels.iter().enumerate() {
            for c in 0..3 {
                let want = 1.0 / 3.0 - if c == label { 1.0 } else { 0.0 };
                assert!((grad.data()[row * 3 + c] - want).abs() < 1e-15);
            }
        }
    }
    let wrong = compiled.set_op(loss, Op::Elementwise(ElementwiseOp::Exp(Exp)));
    assert!(wrong.unwrap_err().to_string().contains("'loss'"));
    let more_rows = compiled.set_op(loss, ce(vec![0, 1, 2]));
    assert!(more_rows.is_err());
}

/// Compiled mode runs relu in place on its producer's dead output and applies relu's VJP to the
/// cotangent's own buffer: the values, the gradients and the caller's inputs stay exactly as the
/// reference has them (NaN and both zero signs included), and an input that relu reads directly
/// is never overwritten.
#[test]
fn relu_in_place_keeps_values_gradients_and_inputs() {
    let mut g = Graph::new();
    let x = g.input("x", Shape::new([2, 3]).unwrap(), false).unwrap();
    let w1 = g.input("w1", Shape::new([4, 3]).unwrap(), true).unwrap();
    let b1 = g.input("b1", Shape::new([4]).unwrap(), true).unwrap();
    let w2 = g.input("w2", Shape::new([2, 4]).unwrap(), true).unwrap();
    let relu = || Op::Activation(ActivationOp::Relu(Relu));
    let direct = g.node("direct", relu(), &[x]).unwrap();
    let h = g
        .node(
            "h",
            Op::Linalg(LinalgOp::Linear(Linear { bias: true })),
            &[direct, w1, b1],
        )
        .unwrap();
    let a = g.node("a", relu(), &[h]).unwrap();
    let y = g
        .node(
            "y",
            Op::Linalg(LinalgOp::Linear(Linear { bias: false })),
            &[a, w2],
        )
        .unwrap();
    g.node("z", relu(), &[y]).unwrap();
    let xs = [
        t(&[2, 3], &[1.0, -2.0, 0.5, f64::NAN, -0.0, 3.0]),
        t(
            &[4, 3],
            &[
                1.0, -1.0, 0.5, -2.0, 0.25, 1.0, 0.0, 0.0, 0.0, 1.5, 2.0, -0.5,
            ],
        ),
        t(&[4], &[0.5, -4.0, -0.0, 0.25]),
        t(&[2, 4], &[1.0, -1.0, 2.0, 0.5, -1.5, 0.25, 1.0, -2.0]),
    ];
    let before = xs.clone();
    let compiled = CompiledGraph::new(g.clone());
    let saved = compiled.forward(&xs).unwrap();
    let context = g.eval(&xs).unwrap();
    assert!(same_bits(saved.output(), context.last().unwrap()));
    assert!(saved.output().data()[2].is_nan(), "NaN passes through relu");
    assert!(!saved.output().data()[0].is_nan());
    for (a, b) in xs.iter().zip(&before) {
        assert!(same_bits(a, b), "an input was overwritten");
    }
    let seed = t(&[2, 2], &[1.0, -0.5, 2.0, -3.0]);
    let reference = g.backprop(&xs, g.single(g.last_slot().unwrap(), &seed).unwrap());
    let reference = reference.unwrap();
    let grads = saved.backward(&seed).unwrap();
    assert!(grads[0].is_none());
    for i in 1..4 {
        let (grad, want) = (grads[i].as_ref().unwrap(), &reference[i]);
        // The weights see the NaN row through their products; the bias only through finite
        // cotangents (relu passes the cotangent where its output is NaN).
        let has_nan = grad.data().iter().any(|v| v.is_nan());
        assert_eq!(has_nan, i != 2, "input {i}");
        let same = grad.data().iter().zip(want.data()).all(|(a, b)| {
            (a.is_nan() && b.is_nan()) || (a == b && (*a == 0.0 || a.to_bits() == b.to_bits()))
        });
        assert!(same, "input {i}: {grad:?} vs {want:?}");
    }
}
