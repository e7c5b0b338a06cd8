//! Extreme attributes and degenerate shapes for the non-window ops: slice, select, flatten,
//! reshape, broadcast_to, concat, transpose, permute, index_select, gather, scatter_add,
//! embedding, sum/mean/amax, softmax/log_softmax, matmul, linear, dropout, the losses and the
//! norms get small tensors, often zero-size ones whose other dims are huge (2^33, 2^40, 2^58,
//! isize::MAX, usize::MAX), while axes, bounds, steps, indices, padding_idx and p are drawn half
//! ordinary, half extreme. A call must not panic, must name the op in its errors, must follow
//! PyTorch's acceptance rule (or tapegrad's documented one: a shape whose non-zero dims multiply
//! past isize::MAX / 16 does not exist), and when accepted its output, VJP and JVP must match a
//! naive definition written here (checked arithmetic) and satisfy the adjoint identity, in f64
//! and f32 on small integers, with one and two kernel threads.

use crate::op_support::no_panic_and_named;
use crate::term_model::{apply_terms, check_against_terms, ints, one, tensor, two, Call, Term};
use proptest::prelude::*;
use proptest::test_runner::Config;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tapegrad_core::ops::linalg::{Linear, Matmul, Permute, Transpose};
use tapegrad_core::ops::loss::{CrossEntropy, MseLoss, NllLoss};
use tapegrad_core::ops::nn::{
    dropout_mask, BatchNorm, Dropout, Embedding, Gather, GroupNorm, IndexSelect, IndexTensor,
    LayerNorm, ScatterAdd, Select,
};
use tapegrad_core::ops::reduce::{Amax, LogSoftmax, Mean, Softmax, Sum};
use tapegrad_core::ops::structure::{BroadcastTo, Concat, Flatten, Reshape, Slice};
use tapegrad_core::ops::{LinalgOp, LossOp, ReduceOp, Reduction, StructureOp};
use tapegrad_core::{Op, Scalar, Shape, Tensor};
use tapegrad_tensor::kernels::set_num_threads;

/// Dims far beyond any real tensor's; allowed in a shape only beside a zero dim.
const HUGE: [usize; 6] = [
    1 << 20,
    1 << 33,
    1 << 40,
    1 << 58,
    isize::MAX as usize,
    usize::MAX,
];

/// Attribute values that overflow sums and products of indices.
const EXTREMES: [usize; 5] = [
    1 << 33,
    1 << 40,
    isize::MAX as usize,
    usize::MAX - 1,
    usize::MAX,
];

/// The most elements a generated argument or output may hold (the naive definitions and the
/// kernels walk every element).
const MAX_NUMEL: u128 = 64;

fn pick<T: Copy>(rng: &mut ChaCha8Rng, xs: &[T]) -> T {
    xs[rng.random_range(0..xs.len())]
}

/// Half ordinary (0..=5), half extreme.
fn mixed(rng: &mut ChaCha8Rng) -> usize {
    if rng.random_bool(0.5) {
        rng.random_range(0..=5)
    } else {
        pick(rng, &EXTREMES)
    }
}

/// A signed value around a length `len`: ordinary ones, the bounds PyTorch checks (-len - 1,
/// -len, -1, 0, len - 1, len) and extremes.
fn signed_near(rng: &mut ChaCha8Rng, len: usize) -> isize {
    let n = isize::try_from(len).unwrap_or(isize::MAX);
    match rng.random_range(0..3) {
        0 => rng.random_range(-4i64..=4) as isize,
        1 => pick(
            rng,
            &[
                n.saturating_neg().saturating_sub(1),
                n.saturating_neg(),
                -1,
                0,
                n.saturating_sub(1),
                n,
                n.saturating_add(1),
            ],
        ),
        _ => pick(
            rng,
            &[
                isize::MIN,
                isize::MIN + 1,
                -(1 << 40),
                1 << 33,
                1 << 40,
                isize::MAX - 1,
                isize::MAX,
            ],
        ),
    }
}

/// An axis for a tensor of rank `rank`: mostly valid (either sign), sometimes not.
fn signed_axis(rng: &mut ChaCha8Rng, rank: usize) -> isize {
    let r = rank as isize;
    if rng.random_bool(0.85) && rank > 0 {
        let a = rng.random_range(0..rank) as isize;
        if rng.random_bool(0.5) {
            a - r
        } else {
            a
        }
    } else {
        signed_near(rng, rank)
    }
}

/// PyTorch's axis normalisation (`rank` 0 counts as 1 where `scalar_ok`).
fn norm_axis(axis: isize, rank: usize) -> Option<usize> {
    let r = rank as i128;
    let a = if axis < 0 {
        axis as i128 + r
    } else {
        axis as i128
    };
    (0..r).contains(&a).then_some(a as usize)
}

/// Where tapegrad deliberately keeps a behaviour PyTorch does not share; each is checked as
/// tapegrad's, and left open for a design decision.
const DIFFERENCES: [&str; 2] = [
    // torch.func.jvp(lambda a: a.mean(), (torch.empty(0, 3),), (torch.empty(0, 3),)) gives
    // (nan, nan), as do mse_loss, binary_cross_entropy_with_logits, cross_entropy and nll_loss
    // with reduction='mean' on an empty batch: the tangent is sum(t) / 0. Here the function of
    // no elements has an empty Jacobian and its JVP is 0 (the VJP, empty, agrees either way).
    "the JVP of a mean over zero elements is 0, where PyTorch's forward AD gives NaN",
    // F.group_norm(torch.empty(2, 4, 0), 2) raises "Expected HxW to be greater than 0, got 0"
    // (N = 0 too); F.layer_norm and F.batch_norm accept the same zero-size inputs. Here
    // group_norm accepts them as the other norms do, with an empty output.
    "group_norm accepts a zero spatial extent, which PyTorch rejects",
];

// ---------------------------------------------------------------------------------------------
// Shapes.

/// Whether tapegrad's `Shape` holds `dims` (its documented rule: the non-zero dims multiply to
/// at most isize::MAX / 16, so that strides and byte counts cannot overflow). PyTorch holds more
/// (`torch.empty(2**33, 0, 2**33)` works); such shapes are rejected with an error.
fn shape_exists(dims: &[usize]) -> bool {
    let mut p: usize = 1;
    for &d in dims.iter().filter(|&&d| d > 0) {
        match p.checked_mul(d) {
            Some(q) => p = q,
            None => return false,
        }
    }
    p <= isize::MAX as usize / 16
}

fn numel(dims: &[usize]) -> u128 {
    if dims.contains(&0) {
        0
    } else {
        dims.iter().fold(1u128, |a, &d| a.saturating_mul(d as u128))
    }
}

/// One dim: mostly 0..=3, a fifth of the time huge.
fn dim(rng: &mut ChaCha8Rng) -> usize {
    if rng.random_bool(0.2) {
        pick(rng, &HUGE)
    } else {
        rng.random_range(0..=3)
    }
}

/// Dims of `rank` that form a small tensor (huge dims only beside a zero).
fn dims(rng: &mut ChaCha8Rng, rank: usize) -> Vec<usize> {
    loop {
        let d: Vec<usize> = (0..rank).map(|_| dim(rng)).collect();
        if numel(&d) <= MAX_NUMEL && shape_exists(&d) {
            return d;
        }
    }
}

/// Dims of `rank` holding no element (one dim forced to zero).
fn empty_dims(rng: &mut ChaCha8Rng, rank: usize) -> Vec<usize> {
    loop {
        let mut d = dims(rng, rank);
        if rank > 0 {
            d[rng.random_range(0..rank)] = 0;
        }
        if shape_exists(&d) && numel(&d) == 0 {
            return d;
        }
    }
}

fn unravel(mut flat: usize, dims: &[usize]) -> Vec<usize> {
    let mut c = vec![0; dims.len()];
    for (i, &d) in dims.iter().enumerate().rev() {
        c[i] = flat % d;
        flat /= d;
    }
    c
}

/// Row-major flat index of `c` in `dims`, checked (the tensor it indexes holds an element, so
/// it fits).
fn ravel(c: &[usize], dims: &[usize]) -> usize {
    c.iter().zip(dims).fold(0usize, |acc, (&x, &d)| {
        assert!(x < d, "test bug: coordinate {x} of {d}");
        acc.checked_mul(d)
            .and_then(|v| v.checked_add(x))
            .expect("test bug: flat index overflows")
    })
}

/// Calls `f(flat, coords)` for every element of `dims` (none when it holds none).
fn each(dims: &[usize], mut f: impl FnMut(usize, Vec<usize>)) {
    let n = numel(dims);
    assert!(n <= MAX_NUMEL * MAX_NUMEL, "test bug: walking {dims:?}");
    for i in 0..n as usize {
        f(i, unravel(i, dims));
    }
}

// ---------------------------------------------------------------------------------------------
// The naive definitions, as lists of terms (tests/term_model).

/// Terms of a gather-like linear map: output element `o` (coords `c`) copies argument `arg`'s
/// element at `source(c)`, if any.
fn copy_terms(
    out_dims: &[usize],
    in_dims: &[usize],
    source: impl Fn(&[usize]) -> Option<Vec<usize>>,
) -> Vec<Term> {
    let mut terms = Vec::new();
    each(out_dims, |o, c| {
        if let Some(src) = source(&c) {
            terms.push(one(o, 0, ravel(&src, in_dims), 1.0));
        }
    });
    terms
}

// ---------------------------------------------------------------------------------------------
// Cases.

type TermsAt = Box<dyn Fn(&[Vec<f64>]) -> Vec<Term>>;

enum Expect {
    /// PyTorch (or tapegrad's shape rule) rejects it: an error naming the op.
    Err,
    /// It succeeds with this shape and these terms.
    Ok(Vec<usize>, TermsAt),
}

struct Case {
    op: Op,
    shapes: Vec<Vec<usize>>,
    expect: Expect,
    /// Whether values are exact on small integers (no division).
    exact: bool,
    /// Every output is NaN: a mean over zero elements (PyTorch: 0 / 0). Its tangent is 0 (one
    /// of the DIFFERENCES).
    nan: bool,
    /// Attributes beyond PyTorch's int64: the op may reject what the rule accepts.
    may_reject: bool,
}

fn case(op: Op, shapes: Vec<Vec<usize>>, expect: Expect) -> Case {
    Case {
        op,
        shapes,
        expect,
        exact: true,
        nan: false,
        may_reject: false,
    }
}

/// `Ok(dims, terms)` when `dims` exists and is small, `Err` when it does not exist, `None` (no
/// case) when it exists but is too large to walk.
fn ok_if_exists(dims: Vec<usize>, terms: TermsAt) -> Option<Expect> {
    if !shape_exists(&dims) {
        Some(Expect::Err)
    } else if numel(&dims) > MAX_NUMEL {
        None
    } else {
        Some(Expect::Ok(dims, terms))
    }
}

fn rank(rng: &mut ChaCha8Rng, lo: usize) -> usize {
    rng.random_range(lo..=3)
}

fn slice_case(rng: &mut ChaCha8Rng) -> Option<Case> {
    let x = {
        let r = rank(rng, 0);
        dims(rng, r)
    };
    let axis = signed_axis(rng, x.len());
    let len = norm_axis(axis, x.len()).map_or(3, |a| x[a]);
    let (start, end) = (signed_near(rng, len), signed_near(rng, len));
    let step = mixed(rng);
    let op = StructureOp::Slice(Slice {
        axis,
        start,
        end,
        step,
    });
    let ax = norm_axis(axis, x.len());
    let expect = match ax {
        // torch: "slice() cannot be applied to a 0-dim tensor"; "slice step must be positive".
        Some(ax) if !x.is_empty() && step > 0 => {
            // Python's range(len)[start:end:step], exactly.
            let n = x[ax] as i128;
            let clamp = |b: isize| {
                let b = b as i128;
                (if b < 0 { b + n } else { b }).clamp(0, n)
            };
            let (s, e) = (clamp(start), clamp(end));
            let count = if e > s {
                (e - s + step as i128 - 1) / step as i128
            } else {
                0
            };
            let mut out = x.clone();
            out[ax] = count as usize;
            let xd = x.clone();
            let od = out.clone();
            ok_if_exists(
                out,
                Box::new(move |_| {
                    copy_terms(&od, &xd, |c| {
                        let mut src = c.to_vec();
                        src[ax] = (s + c[ax] as i128 * step as i128) as usize;
                        Some(src)
                    })
                }),
            )?
        }
        _ => Expect::Err,
    };
    let mut c = case(Op::Structure(op), vec![x], expect);
    // PyTorch's slice bounds and step are int64: a step beyond it cannot be asked of PyTorch.
    c.may_reject = step > i64::MAX as usize;
    Some(c)
}

fn select_case(rng: &mut ChaCha8Rng) -> Option<Case> {
    let x = {
        let r = rank(rng, 0);
        dims(rng, r)
    };
    let dim = signed_axis(rng, x.len());
    let len = norm_axis(dim, x.len()).map_or(3, |a| x[a]);
    let index = signed_near(rng, len);
    let expect = match norm_axis(dim, x.len()) {
        // torch.select: -len <= index < len; a 0-dim tensor cannot be selected from.
        Some(ax) if (-(len as i128)..len as i128).contains(&(index as i128)) => {
            let at = if index < 0 {
                (index as i128 + len as i128) as usize
            } else {
                index as usize
            };
            let mut out = x.clone();
            out.remove(ax);
            let (xd, od) = (x.clone(), out.clone());
            ok_if_exists(
                out,
                Box::new(move |_| {
                    copy_terms(&od, &xd, |c| {
                        let mut src = c.to_vec();
                        src.insert(ax, at);
                        Some(src)
                    })
                }),
            )?
        }
        _ => Expect::Err,
    };
    Some(case(Select { dim, index }.into(), vec![x], expect))
}

/// Output element `i` copies input element `i` (reshape, flatten).
fn same_order(out: Vec<usize>) -> Option<Expect> {
    let od = out.clone();
    ok_if_exists(
        out,
        Box::new(move |_| {
            let mut terms = Vec::new();
            each(&od, |o, _| terms.push(one(o, 0, o, 1.0)));
            terms
        }),
    )
}

fn flatten_case(rng: &mut ChaCha8Rng) -> Option<Case> {
    let x = {
        let r = rank(rng, 0);
        dims(rng, r)
    };
    let r = x.len();
    let (start_dim, end_dim) = (signed_axis(rng, r), signed_axis(rng, r));
    // torch.flatten treats a 0-dim tensor as 1-D (dims 0 and -1) and gives shape [1].
    let rr = r.max(1);
    let expect = match (norm_axis(start_dim, rr), norm_axis(end_dim, rr)) {
        (Some(s), Some(e)) if s <= e => {
            if r == 0 {
                same_order(vec![1])?
            } else {
                let merged = x[s..=e].iter().product::<usize>();
                let out = [&x[..s], &[merged], &x[e + 1..]].concat();
                same_order(out)?
            }
        }
        _ => Expect::Err,
    };
    Some(case(
        Op::Structure(StructureOp::Flatten(Flatten { start_dim, end_dim })),
        vec![x],
        expect,
    ))
}

fn reshape_case(rng: &mut ChaCha8Rng) -> Option<Case> {
    let x = {
        let r = rank(rng, 0);
        dims(rng, r)
    };
    let n = numel(&x);
    let target_rank = rng.random_range(0..=4);
    let mut spec: Vec<isize> = (0..target_rank)
        .map(|_| dim(rng).min(isize::MAX as usize) as isize)
        .collect();
    if target_rank > 0 && rng.random_bool(0.6) {
        let i = rng.random_range(0..target_rank);
        spec[i] = -1;
    }
    if target_rank > 0 && rng.random_bool(0.1) {
        let i = rng.random_range(0..target_rank);
        spec[i] = pick(rng, &[-1, -2, isize::MIN]);
    }
    // Often a spec that fits: the input's own dims with one of them inferred.
    if rng.random_bool(0.3) && !x.is_empty() {
        spec = x
            .iter()
            .map(|&d| d.min(isize::MAX as usize) as isize)
            .collect();
        let i = rng.random_range(0..spec.len());
        spec[i] = -1;
    }
    // torch.reshape: one -1 at most, no other negative; the -1 is inferred unless the other
    // dims hold zero elements ("the unspecified dimension size -1 can be any value and is
    // ambiguous"); the element counts must match; an overflowing product is an error.
    let inferred: Vec<usize> = (0..spec.len()).filter(|&i| spec[i] == -1).collect();
    let valid = inferred.len() <= 1 && spec.iter().all(|&d| d >= -1);
    let known: Vec<usize> = spec
        .iter()
        .filter(|&&d| d >= 0)
        .map(|&d| d as usize)
        .collect();
    let expect = if !valid || !shape_exists(&known) {
        Expect::Err
    } else {
        let k = numel(&known);
        let dims_out = match inferred.first() {
            Some(&i) if k != 0 && n % k == 0 => {
                let mut d: Vec<usize> = spec.iter().map(|&v| v.max(0) as usize).collect();
                d[i] = (n / k) as usize;
                Some(d)
            }
            Some(_) => None,
            None if k == n => Some(known.clone()),
            None => None,
        };
        match dims_out {
            Some(d) => same_order(d)?,
            None => Expect::Err,
        }
    };
    Some(case(
        Op::Structure(StructureOp::Reshape(Reshape { shape: spec })),
        vec![x],
        expect,
    ))
}

fn broadcast_case(rng: &mut ChaCha8Rng) -> Option<Case> {
    let x = {
        let r = rank(rng, 0);
        dims(rng, r)
    };
    let extra = rng.random_range(0..=2);
    let mut target: Vec<usize> = (0..extra).map(|_| dim(rng)).collect();
    for &d in &x {
        target.push(if d == 1 { dim(rng) } else { d });
    }
    if !target.is_empty() && rng.random_bool(0.15) {
        let i = rng.random_range(0..target.len());
        target[i] = dim(rng);
    }
    // torch.broadcast_to: the input's dims, aligned right, equal the target's or are 1.
    let off = target.len().wrapping_sub(x.len());
    let fits = target.len() >= x.len()
        && x.iter()
            .enumerate()
            .all(|(i, &d)| d == 1 || d == target[off + i]);
    let expect = if !fits {
        Expect::Err
    } else {
        let (xd, td) = (x.clone(), target.clone());
        ok_if_exists(
            target.clone(),
            Box::new(move |_| {
                copy_terms(&td, &xd, |c| {
                    Some(
                        xd.iter()
                            .enumerate()
                            .map(|(i, &d)| if d == 1 { 0 } else { c[off + i] })
                            .collect(),
                    )
                })
            }),
        )?
    };
    Some(case(
        Op::Structure(StructureOp::BroadcastTo(BroadcastTo { shape: target })),
        vec![x],
        expect,
    ))
}

fn concat_case(rng: &mut ChaCha8Rng) -> Option<Case> {
    let base = {
        let r = rank(rng, 0);
        dims(rng, r)
    };
    let axis = signed_axis(rng, base.len());
    let ax = norm_axis(axis, base.len());
    let pieces = rng.random_range(1..=3);
    let mut shapes = Vec::new();
    for _ in 0..pieces {
        let mut d = base.clone();
        if let Some(a) = ax {
            d[a] = dim(rng);
        }
        if !d.is_empty() && rng.random_bool(0.1) {
            let i = rng.random_range(0..d.len());
            d[i] = dim(rng);
        }
        if numel(&d) > MAX_NUMEL || !shape_exists(&d) {
            return None;
        }
        shapes.push(d);
    }
    // torch.cat: same rank (legacy 1-D empty pieces aside: not generated), same dims off the
    // axis; a 0-dim tensor cannot be concatenated.
    let expect = match ax {
        Some(a)
            if shapes.iter().all(|s| {
                s.len() == base.len() && (0..s.len()).all(|i| i == a || s[i] == shapes[0][i])
            }) =>
        {
            let total: u128 = shapes.iter().map(|s| s[a] as u128).sum();
            if total > usize::MAX as u128 {
                Expect::Err
            } else {
                let mut out = shapes[0].clone();
                out[a] = total as usize;
                let (od, sh) = (out.clone(), shapes.clone());
                ok_if_exists(
                    out,
                    Box::new(move |_| {
                        let mut terms = Vec::new();
                        each(&od, |o, c| {
                            let mut at = c[a];
                            for (p, s) in sh.iter().enumerate() {
                                if at < s[a] {
                                    let mut src = c.clone();
                                    src[a] = at;
                                    terms.push(one(o, p, ravel(&src, s), 1.0));
                                    return;
                                }
                                at -= s[a];
                            }
                            unreachable!("test bug: concat position");
                        });
                        terms
                    }),
                )?
            }
        }
        _ => Expect::Err,
    };
    Some(case(
        Op::Structure(StructureOp::Concat(Concat { axis })),
        shapes,
        expect,
    ))
}

fn permute_case(rng: &mut ChaCha8Rng) -> Option<Case> {
    let x = {
        let r = rank(rng, 1);
        dims(rng, r)
    };
    let r = x.len();
    let (op, perm): (Op, Option<Vec<usize>>) = if rng.random_bool(0.5) {
        let (d0, d1) = (signed_axis(rng, r), signed_axis(rng, r));
        let perm = match (norm_axis(d0, r), norm_axis(d1, r)) {
            (Some(a), Some(b)) => {
                let mut p: Vec<usize> = (0..r).collect();
                p.swap(a, b);
                Some(p)
            }
            _ => None,
        };
        (
            Op::Linalg(LinalgOp::Transpose(Transpose { dim0: d0, dim1: d1 })),
            perm,
        )
    } else {
        let mut p: Vec<usize> = (0..r).collect();
        for i in (1..r).rev() {
            p.swap(i, rng.random_range(0..=i));
        }
        let mut dims: Vec<isize> = p
            .iter()
            .map(|&a| {
                if rng.random_bool(0.5) {
                    a as isize - r as isize
                } else {
                    a as isize
                }
            })
            .collect();
        if rng.random_bool(0.2) {
            let i = rng.random_range(0..r);
            dims[i] = signed_axis(rng, r);
        }
        if rng.random_bool(0.05) {
            dims.push(signed_axis(rng, r));
        }
        // torch.permute: one entry per axis, each axis once.
        let norm: Option<Vec<usize>> = dims.iter().map(|&d| norm_axis(d, r)).collect();
        let perm = norm.filter(|n| {
            let mut s = n.clone();
            s.sort_unstable();
            s == (0..r).collect::<Vec<_>>()
        });
        (Op::Linalg(LinalgOp::Permute(Permute { dims })), perm)
    };
    let expect = match perm {
        Some(p) => {
            let out: Vec<usize> = p.iter().map(|&a| x[a]).collect();
            let (xd, od) = (x.clone(), out.clone());
            ok_if_exists(
                out,
                Box::new(move |_| {
                    copy_terms(&od, &xd, |c| {
                        let mut src = vec![0; c.len()];
                        for (i, &a) in p.iter().enumerate() {
                            src[a] = c[i];
                        }
                        Some(src)
                    })
                }),
            )?
        }
        None => Expect::Err,
    };
    Some(case(op, vec![x], expect))
}

/// An index value for an axis of `len`: in range mostly, sometimes at or far past the end.
fn index_value(rng: &mut ChaCha8Rng, len: usize) -> usize {
    match rng.random_range(0..6) {
        0 => len,
        1 => pick(rng, &EXTREMES),
        2 => len.saturating_sub(1),
        _ if len > 0 => rng.random_range(0..len),
        _ => rng.random_range(0..=2),
    }
}

fn index_select_case(rng: &mut ChaCha8Rng) -> Option<Case> {
    let x = {
        let r = rank(rng, 1);
        dims(rng, r)
    };
    let dim = signed_axis(rng, x.len());
    let len = norm_axis(dim, x.len()).map_or(3, |a| x[a]);
    let zero_d = rng.random_bool(0.15);
    let k = if zero_d { 1 } else { rng.random_range(0..=3) };
    let data: Vec<usize> = (0..k).map(|_| index_value(rng, len)).collect();
    let index = if zero_d {
        IndexTensor::new(&[], data.clone()).unwrap()
    } else {
        IndexTensor::vector(data.clone())
    };
    // torch.index_select: a 0-D or 1-D index, every value below the axis length.
    let expect = match norm_axis(dim, x.len()) {
        Some(ax) if data.iter().all(|&i| i < len) => {
            let mut out = x.clone();
            out[ax] = k;
            let (xd, od) = (x.clone(), out.clone());
            ok_if_exists(
                out,
                Box::new(move |_| {
                    copy_terms(&od, &xd, |c| {
                        let mut src = c.to_vec();
                        src[ax] = data[c[ax]];
                        Some(src)
                    })
                }),
            )?
        }
        _ => Expect::Err,
    };
    Some(case(IndexSelect { dim, index }.into(), vec![x], expect))
}

/// An index shape for gather/scatter_add against `x`: same rank, each dim at most x's off
/// `axis` (sometimes not), any small or zero size on it.
fn scatter_index_dims(rng: &mut ChaCha8Rng, x: &[usize], ax: Option<usize>) -> Vec<usize> {
    let mut d: Vec<usize> = x
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            if Some(i) == ax {
                rng.random_range(0..=3)
            } else if rng.random_bool(0.7) {
                n
            } else if n > 0 {
                rng.random_range(0..=n.min(3))
            } else {
                0
            }
        })
        .collect();
    if !d.is_empty() && rng.random_bool(0.1) {
        let i = rng.random_range(0..d.len());
        d[i] = self::dim(rng);
    }
    if rng.random_bool(0.05) {
        d.push(rng.random_range(0..=2));
    }
    d
}

fn gather_case(rng: &mut ChaCha8Rng) -> Option<Case> {
    let x = {
        let r = rank(rng, 1);
        dims(rng, r)
    };
    let dim = signed_axis(rng, x.len());
    let ax = norm_axis(dim, x.len());
    let id = scatter_index_dims(rng, &x, ax);
    if numel(&id) > MAX_NUMEL || !shape_exists(&id) {
        return None;
    }
    let len = ax.map_or(3, |a| x[a]);
    let data: Vec<usize> = (0..numel(&id)).map(|_| index_value(rng, len)).collect();
    let index = IndexTensor::new(&id, data.clone()).unwrap();
    // torch.gather: the index has the input's rank, no larger size off `dim`, values below the
    // size on it; the output has the index's shape.
    let expect = match ax {
        Some(a)
            if id.len() == x.len()
                && (0..x.len()).all(|i| i == a || id[i] <= x[i])
                && data.iter().all(|&v| v < len) =>
        {
            let (xd, od) = (x.clone(), id.clone());
            ok_if_exists(
                id.clone(),
                Box::new(move |_| {
                    copy_terms(&od, &xd, |c| {
                        let mut src = c.to_vec();
                        src[a] = data[ravel(c, &od)];
                        Some(src)
                    })
                }),
            )?
        }
        _ => Expect::Err,
    };
    Some(case(Gather { dim, index }.into(), vec![x], expect))
}

fn scatter_add_case(rng: &mut ChaCha8Rng) -> Option<Case> {
    let x = {
        let r = rank(rng, 1);
        dims(rng, r)
    };
    let dim = signed_axis(rng, x.len());
    let ax = norm_axis(dim, x.len());
    let id = scatter_index_dims(rng, &x, ax);
    // src: at least the index's extent everywhere (sometimes not), same rank.
    let src: Vec<usize> = id
        .iter()
        .map(|&d| {
            if rng.random_bool(0.7) {
                d
            } else {
                d.saturating_add(rng.random_range(0..=1)).min(d.max(3))
            }
        })
        .collect();
    let src = if rng.random_bool(0.05) && !src.is_empty() {
        let mut s = src;
        s[0] = self::dim(rng);
        s
    } else {
        src
    };
    for d in [&id, &src] {
        if numel(d) > MAX_NUMEL || !shape_exists(d) {
            return None;
        }
    }
    let len = ax.map_or(3, |a| x[a]);
    let data: Vec<usize> = (0..numel(&id)).map(|_| index_value(rng, len)).collect();
    let index = IndexTensor::new(&id, data.clone()).unwrap();
    // torch.scatter_add: index, input and src of one rank; index no larger than src anywhere nor
    // than input off `dim`; values below the input's size on `dim`.
    let expect = match ax {
        Some(a)
            if id.len() == x.len()
                && src.len() == x.len()
                && (0..x.len()).all(|i| id[i] <= src[i] && (i == a || id[i] <= x[i]))
                && data.iter().all(|&v| v < len) =>
        {
            let (xd, sd, idd) = (x.clone(), src.clone(), id.clone());
            ok_if_exists(
                x.clone(),
                Box::new(move |_| {
                    let mut terms = Vec::new();
                    each(&xd, |o, _| terms.push(one(o, 0, o, 1.0)));
                    each(&idd, |p, c| {
                        let mut dst = c.clone();
                        dst[a] = data[p];
                        terms.push(one(ravel(&dst, &xd), 1, ravel(&c, &sd), 1.0));
                    });
                    terms
                }),
            )?
        }
        _ => Expect::Err,
    };
    Some(case(ScatterAdd { dim, index }.into(), vec![x, src], expect))
}

fn embedding_case(rng: &mut ChaCha8Rng) -> Option<Case> {
    let w = dims(rng, 2);
    let (rows, width) = (w[0], w[1]);
    let id = {
        let r = rng.random_range(0..=2);
        dims(rng, r)
    };
    let data: Vec<usize> = (0..numel(&id)).map(|_| index_value(rng, rows)).collect();
    let indices = IndexTensor::new(&id, data.clone()).unwrap();
    let padding_idx = rng.random_bool(0.5).then(|| signed_near(rng, rows));
    // F.embedding: every index below num_embeddings; padding_idx in -rows..rows ("Padding_idx
    // must be within num_embeddings"). The padding row gets no gradient (and, in tapegrad, no
    // tangent: see `Embedding`).
    let pad_row = match padding_idx {
        None => Some(None),
        Some(p) if (-(rows as i128)..rows as i128).contains(&(p as i128)) => {
            Some(Some((p as i128).rem_euclid(rows as i128) as usize))
        }
        Some(_) => None,
    };
    let expect = match pad_row {
        Some(pad) if data.iter().all(|&i| i < rows) => {
            let out = [&id[..], &[width]].concat();
            let od = out.clone();
            ok_if_exists(
                out,
                Box::new(move |_| {
                    let mut terms = Vec::new();
                    each(&od, |o, c| {
                        let (pos, j) = (&c[..c.len() - 1], c[c.len() - 1]);
                        let row = data[ravel(pos, &od[..od.len() - 1])];
                        if Some(row) != pad {
                            terms.push(one(o, 0, row * width + j, 1.0));
                        }
                    });
                    terms
                }),
            )?
        }
        _ => Expect::Err,
    };
    let mut c = case(
        Embedding {
            indices,
            padding_idx,
        }
        .into(),
        vec![w],
        expect,
    );
    // The padding row's forward values are the table's, but the row is a constant to the
    // derivatives: checked separately below (the terms leave it out).
    c.exact = true;
    Some(c)
}

#[derive(Clone, Copy, PartialEq)]
enum Reduce {
    Sum,
    Mean,
    Amax,
}

fn reduce_case(rng: &mut ChaCha8Rng) -> Option<Case> {
    let x = {
        let r = rank(rng, 0);
        dims(rng, r)
    };
    let r = x.len();
    let kind = pick(rng, &[Reduce::Sum, Reduce::Mean, Reduce::Amax]);
    let keepdim = rng.random_bool(0.5);
    let axes: Option<Vec<isize>> = rng.random_bool(0.8).then(|| {
        let n = rng.random_range(1..=r.max(1));
        (0..n).map(|_| signed_axis(rng, r)).collect()
    });
    let op = match kind {
        Reduce::Sum => ReduceOp::Sum(Sum {
            axes: axes.clone(),
            keepdim,
        }),
        Reduce::Mean => ReduceOp::Mean(Mean {
            axes: axes.clone(),
            keepdim,
        }),
        Reduce::Amax => ReduceOp::Amax(Amax {
            axes: axes.clone(),
            keepdim,
        }),
    };
    // Reduced axes, normalised (a 0-dim tensor accepts 0 and -1 and reduces nothing); a repeated
    // axis is an error ("dim 0 appears multiple times in the list of dims").
    let reduced: Option<Vec<usize>> = match &axes {
        None => Some((0..r).collect()),
        Some(list) => {
            let norm: Option<Vec<usize>> = list.iter().map(|&a| norm_axis(a, r.max(1))).collect();
            norm.filter(|n| {
                let mut s = n.clone();
                s.sort_unstable();
                s.dedup();
                s.len() == n.len()
            })
            .map(|n| if r == 0 { vec![] } else { n })
        }
    };
    let Some(reduced) = reduced else {
        return Some(case(Op::Reduce(op), vec![x], Expect::Err));
    };
    let count: u128 = reduced.iter().map(|&a| x[a] as u128).product();
    // torch.amax: "Expected reduction dim {d} to have non-zero size" (and a full reduction of an
    // empty tensor is one over a zero-size dim).
    if kind == Reduce::Amax && count == 0 {
        return Some(case(Op::Reduce(op), vec![x], Expect::Err));
    }
    let out: Vec<usize> = (0..r)
        .filter_map(|i| match (reduced.contains(&i), keepdim) {
            (false, _) => Some(x[i]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    let (xd, od, red) = (x.clone(), out.clone(), reduced.clone());
    let target = move |c: &[usize]| -> usize {
        let oc: Vec<usize> = (0..c.len())
            .filter_map(|i| match (red.contains(&i), keepdim) {
                (false, _) => Some(c[i]),
                (true, true) => Some(0),
                (true, false) => None,
            })
            .collect();
        ravel(&oc, &od)
    };
    let terms: TermsAt = match kind {
        Reduce::Sum | Reduce::Mean => {
            let div = if kind == Reduce::Mean {
                count as f64
            } else {
                1.0
            };
            Box::new(move |_| {
                let mut terms = Vec::new();
                each(&xd, |i, c| terms.push(one(target(&c), 0, i, div)));
                terms
            })
        }
        Reduce::Amax => Box::new(move |args| {
            // Tied maxima share the gradient equally: each is a term over the tie count.
            let mut best: Vec<(f64, Vec<usize>)> = Vec::new();
            let mut slots = std::collections::HashMap::new();
            each(&xd, |i, c| {
                let o = target(&c);
                let k = *slots.entry(o).or_insert_with(|| {
                    best.push((f64::NEG_INFINITY, Vec::new()));
                    best.len() - 1
                });
                let v = args[0][i];
                if v > best[k].0 {
                    best[k] = (v, vec![i]);
                } else if v == best[k].0 {
                    best[k].1.push(i);
                }
            });
            let mut terms = Vec::new();
            for (&o, &k) in &slots {
                let tied = &best[k].1;
                for &i in tied {
                    terms.push(one(o, 0, i, tied.len() as f64));
                }
            }
            terms
        }),
    };
    let expect = ok_if_exists(out, terms)?;
    let mut c = case(Op::Reduce(op), vec![x], expect);
    c.exact = kind == Reduce::Sum;
    // PyTorch: the mean of no elements is 0 / 0 = NaN.
    c.nan = kind == Reduce::Mean && count == 0;
    Some(c)
}

fn softmax_case(rng: &mut ChaCha8Rng) -> Option<Case> {
    // Non-linear: only zero-size inputs, whose outputs are empty (PyTorch: shape kept).
    let x = {
        let r = rank(rng, 1);
        empty_dims(rng, r)
    };
    let axis = signed_axis(rng, x.len());
    let op = if rng.random_bool(0.5) {
        ReduceOp::Softmax(Softmax { axis })
    } else {
        ReduceOp::LogSoftmax(LogSoftmax { axis })
    };
    let expect = match norm_axis(axis, x.len()) {
        Some(_) => Expect::Ok(x.clone(), Box::new(|_| Vec::new())),
        None => Expect::Err,
    };
    Some(case(Op::Reduce(op), vec![x], expect))
}

/// The batch dims `b` takes against `a`'s: often the same, some set to 1, some dropped, some
/// redrawn.
fn partner_batch(rng: &mut ChaCha8Rng, a: &[usize]) -> Vec<usize> {
    let mut b: Vec<usize> = a
        .iter()
        .map(|&d| match rng.random_range(0..6) {
            0 => 1,
            1 => dim(rng),
            _ => d,
        })
        .collect();
    if !b.is_empty() && rng.random_bool(0.3) {
        b.remove(0);
    }
    b
}

/// torch's broadcast of two dim lists (right-aligned, 1 stretches), or `None`.
fn broadcast_dims(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    let at = |d: &[usize], i: usize| {
        let off = r - d.len();
        if i < off {
            1
        } else {
            d[i - off]
        }
    };
    (0..r)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// The position in `dims` (right-aligned under `out`) that broadcast output coords `c` read.
fn broadcast_source(c: &[usize], dims: &[usize]) -> Vec<usize> {
    let off = c.len() - dims.len();
    dims.iter()
        .enumerate()
        .map(|(i, &d)| if d == 1 { 0 } else { c[off + i] })
        .collect()
}

/// matmul of [.., m, k] by [.., k, n] (either side sometimes 1-D, batch dims broadcast), k or m
/// often 0 beside huge dims.
fn matmul_case(rng: &mut ChaCha8Rng) -> Option<Case> {
    let [m, k, n] = [dim(rng), dim(rng), dim(rng)];
    let (a_vec, b_vec) = (rng.random_bool(0.2), rng.random_bool(0.2));
    let batch_a: Vec<usize> = if !a_vec && rng.random_bool(0.4) {
        let r = rng.random_range(1..=2);
        dims(rng, r)
    } else {
        vec![]
    };
    let batch_b: Vec<usize> = if b_vec {
        vec![]
    } else if rng.random_bool(0.5) {
        partner_batch(rng, &batch_a)
    } else {
        vec![]
    };
    let a_mat = if a_vec { vec![k] } else { vec![m, k] };
    let a: Vec<usize> = [&batch_a[..], &a_mat[..]].concat();
    let b_mat = if b_vec { vec![k] } else { vec![k, n] };
    let mut b: Vec<usize> = [&batch_b[..], &b_mat[..]].concat();
    if rng.random_bool(0.1) {
        let at = batch_b.len();
        b[at] = dim(rng);
    }
    for d in [&a, &b] {
        if numel(d) > MAX_NUMEL || !shape_exists(d) {
            return None;
        }
    }
    let k_b = b[batch_b.len()];
    // torch.matmul: 1-D operands are a row (left) or a column (right) whose axis is dropped;
    // the batch dims broadcast.
    let expect = match broadcast_dims(&batch_a, &batch_b) {
        Some(batch) if a[a.len() - 1] == k_b => {
            let mut out = batch.clone();
            if !a_vec {
                out.push(m);
            }
            if !b_vec {
                out.push(n);
            }
            let (mm, nn) = (if a_vec { 1 } else { m }, if b_vec { 1 } else { n });
            ok_if_exists(
                out,
                Box::new(move |_| {
                    let mut terms = Vec::new();
                    let full = [&batch[..], &[mm, nn]].concat();
                    each(&full, |o, c| {
                        let (bc, i, j) = (&c[..batch.len()], c[batch.len()], c[batch.len() + 1]);
                        let ab = ravel(&broadcast_source(bc, &batch_a), &batch_a);
                        let bb = ravel(&broadcast_source(bc, &batch_b), &batch_b);
                        for p in 0..k {
                            terms.push(two(
                                o,
                                (0, (ab * mm + i) * k + p),
                                (1, (bb * k + p) * nn + j),
                            ));
                        }
                    });
                    terms
                }),
            )?
        }
        _ => Expect::Err,
    };
    Some(case(
        Op::Linalg(LinalgOp::Matmul(Matmul)),
        vec![a, b],
        expect,
    ))
}

/// linear: x [.., k] by w [n, k] (+ b [n]).
fn linear_case(rng: &mut ChaCha8Rng) -> Option<Case> {
    let lead = {
        let r = rng.random_range(0..=2);
        dims(rng, r)
    };
    let [k, n] = [dim(rng), dim(rng)];
    let bias = rng.random_bool(0.5);
    let x = [&lead[..], &[k]].concat();
    let mut w = vec![n, k];
    if rng.random_bool(0.1) {
        w[1] = dim(rng);
    }
    let mut shapes = vec![x.clone(), w.clone()];
    if bias {
        shapes.push(vec![if rng.random_bool(0.9) { n } else { dim(rng) }]);
    }
    for d in &shapes {
        if numel(d) > MAX_NUMEL || !shape_exists(d) {
            return None;
        }
    }
    // F.linear: weight (out, in), bias (out).
    let expect = if w[1] != k || (bias && shapes[2][0] != n) {
        Expect::Err
    } else {
        let out = [&lead[..], &[n]].concat();
        let rows = numel(&lead) as usize;
        ok_if_exists(
            out,
            Box::new(move |_| {
                let mut terms = Vec::new();
                each(&[rows, n], |o, c| {
                    for p in 0..k {
                        terms.push(two(o, (0, c[0] * k + p), (1, c[1] * k + p)));
                    }
                    if bias {
                        terms.push(one(o, 2, c[1], 1.0));
                    }
                });
                terms
            }),
        )?
    };
    Some(case(
        Op::Linalg(LinalgOp::Linear(Linear { bias })),
        shapes,
        expect,
    ))
}

fn dropout_case(rng: &mut ChaCha8Rng) -> Option<Case> {
    let x = {
        let r = rank(rng, 0);
        dims(rng, r)
    };
    let below_one = 1.0 - f64::EPSILON / 2.0;
    let p = pick(
        rng,
        &[
            0.0,
            -0.0,
            1.0,
            below_one,
            0.5,
            0.25,
            f64::NAN,
            -f64::MIN_POSITIVE,
            1.0 + f64::EPSILON,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ],
    );
    let training = rng.random_bool(0.7);
    let seed = rng.random();
    // F.dropout: "dropout probability has to be between 0 and 1, but got {p}" (NaN included).
    let expect = if !(0.0..=1.0).contains(&p) {
        Expect::Err
    } else {
        let n = numel(&x) as usize;
        Expect::Ok(
            x.clone(),
            Box::new(move |_| {
                if !training {
                    return (0..n).map(|i| one(i, 0, i, 1.0)).collect();
                }
                // Kept elements are scaled by 1 / (1 - p); with p = 1 nothing is kept.
                dropout_mask(seed, n, p)
                    .into_iter()
                    .enumerate()
                    .filter(|&(_, keep)| keep && p < 1.0)
                    .map(|(i, _)| one(i, 0, i, 1.0 - p))
                    .collect()
            }),
        )
    };
    let mut c = case(Dropout { p, training, seed }.into(), vec![x], expect);
    c.exact = false;
    Some(c)
}

fn reduction(rng: &mut ChaCha8Rng) -> Reduction {
    pick(rng, &[Reduction::None, Reduction::Mean, Reduction::Sum])
}

/// A loss on an empty batch: `none` gives an empty tensor, `sum` 0 and `mean` NaN (PyTorch:
/// `F.mse_loss(torch.empty(0), torch.empty(0))` is nan, `reduction='sum'` gives 0).
fn loss_case(rng: &mut ChaCha8Rng) -> Option<Case> {
    let red = reduction(rng);
    let (op, shapes, unreduced) = match rng.random_range(0..3) {
        0 | 1 => {
            let x = {
                let r = rank(rng, 0).max(1);
                empty_dims(rng, r)
            };
            let op = if rng.random_bool(0.5) {
                LossOp::MseLoss(MseLoss { reduction: red })
            } else {
                LossOp::bce_with_logits(red)
            };
            (op, vec![x.clone(), x.clone()], x)
        }
        _ => {
            // (N, C) logits with N = 0 and any C, even a huge one; no targets.
            let c = dim(rng);
            if !shape_exists(&[0, c]) {
                return None;
            }
            let targets = Arc::new(Vec::new());
            // PyTorch's options change nothing on an empty batch (a mean is still 0/0).
            let ignore_index = rng.random_bool(0.5).then_some(i64::MAX);
            let op = if rng.random_bool(0.5) {
                LossOp::CrossEntropy(CrossEntropy {
                    targets,
                    reduction: red,
                    weight: None,
                    ignore_index,
                    label_smoothing: if rng.random_bool(0.5) { 0.5 } else { 0.0 },
                })
            } else {
                LossOp::NllLoss(NllLoss {
                    targets,
                    reduction: red,
                    weight: None,
                    ignore_index,
                })
            };
            (op, vec![vec![0, c]], vec![0])
        }
    };
    let (out, nan) = match red {
        Reduction::None => (unreduced, false),
        Reduction::Mean => (vec![], true),
        Reduction::Sum => (vec![], false),
    };
    let mut c = case(
        Op::Loss(op),
        shapes,
        Expect::Ok(out, Box::new(|_| Vec::new())),
    );
    c.nan = nan;
    Some(c)
}

/// The norms on zero-size batches: the output is empty, parameter gradients are zeros.
fn norm_case(rng: &mut ChaCha8Rng) -> Option<Case> {
    let eps = 1e-5;
    let (weight, bias) = (rng.random_bool(0.5), rng.random_bool(0.5));
    let affine = |shape: &[usize]| {
        let mut v = Vec::new();
        if weight {
            v.push(shape.to_vec());
        }
        if bias {
            v.push(shape.to_vec());
        }
        v
    };
    let (op, shapes, ok): (Op, Vec<Vec<usize>>, bool) = match rng.random_range(0..3) {
        0 => {
            let x = {
                let r = rank(rng, 1);
                empty_dims(rng, r)
            };
            let k = rng.random_range(1..=x.len());
            let normalized_shape = x[x.len() - k..].to_vec();
            // The statistics (mean and rstd per row) are outputs, as PyTorch's
            // native_layer_norm's: a huge row count is a huge allocation in both (PyTorch:
            // "can't allocate memory"), not generated.
            if numel(&x[..x.len() - k]) > MAX_NUMEL && !x[..x.len() - k].contains(&0) {
                return None;
            }
            if (weight || bias) && numel(&normalized_shape) > MAX_NUMEL {
                return None;
            }
            let op = LayerNorm {
                normalized_shape: normalized_shape.clone(),
                eps,
                weight,
                bias,
            };
            let shapes = [vec![x], affine(&normalized_shape)].concat();
            (op.into(), shapes, true)
        }
        1 => {
            // (N, C, *) with N = 0 or a zero spatial dim.
            let c = rng.random_range(1..=4);
            let mut x = vec![0, c];
            x.extend({
                let r = rng.random_range(0..=2);
                dims(rng, r)
            });
            if rng.random_bool(0.5) && x.len() > 2 {
                x[0] = dim(rng);
                let last = x.len() - 1;
                x[last] = 0;
            }
            if !shape_exists(&x) {
                return None;
            }
            let num_groups = if rng.random_bool(0.7) {
                pick(rng, &[1, c])
            } else {
                mixed(rng)
            };
            // The statistics per (sample, group) are outputs, as PyTorch's native_group_norm's:
            // a huge count of them is a huge allocation, not generated.
            if x[0] as u128 * num_groups.min(c) as u128 > MAX_NUMEL {
                return None;
            }
            let op = GroupNorm {
                num_groups,
                eps,
                weight,
                bias,
            };
            // F.group_norm: C divisible by num_groups (and num_groups > 0). PyTorch also rejects
            // a zero spatial extent ("Expected HxW to be greater than 0"), tapegrad accepts it:
            // one of the DIFFERENCES, checked as tapegrad's.
            let ok = num_groups > 0 && c % num_groups == 0;
            let shapes = [vec![x], affine(&[c])].concat();
            (op.into(), shapes, ok)
        }
        _ => {
            let c = rng.random_range(1..=4);
            let mut x = vec![0, c];
            x.extend({
                let r = rng.random_range(0..=2);
                dims(rng, r)
            });
            if !shape_exists(&x) {
                return None;
            }
            let training = rng.random_bool(0.5);
            let op = BatchNorm {
                training,
                momentum: 0.1,
                eps,
                weight,
                bias,
            };
            let stats = if training {
                vec![]
            } else {
                vec![vec![c], vec![c]]
            };
            // F.batch_norm on an empty batch: accepted in both modes (PyTorch raises "Expected
            // more than 1 value per channel when training" only when there is exactly one).
            let shapes = [vec![x], stats, affine(&[c])].concat();
            (op.into(), shapes, true)
        }
    };
    let expect = if ok {
        Expect::Ok(shapes[0].clone(), Box::new(|_| Vec::new()))
    } else {
        Expect::Err
    };
    let mut c = case(op, shapes, expect);
    c.exact = false;
    Some(c)
}

fn any_case(rng: &mut ChaCha8Rng) -> Case {
    loop {
        let c = match rng.random_range(0..19) {
            0 => slice_case(rng),
            1 => select_case(rng),
            2 => flatten_case(rng),
            3 => reshape_case(rng),
            4 => broadcast_case(rng),
            5 => concat_case(rng),
            6 => permute_case(rng),
            7 => index_select_case(rng),
            8 => gather_case(rng),
            9 => scatter_add_case(rng),
            10 => embedding_case(rng),
            11 | 12 => reduce_case(rng),
            13 => softmax_case(rng),
            14 => matmul_case(rng),
            15 => linear_case(rng),
            16 => dropout_case(rng),
            17 => loss_case(rng),
            _ => norm_case(rng),
        };
        if let Some(c) = c {
            return c;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Checking one case.

/// Positive small integers (batch_norm's running variance must stay positive).
fn positive(rng: &mut ChaCha8Rng, n: usize) -> Vec<f64> {
    (0..n).map(|_| rng.random_range(1..=3) as f64).collect()
}

fn check_case<S: Scalar>(case: &Case, rng: &mut ChaCha8Rng, eps: f64) {
    let op = &case.op;
    let args: Vec<Vec<f64>> = case
        .shapes
        .iter()
        .map(|d| {
            let n = numel(d) as usize;
            if matches!(op, Op::Nn(_)) && op.name() == "batch_norm" {
                positive(rng, n)
            } else {
                ints(rng, n)
            }
        })
        .collect();
    let inputs: Vec<Tensor<S>> = case
        .shapes
        .iter()
        .zip(&args)
        .map(|(d, v)| tensor(d, v))
        .collect();
    let refs: Vec<&Tensor<S>> = inputs.iter().collect();
    let shapes: Vec<&Shape> = inputs.iter().map(|t| t.shape()).collect();
    let shape = no_panic_and_named(op, "output_shape", || op.output_shape(&shapes));
    let forward = no_panic_and_named(op, "forward", || op.forward(&refs));

    let (out_dims, terms) = match &case.expect {
        Expect::Err => {
            assert!(
                forward.is_none() && shape.is_none(),
                "{op}: accepted {:?}, which PyTorch (or the shape rule) rejects",
                case.shapes
            );
            return;
        }
        Expect::Ok(dims, terms) => (dims, terms(&args)),
    };
    let forward = match forward {
        Some(f) => f,
        None if case.may_reject => return,
        None => {
            let err = op.forward(&refs).err().unwrap();
            panic!(
                "{op}: rejected {:?}, which PyTorch accepts with output {out_dims:?}: {err}",
                case.shapes
            );
        }
    };
    assert_eq!(
        shape.as_ref().map(|s| s.dims()),
        Some(&out_dims[..]),
        "{op}"
    );
    assert_eq!(forward.value.dims(), &out_dims[..], "{op}: output shape");
    let out_len = numel(out_dims) as usize;
    let mut want = apply_terms(&terms, &args, out_len);
    if let Op::Nn(_) = op {
        if let Some(fixed) = embedding_forward(op, &args, out_len) {
            want = fixed;
        }
    }
    if case.nan {
        want.iter_mut().for_each(|v| *v = f64::NAN);
    }
    check_against_terms(
        &Call {
            op,
            shapes: &case.shapes,
            inputs: &refs,
            args: &args,
            forward: &forward,
            want: &want,
            out_dims,
            terms: &terms,
            exact: case.exact,
            eps,
        },
        rng,
    );
}

/// Embedding's forward reads the padding row like any other (only its derivatives are cut):
/// the table's values at every index.
fn embedding_forward(op: &Op, args: &[Vec<f64>], out_len: usize) -> Option<Vec<f64>> {
    let Op::Nn(nn) = op else { return None };
    let tapegrad_core::ops::NnOp::Embedding(e) = nn.as_ref() else {
        return None;
    };
    let width = if e.indices.data.is_empty() {
        return Some(vec![0.0; out_len]);
    } else {
        out_len / e.indices.data.len()
    };
    let mut out = Vec::with_capacity(out_len);
    for &row in e.indices.data.iter() {
        out.extend_from_slice(&args[0][row * width..(row + 1) * width]);
    }
    Some(out)
}

/// `Shape::new` accepts exactly the dims `shape_exists` describes, zero-size or not.
fn check_shape_rule(rng: &mut ChaCha8Rng) {
    let d: Vec<usize> = (0..rng.random_range(0..=5)).map(|_| dim(rng)).collect();
    match Shape::new(&d) {
        Ok(s) => {
            assert!(shape_exists(&d), "Shape::new accepted {d:?}");
            assert_eq!(s.numel() as u128, numel(&d), "numel of {d:?}");
            // Strides are products of trailing dims: they must not overflow.
            assert_eq!(s.strides().len(), d.len());
        }
        Err(e) => {
            assert!(!shape_exists(&d), "Shape::new rejected {d:?}: {e}");
            assert!(e.to_string().contains("Shape::new"), "{e}");
        }
    }
}

fn round(rng: &mut ChaCha8Rng) {
    check_shape_rule(rng);
    let case = any_case(rng);
    // A hang shows no failure: with EXTREME_STRUCTURE_TRACE set (and --nocapture) the last call
    // printed is the one that hangs or aborts.
    if std::env::var_os("EXTREME_STRUCTURE_TRACE").is_some() {
        eprintln!("call: {} on {:?}", case.op, case.shapes);
    }
    set_num_threads(rng.random_range(1..=2));
    if rng.random_bool(0.5) {
        check_case::<f64>(&case, rng, 1e-9);
    } else {
        check_case::<f32>(&case, rng, 1e-5);
    }
}

/// Calls per proptest case: `EXTREME_STRUCTURE_CALLS` for a soak, 512 by default.
fn calls_per_case() -> usize {
    std::env::var("EXTREME_STRUCTURE_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512)
}

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    // 256 x 512 calls, about 4 s in a debug build. A soak: EXTREME_STRUCTURE_CALLS=16384 (4.2
    // million calls).
    #![proptest_config(config(256))]

    #[test]
    fn extreme_structure_attributes_on_degenerate_shapes_match_the_definitions(seed in any::<u64>()) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for _ in 0..calls_per_case() {
            round(&mut rng);
        }
    }
}

/// Seeds that once failed, replayed every run (proptest draws fresh seeds each time).
#[test]
fn seeds_that_once_failed_stay_fixed() {
    // layer_norm on [0, 2^33] with normalized_shape [2^33]: rejected by a first version of the
    // norms' allocation check, which also counted per-channel state that is never made there.
    for seed in [15615883869167790253] {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for _ in 0..512 {
            round(&mut rng);
        }
    }
}

/// The DIFFERENCES, each checked as tapegrad's behaviour on the smallest call that shows it.
#[test]
fn the_documented_differences_hold() {
    assert_eq!(DIFFERENCES.len(), 2);
    // The JVP of a mean over zero elements: 0 (PyTorch: NaN), the value NaN in both.
    let x = Tensor::<f64>::new(&[0, 3], vec![]).unwrap();
    let losses = [
        Op::Reduce(ReduceOp::Mean(Mean {
            axes: None,
            keepdim: false,
        })),
        Op::Loss(LossOp::MseLoss(MseLoss {
            reduction: Reduction::Mean,
        })),
    ];
    for op in losses {
        let args: Vec<&Tensor<f64>> = if op.name() == "mean" {
            vec![&x]
        } else {
            vec![&x, &x]
        };
        let out = op.forward(&args).unwrap();
        assert!(out.value.data()[0].is_nan(), "{op}");
        assert_eq!(op.jvp(&args, &out, &args).unwrap().data(), [0.0], "{op}");
    }
    // group_norm with a zero spatial extent: accepted (PyTorch: an error).
    let op: Op = GroupNorm {
        num_groups: 2,
        eps: 1e-5,
        weight: false,
        bias: false,
    }
    .into();
    let x = Tensor::<f64>::new(&[2, 4, 0], vec![]).unwrap();
    assert_eq!(op.forward(&[&x]).unwrap().value.dims(), [2, 4, 0]);
}
