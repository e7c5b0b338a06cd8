//! The neural-network family in the op-case registry: its attribute variants (conv and pooling
//! geometries that do not divide evenly, repeated indices, a fully masked attention row), argument
//! generators, first-argument shapes that suit each op, and the generic-point conditions of law 6.

use super::NnKind;
use super::{
    distinct, random_dim, random_shape, shape, uniform, Draft, DOMAIN_MARGIN, KINK_MARGIN,
};
use crate::ops::nn::{
    AdaptiveAvgPool2d, AvgPool2d, BatchNorm, Conv1d, Conv2d, Dropout, Embedding, Gather, GroupNorm,
    IndexSelect, IndexTensor, LayerNorm, MaxPool2d, NnOp, QkvAttention, ScaledDotProductAttention,
    ScatterAdd, Select,
};
use crate::ops::nn::{NamedPadding, PaddingMode};
use crate::ops::{Mask, Op, OpRules};
use rand::Rng;
use tapegrad_tensor::{Shape, Tensor};

/// Smallest biased variance of a normalised group (of three or more elements) at a generic point:
/// the derivatives of a normalisation grow like 1/std, its third derivative like 1/std³, so a
/// spread of at least 0.1 keeps central differences accurate.
pub const MIN_GROUP_VARIANCE: f64 = 1e-2;

use NnKind as N;

const CONV2D: &[&str] = &[
    "plain",
    "bias",
    "stride 2 padding 1",
    "stride (2, 1) padding (0, 1) dilation (1, 2)",
    "groups 2 bias",
    "padding same reflect",
    "padding 1 replicate bias",
];
const CONV1D: &[&str] = &[
    "plain",
    "bias",
    "stride 2 padding 1",
    "stride 3 padding 2 dilation 2",
    "groups 2 bias",
    "padding same reflect",
    "padding 1 circular bias",
];

/// The named attribute variants of an nn kind.
pub(super) fn variants(kind: NnKind) -> &'static [&'static str] {
    match kind {
        N::Conv1d => CONV1D,
        N::Conv2d => CONV2D,
        N::MaxPool2d => &[
            "kernel 2",
            "kernel 3 stride 2 padding 1",
            "kernel 2 stride 1 dilation 2",
            "kernel 2 ceil mode",
        ],
        N::AvgPool2d => &[
            "kernel 2",
            "kernel 3 stride 2 padding 1 count pad",
            "kernel 3 stride 2 padding 1 skip pad",
            "kernel 2 ceil mode",
            "kernel 3 stride 2 padding 1 divisor 4",
        ],
        N::AdaptiveAvgPool2d => &["global", "2x3", "larger than input"],
        N::LayerNorm => &["last axis affine", "last two axes", "weight only"],
        N::BatchNorm => &[
            "training affine",
            "training plain",
            "evaluation affine",
            "evaluation plain",
        ],
        N::GroupNorm => &["one group affine", "group per channel", "two groups affine"],
        N::Embedding => &[
            "repeated indices",
            "2-D indices",
            "padding_idx not looked up",
        ],
        N::IndexSelect => &["axis 0", "last axis repeated", "0-D index"],
        N::Gather | N::ScatterAdd => &["axis 0", "last axis"],
        N::Select => &["axis 0", "negative index last axis"],
        N::Dropout => &["training p 0.3", "training p 1", "evaluation"],
        N::ScaledDotProductAttention => &[
            "plain",
            "causal",
            "scale 0.5",
            "mask with an empty row",
            "dropout 0.3",
            "float mask",
            "key and value broadcast over leading axes",
        ],
        N::QkvAttention => &[
            "causal, up to three heads",
            "one head",
            "scale 0.5, head width 1",
            "causal, dropout 0.3",
        ],
    }
}

/// `[N,] C, spatial...` with the batch axis present half the time: an input that conv and pooling
/// accept, with sizes that often do not divide evenly by the stride.
fn image<R: Rng + ?Sized>(spatial: usize, rng: &mut R) -> Shape {
    let mut dims = Vec::new();
    if rng.random_bool(0.5) {
        dims.push(rng.random_range(1..=2));
    }
    dims.push(rng.random_range(1..=3));
    for _ in 0..spatial {
        dims.push(rng.random_range(2..=5));
    }
    shape(&dims)
}

/// A first-argument shape that suits `kind` (most of the time; the generator has the last word).
pub(super) fn random_first_shape<R: Rng + ?Sized>(kind: NnKind, rng: &mut R) -> Shape {
    match kind {
        N::Conv1d => image(1, rng),
        N::Conv2d | N::MaxPool2d | N::AvgPool2d | N::AdaptiveAvgPool2d => image(2, rng),
        N::BatchNorm | N::GroupNorm => {
            let spatial = rng.random_range(0..=2);
            let mut dims = vec![rng.random_range(1..=3), rng.random_range(1..=4)];
            dims.extend((0..spatial).map(|_| rng.random_range(1..=3)));
            shape(&dims)
        }
        N::Embedding => shape(&[rng.random_range(2..=6), rng.random_range(1..=4)]),
        N::ScaledDotProductAttention => {
            let lead = rng.random_range(0..=2);
            let mut dims: Vec<usize> = (0..lead).map(|_| rng.random_range(1..=2)).collect();
            dims.extend([rng.random_range(1..=4), rng.random_range(1..=4)]);
            shape(&dims)
        }
        N::QkvAttention => {
            let lead = rng.random_range(0..=2);
            let mut dims: Vec<usize> = (0..lead).map(|_| rng.random_range(1..=2)).collect();
            let width = 3 * rng.random_range(1..=3) * rng.random_range(1..=2);
            dims.extend([rng.random_range(1..=4), width]);
            shape(&dims)
        }
        N::LayerNorm | N::IndexSelect | N::Gather | N::ScatterAdd | N::Select | N::Dropout => {
            random_shape(rng)
        }
    }
}

/// Per-axis (height, width) convolution attributes of a variant.
struct ConvAttrs {
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
    bias: bool,
    named_padding: Option<NamedPadding>,
    padding_mode: PaddingMode,
}

fn conv_attrs(spatial: usize, variant: usize) -> ConvAttrs {
    let plain = ConvAttrs {
        stride: [1, 1],
        padding: [0, 0],
        dilation: [1, 1],
        groups: 1,
        bias: false,
        named_padding: None,
        padding_mode: PaddingMode::Zeros,
    };
    match (spatial, variant) {
        (_, 1) => ConvAttrs {
            bias: true,
            ..plain
        },
        (_, 2) => ConvAttrs {
            stride: [2, 2],
            padding: [1, 1],
            ..plain
        },
        (2, 3) => ConvAttrs {
            stride: [2, 1],
            padding: [0, 1],
            dilation: [1, 2],
            bias: true,
            ..plain
        },
        (_, 3) => ConvAttrs {
            stride: [1, 3],
            padding: [0, 2],
            dilation: [1, 2],
            bias: true,
            ..plain
        },
        (_, 4) => ConvAttrs {
            groups: 2,
            bias: true,
            ..plain
        },
        // "same" pads (at most 1 per side for kernels up to 3) below every input size (>= 2), as
        // reflect requires; the odd total of an even kernel takes the explicit-padding path.
        (_, 5) => ConvAttrs {
            named_padding: Some(NamedPadding::Same),
            padding_mode: PaddingMode::Reflect,
            ..plain
        },
        (2, 6) => ConvAttrs {
            padding: [1, 1],
            padding_mode: PaddingMode::Replicate,
            bias: true,
            ..plain
        },
        (_, 6) => ConvAttrs {
            padding: [1, 1],
            padding_mode: PaddingMode::Circular,
            bias: true,
            ..plain
        },
        _ => plain,
    }
}

/// A conv case on input `x` (`spatial` = 1 or 2 trailing axes): random kernel sizes that fit the
/// padded input, `groups * (1 or 2)` output channels.
fn conv<R: Rng + ?Sized>(spatial: usize, variant: usize, x: &Shape, rng: &mut R) -> Option<Draft> {
    let d = x.dims();
    let r = d.len();
    if r != spatial + 1 && r != spatial + 2 {
        return None;
    }
    let a = conv_attrs(spatial, variant);
    let c = d[r - spatial - 1];
    if c == 0 || c % a.groups != 0 {
        return None;
    }
    let mut kernel = Vec::new();
    for (i, &len) in d[r - spatial..].iter().enumerate() {
        let axis = 2 - spatial + i;
        let room = len + 2 * a.padding[axis];
        // The dilated kernel must fit the padded input: dilation * (k - 1) + 1 <= room.
        let max_k = (room.checked_sub(1)? / a.dilation[axis] + 1).min(3);
        kernel.push(rng.random_range(1..=max_k));
    }
    let out_channels = a.groups * rng.random_range(1..=2);
    let mut w = vec![out_channels, c / a.groups];
    w.extend(&kernel);
    let mut inputs = vec![
        uniform(x, rng, -2.0, 2.0),
        uniform(&shape(&w), rng, -1.0, 1.0),
    ];
    if a.bias {
        inputs.push(uniform(&shape(&[out_channels]), rng, -1.0, 1.0));
    }
    let op: Op = if spatial == 2 {
        Conv2d {
            stride: a.stride,
            padding: a.padding,
            dilation: a.dilation,
            groups: a.groups,
            bias: a.bias,
            named_padding: a.named_padding,
            padding_mode: a.padding_mode,
        }
        .into()
    } else {
        Conv1d {
            stride: a.stride[1],
            padding: a.padding[1],
            dilation: a.dilation[1],
            groups: a.groups,
            bias: a.bias,
            named_padding: a.named_padding,
            padding_mode: a.padding_mode,
        }
        .into()
    };
    Some((op, inputs))
}

/// The height and width of a rank-3 or rank-4 input.
fn spatial_dims(x: &Shape) -> Option<(usize, usize)> {
    let d = x.dims();
    matches!(d.len(), 3 | 4).then(|| (d[d.len() - 2], d[d.len() - 1]))
}

fn index_vector<R: Rng + ?Sized>(
    len: usize,
    bound: usize,
    repeat: bool,
    rng: &mut R,
) -> Vec<usize> {
    let mut v: Vec<usize> = (0..len).map(|_| rng.random_range(0..bound)).collect();
    if repeat && len >= 2 {
        v[1] = v[0];
    }
    v
}

/// An index for gather and scatter_add on `x` along `axis`: `x`'s rank, no larger off `axis`,
/// 1 to 3 long along it, values in range (with repeats, which scatter_add accumulates).
fn scatter_index<R: Rng + ?Sized>(x: &Shape, axis: usize, rng: &mut R) -> Option<IndexTensor> {
    let d = x.dims();
    if d.contains(&0) {
        return None;
    }
    let dims: Vec<usize> = (0..d.len())
        .map(|a| {
            if a == axis {
                rng.random_range(1..=3)
            } else {
                rng.random_range(1..=d[a])
            }
        })
        .collect();
    let n = dims.iter().product();
    IndexTensor::new(&dims, index_vector(n, d[axis], false, rng)).ok()
}

/// A case of nn `kind`/`variant` whose first argument has shape `x`; `None` when it does not fit.
pub(super) fn generate<R: Rng + ?Sized>(
    kind: NnKind,
    variant: usize,
    x: &Shape,
    rng: &mut R,
) -> Option<Draft> {
    let d = x.dims();
    let rank = d.len();
    let affine = |n: usize, weight: bool, bias: bool, rng: &mut R| {
        let mut v = Vec::new();
        if weight {
            v.push(uniform(&shape(&[n]), rng, 0.5, 1.5));
        }
        if bias {
            v.push(uniform(&shape(&[n]), rng, -1.0, 1.0));
        }
        v
    };
    Some(match kind {
        N::Conv1d => return conv(1, variant, x, rng),
        N::Conv2d => return conv(2, variant, x, rng),
        N::MaxPool2d => {
            let (h, w) = spatial_dims(x)?;
            let op = match variant {
                0 if h >= 2 && w >= 2 => MaxPool2d::new([2, 2]),
                1 => MaxPool2d {
                    stride: [2, 2],
                    padding: [1, 1],
                    ..MaxPool2d::new([3, 3])
                },
                2 if h >= 3 && w >= 3 => MaxPool2d {
                    stride: [1, 1],
                    dilation: [2, 2],
                    ..MaxPool2d::new([2, 2])
                },
                3 if h >= 2 && w >= 2 => MaxPool2d {
                    ceil_mode: true,
                    ..MaxPool2d::new([2, 2])
                },
                _ => return None,
            };
            // Pairwise distinct values: no window ever holds a near-tie.
            (op.into(), vec![distinct(x, rng)])
        }
        N::AvgPool2d => {
            let (h, w) = spatial_dims(x)?;
            let padded = |count_include_pad| AvgPool2d {
                stride: [2, 2],
                padding: [1, 1],
                count_include_pad,
                ..AvgPool2d::new([3, 3])
            };
            let op = match variant {
                0 if h >= 2 && w >= 2 => AvgPool2d::new([2, 2]),
                1 => padded(true),
                2 => padded(false),
                3 if h >= 2 && w >= 2 => AvgPool2d {
                    ceil_mode: true,
                    ..AvgPool2d::new([2, 2])
                },
                4 => AvgPool2d {
                    divisor_override: Some(4),
                    ..padded(true)
                },
                _ => return None,
            };
            (op.into(), vec![uniform(x, rng, -2.0, 2.0)])
        }
        N::AdaptiveAvgPool2d => {
            let (h, w) = spatial_dims(x)?;
            let output_size = [[1, 1], [2, 3], [h + 1, w + 2]][variant];
            (
                AdaptiveAvgPool2d { output_size }.into(),
                vec![uniform(x, rng, -2.0, 2.0)],
            )
        }
        N::LayerNorm => {
            let (k, weight, bias) = [(1, true, true), (2, false, false), (1, true, false)][variant];
            if rank < k {
                return None;
            }
            let normalized_shape = d[rank - k..].to_vec();
            let n: usize = normalized_shape.iter().product();
            if n < 3 {
                return None;
            }
            let mut inputs = vec![uniform(x, rng, -2.0, 2.0)];
            // Affine parameters have the normalised shape.
            let param = shape(&normalized_shape);
            if weight {
                inputs.push(uniform(&param, rng, 0.5, 1.5));
            }
            if bias {
                inputs.push(uniform(&param, rng, -1.0, 1.0));
            }
            let op = LayerNorm {
                normalized_shape,
                eps: 1e-5,
                weight,
                bias,
            };
            (op.into(), inputs)
        }
        N::BatchNorm => {
            if rank < 2 {
                return None;
            }
            let (training, with_affine) =
                [(true, true), (true, false), (false, true), (false, false)][variant];
            let c = d[1];
            let per_channel = x.numel() / c.max(1);
            if c == 0 || (training && per_channel < 3) {
                return None;
            }
            let mut inputs = vec![uniform(x, rng, -2.0, 2.0)];
            if !training {
                inputs.push(uniform(&shape(&[c]), rng, -1.0, 1.0));
                inputs.push(uniform(&shape(&[c]), rng, 0.5, 2.0));
            }
            inputs.extend(affine(c, with_affine, with_affine, rng));
            let op = BatchNorm {
                weight: with_affine,
                bias: with_affine,
                ..BatchNorm::new(training)
            };
            (op.into(), inputs)
        }
        N::GroupNorm => {
            if rank < 2 || d[1] == 0 {
                return None;
            }
            let c = d[1];
            let (num_groups, with_affine) = match variant {
                0 => (1, true),
                1 => (c, false),
                _ if c % 2 == 0 => (2, true),
                _ => return None,
            };
            let spatial: usize = d[2..].iter().product();
            if c / num_groups * spatial < 3 {
                return None;
            }
            let mut inputs = vec![uniform(x, rng, -2.0, 2.0)];
            inputs.extend(affine(c, with_affine, with_affine, rng));
            let op = GroupNorm {
                num_groups,
                eps: 1e-5,
                weight: with_affine,
                bias: with_affine,
            };
            (op.into(), inputs)
        }
        N::Embedding => {
            if rank != 2 || d[0] == 0 {
                return None;
            }
            let indices = if variant == 0 {
                let n = rng.random_range(2..=5);
                IndexTensor::vector(index_vector(n, d[0], true, rng))
            } else {
                let dims = [rng.random_range(1..=3), rng.random_range(1..=3)];
                IndexTensor::new(&dims, index_vector(dims[0] * dims[1], d[0], false, rng)).ok()?
            };
            let mut op = Embedding::new(indices);
            if variant == 2 {
                // A padding row that is looked up has a zero gradient where finite differences
                // see a slope (by design), so the generic case pads a row no index reads.
                let unused = (0..d[0]).find(|row| !op.indices.data.contains(row))?;
                op.padding_idx = Some(
                    unused as isize
                        - if rng.random_bool(0.5) {
                            d[0] as isize
                        } else {
                            0
                        },
                );
            }
            (op.into(), vec![uniform(x, rng, -2.0, 2.0)])
        }
        N::IndexSelect => {
            if rank == 0 {
                return None;
            }
            let (dim, axis) = if variant == 1 { (-1, rank - 1) } else { (0, 0) };
            let bound = d[axis];
            if bound == 0 {
                return None;
            }
            let index = match variant {
                0 => IndexTensor::vector(index_vector(random_dim(rng), bound, false, rng)),
                1 => IndexTensor::vector(index_vector(rng.random_range(2..=4), bound, true, rng)),
                _ => IndexTensor::new(&[], vec![rng.random_range(0..bound)]).ok()?,
            };
            (
                IndexSelect { dim, index }.into(),
                vec![uniform(x, rng, -2.0, 2.0)],
            )
        }
        N::Gather | N::ScatterAdd => {
            if rank == 0 {
                return None;
            }
            let (dim, axis) = if variant == 0 { (0, 0) } else { (-1, rank - 1) };
            let index = scatter_index(x, axis, rng)?;
            let mut inputs = vec![uniform(x, rng, -2.0, 2.0)];
            let op: Op = if kind == N::Gather {
                Gather { dim, index }.into()
            } else {
                inputs.push(uniform(&index.shape, rng, -2.0, 2.0));
                ScatterAdd { dim, index }.into()
            };
            (op, inputs)
        }
        N::Select => {
            if rank == 0 {
                return None;
            }
            let (dim, axis) = if variant == 0 { (0, 0) } else { (-1, rank - 1) };
            let len = d[axis];
            if len == 0 {
                return None;
            }
            let index = if variant == 0 {
                rng.random_range(0..len) as isize
            } else {
                -(rng.random_range(1..=len) as isize)
            };
            (
                Select { dim, index }.into(),
                vec![uniform(x, rng, -2.0, 2.0)],
            )
        }
        N::Dropout => {
            let (p, training) = [(0.3, true), (1.0, true), (0.5, false)][variant];
            let op = Dropout {
                p,
                training,
                seed: rng.random(),
            };
            (op.into(), vec![uniform(x, rng, -2.0, 2.0)])
        }
        N::ScaledDotProductAttention => {
            if rank < 2 {
                return None;
            }
            let l = d[rank - 2];
            let (s, ev) = (rng.random_range(1..=4), rng.random_range(1..=4));
            let mut k = d.to_vec();
            k[rank - 2] = s;
            if variant == 6 {
                // Key and value shared along some leading axes (multi-query attention's
                // [B, 1, S, E] under [B, H, L, E]), or without the leading axes at all.
                if rng.random_bool(0.25) {
                    k.drain(..rank - 2);
                } else {
                    for a in &mut k[..rank - 2] {
                        if rng.random_bool(0.6) {
                            *a = 1;
                        }
                    }
                }
            }
            let mut v = k.clone();
            let kr = v.len();
            v[kr - 1] = ev;
            let op = match variant {
                0 | 6 => ScaledDotProductAttention::default(),
                1 => ScaledDotProductAttention {
                    is_causal: true,
                    ..Default::default()
                },
                2 => ScaledDotProductAttention {
                    scale: Some(0.5),
                    ..Default::default()
                },
                4 => ScaledDotProductAttention {
                    dropout_p: 0.3,
                    seed: rng.random(),
                    ..Default::default()
                },
                5 => ScaledDotProductAttention {
                    float_mask: true,
                    ..Default::default()
                },
                _ => {
                    // Query row 0 sees no key: its output is 0 and it passes no gradient.
                    let bits = (0..l * s).map(|i| i >= s && rng.random_bool(0.6)).collect();
                    ScaledDotProductAttention {
                        attn_mask: Some(Mask::new(&[l, s], bits).ok()?),
                        ..Default::default()
                    }
                }
            };
            let mut inputs = vec![
                uniform(x, rng, -2.0, 2.0),
                uniform(&shape(&k), rng, -2.0, 2.0),
                uniform(&shape(&v), rng, -2.0, 2.0),
            ];
            if op.float_mask {
                // An additive (L, S) mask broadcast over the batch axes. Finite: an input of -inf
                // would poison the size-scaled tolerances of the whole-program laws; the -inf rows
                // are covered by crates/core/tests/ops_nn_options_attention.rs.
                inputs.push(uniform(&shape(&[l, s]), rng, -1.0, 1.0));
            }
            (op.into(), inputs)
        }
        N::QkvAttention => {
            let e = match d.last() {
                Some(&w) if rank >= 2 && w > 0 && w % 3 == 0 => w / 3,
                _ => return None,
            };
            let largest_divisor_up_to_3 = (1..=3).rev().find(|h| e % h == 0).unwrap_or(1);
            let op = match variant {
                0 => QkvAttention {
                    heads: largest_divisor_up_to_3,
                    is_causal: true,
                    ..Default::default()
                },
                1 => QkvAttention {
                    heads: 1,
                    ..Default::default()
                },
                2 => QkvAttention {
                    heads: e,
                    scale: Some(0.5),
                    ..Default::default()
                },
                _ => QkvAttention {
                    heads: largest_divisor_up_to_3,
                    is_causal: true,
                    dropout_p: 0.3,
                    seed: rng.random(),
                    ..Default::default()
                },
            };
            (op.into(), vec![uniform(x, rng, -2.0, 2.0)])
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Generic points.

/// The nn part of `is_generic`, called once the forward pass succeeded with bounded values:
/// max_pool2d windows hold no near-tie for the maximum; every normalised group has one element or
/// at least three with variance at least `MIN_GROUP_VARIANCE` (see `spread_groups`); batch_norm's running variance plus eps is
/// at least `DOMAIN_MARGIN`. The other nn ops are linear in each argument (conv, pooling by
/// averages, indexing, dropout) or smooth everywhere (attention, masked rows included).
pub(super) fn is_generic_nn(op: &NnOp, inputs: &[&Tensor<f64>]) -> bool {
    let x = inputs[0];
    match op {
        NnOp::MaxPool2d(pool) => max_pool_tie_free(pool, x),
        NnOp::LayerNorm(ln) => {
            let len: usize = ln.normalized_shape.iter().product();
            spread_groups(x, |i| i / len.max(1))
        }
        NnOp::GroupNorm(gn) => {
            let d = x.dims();
            let spatial: usize = d[2..].iter().product();
            let group_len = (d[1] / gn.num_groups.max(1)) * spatial;
            spread_groups(x, |i| i / group_len.max(1))
        }
        NnOp::BatchNorm(bn) if bn.training => {
            let d = x.dims();
            let spatial: usize = d[2..].iter().product();
            let c = d[1].max(1);
            spread_groups(x, |i| (i / spatial.max(1)) % c)
        }
        NnOp::BatchNorm(bn) => inputs[2]
            .data()
            .iter()
            .all(|&v| v + bn.eps >= DOMAIN_MARGIN),
        NnOp::Conv1d(_)
        | NnOp::Conv2d(_)
        | NnOp::AvgPool2d(_)
        | NnOp::AdaptiveAvgPool2d(_)
        | NnOp::Embedding(_)
        | NnOp::IndexSelect(_)
        | NnOp::Gather(_)
        | NnOp::ScatterAdd(_)
        | NnOp::Select(_)
        | NnOp::Dropout(_)
        | NnOp::ScaledDotProductAttention(_)
        | NnOp::QkvAttention(_) => true,
    }
}

/// Whether every group (elements with equal `group_of(flat index)`) has one element or at least
/// three, with biased variance at least `MIN_GROUP_VARIANCE`. A group of one normalises to exactly
/// 0 whatever its value (a zero derivative, computed exactly). A group of two normalises to
/// `±1/sqrt(1 + eps/var)` whatever its values, so its derivative is about `eps/var` times
/// `rstd`, computed by cancelling terms of size `rstd`: the adjoint identity (law 5) would then
/// compare rounding errors to a tolerance scaled by the tiny result, not check the rule.
fn spread_groups(x: &Tensor<f64>, group_of: impl Fn(usize) -> usize) -> bool {
    let mut groups: std::collections::BTreeMap<usize, Vec<f64>> = Default::default();
    for (i, &v) in x.data().iter().enumerate() {
        groups.entry(group_of(i)).or_default().push(v);
    }
    groups.values().all(|g| {
        let n = g.len() as f64;
        let mean = g.iter().sum::<f64>() / n;
        let var = g.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        g.len() == 1 || (g.len() >= 3 && var >= MIN_GROUP_VARIANCE)
    })
}

/// The input positions window `o` of one axis reads: `o * stride - padding + k * dilation` for
/// the `k < kernel` that land in `0..len` (computed without looping over a huge kernel).
fn window(
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
    o: usize,
    len: usize,
) -> Vec<usize> {
    let (kernel, d) = (kernel as i128, dilation.max(1) as i128);
    let start = o as i128 * stride as i128 - padding as i128;
    let first = if start < 0 { (-start + d - 1) / d } else { 0 };
    let end = ((len as i128 - start + d - 1) / d).clamp(0, kernel);
    (first..end.max(first))
        .map(|k| (start + k * d) as usize)
        .collect()
}

/// Whether, in every window of `pool` over `x`, the maximum beats the runner-up by more than
/// `KINK_MARGIN` (so a small step never moves the gradient to another element).
fn max_pool_tie_free(pool: &MaxPool2d, x: &Tensor<f64>) -> bool {
    let Ok(out) = pool.output_shape(&[x.shape()]) else {
        return false;
    };
    let r = x.rank();
    let (h, w) = (x.dims()[r - 2], x.dims()[r - 1]);
    let (oh, ow) = (out.dims()[r - 2], out.dims()[r - 1]);
    let rows: Vec<Vec<usize>> = (0..oh)
        .map(|o| {
            window(
                pool.kernel_size[0],
                pool.stride[0],
                pool.padding[0],
                pool.dilation[0],
                o,
                h,
            )
        })
        .collect();
    let cols: Vec<Vec<usize>> = (0..ow)
        .map(|o| {
            window(
                pool.kernel_size[1],
                pool.stride[1],
                pool.padding[1],
                pool.dilation[1],
                o,
                w,
            )
        })
        .collect();
    let data = x.data();
    data.chunks(h * w).all(|plane| {
        rows.iter().all(|ys| {
            cols.iter().all(|xs| {
                let vals: Vec<f64> = ys
                    .iter()
                    .flat_map(|&y| xs.iter().map(move |&x| plane[y * w + x]))
                    .collect();
                let top = vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                vals.iter().filter(|&&v| v > top - KINK_MARGIN).count() == 1
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_clip_to_the_input_and_skip_with_dilation() {
        // kernel 3, stride 2, padding 1 over 4: windows [-1, 0, 1] -> [0, 1], [1, 2, 3].
        assert_eq!(window(3, 2, 1, 1, 0, 4), vec![0, 1]);
        assert_eq!(window(3, 2, 1, 1, 1, 4), vec![1, 2, 3]);
        // kernel 2, dilation 2, stride 1 over 3: window 0 reads 0 and 2.
        assert_eq!(window(2, 1, 0, 2, 0, 3), vec![0, 2]);
        // A huge kernel reads only the input.
        assert_eq!(window(usize::MAX / 4, 1, 0, 1, 0, 3), vec![0, 1, 2]);
    }

    #[test]
    fn max_pool_ties_and_flat_groups_are_not_generic() {
        let pool = MaxPool2d::new([2, 2]);
        let tied = Tensor::from_f64(&[1, 2, 2], &[1.0, 3.0, 3.0, 0.0]).unwrap();
        let apart = Tensor::from_f64(&[1, 2, 2], &[1.0, 3.0, 2.5, 0.0]).unwrap();
        assert!(!max_pool_tie_free(&pool, &tied));
        assert!(max_pool_tie_free(&pool, &apart));
        let flat = Tensor::from_f64(&[2, 3], &[1.0, 1.01, 1.02, -1.0, 0.5, 0.0]).unwrap();
        assert!(!spread_groups(&flat, |i| i / 3));
        assert!(spread_groups(&flat, |i| i % 2));
        assert!(spread_groups(&flat, |i| i));
        // Pairs are never generic, however spread.
        assert!(!spread_groups(&flat, |i| i / 2));
    }
}
