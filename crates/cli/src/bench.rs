//! `tapegrad bench`: timing of whole workloads (an MLP training step, the tape-overhead chain, square
//! sgemm), reported as median and spread over repetitions, as a table or one JSON object per line.

use crate::error::{CliError, CliResult};
use clap::{Args, Subcommand, ValueEnum};
use rand::{Rng, SeedableRng};
use std::process::ExitCode;
use std::time::Instant;
use tapegrad_core::{Session, Shape, Tensor};
use tapegrad_tensor::kernels::{matmul, set_num_threads};

/// Arguments of `tapegrad bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub workload: Workload,
    /// Threads for the GEMM (1 = single-threaded everywhere).
    #[arg(long, global = true, default_value_t = 1)]
    pub threads: usize,
    /// Which engine runs the step.
    #[arg(long, global = true, value_enum, default_value_t = Backend::Eager)]
    pub backend: Backend,
    /// Print one JSON object per workload instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// Timed repetitions (after warm-up).
    #[arg(long, global = true, default_value_t = 30)]
    pub reps: usize,
}

/// The workloads.
#[derive(Debug, Subcommand)]
pub enum Workload {
    /// One training step of an MLP 784-256-128-10 (ReLU, softmax cross entropy, SGD), f32.
    Mlp {
        #[arg(long, default_value_t = 32)]
        batch: usize,
    },
    /// 1,000 x (x = x * 1.0001 + 0.0001) forward + backward, f32; reports time per recorded op.
    Chain {
        #[arg(long, default_value_t = 16)]
        numel: usize,
    },
    /// Square f32 matmul n x n x n.
    Matmul {
        #[arg(long, default_value_t = 512)]
        n: usize,
    },
}

/// Engines a step can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    Eager,
    Compiled,
}

/// Median and spread of a set of timings, in the unit they were given.
struct Stats {
    median: f64,
    min: f64,
    max: f64,
}

fn stats(mut xs: Vec<f64>) -> Stats {
    xs.sort_by(f64::total_cmp);
    Stats {
        median: xs[xs.len() / 2],
        min: xs[0],
        max: xs[xs.len() - 1],
    }
}

/// Times `f` `reps` times after `reps / 5 + 1` warm-up calls; returns seconds per call.
fn time_it(reps: usize, mut f: impl FnMut() -> Result<(), CliError>) -> Result<Vec<f64>, CliError> {
    for _ in 0..reps / 5 + 1 {
        f()?;
    }
    let mut out = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t0 = Instant::now();
        f()?;
        out.push(t0.elapsed().as_secs_f64());
    }
    Ok(out)
}

fn random(rng: &mut impl Rng, dims: &[usize], scale: f32) -> Result<Tensor<f32>, CliError> {
    let shape = Shape::new(dims)?;
    let data = (0..shape.numel())
        .map(|_| rng.random_range(-scale..scale))
        .collect();
    Ok(Tensor::from_shape(shape, data)?)
}

/// State of the MLP benchmark: parameters updated in place by SGD after each step.
struct Mlp {
    params: Vec<(String, Tensor<f32>)>,
    x: Tensor<f32>,
    labels: Vec<usize>,
    session: Session<f32>,
    saved_bytes: usize,
}

impl Mlp {
    fn new(batch: usize) -> Result<Mlp, CliError> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let sizes = [784usize, 256, 128, 10];
        let mut params = Vec::new();
        for (i, w) in sizes.windows(2).enumerate() {
            let bound = 1.0 / (w[0] as f32).sqrt();
            params.push((format!("w{i}"), random(&mut rng, &[w[1], w[0]], bound)?));
            params.push((format!("b{i}"), random(&mut rng, &[w[1]], bound)?));
        }
        let x = random(&mut rng, &[batch, 784], 1.0)?;
        let labels = (0..batch).map(|_| rng.random_range(0..10)).collect();
        Ok(Mlp {
            params,
            x,
            labels,
            session: Session::new(),
            saved_bytes: 0,
        })
    }

    fn step(&mut self) -> Result<(), CliError> {
        let s = &mut self.session;
        s.reset();
        let mut vars = Vec::with_capacity(self.params.len());
        for (name, p) in &self.params {
            vars.push(s.parameter(name.clone(), p.clone())?);
        }
        let mut h = s.input(self.x.clone());
        for layer in 0..3 {
            h = s.linear(h, vars[2 * layer], Some(vars[2 * layer + 1]))?;
            if layer < 2 {
                h = s.relu(h)?;
            }
        }
        let loss = s.cross_entropy(h, &self.labels)?;
        self.saved_bytes = s.tape().saved_bytes();
        let grads = s.backward(loss)?;
        // Drop the tape's references first so the parameter buffers are unshared and update in place.
        s.reset();
        let lr = 0.01f32;
        for ((_, p), (_, g)) in self.params.iter_mut().zip(grads.iter()) {
            for (w, &d) in p.data_mut().iter_mut().zip(g.data()) {
                *w -= lr * d;
            }
        }
        Ok(())
    }
}

fn chain_step(
    session: &mut Session<f32>,
    x0: &Tensor<f32>,
    bias: &Tensor<f32>,
) -> Result<(), CliError> {
    session.reset();
    let mut x = session.parameter("x", x0.clone())?;
    let c = session.constant(bias.clone());
    for _ in 0..1000 {
        let y = session.scale(x, 1.0001)?;
        x = session.add(y, c)?;
    }
    let seed = Tensor::full(session.value(x)?.shape(), 1.0);
    std::hint::black_box(session.backward_with(x, &seed)?);
    Ok(())
}

/// Runs `tapegrad bench`.
pub fn run(args: BenchArgs) -> CliResult {
    if args.reps == 0 {
        return Err(CliError::Usage("--reps must be at least 1".into()));
    }
    if args.threads == 0 {
        return Err(CliError::Usage("--threads must be at least 1".into()));
    }
    if args.backend == Backend::Compiled {
        return Err(CliError::Usage(
            "--backend compiled is not available in this build yet; use --backend eager".into(),
        ));
    }
    set_num_threads(args.threads);
    let backend = format!("{:?}", args.backend).to_lowercase();
    let (label, json, line) = match args.workload {
        Workload::Mlp { batch } => {
            if batch == 0 {
                return Err(CliError::Usage("--batch must be at least 1".into()));
            }
            let mut mlp = Mlp::new(batch)?;
            let st = stats(
                time_it(args.reps, || mlp.step())?
                    .into_iter()
                    .map(|s| s * 1e3)
                    .collect(),
            );
            (
                format!("mlp 784-256-128-10 batch {batch}"),
                serde_json::json!({"workload": "mlp", "batch": batch, "threads": args.threads, "backend": backend,
                    "ms_per_step": st.median, "ms_min": st.min, "ms_max": st.max, "saved_bytes": mlp.saved_bytes}),
                format!(
                    "{:.4} ms/step (min {:.4}, max {:.4}), {} bytes saved for backward",
                    st.median, st.min, st.max, mlp.saved_bytes
                ),
            )
        }
        Workload::Chain { numel } => {
            let x0 = Tensor::full(&Shape::new([numel])?, 1.0f32);
            let bias = Tensor::scalar(0.0001f32);
            let mut s = Session::new();
            let ops = 2000.0;
            let st = stats(
                time_it(args.reps, || chain_step(&mut s, &x0, &bias))?
                    .into_iter()
                    .map(|t| t * 1e6 / ops)
                    .collect(),
            );
            (
                format!("chain 1000 x (x * 1.0001 + 0.0001), numel {numel}"),
                serde_json::json!({"workload": "chain", "numel": numel, "threads": args.threads, "backend": backend,
                    "us_per_op": st.median, "us_min": st.min, "us_max": st.max}),
                format!(
                    "{:.1} ns/op (min {:.1}, max {:.1}), forward + backward",
                    st.median * 1e3,
                    st.min * 1e3,
                    st.max * 1e3
                ),
            )
        }
        Workload::Matmul { n } => {
            if n == 0 {
                return Err(CliError::Usage("--n must be at least 1".into()));
            }
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
            let a = random(&mut rng, &[n, n], 1.0)?;
            let b = random(&mut rng, &[n, n], 1.0)?;
            let flops = 2.0 * (n as f64).powi(3);
            let st = stats(
                time_it(args.reps, || {
                    std::hint::black_box(matmul(&a, &b)?);
                    Ok(())
                })?
                .into_iter()
                .map(|t| flops / t / 1e9)
                .collect(),
            );
            (
                format!("sgemm {n} x {n} x {n}"),
                serde_json::json!({"workload": "matmul", "n": n, "threads": args.threads,
                    "gflops": st.median, "gflops_min": st.min, "gflops_max": st.max}),
                format!(
                    "{:.1} GFLOP/s (min {:.1}, max {:.1})",
                    st.median, st.min, st.max
                ),
            )
        }
    };
    if args.json {
        println!("{json}");
    } else {
        println!(
            "{label:<48} threads {:<2} {backend:<8} {line}",
            args.threads
        );
    }
    Ok(ExitCode::SUCCESS)
}
