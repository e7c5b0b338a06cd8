//! `tapegrad generate --load FILE`: samples text from a GPT checkpoint with a key/value cache and
//! streams it to stdout: the prompt, then `--tokens` new characters drawn with `--temperature` and
//! `--top-k` from a stream seeded by `--seed` (the same seed gives the same text).

use crate::engine_flags::by_dtype;
use crate::error::{CliError, CliResult};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::io::Write;
use std::path::PathBuf;
use tapegrad_nn::data::text::encode;
use tapegrad_nn::gpt::checkpoint::GptCheckpoint;
use tapegrad_nn::gpt::generate::{continue_prompt, Generator, Sampling};
use tapegrad_tensor::Scalar;

/// Arguments of `tapegrad generate`.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// The GPT checkpoint (from `tapegrad train gpt --save FILE`).
    #[arg(long)]
    pub load: PathBuf,
    /// Text to continue (default: a newline, or the vocabulary's first character).
    #[arg(long)]
    pub prompt: Option<String>,
    /// Characters to generate.
    #[arg(long, default_value_t = 500)]
    pub tokens: usize,
    /// Divides the logits before sampling: below 1 is more conservative, above 1 more varied.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub temperature: f64,
    /// Sample only among the K likeliest characters.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Seed of the sampling stream.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Threads for the kernels.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
}

/// Runs `tapegrad generate`.
pub fn run(args: GenerateArgs) -> CliResult {
    crate::engine_flags::set_threads(args.threads)?;
    let sampling = Sampling {
        temperature: args.temperature,
        top_k: args.top_k,
    };
    sampling
        .validate()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let ckpt = GptCheckpoint::read(&args.load)?;
    by_dtype!(ckpt.dtype, generate_typed(&args, &ckpt, sampling))
}

fn generate_typed<S: Scalar>(
    args: &GenerateArgs,
    ckpt: &GptCheckpoint,
    sampling: Sampling,
) -> CliResult {
    let vocab = &ckpt.vocab;
    let prompt = match &args.prompt {
        Some(p) if !p.is_empty() => p.clone(),
        _ if vocab.contains(&'\n') => "\n".to_string(),
        _ => vocab.first().map(|c| c.to_string()).unwrap_or_default(),
    };
    let ids = encode(vocab, &prompt).map_err(|(pos, c)| {
        CliError::Usage(format!(
            "--prompt: character {c:?} at position {pos} is not in the model's vocabulary of {} characters (from {})",
            vocab.len(),
            ckpt.path.display()
        ))
    })?;
    let model = ckpt.model::<S>()?;
    let mut gen = Generator::new(&model)?;
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let mut out = std::io::stdout().lock();
    let io = |e: std::io::Error| CliError::Io {
        path: "stdout".into(),
        source: e,
    };
    write!(out, "{prompt}").map_err(io)?;
    continue_prompt(&mut gen, &ids, args.tokens, sampling, &mut rng, |next| {
        if let Some(c) = vocab.get(next as usize) {
            write!(out, "{c}").map_err(io)?;
            out.flush().map_err(io)?;
        }
        Ok::<(), CliError>(())
    })?;
    writeln!(out).map_err(io)?;
    Ok(std::process::ExitCode::SUCCESS)
}
