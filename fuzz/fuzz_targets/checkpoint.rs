//! Checkpoints from arbitrary bytes. Each input is tried as is (the safetensors framing and the
//! checksum) and, when it is a safetensors file with metadata, once more with its checksum
//! recomputed, so mutated headers, configs and tensors reach the model, optimizer and statistics
//! checks (a hand-edited file has a right checksum too). Property: an `Err`, never a panic, an
//! OOM from a size field or a hang.
#![no_main]

use libfuzzer_sys::fuzz_target;
use safetensors::tensor::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use tapegrad_nn::checkpoint::Checkpoint;

/// FNV-1a over the metadata and tensors, as `checkpoint.rs` computes it.
fn checksum(meta: &BTreeMap<String, String>, st: &SafeTensors) -> String {
    fn fnv(h: &mut u64, bytes: &[u8]) {
        for &b in bytes {
            *h ^= u64::from(b);
            *h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for (k, v) in meta {
        fnv(&mut h, k.as_bytes());
        fnv(&mut h, &[0]);
        fnv(&mut h, v.as_bytes());
        fnv(&mut h, &[0]);
    }
    let mut tensors: Vec<_> = st.tensors();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, view) in tensors {
        fnv(&mut h, name.as_bytes());
        let dtype = match view.dtype() {
            Dtype::F32 => "f32".to_string(),
            Dtype::F64 => "f64".to_string(),
            other => format!("{other:?}").to_lowercase(),
        };
        fnv(&mut h, dtype.as_bytes());
        for d in view.shape() {
            fnv(&mut h, &(*d as u64).to_le_bytes());
        }
        fnv(&mut h, view.data());
    }
    format!("{h:016x}")
}

/// The same file with the checksum that matches its contents.
fn resealed(bytes: &[u8]) -> Option<Vec<u8>> {
    let st = SafeTensors::deserialize(bytes).ok()?;
    let (n, metadata) = SafeTensors::read_metadata(bytes).ok()?;
    let mut meta: BTreeMap<String, String> = metadata.metadata().clone()?.into_iter().collect();
    meta.remove("checksum");
    let sum = checksum(&meta, &st);
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).ok()?;
    header
        .get_mut("__metadata__")?
        .as_object_mut()?
        .insert("checksum".into(), sum.into());
    let mut text = serde_json::to_vec(&header).ok()?;
    while text.len() % 8 != 0 {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    Some(out)
}

fn load(bytes: &[u8]) {
    let Ok(ckpt) = Checkpoint::from_bytes("fuzz.safetensors", bytes) else {
        return;
    };
    let _ = ckpt.standardizers();
    let _ = ckpt.inference_model::<f32>();
    let _ = ckpt.inference_model::<f64>();
    if let Ok(model) = ckpt.model::<f32>() {
        let _ = ckpt.optimizer(&model);
    }
    if let Ok(model) = ckpt.model::<f64>() {
        let _ = ckpt.optimizer(&model);
    }
}

fuzz_target!(|bytes: &[u8]| {
    load(bytes);
    if let Some(sealed) = resealed(bytes) {
        load(&sealed);
    }
});
