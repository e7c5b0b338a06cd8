//! `tapegrad graph FILE [--dot]`: prints a graph file as readable text (one line per input and
//! node, with shapes, attributes and the output marked) or as Graphviz DOT.

use crate::error::CliResult;
use std::path::PathBuf;
use tapegrad_core::graph::{dot::to_dot, render_text};

/// Arguments of `tapegrad graph`.
#[derive(Debug, clap::Args)]
pub struct GraphArgs {
    /// The graph file (format tapegrad-graph/1, see docs/graph-format.md).
    pub file: PathBuf,
    /// Print Graphviz DOT instead of text (render with `dot -Tsvg`).
    #[arg(long)]
    pub dot: bool,
}

/// Runs `tapegrad graph`.
pub fn run(args: GraphArgs) -> CliResult {
    let file = crate::grad::load(&args.file)?;
    let text = if args.dot {
        to_dot(&file.graph, Some(file.output))
    } else {
        format!(
            "graph {} (dtype {}): {} inputs, {} nodes\n{}",
            args.file.display(),
            file.dtype,
            file.graph.inputs().len(),
            file.graph.nodes().len(),
            render_text(&file.graph, Some(file.output))
        )
    };
    print!("{text}");
    Ok(std::process::ExitCode::SUCCESS)
}
