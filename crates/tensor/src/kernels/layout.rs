//! Layout kernels that move elements without arithmetic: permute/transpose, slice with a step, and
//! concatenation along an axis. Each checks its arguments and names itself in errors.

use super::strided_walk;
use crate::{normalize_axis, Error, Result, Scalar, Shape, Tensor};

/// Reorders axes: output axis `i` is input axis `dims[i]`. `dims` must be a permutation.
pub fn permute<S: Scalar>(t: &Tensor<S>, dims: &[usize]) -> Result<Tensor<S>> {
    let rank = t.rank();
    let mut seen = vec![false; rank];
    if dims.len() != rank {
        return Err(Error::invalid(
            "permute",
            format!(
                "dims {dims:?} has {} entries for a tensor of shape {}",
                dims.len(),
                t.shape()
            ),
        ));
    }
    for &d in dims {
        if d >= rank || seen[d] {
            return Err(Error::invalid(
                "permute",
                format!(
                    "dims {dims:?} is not a permutation of 0..{rank} (shape {})",
                    t.shape()
                ),
            ));
        }
        seen[d] = true;
    }
    if dims.iter().enumerate().all(|(i, &d)| i == d) {
        return Ok(t.clone());
    }
    if swaps_last_two(dims) {
        return transpose_last_two(t);
    }
    let in_strides = t.shape().strides();
    let out_dims: Vec<usize> = dims.iter().map(|&d| t.dims()[d]).collect();
    let walk: Vec<usize> = dims.iter().map(|&d| in_strides[d]).collect();
    let src = t.data();
    let shape = Shape::for_op("permute", &out_dims)?;
    let kept = kept_trailing_axes(dims);
    if kept > 0 {
        return Ok(Tensor::from_writer(shape, |dst| {
            copy_runs(src, &out_dims, &walk, kept, dst)
        }));
    }
    Ok(Tensor::from_writer(shape, |dst| {
        strided_walk(&out_dims, [&walk], |lin, [i]| dst[lin] = src[i])
    }))
}

/// How many trailing axes `dims` leaves in place (`dims[k] == k` from the end): their elements
/// stay contiguous, in runs the permutation moves whole.
fn kept_trailing_axes(dims: &[usize]) -> usize {
    let rank = dims.len();
    (0..rank).rev().take_while(|&k| dims[k] == k).count()
}

/// The permutation that keeps its last `kept` axes (output dims `out_dims`, input strides per
/// output axis `walk`) as one copy of a contiguous run per index of the leading axes, e.g. the
/// head split [B, T, H, D] -> [B, H, T, D] as B H T copies of D elements, not an element-wise
/// strided walk.
fn copy_runs<S: Scalar>(src: &[S], out_dims: &[usize], walk: &[usize], kept: usize, dst: &mut [S]) {
    let lead = out_dims.len() - kept;
    let run: usize = out_dims[lead..].iter().product();
    if run == 0 || dst.is_empty() {
        return;
    }
    strided_walk(&out_dims[..lead], [&walk[..lead]], |lin, [i]| {
        dst[lin * run..(lin + 1) * run].copy_from_slice(&src[i..i + run])
    });
}

/// Whether `dims` keeps every axis but swaps the last two (a batch of matrix transposes).
fn swaps_last_two(dims: &[usize]) -> bool {
    let rank = dims.len();
    rank >= 2
        && dims[rank - 2] == rank - 1
        && dims[rank - 1] == rank - 2
        && dims[..rank - 2].iter().enumerate().all(|(i, &d)| i == d)
}

/// `t` with its last two axes swapped: each `(r, c)` matrix of the batch transposed by
/// [`transpose_matrix_into`], not by the general strided walk.
fn transpose_last_two<S: Scalar>(t: &Tensor<S>) -> Result<Tensor<S>> {
    let rank = t.rank();
    let (r, c) = (t.dims()[rank - 2], t.dims()[rank - 1]);
    let mut out_dims = t.dims().to_vec();
    out_dims.swap(rank - 2, rank - 1);
    let shape = Shape::for_op("transpose", &out_dims)?;
    let src = t.data();
    Ok(Tensor::from_writer(shape, |dst| {
        let matrix = r * c;
        if matrix == 0 {
            return;
        }
        for (s, d) in src.chunks_exact(matrix).zip(dst.chunks_exact_mut(matrix)) {
            transpose_matrix_into(s, r, c, d);
        }
    }))
}

/// Writes the transpose of the row-major `(r, c)` matrix `src` into `dst` (`(c, r)`). Eight
/// rows of `src` at a time: each column of the eight becomes eight consecutive elements of a
/// `dst` row, so every read walks eight cache lines in step and every write is a short
/// contiguous run (one slice check per run and per row); the last `r % 8` rows go element by
/// element.
fn transpose_matrix_into<S: Scalar>(src: &[S], r: usize, c: usize, dst: &mut [S]) {
    const ROWS: usize = 8;
    if r == 0 || c == 0 {
        return;
    }
    let whole = r / ROWS * ROWS;
    for (b, block) in src[..whole * c].chunks_exact(ROWS * c).enumerate() {
        let rows: [&[S]; ROWS] = std::array::from_fn(|t| &block[t * c..(t + 1) * c]);
        let i0 = b * ROWS;
        for (j, dst_row) in dst.chunks_exact_mut(r).take(c).enumerate() {
            for (d, row) in dst_row[i0..i0 + ROWS].iter_mut().zip(&rows) {
                *d = row[j];
            }
        }
    }
    for i in whole..r {
        for j in 0..c {
            dst[j * r + i] = src[i * c + j];
        }
    }
}

/// The inverse permutation of `dims`.
pub fn inverse_permutation(dims: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; dims.len()];
    for (i, &d) in dims.iter().enumerate() {
        inv[d] = i;
    }
    inv
}

/// Swaps two (normalised) axes.
pub fn transpose<S: Scalar>(t: &Tensor<S>, a: usize, b: usize) -> Result<Tensor<S>> {
    let mut dims: Vec<usize> = (0..t.rank()).collect();
    if a >= t.rank() || b >= t.rank() {
        return Err(Error::Axis {
            op: "transpose",
            axis: a.max(b) as isize,
            rank: t.rank(),
        });
    }
    dims.swap(a, b);
    permute(t, &dims)
}

/// Elements `start, start + step, ...` below `end` along `axis` (normalised); `step >= 1`.
pub fn slice<S: Scalar>(
    t: &Tensor<S>,
    axis: usize,
    start: usize,
    end: usize,
    step: usize,
) -> Result<Tensor<S>> {
    // Checked here (as `transpose` does) so a bad axis is an error rather than an index panic.
    if axis >= t.rank() {
        return Err(Error::Axis {
            op: "slice",
            axis: axis as isize,
            rank: t.rank(),
        });
    }
    let len = t.dims()[axis];
    if step == 0 || start > end || end > len {
        return Err(Error::invalid(
            "slice",
            format!(
                "range {start}..{end} step {step} is invalid for axis {axis} of length {len} (shape {})",
                t.shape()
            ),
        ));
    }
    let count = (end - start).div_ceil(step);
    // Taking at most one element makes the step irrelevant; a huge step must not overflow offsets.
    let step = if count <= 1 { 1 } else { step };
    let mut out_dims = t.dims().to_vec();
    out_dims[axis] = count;
    let strides = t.shape().strides();
    let mut walk = strides.clone();
    walk[axis] = strides[axis] * step;
    let base = start * strides[axis];
    let src = t.data();
    let shape = Shape::for_op("slice", &out_dims)?;
    Ok(Tensor::from_writer(shape, |dst| {
        strided_walk(&out_dims, [&walk], |lin, [i]| dst[lin] = src[base + i])
    }))
}

/// The shape of `parts` concatenated along `axis` (may be negative), with the axis resolved:
/// every other dimension must agree. The one shape rule of concatenation (the `concat` op uses
/// it too).
pub fn concat_shape(parts: &[&Shape], axis: isize) -> Result<(Shape, usize)> {
    let first = *parts
        .first()
        .ok_or_else(|| Error::invalid("concat", "needs at least one tensor"))?;
    if first.rank() == 0 {
        return Err(Error::invalid(
            "concat",
            format!("cannot concatenate a rank-0 tensor (shape {first})"),
        ));
    }
    let ax = normalize_axis("concat", axis, first.rank()).map_err(|_| {
        Error::invalid(
            "concat",
            format!("axis {axis} is out of range for input of shape {first}"),
        )
    })?;
    let mut out_dims = first.dims().to_vec();
    out_dims[ax] = 0;
    for p in parts {
        let compatible = p.rank() == first.rank()
            && p.dims()
                .iter()
                .zip(first.dims())
                .enumerate()
                .all(|(i, (a, b))| i == ax || a == b);
        if !compatible {
            return Err(Error::ShapeMismatch {
                op: "concat",
                expected: Box::new(first.clone()),
                found: Box::new((*p).clone()),
            });
        }
        out_dims[ax] = out_dims[ax]
            .checked_add(p.dims()[ax])
            .ok_or_else(|| Error::Overflow {
                op: "concat",
                dims: out_dims.clone(),
            })?;
    }
    Ok((Shape::for_op("concat", out_dims)?, ax))
}

/// Concatenates tensors along `axis` (may be negative); all other dimensions must agree.
pub fn concat<S: Scalar>(parts: &[&Tensor<S>], axis: isize) -> Result<Tensor<S>> {
    let shapes: Vec<&Shape> = parts.iter().map(|p| p.shape()).collect();
    let (shape, ax) = concat_shape(&shapes, axis)?;
    let first = parts[0];
    let outer: usize = first.dims()[..ax].iter().product();
    // The parts' runs tile the output in order, so every element is written once.
    Ok(Tensor::from_writer(shape, |dst| {
        // An empty result has nothing to copy, but its outer blocks may number 2^40 (a zero
        // after the axis): walking them would hang.
        if dst.is_empty() {
            return;
        }
        let mut at = 0;
        for o in 0..outer {
            for p in parts {
                let run = p.numel() / outer.max(1);
                dst[at..at + run].copy_from_slice(&p.data()[o * run..(o + 1) * run]);
                at += run;
            }
        }
    }))
}
