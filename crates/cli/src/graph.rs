//! `tapegrad graph` (not implemented yet).

use crate::error::{CliError, CliResult};

/// Arguments of `tapegrad graph`.
#[derive(Debug, clap::Args)]
pub struct GraphArgs {}

/// Runs `tapegrad graph`.
pub fn run(_args: GraphArgs) -> CliResult {
    Err(CliError::Other(
        "`tapegrad graph` is not implemented yet".into(),
    ))
}
