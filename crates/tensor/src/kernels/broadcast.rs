//! Broadcasting under NumPy/PyTorch rules: the output shape of two operands, binary maps over
//! broadcast operands, materialising a broadcast, and its adjoint `sum_to` (reducing a gradient back
//! to an operand's shape).

use super::alloc::ensure_allocatable;
use super::strided_walk;
use crate::{Error, Result, Scalar, Shape, Tensor};

/// The broadcast of two shapes (right-aligned; a dimension of 1 stretches).
pub fn broadcast_shape(op: &'static str, a: &Shape, b: &Shape) -> Result<Shape> {
    // The common cases (equal shapes, a scalar operand) need no dimension walk.
    if a == b || b.rank() == 0 {
        return Ok(a.clone());
    }
    if a.rank() == 0 {
        return Ok(b.clone());
    }
    let rank = a.rank().max(b.rank());
    // Ranks up to 8 are built on the stack: this runs on every binary op's forward.
    let mut stack = [0usize; 8];
    let mut heap = Vec::new();
    let dims: &mut [usize] = if rank <= stack.len() {
        &mut stack[..rank]
    } else {
        heap.resize(rank, 0);
        &mut heap
    };
    for (i, out) in dims.iter_mut().enumerate() {
        let da = dim_from_right(a, rank - 1 - i);
        let db = dim_from_right(b, rank - 1 - i);
        *out = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::Broadcast {
                    op,
                    lhs: Box::new(a.clone()),
                    rhs: Box::new(b.clone()),
                })
            }
        };
    }
    Shape::for_op(op, &*dims)
}

fn dim_from_right(s: &Shape, from_right: usize) -> usize {
    if from_right < s.rank() {
        s.dims()[s.rank() - 1 - from_right]
    } else {
        1
    }
}

/// Strides of `src` seen from an index of `out`: 0 on axes that `src` broadcasts along.
pub(crate) fn broadcast_strides(src: &Shape, out: &Shape) -> Vec<usize> {
    let src_strides = src.strides();
    let offset = out.rank() - src.rank();
    (0..out.rank())
        .map(|i| {
            if i < offset || src.dims()[i - offset] == 1 {
                0
            } else {
                src_strides[i - offset]
            }
        })
        .collect()
}

/// `f(a, b)` elementwise over the broadcast of the two shapes.
#[inline]
pub fn binary_map<S: Scalar>(
    op: &'static str,
    a: &Tensor<S>,
    b: &Tensor<S>,
    f: impl Fn(S, S) -> S,
) -> Result<Tensor<S>> {
    // Two one-element operands (scalar code): all their dims are 1, so the result has the
    // shape of the one of higher rank (the first when the ranks are equal), as below.
    if let (Some(x), Some(y)) = (a.the_one(), b.the_one()) {
        let shape = if b.rank() > a.rank() { b } else { a }.shape();
        return Ok(Tensor::one_element(shape.clone(), f(x, y)));
    }
    // Every path writes straight into the output's buffer (one allocation per result, none
    // when the pool has one).
    let (da, db) = (a.data(), b.data());
    if a.shape() == b.shape() {
        return Ok(Tensor::from_writer(a.shape().clone(), |dst| {
            for ((d, &x), &y) in dst.iter_mut().zip(da).zip(db) {
                *d = f(x, y);
            }
        }));
    }
    // A one-element operand of no higher rank (all its dims are 1) broadcasts to the other
    // operand's shape unchanged: no shape walk needed.
    if b.numel() == 1 && b.rank() <= a.rank() {
        let y = db[0];
        return Ok(Tensor::from_writer(a.shape().clone(), |dst| {
            for (d, &x) in dst.iter_mut().zip(da) {
                *d = f(x, y);
            }
        }));
    }
    if a.numel() == 1 && a.rank() <= b.rank() {
        let x = da[0];
        return Ok(Tensor::from_writer(b.shape().clone(), |dst| {
            for (d, &y) in dst.iter_mut().zip(db) {
                *d = f(x, y);
            }
        }));
    }
    binary_map_broadcast(op, a, b, f)
}

/// `binary_map` past its fast paths: a real broadcast (kept out of line, so the fast paths
/// inline into their callers).
#[inline(never)]
fn binary_map_broadcast<S: Scalar>(
    op: &'static str,
    a: &Tensor<S>,
    b: &Tensor<S>,
    f: impl Fn(S, S) -> S,
) -> Result<Tensor<S>> {
    let out = broadcast_shape(op, a.shape(), b.shape())?;
    // The one path whose result can be far larger than both operands.
    ensure_allocatable::<S>(op, &out)?;
    let (da, db) = (a.data(), b.data());
    // A trailing-suffix operand (bias rows): repeat it in chunks without a general walk.
    if out == *a.shape() && is_suffix(b.shape(), a.shape()) && b.numel() > 0 {
        return Ok(Tensor::from_writer(out, |dst| {
            for (d, x) in dst.chunks_mut(db.len()).zip(da.chunks(db.len())) {
                for ((d, &x), &y) in d.iter_mut().zip(x).zip(db) {
                    *d = f(x, y);
                }
            }
        }));
    }
    let sa = broadcast_strides(a.shape(), &out);
    let sb = broadcast_strides(b.shape(), &out);
    let dims = out.dims().to_vec();
    Ok(Tensor::from_writer(out, |dst| {
        strided_walk(&dims, [&sa, &sb], |lin, [ia, ib]| {
            dst[lin] = f(da[ia], db[ib])
        })
    }))
}

/// True when `small`'s dims equal the trailing dims of `big` (after dropping leading ones).
fn is_suffix(small: &Shape, big: &Shape) -> bool {
    let dims = small.dims();
    let lead = dims.iter().take_while(|&&d| d == 1).count();
    let rest = &dims[lead..];
    rest.len() <= big.rank() && big.dims()[big.rank() - rest.len()..] == *rest
}

/// Materialises `t` broadcast to `shape`.
pub fn broadcast_to<S: Scalar>(t: &Tensor<S>, shape: &Shape) -> Result<Tensor<S>> {
    if t.shape() == shape {
        return Ok(t.clone());
    }
    let out = broadcast_shape("broadcast_to", t.shape(), shape)?;
    if out != *shape {
        return Err(Error::Broadcast {
            op: "broadcast_to",
            lhs: Box::new(t.shape().clone()),
            rhs: Box::new(shape.clone()),
        });
    }
    ensure_allocatable::<S>("broadcast_to", shape)?;
    let st = broadcast_strides(t.shape(), shape);
    let src = t.data();
    Ok(Tensor::from_writer(shape.clone(), |dst| {
        strided_walk(shape.dims(), [&st], |lin, [i]| dst[lin] = src[i])
    }))
}

/// The adjoint of broadcasting: sums `g` (of a broadcast shape) down to `shape`.
pub fn sum_to<S: Scalar>(g: &Tensor<S>, shape: &Shape) -> Result<Tensor<S>> {
    if g.shape() == shape {
        return Ok(g.clone());
    }
    let out = broadcast_shape("sum_to", shape, g.shape())?;
    if out != *g.shape() {
        return Err(Error::Broadcast {
            op: "sum_to",
            lhs: Box::new(g.shape().clone()),
            rhs: Box::new(shape.clone()),
        });
    }
    let st = broadcast_strides(shape, g.shape());
    let src = g.data();
    Ok(Tensor::zeros_with(shape.clone(), |acc| {
        strided_walk(g.dims(), [&st], |lin, [i]| acc[i] += src[lin])
    }))
}
