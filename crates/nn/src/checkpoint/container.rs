//! The file layer every checkpoint kind shares: a safetensors file whose metadata holds the
//! format, version, preset, dtype, step and a checksum of everything, written atomically with its
//! header keys sorted. Reading verifies that common part; each kind then reads its own fields.

use crate::error::{NnError, NnResult};
use crate::model::{Model, ModelSpec};
use crate::optim::{Optimizer, OptimizerConfig};
use crate::params::ParamKind;
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

/// One tensor as the file stores it.
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

fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
    }
}

fn dtype_name(d: Dtype) -> String {
    match d {
        Dtype::F32 => "f32".into(),
        Dtype::F64 => "f64".into(),
        other => format!("{other:?}").to_lowercase(),
    }
}

fn to_stored<S: Scalar>(t: &Tensor<S>) -> Stored {
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

pub(crate) fn f64_stored(values: &[f64]) -> Stored {
    Stored {
        dtype: Dtype::F64,
        shape: vec![values.len()],
        bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

fn decode<S: Scalar>(bytes: &[u8]) -> Vec<S> {
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

/// FNV-1a, 64 bits: a corruption check, not a cryptographic hash.
fn fnv1a(hash: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *hash ^= u64::from(b);
        *hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
}

fn checksum(tensors: &BTreeMap<String, Stored>, meta: &BTreeMap<String, String>) -> String {
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

/// Serialises any serde value to a JSON string for the metadata header.
pub(crate) fn to_json(value: &impl serde::Serialize) -> NnResult<String> {
    serde_json::to_string(value)
        .map_err(|e| NnError::Config(format!("cannot serialise metadata: {e}")))
}

/// A checkpoint being assembled: the model's parameters and buffers under `model.`, the
/// optimizer's state under `optim.<slot>.`, and the common metadata; the caller adds its own.
pub(crate) struct Contents {
    pub(crate) tensors: BTreeMap<String, Stored>,
    pub(crate) meta: BTreeMap<String, String>,
}

impl Contents {
    pub(crate) fn new<S: Scalar>(
        preset: &str,
        step: u64,
        seed: u64,
        model: &Model<S>,
        optimizer: &Optimizer<S>,
    ) -> Self {
        let mut tensors = BTreeMap::new();
        for p in model.params.iter() {
            tensors.insert(format!("model.{}", p.name), to_stored(&p.value));
        }
        let names: Vec<&str> = model.params.trainable().map(|p| p.name.as_str()).collect();
        for (slot, i, t) in optimizer.state_entries() {
            tensors.insert(format!("optim.{slot}.{}", names[i]), to_stored(t));
        }
        let mut meta = BTreeMap::new();
        meta.insert("format".to_string(), FORMAT.to_string());
        meta.insert("format_version".into(), FORMAT_VERSION.to_string());
        meta.insert("preset".into(), preset.to_string());
        meta.insert("dtype".into(), S::DTYPE.name().to_string());
        meta.insert("step".into(), step.to_string());
        meta.insert("seed".into(), seed.to_string());
        meta.insert("optimizer_steps".into(), optimizer.steps().to_string());
        meta.insert("model".into(), model.describe());
        Contents { tensors, meta }
    }

    /// Adds the checksum and writes the file atomically.
    pub(crate) fn write(mut self, path: &Path) -> NnResult<()> {
        let sum = checksum(&self.tensors, &self.meta);
        self.meta.insert("checksum".into(), sum);
        let bytes = safetensors::serialize(
            self.tensors.iter().map(|(k, v)| (k.as_str(), v)),
            Some(self.meta.into_iter().collect()),
        )
        .map_err(|e| NnError::checkpoint(path, format!("cannot serialise: {e}")))?;
        write_atomic(
            path,
            &canonical(&bytes).map_err(|m| NnError::checkpoint(path, m))?,
        )
    }
}

/// The same safetensors file with its JSON header's keys sorted, so that equal states give
/// byte-identical files (safetensors writes the metadata map in hash order). The header stays
/// padded with spaces to a multiple of 8 bytes, as the format asks.
fn canonical(bytes: &[u8]) -> Result<Vec<u8>, String> {
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

/// A safetensors file's tapegrad metadata and its tensors, as stored; `path` only names the file
/// in messages.
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

/// A checkpoint file read back, with its common metadata verified: format, version, checksum,
/// dtype, and the optimizer's step count equal to the run's.
pub(crate) struct Verified {
    pub(crate) path: PathBuf,
    pub(crate) meta: HashMap<String, String>,
    pub(crate) tensors: BTreeMap<String, Stored>,
    pub(crate) dtype: DType,
    pub(crate) step: u64,
    /// What a file of this kind is called in messages ("tapegrad checkpoint", ...).
    kind: &'static str,
}

impl Verified {
    pub(crate) fn from_bytes(path: &Path, bytes: &[u8], kind: &'static str) -> NnResult<Self> {
        let (meta, tensors) = read_container(path, bytes)?;
        let mut file = Verified {
            path: path.to_path_buf(),
            meta,
            tensors,
            dtype: DType::F32,
            step: 0,
            kind,
        };
        if file.field("format")? != FORMAT {
            return Err(file.err(format!(
                "metadata says format '{}', expected '{FORMAT}'",
                file.field("format")?
            )));
        }
        let version: u32 = file.parse("format_version")?;
        if version != FORMAT_VERSION {
            return Err(file.err(format!(
                "format version {version} is not supported (this build reads version {FORMAT_VERSION})"
            )));
        }
        let stored_sum = file.field("checksum")?.clone();
        let mut rest: BTreeMap<String, String> = file.meta.clone().into_iter().collect();
        rest.remove("checksum");
        let actual = checksum(&file.tensors, &rest);
        if actual != stored_sum {
            return Err(file.err(format!(
                "checksum mismatch (file says {stored_sum}, contents give {actual}): the file is corrupted"
            )));
        }
        file.dtype = match file.field("dtype")?.as_str() {
            "f32" => DType::F32,
            "f64" => DType::F64,
            other => return Err(file.err(format!("unknown dtype '{other}' in metadata"))),
        };
        file.step = file.parse("step")?;
        let optimizer_steps: u64 = file.parse("optimizer_steps")?;
        if optimizer_steps != file.step {
            return Err(file.err(format!(
                "optimizer_steps {optimizer_steps} differs from step {}",
                file.step
            )));
        }
        Ok(file)
    }

    pub(crate) fn err(&self, message: String) -> NnError {
        NnError::checkpoint(&self.path, message)
    }

    /// The metadata value under `key`.
    pub(crate) fn field(&self, key: &str) -> NnResult<&String> {
        self.meta.get(key).ok_or_else(|| {
            self.err(format!(
                "metadata field '{key}' is missing (not a {}?)",
                self.kind
            ))
        })
    }

    /// The metadata value under `key`, parsed.
    pub(crate) fn parse<T: std::str::FromStr>(&self, key: &str) -> NnResult<T> {
        let v = self.field(key)?;
        v.parse()
            .map_err(|_| self.err(format!("metadata field '{key}' is not valid: '{v}'")))
    }

    /// The metadata value under `key`, read as JSON.
    pub(crate) fn json<T: serde::de::DeserializeOwned>(&self, key: &str) -> NnResult<T> {
        serde_json::from_str(self.field(key)?)
            .map_err(|e| self.err(format!("metadata field '{key}' is not valid: {e}")))
    }

    /// Errs unless the file holds tensors of the dtype `S`.
    pub(crate) fn expect_dtype<S: Scalar>(&self) -> NnResult<()> {
        if self.dtype != S::DTYPE {
            return Err(self.err(format!(
                "the checkpoint holds {} tensors but {} was requested",
                self.dtype,
                S::DTYPE
            )));
        }
        Ok(())
    }

    /// The stored tensor `name` as a `Tensor<S>` of the expected shape; says what differs.
    pub(crate) fn tensor<S: Scalar>(&self, name: &str, expected: &Shape) -> NnResult<Tensor<S>> {
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

    /// The stored f64 vector `name` of `len` elements.
    pub(crate) fn f64_vec(&self, name: &str, len: usize) -> NnResult<Vec<f64>> {
        let shape = Shape::new(vec![len])?;
        Ok(self.tensor::<f64>(name, &shape)?.into_vec())
    }

    /// Builds the model `spec` describes and fills it with the stored `model.` tensors, checking
    /// each name and shape. The declared size is checked against the stored tensors first, so a
    /// corrupt or hostile size is an error, not an out-of-memory.
    pub(crate) fn model<S: Scalar>(&self, spec: &ModelSpec, seed: u64) -> NnResult<Model<S>> {
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
        match spec.min_params() {
            Some(needed) if needed <= stored.max(HARMLESS_PARAMS) => {}
            needed => {
                return Err(self.err(format!(
                    "the config's model {} needs {} parameters but the file stores {stored}",
                    spec.name(),
                    needed.map_or("more than usize::MAX".to_string(), |n| n.to_string())
                )))
            }
        }
        let mut model = Model::<S>::new(spec, seed)?;
        for p in model.params.iter_mut() {
            p.value = self.tensor::<S>(&format!("model.{}", p.name), p.value.shape())?;
        }
        Ok(model)
    }

    /// The optimizer state for `model`, as saved; a slot the optimizer has no use for at this
    /// step is an error, not silently dropped.
    pub(crate) fn optimizer<S: Scalar>(
        &self,
        config: OptimizerConfig,
        model: &Model<S>,
    ) -> NnResult<Optimizer<S>> {
        let mut opt = Optimizer::new(config, &model.params)?;
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
                } else if self.tensors.contains_key(&key) {
                    return Err(self.err(format!(
                        "tensor '{key}' is present but a {} optimizer has no such state after {} steps",
                        opt.config().name(),
                        self.step
                    )));
                }
            }
        }
        opt.restore(self.step, |slot, i| loaded.remove(&(slot, i)));
        Ok(opt)
    }

    /// Rejects tensors that are neither the model's, its optimizer's (`slots`), nor in `others`.
    pub(crate) fn check_no_extra<S: Scalar>(
        &self,
        model: &Model<S>,
        slots: &[&str],
        others: &[&str],
    ) -> NnResult<()> {
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
                others.contains(&name.as_str())
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
}
