//! Graph-file form of the neural-network family, with torch.nn.functional's names and argument
//! names: `stride`, `padding` (numbers, or "same"/"valid"), `dilation`, `kernel_size`,
//! `output_size` as pairs (`[a, b]`, or one integer for both), `groups`, nn.Conv2d's
//! `padding_mode`, `divisor_override`, `normalized_shape`, `eps`, `momentum`, `training`,
//! `num_groups`, `dim` and `index` for the indexing ops, `indices` and `padding_idx` for embedding,
//! dropout's `p`, `training` and `seed`, attention's `is_causal`, `scale`, `attn_mask`,
//! `dropout_p` and `seed`. Optional tensor arguments (a conv bias, a norm's weight and bias,
//! attention's float mask) are present exactly when the node lists them, in PyTorch's order.

use super::super::attrs::{not_writable, AttrWriter, Attrs};
use crate::ops::nn::{
    AdaptiveAvgPool2d, AvgPool2d, BatchNorm, Conv1d, Conv2d, Dropout, Embedding, Gather, GroupNorm,
    IndexSelect, LayerNorm, MaxPool2d, NamedPadding, PaddingMode, QkvAttention,
    ScaledDotProductAttention, ScatterAdd, Select,
};
use crate::ops::{NnKind as NK, NnOp as N, Op, OpKind as K, OpRules};
use crate::Result;
use serde_json::{Map, Value};

/// PyTorch's default `eps` of the norms.
const EPS: f64 = 1e-5;

/// `(weight, bias)` flags of a norm whose affine arguments follow `fixed` leading ones: one more
/// argument is a weight, two more are a weight and a bias.
fn affine(args: usize, fixed: usize) -> (bool, bool) {
    let extra = args.saturating_sub(fixed);
    (extra >= 1, extra >= 2)
}

/// A convolution's `padding`: `"same"` or `"valid"`, else numbers read by `numbers` from an
/// attribute set holding only that value (so the number errors are the usual ones).
fn conv_padding<T>(
    a: &mut Attrs,
    default: T,
    numbers: impl FnOnce(&mut Attrs) -> Result<T>,
) -> Result<(T, Option<NamedPadding>)> {
    let key = "padding";
    match a.take(key) {
        None => Ok((default, None)),
        Some(Value::String(s)) => match NamedPadding::parse(&s) {
            Some(named) => Ok((default, Some(named))),
            None => Err(crate::Error::invalid(
                a.op(),
                format!("attribute '{key}' must be a number, a pair, \"same\" or \"valid\", found \"{s}\""),
            )),
        },
        Some(v) => {
            let mut only = Attrs::new(a.op(), Map::from_iter([(key.to_string(), v)]));
            Ok((numbers(&mut only)?, None))
        }
    }
}

/// nn.Conv2d's `padding_mode` ("zeros" by default).
fn padding_mode(a: &mut Attrs) -> Result<PaddingMode> {
    let name = a.choice(
        "padding_mode",
        &["zeros", "reflect", "replicate", "circular"],
        "zeros",
    )?;
    Ok(PaddingMode::parse(name).unwrap_or_default())
}

pub(super) fn parse(kind: K, args: usize, a: &mut Attrs) -> Result<Op> {
    let op = match kind {
        K::Nn(NK::Conv1d) => {
            let (padding, named_padding) = conv_padding(a, 0, |p| p.usize_req("padding"))?;
            N::Conv1d(Conv1d {
                stride: a.usize_or("stride", 1)?,
                padding,
                dilation: a.usize_or("dilation", 1)?,
                groups: a.usize_or("groups", 1)?,
                bias: args == 3,
                named_padding,
                padding_mode: padding_mode(a)?,
            })
        }
        K::Nn(NK::Conv2d) => {
            let (padding, named_padding) =
                conv_padding(a, [0, 0], |p| p.usize_pair_req("padding"))?;
            N::Conv2d(Conv2d {
                stride: a.usize_pair_or("stride", [1, 1])?,
                padding,
                dilation: a.usize_pair_or("dilation", [1, 1])?,
                groups: a.usize_or("groups", 1)?,
                bias: args == 3,
                named_padding,
                padding_mode: padding_mode(a)?,
            })
        }
        K::Nn(NK::MaxPool2d) => {
            let kernel_size = a.usize_pair_req("kernel_size")?;
            N::MaxPool2d(MaxPool2d {
                kernel_size,
                stride: a.usize_pair_or("stride", kernel_size)?,
                padding: a.usize_pair_or("padding", [0, 0])?,
                dilation: a.usize_pair_or("dilation", [1, 1])?,
                ceil_mode: a.bool_or("ceil_mode", false)?,
            })
        }
        K::Nn(NK::AvgPool2d) => {
            let kernel_size = a.usize_pair_req("kernel_size")?;
            N::AvgPool2d(AvgPool2d {
                kernel_size,
                stride: a.usize_pair_or("stride", kernel_size)?,
                padding: a.usize_pair_or("padding", [0, 0])?,
                ceil_mode: a.bool_or("ceil_mode", false)?,
                count_include_pad: a.bool_or("count_include_pad", true)?,
                divisor_override: a.isize("divisor_override")?.map(|d| d as i64),
            })
        }
        K::Nn(NK::AdaptiveAvgPool2d) => N::AdaptiveAvgPool2d(AdaptiveAvgPool2d {
            output_size: a.usize_pair_req("output_size")?,
        }),
        K::Nn(NK::LayerNorm) => {
            let (weight, bias) = affine(args, 1);
            N::LayerNorm(LayerNorm {
                normalized_shape: a.usizes_req("normalized_shape")?,
                eps: a.f64_or("eps", EPS)?,
                weight,
                bias,
            })
        }
        K::Nn(NK::BatchNorm) => {
            // PyTorch's F.batch_norm defaults to evaluation mode, whose arguments start with
            // (input, running_mean, running_var).
            let training = a.bool_or("training", false)?;
            let (weight, bias) = affine(args, if training { 1 } else { 3 });
            N::BatchNorm(BatchNorm {
                training,
                momentum: a.f64_or("momentum", 0.1)?,
                eps: a.f64_or("eps", EPS)?,
                weight,
                bias,
            })
        }
        K::Nn(NK::GroupNorm) => {
            let (weight, bias) = affine(args, 1);
            N::GroupNorm(GroupNorm {
                num_groups: a.usize_req("num_groups")?,
                eps: a.f64_or("eps", EPS)?,
                weight,
                bias,
            })
        }
        K::Nn(NK::Embedding) => N::Embedding(Embedding {
            indices: a.indices_req("indices")?,
            padding_idx: a.isize("padding_idx")?,
        }),
        K::Nn(NK::IndexSelect) => N::IndexSelect(IndexSelect {
            dim: a.isize_req("dim")?,
            index: a.indices_req("index")?,
        }),
        K::Nn(NK::Gather) => N::Gather(Gather {
            dim: a.isize_req("dim")?,
            index: a.indices_req("index")?,
        }),
        K::Nn(NK::ScatterAdd) => N::ScatterAdd(ScatterAdd {
            dim: a.isize_req("dim")?,
            index: a.indices_req("index")?,
        }),
        K::Nn(NK::Select) => N::Select(Select {
            dim: a.isize_req("dim")?,
            index: a.isize_req("index")?,
        }),
        K::Nn(NK::Dropout) => N::Dropout(Dropout {
            p: a.f64_or("p", 0.5)?,
            training: a.bool_or("training", true)?,
            seed: a.u64_or("seed", 0)?,
        }),
        K::Nn(NK::ScaledDotProductAttention) => {
            N::ScaledDotProductAttention(ScaledDotProductAttention {
                is_causal: a.bool_or("is_causal", false)?,
                scale: a.f64("scale")?,
                attn_mask: a.mask("attn_mask")?,
                float_mask: args == 4,
                dropout_p: a.f64_or("dropout_p", 0.0)?,
                seed: a.u64_or("seed", 0)?,
            })
        }
        K::Nn(NK::QkvAttention) => N::QkvAttention(QkvAttention {
            heads: a.usize_req("heads")?,
            is_causal: a.bool_or("is_causal", false)?,
            scale: a.f64("scale")?,
            dropout_p: a.f64_or("dropout_p", 0.0)?,
            seed: a.u64_or("seed", 0)?,
        }),
        other => return Err(not_writable(other.label())),
    };
    Ok(Op::Nn(Box::new(op)))
}

pub(super) fn write(op: &N, w: &mut AttrWriter) -> Result<()> {
    #[allow(unreachable_patterns)]
    match op {
        N::Conv1d(c) => {
            w.int("stride", c.stride);
            match c.named_padding {
                Some(n) => w.str("padding", n.name()),
                None => w.int("padding", c.padding),
            }
            w.int("dilation", c.dilation);
            w.int("groups", c.groups);
            write_padding_mode(w, c.padding_mode);
        }
        N::Conv2d(c) => {
            w.pair("stride", c.stride);
            match c.named_padding {
                Some(n) => w.str("padding", n.name()),
                None => w.pair("padding", c.padding),
            }
            w.pair("dilation", c.dilation);
            w.int("groups", c.groups);
            write_padding_mode(w, c.padding_mode);
        }
        N::MaxPool2d(p) => {
            w.pair("kernel_size", p.kernel_size);
            w.pair("stride", p.stride);
            w.pair("padding", p.padding);
            w.pair("dilation", p.dilation);
            w.bool("ceil_mode", p.ceil_mode);
        }
        N::AvgPool2d(p) => {
            w.pair("kernel_size", p.kernel_size);
            w.pair("stride", p.stride);
            w.pair("padding", p.padding);
            w.bool("ceil_mode", p.ceil_mode);
            w.bool("count_include_pad", p.count_include_pad);
            if let Some(d) = p.divisor_override {
                w.int("divisor_override", d);
            }
        }
        N::AdaptiveAvgPool2d(p) => w.pair("output_size", p.output_size),
        N::LayerNorm(n) => {
            w.ints("normalized_shape", &n.normalized_shape);
            w.f64("eps", n.eps);
        }
        N::BatchNorm(n) => {
            w.bool("training", n.training);
            w.f64("momentum", n.momentum);
            w.f64("eps", n.eps);
        }
        N::GroupNorm(n) => {
            w.int("num_groups", n.num_groups);
            w.f64("eps", n.eps);
        }
        N::Embedding(e) => {
            w.indices("indices", &e.indices);
            if let Some(p) = e.padding_idx {
                w.int("padding_idx", p);
            }
        }
        N::IndexSelect(i) => {
            w.int("dim", i.dim);
            w.indices("index", &i.index);
        }
        N::Gather(i) => {
            w.int("dim", i.dim);
            w.indices("index", &i.index);
        }
        N::ScatterAdd(i) => {
            w.int("dim", i.dim);
            w.indices("index", &i.index);
        }
        N::Select(s) => {
            w.int("dim", s.dim);
            w.int("index", s.index);
        }
        N::Dropout(d) => {
            w.f64("p", d.p);
            w.bool("training", d.training);
            w.int("seed", d.seed);
        }
        N::ScaledDotProductAttention(s) => {
            w.bool("is_causal", s.is_causal);
            w.opt_f64("scale", s.scale);
            if let Some(mask) = &s.attn_mask {
                w.mask("attn_mask", mask);
            }
            if s.dropout_p != 0.0 || s.seed != 0 {
                w.f64("dropout_p", s.dropout_p);
                w.int("seed", s.seed);
            }
        }
        N::QkvAttention(s) => {
            w.int("heads", s.heads);
            w.bool("is_causal", s.is_causal);
            w.opt_f64("scale", s.scale);
            if s.dropout_p != 0.0 || s.seed != 0 {
                w.f64("dropout_p", s.dropout_p);
                w.int("seed", s.seed);
            }
        }
        other => return Err(not_writable(other.name())),
    }
    Ok(())
}

/// `padding_mode`, written only when it is not PyTorch's default "zeros".
fn write_padding_mode(w: &mut AttrWriter, mode: PaddingMode) {
    if mode != PaddingMode::Zeros {
        w.str("padding_mode", mode.name());
    }
}
