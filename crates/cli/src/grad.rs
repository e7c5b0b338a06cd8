//! `tapegrad grad FILE [--sweep executed|reference|saved] [--dtype f32|f64] [--detect-anomaly]`:
//! reads a graph file and prints one JSON object with the output's value and the gradient of every
//! input that requires grad. Numbers are printed in shortest round-trip form, so they read back
//! exactly. With `--detect-anomaly` the graph is lowered onto a tape in anomaly mode, so the first
//! NaN or infinity in forward or in the executed sweep is an error naming its graph node.

use crate::error::{CliError, CliResult};
use std::path::PathBuf;
use tapegrad_core::graph::file::format_scalar;
use tapegrad_core::graph::{GraphFile, Sweep};
use tapegrad_core::{DType, Scalar, Tape, Tensor};

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
    /// Stop at the first NaN or infinity made in forward or backward, naming the node, op, input
    /// shapes, element and value, and the masked-branch trap (a zero cotangent meeting an
    /// infinite local derivative) with its remedy. Watches the executed sweep's tape.
    #[arg(long)]
    pub detect_anomaly: bool,
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
    Ok(json(&result.output, &result.grads))
}

/// The printed object: the output and one gradient per named input.
fn json<S: Scalar>(output: &Tensor<S>, grads: &[(String, Tensor<S>)]) -> String {
    let grads: Vec<String> = grads
        .iter()
        .map(|(name, g)| {
            format!(
                "{}: {}",
                serde_json::Value::String(name.clone()),
                tensor_json(g)
            )
        })
        .collect();
    format!(
        "{{\"output\": {}, \"grads\": {{{}}}}}",
        tensor_json(output),
        grads.join(", ")
    )
}

/// `grad_json` for the executed sweep on a tape in anomaly mode: the graph is lowered node by node
/// (graph node k is tape id `inputs + k`, named as in the file), so the first non-finite value in
/// forward or backward is an `Error::Anomaly` that names its node.
pub fn grad_json_checked<S: Scalar>(file: &GraphFile) -> Result<String, CliError> {
    let inputs = file.inputs::<S>()?;
    let seed = file.seed::<S>()?;
    let graph = file.graph.truncated(file.output)?;
    let mut tape = Tape::<S>::with_capacity(graph.slots());
    tape.set_detect_anomaly(true);
    for (x, v) in graph.inputs().iter().zip(inputs) {
        tape.leaf_named(x.name.clone(), v, x.requires_grad);
    }
    for node in graph.nodes() {
        let id = tape
            .apply(node.op.clone(), &node.args)
            // A forward anomaly is found before the node is named on the tape: name it here, as
            // graph evaluation names the node of any error.
            .map_err(|e| e.at_node(format!("'{}' ({})", node.name, node.op.name())))?;
        tape.set_name(id, node.name.clone())?;
    }
    let all = tape.backward_all(file.output, &seed)?;
    let grads: Vec<(String, Tensor<S>)> = graph
        .inputs()
        .iter()
        .zip(all)
        .filter(|(x, _)| x.requires_grad)
        // +0 for every zero, as `Graph::gradients` prints them.
        .map(|(x, g)| (x.name.clone(), g.map(|v| v + S::ZERO)))
        .collect();
    Ok(json(tape.value(file.output)?, &grads))
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
    if args.detect_anomaly && sweep != Sweep::Executed {
        return Err(CliError::Usage(format!(
            "--detect-anomaly watches the executed sweep's tape; drop --sweep {} (the sweeps print the same gradients)",
            sweep.name()
        )));
    }
    let json = match (dtype, args.detect_anomaly) {
        (DType::F32, false) => grad_json::<f32>(&file, sweep)?,
        (DType::F64, false) => grad_json::<f64>(&file, sweep)?,
        (DType::F32, true) => grad_json_checked::<f32>(&file)?,
        (DType::F64, true) => grad_json_checked::<f64>(&file)?,
    };
    println!("{json}");
    Ok(std::process::ExitCode::SUCCESS)
}
