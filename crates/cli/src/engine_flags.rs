//! The flags that every command running a model shares, defined once: `--backend`, `--threads`
//! and `--dtype`, with the step from a run's element type to the typed function that runs it.

use crate::error::CliError;
use clap::ValueEnum;
use tapegrad_nn::BackendKind;
use tapegrad_tensor::DType;

/// Element types for `--dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DTypeArg {
    F32,
    F64,
}

impl DTypeArg {
    /// The element type it names.
    pub fn dtype(self) -> DType {
        match self {
            DTypeArg::F32 => DType::F32,
            DTypeArg::F64 => DType::F64,
        }
    }
}

/// Backends for `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    Eager,
    Compiled,
}

impl BackendArg {
    pub(crate) fn kind(self) -> BackendKind {
        match self {
            BackendArg::Eager => BackendKind::Eager,
            BackendArg::Compiled => BackendKind::Compiled,
        }
    }
}

/// `--backend` and `--threads`, for the commands that run a model through a backend.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct EngineFlags {
    /// eager (a tape per step) or compiled (a saved graph).
    #[arg(long, value_enum, default_value = "eager")]
    pub backend: BackendArg,
    /// Threads for the kernels (products, convolutions, element loops). The results are the same
    /// bits on any count; small models gain nothing (a split must pay for its hand-off).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
}

impl EngineFlags {
    /// Applies `--threads` for the rest of the process.
    pub(crate) fn apply(&self) -> Result<(), CliError> {
        set_threads(self.threads)
    }

    /// The backend `--backend` names.
    pub(crate) fn backend(&self) -> BackendKind {
        self.backend.kind()
    }
}

/// Applies `--threads` to every kernel (GEMM included) for the rest of the process.
pub(crate) fn set_threads(threads: usize) -> Result<(), CliError> {
    if threads == 0 {
        return Err(CliError::Usage("--threads must be at least 1".into()));
    }
    tapegrad_tensor::kernels::set_num_threads(threads);
    Ok(())
}

/// The error for a `--resume` that also gives settings the checkpoint fixes: `flags` pairs
/// whether each flag was given with its name, and `--dtype` must agree with the checkpoint's.
pub(crate) fn reject_settings_on_resume(
    path: &std::path::Path,
    flags: &[(bool, &str)],
    dtype: Option<DTypeArg>,
    saved: DType,
) -> Result<(), CliError> {
    let given: Vec<&str> = flags.iter().filter(|(g, _)| *g).map(|(_, n)| *n).collect();
    if !given.is_empty() {
        return Err(CliError::Usage(format!(
            "--resume continues the run saved in {} with its own settings; remove {}",
            path.display(),
            given.join(", ")
        )));
    }
    match dtype.map(DTypeArg::dtype) {
        Some(want) if want != saved => Err(CliError::Usage(format!(
            "--dtype {want} differs from the checkpoint's {saved}; resume keeps the checkpoint's dtype"
        ))),
        _ => Ok(()),
    }
}

/// Calls `function::<f32>(args)` or `function::<f64>(args)` as `dtype` (a [`DType`]) says.
macro_rules! by_dtype {
    ($dtype:expr, $function:ident($($arg:expr),* $(,)?)) => {
        match $dtype {
            tapegrad_tensor::DType::F32 => $function::<f32>($($arg),*),
            tapegrad_tensor::DType::F64 => $function::<f64>($($arg),*),
        }
    };
}
pub(crate) use by_dtype;
