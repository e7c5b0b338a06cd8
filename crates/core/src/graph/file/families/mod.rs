//! The op families of the graph-file format: each file builds an `Op` of its family from a kind
//! of the list of ops (`ops/list.rs`, whose labels are the file's op names) and its attributes, and
//! writes an op's attributes back. Adding a family is one file here and one arm in `parse_op` and
//! in `write_attrs`.

mod activation;
mod elementwise;
mod linalg;
mod loss;
mod nn;
mod reduce;
mod structure;

use super::attrs::{AttrWriter, Attrs};
use crate::ops::{Op, OpFamily, OpKind};
use crate::{Error, Result};

/// Every op name the file format knows: the labels of the list of ops, each once.
pub fn op_names() -> impl Iterator<Item = &'static str> {
    OpKind::ALL
        .iter()
        .enumerate()
        .filter(|&(i, k)| OpKind::ALL[..i].iter().all(|e| e.label() != k.label()))
        .map(|(_, k)| k.label())
}

/// The op called `name` with these attributes; unknown ops and attributes are errors.
pub fn parse_op(
    name: &str,
    args: usize,
    attrs: serde_json::Map<String, serde_json::Value>,
) -> Result<Op> {
    let Some(&kind) = OpKind::ALL.iter().find(|k| k.label() == name) else {
        return Err(Error::invalid(
            "graph file",
            format!("unknown op '{name}' (ops use PyTorch's names, e.g. add, matmul, log_softmax)"),
        ));
    };
    let mut reader = Attrs::new(kind.label(), attrs);
    let built = match kind.family() {
        OpFamily::Elementwise => elementwise::parse(kind, args, &mut reader)?,
        OpFamily::Activation => activation::parse(kind, args, &mut reader)?,
        OpFamily::Reduce => reduce::parse(kind, args, &mut reader)?,
        OpFamily::Linalg => linalg::parse(kind, args, &mut reader)?,
        OpFamily::Structure => structure::parse(kind, args, &mut reader)?,
        OpFamily::Loss => loss::parse(kind, args, &mut reader)?,
        OpFamily::Nn => nn::parse(kind, args, &mut reader)?,
    };
    reader.finish()?;
    Ok(built)
}

/// The attributes of `op` as `(name, JSON text)` pairs.
pub fn write_attrs(op: &Op) -> Result<Vec<(&'static str, String)>> {
    let mut w = AttrWriter::default();
    match op {
        Op::Elementwise(o) => elementwise::write(o, &mut w)?,
        Op::Activation(o) => activation::write(o, &mut w)?,
        Op::Reduce(o) => reduce::write(o, &mut w)?,
        Op::Linalg(o) => linalg::write(o, &mut w)?,
        Op::Structure(o) => structure::write(o, &mut w)?,
        Op::Loss(o) => loss::write(o, &mut w)?,
        Op::Nn(o) => nn::write(o, &mut w)?,
    }
    Ok(w.entries)
}
