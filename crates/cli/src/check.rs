//! `tapegrad check` (not implemented yet).

use crate::error::{CliError, CliResult};

/// Arguments of `tapegrad check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {}

/// Runs `tapegrad check`.
pub fn run(_args: CheckArgs) -> CliResult {
    Err(CliError::Other(
        "`tapegrad check` is not implemented yet".into(),
    ))
}
