//! `--accumulate K` on the GPT is the defined sum: a step's windows cut by `micro_batches`
//! (uneven here: 7 windows in 3 micro-batches of 3, 2 and 2), each micro-batch's mean-loss
//! gradient weighted by `K m_k / n`, added left to right, divided by K once, micro-batch k's
//! dropout from `dropout_micro_rng(seed, t, k)`; then clipping and AdamW as one step. Checked bit
//! for bit against that sum written out here, on both backends, with dropout on. And law 10 with
//! ranks as threads (a fake `Exchange`, small buckets): N ranks give the bits of `--accumulate N`.

use tapegrad_core::Tensor;
use tapegrad_nn::backend::{make_backend, BackendKind};
use tapegrad_nn::clip::clip_grad_norm;
use tapegrad_nn::data::text::{TextData, TextSource};
use tapegrad_nn::data::{Batch, BatchTargets};
use tapegrad_nn::exchange::Exchange;
use tapegrad_nn::gpt::{GptConfig, GptRun};
use tapegrad_nn::rng::dropout_micro_rng;
use tapegrad_nn::trainer::micro_batches;
use tapegrad_nn::ModelSpec;

const CONTEXT: usize = 8;

fn run(kind: BackendKind, k: usize) -> GptRun<f64> {
    let data = TextData::load(&TextSource::Shakespeare, CONTEXT).unwrap();
    let spec = ModelSpec::Gpt {
        vocab: data.vocab.len(),
        context: CONTEXT,
        layers: 1,
        heads: 2,
        embd: 8,
        mlp_ratio: 4,
        dropout: 0.1,
        tie_weights: false,
    };
    let mut config = GptConfig::preset(TextSource::Shakespeare, spec, 7, 10);
    config.seed = 5;
    config.accumulate = k;
    config.val_windows = 4;
    GptRun::new(config, data, make_backend(kind).unwrap()).unwrap()
}

fn sub(b: &Batch<f64>, rows: std::ops::Range<usize>) -> Batch<f64> {
    let BatchTargets::Classes(y) = &b.y else {
        unreachable!()
    };
    let (s, e) = (rows.start * CONTEXT, rows.end * CONTEXT);
    Batch {
        x: Tensor::new(&[rows.len(), CONTEXT], b.x.data()[s..e].to_vec()).unwrap(),
        y: BatchTargets::Classes(y[s..e].to_vec()),
    }
}

fn bits(t: &Tensor<f64>) -> Vec<u64> {
    t.data().iter().map(|v| v.to_bits()).collect()
}

#[test]
fn accumulate_k_is_the_defined_sum_bit_for_bit() {
    let k = 3;
    for kind in [BackendKind::Eager, BackendKind::Compiled] {
        let mut r = run(kind, k);
        // Two steps: the second starts from moved parameters and AdamW's state.
        for _ in 0..2 {
            let mut model = r.model.clone();
            let mut optimizer = r.optimizer.clone();
            let (seed, step) = (r.config.seed, r.step);
            let batch = r.next_batch().unwrap();
            let lr = r.current_lr();
            let rec = r.train_step().unwrap();

            let n = batch.x.dims()[0];
            let parts = micro_batches(n, k);
            assert_eq!(parts, vec![0..3, 3..5, 5..7]);
            let mut backend = make_backend::<f64>(BackendKind::Eager).unwrap();
            let mut acc: Option<Vec<Tensor<f64>>> = None;
            let mut loss = 0.0;
            for (i, rows) in parts.into_iter().enumerate() {
                let c = (k * rows.len()) as f64 / n as f64;
                let out = backend
                    .train_step(
                        &model,
                        &sub(&batch, rows),
                        dropout_micro_rng(seed, step, i as u64),
                    )
                    .unwrap();
                loss += c * out.loss;
                let g: Vec<Tensor<f64>> = out
                    .grads
                    .into_iter()
                    .map(|g| g.into_dense().unwrap())
                    .collect();
                acc = Some(match acc {
                    None => g.iter().map(|t| t.map(|v| c * v)).collect(),
                    Some(a) => a
                        .iter()
                        .zip(&g)
                        .map(|(a, t)| {
                            let v = a.data().iter().zip(t.data()).map(|(x, y)| x + c * y);
                            Tensor::new(a.dims(), v.collect()).unwrap()
                        })
                        .collect(),
                });
            }
            let mut grads: Vec<Tensor<f64>> = acc
                .unwrap()
                .iter()
                .map(|t| t.map(|v| v / k as f64))
                .collect();
            assert_eq!((loss / k as f64).to_bits(), rec.loss.to_bits(), "{kind:?}");
            clip_grad_norm(&mut grads, 1.0).unwrap();
            optimizer.step(&mut model.params, &grads, lr).unwrap();
            for (a, b) in model.params.iter().zip(r.model.params.iter()) {
                assert_eq!(bits(&a.value), bits(&b.value), "{kind:?} {}", a.name);
            }
        }
    }
}

#[test]
fn accumulate_one_is_the_plain_step_and_k_needs_a_window_each() {
    let mut a = run(BackendKind::Eager, 1);
    a.train_step().unwrap();
    // The plain step's windows in one micro-batch, with the plain dropout stream.
    let mut b = run(BackendKind::Eager, 7);
    b.train_step().unwrap();
    assert_ne!(
        a.model.params, b.model.params,
        "seven micro-batches round and draw dropout otherwise"
    );
    let data = TextData::load(&TextSource::Shakespeare, CONTEXT).unwrap();
    let mut config = a.config.clone();
    config.accumulate = 8;
    let e = GptRun::<f64>::new(config, data, make_backend(BackendKind::Eager).unwrap())
        .err()
        .unwrap();
    assert!(e.to_string().contains("--accumulate 8 needs 1 to 7"), "{e}");
}

/// An all-gather between threads: each rank leaves its buffer in its slot, and reads all of
/// them once every rank has; small buckets, so a step's gradients go in several.
struct Threads {
    rank: usize,
    shared: std::sync::Arc<(std::sync::Barrier, std::sync::Mutex<Vec<Vec<f64>>>)>,
}

impl Exchange for Threads {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.shared.1.lock().unwrap().len()
    }
    fn all_gather_f64(&mut self, local: &[f64]) -> tapegrad_nn::NnResult<Vec<f64>> {
        let (barrier, slots) = &*self.shared;
        slots.lock().unwrap()[self.rank] = local.to_vec();
        barrier.wait();
        let all = slots.lock().unwrap().concat();
        barrier.wait();
        Ok(all)
    }
    fn all_gather_f32(&mut self, local: &[f32]) -> tapegrad_nn::NnResult<Vec<f32>> {
        let wide: Vec<f64> = local.iter().map(|&v| f64::from(v)).collect();
        Ok(self
            .all_gather_f64(&wide)?
            .into_iter()
            .map(|v| v as f32)
            .collect())
    }
    fn bucket_bytes(&self) -> usize {
        512
    }
}

/// `n` ranks (threads) taking `steps` steps of `run(kind, n)` with `change` applied to rank 1's
/// config: each rank's parameter bits, or its error.
fn on_ranks(
    kind: BackendKind,
    n: usize,
    steps: usize,
    change: fn(&mut GptRun<f64>),
) -> Vec<Result<Vec<Vec<u64>>, String>> {
    let shared = std::sync::Arc::new((
        std::sync::Barrier::new(n),
        std::sync::Mutex::new(vec![Vec::new(); n]),
    ));
    let ranks: Vec<_> = (0..n)
        .map(|rank| {
            let shared = shared.clone();
            std::thread::spawn(move || {
                let mut r = run(kind, n);
                if rank == 1 {
                    change(&mut r);
                }
                r.set_exchange(Box::new(Threads { rank, shared }))
                    .map_err(|e| e.to_string())?;
                for _ in 0..steps {
                    r.train_step().map_err(|e| e.to_string())?;
                }
                r.finish_exchange();
                Ok(r.model.params.iter().map(|p| bits(&p.value)).collect())
            })
        })
        .collect();
    ranks.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn ranks_as_threads_give_the_bits_of_accumulate_n() {
    for kind in [BackendKind::Eager, BackendKind::Compiled] {
        for n in [2, 3] {
            let mut one = run(kind, n);
            for _ in 0..2 {
                one.train_step().unwrap();
            }
            let want: Vec<Vec<u64>> = one.model.params.iter().map(|p| bits(&p.value)).collect();
            for (rank, got) in on_ranks(kind, n, 2, |_| {}).into_iter().enumerate() {
                assert!(got.unwrap() == want, "{kind:?}, rank {rank} of {n}");
            }
        }
    }
}

#[test]
fn a_rank_with_another_config_is_an_error_on_every_rank() {
    let got = on_ranks(BackendKind::Eager, 2, 1, |r| r.config.seed += 1);
    for (rank, e) in got.into_iter().enumerate() {
        let e = e.err().unwrap();
        assert!(
            e.contains("rank 1's configuration differs from rank 0's")
                && e.contains(&format!("seen on rank {rank}")),
            "{e}"
        );
    }
}
