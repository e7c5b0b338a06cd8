//! `CliError`: what a subcommand can fail with, each variant carrying enough context (file, flag,
//! node) for the message alone to say what to fix.

/// A failed subcommand.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// An error from the engine (shapes, ops, graph nodes).
    #[error(transparent)]
    Engine(#[from] tapegrad_core::Error),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A flag value or combination that makes no sense.
    #[error("{0}")]
    Usage(String),
    /// Any other failure with a complete message.
    #[error("{0}")]
    Other(String),
}

impl From<tapegrad_core::OpError> for CliError {
    fn from(e: tapegrad_core::OpError) -> Self {
        CliError::Engine(e.into())
    }
}

/// Result of a subcommand: the exit code on success.
pub type CliResult = Result<std::process::ExitCode, CliError>;
