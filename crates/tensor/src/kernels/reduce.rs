//! Reductions over any set of axes, with or without keepdim: sum, mean and max, plus
//! `expand_reduced`, which broadcasts a reduced gradient back over the reduced axes.

use super::broadcast::broadcast_to;
use super::strided_walk;
use super::workers::for_each_chunk_mut;
use crate::{Error, Result, Scalar, Shape, Tensor};

/// Input elements per thread below which a reduction over leading axes stays on one thread (an
/// add per element at memory speed: about 4 us for 16k f32 elements, a few hand-offs' worth).
const MIN_REDUCE_PER_THREAD: usize = 1 << 14;

/// Checks that `axes` are in range and distinct. Without it an out-of-range axis was silently
/// ignored by `sum_axes` (or panicked in `mean_axes`), and a repeated one made the mean count wrong.
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

/// Folds `t` over `axes` (normalised, distinct) with `f`, starting every output slot at `init`.
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
    let kept_strides = kept.strides();
    let walk_strides: Vec<usize> = (0..t.rank())
        .map(|d| {
            if axes.contains(&d) {
                0
            } else {
                kept_strides[d]
            }
        })
        .collect();
    let out = reduced_shape(t.shape(), axes, keepdim)?;
    let src = t.data();
    // Fast path: reducing exactly the trailing axes, so each output is one contiguous run.
    let trailing = axes
        .iter()
        .enumerate()
        .all(|(i, &a)| a == t.rank() - axes.len() + i);
    // `kept` and `out` differ only in unit axes, so they hold the same number of elements.
    let leading = axes.iter().enumerate().all(|(i, &a)| a == i);
    Ok(Tensor::from_writer(out, |acc| {
        acc.fill(init);
        if leading && !trailing {
            fold_rows(src, acc, &f);
        } else if trailing && kept.numel() > 0 {
            let run = t.numel() / kept.numel();
            if run > 0 {
                for (slot, chunk) in acc.iter_mut().zip(src.chunks(run)) {
                    for &v in chunk {
                        *slot = f(*slot, v);
                    }
                }
            }
        } else {
            strided_walk(t.dims(), [&walk_strides], |lin, [o]| {
                acc[o] = f(acc[o], src[lin])
            });
        }
    }))
}

/// Folds the rows of `src` (a matrix of `acc.len()` columns) into `acc`, row after row, so each
/// column sees its elements in the order the strided walk gives them. Long folds are split by
/// columns (whole cache lines per thread), never by rows: every column keeps its one order of
/// additions, so the bits are the same for every thread count.
fn fold_rows<S: Scalar>(src: &[S], acc: &mut [S], f: &(impl Fn(S, S) -> S + Sync)) {
    let cols = acc.len();
    if cols == 0 {
        return;
    }
    let rows = src.len() / cols;
    let serial = |start: usize, acc: &mut [S]| {
        let end = start + acc.len();
        for row in src.chunks_exact(cols) {
            for (a, &v) in acc.iter_mut().zip(&row[start..end]) {
                *a = f(*a, v);
            }
        }
    };
    if src.len() < 2 * MIN_REDUCE_PER_THREAD || rows == 0 {
        return serial(0, acc);
    }
    let min_cols = MIN_REDUCE_PER_THREAD.div_ceil(rows).max(16);
    for_each_chunk_mut(acc, min_cols, serial);
}

/// The sums of the columns of a matrix `t` (rows, cols): `sum_axes(t, &[0], false)` with the same
/// bits (each column added row after row from zero), without its axis bookkeeping. The bias
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
        fold_rows(t.data(), acc, &|a, b| a + b);
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
