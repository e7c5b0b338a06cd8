//! Inputs the fuzz targets (fuzz/, see fuzz/README.md) found to panic, replayed as plain tests:
//! each file under tests/fuzz_inputs/TARGET/ goes through the same entry points as its target
//! and must give an `Err` or a result, never a panic; named tests pin the error each fix returns.

use std::path::PathBuf;
use tapegrad_core::graph::{GraphFile, Sweep};
use tapegrad_nn::checkpoint::Checkpoint;
use tapegrad_nn::data::{parse_csv, Dataset, Prepared, TaskKind};

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz_inputs")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect()
}

/// What fuzz/fuzz_targets/graph_file.rs does with one input.
fn replay_graph_file(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let Ok(file) = GraphFile::parse(text) else {
        return;
    };
    if let Ok(written) = file.to_json() {
        assert_eq!(GraphFile::parse(&written).unwrap(), file);
    }
    for sweep in Sweep::ALL {
        if let (Ok(x), Ok(seed)) = (file.inputs::<f64>(), file.seed::<f64>()) {
            let _ = file.graph.gradients(&x, file.output, &seed, sweep);
        }
        if let (Ok(x), Ok(seed)) = (file.inputs::<f32>(), file.seed::<f32>()) {
            let _ = file.graph.gradients(&x, file.output, &seed, sweep);
        }
    }
}

/// What fuzz/fuzz_targets/checkpoint.rs does with one input (without resealing).
fn replay_checkpoint(bytes: &[u8]) {
    let Ok(ckpt) = Checkpoint::from_bytes("fuzz.safetensors", bytes) else {
        return;
    };
    let _ = ckpt.standardizers();
    let _ = ckpt.inference_model::<f32>();
    let _ = ckpt.inference_model::<f64>();
}

/// What fuzz/fuzz_targets/csv.rs does with one input: a flags byte, then the text.
fn replay_csv(bytes: &[u8]) {
    let Some((&flags, rest)) = bytes.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let Ok(table) = parse_csv("fuzz.csv", text, flags & 1 == 0) else {
        return;
    };
    let task = if flags & 2 == 0 {
        TaskKind::Regression
    } else {
        TaskKind::Classification
    };
    for target in ["last", "0"] {
        let Ok(data) = Dataset::from_table(&table, target, task) else {
            continue;
        };
        if let Ok(prepared) = Prepared::<f32>::new(&data, 0.2, u64::from(flags)) {
            let n = prepared.train.len();
            assert!(prepared.train.batch(&[0, n - 1]).is_ok());
            assert!(prepared.train.batch(&[n]).is_err());
        }
    }
}

#[test]
fn graph_file_inputs_never_panic() {
    for (path, bytes) in inputs("graph_file") {
        eprintln!("{}", path.display());
        replay_graph_file(&bytes);
    }
}

#[test]
fn checkpoint_inputs_never_panic() {
    for (path, bytes) in inputs("checkpoint") {
        eprintln!("{}", path.display());
        replay_checkpoint(&bytes);
    }
}

#[test]
fn csv_inputs_never_panic() {
    let cases = inputs("csv");
    assert!(!cases.is_empty());
    for (path, bytes) in cases {
        eprintln!("{}", path.display());
        replay_csv(&bytes);
    }
}

/// `Split::batch` indexed the feature buffer with the row unchecked: a row past the split
/// panicked with a slice-range error instead of naming the row.
#[test]
fn a_batch_row_outside_the_split_is_an_error() {
    let table = parse_csv("t.csv", "a,b,y\n1,2,3\n4,5,6\n7,8,9\n", true).unwrap();
    let data = Dataset::from_table(&table, "y", TaskKind::Regression).unwrap();
    let prepared = Prepared::<f64>::new(&data, 0.0, 1).unwrap();
    assert_eq!(prepared.train.len(), 3);
    assert_eq!(prepared.train.batch(&[2, 0]).unwrap().x.dims(), &[2, 2]);
    let err = prepared.train.batch(&[0, 3]).unwrap_err().to_string();
    assert!(err.contains("batch") && err.contains("row 3"), "{err}");
}

/// Found by the audit: `next_batch` added the batch size to the cursor unchecked, and a batch
/// size of usize::MAX (from `--batch-size` or a checkpoint's config) overflowed; so did the epoch
/// counter at u64::MAX (from a checkpoint's metadata).
#[test]
fn a_huge_batch_size_or_epoch_saturates() {
    use tapegrad_nn::data::BatchOrder;
    let mut order = BatchOrder::new(5, usize::MAX, 7).unwrap();
    let mut rows = order.next_batch();
    rows.sort();
    assert_eq!(rows, vec![0, 1, 2, 3, 4]);
    assert_eq!(order.epoch(), 1);
    let mut order = BatchOrder::at(3, 2, 7, u64::MAX, 2).unwrap();
    assert_eq!(order.next_batch().len(), 1);
    assert_eq!((order.epoch(), order.cursor()), (u64::MAX, 0));
}

/// Found by the audit: a checkpoint's config declares the layer widths, and the model was built
/// (allocated) from them before any stored tensor was compared, so a header saying
/// `hidden: [1000000000, 1000000000]` ran out of memory. A declared model larger than both
/// the stored tensors and a harmless size (2^24 parameters) is now refused before it is built.
#[test]
fn a_checkpoint_config_cannot_declare_a_model_larger_than_its_file() {
    use tapegrad_nn::ModelSpec;
    let dir = std::env::temp_dir().join(format!("tapegrad-fuzz-reg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mlp.safetensors");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tapegrad"))
        .args(["train", "mlp", "--steps", "2", "-q", "--save"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ckpt = Checkpoint::read(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(ckpt.inference_model::<f32>().is_ok());
    let with_hidden = |hidden: Vec<usize>| {
        let mut config = ckpt.header.config.clone();
        let ModelSpec::Mlp { hidden: h, .. } = &mut config.model else {
            panic!("the mlp preset trains an MLP");
        };
        *h = hidden;
        config
    };
    let err = ckpt
        .model_from::<f32>(&with_hidden(vec![1_000_000_000, 1_000_000_000]))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("needs") && err.contains("the file stores"),
        "{err}"
    );
    let err = ckpt
        .model_from::<f32>(&with_hidden(vec![usize::MAX, 2]))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("more than usize::MAX"), "{err}");
    let mut config = ckpt.header.config.clone();
    config.model = ModelSpec::Cnn {
        image: [usize::MAX, 3, 3],
        channels: vec![4],
        outputs: 2,
        batch_norm: false,
        dropout: 0.0,
    };
    assert_eq!(config.model.inputs(), usize::MAX);
    assert!(ckpt.model_from::<f32>(&config).is_err());
}

/// Found by the audit (the fuzzer's inputs are too short to spell it): sizes written in a graph
/// file were trusted, so `broadcast_to` a [1000000, 1000000] shape from one number aborted on an
/// 8 TB allocation. The elements a file may produce are now capped by the data it holds.
#[test]
fn a_graph_file_cannot_declare_more_elements_than_its_data_allows() {
    let file = |shape: &str| {
        format!(
            r#"{{"format": "tapegrad-graph/1",
 "inputs": [{{"name": "x", "shape": [1], "data": [1], "requires_grad": true}}],
 "nodes": [{{"name": "b", "op": "broadcast_to", "args": ["x"], "attrs": {{"shape": {shape}}}}},
           {{"name": "s", "op": "sum", "args": ["b"]}}]}}"#
        )
    };
    let err = GraphFile::parse(&file("[1000000, 1000000]"))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("node 'b':")
            && err.contains("shape [1000000, 1000000]")
            && err.contains("at most 1048576"),
        "{err}"
    );
    // Within the budget the same file is fine, and its gradient is the element count.
    let ok = GraphFile::parse(&file("[1000, 1000]")).unwrap();
    let x = ok.inputs::<f64>().unwrap();
    let g = ok
        .graph
        .gradients(&x, ok.output, &ok.seed().unwrap(), Sweep::Reference)
        .unwrap();
    assert_eq!(g.grads[0].1.data(), &[1_000_000.0]);
    replay_graph_file(file("[1000000, 1000000]").as_bytes());
}

/// `bytes` (a checkpoint) with its metadata edited by `edit` and the checksum recomputed, as a
/// hand-edited file would be: the checksum guards against corruption, not against edits.
fn resealed(
    bytes: &[u8],
    edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> Vec<u8> {
    fn fnv(h: &mut u64, bytes: &[u8]) {
        for &b in bytes {
            *h ^= u64::from(b);
            *h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let data = &bytes[8 + n..];
    let mut header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut meta = header
        .remove("__metadata__")
        .unwrap()
        .as_object()
        .unwrap()
        .clone();
    edit(&mut meta);
    meta.remove("checksum");
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for (k, v) in &meta {
        fnv(&mut h, k.as_bytes());
        fnv(&mut h, &[0]);
        fnv(&mut h, v.as_str().unwrap().as_bytes());
        fnv(&mut h, &[0]);
    }
    // serde_json's map is sorted by key, as the checksum wants.
    for (name, t) in &header {
        fnv(&mut h, name.as_bytes());
        fnv(
            &mut h,
            t["dtype"].as_str().unwrap().to_lowercase().as_bytes(),
        );
        for d in t["shape"].as_array().unwrap() {
            fnv(&mut h, &d.as_u64().unwrap().to_le_bytes());
        }
        let at = |i: usize| t["data_offsets"][i].as_u64().unwrap() as usize;
        fnv(&mut h, &data[at(0)..at(1)]);
    }
    meta.insert("checksum".into(), format!("{h:016x}").into());
    header.insert("__metadata__".into(), meta.into());
    let mut text = serde_json::to_vec(&header).unwrap();
    while text.len() % 8 != 0 {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(data);
    out
}

/// Found by the audit: a checkpoint whose task lists fewer classes than the model has outputs
/// (or feature names other than its inputs) was accepted, and `tapegrad predict` then indexed
/// each output row by the class count and panicked. Reading now checks both against the model.
#[test]
fn a_checkpoint_task_must_match_its_model() {
    let dir = std::env::temp_dir().join(format!("tapegrad-fuzz-task-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("digits.safetensors");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tapegrad"))
        .args([
            "train", "digits", "--hidden", "4", "--steps", "1", "-q", "--save",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    // Resealing without an edit gives a file that still reads: the helper is right.
    let same = resealed(&bytes, |_| {});
    assert!(Checkpoint::from_bytes("same", &same).is_ok());
    let fewer_classes = resealed(&bytes, |meta| {
        meta.insert(
            "task".into(),
            r#"{"kind":"classification","classes":["a"]}"#.into(),
        );
    });
    let err = Checkpoint::from_bytes("edited", &fewer_classes)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("the task has 1 outputs") && err.contains("10 outputs"),
        "{err}"
    );
    let fewer_features = resealed(&bytes, |meta| {
        meta.insert("features".into(), r#"["x"]"#.into());
    });
    let err = Checkpoint::from_bytes("edited", &fewer_features)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("1 feature names") && err.contains("64 inputs"),
        "{err}"
    );
}
