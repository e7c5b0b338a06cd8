//! `train gpt --init-from FILE.safetensors`: a GPT's parameters read from a safetensors file that
//! PyTorch wrote under nanoGPT's names (`transformer.wte.weight`, ..., `lm_head.weight`). Owns the
//! checks that make a wrong file a clear error: sizes against the model's flags, every tensor's
//! name, shape and dtype, tied weights stored once or twice.

use crate::error::{NnError, NnResult};
use crate::model::Model;
use safetensors::tensor::SafeTensors;
use safetensors::Dtype;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use tapegrad_tensor::{DType, Scalar, Shape, Tensor};

const WTE: &str = "transformer.wte.weight";
const WPE: &str = "transformer.wpe.weight";
const HEAD: &str = "lm_head.weight";
/// The prefix `torch.compile` puts before every name of a compiled module's state_dict.
const COMPILED_PREFIX: &str = "_orig_mod.";

/// What `init_from` read.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    /// Parameters of the model filled from the file.
    pub params: usize,
    /// Whether f64 values were rounded to the model's f32.
    pub rounded: bool,
    /// Things worth telling the user (a dropped causal-mask buffer, a tied table stored once).
    pub notes: Vec<String>,
}

/// One tensor as the file stores it.
struct Entry {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl Entry {
    fn describe(&self) -> String {
        format!("shape {:?}, {}", self.shape, dtype_name(self.dtype))
    }
}

fn dtype_name(d: Dtype) -> String {
    format!("{d:?}").to_lowercase()
}

fn err(path: &Path, message: String) -> NnError {
    NnError::data(format!("--init-from {}", path.display()), message)
}

/// Fills every parameter of the GPT `model` from the safetensors file at `path`. `vocab` (the
/// text's characters) is checked against the file's `vocab` metadata when the file has one.
pub fn init_from<S: Scalar>(
    path: impl AsRef<Path>,
    model: &mut Model<S>,
    vocab: Option<&[char]>,
) -> NnResult<Imported> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| NnError::io(path, e))?;
    init_from_bytes(path, &bytes, model, vocab)
}

/// As [`init_from`], from the file's `bytes`; `path` only names the file in messages.
pub fn init_from_bytes<S: Scalar>(
    path: &Path,
    bytes: &[u8],
    model: &mut Model<S>,
    vocab: Option<&[char]>,
) -> NnResult<Imported> {
    let shape = model.spec.gpt_shape().ok_or_else(|| {
        NnError::Config(format!(
            "--init-from reads a gpt's weights, not those of {}",
            model.spec.name()
        ))
    })?;
    let st = SafeTensors::deserialize(bytes).map_err(|e| {
        err(
            path,
            format!(
                "not a safetensors file ({} bytes; truncated, or another format such as a \
                 pickled .pt file?): {e}",
                bytes.len()
            ),
        )
    })?;
    let meta: HashMap<String, String> = SafeTensors::read_metadata(bytes)
        .ok()
        .and_then(|(_, m)| m.metadata().clone())
        .unwrap_or_default();
    if meta.get("preset").map(String::as_str) == Some(super::checkpoint::PRESET) {
        return Err(err(
            path,
            "this is a tapegrad gpt checkpoint, not a PyTorch state_dict: continue it with \
             `train --resume`"
                .into(),
        ));
    }
    let mut notes = Vec::new();
    let mut file: BTreeMap<String, Entry> = BTreeMap::new();
    let mut stripped = false;
    for (name, view) in st.iter() {
        let name = match name.strip_prefix(COMPILED_PREFIX) {
            Some(rest) => {
                stripped = true;
                rest.to_string()
            }
            None => name.to_string(),
        };
        file.insert(
            name,
            Entry {
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                bytes: view.data().to_vec(),
            },
        );
    }
    if stripped {
        notes.push(format!(
            "names read without torch.compile's '{COMPILED_PREFIX}' prefix"
        ));
    }
    // nanoGPT without flash attention registers its causal mask as a buffer `attn.bias` of
    // shape [1, 1, block, block]: not a parameter, and tapegrad's attention needs no mask.
    let masks: Vec<String> = file
        .iter()
        .filter(|(n, e)| {
            (n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias"))
                && e.shape.len() == 4
                && e.shape[..2] == [1, 1]
                && e.shape[2] == e.shape[3]
        })
        .map(|(n, _)| n.clone())
        .collect();
    if !masks.is_empty() {
        notes.push(format!(
            "{} causal-mask buffers (attn.bias) left out: the attention is causal by construction",
            masks.len()
        ));
        for n in masks {
            file.remove(&n);
        }
    }
    let tied = model.params.find(HEAD).is_none();
    reconcile_tied(path, &mut file, &meta, tied, &mut notes)?;
    check_sizes(path, &file, &meta, &shape, vocab)?;

    let mut rounded = false;
    let mut count = 0;
    for p in model.params.iter_mut() {
        let expected = p.value.shape().clone();
        let e = file.remove(&p.name).ok_or_else(|| {
            err(
                path,
                format!(
                    "tensor '{}' is missing (the model expects shape {expected}, {})",
                    p.name,
                    S::DTYPE
                ),
            )
        })?;
        p.value = decode::<S>(path, &p.name, &e, &expected, &mut rounded)?;
        count += 1;
    }
    if let Some((name, e)) = file.iter().next() {
        let more = match file.len() {
            1 => String::new(),
            n => format!(" (and {} more)", n - 1),
        };
        return Err(err(
            path,
            format!(
                "tensor '{name}' ({}) is not a parameter of the model {}{more}",
                e.describe(),
                model.spec.name()
            ),
        ));
    }
    if rounded {
        notes.push("f64 values rounded to the nearest f32".into());
    }
    Ok(Imported {
        params: count,
        rounded,
        notes,
    })
}

/// PyTorch's state_dict of a tied model names one table twice (`transformer.wte.weight` and
/// `lm_head.weight`); `safetensors.torch.save_model` stores it once under one of the names (and
/// records the other in the metadata). Leaves `file` with the names the model has.
fn reconcile_tied(
    path: &Path,
    file: &mut BTreeMap<String, Entry>,
    meta: &HashMap<String, String>,
    tied: bool,
    notes: &mut Vec<String>,
) -> NnResult<()> {
    let aliased = meta.get(WTE).map(String::as_str) == Some(HEAD)
        || meta.get(HEAD).map(String::as_str) == Some(WTE);
    match (tied, file.contains_key(WTE), file.contains_key(HEAD)) {
        (true, true, true) => {
            let (w, h) = (&file[WTE], &file[HEAD]);
            if w.dtype != h.dtype || w.shape != h.shape || w.bytes != h.bytes {
                return Err(err(
                    path,
                    format!(
                        "the model ties {HEAD} to {WTE} (--tie-weights) but the file's two \
                         tensors differ ({}; {}): leave out --tie-weights",
                        w.describe(),
                        h.describe()
                    ),
                ));
            }
            file.remove(HEAD);
        }
        (true, false, true) => {
            if let Some(e) = file.remove(HEAD) {
                file.insert(WTE.to_string(), e);
            }
            notes.push(format!(
                "{WTE} read from {HEAD} (the file stores the tied table once)"
            ));
        }
        (false, true, false) | (false, false, true) => {
            let (has, lacks) = match file.contains_key(WTE) {
                true => (WTE, HEAD),
                false => (HEAD, WTE),
            };
            let why = if aliased {
                "the file's metadata says the two share one table"
            } else {
                "the file stores one table for both"
            };
            return Err(err(
                path,
                format!(
                    "tensor '{lacks}' is missing but '{has}' is there: {why} (a model with tied \
                     weights, nanoGPT's default); add --tie-weights"
                ),
            ));
        }
        _ => {}
    }
    Ok(())
}

/// The file's sizes against the model's, so a mismatch names the flag to set.
fn check_sizes(
    path: &Path,
    file: &BTreeMap<String, Entry>,
    meta: &HashMap<String, String>,
    shape: &super::GptShape,
    vocab: Option<&[char]>,
) -> NnResult<()> {
    let dims = |name: &str| file.get(name).map(|e| e.shape.clone());
    if let Some(d) = dims(WTE).filter(|d| d.len() == 2) {
        if d[0] != shape.vocab {
            return Err(err(
                path,
                format!(
                    "{WTE} has shape {d:?}: a vocabulary of {} tokens, but the text has {} \
                     distinct characters; train on the text the weights were made for (--text \
                     FILE, its sorted distinct characters in the order of the table's rows)",
                    d[0], shape.vocab
                ),
            ));
        }
        if d[1] != shape.embd {
            return Err(flag(path, WTE, &d, "embd", d[1], shape.embd));
        }
    }
    if let Some(d) = dims(WPE).filter(|d| d.len() == 2) {
        if d[0] != shape.context {
            return Err(flag(path, WPE, &d, "context", d[0], shape.context));
        }
    }
    let layers = file
        .keys()
        .filter_map(|n| n.strip_prefix("transformer.h."))
        .filter_map(|rest| rest.split('.').next()?.parse::<usize>().ok())
        .max()
        .map(|i| i + 1);
    if let Some(l) = layers.filter(|&l| l != shape.layers) {
        return Err(err(
            path,
            format!(
                "the file holds {l} blocks (transformer.h.0 to transformer.h.{}) but the model \
                 has {}: set --layers {l}",
                l - 1,
                shape.layers
            ),
        ));
    }
    let fc = "transformer.h.0.mlp.c_fc.weight";
    if let Some(d) = dims(fc).filter(|d| d.len() == 2 && d[1] == shape.embd) {
        if d[0] != shape.mlp_ratio * shape.embd {
            return Err(err(
                path,
                format!(
                    "{fc} has shape {d:?}: an MLP {} wide, but tapegrad's GPT is {} x {} = {} wide",
                    d[0],
                    shape.mlp_ratio,
                    shape.embd,
                    shape.mlp_ratio * shape.embd
                ),
            ));
        }
    }
    // The shapes do not tell the heads; a file written by bench/gpt_weights.py says them.
    if let Some(h) = meta.get("n_head") {
        if h.parse::<usize>().ok() != Some(shape.heads) {
            return Err(err(
                path,
                format!(
                    "the file's metadata says n_head {h} but the model has {} heads: set --heads {h}",
                    shape.heads
                ),
            ));
        }
    }
    if let (Some(stored), Some(vocab)) = (meta.get("vocab"), vocab) {
        let stored: Option<String> = serde_json::from_str(stored).ok();
        let text: String = vocab.iter().collect();
        if stored.as_deref() != Some(text.as_str()) {
            return Err(err(
                path,
                format!(
                    "the file's metadata gives the vocabulary {} but the text's is {}: train on \
                     the text the weights were made for (--text FILE)",
                    serde_json::to_string(&stored).unwrap_or_default(),
                    serde_json::to_string(&text).unwrap_or_default()
                ),
            ));
        }
    }
    Ok(())
}

fn flag(path: &Path, name: &str, dims: &[usize], flag: &str, file: usize, model: usize) -> NnError {
    err(
        path,
        format!("{name} has shape {dims:?} but the model's {flag} is {model}: set --{flag} {file}"),
    )
}

/// The entry's values as the model's dtype: f32 to f64 exactly, f64 to f32 rounded to nearest.
fn decode<S: Scalar>(
    path: &Path,
    name: &str,
    e: &Entry,
    expected: &Shape,
    rounded: &mut bool,
) -> NnResult<Tensor<S>> {
    if e.shape != expected.dims() {
        return Err(err(
            path,
            format!(
                "tensor '{name}' has shape {:?} but the model expects {expected}",
                e.shape
            ),
        ));
    }
    let values: Vec<S> = match e.dtype {
        Dtype::F32 => e
            .bytes
            .chunks_exact(4)
            .map(|c| S::from_f64(f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))))
            .collect(),
        Dtype::F64 => {
            *rounded |= S::DTYPE == DType::F32;
            e.bytes
                .chunks_exact(8)
                .map(|c| {
                    S::from_f64(f64::from_le_bytes([
                        c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7],
                    ]))
                })
                .collect()
        }
        other => {
            return Err(err(
                path,
                format!(
                    "tensor '{name}' has dtype {} but --init-from reads f32 or f64 (convert it \
                     with tensor.float() before saving)",
                    dtype_name(other)
                ),
            ))
        }
    };
    if values.len() != expected.numel() {
        return Err(err(
            path,
            format!(
                "tensor '{name}' holds {} values for its shape {expected}",
                values.len()
            ),
        ));
    }
    Ok(Tensor::from_shape(expected.clone(), values)?)
}
