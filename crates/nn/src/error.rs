//! `NnError`: what training, data loading and checkpoints can fail with. Engine errors (shapes,
//! ops) pass through unchanged; file and format errors name the file and what was wrong in it.

/// Result alias for the nn crate.
pub type NnResult<T> = std::result::Result<T, NnError>;

/// A failure in the nn layer.
#[derive(Debug, thiserror::Error)]
pub enum NnError {
    /// An error from the engine (shapes, ops, handles), boxed to keep results small.
    #[error(transparent)]
    Engine(Box<tapegrad_core::Error>),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A data table that cannot be used (bad number, unknown column, too few rows).
    #[error("{source_name}: {message}")]
    Data {
        source_name: String,
        message: String,
    },
    /// A checkpoint that is corrupted, truncated, or does not fit the model it is loaded into.
    #[error("checkpoint {path}: {message}")]
    Checkpoint { path: String, message: String },
    /// A configuration value or combination that makes no sense.
    #[error("{0}")]
    Config(String),
    /// A law `--verify-every` checks did not hold on a training step.
    #[error(transparent)]
    Verify(Box<crate::verify::VerifyFailure>),
}

impl From<tapegrad_core::Error> for NnError {
    fn from(e: tapegrad_core::Error) -> Self {
        NnError::Engine(Box::new(e))
    }
}

impl From<tapegrad_core::OpError> for NnError {
    fn from(e: tapegrad_core::OpError) -> Self {
        NnError::Engine(Box::new(e.into()))
    }
}

impl NnError {
    /// An I/O error on `path`.
    pub fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        NnError::Io {
            path: path.as_ref().display().to_string(),
            source,
        }
    }

    /// A data error in the table called `source_name`.
    pub fn data(source_name: impl Into<String>, message: impl Into<String>) -> Self {
        NnError::Data {
            source_name: source_name.into(),
            message: message.into(),
        }
    }

    /// A checkpoint error for the file at `path`.
    pub fn checkpoint(path: impl AsRef<std::path::Path>, message: impl Into<String>) -> Self {
        NnError::Checkpoint {
            path: path.as_ref().display().to_string(),
            message: message.into(),
        }
    }
}
