//! `tapegrad grad` (not implemented yet).

use crate::error::{CliError, CliResult};

/// Arguments of `tapegrad grad`.
#[derive(Debug, clap::Args)]
pub struct GradArgs {}

/// Runs `tapegrad grad`.
pub fn run(_args: GradArgs) -> CliResult {
    Err(CliError::Other(
        "`tapegrad grad` is not implemented yet".into(),
    ))
}
