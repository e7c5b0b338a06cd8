//! Paired A/B timing of the eager and compiled backends on one MLP 784-256-128-10 training step
//! with plain SGD and factored gradients (the step `tapegrad bench mlp` times), in ONE process,
//! alternating steps E C C E ... so both backends see the same machine phases. Reports each
//! backend's median, 10th percentile and best rep, and the paired ratio (median over pairs of
//! t_compiled / t_eager), for the whole step, for `train_step` (forward + loss + backward) and for
//! `Optimizer::step_grads` (the update).
//!
//! By default both backends step ONE model, batch and optimizer (the backends agree bit for bit,
//! so this is the run either would make alone): the parameters, the batch and the optimizer
//! then sit at the same addresses for both, and only the backends' own buffers differ. With
//! `--models separate` each backend steps its own copy, as two processes would; the copies'
//! placement then differs (the first copy's big weight is mmapped, the second's is on the heap),
//! and `--sides eager,eager` shows what that placement alone costs. Before timing, one step of
//! each backend from the same state is checked to give the same loss and gradients, bit for bit.
//!
//! `cargo run --release -p tapegrad-nn --example backend_ab -- --batch 1 [--pairs N]
//! [--threads T] [--models shared|separate] [--sides KIND,KIND] [--only eager|compiled]` (`--only`
//! steps one backend alone, for profilers and for comparing processes). The batch's placement
//! once moved the whole step by several percent (a `--batch-align` probe put it off a 64-byte
//! boundary); every tensor buffer now starts on one, so there is no placement left to probe.

use std::hint::black_box;
use std::time::Instant;
// What a step trains: the workload `tapegrad bench mlp` times.
use tapegrad_nn::benchmarking::MlpStep as State;
use tapegrad_nn::{make_backend, Backend, BackendKind, Grad, NnResult};
use tapegrad_tensor::kernels::set_num_threads;
use tapegrad_tensor::{pool, Tensor};

/// A phase's name and its time from a step's (train_step, update) times.
type Phase = (&'static str, fn(&(f64, f64)) -> f64);

/// One backend and the times of its steps.
struct Side {
    backend: Box<dyn Backend<f32>>,
    /// Per timed step: (train_step seconds, update seconds).
    times: Vec<(f64, f64)>,
    /// Pooled-size allocations (pool misses) over the timed steps.
    pool_misses: u64,
}

impl Side {
    fn new(kind: BackendKind) -> NnResult<Side> {
        let mut backend = make_backend(kind)?;
        // As the trainer does for plain SGD without clipping.
        backend.set_factored_grads(true);
        Ok(Side {
            backend,
            times: Vec::new(),
            pool_misses: 0,
        })
    }

    /// One step on `state`; records its two phases' times when `record`.
    fn step(&mut self, state: &mut State, record: bool) -> NnResult<()> {
        let misses = pool::stats::<f32>().allocated;
        let t0 = Instant::now();
        let out = self.backend.train_step(
            &state.model,
            &state.batch,
            tapegrad_nn::rng::dropout_rng(0, 0),
        )?;
        let t1 = Instant::now();
        black_box(out.loss);
        state
            .optimizer
            .step_grads(&mut state.model.params, out.grads, 0.01)?;
        let t2 = Instant::now();
        drop(black_box(out.outputs));
        if record {
            self.times
                .push(((t1 - t0).as_secs_f64(), (t2 - t1).as_secs_f64()));
            self.pool_misses += pool::stats::<f32>().allocated - misses;
        }
        Ok(())
    }
}

/// Whether both backends make the same loss and gradients, bit for bit, from `state`.
fn same_step(a: &mut Side, b: &mut Side, state: &State) -> NnResult<bool> {
    let run = |side: &mut Side| -> NnResult<(u64, Vec<Tensor<f32>>)> {
        let out = side.backend.train_step(
            &state.model,
            &state.batch,
            tapegrad_nn::rng::dropout_rng(0, 0),
        )?;
        Ok((out.loss.to_bits(), Grad::all_dense(out.grads)?))
    };
    let (la, ga) = run(a)?;
    let (lb, gb) = run(b)?;
    let bits = |g: &[Tensor<f32>]| -> Vec<u32> {
        g.iter()
            .flat_map(|t| t.data().iter().map(|v| v.to_bits()))
            .collect()
    };
    Ok(la == lb && bits(&ga) == bits(&gb))
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// The `q` quantile of sorted `v` (nearest rank).
fn quantile(v: &[f64], q: f64) -> f64 {
    v[((v.len() - 1) as f64 * q).round() as usize]
}

struct Args {
    batch: usize,
    pairs: Option<usize>,
    threads: usize,
    separate: bool,
    sides: (BackendKind, BackendKind),
    only: Option<BackendKind>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        batch: 1,
        pairs: None,
        threads: 1,
        separate: false,
        sides: (BackendKind::Eager, BackendKind::Compiled),
        only: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<usize>()
                .map_err(|e| format!("{flag} {value}: {e}"))
        };
        match flag.as_str() {
            "--batch" => args.batch = number()?,
            "--pairs" => args.pairs = Some(number()?),
            "--threads" => args.threads = number()?,
            "--models" => {
                args.separate = match value.as_str() {
                    "shared" => false,
                    "separate" => true,
                    _ => return Err(format!("--models {value}: expected shared or separate")),
                }
            }
            "--sides" => {
                let (a, b) = value
                    .split_once(',')
                    .ok_or(format!("--sides {value}: expected KIND,KIND"))?;
                args.sides = (a.parse()?, b.parse()?);
            }
            "--only" => args.only = Some(value.parse()?),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.batch == 0 || args.threads == 0 {
        return Err("--batch and --threads must be at least 1".into());
    }
    Ok(args)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse()?;
    set_num_threads(args.threads);
    // About a second of each backend's steps at batch 1, fewer pairs for big batches.
    let pairs = args
        .pairs
        .unwrap_or_else(|| (20_000 / args.batch).clamp(200, 10_000));
    if let Some(kind) = args.only {
        let mut state = State::new(args.batch)?;
        let mut side = Side::new(kind)?;
        for _ in 0..3 {
            side.step(&mut state, false)?;
        }
        for _ in 0..pairs {
            side.step(&mut state, true)?;
        }
        let total = sorted(side.times.iter().map(|t| (t.0 + t.1) * 1e6).collect());
        let update = sorted(side.times.iter().map(|t| t.1 * 1e6).collect());
        println!(
            "{} alone, {pairs} steps: median {:.2} us, best {:.2} us (update: median {:.2}, best {:.2}); first weight at {:?}, batch at {:?}",
            kind.name(),
            quantile(&total, 0.5),
            total[0],
            quantile(&update, 0.5),
            update[0],
            state.model.params.iter().next().map(|p| p.value.data().as_ptr()),
            state.batch.x.data().as_ptr(),
        );
        return Ok(());
    }
    let mut states = vec![State::new(args.batch)?];
    if args.separate {
        states.push(State::new(args.batch)?);
    }
    let mut sides = [Side::new(args.sides.0)?, Side::new(args.sides.1)?];
    let [a, b] = &mut sides;
    if !same_step(a, b, &states[0])? {
        return Err("the two backends' steps differ".into());
    }
    let last = states.len() - 1;
    let warmup = (pairs / 10).max(20);
    for k in 0..warmup + pairs {
        // E C C E: each side goes first in half the pairs.
        let order = if k % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            sides[i].step(&mut states[i.min(last)], k >= warmup)?;
        }
    }
    println!(
        "mlp 784-256-128-10, batch {}, {} thread(s), {} model(s), {pairs} pairs after {warmup} warm-up pairs; E = {}, C = {} (times in us)",
        args.batch,
        args.threads,
        if args.separate { "separate" } else { "one shared" },
        args.sides.0.name(),
        args.sides.1.name()
    );
    let phases: [Phase; 3] = [
        ("whole step", |t| t.0 + t.1),
        ("train_step (fwd+loss+bwd)", |t| t.0),
        ("step_grads (update)", |t| t.1),
    ];
    println!(
        "{:<26} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7}",
        "phase",
        "E median",
        "C median",
        "E p10",
        "C p10",
        "E best",
        "C best",
        "C/E med",
        "p25",
        "p75"
    );
    let [e_side, c_side] = &sides;
    for (name, f) in phases {
        let e: Vec<f64> = e_side.times.iter().map(|t| f(t) * 1e6).collect();
        let c: Vec<f64> = c_side.times.iter().map(|t| f(t) * 1e6).collect();
        let ratios = sorted(c.iter().zip(&e).map(|(c, e)| c / e).collect());
        let (e, c) = (sorted(e), sorted(c));
        println!(
            "{:<26} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>7.4} {:>7.4} {:>7.4}",
            name,
            quantile(&e, 0.5),
            quantile(&c, 0.5),
            quantile(&e, 0.1),
            quantile(&c, 0.1),
            e[0],
            c[0],
            quantile(&ratios, 0.5),
            quantile(&ratios, 0.25),
            quantile(&ratios, 0.75),
        );
    }
    println!(
        "pool misses per step: E {:.2}, C {:.2}; kept bytes: E {}, C {}",
        e_side.pool_misses as f64 / pairs as f64,
        c_side.pool_misses as f64 / pairs as f64,
        e_side.backend.kept_bytes(),
        c_side.backend.kept_bytes(),
    );
    Ok(())
}
