//! cross_entropy and nll_loss with PyTorch's options (class `weight`, `ignore_index`,
//! `label_smoothing`) and binary_cross_entropy_with_logits with `pos_weight`: forward values
//! against the definition written out term by term here, the
//! per-op laws (finite differences, adjoint, needs, f32 against f64) on random options, the edge
//! cases (every sample ignored, an ignored label out of range, no class), the errors, and the
//! session methods. PyTorch's own answers are checked in pytorch_ops.rs.

use crate::ops_nn_support::{fwd, labels_with_options, laws, rng, uniform, vjp_with_needs};
use proptest::prelude::*;
use rand::Rng;
use std::sync::Arc;
use tapegrad_core::ops::loss::{BinaryCrossEntropyWithLogits, CrossEntropy, NllLoss};
use tapegrad_core::ops::{ClassLossOptions, LossOp, Reduction};
use tapegrad_core::{Op, Session, Tensor};

const REDUCTIONS: [Reduction; 3] = [Reduction::None, Reduction::Mean, Reduction::Sum];

fn cross_entropy(
    targets: &[i64],
    reduction: Reduction,
    weight: Option<Vec<f64>>,
    ignore_index: Option<i64>,
    label_smoothing: f64,
) -> Op {
    Op::Loss(LossOp::CrossEntropy(CrossEntropy {
        targets: Arc::new(targets.to_vec()),
        reduction,
        weight: weight.map(Arc::new),
        ignore_index,
        label_smoothing,
    }))
}

fn nll(
    targets: &[i64],
    reduction: Reduction,
    weight: Option<Vec<f64>>,
    ignore_index: Option<i64>,
) -> Op {
    Op::Loss(LossOp::NllLoss(NllLoss {
        targets: Arc::new(targets.to_vec()),
        reduction,
        weight: weight.map(Arc::new),
        ignore_index,
    }))
}

/// One call's options.
#[derive(Clone)]
struct Case {
    targets: Vec<i64>,
    classes: usize,
    weight: Option<Vec<f64>>,
    ignore_index: Option<i64>,
    smoothing: f64,
    reduction: Reduction,
}

impl Case {
    fn cross_entropy(&self) -> Op {
        cross_entropy(
            &self.targets,
            self.reduction,
            self.weight.clone(),
            self.ignore_index,
            self.smoothing,
        )
    }

    fn nll(&self) -> Op {
        nll(
            &self.targets,
            self.reduction,
            self.weight.clone(),
            self.ignore_index,
        )
    }

    /// PyTorch's definition, written out: per sample `n` with label `y` not ignored,
    /// `(1 - e) w_y (-lp_y) + (e / C) sum_c w_c (-lp_c)` (`lp` the row's log-softmax for
    /// cross_entropy, the row itself for nll_loss, where `e` must be 0); `mean` divides the sum
    /// by the counted samples' `w_y`.
    fn definition(&self, x: &[f64], log_softmax: bool) -> Vec<f64> {
        let c = self.classes;
        let w = |k: usize| self.weight.as_ref().map_or(1.0, |w| w[k]);
        let mut per = Vec::new();
        let mut total_weight = 0.0;
        for (n, &y) in self.targets.iter().enumerate() {
            if Some(y) == self.ignore_index {
                per.push(0.0);
                continue;
            }
            let row = &x[n * c..(n + 1) * c];
            let lp: Vec<f64> = if log_softmax {
                let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
                row.iter().map(|v| v - lse).collect()
            } else {
                row.to_vec()
            };
            let smooth: f64 = (0..c).map(|k| w(k) * -lp[k]).sum();
            let e = self.smoothing;
            let y = usize::try_from(y).expect("a counted label is a class");
            per.push((1.0 - e) * w(y) * -lp[y] + e / c as f64 * smooth);
            total_weight += w(y);
        }
        match self.reduction {
            Reduction::None => per,
            Reduction::Sum => vec![per.iter().sum()],
            Reduction::Mean => vec![per.iter().sum::<f64>() / total_weight],
        }
    }
}

fn close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        let ok = (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-12 * w.abs().max(1.0);
        assert!(ok, "{what}: got {got:?}, want {want:?}");
    }
}

/// Random options: weights in [0.25, 2) or none, an ignored label in range, out of range or none
/// (with some samples carrying it, but at least one counted), smoothing 0, 1 or in between.
fn random_case(seed: u64) -> Case {
    let mut r = rng(seed);
    let c = r.random_range(1..=5);
    let n = r.random_range(1..=5);
    let (targets, weight, ignore_index) = labels_with_options(&mut r, c, n);
    Case {
        targets,
        classes: c,
        weight,
        ignore_index,
        smoothing: [0.0, 0.1, 0.5, 1.0][r.random_range(0..4)],
        reduction: REDUCTIONS[r.random_range(0..3)],
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn cross_entropy_with_options_is_the_definition_and_obeys_the_laws(seed in any::<u64>()) {
        let case = random_case(seed);
        let mut r = rng(seed ^ 1);
        let x = uniform(&mut r, &[case.targets.len(), case.classes], -3.0, 3.0);
        let op = case.cross_entropy();
        close(fwd(&op, &[&x]).data(), &case.definition(x.data(), true), &op.to_string());
        laws(&op, &[x], &mut r);
    }

    #[test]
    fn nll_loss_with_options_is_the_definition_and_obeys_the_laws(seed in any::<u64>()) {
        let case = Case { smoothing: 0.0, ..random_case(seed) };
        let mut r = rng(seed ^ 2);
        let x = uniform(&mut r, &[case.targets.len(), case.classes], -3.0, 3.0);
        let op = case.nll();
        close(fwd(&op, &[&x]).data(), &case.definition(x.data(), false), &op.to_string());
        laws(&op, &[x], &mut r);
    }
}

#[test]
fn options_at_their_defaults_give_the_plain_loss_bit_for_bit() {
    let mut r = rng(7);
    let x = uniform(&mut r, &[4, 3], -3.0, 3.0);
    let targets = [0, 2, 1, 2];
    // Unit weights and an ignored label nobody carries take the options path; the plain loss
    // takes the fused kernel path. Same formula, same order: the same bits.
    for reduction in REDUCTIONS {
        let plain = cross_entropy(&targets, reduction, None, None, 0.0);
        let options = cross_entropy(&targets, reduction, Some(vec![1.0; 3]), Some(9), 0.0);
        let seed = uniform(&mut r, fwd(&plain, &[&x]).dims(), -1.0, 1.0);
        let bits = |op: &Op| {
            let y = fwd(op, &[&x]);
            let g = vjp_with_needs(op, &[&x], &seed, vec![true])[0]
                .clone()
                .unwrap();
            (y.data().to_vec(), g.data().to_vec())
        };
        assert_eq!(bits(&plain), bits(&options), "{options}");
        let plain = nll(&targets, reduction, None, None);
        let options = nll(&targets, reduction, Some(vec![1.0; 3]), Some(9));
        assert_eq!(bits(&plain), bits(&options), "{options}");
    }
}

#[test]
fn every_sample_ignored_gives_nan_for_mean_zero_otherwise_and_no_gradient() {
    let x = Tensor::new(&[2, 3], vec![0.5, -1.0, 2.0, 0.0, 1.5, -0.5]).unwrap();
    for op in [
        cross_entropy(
            &[4, 4],
            Reduction::Mean,
            Some(vec![1.0, 2.0, 3.0]),
            Some(4),
            0.3,
        ),
        nll(&[1, 1], Reduction::Mean, None, Some(1)),
    ] {
        // PyTorch: the mean over a total weight of 0 is 0/0.
        assert!(fwd(&op, &[&x]).data()[0].is_nan(), "{op}");
        let g = vjp_with_needs(&op, &[&x], &Tensor::scalar(1.0), vec![true]);
        assert_eq!(g[0].as_ref().unwrap().data(), &[0.0; 6], "{op}");
        let out = op.forward(&[&x]).unwrap();
        let tangent = op.jvp(&[&x], &out, &[&x]).unwrap();
        assert_eq!(
            tangent.data(),
            &[0.0],
            "{op}: the constant NaN has tangent 0"
        );
    }
    for reduction in [Reduction::Sum, Reduction::None] {
        let op = cross_entropy(&[4, 0], reduction, None, Some(4), 0.5);
        let y = fwd(&op, &[&x]);
        if reduction == Reduction::None {
            assert_eq!(y.data()[0], 0.0, "{op}: an ignored sample's loss is 0");
        }
        let g = vjp_with_needs(
            &op,
            &[&x],
            &Tensor::new(y.dims(), vec![1.0; y.numel()]).unwrap(),
            vec![true],
        );
        assert_eq!(&g[0].as_ref().unwrap().data()[..3], &[0.0; 3], "{op}");
    }
}

#[test]
fn an_input_without_classes_takes_only_ignored_labels() {
    let x = Tensor::<f64>::new(&[2, 0], vec![]).unwrap();
    let op = cross_entropy(&[5, 5], Reduction::Sum, None, Some(5), 0.0);
    assert_eq!(fwd(&op, &[&x]).data(), &[0.0]);
    let err = cross_entropy(&[5, 0], Reduction::Sum, None, Some(5), 0.0)
        .forward(&[&x])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cross_entropy") && err.contains("class label"),
        "{err}"
    );
}

#[test]
fn bad_options_are_errors_naming_the_op_and_the_values() {
    let x = Tensor::<f64>::new(&[2, 3], vec![0.0; 6]).unwrap();
    let cases = [
        (
            cross_entropy(&[0, 1], Reduction::Mean, Some(vec![1.0; 4]), None, 0.0),
            vec!["cross_entropy", "3 classes", "4 entries"],
        ),
        (
            nll(&[0, 1], Reduction::Mean, Some(vec![1.0; 2]), None),
            vec!["nll_loss", "3 classes", "2 entries"],
        ),
        (
            cross_entropy(&[0, 1], Reduction::Mean, None, None, 1.5),
            vec!["cross_entropy", "label_smoothing", "1.5"],
        ),
        (
            // PyTorch takes a negative smoothing as none; here it is an error.
            cross_entropy(&[0, 1], Reduction::Mean, None, None, -0.1),
            vec!["cross_entropy", "label_smoothing", "-0.1"],
        ),
        (
            cross_entropy(&[0, 1], Reduction::Mean, None, None, f64::NAN),
            vec!["cross_entropy", "label_smoothing", "NaN"],
        ),
        (
            // Only the ignored label may be out of range.
            cross_entropy(&[7, 3], Reduction::Mean, None, Some(7), 0.0),
            vec!["cross_entropy", "class label", "3"],
        ),
    ];
    for (op, words) in cases {
        let err = op.forward(&[&x]).unwrap_err().to_string();
        for w in words {
            assert!(err.contains(w), "{op}: '{err}' does not say '{w}'");
        }
    }
}

#[test]
fn session_methods_take_pytorch_keyword_arguments() {
    let mut r = rng(3);
    let x = uniform(&mut r, &[3, 4], -2.0, 2.0);
    let options = ClassLossOptions {
        reduction: Reduction::Sum,
        weight: Some(vec![0.5, 1.0, 2.0, 1.5]),
        ignore_index: Some(1),
        label_smoothing: 0.2,
    };
    let targets = [0, 1, 3];
    let mut case = Case {
        targets: targets.to_vec(),
        classes: 4,
        weight: options.weight.clone(),
        ignore_index: Some(1),
        smoothing: 0.2,
        reduction: Reduction::Sum,
    };
    let mut s = Session::<f64>::new();
    let p = s.parameter("x", x.clone()).unwrap();
    let loss = s.cross_entropy_with(p, &targets, &options).unwrap();
    let want = case.definition(x.data(), true);
    close(s.value(loss).unwrap().data(), &want, "cross_entropy_with");
    let grads = s.backward(loss).unwrap();
    let g = grads.get("x").unwrap();
    assert_eq!(
        &g.data()[4..8],
        &[0.0; 4],
        "the ignored sample gets no gradient"
    );

    let mut s = Session::<f64>::new();
    let p = s.parameter("x", x.clone()).unwrap();
    let err = s
        .nll_loss_with(p, &targets, &options)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("nll_loss") && err.contains("label_smoothing"),
        "{err}"
    );
    let plain = ClassLossOptions {
        label_smoothing: 0.0,
        ..options.clone()
    };
    let loss = s.nll_loss_with(p, &targets, &plain).unwrap();
    case.smoothing = 0.0;
    let want = case.definition(x.data(), false);
    close(s.value(loss).unwrap().data(), &want, "nll_loss_with");
}

/// PyTorch's definition of binary_cross_entropy_with_logits with `pos_weight`, per element:
/// `-(p y log(sigmoid(x)) + (1 - y) log(1 - sigmoid(x)))`.
fn bce_definition(x: &[f64], y: &[f64], pos_weight: &[f64], reduction: Reduction) -> Vec<f64> {
    let per: Vec<f64> = x
        .iter()
        .zip(y)
        .enumerate()
        .map(|(i, (&x, &y))| {
            let p = pos_weight[i % pos_weight.len()];
            let s = 1.0 / (1.0 + (-x).exp());
            -(p * y * s.ln() + (1.0 - y) * (1.0 - s).ln())
        })
        .collect();
    match reduction {
        Reduction::None => per,
        Reduction::Sum => vec![per.iter().sum()],
        Reduction::Mean => vec![per.iter().sum::<f64>() / per.len() as f64],
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn bce_with_pos_weight_is_the_definition_and_obeys_the_laws(seed in any::<u64>()) {
        let mut r = rng(seed);
        let dims: Vec<usize> = (0..r.random_range(1..=3)).map(|_| r.random_range(1..=4)).collect();
        let last = *dims.last().unwrap();
        let len = if r.random_bool(0.5) { last } else { 1 };
        let pos_weight: Vec<f64> = (0..len).map(|_| r.random_range(0.25..4.0)).collect();
        let reduction = REDUCTIONS[r.random_range(0..3)];
        let x = uniform(&mut r, &dims, -3.0, 3.0);
        let y = uniform(&mut r, &dims, 0.0, 1.0);
        let op = Op::Loss(LossOp::BinaryCrossEntropyWithLogits(BinaryCrossEntropyWithLogits {
            reduction,
            pos_weight: Some(Arc::new(vector(pos_weight.clone()))),
            weight: None,
        }));
        let want = bce_definition(x.data(), y.data(), &pos_weight, reduction);
        close(fwd(&op, &[&x, &y]).data(), &want, &op.to_string());
        laws(&op, &[x, y], &mut r);
    }
}

#[test]
fn pos_weight_stays_finite_for_large_logits_and_checks_its_length() {
    let x = Tensor::new(&[1, 3], vec![-800.0, 0.0, 800.0]).unwrap();
    let y = Tensor::new(&[1, 3], vec![1.0, 0.5, 0.0]).unwrap();
    let op = Op::Loss(LossOp::BinaryCrossEntropyWithLogits(
        BinaryCrossEntropyWithLogits {
            reduction: Reduction::None,
            pos_weight: Some(Arc::new(vector(vec![2.0, 3.0, 0.5]))),
            weight: None,
        },
    ));
    // log(1 + exp(800)) = 800 to double precision: 2 * 800, 3 * ln 2 / 2 + ln 2 / 2, 800.
    let ln2 = std::f64::consts::LN_2;
    close(
        fwd(&op, &[&x, &y]).data(),
        &[1600.0, 2.0 * ln2, 800.0],
        "large logits",
    );
    let g = vjp_with_needs(
        &op,
        &[&x, &y],
        &Tensor::new(&[1, 3], vec![1.0; 3]).unwrap(),
        vec![true, true],
    );
    assert!(g
        .iter()
        .all(|g| g.as_ref().unwrap().data().iter().all(|v| v.is_finite())));

    let two = Op::Loss(LossOp::BinaryCrossEntropyWithLogits(
        BinaryCrossEntropyWithLogits {
            reduction: Reduction::Mean,
            pos_weight: Some(Arc::new(vector(vec![1.0, 2.0]))),
            weight: None,
        },
    ));
    let err = two.forward(&[&x, &y]).unwrap_err().to_string();
    for w in [
        "binary_cross_entropy_with_logits",
        "pos_weight",
        "(3 for shape [1, 3])",
        "2 entries",
    ] {
        assert!(err.contains(w), "'{err}' does not say '{w}'");
    }
    let scalar = Tensor::scalar(0.5);
    let err = two.forward(&[&scalar, &scalar]).unwrap_err().to_string();
    assert!(err.contains("pos_weight") && err.contains("0-d"), "{err}");
}

#[test]
fn session_bce_takes_pos_weight() {
    let mut r = rng(5);
    let x = uniform(&mut r, &[2, 3], -2.0, 2.0);
    let y = uniform(&mut r, &[2, 3], 0.0, 1.0);
    let mut s = Session::<f64>::new();
    let px = s.parameter("x", x.clone()).unwrap();
    let py = s.input(y.clone());
    let w = [0.5, 1.0, 3.0];
    let loss = s
        .binary_cross_entropy_with_logits_with(px, py, Reduction::Sum, Some(&vector(w.to_vec())))
        .unwrap();
    let want = bce_definition(x.data(), y.data(), &w, Reduction::Sum);
    close(s.value(loss).unwrap().data(), &want, "session bce");
}

/// A one-axis tensor of `values` (a pos_weight of the usual form).
fn vector(values: Vec<f64>) -> Tensor<f64> {
    let n = values.len();
    Tensor::new(&[n], values).unwrap()
}

// ---------------------------------------------------------------------------------------------
// A negative ignore_index: PyTorch's default -100 on padding labels.

#[test]
fn a_negative_ignore_index_ignores_its_padding_labels() {
    let mut r = rng(17);
    let x = uniform(&mut r, &[5, 3], -3.0, 3.0);
    let padded = [2, -100, 0, -100, 1];
    for (weight, smoothing) in [(None, 0.0), (Some(vec![0.5, 1.0, 2.0]), 0.2)] {
        for reduction in REDUCTIONS {
            let case = Case {
                targets: padded.to_vec(),
                classes: 3,
                weight: weight.clone(),
                ignore_index: Some(-100),
                smoothing,
                reduction,
            };
            let ops = [
                case.cross_entropy(),
                Case {
                    smoothing: 0.0,
                    ..case.clone()
                }
                .nll(),
            ];
            for (op, log_softmax) in ops.iter().zip([true, false]) {
                let want = Case {
                    smoothing: if log_softmax { smoothing } else { 0.0 },
                    ..case.clone()
                }
                .definition(x.data(), log_softmax);
                close(fwd(op, &[&x]).data(), &want, &op.to_string());
                laws(op, std::slice::from_ref(&x), &mut r);
            }
            // Which value marks the padding changes nothing: the same bits as a label beyond
            // the classes.
            let beyond = Case {
                targets: padded.iter().map(|&t| if t < 0 { 7 } else { t }).collect(),
                ignore_index: Some(7),
                ..case.clone()
            };
            let seed = uniform(&mut r, fwd(&ops[0], &[&x]).dims(), -1.0, 1.0);
            for (op, other) in ops.iter().zip([
                beyond.cross_entropy(),
                Case {
                    smoothing: 0.0,
                    ..beyond.clone()
                }
                .nll(),
            ]) {
                assert_eq!(fwd(op, &[&x]).data(), fwd(&other, &[&x]).data(), "{op}");
                let g = |o: &Op| {
                    vjp_with_needs(o, &[&x], &seed, vec![true])[0]
                        .clone()
                        .unwrap()
                };
                let (g, want) = (g(op), g(&other));
                assert_eq!(g.data(), want.data(), "{op}");
                assert_eq!(
                    &g.data()[3..6],
                    &[0.0; 3],
                    "{op}: a padding row has no gradient"
                );
            }
        }
    }
}

#[test]
fn a_negative_label_that_is_not_ignored_is_an_error_naming_it() {
    let x = Tensor::<f64>::new(&[3, 4], vec![0.0; 12]).unwrap();
    let cases = [
        (
            cross_entropy(&[1, -3, 2], Reduction::Mean, None, Some(-100), 0.0),
            "-3",
            "-100",
        ),
        (
            nll(&[1, -100, 2], Reduction::Sum, None, Some(-1)),
            "-100",
            "-1",
        ),
        // No ignore_index: the message says what PyTorch's default would have been.
        (
            cross_entropy(&[-100, 0, 0], Reduction::Mean, None, None, 0.0),
            "-100",
            "default",
        ),
        (
            nll(&[0, 0, -5], Reduction::None, Some(vec![1.0; 4]), None),
            "-5",
            "default",
        ),
    ];
    for (op, label, ignore) in cases {
        let err = op.forward(&[&x]).unwrap_err().to_string();
        for w in [op.name(), "class label", label, ignore] {
            assert!(err.contains(w), "{op}: '{err}' does not say '{w}'");
        }
    }
}

#[test]
fn session_methods_take_signed_labels_and_pytorchs_default_ignore_index() {
    let mut r = rng(19);
    let x = uniform(&mut r, &[4, 3], -2.0, 2.0);
    let options = ClassLossOptions {
        ignore_index: Some(-100),
        ..ClassLossOptions::default()
    };
    let labels: [i64; 4] = [-100, 2, 0, -100];
    let mut s = Session::<f64>::new();
    let p = s.parameter("x", x.clone()).unwrap();
    let loss = s.cross_entropy_with(p, &labels, &options).unwrap();
    let want = Case {
        targets: labels.to_vec(),
        classes: 3,
        weight: None,
        ignore_index: Some(-100),
        smoothing: 0.0,
        reduction: Reduction::Mean,
    };
    close(
        s.value(loss).unwrap().data(),
        &want.definition(x.data(), true),
        "cross_entropy_with",
    );
    let g = s.backward(loss).unwrap();
    let g = g.get("x").unwrap();
    assert_eq!(&g.data()[..3], &[0.0; 3]);
    assert_eq!(&g.data()[9..], &[0.0; 3]);
    let loss = s.nll_loss_with(p, &labels, &options).unwrap();
    close(
        s.value(loss).unwrap().data(),
        &want.definition(x.data(), false),
        "nll_loss_with",
    );
    // Labels of any integer type give one loss.
    let unsigned: [usize; 2] = [2, 0];
    let a = s.cross_entropy(p, &unsigned[..]).unwrap_err();
    assert!(a.to_string().contains("class labels"), "{a}");
    let y = s.slice(p, 0, 1, 3, 1).unwrap();
    let a = s.cross_entropy(y, &unsigned).unwrap();
    let b = s.cross_entropy(y, &[2i32, 0]).unwrap();
    assert_eq!(s.value(a).unwrap().data(), s.value(b).unwrap().data());
    // The plain methods ignore nothing: a padding label is an error naming it.
    let err = s.cross_entropy(p, &labels).unwrap_err().to_string();
    assert!(
        err.contains("-100") && err.contains("cross_entropy"),
        "{err}"
    );
}
