//! cross_entropy with probability targets (PyTorch's float target of the input's shape), per row
//! of C logits: the loss `-sum_k w_k y'_k lsm_k` with `y' = (1 - e) y + e / C` and `lsm` the row's
//! log-softmax, its partials in the logits and in the targets, and its tangent.

use super::class_options::Weighting;
use super::Weights;
use tapegrad_tensor::kernels::{exp_sum, pairwise_sum_by};
use tapegrad_tensor::Scalar;

/// Per-row losses and the rows' log-softmax (kept for the VJP and JVP), from logit rows `x` and
/// target rows `y` of `c` classes. `lsm_k` is computed as `log_softmax` does:
/// `(x_k - max) - ln(sum exp(x - max))`, both sums pairwise (wide rows stay accurate).
pub(super) fn losses<S: Scalar>(
    weighting: &Weighting<'_>,
    x: &[S],
    y: &[S],
    c: usize,
    rows: usize,
) -> (Vec<S>, Vec<S>) {
    let (keep, share) = weighting.smoothing_factors::<S>();
    let mut lsm = vec![S::ZERO; x.len()];
    let per = (0..rows)
        .map(|i| {
            let row = i * c..(i + 1) * c;
            let xs = &x[row.clone()];
            let m = xs.iter().fold(S::NEG_INFINITY, |m, &v| m.max_nan(v));
            let m = if m.is_finite() { m } else { S::ZERO };
            let ln_total = exp_sum(xs, m).ln();
            for (l, &v) in lsm[row.clone()].iter_mut().zip(xs) {
                *l = (v - m) - ln_total;
            }
            let (ls, ys) = (&lsm[row.clone()], &y[row]);
            -pairwise_sum_by(c, |k| {
                ls[k] * (keep * ys[k] + share) * weighting.class_weight::<S>(k)
            })
        })
        .collect();
    (per, lsm)
}

/// `S = sum_k w_k y'_k` of one row: the weight the softmax carries in the logits' gradient.
fn smoothed_mass<S: Scalar>(weighting: &Weighting<'_>, y: &[S]) -> S {
    let (keep, share) = weighting.smoothing_factors::<S>();
    y.iter()
        .enumerate()
        .map(|(k, &t)| (keep * t + share) * weighting.class_weight::<S>(k))
        .sum()
}

/// The partials of one row's loss in its logits, `p_j S - w_j y'_j` (`p = exp(lsm)`), each passed
/// to `each`.
fn logit_partials<S: Scalar>(
    weighting: &Weighting<'_>,
    lsm: &[S],
    y: &[S],
    mut each: impl FnMut(S),
) {
    let (keep, share) = weighting.smoothing_factors::<S>();
    let mass = smoothed_mass(weighting, y);
    for (k, (&l, &t)) in lsm.iter().zip(y).enumerate() {
        each(l.exp() * mass - (keep * t + share) * weighting.class_weight::<S>(k));
    }
}

/// The partial of one row's loss in its target `k`: `-(1 - e) w_k lsm_k`.
fn target_partial<S: Scalar>(weighting: &Weighting<'_>, lsm: S, k: usize) -> S {
    let (keep, _) = weighting.smoothing_factors::<S>();
    -(keep * weighting.class_weight::<S>(k) * lsm)
}

/// The gradient in the logits, row by row, each row scaled by its cotangent `w`.
pub(super) fn grad_logits<S: Scalar>(
    weighting: &Weighting<'_>,
    lsm: &[S],
    y: &[S],
    c: usize,
    w: &Weights<'_, S>,
    out: &mut [S],
) {
    for (i, g) in out.chunks_mut(c.max(1)).enumerate() {
        let row = i * c..(i + 1) * c;
        let wi = w.at(i);
        let mut slots = g.iter_mut();
        logit_partials(weighting, &lsm[row.clone()], &y[row], |d| {
            if let Some(slot) = slots.next() {
                *slot = d * wi;
            }
        });
    }
}

/// The gradient in the targets, row by row, each row scaled by its cotangent `w`.
pub(super) fn grad_targets<S: Scalar>(
    weighting: &Weighting<'_>,
    lsm: &[S],
    c: usize,
    w: &Weights<'_, S>,
    out: &mut [S],
) {
    for (i, g) in out.chunks_mut(c.max(1)).enumerate() {
        let wi = w.at(i);
        for (k, (slot, &l)) in g.iter_mut().zip(&lsm[i * c..(i + 1) * c]).enumerate() {
            *slot = target_partial(weighting, l, k) * wi;
        }
    }
}

/// Per-row tangents along the logits' tangent `tx` and the targets' tangent `ty`.
pub(super) fn tangents<S: Scalar>(
    weighting: &Weighting<'_>,
    lsm: &[S],
    y: &[S],
    (tx, ty): (&[S], &[S]),
    c: usize,
    rows: usize,
) -> Vec<S> {
    (0..rows)
        .map(|i| {
            let row = i * c..(i + 1) * c;
            let mut total = S::ZERO;
            let mut txs = tx[row.clone()].iter();
            logit_partials(weighting, &lsm[row.clone()], &y[row.clone()], |d| {
                if let Some(&t) = txs.next() {
                    total += d * t;
                }
            });
            for (k, (&l, &t)) in lsm[row.clone()].iter().zip(&ty[row]).enumerate() {
                total += target_partial(weighting, l, k) * t;
            }
            total
        })
        .collect()
}
