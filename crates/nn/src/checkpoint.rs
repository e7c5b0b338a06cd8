//! Checkpoints: a run's parameters, buffers, optimizer state and data statistics in one
//! safetensors file, with a metadata header (format version, preset, dtype, step, seed, the run's
//! config, the data-order position and a checksum of everything). Files are written atomically
//! (temporary file in the same folder, fsync, rename, fsync of the folder), so a failed save
//! leaves the previous file intact. Reading checks the checksum, the format, the dtype, and every
//! tensor's name and shape against the model, and says which one differs.

use crate::backend::Backend;
use crate::data::{BatchOrder, Prepared, Standardizer, Task};
use crate::error::{NnError, NnResult};
use crate::model::Model;
use crate::optim::Optimizer;
use crate::params::ParamKind;
use crate::trainer::{TrainConfig, Trainer};
use safetensors::tensor::{Dtype, SafeTensors, View};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use tapegrad_tensor::{DType, Scalar, Shape, Tensor};

/// The `format` metadata value.
pub const FORMAT: &str = "tapegrad-checkpoint";
/// The version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// The metadata of a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    pub format_version: u32,
    pub preset: String,
    pub dtype: DType,
    /// Optimizer steps taken.
    pub step: u64,
    pub seed: u64,
    pub config: TrainConfig,
    /// Data-order position: completed epochs and the cursor in the current epoch's shuffle.
    pub epoch: u64,
    pub cursor: usize,
    pub task: Task,
    pub feature_names: Vec<String>,
    /// The layer stack, for people reading the file.
    pub model: String,
}

pub(crate) struct Stored {
    pub(crate) dtype: Dtype,
    pub(crate) shape: Vec<usize>,
    pub(crate) bytes: Vec<u8>,
}

impl View for &Stored {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

pub(crate) fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
    }
}

pub(crate) fn dtype_name(d: Dtype) -> String {
    match d {
        Dtype::F32 => "f32".into(),
        Dtype::F64 => "f64".into(),
        other => format!("{other:?}").to_lowercase(),
    }
}

pub(crate) fn to_stored<S: Scalar>(t: &Tensor<S>) -> Stored {
    let bytes = match S::DTYPE {
        DType::F32 => t
            .data()
            .iter()
            .flat_map(|v| (v.to_f64() as f32).to_le_bytes())
            .collect(),
        DType::F64 => t
            .data()
            .iter()
            .flat_map(|v| v.to_f64().to_le_bytes())
            .collect(),
    };
    Stored {
        dtype: st_dtype(S::DTYPE),
        shape: t.dims().to_vec(),
        bytes,
    }
}

fn f64_stored(values: &[f64]) -> Stored {
    Stored {
        dtype: Dtype::F64,
        shape: vec![values.len()],
        bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// FNV-1a, 64 bits: a corruption check, not a cryptographic hash.
fn fnv1a(hash: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *hash ^= u64::from(b);
        *hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
}

pub(crate) fn checksum(
    tensors: &BTreeMap<String, Stored>,
    meta: &BTreeMap<String, String>,
) -> String {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for (k, v) in meta {
        fnv1a(&mut h, k.as_bytes());
        fnv1a(&mut h, &[0]);
        fnv1a(&mut h, v.as_bytes());
        fnv1a(&mut h, &[0]);
    }
    for (name, t) in tensors {
        fnv1a(&mut h, name.as_bytes());
        fnv1a(&mut h, dtype_name(t.dtype).as_bytes());
        for d in &t.shape {
            fnv1a(&mut h, &(*d as u64).to_le_bytes());
        }
        fnv1a(&mut h, &t.bytes);
    }
    format!("{h:016x}")
}

/// Saves `trainer` to `path` atomically.
pub fn save<S: Scalar>(path: impl AsRef<Path>, trainer: &Trainer<S>) -> NnResult<()> {
    let path = path.as_ref();
    let mut tensors = BTreeMap::new();
    for p in trainer.model.params.iter() {
        tensors.insert(format!("model.{}", p.name), to_stored(&p.value));
    }
    let names: Vec<&str> = trainer
        .model
        .params
        .trainable()
        .map(|p| p.name.as_str())
        .collect();
    for (slot, i, t) in trainer.optimizer.state_entries() {
        tensors.insert(format!("optim.{slot}.{}", names[i]), to_stored(t));
    }
    tensors.insert(
        "data.feature_mean".into(),
        f64_stored(&trainer.data.features.mean),
    );
    tensors.insert(
        "data.feature_std".into(),
        f64_stored(&trainer.data.features.std),
    );
    if let Some(t) = &trainer.data.target {
        tensors.insert("data.target_mean".into(), f64_stored(&t.mean));
        tensors.insert("data.target_std".into(), f64_stored(&t.std));
    }
    let json = |v: &dyn erased::Json| v.to_json();
    let mut meta = BTreeMap::new();
    meta.insert("format".to_string(), FORMAT.to_string());
    meta.insert("format_version".into(), FORMAT_VERSION.to_string());
    meta.insert("preset".into(), trainer.config.preset.clone());
    meta.insert("dtype".into(), S::DTYPE.name().to_string());
    meta.insert("step".into(), trainer.step.to_string());
    meta.insert("seed".into(), trainer.config.seed.to_string());
    meta.insert("epoch".into(), trainer.order.epoch().to_string());
    meta.insert("cursor".into(), trainer.order.cursor().to_string());
    meta.insert(
        "optimizer_steps".into(),
        trainer.optimizer.steps().to_string(),
    );
    meta.insert("config".into(), json(&trainer.config)?);
    meta.insert("task".into(), json(&trainer.data.task)?);
    meta.insert("features".into(), json(&trainer.data.feature_names)?);
    meta.insert("model".into(), trainer.model.describe());
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

/// The same safetensors file with its JSON header's keys sorted, so that equal states give
/// byte-identical files (safetensors writes the metadata map in hash order). The header stays
/// padded with spaces to a multiple of 8 bytes, as the format asks.
pub(crate) fn canonical(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let n = u64::from_le_bytes(bytes[..8].try_into().map_err(|_| "short buffer")?) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n])
        .map_err(|e| format!("cannot reorder the header: {e}"))?;
    // serde_json's map is a BTreeMap (no `preserve_order`), so this prints keys sorted.
    let mut text =
        serde_json::to_vec(&header).map_err(|e| format!("cannot reorder the header: {e}"))?;
    while text.len() % 8 != 0 {
        text.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + text.len() + bytes.len() - 8 - n);
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    Ok(out)
}

/// Writes `bytes` to `path` through a temporary file in the same folder, fsynced and renamed,
/// then fsyncs the folder so the rename itself is durable.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> NnResult<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| NnError::checkpoint(path, "the path names no file"))?
        .to_string_lossy()
        .into_owned();
    let tmp = dir.join(format!(".{file_name}.tmp"));
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        Ok(())
    })();
    if let Err(e) = result {
        if tmp.is_file() {
            let _ = std::fs::remove_file(&tmp);
        }
        return Err(NnError::checkpoint(
            path,
            format!("cannot write the temporary file {}: {e}", tmp.display()),
        ));
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(NnError::checkpoint(
            path,
            format!("cannot replace the file: {e}"),
        ));
    }
    #[cfg(unix)]
    if let Ok(d) = std::fs::File::open(&dir) {
        // Some file systems refuse to fsync a directory; the data itself is already durable.
        let _ = d.sync_all();
    }
    Ok(())
}

/// A checkpoint read from disk and checked for corruption.
pub struct Checkpoint {
    pub path: PathBuf,
    pub header: Header,
    tensors: BTreeMap<String, Stored>,
}

impl Checkpoint {
    /// Reads and verifies the file at `path` (never modifies it).
    pub fn read(path: impl AsRef<Path>) -> NnResult<Checkpoint> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| NnError::io(path, e))?;
        Checkpoint::from_bytes(path, &bytes)
    }

    /// Verifies a checkpoint's `bytes` as `read` does; `path` only names the file in messages.
    pub fn from_bytes(path: impl AsRef<Path>, bytes: &[u8]) -> NnResult<Checkpoint> {
        let path = path.as_ref();
        let err = |m: String| NnError::checkpoint(path, m);
        let (meta, tensors) = read_container(path, bytes)?;
        let field = |k: &str| -> NnResult<&String> {
            meta.get(k).ok_or_else(|| {
                err(format!(
                    "metadata field '{k}' is missing (not a tapegrad checkpoint?)"
                ))
            })
        };
        if field("format")? != FORMAT {
            return Err(err(format!(
                "metadata says format '{}', expected '{FORMAT}'",
                field("format")?
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
        let header = Header {
            format_version: version,
            preset: field("preset")?.clone(),
            dtype,
            step: parse(path, "step", field("step")?)?,
            seed: parse(path, "seed", field("seed")?)?,
            config: json_field(path, "config", field("config")?)?,
            epoch: parse(path, "epoch", field("epoch")?)?,
            cursor: parse(path, "cursor", field("cursor")?)?,
            task: json_field(path, "task", field("task")?)?,
            feature_names: json_field(path, "features", field("features")?)?,
            model: field("model")?.clone(),
        };
        // Readers size their outputs by the task and their inputs by the feature names: both
        // must agree with the model the config describes (`predict` indexes rows by them).
        let (outputs, inputs) = (header.config.model.outputs(), header.config.model.inputs());
        if header.task.outputs() != outputs || header.feature_names.len() != inputs {
            return Err(err(format!(
                "the task has {} outputs and {} feature names, but the model {} has {outputs} outputs and {inputs} inputs",
                header.task.outputs(),
                header.feature_names.len(),
                header.config.model.name()
            )));
        }
        let optimizer_steps: u64 = parse(path, "optimizer_steps", field("optimizer_steps")?)?;
        if optimizer_steps != header.step {
            return Err(err(format!(
                "optimizer_steps {optimizer_steps} differs from step {}",
                header.step
            )));
        }
        Ok(Checkpoint {
            path: path.to_path_buf(),
            header,
            tensors,
        })
    }

    fn err(&self, message: String) -> NnError {
        NnError::checkpoint(&self.path, message)
    }

    /// The stored tensor `name` as a `Tensor<S>` of the expected shape; says what differs.
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

    fn f64_vec(&self, name: &str, len: usize) -> NnResult<Vec<f64>> {
        let shape = Shape::new(vec![len])?;
        Ok(self.tensor::<f64>(name, &shape)?.into_vec())
    }

    /// The model, built from the stored spec and filled with the stored tensors.
    pub fn model<S: Scalar>(&self) -> NnResult<Model<S>> {
        if self.header.dtype != S::DTYPE {
            return Err(self.err(format!(
                "the checkpoint holds {} tensors but {} was requested",
                self.header.dtype,
                S::DTYPE
            )));
        }
        self.model_from(&self.header.config)
    }

    /// Fills a model built from `config` with the stored tensors, checking names and shapes.
    pub fn model_from<S: Scalar>(&self, config: &TrainConfig) -> NnResult<Model<S>> {
        // The layer sizes are declared in the header: check them against the stored tensors
        // before allocating, so a corrupt or hostile size is an error, not an out-of-memory.
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
        // A model up to this size is cheap to build, and building it lets the tensor-by-tensor
        // check below name the first differing tensor and both shapes; only a larger declared
        // model than the file can fill is refused unbuilt.
        const HARMLESS_PARAMS: usize = 1 << 24;
        match config.model.min_params() {
            Some(needed) if needed <= stored.max(HARMLESS_PARAMS) => {}
            needed => {
                return Err(self.err(format!(
                    "the config's model {} needs {} parameters but the file stores {stored}",
                    config.model.name(),
                    needed.map_or("more than usize::MAX".to_string(), |n| n.to_string())
                )))
            }
        }
        let mut model = Model::<S>::new(&config.model, config.seed)?;
        for p in model.params.iter_mut() {
            p.value = self.tensor::<S>(&format!("model.{}", p.name), p.value.shape())?;
        }
        Ok(model)
    }

    /// The optimizer state for `model`, as saved.
    pub fn optimizer<S: Scalar>(&self, model: &Model<S>) -> NnResult<Optimizer<S>> {
        let mut opt = Optimizer::new(self.header.config.optimizer, &model.params)?;
        let required = opt.required_slots(self.header.step);
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
                } else if self.tensors.contains_key(&key) {
                    return Err(self.err(format!(
                        "tensor '{key}' is present but a {} optimizer has no such state after {} steps",
                        opt.config().name(),
                        self.header.step
                    )));
                }
            }
        }
        opt.restore(self.header.step, |slot, i| loaded.remove(&(slot, i)));
        Ok(opt)
    }

    /// The feature statistics and, for regression, the target statistics.
    pub fn standardizers(&self) -> NnResult<(Standardizer, Option<Standardizer>)> {
        let width = self.header.feature_names.len();
        let features = Standardizer {
            mean: self.f64_vec("data.feature_mean", width)?,
            std: self.f64_vec("data.feature_std", width)?,
        };
        let target = match self.header.task {
            Task::Regression => Some(Standardizer {
                mean: self.f64_vec("data.target_mean", 1)?,
                std: self.f64_vec("data.target_std", 1)?,
            }),
            Task::Classification { .. } => None,
        };
        Ok((features, target))
    }

    /// Rejects tensors the model, optimizer and data statistics do not account for.
    fn check_no_extra<S: Scalar>(&self, model: &Model<S>) -> NnResult<()> {
        for name in self.tensors.keys() {
            let known = if let Some(p) = name.strip_prefix("model.") {
                model.params.find(p).is_some()
            } else if let Some(rest) = name.strip_prefix("optim.") {
                // Present optimizer slots were checked by `optimizer`; any other name is foreign.
                self.header
                    .config
                    .optimizer
                    .slot_names()
                    .iter()
                    .any(|slot| {
                        rest.strip_prefix(slot)
                            .and_then(|r| r.strip_prefix('.'))
                            .is_some_and(|p| model.params.find(p).is_some())
                    })
            } else {
                matches!(
                    name.as_str(),
                    "data.feature_mean"
                        | "data.feature_std"
                        | "data.target_mean"
                        | "data.target_std"
                )
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

    /// A trainer that continues this run where it stopped: same data (reloaded and checked against
    /// the stored statistics), parameters, optimizer state and data-order position.
    pub fn resume<S: Scalar>(&self, backend: Box<dyn Backend<S>>) -> NnResult<Trainer<S>> {
        let model = self.model::<S>()?;
        let optimizer = self.optimizer(&model)?;
        self.check_no_extra(&model)?;
        let config = self.header.config.clone();
        let data = Prepared::<S>::new(&config.data.load()?, config.val_fraction, config.seed)?;
        let (features, target) = self.standardizers()?;
        if data.features != features
            || data.target != target
            || data.feature_names != self.header.feature_names
        {
            return Err(self.err(format!(
                "the data from {} differs from the data this checkpoint was trained on (feature columns or statistics changed)",
                config.data.describe()
            )));
        }
        let order = BatchOrder::at(
            data.train.len(),
            config.batch_size,
            config.seed,
            self.header.epoch,
            self.header.cursor,
        )?;
        Trainer::from_parts(
            config,
            model,
            optimizer,
            data,
            order,
            self.header.step,
            backend,
        )
    }

    /// The model for evaluation or prediction, with every stored tensor checked.
    pub fn inference_model<S: Scalar>(&self) -> NnResult<Model<S>> {
        let model = self.model::<S>()?;
        self.optimizer(&model)?;
        self.check_no_extra(&model)?;
        Ok(model)
    }
}

pub(crate) fn decode<S: Scalar>(bytes: &[u8]) -> Vec<S> {
    match S::DTYPE {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| S::from_f64(f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64))
            .collect(),
        DType::F64 => bytes
            .chunks_exact(8)
            .map(|c| {
                S::from_f64(f64::from_le_bytes([
                    c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7],
                ]))
            })
            .collect(),
    }
}

pub(crate) fn parse<T: std::str::FromStr>(path: &Path, key: &str, v: &str) -> NnResult<T> {
    v.parse().map_err(|_| {
        NnError::checkpoint(path, format!("metadata field '{key}' is not valid: '{v}'"))
    })
}

pub(crate) fn json_field<T: serde::de::DeserializeOwned>(
    path: &Path,
    key: &str,
    v: &str,
) -> NnResult<T> {
    serde_json::from_str(v)
        .map_err(|e| NnError::checkpoint(path, format!("metadata field '{key}' is not valid: {e}")))
}

pub(crate) mod erased {
    //! Serialises any serde value to a JSON string for the metadata header.
    use crate::error::{NnError, NnResult};

    pub trait Json {
        fn to_json(&self) -> NnResult<String>;
    }

    impl<T: serde::Serialize> Json for T {
        fn to_json(&self) -> NnResult<String> {
            serde_json::to_string(self)
                .map_err(|e| NnError::Config(format!("cannot serialise metadata: {e}")))
        }
    }
}

/// A safetensors file's tapegrad metadata and its tensors, as stored; `path` only names the file
/// in messages. Shared by every checkpoint kind, which then reads its own fields.
pub(crate) fn read_container(
    path: &Path,
    bytes: &[u8],
) -> NnResult<(HashMap<String, String>, BTreeMap<String, Stored>)> {
    let err = |m: String| NnError::checkpoint(path, m);
    let st = SafeTensors::deserialize(bytes).map_err(|e| {
        err(format!(
            "not a readable safetensors file ({} bytes; truncated or corrupted?): {e}",
            bytes.len()
        ))
    })?;
    let (_, metadata) =
        SafeTensors::read_metadata(bytes).map_err(|e| err(format!("unreadable header: {e}")))?;
    let meta: HashMap<String, String> = metadata.metadata().clone().ok_or_else(|| {
        err("the file has no tapegrad metadata (not a tapegrad checkpoint?)".into())
    })?;
    let mut tensors = BTreeMap::new();
    for (name, view) in st.iter() {
        tensors.insert(
            name.to_string(),
            Stored {
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                bytes: view.data().to_vec(),
            },
        );
    }
    Ok((meta, tensors))
}
