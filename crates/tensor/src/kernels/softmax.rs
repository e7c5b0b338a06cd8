//! Numerically stable softmax and log-softmax along one axis: the maximum is subtracted before
//! exponentiating, so large logits neither overflow nor lose the small ones, and each row's
//! denominator is a blocked pairwise sum, so a wide row (a vocabulary) stays within a few ulps.

use super::reduce::{pairwise_sum, pairwise_sum_by};
use super::workers::{for_each_band_mut, for_each_part};
use crate::{Error, Result, Scalar, Tensor};

/// Elements per thread below which softmax stays on one thread: an `exp` and a few flops each,
/// a few nanoseconds, so 1024 elements are some microseconds, a few hand-offs' worth.
const MIN_SOFTMAX_PER_THREAD: usize = 1024;

/// Splits a shape around `axis` into (outer, len, inner) counts.
pub fn split_at_axis(dims: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = dims[..axis].iter().product();
    let inner = dims[axis + 1..].iter().product();
    (outer, dims[axis], inner)
}

/// Applies `row(x, len, stride)` to every line of `t` along `axis` (in a copy of `t`). Lines are
/// independent, so bands of whole outer blocks go to the GEMM threads when long: the same bits
/// on every thread count.
fn along_axis<S: Scalar>(
    op: &'static str,
    t: &Tensor<S>,
    axis: usize,
    row: impl Fn(&mut [S], usize, usize) + Sync,
) -> Result<Tensor<S>> {
    // `split_at_axis` would index out of bounds; a bad axis is the caller's error, not a panic.
    if axis >= t.rank() {
        return Err(Error::Axis {
            op,
            axis: axis as isize,
            rank: t.rank(),
        });
    }
    let (_, len, inner) = split_at_axis(t.dims(), axis);
    let block = len * inner;
    let src = t.data();
    Ok(Tensor::from_writer(t.shape().clone(), |out| {
        let band = |start: usize, out: &mut [S]| {
            out.copy_from_slice(&src[start..start + out.len()]);
            if block > 0 {
                for o in out.chunks_exact_mut(block) {
                    for i in 0..inner {
                        row(&mut o[i..], len, inner);
                    }
                }
            }
        };
        let min_blocks = MIN_SOFTMAX_PER_THREAD.div_ceil(block.max(1));
        for_each_band_mut(out, block, min_blocks, band);
    }))
}

/// The terms of a row's denominator: up to its last logit that is not `-inf` (a masked one,
/// whose `exp` is exactly 0). Then a causally masked row has the bits of the same row cut after
/// its last visible position, as a generation step with a key/value cache computes it; the
/// pairwise order would otherwise group the sum differently.
fn taken<S: Scalar>(len: usize, x: impl Fn(usize) -> S) -> usize {
    (0..len)
        .rev()
        .find(|&j| x(j) != S::NEG_INFINITY)
        .map_or(0, |j| j + 1)
}

/// `sum(exp(row - m))` of a contiguous row with the bits `log_softmax` gives its denominator
/// (the same terms, the same pairwise order): for the losses that take a log-softmax of their
/// own.
pub fn exp_sum<S: Scalar>(row: &[S], m: S) -> S {
    pairwise_sum_by(taken(row.len(), |j| row[j]), |j| (row[j] - m).exp())
}

/// Softmax along `axis` (normalised).
pub fn softmax<S: Scalar>(t: &Tensor<S>, axis: usize) -> Result<Tensor<S>> {
    along_axis("softmax", t, axis, |x, len, stride| {
        let m = (0..len).fold(S::NEG_INFINITY, |m, j| m.max_nan(x[j * stride]));
        // A row with no finite maximum is not shifted; an all -inf row then gives NaN, as in PyTorch.
        let m = if m.is_finite() { m } else { S::ZERO };
        let taken = taken(len, |j| x[j * stride]);
        for j in 0..len {
            x[j * stride] = (x[j * stride] - m).exp();
        }
        // Pairwise, as `pairwise_sum` of the row: one running total is 22 ulps off over 2,000
        // classes in f32.
        let total = pairwise_sum_by(taken, |j| x[j * stride]);
        for j in 0..len {
            x[j * stride] /= total;
        }
    })
}

/// Log-softmax along `axis` (normalised): `(x - max) - log(sum(exp(x - max)))`.
pub fn log_softmax<S: Scalar>(t: &Tensor<S>, axis: usize) -> Result<Tensor<S>> {
    along_axis("log_softmax", t, axis, |x, len, stride| {
        let m = (0..len).fold(S::NEG_INFINITY, |m, j| m.max_nan(x[j * stride]));
        let m = if m.is_finite() { m } else { S::ZERO };
        // The same terms in the same pairwise order as `softmax`'s denominator.
        let total = pairwise_sum_by(taken(len, |j| x[j * stride]), |j| (x[j * stride] - m).exp());
        // `(x - m) - ln(total)`, not `x - (m + ln(total))`: at logits near 1000 the sum `m + ln`
        // rounds to the ulp of 1000 (3e-5 in f32), which would swamp small log-probabilities.
        let log_total = total.ln();
        for j in 0..len {
            x[j * stride] = (x[j * stride] - m) - log_total;
        }
    })
}

/// Cross entropy's forward on `(rows, classes)` logits in one pass over each row: `probs` gets
/// the row's softmax (the same bits as [`softmax`] along the last axis) and `losses[i]` gets
/// `-log_softmax(x)[i, targets[i]]` (the same bits as [`log_softmax`] picked at the label), so
/// each logit is exponentiated once, not twice (a log-softmax, then `exp` of it).
/// Rows are independent, so long inputs are cut into bands of rows for the GEMM threads: the
/// same bits on every thread count.
///
/// The caller checks the shapes: `x` and `probs` hold `rows * classes` elements, `losses` and
/// `targets` hold `rows`, every label is below `classes` (else an error naming the op, no panic).
pub fn cross_entropy_rows<S: Scalar>(
    x: &[S],
    classes: usize,
    targets: &[usize],
    probs: &mut [S],
    losses: &mut [S],
) -> Result<()> {
    let rows = targets.len();
    let fits = rows.checked_mul(classes) == Some(x.len())
        && probs.len() == x.len()
        && losses.len() == rows
        && targets.iter().all(|&t| t < classes);
    if !fits {
        return Err(Error::invalid(
            "cross_entropy",
            format!(
                "{} logits, {} probabilities and {} losses do not make {rows} rows of {classes} classes with labels below {classes}",
                x.len(),
                probs.len(),
                losses.len()
            ),
        ));
    }
    if rows == 0 || classes == 0 {
        return Ok(());
    }
    let band = |first: usize, probs: &mut [S], losses: &mut [S]| {
        let rows_here = probs.chunks_exact_mut(classes).zip(losses.iter_mut());
        for (i, (p, loss)) in rows_here.enumerate() {
            let row = first + i;
            let xs = &x[row * classes..(row + 1) * classes];
            let m = xs.iter().fold(S::NEG_INFINITY, |m, &v| m.max_nan(v));
            let m = if m.is_finite() { m } else { S::ZERO };
            for (p, &v) in p.iter_mut().zip(xs) {
                *p = (v - m).exp();
            }
            let total = pairwise_sum(&p[..taken(classes, |j| xs[j])]);
            for p in p.iter_mut() {
                *p /= total;
            }
            // As `log_softmax`: `(x - m) - ln(total)`, negated.
            *loss = -((xs[targets[row]] - m) - total.ln());
        }
    };
    let threads = super::num_threads()
        .min(x.len() / MIN_SOFTMAX_PER_THREAD)
        .max(1);
    if threads == 1 {
        band(0, probs, losses);
        return Ok(());
    }
    let per_band = rows.div_ceil(threads);
    let parts: Vec<_> = probs
        .chunks_mut(per_band * classes)
        .zip(losses.chunks_mut(per_band))
        .enumerate()
        .map(|(k, (p, l))| (k * per_band, p, l))
        .collect();
    for_each_part(parts, |(first, p, l)| band(first, p, l));
    Ok(())
}
