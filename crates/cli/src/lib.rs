//! The `tapegrad` command-line tool: argument parsing and dispatch to one module per subcommand.
//! Every subcommand returns a `CliError` instead of panicking; `main` prints it and exits non-zero.

// Deny rather than forbid: `distributed::node_window` (the `mpi` feature's shared-memory window)
// is the one module allowed to call into MPI's C interface.
#![deny(unsafe_code)]

pub mod bench;
pub mod check;
mod distributed;
pub mod engine_flags;
pub mod error;
pub mod eval;
pub mod generate;
pub mod grad;
pub mod graph;
pub mod predict;
mod run_output;
pub mod train;
pub mod train_gpt;

use clap::{Parser, Subcommand};
pub use error::CliError;

/// Reverse-mode automatic differentiation and neural-network training whose fast backward pass is
/// checked against a reference semantics.
#[derive(Debug, Parser)]
#[command(name = "tapegrad", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train a model on an embedded data set or your own CSV file.
    Train(train::TrainArgs),
    /// Run the laws (finite differences, adjointness, audit) on every op and print a table.
    Check(check::CheckArgs),
    /// Read a graph file, print its value and the gradients of its inputs as JSON.
    Grad(grad::GradArgs),
    /// Print a graph file as readable text or Graphviz DOT.
    Graph(graph::GraphArgs),
    /// Report a saved checkpoint's metric on the validation split.
    Eval(eval::EvalArgs),
    /// Write predictions of a saved checkpoint for a CSV file.
    Predict(predict::PredictArgs),
    /// Measure speed: MLP steps, tape overhead, matmul, conv.
    Bench(bench::BenchArgs),
    /// Sample text from a GPT checkpoint (streams to stdout).
    Generate(generate::GenerateArgs),
}

/// Parses the command line, runs the subcommand, and returns the process exit code.
pub fn main() -> std::process::ExitCode {
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train(a) => train::run(a),
        Command::Check(a) => check::run(a),
        Command::Grad(a) => grad::run(a),
        Command::Graph(a) => graph::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Predict(a) => predict::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Generate(a) => generate::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

/// A reader that stops early (`tapegrad train | head`) closes our stdout; Rust ignores SIGPIPE,
/// so the next `println!` panics. That is the reader's choice, not an error of ours: end quietly
/// with the status a shell gives a process killed by SIGPIPE (128 + 13), as other tools do.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info)
    }));
}
