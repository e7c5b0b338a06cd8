//! GPT checkpoints: the same safetensors format, atomic write and checksum as the tabular runs'
//! (`crate::checkpoint`), with preset `gpt`, the run's `GptConfig` and the character vocabulary in
//! the metadata, and the parameters under nanoGPT's names (`model.transformer.wte.weight`, ...)
//! beside the optimizer state. Reading checks the checksum, dtype, and every tensor's name and shape.

use super::run::{GptConfig, GptRun};
use crate::backend::Backend;
use crate::checkpoint::container::{to_json, Contents, Verified};
use crate::data::text::TextData;
use crate::error::{NnError, NnResult};
use crate::model::Model;
use crate::optim::Optimizer;
use safetensors::tensor::SafeTensors;
use std::path::{Path, PathBuf};
use tapegrad_tensor::{DType, Scalar};

/// The `preset` metadata value of GPT checkpoints.
pub const PRESET: &str = "gpt";

/// Whether the checkpoint file `bytes` was written by a GPT run (its metadata says preset `gpt`).
pub fn is_gpt(bytes: &[u8]) -> bool {
    SafeTensors::read_metadata(bytes)
        .ok()
        .and_then(|(_, m)| m.metadata().clone())
        .is_some_and(|m| m.get("preset").map(String::as_str) == Some(PRESET))
}

/// Saves `run` to `path` atomically.
pub fn save<S: Scalar>(path: impl AsRef<Path>, run: &GptRun<S>) -> NnResult<()> {
    let mut file = Contents::new(
        PRESET,
        run.step,
        run.config.seed,
        &run.model,
        &run.optimizer,
    );
    let vocab: String = run.data.vocab.iter().collect();
    file.meta.insert("config".into(), to_json(&run.config)?);
    file.meta.insert("vocab".into(), to_json(&vocab)?);
    file.write(path.as_ref())
}

/// A GPT checkpoint read from disk and checked for corruption.
pub struct GptCheckpoint {
    pub path: PathBuf,
    pub dtype: DType,
    /// Optimizer steps taken.
    pub step: u64,
    pub config: GptConfig,
    /// The character vocabulary the model was trained on.
    pub vocab: Vec<char>,
    file: Verified,
}

impl GptCheckpoint {
    /// Reads and verifies the file at `path`.
    pub fn read(path: impl AsRef<Path>) -> NnResult<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| NnError::io(path, e))?;
        Self::from_bytes(path, &bytes)
    }

    /// Verifies a GPT checkpoint's `bytes`; `path` only names the file in messages.
    pub fn from_bytes(path: impl AsRef<Path>, bytes: &[u8]) -> NnResult<Self> {
        let path = path.as_ref();
        let file = Verified::from_bytes(path, bytes, "tapegrad gpt checkpoint")?;
        if file.field("preset")? != PRESET {
            return Err(file.err(format!(
                "metadata says preset '{}', expected '{PRESET}' (not a GPT checkpoint)",
                file.field("preset")?
            )));
        }
        let config: GptConfig = file.json("config")?;
        let vocab: String = file.json("vocab")?;
        let vocab: Vec<char> = vocab.chars().collect();
        if config.model.outputs() != vocab.len() || !vocab.windows(2).all(|w| w[0] < w[1]) {
            return Err(file.err(format!(
                "the vocabulary ({} characters) must be sorted, distinct and match the model's {} outputs",
                vocab.len(),
                config.model.outputs()
            )));
        }
        config.context()?;
        Ok(GptCheckpoint {
            path: path.to_path_buf(),
            dtype: file.dtype,
            step: file.step,
            config,
            vocab,
            file,
        })
    }

    fn err(&self, message: String) -> NnError {
        self.file.err(message)
    }

    /// The model, built from the stored spec and filled with the stored tensors.
    pub fn model<S: Scalar>(&self) -> NnResult<Model<S>> {
        self.file.expect_dtype::<S>()?;
        self.file.model(&self.config.model, self.config.seed)
    }

    /// The optimizer state for `model`, as saved; every stored tensor must be accounted for.
    pub fn optimizer<S: Scalar>(&self, model: &Model<S>) -> NnResult<Optimizer<S>> {
        let optimizer = self.file.optimizer(self.config.optimizer, model)?;
        let slots = self.config.optimizer.slot_names();
        self.file.check_no_extra(model, slots, &[])?;
        Ok(optimizer)
    }

    /// The text this run trained on, reloaded and checked against the stored vocabulary.
    pub fn data(&self) -> NnResult<TextData> {
        let data = TextData::load(&self.config.text, self.config.context()?)?;
        if data.vocab != self.vocab {
            return Err(self.err(format!(
                "the text {} has a vocabulary of {} characters, not the {} this checkpoint was trained on",
                self.config.text.describe(),
                data.vocab.len(),
                self.vocab.len()
            )));
        }
        Ok(data)
    }

    /// A run that continues where this one stopped.
    pub fn resume<S: Scalar>(&self, backend: Box<dyn Backend<S>>) -> NnResult<GptRun<S>> {
        let model = self.model::<S>()?;
        let optimizer = self.optimizer(&model)?;
        GptRun::from_parts(
            self.config.clone(),
            model,
            optimizer,
            self.data()?,
            self.step,
            backend,
        )
    }
}
