//! Gradient accumulation (`TrainConfig::accumulate`): K = 1 is today's run, unchanged in its bits
//! and in its checkpoint bytes; K > 1 equals a hand-rolled sum of the micro-batches' gradients
//! (scaled once) for an MLP with dropout and a CNN with batch norm, on both backends; and a run
//! whose micro-batches are computed by separate "ranks" (threads behind an in-memory `Exchange`)
//! gives the bits of the one-process run, which is law 10 without MPI, whatever the buckets the
//! gradients are exchanged in (handed over as the backward makes them final).

use std::sync::{Arc, Barrier, Mutex};
use tapegrad_nn::checkpoint;
use tapegrad_nn::data::{DataSource, Prepared};
use tapegrad_nn::layers::Activation;
use tapegrad_nn::rng::dropout_micro_rng;
use tapegrad_nn::trainer::{micro_batches, Exchange};
use tapegrad_nn::{
    make_backend, BackendKind, Grad, ModelSpec, NnResult, OptimizerConfig, Schedule, TrainConfig,
    Trainer,
};
use tapegrad_tensor::{Scalar, Tensor};

fn mlp(k: usize, batch: usize) -> TrainConfig {
    TrainConfig {
        preset: "test".into(),
        data: DataSource::Digits,
        model: ModelSpec::Mlp {
            inputs: 64,
            hidden: vec![16],
            outputs: 10,
            activation: Activation::Relu,
            dropout: 0.3,
        },
        optimizer: OptimizerConfig::by_name("adam", 1e-2).unwrap(),
        schedule: Schedule::default(),
        clip_norm: None,
        batch_size: batch,
        val_fraction: 0.2,
        seed: 7,
        label_smoothing: 0.0,
        accumulate: k,
    }
}

fn cnn(k: usize, batch: usize) -> TrainConfig {
    TrainConfig {
        model: ModelSpec::Cnn {
            image: [1, 8, 8],
            channels: vec![4, 8],
            outputs: 10,
            batch_norm: true,
            dropout: 0.2,
        },
        clip_norm: Some(0.5),
        ..mlp(k, batch)
    }
}

fn trainer<S: Scalar>(cfg: &TrainConfig, kind: BackendKind) -> Trainer<S> {
    let data = Prepared::<S>::new(&cfg.data.load().unwrap(), cfg.val_fraction, cfg.seed).unwrap();
    Trainer::new(cfg.clone(), data, make_backend::<S>(kind).unwrap()).unwrap()
}

fn bits<S: Scalar>(t: &Trainer<S>) -> Vec<(String, Vec<u64>)> {
    t.model
        .params
        .iter()
        .map(|p| {
            let b = p.value.data().iter().map(|v| v.to_f64().to_bits());
            (p.name.clone(), b.collect())
        })
        .collect()
}

/// One step of `t` (whose config says K = 1) done by hand as K micro-batches: each micro-batch's
/// gradient and buffer updates weighted by `K m_k / n`, summed in order, divided by K once.
fn hand_rolled_step<S: Scalar>(t: &mut Trainer<S>, k: usize, kind: BackendKind) {
    let rows = t.order.next_batch();
    let n = rows.len();
    let mut backend = make_backend::<S>(kind).unwrap();
    let mut grads: Option<Vec<Vec<S>>> = None;
    let mut buffers: Option<Vec<(tapegrad_nn::ParamId, Vec<S>)>> = None;
    for (i, r) in micro_batches(n, k).into_iter().enumerate() {
        if r.is_empty() {
            continue;
        }
        let c = S::from_f64(k as f64 * r.len() as f64 / n as f64);
        let batch = t.data.train.batch(&rows[r]).unwrap();
        let rng = dropout_micro_rng(t.config.seed, t.step, i as u64);
        let out = backend.train_step(&t.model, &batch, rng).unwrap();
        let g: Vec<Vec<S>> = Grad::all_dense(out.grads)
            .unwrap()
            .iter()
            .map(|g| g.data().iter().map(|&v| c * v).collect())
            .collect();
        let u: Vec<_> = out
            .updates
            .iter()
            .map(|(id, v)| (*id, v.data().iter().map(|&x| c * x).collect::<Vec<S>>()))
            .collect();
        match (&mut grads, &mut buffers) {
            (Some(acc), Some(bacc)) => {
                for (a, g) in acc.iter_mut().zip(&g) {
                    a.iter_mut().zip(g).for_each(|(a, &g)| *a += g);
                }
                for ((_, a), (_, u)) in bacc.iter_mut().zip(&u) {
                    a.iter_mut().zip(u).for_each(|(a, &u)| *a += u);
                }
            }
            _ => {
                grads = Some(g);
                buffers = Some(u);
            }
        }
    }
    let kk = S::from_usize(k);
    let shapes: Vec<Vec<usize>> = t
        .model
        .params
        .trainable()
        .map(|p| p.value.dims().to_vec())
        .collect();
    let mut dense: Vec<Tensor<S>> = grads
        .unwrap()
        .into_iter()
        .zip(&shapes)
        .map(|(g, s)| Tensor::new(s, g.into_iter().map(|v| v / kk).collect()).unwrap())
        .collect();
    if let Some(max) = t.config.clip_norm {
        tapegrad_nn::clip::clip_grad_norm(&mut dense, max).unwrap();
    }
    let lr = t.current_lr();
    t.optimizer.step(&mut t.model.params, &dense, lr).unwrap();
    for (id, u) in buffers.unwrap() {
        let dims = t.model.params.get(id).value.dims().to_vec();
        let v = Tensor::new(&dims, u.into_iter().map(|v| v / kk).collect()).unwrap();
        t.model.params.set(id, v).unwrap();
    }
    t.step += 1;
}

fn check_against_hand_rolled<S: Scalar>(cfg: TrainConfig, kind: BackendKind, steps: usize) {
    let k = cfg.accumulate;
    let mut acc = trainer::<S>(&cfg, kind);
    let mut manual = trainer::<S>(
        &TrainConfig {
            accumulate: 1,
            ..cfg
        },
        kind,
    );
    for s in 0..steps {
        acc.train_step().unwrap();
        hand_rolled_step(&mut manual, k, kind);
        assert_eq!(
            bits(&acc),
            bits(&manual),
            "K = {k}, {kind:?}, step {}",
            s + 1
        );
    }
}

#[test]
fn two_micro_batches_equal_the_hand_rolled_sum_mlp_with_dropout() {
    check_against_hand_rolled::<f32>(mlp(2, 32), BackendKind::Eager, 3);
    check_against_hand_rolled::<f64>(mlp(2, 32), BackendKind::Compiled, 2);
}

#[test]
fn two_micro_batches_equal_the_hand_rolled_sum_cnn_with_batch_norm() {
    check_against_hand_rolled::<f32>(cnn(2, 16), BackendKind::Eager, 2);
}

#[test]
fn uneven_micro_batches_are_weighted_by_their_rows() {
    // 10 rows in 3 micro-batches of 4, 3 and 3 rows.
    check_against_hand_rolled::<f64>(mlp(3, 10), BackendKind::Eager, 2);
}

#[test]
fn eager_and_compiled_accumulate_to_the_same_bits() {
    let mut e = trainer::<f32>(&cnn(3, 12), BackendKind::Eager);
    let mut c = trainer::<f32>(&cnn(3, 12), BackendKind::Compiled);
    for _ in 0..3 {
        let (re, rc) = (e.train_step().unwrap(), c.train_step().unwrap());
        assert_eq!(re.loss.to_bits(), rc.loss.to_bits());
    }
    assert_eq!(bits(&e), bits(&c));
}

#[test]
fn k_of_one_is_not_written_and_old_configs_load_with_k_one() {
    let cfg = mlp(1, 32);
    let json = serde_json::to_string(&cfg).unwrap();
    assert!(!json.contains("accumulate"), "{json}");
    let back: TrainConfig = serde_json::from_str(&json).unwrap();
    assert_eq!(back.accumulate, 1);
    let four = serde_json::to_string(&mlp(4, 32)).unwrap();
    assert!(four.contains("\"accumulate\":4"), "{four}");
}

#[test]
fn k_of_one_checkpoint_has_todays_bytes() {
    // The same run with the field at its default: identical checkpoint bytes.
    let dir = std::env::temp_dir().join(format!("tapegrad-acc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut t = trainer::<f32>(&mlp(1, 32), BackendKind::Eager);
    t.train_step().unwrap();
    let path = dir.join("k1.safetensors");
    checkpoint::save(&path, &t).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert!(!String::from_utf8_lossy(&bytes).contains("accumulate"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn k_must_fit_the_batch() {
    let cfg = mlp(33, 32);
    let data = Prepared::<f32>::new(&cfg.data.load().unwrap(), 0.2, 7).unwrap();
    let e = Trainer::new(cfg, data, make_backend(BackendKind::Eager).unwrap())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("--accumulate 33") && e.contains("(32)"), "{e}");
}

#[test]
fn resuming_an_accumulated_run_gives_the_uninterrupted_bits() {
    let cfg = cnn(2, 16);
    let mut straight = trainer::<f32>(&cfg, BackendKind::Eager);
    for _ in 0..4 {
        straight.train_step().unwrap();
    }
    let dir = std::env::temp_dir().join(format!("tapegrad-acc-resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("k2.safetensors");
    let mut first = trainer::<f32>(&cfg, BackendKind::Eager);
    first.train_step().unwrap();
    first.train_step().unwrap();
    checkpoint::save(&path, &first).unwrap();
    let ckpt = checkpoint::Checkpoint::read(&path).unwrap();
    assert_eq!(ckpt.header.config.accumulate, 2);
    let mut resumed = ckpt
        .resume::<f32>(make_backend(BackendKind::Eager).unwrap())
        .unwrap();
    resumed.train_step().unwrap();
    resumed.train_step().unwrap();
    assert_eq!(bits(&resumed), bits(&straight));
    std::fs::remove_dir_all(&dir).ok();
}

/// Ranks as threads: each writes its buffer into its slot, and all read every slot.
struct Threads {
    rank: usize,
    size: usize,
    slots: Arc<Mutex<Vec<Vec<f64>>>>,
    barrier: Arc<Barrier>,
    bucket_bytes: usize,
}

impl Threads {
    fn gather(&mut self, local: Vec<f64>) -> Vec<f64> {
        self.slots.lock().unwrap()[self.rank] = local;
        self.barrier.wait();
        let all = self.slots.lock().unwrap().concat();
        self.barrier.wait();
        all
    }
}

impl Exchange for Threads {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn all_gather_f64(&mut self, local: &[f64]) -> NnResult<Vec<f64>> {
        Ok(self.gather(local.to_vec()))
    }
    fn all_gather_f32(&mut self, local: &[f32]) -> NnResult<Vec<f32>> {
        let all = self.gather(local.iter().map(|&v| f64::from(v)).collect());
        Ok(all.into_iter().map(|v| v as f32).collect())
    }
    fn bucket_bytes(&self) -> usize {
        self.bucket_bytes
    }
}

/// Runs `steps` steps of `cfg` on `size` thread-ranks of `kind`, exchanging gradients in buckets
/// of `bucket_bytes`; returns each rank's parameter bits.
fn run_ranks(
    cfg: &TrainConfig,
    size: usize,
    steps: usize,
    kind: BackendKind,
    bucket_bytes: usize,
) -> Vec<Vec<(String, Vec<u64>)>> {
    let slots = Arc::new(Mutex::new(vec![Vec::new(); size]));
    let barrier = Arc::new(Barrier::new(size));
    let handles: Vec<_> = (0..size)
        .map(|rank| {
            let cfg = cfg.clone();
            let ex = Threads {
                rank,
                size,
                slots: slots.clone(),
                barrier: barrier.clone(),
                bucket_bytes,
            };
            std::thread::spawn(move || {
                let mut t = trainer::<f32>(&cfg, kind);
                t.set_exchange(Box::new(ex)).unwrap();
                for _ in 0..steps {
                    t.train_step().unwrap();
                }
                bits(&t)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn ranks_behind_an_exchange_equal_one_process() {
    for kind in [BackendKind::Eager, BackendKind::Compiled] {
        for (cfg, size) in [(cnn(3, 16), 3), (mlp(2, 32), 2)] {
            let mut one = trainer::<f32>(&cfg, kind);
            for _ in 0..3 {
                one.train_step().unwrap();
            }
            // One bucket; buckets of one tensor each (the smallest hold 4 values).
            for bucket_bytes in [usize::MAX, 16] {
                for (rank, b) in run_ranks(&cfg, size, 3, kind, bucket_bytes)
                    .iter()
                    .enumerate()
                {
                    assert_eq!(
                        b,
                        &bits(&one),
                        "{kind:?}, rank {rank} of {size}, buckets of {bucket_bytes} bytes"
                    );
                }
            }
        }
    }
}

#[test]
fn ranks_that_disagree_are_told_which_part_differs() {
    let slots = Arc::new(Mutex::new(vec![Vec::new(); 2]));
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let ex = Threads {
                rank,
                size: 2,
                slots: slots.clone(),
                barrier: barrier.clone(),
                bucket_bytes: usize::MAX,
            };
            std::thread::spawn(move || {
                // Rank 1 holds other data: a different split of the same table.
                let cfg = mlp(2, 32);
                let data = Prepared::<f32>::new(
                    &cfg.data.load().unwrap(),
                    if rank == 0 { 0.2 } else { 0.25 },
                    7,
                )
                .unwrap();
                let mut t =
                    Trainer::new(cfg, data, make_backend(BackendKind::Eager).unwrap()).unwrap();
                t.set_exchange(Box::new(ex)).err().unwrap().to_string()
            })
        })
        .collect();
    for h in handles {
        let e = h.join().unwrap();
        assert!(e.contains("rank 1's data differ from rank 0's"), "{e}");
    }
}
