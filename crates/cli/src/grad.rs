//! `tapegrad grad FILE [--sweep executed|reference|saved] [--dtype f32|f64]`: reads a graph file
//! and prints one JSON object with the output's value and the gradient of every input that
//! requires grad. Numbers are printed in shortest round-trip form, so they read back exactly.

use crate::error::{CliError, CliResult};
use std::path::PathBuf;
use tapegrad_core::graph::file::format_scalar;
use tapegrad_core::graph::{GraphFile, Sweep};
use tapegrad_core::{DType, Scalar, Tensor};

/// Arguments of `tapegrad grad`.
#[derive(Debug, clap::Args)]
pub struct GradArgs {
    /// The graph file (format tapegrad-graph/1, see docs/graph-format.md).
    pub file: PathBuf,
    /// Which backward pass computes the gradients: executed (the eager tape), reference (backprop
    /// over the graph) or saved (the compiled graph). All three print the same gradients.
    #[arg(long, default_value = "executed", value_parser = ["executed", "reference", "saved"])]
    pub sweep: String,
    /// Compute in this precision instead of the file's dtype.
    #[arg(long, value_parser = ["f32", "f64"])]
    pub dtype: Option<String>,
}

/// Reads a graph file, naming the path in any error.
pub(crate) fn load(path: &PathBuf) -> Result<GraphFile, CliError> {
    let text = std::fs::read_to_string(path).map_err(|source| CliError::Io {
        path: path.display().to_string(),
        source,
    })?;
    GraphFile::parse(&text).map_err(|e| CliError::Other(format!("{}: {e}", path.display())))
}

/// `{"shape": [...], "data": [...]}` for a tensor.
fn tensor_json<S: Scalar>(t: &Tensor<S>) -> String {
    let dims: Vec<String> = t.dims().iter().map(|d| d.to_string()).collect();
    let data: Vec<String> = t.data().iter().map(|&v| format_scalar(v)).collect();
    format!(
        "{{\"shape\": [{}], \"data\": [{}]}}",
        dims.join(", "),
        data.join(", ")
    )
}

/// The JSON object `tapegrad grad` prints for `file`, computed in `S` by `sweep`.
pub fn grad_json<S: Scalar>(file: &GraphFile, sweep: Sweep) -> Result<String, CliError> {
    let inputs = file.inputs::<S>()?;
    let seed = file.seed::<S>()?;
    let result = file.graph.gradients(&inputs, file.output, &seed, sweep)?;
    let grads: Vec<String> = result
        .grads
        .iter()
        .map(|(name, g)| {
            format!(
                "{}: {}",
                serde_json::Value::String(name.clone()),
                tensor_json(g)
            )
        })
        .collect();
    Ok(format!(
        "{{\"output\": {}, \"grads\": {{{}}}}}",
        tensor_json(&result.output),
        grads.join(", ")
    ))
}

/// Runs `tapegrad grad`.
pub fn run(args: GradArgs) -> CliResult {
    let file = load(&args.file)?;
    let sweep = Sweep::parse(&args.sweep)
        .ok_or_else(|| CliError::Usage(format!("unknown sweep '{}'", args.sweep)))?;
    let dtype = match args.dtype.as_deref() {
        None => file.dtype,
        Some("f32") => DType::F32,
        Some("f64") => DType::F64,
        Some(other) => return Err(CliError::Usage(format!("unknown dtype '{other}'"))),
    };
    let json = match dtype {
        DType::F32 => grad_json::<f32>(&file, sweep)?,
        DType::F64 => grad_json::<f64>(&file, sweep)?,
    };
    println!("{json}");
    Ok(std::process::ExitCode::SUCCESS)
}
