//! The `tapegrad-graph/1` JSON format (reference: docs/graph-format.md): typed inputs with their
//! data, nodes with PyTorch op names and attributes, the output and an optional seed. Parsing
//! reports every malformed piece as an error naming the node; writing gives text that parses back
//! to an equal `GraphFile`.

mod attrs;
mod families;
mod numbers;
mod parse;
mod write;

pub use attrs::{AttrWriter, Attrs};
pub use families::{op_names, parse_op, write_attrs};
pub use numbers::{format_f32, format_f64, format_scalar};

use super::Graph;
use crate::Result;
use tapegrad_tensor::{DType, Scalar, Tensor};

/// The value of the `format` field this version reads and writes.
pub const FORMAT: &str = "tapegrad-graph/1";

/// A parsed graph file: the graph, the data of each input, the output slot and the seed.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphFile {
    pub dtype: DType,
    pub graph: Graph,
    /// Row-major data of each input, as written in the file.
    pub data: Vec<Vec<f64>>,
    /// The slot whose value is printed and seeded.
    pub output: usize,
    /// The seed's data (of the output's shape); `None` means ones.
    pub seed: Option<Vec<f64>>,
}

impl GraphFile {
    /// Parses a graph file from its text.
    pub fn parse(text: &str) -> Result<GraphFile> {
        parse::parse(text)
    }

    /// The file's text; parsing it gives back an equal `GraphFile`.
    pub fn to_json(&self) -> Result<String> {
        write::write(self)
    }

    /// The input values in `S`.
    pub fn inputs<S: Scalar>(&self) -> Result<Vec<Tensor<S>>> {
        self.graph
            .inputs()
            .iter()
            .zip(&self.data)
            .map(|(x, d)| {
                let values = d.iter().map(|&v| S::from_f64(v)).collect();
                Ok(Tensor::from_shape(x.shape.clone(), values)?)
            })
            .collect()
    }

    /// The seed in `S`: the file's, or ones of the output's shape.
    pub fn seed<S: Scalar>(&self) -> Result<Tensor<S>> {
        let shape = self.graph.shape(self.output)?.clone();
        match &self.seed {
            Some(d) => Ok(Tensor::from_shape(
                shape,
                d.iter().map(|&v| S::from_f64(v)).collect(),
            )?),
            None => Ok(Tensor::ones(&shape)),
        }
    }
}
