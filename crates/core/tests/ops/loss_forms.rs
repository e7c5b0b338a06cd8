//! The loss forms beyond (N, C) class labels: cross_entropy and nll_loss on (N, C, d1, ..., dk)
//! inputs with one class label per position, cross_entropy with probability targets
//! (cross_entropy_probs) and binary_cross_entropy_with_logits with a per-element `weight` and
//! with a `pos_weight` of any shape that broadcasts into the input's ([C, 1, 1] and so on). Each
//! form is checked against PyTorch's definition
//! written out term by term here (indexing the input where PyTorch does), the per-op laws, its
//! edge cases (zero-size dimensions, every position ignored, C = 0 or 1), its errors, the session
//! methods and the graph-file round trip. PyTorch's own answers are checked in pytorch_ops.rs.

use crate::ops_nn_support::{fwd, labels_with_options, laws, rng, uniform, vjp_with_needs};
use proptest::prelude::*;
use rand::Rng;
use std::sync::Arc;
use tapegrad_core::graph::file::{parse_op, write_attrs};
use tapegrad_core::ops::loss::{
    BinaryCrossEntropyWithLogits, CrossEntropy, CrossEntropyProbs, NllLoss,
};
use tapegrad_core::ops::{ClassLossOptions, LossOp, Reduction};
use tapegrad_core::{Op, Session, Tensor};

const REDUCTIONS: [Reduction; 3] = [Reduction::None, Reduction::Mean, Reduction::Sum];

fn close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        let ok = (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-12 * w.abs().max(1.0);
        assert!(ok, "{what}: got {got:?}, want {want:?}");
    }
}

/// The op's attributes written to a graph file's form and read back give the same op.
fn round_trips(op: &Op, args: usize) {
    let entries = write_attrs(op).unwrap();
    let attrs: serde_json::Map<String, serde_json::Value> = entries
        .into_iter()
        .map(|(k, v)| (k.to_string(), serde_json::from_str(&v).unwrap()))
        .collect();
    let back = parse_op(op.name(), args, attrs).unwrap_or_else(|e| panic!("{op}: {e}"));
    assert_eq!(&back, op, "{op}");
}

// ---------------------------------------------------------------------------------------------
// Class labels per position: (N, C, d1, ..., dk).

/// One spatial call: the input's dims (N, C, d1, ..., dk), one label per position and options.
#[derive(Clone, Debug)]
struct Spatial {
    dims: Vec<usize>,
    targets: Vec<i64>,
    weight: Option<Vec<f64>>,
    ignore_index: Option<i64>,
    smoothing: f64,
    reduction: Reduction,
}

impl Spatial {
    fn classes(&self) -> usize {
        self.dims[1]
    }

    fn positions(&self) -> usize {
        self.dims[2..].iter().product()
    }

    fn cross_entropy(&self) -> Op {
        Op::Loss(LossOp::CrossEntropy(CrossEntropy {
            targets: Arc::new(self.targets.clone()),
            reduction: self.reduction,
            weight: self.weight.clone().map(Arc::new),
            ignore_index: self.ignore_index,
            label_smoothing: self.smoothing,
        }))
    }

    fn nll(&self) -> Op {
        Op::Loss(LossOp::NllLoss(NllLoss {
            targets: Arc::new(self.targets.clone()),
            reduction: self.reduction,
            weight: self.weight.clone().map(Arc::new),
            ignore_index: self.ignore_index,
        }))
    }

    /// PyTorch's definition, written out on the input as laid out: for sample `b` and position
    /// `s` with label `y` not ignored, `lp_k = log_softmax(x[b, :, s])_k` (the input itself for
    /// nll_loss) and the loss `(1 - e) w_y (-lp_y) + (e / C) sum_k w_k (-lp_k)`; `none` has shape
    /// (N, d1, ..., dk), `mean` divides the sum by the counted positions' `w_y`.
    fn definition(&self, x: &[f64], log_softmax: bool) -> Vec<f64> {
        let (c, p) = (self.classes(), self.positions());
        let w = |k: usize| self.weight.as_ref().map_or(1.0, |w| w[k]);
        let at = |b: usize, k: usize, s: usize| x[(b * c + k) * p + s];
        let mut per = Vec::new();
        let mut total_weight = 0.0;
        for b in 0..self.dims[0] {
            for s in 0..p {
                let y = self.targets[b * p + s];
                if Some(y) == self.ignore_index {
                    per.push(0.0);
                    continue;
                }
                let lp: Vec<f64> = if log_softmax {
                    let m = (0..c)
                        .map(|k| at(b, k, s))
                        .fold(f64::NEG_INFINITY, f64::max);
                    let lse = m + (0..c).map(|k| (at(b, k, s) - m).exp()).sum::<f64>().ln();
                    (0..c).map(|k| at(b, k, s) - lse).collect()
                } else {
                    (0..c).map(|k| at(b, k, s)).collect()
                };
                let smooth: f64 = (0..c).map(|k| w(k) * -lp[k]).sum();
                let e = self.smoothing;
                let y = usize::try_from(y).expect("a counted label is a class");
                per.push((1.0 - e) * w(y) * -lp[y] + e / c as f64 * smooth);
                total_weight += w(y);
            }
        }
        match self.reduction {
            Reduction::None => per,
            Reduction::Sum => vec![per.iter().sum()],
            Reduction::Mean => vec![per.iter().sum::<f64>() / total_weight],
        }
    }

    /// The same call on the (N·d1···dk, C) rows: the input with its class axis moved last.
    fn as_rows(&self, x: &Tensor<f64>) -> (Spatial, Tensor<f64>) {
        let rows = to_rows(x, self.dims[0], self.classes(), self.positions());
        let call = Spatial {
            dims: rows.dims().to_vec(),
            ..self.clone()
        };
        (call, rows)
    }
}

/// (N, C, P) data as (N·P, C) rows.
fn to_rows(x: &Tensor<f64>, n: usize, c: usize, p: usize) -> Tensor<f64> {
    let mut rows = vec![0.0; n * c * p];
    for b in 0..n {
        for k in 0..c {
            for s in 0..p {
                rows[(b * p + s) * c + k] = x.data()[(b * c + k) * p + s];
            }
        }
    }
    Tensor::new(&[n * p, c], rows).unwrap()
}

/// Random spatial options: k = 1 to 3 trailing dims, weights or none, an ignored label in or out
/// of range carried by some positions (the first kept counted), smoothing 0, 0.1, 0.5 or 1.
fn random_spatial(seed: u64) -> Spatial {
    let mut r = rng(seed);
    let c = r.random_range(1..=4);
    let mut dims = vec![r.random_range(1..=3), c];
    for _ in 0..r.random_range(1..=3) {
        dims.push(r.random_range(1..=3));
    }
    let count: usize = dims[0] * dims[2..].iter().product::<usize>();
    let (targets, weight, ignore_index) = labels_with_options(&mut r, c, count);
    Spatial {
        dims,
        targets,
        weight,
        ignore_index,
        smoothing: [0.0, 0.1, 0.5, 1.0][r.random_range(0..4)],
        reduction: REDUCTIONS[r.random_range(0..3)],
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn spatial_cross_entropy_is_the_definition_and_obeys_the_laws(seed in any::<u64>()) {
        let call = random_spatial(seed);
        let mut r = rng(seed ^ 1);
        let x = uniform(&mut r, &call.dims, -3.0, 3.0);
        let op = call.cross_entropy();
        let y = fwd(&op, &[&x]);
        if call.reduction == Reduction::None {
            let per: Vec<usize> =
                [call.dims[0]].into_iter().chain(call.dims[2..].iter().copied()).collect();
            prop_assert_eq!(y.dims(), &per[..]);
        }
        close(y.data(), &call.definition(x.data(), true), &op.to_string());
        laws(&op, &[x], &mut r);
    }

    #[test]
    fn spatial_nll_loss_is_the_definition_and_obeys_the_laws(seed in any::<u64>()) {
        let call = Spatial { smoothing: 0.0, ..random_spatial(seed) };
        let mut r = rng(seed ^ 2);
        let x = uniform(&mut r, &call.dims, -3.0, 3.0);
        let op = call.nll();
        close(fwd(&op, &[&x]).data(), &call.definition(x.data(), false), &op.to_string());
        laws(&op, &[x], &mut r);
    }

    /// The spatial form is the row form on the input with its class axis moved last, to the bit:
    /// values, gradients (moved back) and tangents.
    #[test]
    fn spatial_form_is_the_row_form_bit_for_bit(seed in any::<u64>()) {
        let call = random_spatial(seed);
        let mut r = rng(seed ^ 3);
        let x = uniform(&mut r, &call.dims, -3.0, 3.0);
        let tx = uniform(&mut r, &call.dims, -1.0, 1.0);
        let (rows_call, rows) = call.as_rows(&x);
        let trows = to_rows(&tx, call.dims[0], call.classes(), call.positions());
        let smooth_free = Spatial { smoothing: 0.0, ..call.clone() };
        let (smooth_free_rows, _) = smooth_free.as_rows(&x);
        for (op, row_op) in [
            (call.cross_entropy(), rows_call.cross_entropy()),
            (smooth_free.nll(), smooth_free_rows.nll()),
        ] {
            let y = fwd(&op, &[&x]);
            let y_rows = fwd(&row_op, &[&rows]);
            prop_assert_eq!(y.data(), y_rows.data(), "{}", op);
            let seed_t = uniform(&mut r, y.dims(), -1.0, 1.0);
            let seed_rows = Tensor::new(y_rows.dims(), seed_t.data().to_vec()).unwrap();
            let g = vjp_with_needs(&op, &[&x], &seed_t, vec![true])[0].clone().unwrap();
            let g_rows = vjp_with_needs(&row_op, &[&rows], &seed_rows, vec![true])[0]
                .clone()
                .unwrap();
            let moved = to_rows(&g, call.dims[0], call.classes(), call.positions());
            prop_assert_eq!(moved.data(), g_rows.data(), "{}", op);
            let out = op.forward(&[&x]).unwrap();
            let out_rows = row_op.forward(&[&rows]).unwrap();
            let t = op.jvp(&[&x], &out, &[&tx]).unwrap();
            let t_rows = row_op.jvp(&[&rows], &out_rows, &[&trows]).unwrap();
            prop_assert_eq!(t.data(), t_rows.data(), "{}", op);
        }
    }
}

/// The (N, C) and (C) forms without options keep the fused kernel's bits: the losses are the
/// kernel's, the gradient is `(p - onehot) g` with the kernel's `p`, and an (N, C, 1) input
/// (a spatial form with one position) gives the same bits as (N, C).
#[test]
fn the_plain_row_forms_keep_the_kernel_bits() {
    let mut r = rng(11);
    let (n, c) = (5, 4);
    let x = uniform(&mut r, &[n, c], -3.0, 3.0);
    let targets: Vec<usize> = (0..n).map(|_| r.random_range(0..c)).collect();
    let mut probs = vec![0.0; n * c];
    let mut losses = vec![0.0; n];
    tapegrad_tensor::kernels::cross_entropy_rows(x.data(), c, &targets, &mut probs, &mut losses)
        .unwrap();
    let op = Op::Loss(LossOp::cross_entropy(
        Arc::new(targets.clone()),
        Reduction::None,
    ));
    assert_eq!(fwd(&op, &[&x]).data(), &losses[..]);
    let seed = uniform(&mut r, &[n], -1.0, 1.0);
    let g = vjp_with_needs(&op, &[&x], &seed, vec![true])[0]
        .clone()
        .unwrap();
    let want: Vec<f64> = (0..n * c)
        .map(|i| {
            let (row, k) = (i / c, i % c);
            if k == targets[row] {
                (probs[i] - 1.0) * seed.data()[row]
            } else {
                probs[i] * seed.data()[row]
            }
        })
        .collect();
    assert_eq!(g.data(), &want[..]);
    let single = Op::Loss(LossOp::cross_entropy(Arc::new(vec![2]), Reduction::Sum));
    let row = Tensor::new(&[c], x.data()[..c].to_vec()).unwrap();
    let mut p1 = vec![0.0; c];
    let mut l1 = vec![0.0];
    tapegrad_tensor::kernels::cross_entropy_rows(row.data(), c, &[2], &mut p1, &mut l1).unwrap();
    assert_eq!(fwd(&single, &[&row]).data(), &l1[..]);

    let x1 = Tensor::new(&[n, c, 1], x.data().to_vec()).unwrap();
    for reduction in REDUCTIONS {
        for op in [
            Op::Loss(LossOp::cross_entropy(Arc::new(targets.clone()), reduction)),
            Op::Loss(LossOp::nll_loss(Arc::new(targets.clone()), reduction)),
        ] {
            assert_eq!(fwd(&op, &[&x]).data(), fwd(&op, &[&x1]).data(), "{op}");
            let y = fwd(&op, &[&x]);
            let s = uniform(&mut r, y.dims(), -1.0, 1.0);
            let s1 = Tensor::new(fwd(&op, &[&x1]).dims(), s.data().to_vec()).unwrap();
            let g = vjp_with_needs(&op, &[&x], &s, vec![true])[0]
                .clone()
                .unwrap();
            let g1 = vjp_with_needs(&op, &[&x1], &s1, vec![true])[0]
                .clone()
                .unwrap();
            assert_eq!(g.data(), g1.data(), "{op}");
        }
    }
}

#[test]
fn spatial_edge_cases_zero_size_all_ignored_and_one_class() {
    // A zero-size trailing dim: no position, `none` of shape (N, 0), mean 0/0, sum 0.
    let x = Tensor::<f64>::new(&[2, 3, 0], vec![]).unwrap();
    for (reduction, want_dims, want) in [
        (Reduction::None, vec![2, 0], vec![]),
        (Reduction::Sum, vec![], vec![0.0]),
        (Reduction::Mean, vec![], vec![f64::NAN]),
    ] {
        for op in [
            Op::Loss(LossOp::cross_entropy(Arc::new(vec![]), reduction)),
            Op::Loss(LossOp::nll_loss(Arc::new(vec![]), reduction)),
        ] {
            let y = fwd(&op, &[&x]);
            assert_eq!(y.dims(), &want_dims[..], "{op}");
            close(y.data(), &want, &op.to_string());
            let g = vjp_with_needs(&op, &[&x], &Tensor::ones(y.shape()), vec![true]);
            assert_eq!(g[0].as_ref().unwrap().dims(), &[2, 3, 0]);
        }
    }
    // No sample: (0, C, d) takes no label.
    let x = Tensor::<f64>::new(&[0, 3, 2], vec![]).unwrap();
    let op = Op::Loss(LossOp::cross_entropy(Arc::new(vec![]), Reduction::None));
    assert_eq!(fwd(&op, &[&x]).dims(), &[0, 2]);

    // Every position ignored: mean NaN, zero gradient and tangent.
    let mut r = rng(5);
    let x = uniform(&mut r, &[2, 3, 2], -2.0, 2.0);
    let ignored = Spatial {
        dims: vec![2, 3, 2],
        targets: vec![1; 4],
        weight: Some(vec![0.5, 1.0, 2.0]),
        ignore_index: Some(1),
        smoothing: 0.2,
        reduction: Reduction::Mean,
    };
    for op in [
        ignored.cross_entropy(),
        Spatial {
            smoothing: 0.0,
            ..ignored.clone()
        }
        .nll(),
    ] {
        assert!(fwd(&op, &[&x]).data()[0].is_nan(), "{op}");
        let g = vjp_with_needs(&op, &[&x], &Tensor::scalar(1.0), vec![true]);
        assert!(g[0].as_ref().unwrap().is_all_zero(), "{op}");
        let out = op.forward(&[&x]).unwrap();
        assert_eq!(op.jvp(&[&x], &out, &[&x]).unwrap().data(), &[0.0], "{op}");
    }

    // One class: every log-softmax is 0, so the loss is 0 (PyTorch: -0) and so is the gradient.
    let x = uniform(&mut r, &[2, 1, 3], -2.0, 2.0);
    let op = Op::Loss(LossOp::cross_entropy(Arc::new(vec![0; 6]), Reduction::None));
    assert!(fwd(&op, &[&x]).data().iter().all(|&v| v == 0.0));
    let g = vjp_with_needs(
        &op,
        &[&x],
        &Tensor::new(&[2, 3], vec![1.0; 6]).unwrap(),
        vec![true],
    );
    assert!(g[0].as_ref().unwrap().is_all_zero());
}

#[test]
fn spatial_errors_name_the_op_and_both_counts() {
    let x = Tensor::<f64>::new(&[2, 3, 4], vec![0.0; 24]).unwrap();
    let cases = [
        (
            Op::Loss(LossOp::cross_entropy(Arc::new(vec![0; 6]), Reduction::Mean)),
            vec![
                "cross_entropy",
                "[2, 3, 4]",
                "8 class labels",
                "[2, 4]",
                "found 6",
            ],
        ),
        (
            Op::Loss(LossOp::nll_loss(Arc::new(vec![0; 9]), Reduction::Sum)),
            vec!["nll_loss", "[2, 3, 4]", "8 class labels", "found 9"],
        ),
        (
            Op::Loss(LossOp::cross_entropy(
                Arc::new(vec![0, 1, 2, 3, 0, 0, 0, 0]),
                Reduction::None,
            )),
            vec!["cross_entropy", "class label", "3"],
        ),
    ];
    for (op, words) in cases {
        let err = op.forward(&[&x]).unwrap_err().to_string();
        for w in words {
            assert!(err.contains(w), "{op}: '{err}' does not say '{w}'");
        }
        assert!(op.output_shape(&[x.shape()]).is_err(), "{op}");
    }
    // No class and some positions: PyTorch rejects it even with every label ignored.
    let empty = Tensor::<f64>::new(&[2, 0, 3], vec![]).unwrap();
    let op = Spatial {
        dims: vec![2, 0, 3],
        targets: vec![7; 6],
        weight: None,
        ignore_index: Some(7),
        smoothing: 0.0,
        reduction: Reduction::Sum,
    };
    for op in [op.cross_entropy(), op.nll()] {
        let err = op.forward(&[&empty]).unwrap_err().to_string();
        for w in [op.name(), "[2, 0, 3]", "6 positions", "C = 0"] {
            assert!(err.contains(w), "{op}: '{err}' does not say '{w}'");
        }
    }
    // A 0-d input has no class axis.
    let err = Op::Loss(LossOp::cross_entropy(Arc::new(vec![0]), Reduction::Sum))
        .forward(&[&Tensor::scalar(1.0)])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cross_entropy") && err.contains("(N, C, d1, ..., dk)"),
        "{err}"
    );
}

#[test]
fn session_and_graph_files_take_the_spatial_form() {
    let call = Spatial {
        dims: vec![2, 3, 2, 2],
        targets: vec![0, 1, 2, 2, 1, 0, 9, 1],
        weight: Some(vec![0.5, 1.0, 2.0]),
        ignore_index: Some(9),
        smoothing: 0.3,
        reduction: Reduction::Mean,
    };
    let mut r = rng(9);
    let x = uniform(&mut r, &call.dims, -2.0, 2.0);
    let options = ClassLossOptions {
        reduction: call.reduction,
        weight: call.weight.clone(),
        ignore_index: call.ignore_index,
        label_smoothing: call.smoothing,
    };
    let mut s = Session::<f64>::new();
    let p = s.parameter("x", x.clone()).unwrap();
    let loss = s.cross_entropy_with(p, &call.targets, &options).unwrap();
    close(
        s.value(loss).unwrap().data(),
        &call.definition(x.data(), true),
        "cross_entropy_with",
    );
    let g = s.backward(loss).unwrap();
    assert_eq!(g.get("x").unwrap().dims(), &call.dims[..]);
    let nll_options = ClassLossOptions {
        label_smoothing: 0.0,
        ..options
    };
    let loss = s.nll_loss_with(p, &call.targets, &nll_options).unwrap();
    let nll_call = Spatial {
        smoothing: 0.0,
        ..call.clone()
    };
    close(
        s.value(loss).unwrap().data(),
        &nll_call.definition(x.data(), false),
        "nll_loss_with",
    );
    round_trips(&call.cross_entropy(), 1);
    round_trips(&nll_call.nll(), 1);
}

// ---------------------------------------------------------------------------------------------
// Probability targets: cross_entropy_probs, PyTorch's cross_entropy with a float target.

/// One call with probability targets.
#[derive(Clone, Debug)]
struct Soft {
    dims: Vec<usize>,
    weight: Option<Vec<f64>>,
    smoothing: f64,
    reduction: Reduction,
}

impl Soft {
    fn op(&self) -> Op {
        Op::Loss(LossOp::CrossEntropyProbs(CrossEntropyProbs {
            reduction: self.reduction,
            weight: self.weight.clone().map(Arc::new),
            label_smoothing: self.smoothing,
        }))
    }

    /// (samples, classes, positions): (1, C, 1) for (C), (N, C, d1···dk) otherwise.
    fn layout(&self) -> (usize, usize, usize) {
        match self.dims[..] {
            [c] => (1, c, 1),
            [n, c, ref rest @ ..] => (n, c, rest.iter().product()),
            _ => unreachable!("no 0-d case"),
        }
    }

    /// PyTorch's definition, written out on the input as laid out: per sample `b` and position
    /// `s`, `-sum_k w_k y'_k lsm_k` with `y'_k = (1 - e) y[b, k, s] + e / C` and
    /// `lsm = log_softmax(x[b, :, s])`; `mean` divides the sum by the number of positions
    /// (numel / C, NaN for an empty input), whatever the weights.
    fn definition(&self, x: &[f64], y: &[f64]) -> Vec<f64> {
        let (n, c, p) = self.layout();
        let w = |k: usize| self.weight.as_ref().map_or(1.0, |w| w[k]);
        let at = |t: &[f64], b: usize, k: usize, s: usize| t[(b * c + k) * p + s];
        let e = self.smoothing;
        let mut per = Vec::new();
        for b in 0..n {
            for s in 0..p {
                let m = (0..c)
                    .map(|k| at(x, b, k, s))
                    .fold(f64::NEG_INFINITY, f64::max);
                let lse = m + (0..c).map(|k| (at(x, b, k, s) - m).exp()).sum::<f64>().ln();
                let loss: f64 = (0..c)
                    .map(|k| {
                        let smoothed = (1.0 - e) * at(y, b, k, s) + e / c as f64;
                        -w(k) * smoothed * (at(x, b, k, s) - lse)
                    })
                    .sum();
                per.push(loss);
            }
        }
        let numel: usize = self.dims.iter().product();
        match self.reduction {
            Reduction::None => per,
            Reduction::Sum => vec![per.iter().sum()],
            Reduction::Mean if numel == 0 => vec![f64::NAN],
            Reduction::Mean => vec![per.iter().sum::<f64>() / (numel / c) as f64],
        }
    }
}

/// Random calls: rank 1 to 4, weights or none, smoothing 0, 0.1, 0.5 or 1.
fn random_soft(seed: u64) -> Soft {
    let mut r = rng(seed);
    let rank = r.random_range(1..=4);
    let dims: Vec<usize> = (0..rank).map(|_| r.random_range(1..=3)).collect();
    let c = dims[usize::from(rank >= 2)];
    Soft {
        dims,
        weight: r
            .random_bool(0.6)
            .then(|| (0..c).map(|_| r.random_range(0.25..2.0)).collect()),
        smoothing: [0.0, 0.1, 0.5, 1.0][r.random_range(0..4)],
        reduction: REDUCTIONS[r.random_range(0..3)],
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn probability_targets_are_the_definition_and_obey_the_laws(seed in any::<u64>()) {
        let call = random_soft(seed);
        let mut r = rng(seed ^ 4);
        let x = uniform(&mut r, &call.dims, -3.0, 3.0);
        let y = uniform(&mut r, &call.dims, 0.0, 1.0);
        let op = call.op();
        close(fwd(&op, &[&x, &y]).data(), &call.definition(x.data(), y.data()), &op.to_string());
        laws(&op, &[x, y], &mut r);
    }

    /// One-hot targets give the class-label loss (with the same weights and smoothing) for
    /// `none` and `sum`; the means differ only in their divisor.
    #[test]
    fn one_hot_targets_are_the_class_label_loss(seed in any::<u64>()) {
        let call = Soft { dims: vec![3, 4, 2], ..random_soft(seed) };
        let call = Soft {
            weight: call.weight.map(|_| vec![0.5, 1.5, 2.0, 0.75]),
            ..call
        };
        let mut r = rng(seed ^ 5);
        let labels: Vec<i64> = (0..6).map(|_| r.random_range(0..4)).collect();
        let mut onehot = vec![0.0; 24];
        for (i, &t) in labels.iter().enumerate() {
            let (b, s) = (i / 2, i % 2);
            onehot[(b * 4 + t as usize) * 2 + s] = 1.0;
        }
        let y = Tensor::new(&[3, 4, 2], onehot).unwrap();
        let x = uniform(&mut r, &[3, 4, 2], -3.0, 3.0);
        let labelled = Spatial {
            dims: vec![3, 4, 2],
            targets: labels,
            weight: call.weight.clone(),
            ignore_index: None,
            smoothing: call.smoothing,
            reduction: call.reduction,
        };
        let got = fwd(&call.op(), &[&x, &y]);
        let want = fwd(&labelled.cross_entropy(), &[&x]);
        if call.reduction == Reduction::Mean {
            let total: f64 = labelled.targets.iter().map(|&t| labelled.weight.as_ref().map_or(1.0, |w| w[t as usize])).sum();
            close(&[got.data()[0] * 6.0], &[want.data()[0] * total], "mean");
        } else {
            close(got.data(), want.data(), &call.op().to_string());
        }
    }
}

#[test]
fn probability_mean_divides_by_positions_not_weights() {
    let x = Tensor::new(&[2, 2], vec![0.0, 1.0, 2.0, -1.0]).unwrap();
    let y = Tensor::new(&[2, 2], vec![1.0, 0.0, 0.0, 1.0]).unwrap();
    let weighted = Soft {
        dims: vec![2, 2],
        weight: Some(vec![3.0, 5.0]),
        smoothing: 0.0,
        reduction: Reduction::Mean,
    };
    let sum = Soft {
        reduction: Reduction::Sum,
        ..weighted.clone()
    };
    let mean = fwd(&weighted.op(), &[&x, &y]).data()[0];
    let total = fwd(&sum.op(), &[&x, &y]).data()[0];
    assert_eq!(mean, total / 2.0);
}

#[test]
fn probability_edge_cases_empty_and_one_class() {
    // No class: every position's loss is an empty sum; the mean of an empty input is NaN.
    let x = Tensor::<f64>::new(&[2, 0], vec![]).unwrap();
    for (reduction, dims, want) in [
        (Reduction::None, vec![2], vec![0.0, 0.0]),
        (Reduction::Sum, vec![], vec![0.0]),
        (Reduction::Mean, vec![], vec![f64::NAN]),
    ] {
        let op = Soft {
            dims: vec![2, 0],
            weight: None,
            smoothing: 0.5,
            reduction,
        }
        .op();
        let y = fwd(&op, &[&x, &x]);
        assert_eq!(y.dims(), &dims[..], "{op}");
        close(y.data(), &want, &op.to_string());
        let g = vjp_with_needs(&op, &[&x, &x], &Tensor::ones(y.shape()), vec![true, true]);
        assert!(
            g.iter().all(|g| g.as_ref().unwrap().dims() == [2, 0]),
            "{op}"
        );
        let out = op.forward(&[&x, &x]).unwrap();
        let t = op.jvp(&[&x, &x], &out, &[&x, &x]).unwrap();
        assert!(t.data().iter().all(|&v| v == 0.0), "{op}: {t:?}");
    }
    // No sample, and a zero-size trailing dim.
    for dims in [vec![0, 3], vec![2, 3, 0]] {
        let x = Tensor::<f64>::new(&dims, vec![]).unwrap();
        let op = Soft {
            dims: dims.clone(),
            weight: None,
            smoothing: 0.0,
            reduction: Reduction::Mean,
        }
        .op();
        assert!(fwd(&op, &[&x, &x]).data()[0].is_nan(), "{op}");
    }
    // One class: the log-softmax is 0, so the loss and both gradients are 0.
    let mut r = rng(8);
    let x = uniform(&mut r, &[3, 1, 2], -2.0, 2.0);
    let y = uniform(&mut r, &[3, 1, 2], 0.0, 1.0);
    let op = Soft {
        dims: vec![3, 1, 2],
        weight: Some(vec![2.0]),
        smoothing: 0.3,
        reduction: Reduction::Sum,
    }
    .op();
    assert_eq!(fwd(&op, &[&x, &y]).data(), &[0.0]);
    let g = vjp_with_needs(&op, &[&x, &y], &Tensor::scalar(1.0), vec![true, true]);
    assert!(g.iter().all(|g| g.as_ref().unwrap().is_all_zero()));
}

#[test]
fn probability_errors_name_the_op_and_both_values() {
    let x = Tensor::<f64>::new(&[2, 3], vec![0.0; 6]).unwrap();
    let plain = Soft {
        dims: vec![2, 3],
        weight: None,
        smoothing: 0.0,
        reduction: Reduction::Mean,
    };
    let y = Tensor::<f64>::new(&[2, 4], vec![0.0; 8]).unwrap();
    let cases = [
        (
            plain.op(),
            y.clone(),
            vec!["cross_entropy_probs", "[2, 3]", "[2, 4]"],
        ),
        (
            Soft {
                weight: Some(vec![1.0; 4]),
                ..plain.clone()
            }
            .op(),
            x.clone(),
            vec!["cross_entropy_probs", "3 classes", "4 entries"],
        ),
        (
            Soft {
                smoothing: 1.5,
                ..plain.clone()
            }
            .op(),
            x.clone(),
            vec!["cross_entropy_probs", "label_smoothing", "1.5"],
        ),
        (
            Soft {
                smoothing: -0.5,
                ..plain.clone()
            }
            .op(),
            x.clone(),
            vec!["cross_entropy_probs", "label_smoothing", "-0.5"],
        ),
    ];
    for (op, y, words) in cases {
        let err = op.forward(&[&x, &y]).unwrap_err().to_string();
        for w in words {
            assert!(err.contains(w), "{op}: '{err}' does not say '{w}'");
        }
        assert!(op.output_shape(&[x.shape(), y.shape()]).is_err(), "{op}");
    }
    let s0 = Tensor::scalar(0.0);
    let err = plain.op().forward(&[&s0, &s0]).unwrap_err().to_string();
    assert!(
        err.contains("cross_entropy_probs") && err.contains("found []"),
        "{err}"
    );
    let err = plain.op().forward(&[&x]).unwrap_err().to_string();
    assert!(err.contains("cross_entropy_probs"), "{err}");
}

#[test]
fn session_and_graph_files_take_probability_targets() {
    let call = Soft {
        dims: vec![2, 3, 2],
        weight: Some(vec![0.5, 1.0, 2.0]),
        smoothing: 0.2,
        reduction: Reduction::Mean,
    };
    let mut r = rng(12);
    let x = uniform(&mut r, &call.dims, -2.0, 2.0);
    let y = uniform(&mut r, &call.dims, 0.0, 1.0);
    let options = ClassLossOptions {
        reduction: call.reduction,
        weight: call.weight.clone(),
        ignore_index: None,
        label_smoothing: call.smoothing,
    };
    let mut s = Session::<f64>::new();
    let px = s.parameter("x", x.clone()).unwrap();
    let py = s.parameter("y", y.clone()).unwrap();
    let loss = s.cross_entropy_probs_with(px, py, &options).unwrap();
    close(
        s.value(loss).unwrap().data(),
        &call.definition(x.data(), y.data()),
        "cross_entropy_probs_with",
    );
    let g = s.backward(loss).unwrap();
    assert_eq!(g.get("x").unwrap().dims(), &call.dims[..]);
    assert_eq!(g.get("y").unwrap().dims(), &call.dims[..]);
    let plain = s.cross_entropy_probs(px, py).unwrap();
    let want = Soft {
        weight: None,
        smoothing: 0.0,
        ..call.clone()
    }
    .definition(x.data(), y.data());
    close(s.value(plain).unwrap().data(), &want, "cross_entropy_probs");
    // PyTorch: "ignore_index is not supported for floating point target".
    let err = s
        .cross_entropy_probs_with(
            px,
            py,
            &ClassLossOptions {
                ignore_index: Some(1),
                ..options
            },
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cross_entropy_probs") && err.contains("ignore_index"),
        "{err}"
    );

    round_trips(&call.op(), 2);
    // A graph file may also spell it as PyTorch does: cross_entropy with two arguments.
    let attrs = serde_json::json!({"reduction": "sum", "label_smoothing": 0.1});
    let op = parse_op("cross_entropy", 2, attrs.as_object().unwrap().clone()).unwrap();
    assert_eq!(
        op,
        Op::Loss(LossOp::CrossEntropyProbs(CrossEntropyProbs {
            reduction: Reduction::Sum,
            weight: None,
            label_smoothing: 0.1,
        }))
    );
}

// ---------------------------------------------------------------------------------------------
// binary_cross_entropy_with_logits with `weight`, a factor per element broadcast to the input.

/// A one-axis tensor of `values` (a pos_weight of the usual form).
fn vector(values: Vec<f64>) -> Tensor<f64> {
    let n = values.len();
    Tensor::new(&[n], values).unwrap()
}

/// The factor `weight` gives element `i` of an input of shape `dims` under broadcasting: the
/// weight's axes line up with the input's trailing ones, and a size-1 axis repeats.
fn weight_at(dims: &[usize], weight: &Tensor<f64>, i: usize) -> f64 {
    let lead = dims.len() - weight.rank();
    // The input's multi-index of element i, then the weight's (size-1 axes at 0).
    let mut rest = i;
    let mut index = vec![0; dims.len()];
    for axis in (0..dims.len()).rev() {
        index[axis] = rest % dims[axis];
        rest /= dims[axis];
    }
    let at = weight.dims().iter().enumerate().fold(0, |at, (a, &d)| {
        at * d + if d == 1 { 0 } else { index[lead + a] }
    });
    weight.data()[at]
}

/// PyTorch's definition per element, `-w (p y log sigmoid(x) + (1 - y) log(1 - sigmoid(x)))`,
/// with `p` the element's pos_weight and `w` its weight, each broadcast to the input.
fn weighted_bce_definition(
    x: &Tensor<f64>,
    y: &Tensor<f64>,
    weight: &Tensor<f64>,
    pos_weight: Option<&Tensor<f64>>,
    reduction: Reduction,
) -> Vec<f64> {
    let per: Vec<f64> = (0..x.numel())
        .map(|i| {
            let w = weight_at(x.dims(), weight, i);
            let p = pos_weight.map_or(1.0, |pw| weight_at(x.dims(), pw, i));
            let s = 1.0 / (1.0 + (-x.data()[i]).exp());
            let t = y.data()[i];
            -w * (p * t * s.ln() + (1.0 - t) * (1.0 - s).ln())
        })
        .collect();
    match reduction {
        Reduction::None => per,
        Reduction::Sum => vec![per.iter().sum()],
        Reduction::Mean => vec![per.iter().sum::<f64>() / per.len() as f64],
    }
}

/// The two gradients of `<seed, loss>` written out per element: the partials
/// `w ((p y + 1 - y) sigmoid(x) - p y)` for the logit and `w (log(1 - sigmoid(x)) - p log
/// sigmoid(x))` for the target, times the seed (its single value over numel under "mean").
fn weighted_bce_gradients(
    x: &Tensor<f64>,
    y: &Tensor<f64>,
    weight: &Tensor<f64>,
    pos_weight: Option<&Tensor<f64>>,
    reduction: Reduction,
    seed: &Tensor<f64>,
) -> (Vec<f64>, Vec<f64>) {
    let n = x.numel();
    (0..n)
        .map(|i| {
            let g = match reduction {
                Reduction::None => seed.data()[i],
                Reduction::Sum => seed.data()[0],
                Reduction::Mean => seed.data()[0] / n as f64,
            };
            let w = weight_at(x.dims(), weight, i);
            let p = pos_weight.map_or(1.0, |pw| weight_at(x.dims(), pw, i));
            let s = 1.0 / (1.0 + (-x.data()[i]).exp());
            let t = y.data()[i];
            let dx = w * ((p * t + 1.0 - t) * s - p * t);
            let dy = w * ((1.0 - s).ln() - p * s.ln());
            (g * dx, g * dy)
        })
        .unzip()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn weighted_bce_is_the_definition_and_obeys_the_laws(seed in any::<u64>()) {
        let mut r = rng(seed);
        let dims: Vec<usize> = (0..r.random_range(1..=3)).map(|_| r.random_range(1..=3)).collect();
        // A shape that broadcasts into the input's: trailing axes, some of them 1.
        let w_dims: Vec<usize> = dims[r.random_range(0..=dims.len())..]
            .iter()
            .map(|&d| if r.random_bool(0.3) { 1 } else { d })
            .collect();
        let weight = uniform(&mut r, &w_dims, 0.25, 2.0);
        let pos_weight: Option<Tensor<f64>> = r
            .random_bool(0.5)
            .then(|| vector((0..*dims.last().unwrap()).map(|_| r.random_range(0.25..4.0)).collect()));
        let reduction = REDUCTIONS[r.random_range(0..3)];
        let x = uniform(&mut r, &dims, -3.0, 3.0);
        let y = uniform(&mut r, &dims, 0.0, 1.0);
        let op = Op::Loss(LossOp::bce_with_logits_weighted(reduction, weight.clone(), pos_weight.clone()));
        let want = weighted_bce_definition(&x, &y, &weight, pos_weight.as_ref(), reduction);
        let out = fwd(&op, &[&x, &y]);
        close(out.data(), &want, &op.to_string());
        let seed = uniform(&mut r, out.dims(), -1.0, 1.0);
        let (gx, gy) = weighted_bce_gradients(&x, &y, &weight, pos_weight.as_ref(), reduction, &seed);
        let g = vjp_with_needs(&op, &[&x, &y], &seed, vec![true, true]);
        close(g[0].as_ref().unwrap().data(), &gx, &format!("{op}: d/dlogits"));
        close(g[1].as_ref().unwrap().data(), &gy, &format!("{op}: d/dtargets"));
        laws(&op, &[x, y], &mut r);
    }
}

/// A weight of ones gives the unweighted loss's bits (a product by 1 is exact), and the
/// unweighted variant is untouched by the weight's code.
#[test]
fn weight_of_ones_is_the_unweighted_loss_bit_for_bit() {
    let mut r = rng(21);
    let x = uniform(&mut r, &[3, 4], -5.0, 5.0);
    let y = uniform(&mut r, &[3, 4], 0.0, 1.0);
    for reduction in REDUCTIONS {
        for pos_weight in [None, Some(vector(vec![0.5, 1.0, 2.0, 3.0]))] {
            let plain = Op::Loss(LossOp::BinaryCrossEntropyWithLogits(
                BinaryCrossEntropyWithLogits {
                    reduction,
                    pos_weight: pos_weight.clone().map(Arc::new),
                    weight: None,
                },
            ));
            let ones = Tensor::new(&[4], vec![1.0; 4]).unwrap();
            let weighted = Op::Loss(LossOp::bce_with_logits_weighted(
                reduction, ones, pos_weight,
            ));
            let out = fwd(&plain, &[&x, &y]);
            assert_eq!(out.data(), fwd(&weighted, &[&x, &y]).data(), "{weighted}");
            let seed = uniform(&mut r, out.dims(), -1.0, 1.0);
            let g = vjp_with_needs(&plain, &[&x, &y], &seed, vec![true, true]);
            let gw = vjp_with_needs(&weighted, &[&x, &y], &seed, vec![true, true]);
            assert_eq!(g, gw, "{weighted}");
        }
    }
}

#[test]
fn weight_shapes_that_do_not_broadcast_into_the_input_are_errors() {
    let x = Tensor::<f64>::new(&[2, 3], vec![0.0; 6]).unwrap();
    for w_dims in [vec![2], vec![4, 2, 3], vec![3, 3], vec![1, 1, 1]] {
        let n: usize = w_dims.iter().product();
        let weight = Tensor::new(&w_dims, vec![1.0; n]).unwrap();
        let op = Op::Loss(LossOp::bce_with_logits_weighted(
            Reduction::Mean,
            weight.clone(),
            None,
        ));
        let err = op.forward(&[&x, &x]).unwrap_err().to_string();
        for w in [
            "binary_cross_entropy_with_logits",
            &format!("{}", weight.shape()),
            "[2, 3]",
        ] {
            assert!(err.contains(w), "{op}: '{err}' does not say '{w}'");
        }
        assert!(op.output_shape(&[x.shape(), x.shape()]).is_err());
    }
    // An empty input takes a weight of ones broadcast to nothing: mean NaN, sum 0.
    let empty = Tensor::<f64>::new(&[2, 0], vec![]).unwrap();
    let one = Tensor::new(&[1], vec![2.0]).unwrap();
    for (reduction, want) in [(Reduction::Mean, f64::NAN), (Reduction::Sum, 0.0)] {
        let op = Op::Loss(LossOp::bce_with_logits_weighted(
            reduction,
            one.clone(),
            None,
        ));
        close(fwd(&op, &[&empty, &empty]).data(), &[want], &op.to_string());
    }
}

/// "mean" divides by the element count, not by the weights: a weight of 2 everywhere doubles
/// every reduction, bit for bit (doubling is exact), where a division by the weights' sum would
/// give the unweighted mean back.
#[test]
fn weighted_mean_divides_by_numel_not_by_the_weights() {
    let mut r = rng(23);
    let x = uniform(&mut r, &[2, 3, 2], -4.0, 4.0);
    let y = uniform(&mut r, &[2, 3, 2], 0.0, 1.0);
    for reduction in REDUCTIONS {
        let plain = Op::Loss(LossOp::bce_with_logits(reduction));
        let twos = Tensor::new(&[3, 1], vec![2.0; 3]).unwrap();
        let doubled = Op::Loss(LossOp::bce_with_logits_weighted(reduction, twos, None));
        let want: Vec<f64> = fwd(&plain, &[&x, &y])
            .data()
            .iter()
            .map(|v| 2.0 * v)
            .collect();
        assert_eq!(fwd(&doubled, &[&x, &y]).data(), &want[..], "{doubled}");
    }
    // One non-zero weight: the mean is that element's loss over all 12 elements.
    let mut w = vec![0.0; 12];
    w[7] = 1.5;
    let weight = Tensor::new(&[2, 3, 2], w).unwrap();
    let op = Op::Loss(LossOp::bce_with_logits_weighted(
        Reduction::Mean,
        weight.clone(),
        None,
    ));
    let one = weighted_bce_definition(&x, &y, &weight, None, Reduction::None)[7];
    close(fwd(&op, &[&x, &y]).data(), &[one / 12.0], &op.to_string());
}

/// A weight of zeros gives a zero loss and zero gradients, also at logits far out in both tails
/// (every partial is finite there, so nothing turns into NaN), and with a pos_weight.
#[test]
fn weight_of_zeros_gives_zero_loss_and_gradients() {
    let x = Tensor::new(&[2, 3], vec![-80.0, -30.0, -1.0, 0.0, 30.0, 80.0]).unwrap();
    let y = Tensor::new(&[2, 3], vec![0.0, 1.0, 0.5, 1.0, 0.0, 0.25]).unwrap();
    for reduction in REDUCTIONS {
        for pos_weight in [None, Some(vector(vec![0.5, 2.0, 4.0]))] {
            let zeros = Tensor::new(&[3], vec![0.0; 3]).unwrap();
            let op = Op::Loss(LossOp::bce_with_logits_weighted(
                reduction, zeros, pos_weight,
            ));
            let out = fwd(&op, &[&x, &y]);
            assert!(out.data().iter().all(|&v| v == 0.0), "{op}: {out:?}");
            let seed = Tensor::new(out.dims(), vec![1.0; out.numel()]).unwrap();
            for g in vjp_with_needs(&op, &[&x, &y], &seed, vec![true, true]) {
                let g = g.unwrap();
                assert!(g.data().iter().all(|&v| v == 0.0), "{op}: {g:?}");
            }
        }
    }
}

/// A 0-d input takes a 0-d weight (PyTorch too); the laws hold there.
#[test]
fn a_scalar_input_takes_a_scalar_weight() {
    let mut r = rng(24);
    let x = Tensor::new(&[], vec![0.7]).unwrap();
    let y = Tensor::new(&[], vec![0.2]).unwrap();
    let weight = Tensor::new(&[], vec![1.75]).unwrap();
    for reduction in REDUCTIONS {
        let op = Op::Loss(LossOp::bce_with_logits_weighted(
            reduction,
            weight.clone(),
            None,
        ));
        let want = weighted_bce_definition(&x, &y, &weight, None, reduction);
        close(fwd(&op, &[&x, &y]).data(), &want, &op.to_string());
        laws(&op, &[x.clone(), y.clone()], &mut r);
    }
}

#[test]
fn session_and_graph_files_take_the_bce_weight() {
    let mut r = rng(22);
    let x = uniform(&mut r, &[2, 3], -2.0, 2.0);
    let y = uniform(&mut r, &[2, 3], 0.0, 1.0);
    let weight = uniform(&mut r, &[2, 1], 0.5, 2.0);
    let mut s = Session::<f64>::new();
    let px = s.parameter("x", x.clone()).unwrap();
    let py = s.input(y.clone());
    let loss = s
        .binary_cross_entropy_with_logits_weighted(
            px,
            py,
            Reduction::Sum,
            &weight,
            Some(&vector(vec![2.0])),
        )
        .unwrap();
    let want = weighted_bce_definition(&x, &y, &weight, Some(&vector(vec![2.0])), Reduction::Sum);
    close(s.value(loss).unwrap().data(), &want, "session weighted bce");
    assert_eq!(s.backward(loss).unwrap().get("x").unwrap().dims(), &[2, 3]);
    // A weight that does not fit is an error naming the op and both shapes.
    let wide = Tensor::new(&[3, 3], vec![1.0; 9]).unwrap();
    let err = s
        .binary_cross_entropy_with_logits_weighted(px, py, Reduction::Sum, &wide, None)
        .unwrap_err()
        .to_string();
    for w in ["binary_cross_entropy_with_logits", "[3, 3]", "[2, 3]"] {
        assert!(err.contains(w), "'{err}' does not say '{w}'");
    }

    let op = Op::Loss(LossOp::bce_with_logits_weighted(
        Reduction::None,
        weight,
        Some(vector(vec![1.5, 2.0, 0.5])),
    ));
    round_trips(&op, 2);
    // Without `weight_shape` the weights match the input's last axis.
    let attrs = serde_json::json!({"weight": [1, 2, 3]});
    let op = parse_op(
        "binary_cross_entropy_with_logits",
        2,
        attrs.as_object().unwrap().clone(),
    )
    .unwrap();
    assert_eq!(
        op,
        Op::Loss(LossOp::bce_with_logits_weighted(
            Reduction::Mean,
            Tensor::new(&[3], vec![1.0, 2.0, 3.0]).unwrap(),
            None,
        ))
    );
    let attrs = serde_json::json!({"weight_shape": [3]});
    let err = parse_op(
        "binary_cross_entropy_with_logits",
        2,
        attrs.as_object().unwrap().clone(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("binary_cross_entropy_with_logits") && err.contains("weight_shape"),
        "{err}"
    );
    let attrs = serde_json::json!({"weight": [1, 2, 3], "weight_shape": [2, 2]});
    let err = parse_op(
        "binary_cross_entropy_with_logits",
        2,
        attrs.as_object().unwrap().clone(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("binary_cross_entropy_with_logits") && err.contains("weight"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// binary_cross_entropy_with_logits with a `pos_weight` broadcast to the input.

/// A pos_weight shape that broadcasts into `dims`: a random tail of its axes, each kept or 1
/// (PyTorch's [C, 1, 1] for a [C, H, W] input among them; 0-d when the tail is empty).
fn broadcastable<R: Rng>(dims: &[usize], r: &mut R) -> Vec<usize> {
    dims[r.random_range(0..=dims.len())..]
        .iter()
        .map(|&d| if r.random_bool(0.4) { 1 } else { d })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn broadcast_pos_weight_is_the_definition_and_obeys_the_laws(seed in any::<u64>()) {
        let mut r = rng(seed);
        let dims: Vec<usize> = (0..r.random_range(0..=4)).map(|_| r.random_range(1..=3)).collect();
        let p_dims = broadcastable(&dims, &mut r);
        // Arbitrary doubles: a graph file must carry them exactly (serde_json's float_roundtrip).
        let pos_weight = uniform(&mut r, &p_dims, 0.25, 4.0);
        let weighted = r.random_bool(0.3);
        let weight = if weighted {
            let w_dims = broadcastable(&dims, &mut r);
            uniform(&mut r, &w_dims, 0.25, 2.0)
        } else {
            Tensor::new(&[], vec![1.0]).unwrap()
        };
        let reduction = REDUCTIONS[r.random_range(0..3)];
        let x = uniform(&mut r, &dims, -3.0, 3.0);
        let y = uniform(&mut r, &dims, 0.0, 1.0);
        let op = Op::Loss(if weighted {
            LossOp::bce_with_logits_weighted(reduction, weight.clone(), Some(pos_weight.clone()))
        } else {
            LossOp::BinaryCrossEntropyWithLogits(BinaryCrossEntropyWithLogits {
                reduction,
                pos_weight: Some(Arc::new(pos_weight.clone())),
                weight: None,
            })
        });
        let want = weighted_bce_definition(&x, &y, &weight, Some(&pos_weight), reduction);
        let out = fwd(&op, &[&x, &y]);
        close(out.data(), &want, &op.to_string());
        let seed = uniform(&mut r, out.dims(), -1.0, 1.0);
        let (gx, gy) = weighted_bce_gradients(&x, &y, &weight, Some(&pos_weight), reduction, &seed);
        let g = vjp_with_needs(&op, &[&x, &y], &seed, vec![true, true]);
        close(g[0].as_ref().unwrap().data(), &gx, &format!("{op}: d/dlogits"));
        close(g[1].as_ref().unwrap().data(), &gy, &format!("{op}: d/dtargets"));
        laws(&op, &[x, y], &mut r);
        round_trips(&op, 2);
    }
}

/// PyTorch's segmentation form: pos_weight [C, 1, 1] on an [N, C, H, W] input weighs class c's
/// plane, element by element as the definition says.
#[test]
fn pos_weight_c11_weighs_the_class_axis() {
    let mut r = rng(31);
    let x = uniform(&mut r, &[2, 3, 2, 2], -3.0, 3.0);
    let y = uniform(&mut r, &[2, 3, 2, 2], 0.0, 1.0);
    let p = Tensor::new(&[3, 1, 1], vec![0.5, 2.0, 4.0]).unwrap();
    let op = Op::Loss(LossOp::BinaryCrossEntropyWithLogits(
        BinaryCrossEntropyWithLogits {
            reduction: Reduction::None,
            pos_weight: Some(Arc::new(p)),
            weight: None,
        },
    ));
    let out = fwd(&op, &[&x, &y]);
    for i in 0..x.numel() {
        let c = (i / 4) % 3;
        let p = [0.5, 2.0, 4.0][c];
        let (xi, yi) = (x.data()[i], y.data()[i]);
        let s = 1.0 / (1.0 + (-xi).exp());
        let want = -(p * yi * s.ln() + (1.0 - yi) * (1.0 - s).ln());
        close(&[out.data()[i]], &[want], &format!("{op} at {i}"));
    }
}

/// A one-axis pos_weight reads its values as before (`w[i % len]`, no copy) and gives the same
/// bits as the same values broadcast by the general path: as [1, C], and written out in full.
#[test]
fn one_axis_pos_weight_gives_the_old_bits() {
    let mut r = rng(32);
    let x = uniform(&mut r, &[3, 2, 4], -30.0, 30.0);
    let y = uniform(&mut r, &[3, 2, 4], 0.0, 1.0);
    let values = vec![0.5, 1.0, 2.5, 3.0];
    let full: Vec<f64> = (0..x.numel()).map(|i| values[i % 4]).collect();
    for reduction in REDUCTIONS {
        let with = |p: Tensor<f64>| {
            Op::Loss(LossOp::BinaryCrossEntropyWithLogits(
                BinaryCrossEntropyWithLogits {
                    reduction,
                    pos_weight: Some(Arc::new(p)),
                    weight: None,
                },
            ))
        };
        let old = with(vector(values.clone()));
        let out = fwd(&old, &[&x, &y]);
        let seed = uniform(&mut r, out.dims(), -1.0, 1.0);
        let g = vjp_with_needs(&old, &[&x, &y], &seed, vec![true, true]);
        for p in [
            Tensor::new(&[1, 4], values.clone()).unwrap(),
            Tensor::new(&[1, 1, 4], values.clone()).unwrap(),
            Tensor::new(&[3, 2, 4], full.clone()).unwrap(),
        ] {
            let op = with(p);
            assert_eq!(fwd(&op, &[&x, &y]).data(), out.data(), "{op}");
            assert_eq!(
                vjp_with_needs(&op, &[&x, &y], &seed, vec![true, true]),
                g,
                "{op}"
            );
        }
        // One value: [1], 0-d and [1, 1] agree too.
        let one = with(vector(vec![2.5]));
        let want = fwd(&one, &[&x, &y]);
        for p in [
            Tensor::new(&[], vec![2.5]).unwrap(),
            Tensor::new(&[1, 1], vec![2.5]).unwrap(),
        ] {
            let op = with(p);
            assert_eq!(fwd(&op, &[&x, &y]).data(), want.data(), "{op}");
        }
    }
}

/// PyTorch 2.15 rejects a pos_weight with more axes than the input (even all 1) or an axis that
/// would enlarge the loss; the error names the op and both shapes, in every entry point.
#[test]
fn pos_weight_shapes_that_do_not_broadcast_into_the_input_are_errors() {
    let x = Tensor::<f64>::new(&[2, 3, 1], vec![0.0; 6]).unwrap();
    for p_dims in [
        vec![1, 2, 3, 1],
        vec![1, 1, 1, 1],
        vec![3, 1, 1],
        vec![2],
        vec![3, 2],
        vec![2, 2, 1],
    ] {
        let n: usize = p_dims.iter().product();
        let p = Tensor::new(&p_dims, vec![1.5; n]).unwrap();
        for op in [
            Op::Loss(LossOp::BinaryCrossEntropyWithLogits(
                BinaryCrossEntropyWithLogits {
                    reduction: Reduction::Mean,
                    pos_weight: Some(Arc::new(p.clone())),
                    weight: None,
                },
            )),
            Op::Loss(LossOp::bce_with_logits_weighted(
                Reduction::None,
                Tensor::new(&[1], vec![1.0]).unwrap(),
                Some(p.clone()),
            )),
        ] {
            let err = op.forward(&[&x, &x]).unwrap_err().to_string();
            for w in [
                "binary_cross_entropy_with_logits",
                "pos_weight",
                &format!("{}", p.shape()),
                "[2, 3, 1]",
            ] {
                assert!(err.contains(w), "{op}: '{err}' does not say '{w}'");
            }
            assert!(op.output_shape(&[x.shape(), x.shape()]).is_err(), "{op}");
        }
        let mut s = Session::<f64>::new();
        let px = s.parameter("x", x.clone()).unwrap();
        let py = s.input(x.clone());
        let err = s
            .binary_cross_entropy_with_logits_with(px, py, Reduction::Sum, Some(&p))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("pos_weight") && err.contains("[2, 3, 1]"),
            "{err}"
        );
    }
    // A 0-d input takes a 0-d pos_weight (PyTorch too), but not [1].
    let scalar = Tensor::new(&[], vec![0.3]).unwrap();
    let zero_d = Op::Loss(LossOp::BinaryCrossEntropyWithLogits(
        BinaryCrossEntropyWithLogits {
            reduction: Reduction::Sum,
            pos_weight: Some(Arc::new(Tensor::new(&[], vec![2.0]).unwrap())),
            weight: None,
        },
    ));
    let want = weighted_bce_definition(
        &scalar,
        &scalar,
        &Tensor::new(&[], vec![1.0]).unwrap(),
        Some(&Tensor::new(&[], vec![2.0]).unwrap()),
        Reduction::Sum,
    );
    close(
        fwd(&zero_d, &[&scalar, &scalar]).data(),
        &want,
        "0-d pos_weight",
    );
    let one = Op::Loss(LossOp::BinaryCrossEntropyWithLogits(
        BinaryCrossEntropyWithLogits {
            reduction: Reduction::Sum,
            pos_weight: Some(Arc::new(vector(vec![2.0]))),
            weight: None,
        },
    ));
    assert!(one.forward(&[&scalar, &scalar]).is_err());
}

#[test]
fn graph_files_take_a_pos_weight_shape() {
    let p = Tensor::new(&[3, 1, 1], vec![0.5, 2.0, 4.0]).unwrap();
    let op = Op::Loss(LossOp::BinaryCrossEntropyWithLogits(
        BinaryCrossEntropyWithLogits {
            reduction: Reduction::Sum,
            pos_weight: Some(Arc::new(p.clone())),
            weight: None,
        },
    ));
    round_trips(&op, 2);
    let attrs = write_attrs(&op).unwrap();
    assert!(
        attrs
            .iter()
            .any(|(k, v)| *k == "pos_weight_shape" && v == "[3, 1, 1]"),
        "{attrs:?}"
    );
    // A 0-d pos_weight keeps its empty shape.
    round_trips(
        &Op::Loss(LossOp::BinaryCrossEntropyWithLogits(
            BinaryCrossEntropyWithLogits {
                reduction: Reduction::Mean,
                pos_weight: Some(Arc::new(Tensor::new(&[], vec![2.0]).unwrap())),
                weight: None,
            },
        )),
        2,
    );
    round_trips(
        &Op::Loss(LossOp::bce_with_logits_weighted(
            Reduction::None,
            Tensor::new(&[2, 1], vec![1.0, 2.0]).unwrap(),
            Some(p),
        )),
        2,
    );
    // A one-axis pos_weight is written as before, without a shape; old files read as one axis.
    let old = Op::Loss(LossOp::BinaryCrossEntropyWithLogits(
        BinaryCrossEntropyWithLogits {
            reduction: Reduction::Mean,
            pos_weight: Some(Arc::new(vector(vec![1.0, 2.0]))),
            weight: None,
        },
    ));
    assert!(write_attrs(&old)
        .unwrap()
        .iter()
        .all(|(k, _)| *k != "pos_weight_shape"));
    let parse = |json: serde_json::Value| {
        parse_op(
            "binary_cross_entropy_with_logits",
            2,
            json.as_object().unwrap().clone(),
        )
    };
    assert_eq!(
        parse(serde_json::json!({"pos_weight": [1, 2]})).unwrap(),
        old
    );
    for bad in [
        serde_json::json!({"pos_weight_shape": [2]}),
        serde_json::json!({"pos_weight": [1, 2, 3], "pos_weight_shape": [2, 1]}),
        serde_json::json!({"pos_weight": [1, 2], "pos_weight_shape": [1, 1]}),
    ] {
        let err = parse(bad.clone()).unwrap_err().to_string();
        assert!(
            err.contains("binary_cross_entropy_with_logits") && err.contains("pos_weight"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn graph_files_take_a_negative_ignore_index_and_older_files_read_the_same() {
    let padded = Spatial {
        dims: vec![2, 3, 2],
        targets: vec![0, -100, 2, -100],
        weight: None,
        ignore_index: Some(-100),
        smoothing: 0.1,
        reduction: Reduction::Mean,
    };
    round_trips(&padded.cross_entropy(), 1);
    round_trips(
        &Spatial {
            smoothing: 0.0,
            ..padded.clone()
        }
        .nll(),
        1,
    );
    let attrs = serde_json::json!({"targets": [1, -100, 0], "ignore_index": -100});
    let op = parse_op("nll_loss", 1, attrs.as_object().unwrap().clone()).unwrap();
    let x = Tensor::new(&[3, 2], vec![-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]).unwrap();
    assert_eq!(fwd(&op, &[&x]).data(), &[(2.0 + 5.0) / 2.0]);
    // A file written before labels were signed: non-negative labels and ignore_index.
    let attrs = serde_json::json!({"targets": [1, 4, 0], "ignore_index": 4, "reduction": "sum"});
    let op = parse_op("cross_entropy", 1, attrs.as_object().unwrap().clone()).unwrap();
    assert_eq!(
        op,
        Op::Loss(LossOp::CrossEntropy(CrossEntropy {
            targets: Arc::new(vec![1, 4, 0]),
            reduction: Reduction::Sum,
            weight: None,
            ignore_index: Some(4),
            label_smoothing: 0.0,
        }))
    );
    // A negative label that is not the ignored one is refused when the node is evaluated.
    let attrs = serde_json::json!({"targets": [1, -1, 0], "ignore_index": -100});
    let op = parse_op("nll_loss", 1, attrs.as_object().unwrap().clone()).unwrap();
    let err = op.forward(&[&x]).unwrap_err().to_string();
    assert!(err.contains("nll_loss") && err.contains("-1"), "{err}");
}
