//! Regression cases of the tape and session: fan-out, long chains, stale handles, no-grad, detach,
//! and the masked-branch NaN of `where(x > 0, sqrt(x), 0)` at 0.

use tapegrad_core::ops::elementwise::{Add, Scale};
use tapegrad_core::ops::{ElementwiseOp, Op};
use tapegrad_core::{audit, Error, Session, Tape, Tensor};

fn t(dims: &[usize], v: &[f64]) -> Tensor<f64> {
    Tensor::from_f64(dims, v).unwrap()
}

#[test]
fn value_used_twice_gets_both_paths() {
    let mut s = Session::<f64>::new();
    let x = s.parameter("x", t(&[3], &[1.0, -2.0, 3.0])).unwrap();
    let y = s.mul(x, x).unwrap();
    let l = s.sum(y).unwrap();
    let g = s.backward(l).unwrap();
    assert_eq!(g.get("x").unwrap().data(), &[2.0, -4.0, 6.0]);
}

#[test]
fn million_node_chain_runs_without_recursion() {
    // Miri interprets each step about a thousand times slower; a shorter chain still exercises
    // every access the long one makes.
    const CHAIN: usize = if cfg!(miri) { 1_000 } else { 1_000_000 };
    let mut tape = Tape::<f64>::with_capacity(CHAIN + 1);
    let mut id = tape.leaf(t(&[2], &[1.0, 2.0]), true);
    let op = Op::Elementwise(ElementwiseOp::Scale(Scale { factor: 1.0 }));
    for _ in 0..CHAIN {
        id = tape.apply(op.clone(), &[id]).unwrap();
    }
    let grads = tape.backward_all(id, &t(&[2], &[3.0, 4.0])).unwrap();
    assert_eq!(grads.len(), CHAIN + 1);
    assert_eq!(grads[0].data(), &[3.0, 4.0]);
    // Backward may run again on the same tape and gives the same answer.
    let again = tape.backward_all(id, &t(&[2], &[3.0, 4.0])).unwrap();
    assert_eq!(again[0].data(), &[3.0, 4.0]);
}

#[test]
fn stale_handles_are_rejected_after_reset() {
    let mut s = Session::<f64>::new();
    let x = s.parameter("x", t(&[1], &[1.0])).unwrap();
    s.reset();
    let err = s.exp(x).unwrap_err();
    assert!(
        matches!(
            err,
            Error::StaleHandle {
                handle_step: 0,
                session_step: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("reset"));
}

#[test]
fn detach_and_no_grad_stop_gradients() {
    let mut s = Session::<f64>::new();
    let x = s.parameter("x", t(&[2], &[1.0, 2.0])).unwrap();
    let d = s.detach(x).unwrap();
    let y = s.mul(x, d).unwrap();
    let l = s.sum(y).unwrap();
    let g = s.backward(l).unwrap();
    assert_eq!(g.get("x").unwrap().data(), &[1.0, 2.0]);
    let z = s.no_grad(|s| s.exp(x)).unwrap();
    assert!(!s.tape().node(z.id()).unwrap().requires_grad);
}

#[test]
fn masked_sqrt_at_zero_gives_nan_and_the_audit_names_the_node() {
    // where(x > 0, sqrt(x), 0) at x = 0: the sqrt branch receives a zero cotangent, and its local
    // derivative 1 / (2 sqrt(0)) is infinite, so 0 * inf = NaN reaches x. We return NaN, as PyTorch
    // does: it is the exact chain rule on the recorded program. The audit (and anomaly mode) name
    // the sqrt node as the cause; the remedy is to mask the input: sqrt(where(x > 0, x, 1)).
    let mut s = Session::<f64>::new();
    let x = s.parameter("x", t(&[2], &[0.0, 4.0])).unwrap();
    let root = s.sqrt(x).unwrap();
    s.set_name(root, "root").unwrap();
    let zero = s.constant(t(&[2], &[0.0, 0.0]));
    let mask = s.gt(x, 0.0).unwrap();
    let y = s.where_(mask, root, zero).unwrap();
    let l = s.sum(y).unwrap();
    let g = s.backward(l).unwrap();
    let gx = g.get("x").unwrap().data();
    assert!(gx[0].is_nan());
    assert_eq!(gx[1], 0.25);
    let report = audit(s.tape());
    assert!(!report.is_zero_preserving());
    assert_eq!(report.findings[0].name.as_deref(), Some("root"));
    assert_eq!(report.findings[0].op, "sqrt");
}

#[test]
fn bad_ids_and_seeds_are_errors() {
    let mut tape = Tape::<f64>::new();
    let x = tape.leaf(t(&[2], &[1.0, 2.0]), true);
    assert!(matches!(
        tape.backward(5, &t(&[2], &[1.0, 1.0])),
        Err(Error::BadId { id: 5, .. })
    ));
    assert!(matches!(
        tape.backward(x, &t(&[3], &[1.0, 1.0, 1.0])),
        Err(Error::GradShape { .. })
    ));
    assert!(matches!(
        tape.backward_from(vec![]),
        Err(Error::GradCount { .. })
    ));
    let err = tape
        .apply(Op::Elementwise(ElementwiseOp::Add(Add)), &[x, 9])
        .unwrap_err();
    assert!(err.to_string().contains("add"), "{err}");
}
