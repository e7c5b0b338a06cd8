//! Graph-file form of linear algebra: matmul, linear (a bias exactly when it has three
//! arguments), transpose (`dim0`, `dim1`) and permute (`dims`).

use super::super::attrs::{not_writable, AttrWriter, Attrs};
use crate::ops::{LinalgOp as L, Op};
use tapegrad_tensor::Result;

pub(super) const OPS: &[&str] = &["matmul", "linear", "transpose", "permute"];

pub(super) fn parse(name: &'static str, args: usize, a: &mut Attrs) -> Result<Op> {
    let op = match name {
        "matmul" => L::Matmul,
        "linear" => L::Linear { bias: args == 3 },
        "transpose" => L::Transpose {
            dim0: a.isize_req("dim0")?,
            dim1: a.isize_req("dim1")?,
        },
        "permute" => L::Permute {
            dims: a.isizes_req("dims")?,
        },
        other => return Err(not_writable(other)),
    };
    Ok(Op::Linalg(op))
}

pub(super) fn write(op: &L, w: &mut AttrWriter) -> Result<()> {
    #[allow(unreachable_patterns)]
    match op {
        L::Matmul | L::Linear { .. } => {}
        L::Transpose { dim0, dim1 } => {
            w.int("dim0", dim0);
            w.int("dim1", dim1);
        }
        L::Permute { dims } => w.ints("dims", dims),
        other => return Err(not_writable(crate::ops::OpRules::name(other))),
    }
    Ok(())
}
