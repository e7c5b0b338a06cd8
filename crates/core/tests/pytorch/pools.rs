//! max_pool2d and avg_pool2d against PyTorch itself: 400 small random geometries (ceil mode,
//! padding, dilation, count_include_pad, divisor_override) whose output shape, values and input
//! gradient PyTorch 2.15 recorded in `fixtures/pytorch_pools.json` (written by
//! `fixtures/pytorch_pools.py`), including the calls it rejects, which must be errors here too.

use crate::ops_nn_support::{fwd, rejects_like_pytorch, vjp_with_needs};
use serde_json::Value;
use tapegrad_core::ops::nn::{AvgPool2d, MaxPool2d};
use tapegrad_core::{Op, Tensor};

const FIXTURE: &str = include_str!("../fixtures/pytorch_pools.json");

fn pair(case: &Value, key: &str) -> [usize; 2] {
    let v: Vec<usize> = serde_json::from_value(case[key].clone()).unwrap();
    [v[0], v[1]]
}

fn numbers(case: &Value, key: &str) -> Vec<f64> {
    serde_json::from_value(case[key].clone()).unwrap()
}

fn dims(case: &Value, key: &str) -> Vec<usize> {
    serde_json::from_value(case[key].clone()).unwrap()
}

fn op_of(case: &Value) -> Op {
    let (kernel_size, stride, padding) = (
        pair(case, "kernel"),
        pair(case, "stride"),
        pair(case, "padding"),
    );
    let ceil_mode = case["ceil_mode"].as_bool().unwrap();
    match case["kind"].as_str().unwrap() {
        "max" => MaxPool2d {
            kernel_size,
            stride,
            padding,
            dilation: pair(case, "dilation"),
            ceil_mode,
        }
        .into(),
        _ => AvgPool2d {
            kernel_size,
            stride,
            padding,
            ceil_mode,
            count_include_pad: case["count_include_pad"].as_bool().unwrap(),
            divisor_override: case["divisor_override"].as_i64(),
        }
        .into(),
    }
}

/// Max pooling picks and routes values exactly; averages may round differently (PyTorch sums in
/// another order), by a few ulps of numbers below 100.
fn assert_close(op: &Op, what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{op}: {what} length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-12 * w.abs().max(1.0),
            "{op}: {what}[{i}] is {g}, PyTorch {w}"
        );
    }
}

#[test]
fn pools_match_pytorch_on_random_geometries() {
    let fixture: Value = serde_json::from_str(FIXTURE).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 400);
    let (mut computed, mut rejected) = (0, 0);
    for case in cases {
        let op = op_of(case);
        let x = Tensor::new(&dims(case, "input"), numbers(case, "x")).unwrap();
        // PyTorch's errors, and its -inf windows of padding alone (whose backward it gets wrong):
        // both must be errors that name the op.
        let why = match (case.get("error"), case.get("padding_only_window")) {
            (Some(error), _) => Some(error.to_string()),
            (None, Some(_)) => Some("-inf for a window of padding alone".to_string()),
            (None, None) => None,
        };
        if let Some(why) = why {
            rejects_like_pytorch(&op, &[&x], &why);
            rejected += 1;
            continue;
        }
        let y = fwd(&op, &[&x]);
        assert_eq!(y.dims(), dims(case, "output"), "{op} on {:?}", x.dims());
        assert_close(&op, "output", y.data(), &numbers(case, "y"));
        let seed = Tensor::new(y.dims(), numbers(case, "seed")).unwrap();
        let grads = vjp_with_needs(&op, &[&x], &seed, vec![true]);
        let dx = grads[0].as_ref().expect("the input gradient");
        assert_close(&op, "input gradient", dx.data(), &numbers(case, "grad"));
        computed += 1;
    }
    // The fixture covers both outcomes in earnest (see pytorch_pools.py for the mix).
    assert!(
        computed > 200 && rejected > 100,
        "{computed} computed, {rejected} rejected"
    );
}
