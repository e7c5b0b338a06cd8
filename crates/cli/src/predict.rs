//! `tapegrad predict` (not implemented yet).

use crate::error::{CliError, CliResult};

/// Arguments of `tapegrad predict`.
#[derive(Debug, clap::Args)]
pub struct PredictArgs {}

/// Runs `tapegrad predict`.
pub fn run(_args: PredictArgs) -> CliResult {
    Err(CliError::Other(
        "`tapegrad predict` is not implemented yet".into(),
    ))
}
