//! Reductions over any set of axes, with or without keepdim: sum, mean and max, plus
//! `expand_reduced`, which broadcasts a reduced gradient back over the reduced axes, and
//! `pairwise_sum`, the same blocked pairwise order for one list of terms.

use super::broadcast::broadcast_to;
use super::workers::for_each_chunk_mut;
use crate::{Error, Result, Scalar, Shape, Tensor};

/// Input elements per thread below which a reduction over leading axes stays on one thread (an
/// add per element at memory speed: about 4 us for 16k f32 elements, a few hand-offs' worth).
const MIN_REDUCE_PER_THREAD: usize = 1 << 14;

/// Checks that `axes` are in range and distinct. Without it an out-of-range axis would be silently
/// ignored by `sum_axes` (or panic in `mean_axes`), and a repeated one would make the mean count
/// wrong.
fn check_axes(op: &'static str, shape: &Shape, axes: &[usize]) -> Result<()> {
    for (i, &a) in axes.iter().enumerate() {
        if a >= shape.rank() {
            return Err(Error::Axis {
                op,
                axis: a as isize,
                rank: shape.rank(),
            });
        }
        if axes[..i].contains(&a) {
            return Err(Error::invalid(
                op,
                format!("axis {a} is repeated in {axes:?} (shape {shape})"),
            ));
        }
    }
    Ok(())
}

/// Output shape of reducing `shape` over normalised `axes`.
pub fn reduced_shape(shape: &Shape, axes: &[usize], keepdim: bool) -> Result<Shape> {
    let dims: Vec<usize> = shape
        .dims()
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| match (axes.contains(&i), keepdim) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    Shape::for_op("reduce", dims)
}

/// Elements of one output folded left to right before partial results are paired (see
/// `fold_run`): short enough that the error of a sum stays near an ulp of the sum of |x|.
const FOLD_BLOCK: usize = 32;

/// Where a run of `n > FOLD_BLOCK` elements splits in two: after half its blocks, rounded up.
fn fold_split(n: usize) -> usize {
    n.div_ceil(FOLD_BLOCK).div_ceil(2) * FOLD_BLOCK
}

/// Folds one output's elements, in the order the reduced axes give them, pairwise: runs of up to
/// `FOLD_BLOCK` left to right from `init`, the two halves (split by `fold_split`) folded
/// separately and then combined. A sum of n values is then off by O(log n) rounding errors of
/// the sum of their magnitudes, not O(n) (a float32 sum of 10^5 positive values is 34-106 ulps
/// off with one running total, against PyTorch's 1). The order depends on `n` alone, so every
/// path below (and every thread count) gives the same bits.
fn fold_run<S: Scalar>(run: &[S], init: S, f: &impl Fn(S, S) -> S) -> S {
    if run.len() <= FOLD_BLOCK {
        return run.iter().fold(init, |a, &v| f(a, v));
    }
    let (left, right) = run.split_at(fold_split(run.len()));
    f(fold_run(left, init, f), fold_run(right, init, f))
}

/// `fold_run`'s order over the `n` values `at(0), ..., at(n - 1)`, added from zero: the same
/// blocks and the same splits, so the same bits as `sum_axes` over those values laid out in a
/// row. For sums whose terms are not stored in a row (a strided softmax line, `exp` of each
/// logit made on the way).
fn pairwise_by<S: Scalar>(start: usize, n: usize, at: &impl Fn(usize) -> S) -> S {
    if n <= FOLD_BLOCK {
        return (start..start + n).fold(S::ZERO, |a, i| a + at(i));
    }
    let left = fold_split(n);
    pairwise_by(start, left, at) + pairwise_by(start + left, n - left, at)
}

/// The sum of `values` in `fold_run`'s blocked pairwise order: the bits `sum_axes` gives for
/// them, off by O(log n) roundings of the sum of their magnitudes where one running total is
/// off by O(n). For the losses' `mean` and `sum` and the softmax denominators.
pub fn pairwise_sum<S: Scalar>(values: &[S]) -> S {
    pairwise_by(0, values.len(), &|i| values[i])
}

/// `pairwise_sum` of `at(0), ..., at(n - 1)`: the same order and bits as `pairwise_sum` of
/// those values collected in a row.
pub fn pairwise_sum_by<S: Scalar>(n: usize, at: impl Fn(usize) -> S) -> S {
    pairwise_by(0, n, &at)
}

/// The length `n` values take in `pairwise_sum`'s order once their last block is filled up: the
/// order's tree of blocks depends on their count alone, so `n` values followed by zeros up to
/// this length sum to the same bits (a total that starts at +0 is never -0, and `x + 0 = x`).
pub fn pairwise_span(n: usize) -> usize {
    n.div_ceil(FOLD_BLOCK) * FOLD_BLOCK
}

/// `pairwise_sum_by` of `G` rows at once: sum `g` is `pairwise_sum_by(n, |j| at(g, j))`, bit
/// for bit. The rows' additions are interleaved, so the `G` running totals of a block advance
/// together instead of each waiting for its own previous addition (short rows are bound by that
/// latency, not by the additions themselves).
#[inline(always)]
pub fn pairwise_sums_by<S: Scalar, const G: usize>(
    n: usize,
    at: &impl Fn(usize, usize) -> S,
) -> [S; G] {
    lockstep_by(0, n, at)
}

fn lockstep_by<S: Scalar, const G: usize>(
    start: usize,
    n: usize,
    at: &impl Fn(usize, usize) -> S,
) -> [S; G] {
    if n <= FOLD_BLOCK {
        let mut totals = [S::ZERO; G];
        for j in start..start + n {
            for (g, total) in totals.iter_mut().enumerate() {
                *total += at(g, j);
            }
        }
        return totals;
    }
    let left = fold_split(n);
    let (a, b) = (
        lockstep_by::<S, G>(start, left, at),
        lockstep_by::<S, G>(start + left, n - left, at),
    );
    std::array::from_fn(|g| a[g] + b[g])
}

/// Folds `t` over `axes` (normalised, distinct) with `f`, each output slot from `init` in
/// `fold_run`'s order.
fn fold_axes<S: Scalar>(
    op: &'static str,
    t: &Tensor<S>,
    axes: &[usize],
    keepdim: bool,
    init: S,
    f: impl Fn(S, S) -> S + Sync,
) -> Result<Tensor<S>> {
    check_axes(op, t.shape(), axes)?;
    let kept = reduced_shape(t.shape(), axes, true)?;
    let out = reduced_shape(t.shape(), axes, keepdim)?;
    // Fast path: reducing exactly the trailing axes, so each output is one contiguous run.
    let trailing = axes
        .iter()
        .enumerate()
        .all(|(i, &a)| a == t.rank() - axes.len() + i);
    // `kept` and `out` differ only in unit axes, so they hold the same number of elements.
    let leading = axes.iter().enumerate().all(|(i, &a)| a == i);
    if !leading && !trailing {
        // The reduced axes moved last (each keeping its place among them, so every output's
        // elements keep their order): one copy, then the trailing path.
        let mut order: Vec<usize> = (0..t.rank()).filter(|d| !axes.contains(d)).collect();
        order.extend_from_slice(axes);
        let moved = super::permute(t, &order)?;
        let last: Vec<usize> = (t.rank() - axes.len()..t.rank()).collect();
        let folded = fold_axes(op, &moved, &last, true, init, f)?;
        return folded.reshape(out.dims());
    }
    let src = t.data();
    Ok(Tensor::from_writer(out, |acc| {
        acc.fill(init);
        if leading && !trailing {
            fold_rows(src, acc, init, &f);
        } else if kept.numel() > 0 {
            let run = t.numel() / kept.numel();
            if run > 0 {
                for (slot, chunk) in acc.iter_mut().zip(src.chunks(run)) {
                    *slot = fold_run(chunk, init, &f);
                }
            }
        }
    }))
}

/// Folds the rows of `src` (a matrix of `acc.len()` columns, `acc` filled with `init`) into
/// `acc`, each column in `fold_run`'s order over the rows. Long folds are split by columns (whole
/// cache lines per thread), never by rows: every column keeps its one order of additions, so the
/// bits are the same for every thread count.
fn fold_rows<S: Scalar>(src: &[S], acc: &mut [S], init: S, f: &(impl Fn(S, S) -> S + Sync)) {
    let cols = acc.len();
    if cols == 0 {
        return;
    }
    let rows = src.len() / cols;
    let serial =
        |start: usize, acc: &mut [S]| fold_row_range(src, cols, start, 0..rows, acc, init, f);
    if src.len() < 2 * MIN_REDUCE_PER_THREAD || rows == 0 {
        return serial(0, acc);
    }
    let min_cols = MIN_REDUCE_PER_THREAD.div_ceil(rows).max(16);
    for_each_chunk_mut(acc, min_cols, serial);
}

/// `fold_run` over `rows` of the columns `start..start + acc.len()`, all columns at once.
fn fold_row_range<S: Scalar>(
    src: &[S],
    cols: usize,
    start: usize,
    rows: std::ops::Range<usize>,
    acc: &mut [S],
    init: S,
    f: &impl Fn(S, S) -> S,
) {
    if rows.len() <= FOLD_BLOCK {
        let end = start + acc.len();
        for row in src[rows.start * cols..rows.end * cols].chunks_exact(cols) {
            for (a, &v) in acc.iter_mut().zip(&row[start..end]) {
                *a = f(*a, v);
            }
        }
        return;
    }
    let mid = rows.start + fold_split(rows.len());
    fold_row_range(src, cols, start, rows.start..mid, acc, init, f);
    let mut right = vec![init; acc.len()];
    fold_row_range(src, cols, start, mid..rows.end, &mut right, init, f);
    for (a, r) in acc.iter_mut().zip(right) {
        *a = f(*a, r);
    }
}

/// The sums of the columns of a matrix `t` (rows, cols): `sum_axes(t, &[0], false)` with the same
/// bits (each column in `fold_run`'s order from zero), without its axis bookkeeping. The bias
/// gradient of a linear layer.
pub fn column_sums<S: Scalar>(t: &Tensor<S>) -> Result<Tensor<S>> {
    let &[_, cols] = t.dims() else {
        return Err(Error::invalid(
            "column_sums",
            format!("expected a matrix, got shape {}", t.shape()),
        ));
    };
    Ok(Tensor::from_writer(Shape::new([cols])?, |acc| {
        acc.fill(S::ZERO);
        fold_rows(t.data(), acc, S::ZERO, &|a, b| a + b);
    }))
}

/// Sum over `axes` (normalised).
pub fn sum_axes<S: Scalar>(t: &Tensor<S>, axes: &[usize], keepdim: bool) -> Result<Tensor<S>> {
    fold_axes("sum", t, axes, keepdim, S::ZERO, |a, b| a + b)
}

/// Mean over `axes` (normalised). The mean of zero elements is NaN, as in PyTorch.
pub fn mean_axes<S: Scalar>(t: &Tensor<S>, axes: &[usize], keepdim: bool) -> Result<Tensor<S>> {
    check_axes("mean", t.shape(), axes)?;
    let count: usize = axes.iter().map(|&a| t.dims()[a]).product();
    let count = S::from_usize(count);
    // Divide rather than multiply by 1/count: `sum * fl(1/n)` is off by an ulp for e.g. 5/3.
    Ok(sum_axes(t, axes, keepdim)?.map(|v| v / count))
}

/// Max over `axes` (normalised); NaN propagates. Errors on an empty reduction, as PyTorch does.
pub fn max_axes<S: Scalar>(t: &Tensor<S>, axes: &[usize], keepdim: bool) -> Result<Tensor<S>> {
    check_axes("amax", t.shape(), axes)?;
    if axes.iter().any(|&a| t.dims()[a] == 0) {
        return Err(crate::Error::invalid(
            "amax",
            format!(
                "cannot take the max over an empty axis of shape {}",
                t.shape()
            ),
        ));
    }
    fold_axes("amax", t, axes, keepdim, S::NEG_INFINITY, |a, b| {
        a.max_nan(b)
    })
}

/// Broadcasts a gradient `g` of the reduced shape back to `in_shape` (the VJP of sum).
pub fn expand_reduced<S: Scalar>(
    g: &Tensor<S>,
    in_shape: &Shape,
    axes: &[usize],
    keepdim: bool,
) -> Result<Tensor<S>> {
    check_axes("expand_reduced", in_shape, axes)?;
    // A gradient of any other shape with the right element count would otherwise be silently
    // reinterpreted by the reshape below.
    let expected = reduced_shape(in_shape, axes, keepdim)?;
    if *g.shape() != expected {
        return Err(Error::ShapeMismatch {
            op: "expand_reduced",
            expected: Box::new(expected),
            found: Box::new(g.shape().clone()),
        });
    }
    let kept = reduced_shape(in_shape, axes, true)?;
    let g = if keepdim {
        g.clone()
    } else {
        g.reshape_to(&kept)?
    };
    broadcast_to(&g, in_shape)
}
