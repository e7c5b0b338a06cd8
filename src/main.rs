//! The `tapegrad` binary; everything lives in the `tapegrad-cli` crate.

mod heap;

fn main() -> std::process::ExitCode {
    heap::keep_freed_buffers();
    tapegrad_cli::main()
}
