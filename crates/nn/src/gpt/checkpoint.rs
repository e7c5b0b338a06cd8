//! GPT checkpoints: the same safetensors format, atomic write and checksum as the tabular runs'
//! (`crate::checkpoint`), with preset `gpt`, the run's `GptConfig` and the character vocabulary in
//! the metadata, and the parameters under nanoGPT's names (`model.transformer.wte.weight`, ...)
//! beside the optimizer state. Reading checks the checksum, dtype, and every tensor's name and shape.

use super::run::{GptConfig, GptRun};
use crate::backend::Backend;
use crate::checkpoint::{
    canonical, checksum, decode, dtype_name, erased::Json, json_field, parse, read_container,
    st_dtype, to_stored, write_atomic, Stored, FORMAT, FORMAT_VERSION,
};
use crate::data::text::TextData;
use crate::error::{NnError, NnResult};
use crate::model::Model;
use crate::optim::Optimizer;
use crate::params::ParamKind;
use safetensors::tensor::SafeTensors;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tapegrad_tensor::{DType, Scalar, Shape, Tensor};

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
    let path = path.as_ref();
    let mut tensors = BTreeMap::new();
    for p in run.model.params.iter() {
        tensors.insert(format!("model.{}", p.name), to_stored(&p.value));
    }
    let names: Vec<&str> = run
        .model
        .params
        .trainable()
        .map(|p| p.name.as_str())
        .collect();
    for (slot, i, t) in run.optimizer.state_entries() {
        tensors.insert(format!("optim.{slot}.{}", names[i]), to_stored(t));
    }
    let vocab: String = run.data.vocab.iter().collect();
    let mut meta = BTreeMap::new();
    meta.insert("format".to_string(), FORMAT.to_string());
    meta.insert("format_version".into(), FORMAT_VERSION.to_string());
    meta.insert("preset".into(), PRESET.to_string());
    meta.insert("dtype".into(), S::DTYPE.name().to_string());
    meta.insert("step".into(), run.step.to_string());
    meta.insert("seed".into(), run.config.seed.to_string());
    meta.insert("optimizer_steps".into(), run.optimizer.steps().to_string());
    meta.insert("config".into(), run.config.to_json()?);
    meta.insert("vocab".into(), vocab.to_json()?);
    meta.insert("model".into(), run.model.describe());
    let sum = checksum(&tensors, &meta);
    meta.insert("checksum".into(), sum);
    let bytes = safetensors::serialize(
        tensors.iter().map(|(k, v)| (k.as_str(), v)),
        Some(meta.into_iter().collect()),
    )
    .map_err(|e| NnError::checkpoint(path, format!("cannot serialise: {e}")))?;
    write_atomic(
        path,
        &canonical(&bytes).map_err(|m| NnError::checkpoint(path, m))?,
    )
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
    tensors: BTreeMap<String, Stored>,
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
        let err = |m: String| NnError::checkpoint(path, m);
        let (meta, tensors) = read_container(path, bytes)?;
        let field = |k: &str| -> NnResult<&String> {
            meta.get(k).ok_or_else(|| {
                err(format!(
                    "metadata field '{k}' is missing (not a tapegrad gpt checkpoint?)"
                ))
            })
        };
        if field("format")? != FORMAT || field("preset")? != PRESET {
            return Err(err(format!(
                "metadata says format '{}', preset '{}'; expected '{FORMAT}', '{PRESET}'",
                field("format")?,
                field("preset")?
            )));
        }
        let version: u32 = parse(path, "format_version", field("format_version")?)?;
        if version != FORMAT_VERSION {
            return Err(err(format!(
                "format version {version} is not supported (this build reads version {FORMAT_VERSION})"
            )));
        }
        let stored_sum = field("checksum")?.clone();
        let mut rest: BTreeMap<String, String> = meta.clone().into_iter().collect();
        rest.remove("checksum");
        let actual = checksum(&tensors, &rest);
        if actual != stored_sum {
            return Err(err(format!(
                "checksum mismatch (file says {stored_sum}, contents give {actual}): the file is corrupted"
            )));
        }
        let dtype = match field("dtype")?.as_str() {
            "f32" => DType::F32,
            "f64" => DType::F64,
            other => return Err(err(format!("unknown dtype '{other}' in metadata"))),
        };
        let step: u64 = parse(path, "step", field("step")?)?;
        let optimizer_steps: u64 = parse(path, "optimizer_steps", field("optimizer_steps")?)?;
        if optimizer_steps != step {
            return Err(err(format!(
                "optimizer_steps {optimizer_steps} differs from step {step}"
            )));
        }
        let config: GptConfig = json_field(path, "config", field("config")?)?;
        let vocab: String = json_field(path, "vocab", field("vocab")?)?;
        let vocab: Vec<char> = vocab.chars().collect();
        if config.model.outputs() != vocab.len() || !vocab.windows(2).all(|w| w[0] < w[1]) {
            return Err(err(format!(
                "the vocabulary ({} characters) must be sorted, distinct and match the model's {} outputs",
                vocab.len(),
                config.model.outputs()
            )));
        }
        config.context()?;
        Ok(GptCheckpoint {
            path: path.to_path_buf(),
            dtype,
            step,
            config,
            vocab,
            tensors,
        })
    }

    fn err(&self, message: String) -> NnError {
        NnError::checkpoint(&self.path, message)
    }

    fn tensor<S: Scalar>(&self, name: &str, expected: &Shape) -> NnResult<Tensor<S>> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| self.err(format!("tensor '{name}' is missing")))?;
        if t.dtype != st_dtype(S::DTYPE) {
            return Err(self.err(format!(
                "tensor '{name}' has dtype {} but {} was expected",
                dtype_name(t.dtype),
                S::DTYPE
            )));
        }
        if t.shape != expected.dims() {
            return Err(self.err(format!(
                "tensor '{name}' has shape {:?} but the model expects {expected}",
                t.shape
            )));
        }
        Ok(Tensor::from_shape(expected.clone(), decode::<S>(&t.bytes))?)
    }

    /// The model, built from the stored spec and filled with the stored tensors.
    pub fn model<S: Scalar>(&self) -> NnResult<Model<S>> {
        if self.dtype != S::DTYPE {
            return Err(self.err(format!(
                "the checkpoint holds {} tensors but {} was requested",
                self.dtype,
                S::DTYPE
            )));
        }
        // The sizes are declared in the header: check them against the stored tensors before
        // allocating, so a hostile size is an error, not an out-of-memory.
        let stored = self
            .tensors
            .iter()
            .filter(|(name, _)| name.starts_with("model."))
            .try_fold(0usize, |n, (_, t)| {
                t.shape
                    .iter()
                    .try_fold(1usize, |m, &d| m.checked_mul(d))?
                    .checked_add(n)
            })
            .unwrap_or(usize::MAX);
        match self.config.model.min_params() {
            Some(needed) if needed <= stored => {}
            needed => {
                return Err(self.err(format!(
                    "the config's model {} needs {} parameters but the file stores {stored}",
                    self.config.model.name(),
                    needed.map_or("more than usize::MAX".to_string(), |n| n.to_string())
                )))
            }
        }
        let mut model = Model::<S>::new(&self.config.model, self.config.seed)?;
        for p in model.params.iter_mut() {
            p.value = self.tensor::<S>(&format!("model.{}", p.name), p.value.shape())?;
        }
        Ok(model)
    }

    /// The optimizer state for `model`, as saved.
    pub fn optimizer<S: Scalar>(&self, model: &Model<S>) -> NnResult<Optimizer<S>> {
        let mut opt = Optimizer::new(self.config.optimizer, &model.params)?;
        let required = opt.required_slots(self.step);
        let trainable: Vec<(String, Shape)> = model
            .params
            .iter()
            .filter(|p| p.kind == ParamKind::Trainable)
            .map(|p| (p.name.clone(), p.value.shape().clone()))
            .collect();
        let mut loaded = BTreeMap::new();
        for slot in opt.config().slot_names() {
            for (i, (name, shape)) in trainable.iter().enumerate() {
                let key = format!("optim.{slot}.{name}");
                if required.contains(slot) {
                    loaded.insert((*slot, i), self.tensor::<S>(&key, shape)?);
                }
            }
        }
        opt.restore(self.step, |slot, i| loaded.remove(&(slot, i)));
        self.check_no_extra(model)?;
        Ok(opt)
    }

    fn check_no_extra<S: Scalar>(&self, model: &Model<S>) -> NnResult<()> {
        let slots = self.config.optimizer.slot_names();
        for name in self.tensors.keys() {
            let known = if let Some(p) = name.strip_prefix("model.") {
                model.params.find(p).is_some()
            } else if let Some(rest) = name.strip_prefix("optim.") {
                slots.iter().any(|slot| {
                    rest.strip_prefix(slot)
                        .and_then(|r| r.strip_prefix('.'))
                        .is_some_and(|p| model.params.find(p).is_some())
                })
            } else {
                false
            };
            if !known {
                return Err(self.err(format!(
                    "tensor '{name}' does not belong to the model {}",
                    model.spec.name()
                )));
            }
        }
        Ok(())
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
