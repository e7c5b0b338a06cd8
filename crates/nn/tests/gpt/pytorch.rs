//! The GPT against PyTorch without torch: `fixtures/gpt_tiny.safetensors` holds a tiny nanoGPT's
//! f32 weights as PyTorch saved them, `fixtures/gpt_tiny.json` PyTorch's logits, loss and four
//! parameters' gradients for a fixed batch, computed in f64 from those weights (both written by
//! `bench/gpt_weights.py fixture`). The weights load through `--init-from`'s path, tapegrad's
//! training step (eager and compiled, f32 and f64) reproduces PyTorch's numbers within the
//! rounding bounds below, and every kind of wrong file is a clear error.

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::BTreeMap;
use std::path::Path;
use tapegrad_core::Tensor;
use tapegrad_nn::backend::{make_backend, BackendKind};
use tapegrad_nn::data::{Batch, BatchTargets};
use tapegrad_nn::gpt::import::{init_from, init_from_bytes};
use tapegrad_nn::rng::dropout_rng;
use tapegrad_nn::{Model, ModelSpec};
use tapegrad_tensor::Scalar;

const WEIGHTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/gpt_tiny.safetensors"
);
const RECORD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gpt_tiny.json");

fn record() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(RECORD).unwrap()).unwrap()
}

fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// The fixture's model: vocab 11, context 8, 2 layers, 2 heads, width 16.
fn spec(layers: usize, heads: usize, embd: usize, context: usize, tie: bool) -> ModelSpec {
    ModelSpec::Gpt {
        vocab: 11,
        context,
        layers,
        heads,
        embd,
        mlp_ratio: 4,
        dropout: 0.0,
        tie_weights: tie,
    }
}

fn tiny() -> ModelSpec {
    spec(2, 2, 16, 8, false)
}

/// Rounding bound for comparing with PyTorch's f64 numbers: every value is made by at most
/// `depth` reductions in a row (per block: ln_1, c_attn, q.k, the softmax's sum, att.v, c_proj,
/// ln_2, c_fc, c_proj; then ln_f and the head: 9 L + 2 = 20 forward, twice that backward), each of
/// at most `k` terms (the MLP's 4E = 64 is the longest), and each reduction adds at most `k u`
/// relative to the size of its terms (the gamma_k bound, u the unit roundoff). So
/// `|error| <= depth k u scale`, with `scale` the largest magnitude among the compared values
/// (the terms are of that order here: weights and activations are O(1)). For f32 that is
/// 20 * 64 * 2^-24 = 7.6e-5 relative for the logits, for f64 1.4e-13.
fn tolerance(u: f64, backward: bool, reference: &[f64]) -> f64 {
    let depth = if backward { 40.0 } else { 20.0 };
    let k = 64.0;
    let scale = reference.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    depth * k * u * scale
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()))
}

fn batch<S: Scalar>(r: &serde_json::Value) -> Batch<S> {
    let x: Vec<S> = r["x"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(floats)
        .map(S::from_f64)
        .collect();
    let y: Vec<usize> = floats(&r["y"]).iter().map(|&v| v as usize).collect();
    Batch {
        x: Tensor::new(&[2, 8], x).unwrap(),
        y: BatchTargets::Classes(y),
    }
}

/// Loads the fixture through `--init-from`'s path and compares one training step's loss, logits
/// and gradients with PyTorch's.
fn matches_pytorch<S: Scalar>(kind: BackendKind, u: f64) {
    let r = record();
    let mut model = Model::<S>::new(&tiny(), 0).unwrap();
    let got = init_from(WEIGHTS, &mut model, None).unwrap();
    assert_eq!(got.params, 2 + 12 * 2 + 2 + 1);
    assert!(!got.rounded);
    let b = batch::<S>(&r);
    let mut backend = make_backend::<S>(kind).unwrap();
    let out = backend.train_step(&model, &b, dropout_rng(0, 0)).unwrap();

    let logits: Vec<f64> = out.outputs.data().iter().map(|v| v.to_f64()).collect();
    let want = floats(&r["logits"]);
    let (err, tol) = (max_diff(&logits, &want), tolerance(u, false, &want));
    eprintln!(
        "{kind:?} {}: logits off by {err:.1e} (tolerance {tol:.1e})",
        S::DTYPE
    );
    assert!(
        err <= tol,
        "{kind:?}: logits differ by {err:e} (tolerance {tol:e})"
    );

    let loss = r["loss"].as_f64().unwrap();
    let tol = tolerance(u, false, &[loss]);
    assert!(
        (out.loss - loss).abs() <= tol,
        "{kind:?}: loss {} against PyTorch's {loss} (tolerance {tol:e})",
        out.loss
    );

    let names: Vec<String> = model.params.trainable().map(|p| p.name.clone()).collect();
    let grads = r["grads"].as_object().unwrap();
    assert_eq!(grads.len(), 4);
    for (name, want) in grads {
        let i = names.iter().position(|n| n == name).unwrap();
        let g = out.grads[i].clone().into_dense().unwrap();
        let g: Vec<f64> = g.data().iter().map(|v| v.to_f64()).collect();
        let want = floats(want);
        let (err, tol) = (max_diff(&g, &want), tolerance(u, true, &want));
        eprintln!(
            "{kind:?} {}: {name} off by {err:.1e} (tolerance {tol:.1e})",
            S::DTYPE
        );
        assert!(
            err <= tol,
            "{kind:?}: gradient of {name} differs by {err:e} (tolerance {tol:e})"
        );
    }
}

#[test]
fn f64_step_matches_pytorch_to_f64_rounding() {
    matches_pytorch::<f64>(BackendKind::Eager, f64::EPSILON / 2.0);
    matches_pytorch::<f64>(BackendKind::Compiled, f64::EPSILON / 2.0);
}

#[test]
fn f32_step_matches_pytorch_to_f32_rounding() {
    matches_pytorch::<f32>(BackendKind::Eager, f64::from(f32::EPSILON) / 2.0);
    matches_pytorch::<f32>(BackendKind::Compiled, f64::from(f32::EPSILON) / 2.0);
}

/// The fixture's tensors, to be changed and written back.
type Entries = BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>;

fn entries() -> Entries {
    let bytes = std::fs::read(WEIGHTS).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.iter()
        .map(|(n, v)| {
            (
                n.to_string(),
                (v.dtype(), v.shape().to_vec(), v.data().to_vec()),
            )
        })
        .collect()
}

fn serialize(e: &Entries, meta: &[(&str, &str)]) -> Vec<u8> {
    let views: Vec<(String, TensorView<'_>)> = e
        .iter()
        .map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let meta = (!meta.is_empty()).then(|| {
        meta.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    });
    safetensors::serialize(views, meta).unwrap()
}

fn load(bytes: &[u8], spec: &ModelSpec) -> Result<Model<f32>, String> {
    let mut m = Model::<f32>::new(spec, 0).unwrap();
    init_from_bytes(Path::new("w.safetensors"), bytes, &mut m, None)
        .map(|_| m)
        .map_err(|e| e.to_string())
}

fn fails(bytes: &[u8], spec: &ModelSpec, parts: &[&str]) {
    let e = load(bytes, spec).expect_err("the load should fail");
    for p in parts {
        assert!(e.contains(p), "'{p}' not in: {e}");
    }
    assert!(e.starts_with("--init-from w.safetensors: "), "{e}");
}

#[test]
fn wrong_files_are_clear_errors_naming_the_tensor_and_both_shapes() {
    let good = entries();
    let tiny = tiny();
    fails(b"not a file", &tiny, &["not a safetensors file (10 bytes"]);

    let mut e = good.clone();
    e.remove("transformer.ln_f.bias");
    fails(
        &serialize(&e, &[]),
        &tiny,
        &["tensor 'transformer.ln_f.bias' is missing (the model expects shape [16], f32)"],
    );

    let mut e = good.clone();
    e.insert("extra.weight".into(), (Dtype::F32, vec![2], vec![0; 8]));
    fails(
        &serialize(&e, &[]),
        &tiny,
        &["tensor 'extra.weight' (shape [2], f32) is not a parameter of the model gpt"],
    );

    let mut e = good.clone();
    e.get_mut("lm_head.weight").unwrap().1 = vec![16, 11];
    fails(
        &serialize(&e, &[]),
        &tiny,
        &["tensor 'lm_head.weight' has shape [16, 11] but the model expects [11, 16]"],
    );

    let mut e = good.clone();
    e.insert(
        "transformer.ln_f.weight".into(),
        (Dtype::F16, vec![16], vec![0; 32]),
    );
    fails(
        &serialize(&e, &[]),
        &tiny,
        &["tensor 'transformer.ln_f.weight' has dtype f16 but --init-from reads f32 or f64"],
    );

    // Sizes that differ from the flags name the flag and the file's value.
    let bytes = serialize(&good, &[("n_head", "2")]);
    fails(&bytes, &spec(2, 2, 16, 4, false), &["--context 8"]);
    fails(
        &bytes,
        &spec(1, 2, 16, 8, false),
        &["holds 2 blocks", "--layers 2"],
    );
    fails(
        &bytes,
        &spec(2, 2, 32, 8, false),
        &["[11, 16]", "--embd 16"],
    );
    fails(
        &bytes,
        &spec(2, 4, 16, 8, false),
        &["n_head 2", "--heads 2"],
    );
    let mut v12 = spec(2, 2, 16, 8, false);
    if let ModelSpec::Gpt { vocab, .. } = &mut v12 {
        *vocab = 12;
    }
    fails(
        &bytes,
        &v12,
        &["vocabulary of 11 tokens", "12 distinct characters"],
    );

    // A tapegrad checkpoint is not a state_dict.
    let bytes = serialize(&good, &[("preset", "gpt")]);
    fails(&bytes, &tiny, &["tapegrad gpt checkpoint", "--resume"]);
}

#[test]
fn tied_weights_stored_once_or_twice() {
    let good = entries();
    let tied = spec(2, 2, 16, 8, true);
    // PyTorch's state_dict of a tied model names the table twice: equal tensors load.
    let mut e = good.clone();
    let wte = e["transformer.wte.weight"].clone();
    e.insert("lm_head.weight".into(), wte.clone());
    let m = load(&serialize(&e, &[]), &tied).unwrap();
    let p = m.params.find("transformer.wte.weight").unwrap();
    let stored: Vec<f32> = wte
        .2
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(m.params.get(p).value.data(), &stored[..]);
    // Different tensors under the two names are not one tied table.
    fails(
        &serialize(&good, &[]),
        &tied,
        &[
            "ties lm_head.weight to transformer.wte.weight",
            "leave out --tie-weights",
        ],
    );
    // safetensors' save_model keeps one name (lm_head.weight) and records the other.
    let mut once = e.clone();
    once.remove("transformer.wte.weight");
    let bytes = serialize(&once, &[("transformer.wte.weight", "lm_head.weight")]);
    let m = load(&bytes, &tied).unwrap();
    assert_eq!(m.params.get(p).value.data(), &stored[..]);
    // The same file into an untied model says to tie.
    fails(
        &bytes,
        &tiny(),
        &["'transformer.wte.weight' is missing", "add --tie-weights"],
    );
}

#[test]
fn f64_files_load_into_f32_models_rounded_and_f32_files_into_f64_exactly() {
    let good = entries();
    let mut wide = good.clone();
    for (d, _, b) in wide.values_mut() {
        let v: Vec<u8> = b
            .chunks_exact(4)
            .flat_map(|c| {
                let x = f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                (x + x * 1e-12).to_le_bytes()
            })
            .collect();
        *d = Dtype::F64;
        *b = v;
    }
    let bytes = serialize(&wide, &[]);
    let mut m = Model::<f32>::new(&tiny(), 0).unwrap();
    let got = init_from_bytes(Path::new("w"), &bytes, &mut m, None).unwrap();
    assert!(got.rounded && got.notes.iter().any(|n| n.contains("rounded")));
    let exact = load(&serialize(&good, &[]), &tiny()).unwrap();
    assert_eq!(m.params, exact.params);
    let mut m64 = Model::<f64>::new(&tiny(), 0).unwrap();
    let got = init_from(WEIGHTS, &mut m64, None).unwrap();
    assert!(!got.rounded);
    for (a, b) in m64.params.iter().zip(exact.params.iter()) {
        let widened: Vec<f64> = b.value.data().iter().map(|&v| f64::from(v)).collect();
        assert_eq!(a.value.data(), &widened[..], "{}", a.name);
    }
}
