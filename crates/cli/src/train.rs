//! `tapegrad train` (not implemented yet).

use crate::error::{CliError, CliResult};

/// Arguments of `tapegrad train`.
#[derive(Debug, clap::Args)]
pub struct TrainArgs {}

/// Runs `tapegrad train`.
pub fn run(_args: TrainArgs) -> CliResult {
    Err(CliError::Other(
        "`tapegrad train` is not implemented yet".into(),
    ))
}
