//! conv1d and conv2d against PyTorch itself: 300 small random calls (stride, numeric or
//! "same"/"valid" padding, every padding_mode, dilation, groups, bias, batched or unbatched input)
//! whose output shape and values and input, weight and bias gradients PyTorch 2.15 recorded in
//! `fixtures/pytorch_conv.json` (written by `fixtures/pytorch_conv.py`), including the calls it
//! rejects, which must be errors here too; a subset again on a batch big enough for 2 threads.

use crate::ops_nn_support::{fwd, rejects_like_pytorch, vjp_with_needs};
use serde_json::Value;
use tapegrad_core::ops::nn::{Conv1d, Conv2d, NamedPadding, PaddingMode};
use tapegrad_core::{Op, Tensor};
use tapegrad_tensor::kernels::set_num_threads;

const FIXTURE: &str = include_str!("../fixtures/pytorch_conv.json");

fn numbers(case: &Value, key: &str) -> Vec<f64> {
    serde_json::from_value(case[key].clone()).unwrap()
}

fn dims(case: &Value, key: &str) -> Vec<usize> {
    serde_json::from_value(case[key].clone()).unwrap()
}

/// The numeric padding (zeros when the padding is named) and the name, if any.
fn padding_of(case: &Value) -> (Vec<usize>, Option<NamedPadding>) {
    match case["padding"].as_str() {
        Some(name) => (vec![], Some(NamedPadding::parse(name).unwrap())),
        None => (dims(case, "padding"), None),
    }
}

fn op_of(case: &Value) -> Op {
    let (stride, dilation) = (dims(case, "stride"), dims(case, "dilation"));
    let (padding, named_padding) = padding_of(case);
    let groups = case["groups"].as_u64().unwrap() as usize;
    let bias = case["bias"].as_bool().unwrap();
    let padding_mode = PaddingMode::parse(case["padding_mode"].as_str().unwrap()).unwrap();
    match case["kind"].as_str().unwrap() {
        "conv1d" => Conv1d {
            stride: stride[0],
            padding: padding.first().copied().unwrap_or(0),
            dilation: dilation[0],
            groups,
            bias,
            named_padding,
            padding_mode,
        }
        .into(),
        _ => Conv2d {
            stride: [stride[0], stride[1]],
            padding: if padding.is_empty() {
                [0, 0]
            } else {
                [padding[0], padding[1]]
            },
            dilation: [dilation[0], dilation[1]],
            groups,
            bias,
            named_padding,
            padding_mode,
        }
        .into(),
    }
}

/// The call's arguments: input, weight and (when the op has one) bias.
fn arguments(case: &Value) -> Vec<Tensor<f64>> {
    let mut args = vec![
        Tensor::new(&dims(case, "input"), numbers(case, "x")).unwrap(),
        Tensor::new(&dims(case, "weight"), numbers(case, "w")).unwrap(),
    ];
    if case["bias"].as_bool().unwrap() {
        let b = numbers(case, "b");
        args.push(Tensor::new(&[b.len()], b).unwrap());
    }
    args
}

/// Every value is a quarter of a small integer, so every product is a sixteenth and every sum
/// exact in f64: any summation order gives PyTorch's bits. The tolerance only frames the check.
fn assert_close(op: &Op, what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{op}: {what} length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-12 * w.abs().max(1.0),
            "{op}: {what}[{i}] is {g}, PyTorch {w}"
        );
    }
}

/// Output and the three gradients (seeded with `seed`) of `op` at `args`.
fn run(op: &Op, args: &[Tensor<f64>], seed: &[f64]) -> (Tensor<f64>, Vec<Tensor<f64>>) {
    let refs: Vec<&Tensor<f64>> = args.iter().collect();
    let y = fwd(op, &refs);
    let seed = Tensor::new(y.dims(), seed.to_vec()).unwrap();
    let grads = vjp_with_needs(op, &refs, &seed, vec![true; args.len()]);
    let grads = grads
        .into_iter()
        .enumerate()
        .map(|(i, g)| g.unwrap_or_else(|| panic!("{op}: no gradient for argument {i}")))
        .collect();
    (y, grads)
}

#[test]
fn convs_match_pytorch_on_random_calls() {
    let fixture: Value = serde_json::from_str(FIXTURE).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 300);
    let (mut computed, mut rejected) = (0, 0);
    for case in cases {
        let op = op_of(case);
        let args = arguments(case);
        let refs: Vec<&Tensor<f64>> = args.iter().collect();
        if let Some(error) = case.get("error") {
            rejects_like_pytorch(&op, &refs, &error.to_string());
            rejected += 1;
            continue;
        }
        let (y, grads) = run(&op, &args, &numbers(case, "seed"));
        let shapes: Vec<&[usize]> = args.iter().map(|a| a.dims()).collect();
        assert_eq!(y.dims(), dims(case, "output"), "{op} on {shapes:?}");
        assert_close(&op, "output", y.data(), &numbers(case, "y"));
        assert_close(
            &op,
            "input gradient",
            grads[0].data(),
            &numbers(case, "grad_x"),
        );
        assert_close(
            &op,
            "weight gradient",
            grads[1].data(),
            &numbers(case, "grad_w"),
        );
        if case["bias"].as_bool().unwrap() {
            assert_close(
                &op,
                "bias gradient",
                grads[2].data(),
                &numbers(case, "grad_b"),
            );
        }
        computed += 1;
    }
    // The fixture covers both outcomes in earnest (see pytorch_conv.py for the mix).
    assert!(
        computed > 150 && rejected > 60,
        "{computed} computed, {rejected} rejected"
    );
}

/// Multiply-adds per sample of the forward pass: each output element reads `in/groups * taps`.
fn work_per_sample(case: &Value) -> usize {
    let out = dims(case, "output");
    let spatial = dims(case, "weight").len() - 2;
    let per_sample: usize = out[out.len() - spatial - 1..].iter().product();
    per_sample * dims(case, "weight")[1..].iter().product::<usize>()
}

/// The multiple of the fixture's first sample that sample `s` of a tiled batch is: distinct
/// neighbours, so a sample computed into another's place shows.
fn scale_of(s: usize) -> f64 {
    (s % 5) as f64 + 1.0
}

/// `case`'s first sample (an unbatched input is one) repeated `batch` times, sample `s` scaled by
/// `scale_of(s)`.
fn tiled(case: &Value, batch: usize) -> Vec<Tensor<f64>> {
    let mut args = arguments(case);
    // A batched input has the weight's rank.
    let batched = args[0].rank() == args[1].rank();
    let sample_dims = &args[0].dims()[usize::from(batched)..];
    let mut dims = vec![batch];
    dims.extend_from_slice(sample_dims);
    let per_sample: usize = sample_dims.iter().product();
    let sample = &args[0].data()[..per_sample];
    let data = (0..batch).flat_map(|s| sample.iter().map(move |v| v * scale_of(s)));
    args[0] = Tensor::new(&dims, data.collect()).unwrap();
    args
}

/// A big batch is cut into bands of samples, one per thread (the kernels split at 128^3
/// multiply-adds): each fixture geometry of at least 256 multiply-adds per sample, on its first
/// sample repeated (and scaled) until the batch passes that, must give the same bits on 2 threads
/// as on 1, and every sample PyTorch's output for it (the convolution is linear in the input:
/// `k * (y - b) + b`, exact on these values).
#[test]
fn convs_give_the_same_bits_on_two_threads() {
    let fixture: Value = serde_json::from_str(FIXTURE).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    let mut checked = 0;
    for case in cases.iter().filter(|c| c.get("error").is_none()) {
        let work = work_per_sample(case);
        if work < 256 {
            continue;
        }
        let batch = (128 * 128 * 128) / work + 1;
        let op = op_of(case);
        let args = tiled(case, batch);
        let out_dims = fwd(&op, &args.iter().collect::<Vec<_>>()).dims().to_vec();
        let seed: Vec<f64> = (0..out_dims.iter().product::<usize>())
            .map(|i| (i % 7) as f64 - 3.0)
            .collect();
        let bits = |threads| {
            set_num_threads(threads);
            let (y, grads) = run(&op, &args, &seed);
            set_num_threads(1);
            let mut all = vec![y];
            all.extend(grads);
            all.iter()
                .map(|t| t.data().iter().map(|v| v.to_bits()).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        };
        let (one, two) = (bits(1), bits(2));
        for (k, what) in [
            "output",
            "input gradient",
            "weight gradient",
            "bias gradient",
        ]
        .iter()
        .enumerate()
        .take(one.len())
        {
            let first = one[k].iter().zip(&two[k]).position(|(a, b)| a != b);
            assert!(
                first.is_none(),
                "{op} on batch {batch}: {what}[{first:?}] differs on 2 threads"
            );
        }
        let y = numbers(case, "y");
        let per_sample = one[0].len() / batch;
        let channel_len = per_sample / dims(case, "weight")[0];
        let b = match case["bias"].as_bool().unwrap() {
            true => numbers(case, "b"),
            false => vec![0.0; dims(case, "weight")[0]],
        };
        let bias = |i: usize| b[i / channel_len];
        for s in 0..batch {
            let got: Vec<f64> = one[0][s * per_sample..(s + 1) * per_sample]
                .iter()
                .map(|&b| f64::from_bits(b))
                .collect();
            let want: Vec<f64> = (0..per_sample)
                .map(|i| scale_of(s) * (y[i] - bias(i)) + bias(i))
                .collect();
            assert_close(&op, &format!("output of sample {s}"), &got, &want);
        }
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} geometries on two threads");
}
