//! Graph-file form of linear algebra: matmul, linear (a bias exactly when it has three
//! arguments), transpose (`dim0`, `dim1`) and permute (`dims`).

use super::super::attrs::{not_writable, AttrWriter, Attrs};
use crate::ops::linalg::{Linear, Matmul, Permute, Transpose};
use crate::ops::{LinalgOp as L, Op, OpKind as K};
use crate::Result;

pub(super) fn parse(kind: K, args: usize, a: &mut Attrs) -> Result<Op> {
    let op = match kind {
        K::Matmul => L::Matmul(Matmul),
        K::Linear => L::Linear(Linear { bias: args == 3 }),
        K::Transpose => L::Transpose(Transpose {
            dim0: a.isize_req("dim0")?,
            dim1: a.isize_req("dim1")?,
        }),
        K::Permute => L::Permute(Permute {
            dims: a.isizes_req("dims")?,
        }),
        other => return Err(not_writable(other.label())),
    };
    Ok(Op::Linalg(op))
}

pub(super) fn write(op: &L, w: &mut AttrWriter) -> Result<()> {
    #[allow(unreachable_patterns)]
    match op {
        L::Matmul(Matmul) | L::Linear(Linear { .. }) => {}
        L::Transpose(Transpose { dim0, dim1 }) => {
            w.int("dim0", dim0);
            w.int("dim1", dim1);
        }
        L::Permute(Permute { dims }) => w.ints("dims", dims),
        other => return Err(not_writable(crate::ops::OpRules::name(other))),
    }
    Ok(())
}
