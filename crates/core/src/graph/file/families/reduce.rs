//! Graph-file form of the reductions: `axes` (a list; absent reduces every axis) and `keepdim`
//! for every reduction over axes (sum, mean, amax, ...: `ReduceOp::over_axes`); `axis` (one
//! integer) for softmax and log_softmax.

use super::super::attrs::{not_writable, AttrWriter, Attrs};
use crate::ops::reduce::{LogSoftmax, Softmax};
use crate::ops::{Op, OpKind as K, ReduceOp as R};
use crate::Result;

pub(super) fn parse(kind: K, _args: usize, a: &mut Attrs) -> Result<Op> {
    let op = match kind {
        K::Softmax => R::Softmax(Softmax {
            axis: a.isize_req("axis")?,
        }),
        K::LogSoftmax => R::LogSoftmax(LogSoftmax {
            axis: a.isize_req("axis")?,
        }),
        other => {
            let (axes, keepdim) = (a.isizes("axes")?, a.bool_or("keepdim", false)?);
            R::over_axes(other, axes, keepdim).ok_or_else(|| not_writable(other.label()))?
        }
    };
    Ok(Op::Reduce(op))
}

pub(super) fn write(op: &R, w: &mut AttrWriter) -> Result<()> {
    if let Some((axes, keepdim)) = op.axes_and_keepdim() {
        if let Some(axes) = axes {
            w.ints("axes", axes);
        }
        w.bool("keepdim", keepdim);
        return Ok(());
    }
    match op {
        R::Softmax(Softmax { axis }) | R::LogSoftmax(LogSoftmax { axis }) => w.int("axis", axis),
        other => return Err(not_writable(crate::ops::OpRules::name(other))),
    }
    Ok(())
}
