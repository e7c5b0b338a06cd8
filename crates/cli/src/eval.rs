//! `tapegrad eval` (not implemented yet).

use crate::error::{CliError, CliResult};

/// Arguments of `tapegrad eval`.
#[derive(Debug, clap::Args)]
pub struct EvalArgs {}

/// Runs `tapegrad eval`.
pub fn run(_args: EvalArgs) -> CliResult {
    Err(CliError::Other(
        "`tapegrad eval` is not implemented yet".into(),
    ))
}
