//! Checkpoint files: a round trip restores every tensor; truncated, corrupted, foreign and
//! mismatched files give errors that say what is wrong and leave the file untouched; a save that
//! fails leaves the previous file intact.

use tapegrad_nn::checkpoint::{self, Checkpoint};
use tapegrad_nn::data::{DataSource, Prepared};
use tapegrad_nn::layers::Activation;
use tapegrad_nn::{
    make_backend, BackendKind, ModelSpec, OptimizerConfig, Schedule, TrainConfig, Trainer,
};
use tapegrad_tensor::Scalar;

fn config(hidden: usize) -> TrainConfig {
    TrainConfig {
        preset: "mlp".into(),
        data: DataSource::AutoMpg,
        model: ModelSpec::Mlp {
            inputs: 7,
            hidden: vec![hidden],
            outputs: 1,
            activation: Activation::Tanh,
            dropout: 0.0,
        },
        optimizer: OptimizerConfig::by_name("adam", 0.01).unwrap(),
        schedule: Schedule::default(),
        clip_norm: None,
        batch_size: 32,
        val_fraction: 0.2,
        seed: 1,
        label_smoothing: 0.0,
        accumulate: 1,
    }
}

fn trained<S: Scalar>(cfg: &TrainConfig, steps: usize) -> Trainer<S> {
    let data = Prepared::<S>::new(&cfg.data.load().unwrap(), cfg.val_fraction, cfg.seed).unwrap();
    let mut t = Trainer::new(
        cfg.clone(),
        data,
        make_backend::<S>(BackendKind::Eager).unwrap(),
    )
    .unwrap();
    for _ in 0..steps {
        t.train_step().unwrap();
    }
    t
}

fn tempdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("tapegrad-ckpt-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn read_err(path: &std::path::Path) -> String {
    match Checkpoint::read(path) {
        Ok(_) => panic!("{} should not load", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn round_trip_restores_everything() {
    let dir = tempdir("roundtrip");
    let t = trained::<f64>(&config(8), 5);
    let path = dir.join("c.safetensors");
    checkpoint::save(&path, &t).unwrap();
    let ck = Checkpoint::read(&path).unwrap();
    assert_eq!(ck.header.step, 5);
    assert_eq!(ck.header.seed, 1);
    assert_eq!(ck.header.preset, "mlp");
    assert_eq!(ck.header.dtype, tapegrad_tensor::DType::F64);
    assert_eq!(ck.header.config, t.config);
    let model = ck.inference_model::<f64>().unwrap();
    assert_eq!(model.params, t.model.params);
    assert_eq!(ck.optimizer(&model).unwrap(), t.optimizer);
    let (features, target) = ck.standardizers().unwrap();
    assert_eq!(features, t.data.features);
    assert_eq!(target, t.data.target);
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn truncated_and_corrupted_files_are_rejected_and_left_alone() {
    let dir = tempdir("corrupt");
    let t = trained::<f32>(&config(8), 3);
    let good = dir.join("good.safetensors");
    checkpoint::save(&good, &t).unwrap();
    let bytes = std::fs::read(&good).unwrap();

    let truncated = dir.join("truncated.safetensors");
    std::fs::write(&truncated, &bytes[..bytes.len() - 10]).unwrap();
    let e = read_err(&truncated);
    assert!(
        e.contains("truncated.safetensors") && e.contains("truncated or corrupted"),
        "{e}"
    );
    assert_eq!(
        std::fs::read(&truncated).unwrap(),
        &bytes[..bytes.len() - 10],
        "reading must not modify the file"
    );

    let short = dir.join("short.safetensors");
    std::fs::write(&short, &bytes[..5]).unwrap();
    assert!(read_err(&short).contains("truncated or corrupted"));

    // A flipped bit in the last tensor's data: still valid safetensors, caught by the checksum.
    let flipped = dir.join("flipped.safetensors");
    let mut f = bytes.clone();
    let last = f.len() - 3;
    f[last] ^= 0x10;
    std::fs::write(&flipped, &f).unwrap();
    let e = read_err(&flipped);
    assert!(
        e.contains("checksum mismatch") && e.contains("corrupted"),
        "{e}"
    );
    assert_eq!(std::fs::read(&flipped).unwrap(), f);

    let garbage = dir.join("garbage.safetensors");
    std::fs::write(&garbage, b"this is not a checkpoint at all").unwrap();
    assert!(read_err(&garbage).contains("not a readable safetensors file"));

    let missing = dir.join("missing.safetensors");
    assert!(read_err(&missing).contains("missing.safetensors"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_safetensors_file_without_our_metadata_is_rejected() {
    let dir = tempdir("foreign");
    let data: Vec<u8> = 1.5f32.to_le_bytes().to_vec();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1], &data).unwrap();
    let bytes = safetensors::serialize([("w", view)], None).unwrap();
    let path = dir.join("foreign.safetensors");
    std::fs::write(&path, bytes).unwrap();
    assert!(read_err(&path).contains("no tapegrad metadata"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn mismatched_model_names_the_tensor_and_both_shapes() {
    let dir = tempdir("mismatch");
    let t = trained::<f32>(&config(8), 2);
    let path = dir.join("c.safetensors");
    checkpoint::save(&path, &t).unwrap();
    let ck = Checkpoint::read(&path).unwrap();
    let e = ck.model_from::<f32>(&config(12)).err().unwrap().to_string();
    assert!(
        e.contains("'model.0.weight'") && e.contains("[8, 7]") && e.contains("[12, 7]"),
        "{e}"
    );
    let e = ck.model::<f64>().err().unwrap().to_string();
    assert!(e.contains("f32") && e.contains("f64"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_failed_save_leaves_the_old_file_intact() {
    let dir = tempdir("failedsave");
    let path = dir.join("c.safetensors");
    checkpoint::save(&path, &trained::<f32>(&config(8), 2)).unwrap();
    let before = std::fs::read(&path).unwrap();
    // Occupy the temporary file's name with a folder so writing it fails.
    std::fs::create_dir(dir.join(".c.safetensors.tmp")).unwrap();
    let e = checkpoint::save(&path, &trained::<f32>(&config(8), 4))
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot write the temporary file"), "{e}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the old checkpoint must survive"
    );
    assert_eq!(Checkpoint::read(&path).unwrap().header.step, 2);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn resaving_over_an_existing_file_replaces_it() {
    let dir = tempdir("resave");
    let path = dir.join("c.safetensors");
    checkpoint::save(&path, &trained::<f32>(&config(8), 2)).unwrap();
    checkpoint::save(&path, &trained::<f32>(&config(8), 3)).unwrap();
    assert_eq!(Checkpoint::read(&path).unwrap().header.step, 3);
    std::fs::remove_dir_all(dir).unwrap();
}
