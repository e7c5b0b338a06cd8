//! Extreme window attributes on valid shapes: conv1d/conv2d (every padding mode, numeric and named
//! padding, groups), max_pool2d, avg_pool2d and adaptive_avg_pool2d get small, consistent tensors
//! while each stride, padding, dilation, kernel or output size is drawn from ordinary values and
//! from 2^33, 2^40, isize::MAX, usize::MAX - 1 and usize::MAX, steered into the regions where
//! window arithmetic overflows (strides past the padded input, outputs that read only padding,
//! kernel extents equal to the padded length, ceil_mode windows past the input, strided 1x1).
//! Forward, VJP and JVP must not panic and must name the op in their errors; a call PyTorch's
//! shape formula accepts must succeed with that shape, and its output, VJP and JVP must match a
//! naive definition written here (checked index arithmetic in i128), and satisfy the adjoint
//! identity, in f64 and f32 on small integers, with one and two kernel threads.

use crate::op_support::no_panic_and_named;
use crate::term_model::{apply_terms, check_against_terms, ints, one, tensor, two, Call, Term};
use proptest::prelude::*;
use proptest::test_runner::Config;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tapegrad_core::ops::nn::{
    AdaptiveAvgPool2d, AvgPool2d, Conv1d, Conv2d, MaxPool2d, NamedPadding, PaddingMode,
};
use tapegrad_core::{Op, Scalar, Shape, Tensor};
use tapegrad_tensor::kernels::set_num_threads;

/// Attribute values far outside any real network's: each overflows some product or sum of
/// window arithmetic.
const EXTREMES: [usize; 5] = [
    1 << 33,
    1 << 40,
    isize::MAX as usize,
    usize::MAX - 1,
    usize::MAX,
];

/// The most output elements a generated call may have per axis: calls that legitimately need
/// huge outputs are not generated (they are a matter of allocation, not of window arithmetic).
const MAX_AXIS_OUT: u128 = 16;

fn pick<T: Copy>(rng: &mut ChaCha8Rng, xs: &[T]) -> T {
    xs[rng.random_range(0..xs.len())]
}

fn extreme(rng: &mut ChaCha8Rng) -> usize {
    pick(rng, &EXTREMES)
}

/// Half ordinary (0..=5), half extreme.
fn mixed(rng: &mut ChaCha8Rng) -> usize {
    if rng.random_bool(0.5) {
        rng.random_range(0..=5)
    } else {
        extreme(rng)
    }
}

/// A value near `v`: `v` itself mostly, sometimes one off (saturating).
fn near(rng: &mut ChaCha8Rng, v: u128) -> usize {
    let v = match rng.random_range(0..4) {
        0 => v.saturating_sub(1),
        1 => v + 1,
        _ => v,
    };
    v.min(usize::MAX as u128) as usize
}

// ---------------------------------------------------------------------------------------------
// PyTorch's shape formulas, in u128 so that nothing overflows.

/// Windows along one axis: PyTorch's `pooling_output_shape` (conv uses it with floor mode):
/// `(len + lo + hi - dilation (kernel - 1) - 1 (+ stride - 1 in ceil mode)) / stride + 1`,
/// floored, minus the last window in ceil mode when it starts past the input and left padding;
/// `None` when PyTorch rejects it (non-positive sizes, no window). Computed exactly, even for
/// values PyTorch's int64 cannot hold (see `beyond_i64`).
fn window_count(
    len: usize,
    kernel: usize,
    stride: usize,
    lo: usize,
    hi: usize,
    dilation: usize,
    ceil_mode: bool,
) -> Option<u128> {
    if kernel == 0 || stride == 0 || dilation == 0 {
        return None;
    }
    let [len, kernel, stride, lo, hi, dilation] =
        [len, kernel, stride, lo, hi, dilation].map(|v| v as u128);
    let padded = len + lo + hi;
    let span = dilation * (kernel - 1) + 1;
    let reach = padded + if ceil_mode { stride - 1 } else { 0 };
    if span > reach {
        return None;
    }
    let mut count = (reach - span) / stride + 1;
    if ceil_mode && (count - 1) * stride >= len + lo {
        count -= 1;
    }
    (count > 0).then_some(count)
}

/// Whether an axis's attributes or padded extent lie beyond PyTorch's int64 (the repository's
/// window arithmetic is in isize): the op may reject such a call, but if it accepts it, the
/// result must be the exact one.
fn beyond_i64(
    len: usize,
    kernel: usize,
    stride: usize,
    lo: u128,
    hi: u128,
    dilation: usize,
) -> bool {
    let max = i64::MAX as u128;
    let span = dilation as u128 * (kernel as u128).saturating_sub(1) + 1;
    [
        kernel as u128,
        stride as u128,
        lo,
        hi,
        dilation as u128,
        span,
    ]
    .iter()
    .any(|&v| v > max)
        || len as u128 + lo + hi > max
}

// ---------------------------------------------------------------------------------------------
// The naive definitions, as lists of terms (tests/term_model): padding and window geometry.

/// The input position read by padded position `j` (relative to the first input element) of an
/// axis of `len` elements padded with `mode`, or `None` for a zero.
fn source(mode: PaddingMode, len: usize, j: i128) -> Option<usize> {
    let n = len as i128;
    let i = if (0..n).contains(&j) {
        j
    } else {
        match mode {
            PaddingMode::Zeros => return None,
            PaddingMode::Reflect if j < 0 => -j,
            PaddingMode::Reflect => 2 * (n - 1) - j,
            PaddingMode::Replicate => j.clamp(0, n - 1),
            PaddingMode::Circular => j.rem_euclid(n),
        }
    };
    assert!((0..n).contains(&i), "test bug: padding reads {i} of {n}");
    Some(i as usize)
}

/// One axis of a sliding window: output `o` reads positions `o * stride + k * dilation - lo`.
#[derive(Debug, Clone, Copy)]
struct Axis {
    len: usize,
    out: usize,
    kernel: usize,
    stride: usize,
    lo: usize,
    dilation: usize,
}

impl Axis {
    fn start(&self, o: usize) -> i128 {
        o as i128 * self.stride as i128 - self.lo as i128
    }

    /// The taps `k` of window `o` whose position lies in the input, with the position; found by
    /// solving for `k` (the kernel may be huge), then each position checked.
    fn taps_inside(&self, o: usize) -> Vec<(usize, usize)> {
        let (s, d, n) = (self.start(o), self.dilation as i128, self.len as i128);
        let first = if s < 0 { (-s + d - 1) / d } else { 0 };
        let end = ((n - s + d - 1) / d).clamp(0, self.kernel as i128);
        (first..end.max(first))
            .map(|k| {
                let p = s + k * d;
                assert!((0..n).contains(&p), "test bug: tap {k} at {p}");
                (k as usize, p as usize)
            })
            .collect()
    }
}

/// Convolution terms: `out[n, o, y, x] += w[o, c, i, j] * padded(x)[n, g c, y sh + i dh - top,
/// ...]` and `+= b[o]`. `x` is (N, C, H, W), `w` (O, C / groups, kH, kW).
fn conv_terms(
    [batch, channels]: [usize; 2],
    [ah, aw]: [Axis; 2],
    out_channels: usize,
    groups: usize,
    mode: PaddingMode,
    bias: bool,
) -> Vec<Term> {
    let (cg, og) = (channels / groups, out_channels / groups);
    let (kh, kw) = (ah.kernel, aw.kernel);
    let mut terms = Vec::new();
    for n in 0..batch {
        for o in 0..out_channels {
            let g = o / og;
            for y in 0..ah.out {
                for x in 0..aw.out {
                    let out = ((n * out_channels + o) * ah.out + y) * aw.out + x;
                    if bias {
                        terms.push(one(out, 2, o, 1.0));
                    }
                    for c in 0..cg {
                        let ic = g * cg + c;
                        for i in 0..kh {
                            let Some(iy) =
                                source(mode, ah.len, ah.start(y) + i as i128 * ah.dilation as i128)
                            else {
                                continue;
                            };
                            for j in 0..kw {
                                let Some(ix) = source(
                                    mode,
                                    aw.len,
                                    aw.start(x) + j as i128 * aw.dilation as i128,
                                ) else {
                                    continue;
                                };
                                let xi = ((n * channels + ic) * ah.len + iy) * aw.len + ix;
                                let wi = ((o * cg + c) * kh + i) * kw + j;
                                terms.push(two(out, (0, xi), (1, wi)));
                            }
                        }
                    }
                }
            }
        }
    }
    terms
}

/// Max-pool terms at `x`: each output takes the first maximum of its window in row-major order;
/// `None` when some window holds no input element.
fn max_pool_terms(x: &[f64], planes: usize, [ah, aw]: [Axis; 2]) -> Option<Vec<Term>> {
    let empty = |a: &Axis| (0..a.out).any(|o| a.taps_inside(o).is_empty());
    if empty(&ah) || empty(&aw) {
        return None;
    }
    let mut terms = Vec::new();
    for p in 0..planes {
        for y in 0..ah.out {
            for xo in 0..aw.out {
                let out = (p * ah.out + y) * aw.out + xo;
                let mut best: Option<(usize, f64)> = None;
                for &(_, iy) in &ah.taps_inside(y) {
                    for &(_, ix) in &aw.taps_inside(xo) {
                        let i = (p * ah.len + iy) * aw.len + ix;
                        if best.is_none_or(|(_, m)| x[i] > m) {
                            best = Some((i, x[i]));
                        }
                    }
                }
                terms.push(one(out, 0, best?.0, 1.0));
            }
        }
    }
    Some(terms)
}

/// Average-pool terms, as PyTorch's CPU kernel: the window `[start, min(start + kernel, len +
/// padding))` gives the count_include_pad divisor, clipped to the input it gives the other; a
/// window with no input element outputs 0.
fn avg_pool_terms(
    planes: usize,
    [ah, aw]: [Axis; 2],
    count_include_pad: bool,
    divisor_override: Option<i64>,
) -> Vec<Term> {
    let clip = |a: &Axis, o: usize| {
        let s = a.start(o);
        let e = (s + a.kernel as i128).min(a.len as i128 + a.lo as i128);
        let extent = e - s;
        (s.max(0), e.min(a.len as i128), extent)
    };
    let mut terms = Vec::new();
    for p in 0..planes {
        for y in 0..ah.out {
            let (y0, y1, ey) = clip(&ah, y);
            for x in 0..aw.out {
                let (x0, x1, ex) = clip(&aw, x);
                if y0 >= y1 || x0 >= x1 {
                    continue;
                }
                let div = match divisor_override {
                    Some(d) => d as f64,
                    None if count_include_pad => ey as f64 * ex as f64,
                    None => ((y1 - y0) * (x1 - x0)) as f64,
                };
                let out = (p * ah.out + y) * aw.out + x;
                for iy in y0..y1 {
                    for ix in x0..x1 {
                        let i = (p * ah.len + iy as usize) * aw.len + ix as usize;
                        terms.push(one(out, 0, i, div));
                    }
                }
            }
        }
    }
    terms
}

/// Adaptive average-pool terms: output `i` averages `floor(i len / out) .. ceil((i + 1) len /
/// out)`.
fn adaptive_terms(planes: usize, [h, w]: [usize; 2], [oh, ow]: [usize; 2]) -> Vec<Term> {
    let span = |i: usize, len: usize, out: usize| {
        let (i, l, o) = (i as u128, len as u128, out as u128);
        ((i * l / o) as usize, ((i + 1) * l).div_ceil(o) as usize)
    };
    let mut terms = Vec::new();
    if oh == 0 || ow == 0 {
        return terms;
    }
    for p in 0..planes {
        for y in 0..oh {
            let (y0, y1) = span(y, h, oh);
            for x in 0..ow {
                let (x0, x1) = span(x, w, ow);
                let div = ((y1 - y0) * (x1 - x0)) as f64;
                for iy in y0..y1 {
                    for ix in x0..x1 {
                        terms.push(one((p * oh + y) * ow + x, 0, (p * h + iy) * w + ix, div));
                    }
                }
            }
        }
    }
    terms
}

// ---------------------------------------------------------------------------------------------
// Cases.

/// The terms of a call at given arguments.
type TermsAt = Box<dyn Fn(&[Vec<f64>]) -> Option<Vec<Term>>>;

/// What the reference says of a call.
enum Expect {
    /// PyTorch rejects it (or cannot represent it): an error naming the op.
    Err,
    /// It succeeds with this shape; the terms give its value at given arguments (max pooling's
    /// depend on the input; `None` there means a window holds no input, an error).
    Ok(Vec<usize>, TermsAt),
}

struct Case {
    op: Op,
    shapes: Vec<Vec<usize>>,
    expect: Expect,
    /// Whether the op's values are exact on small integers (no division).
    exact: bool,
    /// Whether the op may reject a call PyTorch's formula accepts: attributes beyond int64.
    may_reject: bool,
}

fn dims_of(batched: Option<usize>, rest: &[usize]) -> Vec<usize> {
    batched.into_iter().chain(rest.iter().copied()).collect()
}

/// Stride, padding and dilation of one conv axis of `len` inputs and a `kernel`-tap weight,
/// steered into one of the regions where window arithmetic is delicate.
fn conv_axis(rng: &mut ChaCha8Rng, len: usize, kernel: usize) -> (usize, usize, usize) {
    match rng.random_range(0..6) {
        // Ordinary.
        0 => (
            rng.random_range(1..=3),
            rng.random_range(0..=2),
            rng.random_range(1..=2),
        ),
        // A stride beyond the padded input: one window per axis.
        1 => (
            extreme(rng),
            rng.random_range(0..=3),
            rng.random_range(1..=2),
        ),
        // Padding as long as the stride: the first and last windows read only padding.
        2 => {
            let s = mixed(rng).max(1);
            (s, near(rng, s as u128), rng.random_range(1..=2))
        }
        // Dilation stretching the kernel to exactly the padded length (or one off).
        3 => {
            let p = mixed(rng);
            let padded = len as u128 + 2 * p as u128;
            let d = if kernel > 1 {
                near(rng, (padded - 1) / (kernel as u128 - 1))
            } else {
                mixed(rng)
            };
            (mixed(rng), p, d)
        }
        // Huge dilation, the kernel reaching far past the input.
        4 => (mixed(rng), mixed(rng), extreme(rng)),
        // Anything.
        _ => (mixed(rng), mixed(rng), mixed(rng)),
    }
}

fn padding_mode(rng: &mut ChaCha8Rng) -> PaddingMode {
    pick(
        rng,
        &[
            PaddingMode::Zeros,
            PaddingMode::Zeros,
            PaddingMode::Reflect,
            PaddingMode::Replicate,
            PaddingMode::Circular,
        ],
    )
}

/// The per-axis (lo, hi) padding PyTorch uses for a conv axis, or `None` if it rejects it.
fn conv_padding(
    named: Option<NamedPadding>,
    numeric: usize,
    stride: usize,
    kernel: usize,
    dilation: usize,
) -> Option<(u128, u128)> {
    match named {
        None => Some((numeric as u128, numeric as u128)),
        Some(_) if numeric != 0 => None,
        Some(NamedPadding::Valid) => Some((0, 0)),
        Some(NamedPadding::Same) => {
            if stride != 1 {
                return None;
            }
            let total = dilation as u128 * (kernel as u128).saturating_sub(1);
            Some((total / 2, total - total / 2))
        }
    }
}

/// Whether `mode` can pad an axis of `len` by (lo, hi), PyTorch's rule.
fn mode_fits(mode: PaddingMode, len: usize, lo: u128, hi: u128) -> bool {
    let widest = lo.max(hi);
    match mode {
        PaddingMode::Zeros => true,
        PaddingMode::Reflect => widest < len as u128,
        PaddingMode::Circular => widest <= len as u128,
        PaddingMode::Replicate => true,
    }
}

/// A conv1d or conv2d call on valid shapes with steered attributes, or `None` when the draw
/// would legitimately need a huge buffer (a huge output, or an explicitly padded copy that
/// could be allocated but not afforded).
fn conv_case(rng: &mut ChaCha8Rng, spatial: usize) -> Option<Case> {
    let groups_valid = rng.random_range(1..=2);
    let channels = groups_valid * rng.random_range(1..=2);
    let out_channels = groups_valid * rng.random_range(1..=2);
    let groups = if rng.random_bool(0.05) {
        extreme(rng)
    } else {
        groups_valid
    };
    let batch = rng.random_bool(0.7).then(|| pick(rng, &[0, 1, 1, 2]));
    let pointwise = rng.random_bool(0.15);
    let mut lens = [1usize; 2];
    let mut kernels = [1usize; 2];
    for a in 2 - spatial..2 {
        lens[a] = rng.random_range(1..=4);
        kernels[a] = if pointwise {
            1
        } else {
            rng.random_range(1..=3)
        };
    }
    let mut stride = [1usize; 2];
    let mut padding = [0usize; 2];
    let mut dilation = [1usize; 2];
    for a in 2 - spatial..2 {
        let (s, p, d) = if pointwise {
            // The strided 1x1 path: a gather of the column matrix.
            (mixed(rng).max(1), pick(rng, &[0, 0, 1]), mixed(rng))
        } else {
            conv_axis(rng, lens[a], kernels[a])
        };
        stride[a] = s;
        padding[a] = p;
        dilation[a] = d;
    }
    let named = match rng.random_range(0..10) {
        0 | 1 => Some(NamedPadding::Same),
        2 => Some(NamedPadding::Valid),
        _ => None,
    };
    if named.is_some() && rng.random_bool(0.8) {
        padding = [0, 0];
        if named == Some(NamedPadding::Same) && rng.random_bool(0.7) {
            stride = [1, 1];
        }
    }
    let mode = padding_mode(rng);
    let bias = rng.random_bool(0.5);

    let in_spatial = &lens[2 - spatial..];
    let x_dims = dims_of(batch, &[&[channels][..], in_spatial].concat());
    let w_dims = [
        &[out_channels, channels / groups_valid][..],
        &kernels[2 - spatial..],
    ]
    .concat();
    let mut shapes = vec![x_dims, w_dims];
    if bias {
        shapes.push(vec![out_channels]);
    }
    let op: Op = if spatial == 1 {
        Conv1d {
            stride: stride[1],
            padding: padding[1],
            dilation: dilation[1],
            groups,
            bias,
            named_padding: named,
            padding_mode: mode,
        }
        .into()
    } else {
        Conv2d {
            stride,
            padding,
            dilation,
            groups,
            bias,
            named_padding: named,
            padding_mode: mode,
        }
        .into()
    };

    // PyTorch: groups, then the padding, then the window count of each axis on the padded input
    // (the modes other than zeros, and asymmetric "same", pad explicitly first).
    let mut axes = Vec::new();
    let mut valid = groups == groups_valid;
    let mut may_reject = false;
    let planes = batch.unwrap_or(1) as u128 * channels as u128;
    let mut padded_plane: u128 = 1;
    let asymmetric = (0..2).any(|a| {
        conv_padding(named, padding[a], stride[a], kernels[a], dilation[a])
            .is_some_and(|(lo, hi)| lo != hi)
    });
    let explicit = mode != PaddingMode::Zeros || asymmetric;
    for a in 0..2 {
        let Some((lo, hi)) = conv_padding(named, padding[a], stride[a], kernels[a], dilation[a])
        else {
            valid = false;
            continue;
        };
        // Zero padding is copied only where one side has more (PyTorch's "same").
        let copied = if mode == PaddingMode::Zeros {
            lo.abs_diff(hi)
        } else {
            lo + hi
        };
        padded_plane = padded_plane.saturating_mul(lens[a] as u128 + copied);
        may_reject |= beyond_i64(lens[a], kernels[a], stride[a], lo, hi, dilation[a]);
        if lo > usize::MAX as u128 || hi > usize::MAX as u128 || !mode_fits(mode, lens[a], lo, hi) {
            valid = false;
            continue;
        }
        let count = window_count(
            lens[a],
            kernels[a],
            stride[a],
            lo as usize,
            hi as usize,
            dilation[a],
            false,
        );
        match count {
            Some(out) if out <= MAX_AXIS_OUT => axes.push(Axis {
                len: lens[a],
                out: out as usize,
                kernel: kernels[a],
                stride: stride[a],
                lo: lo as usize,
                dilation: dilation[a],
            }),
            Some(_) => return None,
            None => valid = false,
        }
    }
    if valid && explicit {
        let explicit_copy = planes.saturating_mul(padded_plane);
        // A padded copy that fits in memory only on paper: not generated.
        if explicit_copy > 1 << 16 && explicit_copy.saturating_mul(8) <= isize::MAX as u128 {
            return None;
        }
        // One that cannot exist is an error, as PyTorch's F.pad would be; so is an image that
        // cannot exist, even in an empty batch.
        may_reject |= explicit_copy > 1 << 16;
        may_reject |= (channels as u128).saturating_mul(padded_plane) > isize::MAX as u128 / 16;
    }
    let expect = if valid {
        let [ah, aw] = [axes[0], axes[1]];
        let mut out_dims = batch.into_iter().collect::<Vec<_>>();
        out_dims.push(out_channels);
        if spatial == 2 {
            out_dims.push(ah.out);
        }
        out_dims.push(aw.out);
        let n = batch.unwrap_or(1);
        Expect::Ok(
            out_dims,
            Box::new(move |_| {
                Some(conv_terms(
                    [n, channels],
                    [ah, aw],
                    out_channels,
                    groups_valid,
                    mode,
                    bias,
                ))
            }),
        )
    } else {
        Expect::Err
    };
    Some(Case {
        op,
        shapes,
        expect,
        exact: true,
        may_reject,
    })
}

/// Kernel, stride, padding and dilation of one pooling axis of `len` inputs, steered.
fn pool_axis(rng: &mut ChaCha8Rng, len: usize) -> (usize, usize, usize, usize) {
    match rng.random_range(0..6) {
        // Ordinary.
        0 => {
            let k = rng.random_range(1..=3);
            (
                k,
                rng.random_range(1..=3),
                rng.random_range(0..=k / 2),
                rng.random_range(1..=2),
            )
        }
        // A stride beyond the padded input.
        1 => {
            let k = rng.random_range(1..=4);
            (k, extreme(rng), rng.random_range(0..=k / 2), 1)
        }
        // A huge kernel half made of padding: windows start in the padding.
        2 => {
            let k = extreme(rng);
            (
                k,
                mixed(rng).max(1),
                near(rng, (k / 2) as u128).min(k / 2),
                1,
            )
        }
        // A kernel of 1 with a huge dilation (its extent stays 1).
        3 => (1, mixed(rng), 0, extreme(rng)),
        // Dilation stretching the kernel to the padded length.
        4 => {
            let k = rng.random_range(2..=3);
            let p = rng.random_range(0..=k / 2);
            let d = near(rng, (len as u128 + 2 * p as u128 - 1) / (k as u128 - 1)).max(1);
            (k, mixed(rng), p, d)
        }
        // Anything.
        _ => (mixed(rng), mixed(rng), mixed(rng), mixed(rng)),
    }
}

/// The batch and channel dims and the spatial size of a pooling input.
fn pool_input(rng: &mut ChaCha8Rng) -> (Vec<usize>, [usize; 2], usize) {
    let lead: Vec<usize> = if rng.random_bool(0.6) {
        vec![pick(rng, &[0, 1, 2]), rng.random_range(1..=2)]
    } else {
        vec![rng.random_range(1..=2)]
    };
    let hw = [rng.random_range(1..=4), rng.random_range(1..=4)];
    let planes = lead.iter().product();
    (lead, hw, planes)
}

/// The windows of a pooling call on `hw`, or `None` when PyTorch rejects it: padding beyond half
/// the kernel, or no window.
fn pool_axes(
    hw: [usize; 2],
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    d: [usize; 2],
    ceil_mode: bool,
) -> Option<[Axis; 2]> {
    let mut axes = [None; 2];
    for a in 0..2 {
        if p[a] > k[a] / 2 {
            return None;
        }
        let out = window_count(hw[a], k[a], s[a], p[a], p[a], d[a], ceil_mode)?;
        assert!(
            out <= hw[a] as u128 + 1,
            "test bug: {out} windows of {} {} {} {} {} {ceil_mode}",
            hw[a],
            k[a],
            s[a],
            p[a],
            d[a]
        );
        axes[a] = Some(Axis {
            len: hw[a],
            out: out as usize,
            kernel: k[a],
            stride: s[a],
            lo: p[a],
            dilation: d[a],
        });
    }
    Some(axes.map(Option::unwrap))
}

fn pooled(lead: &[usize], axes: [Axis; 2]) -> Vec<usize> {
    [lead, &[axes[0].out, axes[1].out]].concat()
}

fn max_pool_case(rng: &mut ChaCha8Rng) -> Case {
    let (lead, hw, planes) = pool_input(rng);
    let [(kh, sh, ph, dh), (kw, sw, pw, dw)] = [pool_axis(rng, hw[0]), pool_axis(rng, hw[1])];
    let op = MaxPool2d {
        kernel_size: [kh, kw],
        stride: [sh, sw],
        padding: [ph, pw],
        dilation: [dh, dw],
        ceil_mode: rng.random_bool(0.5),
    };
    let may_reject = (0..2).any(|a| {
        let p = op.padding[a] as u128;
        beyond_i64(hw[a], op.kernel_size[a], op.stride[a], p, p, op.dilation[a])
    });
    let expect = match pool_axes(
        hw,
        op.kernel_size,
        op.stride,
        op.padding,
        op.dilation,
        op.ceil_mode,
    ) {
        Some(axes) => Expect::Ok(
            pooled(&lead, axes),
            Box::new(move |args| max_pool_terms(&args[0], planes, axes)),
        ),
        None => Expect::Err,
    };
    Case {
        op: op.into(),
        shapes: vec![[&lead[..], &hw].concat()],
        expect,
        exact: true,
        may_reject,
    }
}

fn avg_pool_case(rng: &mut ChaCha8Rng) -> Case {
    let (lead, hw, planes) = pool_input(rng);
    let [(kh, sh, ph, _), (kw, sw, pw, _)] = [pool_axis(rng, hw[0]), pool_axis(rng, hw[1])];
    let op = AvgPool2d {
        kernel_size: [kh, kw],
        stride: [sh, sw],
        padding: [ph, pw],
        ceil_mode: rng.random_bool(0.5),
        count_include_pad: rng.random_bool(0.5),
        divisor_override: rng
            .random_bool(0.3)
            .then(|| pick(rng, &[1, -3, 4, 7, i64::MAX, i64::MIN, 0])),
    };
    let may_reject = (0..2).any(|a| {
        let p = op.padding[a] as u128;
        beyond_i64(hw[a], op.kernel_size[a], op.stride[a], p, p, 1)
    });
    let axes = pool_axes(
        hw,
        op.kernel_size,
        op.stride,
        op.padding,
        [1, 1],
        op.ceil_mode,
    );
    let expect = match axes {
        Some(axes) if op.divisor_override != Some(0) => {
            let (cip, div) = (op.count_include_pad, op.divisor_override);
            Expect::Ok(
                pooled(&lead, axes),
                Box::new(move |_| Some(avg_pool_terms(planes, axes, cip, div))),
            )
        }
        _ => Expect::Err,
    };
    Case {
        op: op.into(),
        shapes: vec![[&lead[..], &hw].concat()],
        expect,
        exact: false,
        may_reject,
    }
}

/// An adaptive pool to a mixed output size, or `None` for an output that could be allocated
/// but not afforded.
fn adaptive_case(rng: &mut ChaCha8Rng) -> Option<Case> {
    let (lead, hw, planes) = pool_input(rng);
    let output_size = [0, 1].map(|_| {
        if rng.random_bool(0.3) {
            extreme(rng)
        } else {
            rng.random_range(0..=6)
        }
    });
    let out_dims = [&lead[..], &output_size].concat();
    let numel = out_dims
        .iter()
        .fold(1u128, |acc, &d| acc.saturating_mul(d as u128));
    let nonzero = out_dims
        .iter()
        .filter(|&&d| d > 0)
        .fold(1u128, |acc, &d| acc.saturating_mul(d as u128));
    // Shapes whose non-zero dims multiply past isize::MAX / 16 do not exist.
    let expect = if nonzero > (isize::MAX as u128) / 16 {
        Expect::Err
    } else if numel <= MAX_AXIS_OUT * MAX_AXIS_OUT * 4 {
        Expect::Ok(
            out_dims,
            Box::new(move |_| Some(adaptive_terms(planes, hw, output_size))),
        )
    } else {
        return None;
    };
    Some(Case {
        op: AdaptiveAvgPool2d { output_size }.into(),
        shapes: vec![[&lead[..], &hw].concat()],
        expect,
        exact: false,
        may_reject: false,
    })
}

fn any_case(rng: &mut ChaCha8Rng) -> Case {
    loop {
        let case = match rng.random_range(0..5) {
            0 => conv_case(rng, 1),
            1 => conv_case(rng, 2),
            2 => Some(max_pool_case(rng)),
            3 => Some(avg_pool_case(rng)),
            _ => adaptive_case(rng),
        };
        if let Some(c) = case {
            return c;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Checking one case.

fn check_case<S: Scalar>(case: &Case, rng: &mut ChaCha8Rng, eps: f64) {
    let op = &case.op;
    let args: Vec<Vec<f64>> = case
        .shapes
        .iter()
        .map(|d| ints(rng, d.iter().product()))
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
                "{op}: accepted {:?}, which PyTorch rejects",
                case.shapes
            );
            return;
        }
        Expect::Ok(dims, terms) => (dims, terms(&args)),
    };
    let Some(terms) = terms else {
        // Max pooling with a window that holds no input: an error by design (PyTorch gives -inf).
        assert!(
            forward.is_none(),
            "{op}: a window holds no input of {:?}",
            case.shapes
        );
        return;
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
    let out_len: usize = out_dims.iter().product();
    let want = apply_terms(&terms, &args, out_len);
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

fn round(rng: &mut ChaCha8Rng) {
    let case = any_case(rng);
    set_num_threads(rng.random_range(1..=2));
    if rng.random_bool(0.5) {
        check_case::<f64>(&case, rng, 1e-9);
    } else {
        check_case::<f32>(&case, rng, 1e-5);
    }
}

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    // 256 x 1024 calls, about 3 s in the test profile. The rarest bug this file found (an empty
    // batch of huge padded images) showed up about once in 5,000 calls; a soak of 9 million
    // calls in a debug build found nothing more.
    #![proptest_config(config(256))]

    #[test]
    fn extreme_window_attributes_on_valid_shapes_match_the_definitions(seed in any::<u64>()) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for _ in 0..1024 {
            round(&mut rng);
        }
    }
}
