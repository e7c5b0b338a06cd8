//! GPT checkpoints: a saved run reads back with the same parameters, optimizer step and
//! vocabulary, and resaving it gives the same bytes; each checkpoint kind's reader refuses the
//! other kind with a message that says what the file is.

use tapegrad_nn::backend::{make_backend, BackendKind};
use tapegrad_nn::checkpoint::Checkpoint;
use tapegrad_nn::data::text::{TextData, TextSource};
use tapegrad_nn::gpt::checkpoint::{self, GptCheckpoint};
use tapegrad_nn::gpt::{GptConfig, GptRun};
use tapegrad_nn::ModelSpec;

fn trained_run() -> GptRun<f32> {
    let context = 6;
    let data = TextData::load(&TextSource::Shakespeare, context).unwrap();
    let spec = ModelSpec::Gpt {
        vocab: data.vocab.len(),
        context,
        layers: 1,
        heads: 2,
        embd: 8,
        mlp_ratio: 2,
        dropout: 0.0,
        tie_weights: false,
    };
    let mut config = GptConfig::preset(TextSource::Shakespeare, spec, 4, 3);
    config.val_windows = 2;
    let mut run = GptRun::new(config, data, make_backend(BackendKind::Eager).unwrap()).unwrap();
    for _ in 0..3 {
        run.train_step().unwrap();
    }
    run
}

#[test]
fn a_saved_gpt_reads_back_and_resaves_to_the_same_bytes() {
    let dir = std::env::temp_dir().join(format!("tapegrad-gpt-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (first, second) = (dir.join("a.st"), dir.join("b.st"));
    let run = trained_run();
    checkpoint::save(&first, &run).unwrap();

    let read = GptCheckpoint::read(&first).unwrap();
    assert_eq!(read.step, 3);
    assert_eq!(read.vocab, run.data.vocab);
    let model = read.model::<f32>().unwrap();
    for (saved, live) in model.params.iter().zip(run.model.params.iter()) {
        assert_eq!(saved.name, live.name);
        assert_eq!(saved.value.data(), live.value.data(), "{}", saved.name);
    }
    let resumed = read
        .resume::<f32>(make_backend(BackendKind::Eager).unwrap())
        .unwrap();
    checkpoint::save(&second, &resumed).unwrap();
    assert_eq!(
        std::fs::read(&first).unwrap(),
        std::fs::read(&second).unwrap()
    );

    // The tabular reader names what the file is instead of a missing field.
    let e = Checkpoint::read(&first)
        .err()
        .expect("a GPT file is not a tabular checkpoint");
    let message = e.to_string();
    assert!(message.contains("GPT checkpoint"), "{message}");
    assert!(message.contains("a.st"), "{message}");
    // And the GPT reader refuses a f64 request for f32 tensors, naming both.
    let e = read.model::<f64>().expect_err("dtype differs");
    assert!(
        e.to_string().contains("f32") && e.to_string().contains("f64"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
