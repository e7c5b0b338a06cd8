//! Graph-file form of the structural ops: `shape` for reshape and broadcast_to, `start_dim` and
//! `end_dim` for flatten, `axis` for concat, `axis`/`start`/`end`/`step` for slice.

use super::super::attrs::{not_writable, AttrWriter, Attrs};
use crate::ops::structure::{BroadcastTo, Concat, Flatten, Reshape, Slice};
use crate::ops::{Op, OpKind as K, StructureOp as St};
use crate::Result;

pub(super) fn parse(kind: K, _args: usize, a: &mut Attrs) -> Result<Op> {
    let op = match kind {
        K::Reshape => St::Reshape(Reshape {
            shape: a.isizes_req("shape")?,
        }),
        K::Flatten => St::Flatten(Flatten {
            start_dim: a.isize_or("start_dim", 0)?,
            end_dim: a.isize_or("end_dim", -1)?,
        }),
        K::BroadcastTo => St::BroadcastTo(BroadcastTo {
            shape: a.usizes_req("shape")?,
        }),
        K::Concat => St::Concat(Concat {
            axis: a.isize_or("axis", 0)?,
        }),
        K::Slice => St::Slice(Slice {
            axis: a.isize_req("axis")?,
            start: a.isize_req("start")?,
            end: a.isize_req("end")?,
            step: a.usize("step")?.unwrap_or(1),
        }),
        other => return Err(not_writable(other.label())),
    };
    Ok(Op::Structure(op))
}

pub(super) fn write(op: &St, w: &mut AttrWriter) -> Result<()> {
    #[allow(unreachable_patterns)]
    match op {
        St::Reshape(Reshape { shape }) => w.ints("shape", shape),
        St::Flatten(Flatten { start_dim, end_dim }) => {
            w.int("start_dim", start_dim);
            w.int("end_dim", end_dim);
        }
        St::BroadcastTo(BroadcastTo { shape }) => w.ints("shape", shape),
        St::Concat(Concat { axis }) => w.int("axis", axis),
        St::Slice(Slice {
            axis,
            start,
            end,
            step,
        }) => {
            w.int("axis", axis);
            w.int("start", start);
            w.int("end", end);
            w.int("step", step);
        }
        other => return Err(not_writable(crate::ops::OpRules::name(other))),
    }
    Ok(())
}
