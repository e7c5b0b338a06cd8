//! The graph IR (docs/design.md section 4): typed inputs, SSA nodes over a context, evaluation,
//! JVP, reference backprop over the whole context, lowering to a tape, the saved (compiled) graph,
//! the `tapegrad-graph/1` file format, and text/DOT display.

mod backprop;
mod display;
pub mod dot;
mod eval;
pub mod file;
mod grads;
#[allow(clippy::module_inception)]
mod graph;
mod jvp;
mod lower;
mod recompute;
mod record;
mod saved;

pub use display::render_text;
pub use file::{GraphFile, FORMAT};
pub use grads::{Gradients, Sweep};
pub use graph::{Graph, GraphInput, GraphNode};
pub use saved::{distinct_bytes, tape_kept_bytes, CompiledGraph, SavedGraph};
