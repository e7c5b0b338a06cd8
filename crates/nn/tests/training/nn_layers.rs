//! The layers over the ops layer's neural-network ops: batch norm's running-statistics update
//! (PyTorch's formula), layer norm's normalisation, embedding lookups and their errors, and a CNN
//! with batch norm that trains deterministically and resumes bit for bit (buffers included).

use tapegrad_core::Session;
use tapegrad_nn::checkpoint::{self, Checkpoint};
use tapegrad_nn::data::{DataSource, Prepared};
use tapegrad_nn::layers::{BatchNorm2d, Builder, Ctx, Embedding, LayerNorm, Mode};
use tapegrad_nn::rng::{dropout_rng, init_rng};
use tapegrad_nn::{
    make_backend, BackendKind, ModelSpec, OptimizerConfig, ParamSet, Schedule, TrainConfig, Trainer,
};
use tapegrad_tensor::Tensor;

#[test]
fn batch_norm_updates_running_statistics_like_pytorch() {
    let mut params = ParamSet::<f64>::new();
    let mut rng = init_rng(0);
    let bn = BatchNorm2d::new(&mut Builder::new(&mut params, &mut rng), "bn", 2).unwrap();
    // N = 2, C = 2, H = 1, W = 2. Channel 0 holds 1, 2, 3, 4 (mean 2.5, unbiased var 5/3);
    // channel 1 holds 0, 0, 4, 8 (mean 3, unbiased var 44/3).
    let x = Tensor::from_f64(&[2, 2, 1, 2], &[1.0, 2.0, 0.0, 0.0, 3.0, 4.0, 4.0, 8.0]).unwrap();
    let mut s = Session::new();
    let mut ctx = Ctx::new(&mut s, &params, Mode::Train, dropout_rng(0, 0)).unwrap();
    let xv = ctx.session().input(x);
    let y = bn.forward(&mut ctx, xv).unwrap();
    // Channel 0 normalised with the biased variance 1.25.
    let y0 = ctx.session().value(y).unwrap().data()[0];
    assert!(
        (y0 - (1.0 - 2.5) / (1.25f64 + 1e-5).sqrt()).abs() < 1e-12,
        "{y0}"
    );
    let updates = ctx.into_updates();
    let by_name: Vec<(String, Vec<f64>)> = updates
        .iter()
        .map(|(id, t)| (params.get(*id).name.clone(), t.data().to_vec()))
        .collect();
    let expect = |name: &str| by_name.iter().find(|(n, _)| n == name).unwrap().1.clone();
    let rm = expect("bn.running_mean");
    let rv = expect("bn.running_var");
    // running = (1 - 0.1) * running + 0.1 * batch.
    assert!(
        (rm[0] - 0.25).abs() < 1e-15 && (rm[1] - 0.3).abs() < 1e-15,
        "{rm:?}"
    );
    assert!((rv[0] - (0.9 + 0.1 * 5.0 / 3.0)).abs() < 1e-15, "{rv:?}");
    assert!((rv[1] - (0.9 + 0.1 * 44.0 / 3.0)).abs() < 1e-14, "{rv:?}");
    assert_eq!(expect("bn.num_batches_tracked"), [1.0]);
}

#[test]
fn layer_norm_normalises_each_row() {
    let mut params = ParamSet::<f64>::new();
    let mut rng = init_rng(0);
    let ln = LayerNorm::new(&mut Builder::new(&mut params, &mut rng), "ln", &[4]).unwrap();
    let mut s = Session::new();
    let mut ctx = Ctx::new(&mut s, &params, Mode::Train, dropout_rng(0, 0)).unwrap();
    let x = ctx
        .session()
        .input(Tensor::from_f64(&[2, 4], &[1.0, 2.0, 3.0, 4.0, -3.0, 0.0, 3.0, 8.0]).unwrap());
    let y = ln.forward(&mut ctx, x).unwrap();
    let v = ctx.session().value(y).unwrap().data().to_vec();
    for row in v.chunks(4) {
        let mean = row.iter().sum::<f64>() / 4.0;
        let var = row.iter().map(|e| (e - mean) * (e - mean)).sum::<f64>() / 4.0;
        assert!(mean.abs() < 1e-12 && (var - 1.0).abs() < 1e-4, "{row:?}");
    }
}

#[test]
fn embedding_looks_up_rows_and_rejects_bad_indices() {
    let mut params = ParamSet::<f32>::new();
    let mut rng = init_rng(3);
    let emb = Embedding::new(&mut Builder::new(&mut params, &mut rng), "emb", 5, 3).unwrap();
    let table = params.iter().next().unwrap().value.data().to_vec();
    let mut s = Session::new();
    let mut ctx = Ctx::new(&mut s, &params, Mode::Train, dropout_rng(0, 0)).unwrap();
    let x = ctx
        .session()
        .input(Tensor::from_f64(&[2], &[4.0, 1.0]).unwrap());
    let y = emb.forward(&mut ctx, x).unwrap();
    let v = ctx.session().value(y).unwrap();
    assert_eq!(v.dims(), &[2, 3]);
    assert_eq!(&v.data()[..3], &table[12..15]);
    assert_eq!(&v.data()[3..], &table[3..6]);
    for bad in [5.0, 1.5, -1.0] {
        let x = ctx.session().input(Tensor::from_f64(&[1], &[bad]).unwrap());
        let e = emb.forward(&mut ctx, x).unwrap_err().to_string();
        assert!(
            e.contains("embedding") && e.contains("not an index in 0..5"),
            "{e}"
        );
    }
}

fn cnn_config(seed: u64) -> TrainConfig {
    TrainConfig {
        preset: "digits".into(),
        data: DataSource::Digits,
        model: ModelSpec::Cnn {
            image: [1, 8, 8],
            channels: vec![4, 8],
            outputs: 10,
            batch_norm: true,
            dropout: 0.2,
        },
        optimizer: OptimizerConfig::by_name("adam", 1e-3).unwrap(),
        schedule: Schedule::default(),
        clip_norm: None,
        batch_size: 64,
        val_fraction: 0.2,
        seed,
        label_smoothing: 0.0,
        accumulate: 1,
    }
}

fn cnn_trainer(cfg: &TrainConfig) -> Trainer<f32> {
    let data = Prepared::new(&cfg.data.load().unwrap(), cfg.val_fraction, cfg.seed).unwrap();
    Trainer::new(cfg.clone(), data, make_backend(BackendKind::Eager).unwrap()).unwrap()
}

#[test]
fn cnn_with_batch_norm_resumes_bit_for_bit() {
    let cfg = cnn_config(2);
    let mut first = cnn_trainer(&cfg);
    for _ in 0..6 {
        first.train_step().unwrap();
    }
    let dir = std::env::temp_dir().join(format!("tapegrad-cnn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cnn.safetensors");
    checkpoint::save(&path, &first).unwrap();
    let mut resumed: Trainer<f32> = Checkpoint::read(&path)
        .unwrap()
        .resume(make_backend(BackendKind::Eager).unwrap())
        .unwrap();
    let mut straight = cnn_trainer(&cfg);
    for _ in 0..6 {
        straight.train_step().unwrap();
    }
    for _ in 0..5 {
        resumed.train_step().unwrap();
        straight.train_step().unwrap();
    }
    assert_eq!(
        resumed.model.params, straight.model.params,
        "parameters and running statistics"
    );
    let tracked = straight.model.params.find("2.num_batches_tracked").unwrap();
    assert_eq!(straight.model.params.get(tracked).value.data(), &[11.0]);
    // Eval mode uses the running statistics and no dropout: two evaluations agree.
    let a = straight.evaluate(tapegrad_nn::Which::Validation).unwrap();
    let b = straight.evaluate(tapegrad_nn::Which::Validation).unwrap();
    assert_eq!(a, b);
    std::fs::remove_dir_all(dir).unwrap();
}
