//! Anomaly mode: planted NaN and infinity sources in forward and backward are reported at the node
//! that makes them, with the op, name, shapes, element, and the masked-branch diagnosis.

use tapegrad_core::{Error, Session, Tensor};

fn t(dims: &[usize], v: &[f64]) -> Tensor<f64> {
    Tensor::from_f64(dims, v).unwrap()
}

fn anomaly_text(e: Error) -> String {
    match e {
        Error::Anomaly(m) => m,
        other => panic!("expected an anomaly, got {other}"),
    }
}

#[test]
fn forward_log_of_zero_names_the_log_node() {
    let mut s = Session::<f64>::new();
    s.set_detect_anomaly(true);
    let x = s.parameter("x", t(&[3], &[1.0, 0.0, 2.0])).unwrap();
    let e = s.exp(x).unwrap();
    let _ = e;
    let err = s.log(x).unwrap_err();
    let msg = anomaly_text(err);
    assert!(msg.contains("anomaly in forward: node 2 (log)"), "{msg}");
    assert!(msg.contains("[3]"), "{msg}");
    assert!(msg.contains("-inf at element 1"), "{msg}");
    assert!(msg.contains("all its inputs are finite"), "{msg}");
    assert!(msg.contains("mask the op's input"), "{msg}");
}

#[test]
fn forward_reports_a_poisoned_input() {
    let mut s = Session::<f64>::new();
    s.set_detect_anomaly(true);
    let x = s.parameter("x", t(&[2], &[f64::NAN, 1.0])).unwrap();
    let msg = anomaly_text(s.exp(x).unwrap_err());
    assert!(msg.contains("already holds NaN at element 0"), "{msg}");
    assert!(msg.contains("'x'"), "{msg}");
}

#[test]
fn backward_masked_sqrt_is_diagnosed_as_the_masked_branch_trap() {
    let mut s = Session::<f64>::new();
    s.set_detect_anomaly(true);
    let x = s.parameter("x", t(&[2], &[0.0, 4.0])).unwrap();
    let root = s.sqrt(x).unwrap();
    s.set_name(root, "root").unwrap();
    let zero = s.constant(t(&[2], &[0.0, 0.0]));
    let mask = s.gt(x, 0.0).unwrap();
    let y = s.where_(mask, root, zero).unwrap();
    let l = s.sum(y).unwrap();
    let msg = anomaly_text(s.backward(l).unwrap_err());
    assert!(
        msg.contains("anomaly in backward: node 1 'root' (sqrt)"),
        "{msg}"
    );
    assert!(msg.contains("NaN at element 0"), "{msg}");
    assert!(msg.contains("parent node 0 'x' (leaf)"), "{msg}");
    assert!(
        msg.contains("zero cotangent met an infinite or NaN local derivative"),
        "{msg}"
    );
    assert!(msg.contains("mask the input of the unsafe branch"), "{msg}");
}

#[test]
fn backward_with_nonzero_cotangent_and_infinite_saved_value() {
    // d(sqrt)/dx at 0 with a non-zero cotangent is +inf: reported, but not as the masked trap.
    let mut s = Session::<f64>::new();
    s.set_detect_anomaly(true);
    let x = s.parameter("x", t(&[1], &[0.0])).unwrap();
    let r = s.sqrt(x).unwrap();
    let l = s.sum(r).unwrap();
    let msg = anomaly_text(s.backward(l).unwrap_err());
    assert!(msg.contains("(sqrt)"), "{msg}");
    assert!(msg.contains("inf at element 0"), "{msg}");
    assert!(!msg.contains("masked-branch"), "{msg}");
}

#[test]
fn without_the_switch_nothing_is_checked_and_finite_runs_pass_with_it() {
    let mut s = Session::<f64>::new();
    let x = s.parameter("x", t(&[1], &[0.0])).unwrap();
    let lg = s.log(x).unwrap();
    assert_eq!(s.value(lg).unwrap().data()[0], f64::NEG_INFINITY);
    s.reset();
    s.set_detect_anomaly(true);
    let x = s.parameter("x", t(&[2], &[1.0, 2.0])).unwrap();
    let y = s.mul(x, x).unwrap();
    let l = s.sum(y).unwrap();
    let g = s.backward(l).unwrap();
    assert_eq!(g.get("x").unwrap().data(), &[2.0, 4.0]);
}
