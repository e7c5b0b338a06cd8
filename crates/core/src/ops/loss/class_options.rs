//! PyTorch's options of the class-label losses: per-class `weight`, `ignore_index` and (for
//! cross_entropy) `label_smoothing`, with their per-sample losses, gradients and tangents written
//! out. With no option set, a loss keeps the plain path of `label_losses.rs`, which they reduce to.

use std::sync::Arc;
use tapegrad_tensor::kernels::{exp_sum, pairwise_sum, pairwise_sum_by};
use tapegrad_tensor::{Error, Result, Scalar};

/// The options of one class-label loss, checked against its number of classes.
pub(super) struct Weighting<'a> {
    weight: Option<&'a [f64]>,
    /// Only when some label carries it: an ignore_index that no label matches changes nothing,
    /// so such a loss (PyTorch's default -100 without padding) keeps the plain path.
    ignore_index: Option<i64>,
    smoothing: f64,
    classes: usize,
    /// The sum of the class weights (the class count without weights), for the smoothing
    /// term's gradient: computed once, not once per sample.
    all_weights: f64,
}

impl<'a> Weighting<'a> {
    /// Checks the options of `op` for an input with `classes` classes and `targets` (already
    /// checked: each in range or the ignored one): one weight per class and a smoothing in
    /// [0, 1], as PyTorch requires.
    pub(super) fn new(
        op: &'static str,
        weight: &'a Option<Arc<Vec<f64>>>,
        (ignore_index, targets): (Option<i64>, &[i64]),
        smoothing: f64,
        classes: usize,
    ) -> Result<Self> {
        if let Some(w) = weight {
            if w.len() != classes {
                return Err(Error::invalid(
                    op,
                    format!(
                        "weight must have one entry per class: the input has {classes} classes, \
                         weight has {} entries",
                        w.len()
                    ),
                ));
            }
        }
        if !(0.0..=1.0).contains(&smoothing) {
            return Err(Error::invalid(
                op,
                format!("label_smoothing must be between 0 and 1, found {smoothing}"),
            ));
        }
        let weight = weight.as_deref().map(Vec::as_slice);
        Ok(Weighting {
            weight,
            ignore_index: ignore_index.filter(|i| targets.contains(i)),
            smoothing,
            classes,
            all_weights: weight.map_or(classes as f64, |w| w.iter().sum()),
        })
    }

    /// No option set: the loss is the plain one.
    pub(super) fn is_plain(&self) -> bool {
        self.weight.is_none() && self.ignore_index.is_none() && self.smoothing == 0.0
    }

    /// Whether a sample with this label is left out (its loss and gradient are 0 and it does not
    /// count in the mean).
    pub(super) fn ignored(&self, label: i64) -> bool {
        self.ignore_index == Some(label)
    }

    pub(super) fn class_weight<S: Scalar>(&self, class: usize) -> S {
        self.weight.map_or(S::ONE, |w| S::from_f64(w[class]))
    }

    /// The mean's divisor: the sum of the counted samples' label weights (PyTorch's total weight,
    /// added pairwise), their number when no weight is given.
    pub(super) fn total_weight<S: Scalar>(&self, targets: &[i64]) -> S {
        let counted = targets.iter().filter(|&&t| !self.ignored(t));
        match self.weight {
            None => S::from_usize(counted.count()),
            Some(_) => {
                let weights: Vec<S> = counted
                    .map(|&t| self.class_weight::<S>(class_of(t)))
                    .collect();
                pairwise_sum(&weights)
            }
        }
    }

    /// The label for the softmax kernel, which needs one in range even for an ignored sample.
    pub(super) fn kernel_label(&self, label: i64) -> usize {
        if self.ignored(label) {
            0
        } else {
            class_of(label)
        }
    }

    /// Per-sample cross entropy from the logits `x` (rows of `classes`):
    /// `(1 - e) w_y (-lp_y) + (e / C) sum_c w_c (-lp_c)` with `lp = log_softmax(row)`, 0 for an
    /// ignored sample. `-lp_c` is computed as `log_softmax` does: `ln(total) - (x_c - max)`.
    pub(super) fn cross_entropy_losses<S: Scalar>(&self, x: &[S], targets: &[i64]) -> Vec<S> {
        let c = self.classes;
        let (keep, share) = self.smoothing_factors::<S>();
        targets
            .iter()
            .enumerate()
            .map(|(i, &label)| {
                if self.ignored(label) {
                    return S::ZERO;
                }
                let row = &x[i * c..(i + 1) * c];
                let m = row.iter().fold(S::NEG_INFINITY, |m, &v| m.max_nan(v));
                let m = if m.is_finite() { m } else { S::ZERO };
                let ln_total = exp_sum(row, m).ln();
                let neg_lp = |v: S| -((v - m) - ln_total);
                let label = class_of(label);
                let mut loss = keep * self.class_weight::<S>(label) * neg_lp(row[label]);
                if self.smoothing != 0.0 {
                    let smooth = pairwise_sum_by(c, |j| self.class_weight::<S>(j) * neg_lp(row[j]));
                    loss += share * smooth;
                }
                loss
            })
            .collect()
    }

    /// Per-sample nll_loss `-w_y x[y]`, 0 for an ignored sample.
    pub(super) fn nll_losses<S: Scalar>(&self, x: &[S], targets: &[i64]) -> Vec<S> {
        let c = self.classes;
        targets
            .iter()
            .enumerate()
            .map(|(i, &label)| {
                if self.ignored(label) {
                    S::ZERO
                } else {
                    let label = class_of(label);
                    -x[i * c + label] * self.class_weight::<S>(label)
                }
            })
            .collect()
    }

    /// `(1 - e, e / C)`: the weights of the label's term and of each class's smoothing term.
    pub(super) fn smoothing_factors<S: Scalar>(&self) -> (S, S) {
        let e = S::from_f64(self.smoothing);
        let share = if self.smoothing == 0.0 {
            S::ZERO
        } else {
            e / S::from_usize(self.classes)
        };
        (S::ONE - e, share)
    }

    /// The derivative of one sample's cross entropy with respect to logit `j`, from the row's
    /// softmax `p`: `a p_j - (e / C) w_j - [j = y] (1 - e) w_y` with
    /// `a = (1 - e) w_y + (e / C) sum_c w_c`. Calls `each(j, derivative)` for every class.
    fn cross_entropy_partials<S: Scalar>(&self, p: &[S], label: usize, mut each: impl FnMut(S)) {
        let (keep, share) = self.smoothing_factors::<S>();
        let w_label = keep * self.class_weight::<S>(label);
        let a = w_label + share * S::from_f64(self.all_weights);
        for (j, &pj) in p.iter().enumerate() {
            let mut d = a * pj - share * self.class_weight::<S>(j);
            if j == label {
                d -= w_label;
            }
            each(d);
        }
    }

    /// Writes `g` times the gradient of one sample's cross entropy into `out` (zeros for an
    /// ignored sample).
    pub(super) fn cross_entropy_row_grad<S: Scalar>(
        &self,
        p: &[S],
        label: i64,
        g: S,
        out: &mut [S],
    ) {
        if self.ignored(label) {
            out.fill(S::ZERO);
            return;
        }
        let mut slots = out.iter_mut();
        self.cross_entropy_partials(p, class_of(label), |d| {
            if let Some(slot) = slots.next() {
                *slot = d * g;
            }
        });
    }

    /// The tangent of one sample's cross entropy along the logits' tangent row `t` (0 for an
    /// ignored sample).
    pub(super) fn cross_entropy_row_tangent<S: Scalar>(&self, p: &[S], label: i64, t: &[S]) -> S {
        if self.ignored(label) {
            return S::ZERO;
        }
        let mut total = S::ZERO;
        let mut ts = t.iter();
        self.cross_entropy_partials(p, class_of(label), |d| {
            if let Some(&tj) = ts.next() {
                total += d * tj;
            }
        });
        total
    }

    /// One sample's nll_loss derivative with respect to its label's entry: `-w_y` (0 if ignored).
    pub(super) fn nll_partial<S: Scalar>(&self, label: i64) -> S {
        if self.ignored(label) {
            S::ZERO
        } else {
            -self.class_weight::<S>(class_of(label))
        }
    }
}

/// A counted label as a class index. The labels were checked (`classes` in `mod.rs`): each is
/// in `0..C` unless it is the ignored one, which no caller indexes with.
pub(super) fn class_of(label: i64) -> usize {
    usize::try_from(label).unwrap_or(usize::MAX)
}
