//! The op families of the graph-file format: each file lists its PyTorch op names, builds an `Op`
//! from a name and its attributes, and writes an op's attributes back. Adding a family is one file
//! here, one entry in `FAMILIES` and one arm in `write_attrs`.

mod activation;
mod elementwise;
mod linalg;
mod loss;
mod nn;
mod reduce;
mod structure;

use super::attrs::{AttrWriter, Attrs};
use crate::ops::Op;
use tapegrad_tensor::{Error, Result};

/// Builds an op from its file name, its argument count and its attributes.
type Parse = fn(name: &'static str, args: usize, attrs: &mut Attrs) -> Result<Op>;

/// One family: the op names it owns and how to build them.
struct Family {
    ops: &'static [&'static str],
    parse: Parse,
}

const FAMILIES: &[Family] = &[
    Family {
        ops: elementwise::OPS,
        parse: elementwise::parse,
    },
    Family {
        ops: activation::OPS,
        parse: activation::parse,
    },
    Family {
        ops: reduce::OPS,
        parse: reduce::parse,
    },
    Family {
        ops: linalg::OPS,
        parse: linalg::parse,
    },
    Family {
        ops: structure::OPS,
        parse: structure::parse,
    },
    Family {
        ops: loss::OPS,
        parse: loss::parse,
    },
    Family {
        ops: nn::OPS,
        parse: nn::parse,
    },
];

/// Every op name the file format knows.
pub fn op_names() -> impl Iterator<Item = &'static str> {
    FAMILIES.iter().flat_map(|f| f.ops.iter().copied())
}

/// The op called `name` with these attributes; unknown ops and attributes are errors.
pub fn parse_op(
    name: &str,
    args: usize,
    attrs: serde_json::Map<String, serde_json::Value>,
) -> Result<Op> {
    for family in FAMILIES {
        if let Some(&op) = family.ops.iter().find(|&&o| o == name) {
            let mut reader = Attrs::new(op, attrs);
            let built = (family.parse)(op, args, &mut reader)?;
            reader.finish()?;
            return Ok(built);
        }
    }
    Err(Error::invalid(
        "graph file",
        format!("unknown op '{name}' (ops use PyTorch's names, e.g. add, matmul, log_softmax)"),
    ))
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
