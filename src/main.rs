//! The `tapegrad` binary; everything lives in the `tapegrad-cli` crate.

fn main() -> std::process::ExitCode {
    tapegrad_cli::main()
}
