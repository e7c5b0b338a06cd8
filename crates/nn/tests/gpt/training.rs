//! A tiny GPT learns Shakespeare: within a few hundred steps its validation loss beats a bigram
//! model's on the same fixed windows (the bigram fitted on the training text, add-one smoothed).

use tapegrad_nn::backend::{make_backend, BackendKind};
use tapegrad_nn::data::text::{TextData, TextSource};
use tapegrad_nn::data::BatchTargets;
use tapegrad_nn::gpt::{GptConfig, GptRun};
use tapegrad_nn::ModelSpec;

#[test]
fn a_tiny_gpt_beats_the_bigram_model_on_held_out_text() {
    let context = 16;
    let data = TextData::load(&TextSource::Shakespeare, context).unwrap();
    let v = data.vocab.len();
    assert_eq!(v, 76);
    let mut counts = vec![1.0f64; v * v];
    for w in data.train.windows(2) {
        counts[w[0] as usize * v + w[1] as usize] += 1.0;
    }
    let spec = ModelSpec::Gpt {
        vocab: v,
        context,
        layers: 2,
        heads: 2,
        embd: 32,
        mlp_ratio: 4,
        dropout: 0.0,
        tie_weights: false,
    };
    let steps = 300;
    let mut config = GptConfig::preset(TextSource::Shakespeare, spec, 16, steps);
    if let tapegrad_nn::OptimizerConfig::AdamW { lr, .. } = &mut config.optimizer {
        *lr = 6e-3;
    }
    let mut run = GptRun::<f32>::new(
        config,
        data.clone(),
        make_backend(BackendKind::Eager).unwrap(),
    )
    .unwrap();
    // The bigram's loss on the run's validation windows.
    let (mut nll, mut n) = (0.0, 0usize);
    for b in data.val_batches::<f32>(256, 16, context).unwrap() {
        let BatchTargets::Classes(y) = &b.y else {
            unreachable!()
        };
        for (x, &y) in b.x.data().iter().zip(y) {
            let row = &counts[*x as usize * v..(*x as usize + 1) * v];
            nll -= (row[y] / row.iter().sum::<f64>()).ln();
            n += 1;
        }
    }
    let bigram = nll / n as f64;
    let before = run.evaluate().unwrap();
    assert!((before - (v as f64).ln()).abs() < 0.1, "{before}");
    for _ in 0..steps {
        run.train_step().unwrap();
    }
    let after = run.evaluate().unwrap();
    assert!(
        after < bigram,
        "after {steps} steps the validation loss is {after}, the bigram's {bigram}"
    );
}
