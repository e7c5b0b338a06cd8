//! Graph-file form of the neural-network family (conv, pooling, norms, ...). The family is being
//! written; when an op lands, list its PyTorch name in `OPS`, build it in `parse` from PyTorch's
//! argument names (`stride`, `padding`, `dilation`, `kernel_size` through `Attrs::usize_pair`;
//! `normalized_shape`, `eps`, ...) and write the same names back in `write`.

use super::super::attrs::{not_writable, AttrWriter, Attrs};
use crate::ops::{NnOp, Op, OpRules};
use tapegrad_tensor::Result;

pub(super) const OPS: &[&str] = &[];

pub(super) fn parse(name: &'static str, _args: usize, _a: &mut Attrs) -> Result<Op> {
    Err(not_writable(name))
}

pub(super) fn write(op: &NnOp, _w: &mut AttrWriter) -> Result<()> {
    Err(not_writable(op.name()))
}
