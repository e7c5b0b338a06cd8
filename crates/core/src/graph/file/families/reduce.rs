//! Graph-file form of the reductions: `axes` (a list; absent reduces every axis) and `keepdim`
//! for sum, mean and amax; `axis` (one integer) for softmax and log_softmax.

use super::super::attrs::{not_writable, AttrWriter, Attrs};
use crate::ops::{Op, ReduceOp as R};
use tapegrad_tensor::Result;

pub(super) const OPS: &[&str] = &["sum", "mean", "amax", "softmax", "log_softmax"];

pub(super) fn parse(name: &'static str, _args: usize, a: &mut Attrs) -> Result<Op> {
    let op = match name {
        "sum" => R::Sum {
            axes: a.isizes("axes")?,
            keepdim: a.bool_or("keepdim", false)?,
        },
        "mean" => R::Mean {
            axes: a.isizes("axes")?,
            keepdim: a.bool_or("keepdim", false)?,
        },
        "amax" => R::Amax {
            axes: a.isizes("axes")?,
            keepdim: a.bool_or("keepdim", false)?,
        },
        "softmax" => R::Softmax {
            axis: a.isize_req("axis")?,
        },
        "log_softmax" => R::LogSoftmax {
            axis: a.isize_req("axis")?,
        },
        other => return Err(not_writable(other)),
    };
    Ok(Op::Reduce(op))
}

pub(super) fn write(op: &R, w: &mut AttrWriter) -> Result<()> {
    #[allow(unreachable_patterns)]
    match op {
        R::Sum { axes, keepdim } | R::Mean { axes, keepdim } | R::Amax { axes, keepdim } => {
            if let Some(axes) = axes {
                w.ints("axes", axes);
            }
            w.bool("keepdim", *keepdim);
        }
        R::Softmax { axis } | R::LogSoftmax { axis } => w.int("axis", axis),
        other => return Err(not_writable(crate::ops::OpRules::name(other))),
    }
    Ok(())
}
