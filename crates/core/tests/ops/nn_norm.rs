//! layer_norm, batch_norm (training and evaluation) and group_norm: values against the textbook
//! formulas, laws 5 and 6 for every affine/shape variant, the batch-size-1 training error, the
//! running-statistics update and the batch statistics the session hands back.

use crate::ops_nn_support::{fwd, laws, random, rng, t, uniform};
use tapegrad_core::ops::nn::{batch_stats, BatchNorm, GroupNorm, LayerNorm};
use tapegrad_core::ops::Aux;
use tapegrad_core::{Op, OpError, Session, Shape};

fn layer_norm(normalized_shape: &[usize], weight: bool, bias: bool) -> Op {
    LayerNorm {
        normalized_shape: normalized_shape.to_vec(),
        eps: 1e-5,
        weight,
        bias,
    }
    .into()
}

fn batch_norm(training: bool, weight: bool, bias: bool) -> Op {
    BatchNorm {
        weight,
        bias,
        ..BatchNorm::new(training)
    }
    .into()
}

fn group_norm(num_groups: usize, weight: bool, bias: bool) -> Op {
    GroupNorm {
        num_groups,
        eps: 1e-5,
        weight,
        bias,
    }
    .into()
}

fn close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-12, "{a:?} vs {b:?}");
    }
}

#[test]
fn layer_norm_matches_the_formula() {
    // Row [1, 2, 3, 4]: mean 2.5, biased variance 1.25.
    let x = t(&[1, 4], &[1., 2., 3., 4.]);
    let w = t(&[4], &[1., 2., 3., 4.]);
    let b = t(&[4], &[0., 0., 0., 1.]);
    let y = fwd(&layer_norm(&[4], true, true), &[&x, &w, &b]);
    let r = 1.0 / (1.25f64 + 1e-5).sqrt();
    close(
        y.data(),
        &[-1.5 * r, -0.5 * r * 2., 0.5 * r * 3., 1.5 * r * 4. + 1.],
    );
    let out = layer_norm(&[4], false, false).forward(&[&x]).unwrap();
    match out.aux {
        Aux::Tensors(ts) => {
            assert_eq!(ts[0].data(), &[2.5]);
            close(ts[1].data(), &[r]);
        }
        other => panic!("layer_norm left {other:?}"),
    }
}

#[test]
fn layer_norm_laws_for_every_variant() {
    let mut r = rng(11);
    for (dims, normalized) in [
        (vec![3, 5], vec![5]),
        (vec![2, 3, 4], vec![3, 4]),
        (vec![6], vec![6]),
        (vec![2, 3], vec![]),
    ] {
        for (weight, bias) in [(false, false), (true, false), (false, true), (true, true)] {
            let op = layer_norm(&normalized, weight, bias);
            let mut inputs = vec![random(&mut r, &dims)];
            if weight {
                inputs.push(random(&mut r, &normalized));
            }
            if bias {
                inputs.push(random(&mut r, &normalized));
            }
            laws(&op, &inputs, &mut r);
        }
    }
}

#[test]
fn layer_norm_rejects_bad_shapes_and_eps() {
    let x = Shape::new([2, 3]).unwrap();
    let p = Shape::new([3]).unwrap();
    let bad = Shape::new([2]).unwrap();
    assert!(layer_norm(&[2], false, false).output_shape(&[&x]).is_err());
    assert!(layer_norm(&[1, 2, 3], false, false)
        .output_shape(&[&x])
        .is_err());
    let e = layer_norm(&[3], true, true)
        .output_shape(&[&x, &p, &bad])
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("bias must have shape [3], found [2]"),
        "{e}"
    );
    let op: Op = LayerNorm {
        normalized_shape: vec![3],
        eps: -1.0,
        weight: false,
        bias: false,
    }
    .into();
    assert!(op.output_shape(&[&x]).is_err());
}

#[test]
fn batch_norm_training_matches_the_formula() {
    // Channel 0 sees 1, 3 (mean 2, var 1); channel 1 sees 10, 10 (mean 10, var 0).
    let x = t(&[2, 2], &[1., 10., 3., 10.]);
    let op = BatchNorm {
        eps: 0.0,
        ..BatchNorm::new(true)
    };
    let w = t(&[2], &[2., 5.]);
    let b = t(&[2], &[0.5, 7.]);
    let out = Op::from(BatchNorm {
        eps: 1e-5,
        ..op.clone()
    })
    .forward(&[&x, &w, &b])
    .unwrap();
    let r0 = 1.0 / (1.0f64 + 1e-5).sqrt();
    close(out.value.data(), &[-2. * r0 + 0.5, 7., 2. * r0 + 0.5, 7.]);
    let stats = op.stats_from_aux(&out.aux, x.shape()).unwrap();
    assert_eq!(stats.mean.data(), &[2., 10.]);
    assert_eq!(stats.var.data(), &[1., 0.]);
    assert_eq!(stats.count, 2);
    assert_eq!(stats, batch_stats(&x).unwrap());
}

#[test]
fn batch_norm_at_batch_size_one_in_training_is_an_error() {
    let x = Shape::new([1, 3]).unwrap();
    let e = batch_norm(true, false, false)
        .output_shape(&[&x])
        .unwrap_err();
    assert_eq!(
        e,
        OpError::Invalid {
            op: "batch_norm",
            message: "expected more than 1 value per channel when training, got input size [1, 3]"
                .into()
        }
    );
    // One sample with several positions per channel is fine, and evaluation mode is fine too.
    let x4 = Shape::new([1, 3, 2, 2]).unwrap();
    assert!(batch_norm(true, false, false).output_shape(&[&x4]).is_ok());
    let c = Shape::new([3]).unwrap();
    assert!(batch_norm(false, false, false)
        .output_shape(&[&x, &c, &c])
        .is_ok());
}

#[test]
fn batch_norm_training_laws_for_every_variant() {
    let mut r = rng(12);
    for dims in [vec![4, 3], vec![2, 3, 5], vec![2, 2, 3, 3], vec![1, 2, 4]] {
        for (weight, bias) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut inputs = vec![random(&mut r, &dims)];
            if weight {
                inputs.push(random(&mut r, &[dims[1]]));
            }
            if bias {
                inputs.push(random(&mut r, &[dims[1]]));
            }
            laws(&batch_norm(true, weight, bias), &inputs, &mut r);
        }
    }
}

#[test]
fn batch_norm_evaluation_uses_the_running_statistics() {
    let x = t(&[2, 2], &[1., 10., 3., 12.]);
    let mean = t(&[2], &[1., 10.]);
    let var = t(&[2], &[4., 1.]);
    let op = BatchNorm {
        eps: 0.0,
        ..BatchNorm::new(false)
    };
    let w = t(&[2], &[2., 1.]);
    let b = t(&[2], &[0., 1.]);
    let y = fwd(&op.into(), &[&x, &mean, &var, &w, &b]);
    assert_eq!(y.data(), &[0., 1., 2., 3.]);
    let mut r = rng(13);
    for dims in [vec![3, 2], vec![2, 3, 4], vec![1, 2, 2, 3]] {
        for (weight, bias) in [(false, false), (true, true), (true, false)] {
            let c = dims[1];
            let mut inputs = vec![
                random(&mut r, &dims),
                random(&mut r, &[c]),
                uniform(&mut r, &[c], 0.5, 1.5),
            ];
            if weight {
                inputs.push(random(&mut r, &[c]));
            }
            if bias {
                inputs.push(random(&mut r, &[c]));
            }
            laws(&batch_norm(false, weight, bias), &inputs, &mut r);
        }
    }
    // Checked evaluation rejects a running variance that makes var + eps non-positive.
    let bad = t(&[2], &[1., -1.]);
    let e = Op::from(BatchNorm::new(false))
        .check_domain(&[&x, &mean, &bad, &w, &b])
        .unwrap_err();
    assert!(matches!(e, OpError::Domain { index: 1, .. }), "{e}");
}

#[test]
fn running_update_follows_pytorch() {
    let op = BatchNorm::new(true);
    let x = t(&[2, 1], &[1., 3.]);
    let stats = batch_stats(&x).unwrap();
    let (m, v) = op
        .running_update(&t(&[1], &[0.]), &t(&[1], &[1.]), &stats)
        .unwrap();
    // mean' = 0.9 * 0 + 0.1 * 2; var' = 0.9 * 1 + 0.1 * (unbiased 2).
    close(m.data(), &[0.2]);
    close(v.data(), &[0.9 + 0.2]);
    assert!(op
        .running_update(&t(&[2], &[0., 0.]), &t(&[1], &[1.]), &stats)
        .is_err());
}

#[test]
fn session_batch_norm_returns_the_batch_statistics_with_and_without_grad() {
    let mut r = rng(14);
    let xv = random(&mut r, &[4, 3, 2]);
    let expected = batch_stats(&xv).unwrap();
    let mut s = Session::<f64>::new();
    let x = s.variable("x", xv.clone());
    let w = s.parameter("w", random(&mut r, &[3])).unwrap();
    let (y, stats) = s.batch_norm_train(x, Some(w), None, 0.1, 1e-5).unwrap();
    assert_eq!(stats, expected);
    let l = s.sum(y).unwrap();
    // The sum of a batch-normalised tensor does not depend on the input: its gradient is ~0.
    let g = s.backward_all(l, &t(&[], &[1.])).unwrap();
    assert!(g[x.id()].data().iter().all(|v| v.abs() < 1e-12));
    let (_, stats) = s
        .no_grad(|s| s.batch_norm_train(x, Some(w), None, 0.1, 1e-5))
        .unwrap();
    assert_eq!(stats, expected);
}

#[test]
fn group_norm_values_and_laws() {
    // Two groups of one channel: each channel is normalised on its own.
    let x = t(&[1, 2, 2], &[1., 3., 10., 30.]);
    let y = fwd(&group_norm(2, false, false), &[&x]);
    let r1 = 1.0 / (1.0f64 + 1e-5).sqrt();
    let r2 = 1.0 / (100.0f64 + 1e-5).sqrt();
    close(y.data(), &[-r1, r1, -10. * r2, 10. * r2]);
    let mut r = rng(15);
    for (dims, groups) in [
        (vec![2, 4, 3], 2),
        (vec![2, 6, 2, 2], 3),
        (vec![3, 4], 4),
        (vec![1, 4, 5], 1),
    ] {
        for (weight, bias) in [(false, false), (true, true), (false, true)] {
            let mut inputs = vec![random(&mut r, &dims)];
            if weight {
                inputs.push(random(&mut r, &[dims[1]]));
            }
            if bias {
                inputs.push(random(&mut r, &[dims[1]]));
            }
            laws(&group_norm(groups, weight, bias), &inputs, &mut r);
        }
    }
    let x = Shape::new([2, 6]).unwrap();
    for groups in [0, 4] {
        let e = group_norm(groups, false, false)
            .output_shape(&[&x])
            .unwrap_err();
        assert!(e.to_string().contains("num_groups"), "{e}");
    }
}
