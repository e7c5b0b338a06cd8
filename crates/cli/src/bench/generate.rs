//! The `generate` workload of `tapegrad bench`: `--tokens` characters sampled from a one-character
//! prompt by the `train gpt` preset's model through the loop `tapegrad generate` runs (key/value
//! cache, temperature 1, no top-k, a fixed seed), timed as whole runs.

use super::{ensure_memory, report, time_it, BenchArgs, Report, Stats};
use crate::error::CliError;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tapegrad_nn::data::text::{TextData, TextSource};
use tapegrad_nn::gpt::generate::{continue_prompt, Generator, Sampling};
use tapegrad_nn::Model;

/// Times `tokens` characters of sampling at `[context, layers, embd, heads]`, f32. The weights
/// are the preset's seeded initial ones: the work per token does not depend on their values, and
/// the same seed draws the same characters in every repetition.
pub(super) fn generate(
    args: &BenchArgs,
    backend: &str,
    tokens: usize,
    sizes: [usize; 4],
) -> Result<Report, CliError> {
    let [context, layers, embd, heads] = sizes;
    if tokens == 0 || sizes.contains(&0) {
        return Err(CliError::Usage(
            "--tokens, --context, --layers, --embd and --heads must be at least 1".into(),
        ));
    }
    let data = TextData::load(&TextSource::Shakespeare, context)?;
    let spec = super::preset_gpt(data.vocab.len(), sizes);
    // The model's weights, the generator's copy of them, and the cached keys and values.
    let weights = spec
        .gpt_shape()
        .and_then(|s| s.params())
        .map_or(f64::INFINITY, |n| n as f64);
    let cache = 2.0 * (layers * embd) as f64 * context as f64;
    ensure_memory("--layers/--embd/--context", 4.0 * (2.0 * weights + cache))?;
    let model = Model::<f32>::new(&spec, 0)?;
    let mut gen = Generator::new(&model)?;
    let sampling = Sampling {
        temperature: 1.0,
        top_k: None,
    };
    // A newline starts the text, as `tapegrad generate`'s default prompt.
    let prompt = [data.vocab.iter().position(|&c| c == '\n').unwrap_or(0) as u32];
    let secs = time_it(args.reps, || {
        gen.clear();
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        continue_prompt(&mut gen, &prompt, tokens, sampling, &mut rng, |id| {
            std::hint::black_box(id);
            Ok::<(), CliError>(())
        })
    })?;
    let per_token = Stats::of(secs.iter().map(|s| s * 1e3 / tokens as f64).collect());
    let tokens_per_s = 1e3 / per_token.median;
    let mut fields = serde_json::json!({
        "workload": "generate", "tokens": tokens, "context": context, "layers": layers,
        "embd": embd, "heads": heads,
    });
    if let serde_json::Value::Object(m) = &mut fields {
        per_token.json("ms_per_step", "ms", m);
        m.insert("tokens_per_s".into(), tokens_per_s.into());
        m.insert(
            "ms_per_run".into(),
            (per_token.median * tokens as f64).into(),
        );
    }
    Ok(report(
        format!("generate {tokens} gpt {layers}x{embd} heads {heads} context {context}"),
        fields,
        format!(
            "{}, {tokens_per_s:.0} tokens/s",
            per_token.text("ms/token", 4)
        ),
        args,
        backend,
    ))
}
