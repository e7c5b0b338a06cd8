//! `tapegrad bench` (not implemented yet).

use crate::error::{CliError, CliResult};

/// Arguments of `tapegrad bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {}

/// Runs `tapegrad bench`.
pub fn run(_args: BenchArgs) -> CliResult {
    Err(CliError::Other(
        "`tapegrad bench` is not implemented yet".into(),
    ))
}
