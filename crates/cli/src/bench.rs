//! `tapegrad bench`: timing of whole workloads (an MLP training step on either backend, the
//! tape-overhead chain, square sgemm, a conv2d forward + backward, the GPT preset's training step
//! and its sampling with a key/value cache), reported as median and spread
//! (min, quartiles, max) over repetitions, as a table or one JSON object per workload; each report
//! names the vector instruction set the kernels dispatched to on this CPU, and `peak` measures
//! the machine's own FMA ceiling that the GFLOP/s figures are read against.

use crate::engine_flags::BackendArg;
use crate::error::{CliError, CliResult};
use clap::{Args, Subcommand};
use rand::{Rng, SeedableRng};
use std::process::ExitCode;
use std::time::Instant;
use tapegrad_core::ops::nn::Conv2d;
use tapegrad_core::{Session, Shape, Tensor};
use tapegrad_nn::benchmarking::MlpStep;
use tapegrad_nn::gpt::GptPreset;
use tapegrad_nn::{make_backend, Backend as StepBackend, BackendKind};
use tapegrad_tensor::benchmarking::fma_peak_gflops;
use tapegrad_tensor::kernels::{batched_matmul, matmul, simd_level};

mod generate;

/// Arguments of `tapegrad bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub workload: Workload,
    /// Threads for every kernel, GEMM included (1 = single-threaded everywhere).
    #[arg(long, global = true, default_value_t = 1)]
    pub threads: usize,
    /// Which engine runs the mlp and gpt steps (the other workloads have no compiled form).
    #[arg(long, global = true, value_enum, default_value_t = BackendArg::Eager)]
    pub backend: BackendArg,
    /// Print one JSON object per workload instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// Timed repetitions after warm-up; by default at least 50 and at least one second's worth.
    #[arg(long, global = true)]
    pub reps: Option<usize>,
}

/// The workloads.
#[derive(Debug, Subcommand)]
pub enum Workload {
    /// One training step of an MLP 784-256-128-10 (ReLU, softmax cross entropy, SGD lr 0.01 without
    /// momentum), f32.
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
    /// conv2d of a (32, 16, 28, 28) f32 input with 32 3x3 filters, padding 1, bias: forward and
    /// backward (input, weight, bias gradients), next to the same-shape GEMMs it is made of.
    /// `--stride 2` halves the image (14 x 14 outputs), as a ResNet-style downsampling.
    Conv {
        #[arg(long, default_value_t = 1)]
        stride: usize,
    },
    /// One training step of the `train gpt` preset's model (forward, backward, clipping and AdamW)
    /// on Shakespeare windows, f32; its shapes by default.
    Gpt {
        #[arg(long, default_value_t = GptPreset::SHAKESPEARE.batch_size)]
        batch: usize,
        #[command(flatten)]
        sizes: GptSizes,
    },
    /// Sampling `--tokens` characters from a one-character prompt with the preset's model (seeded
    /// weights, the embedded text's vocabulary) as `tapegrad generate` does: key/value cache,
    /// temperature 1, no top-k, a fixed seed, f32; the window slides past the context. Reports
    /// tokens/s of a whole run and `ms_per_step` per generated token.
    Generate {
        #[arg(long, default_value_t = 500)]
        tokens: usize,
        #[command(flatten)]
        sizes: GptSizes,
    },
    /// The f32 fused multiply-add peak of --threads cores at once (register-resident chains on
    /// the widest vector path this CPU has, the best of --reps rounds, 50,000 by default, in
    /// which every core runs one short burst together, timed from the first start to the last
    /// end: about half a second): the ceiling the other workloads' GFLOP/s are measured against.
    Peak,
}

/// Median and spread of a set of measurements, in the unit they were given.
struct Stats {
    median: f64,
    min: f64,
    q1: f64,
    q3: f64,
    max: f64,
    reps: usize,
}

impl Stats {
    fn of(mut xs: Vec<f64>) -> Stats {
        xs.sort_by(f64::total_cmp);
        let at = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
        Stats {
            median: at(0.5),
            min: xs[0],
            q1: at(0.25),
            q3: at(0.75),
            max: xs[xs.len() - 1],
            reps: xs.len(),
        }
    }

    /// The same measurements under `f` (monotone decreasing maps swap the ends).
    fn map(&self, f: impl Fn(f64) -> f64) -> Stats {
        Stats::of(vec![
            f(self.min),
            f(self.q1),
            f(self.median),
            f(self.q3),
            f(self.max),
        ])
        .with_reps(self.reps)
    }

    fn with_reps(mut self, reps: usize) -> Stats {
        self.reps = reps;
        self
    }

    /// JSON fields `{key}` (the median), `{unit}_min`, `_q1`, `_q3`, `_max`.
    fn json(&self, key: &str, unit: &str, obj: &mut serde_json::Map<String, serde_json::Value>) {
        obj.insert(key.into(), self.median.into());
        obj.insert(format!("{unit}_min"), self.min.into());
        obj.insert(format!("{unit}_q1"), self.q1.into());
        obj.insert(format!("{unit}_q3"), self.q3.into());
        obj.insert(format!("{unit}_max"), self.max.into());
        obj.insert("reps".into(), self.reps.into());
    }

    fn text(&self, unit: &str, digits: usize) -> String {
        format!(
            "{:.d$} {unit} (min {:.d$}, IQR {:.d$}-{:.d$}, max {:.d$}; {} reps)",
            self.median,
            self.min,
            self.q1,
            self.q3,
            self.max,
            self.reps,
            d = digits
        )
    }
}

/// Times `f` after warm-up; returns seconds per call. With no fixed count, repeats at least 50
/// times and until one second has passed (at most 5,000 times).
fn time_it(
    reps: Option<usize>,
    mut f: impl FnMut() -> Result<(), CliError>,
) -> Result<Vec<f64>, CliError> {
    let warm = Instant::now();
    let mut warmups = 0;
    while warmups < 3 || (warmups < reps.unwrap_or(50) / 5 && warm.elapsed().as_secs_f64() < 0.3) {
        f()?;
        warmups += 1;
    }
    let mut out = Vec::new();
    let start = Instant::now();
    loop {
        let t0 = Instant::now();
        f()?;
        out.push(t0.elapsed().as_secs_f64());
        let done = match reps {
            Some(n) => out.len() >= n,
            None => out.len() >= 5000 || (out.len() >= 50 && start.elapsed().as_secs_f64() >= 1.0),
        };
        if done {
            return Ok(out);
        }
    }
}

/// Refuses a workload whose buffers this machine cannot hold, before any is allocated: one
/// fallible reservation of about their total (freed at once), so that `--numel 100000000000000`
/// is an error naming the flag rather than an allocation abort part-way through.
fn ensure_memory(flag: &str, bytes: f64) -> Result<(), CliError> {
    let fits =
        bytes < isize::MAX as f64 && Vec::<u8>::new().try_reserve_exact(bytes as usize).is_ok();
    if fits {
        Ok(())
    } else {
        Err(CliError::Usage(format!(
            "{flag} needs about {:.3e} bytes of memory, more than this machine can allocate",
            bytes
        )))
    }
}

fn random(rng: &mut impl Rng, dims: &[usize], scale: f32) -> Result<Tensor<f32>, CliError> {
    let shape = Shape::new(dims)?;
    let data = (0..shape.numel())
        .map(|_| rng.random_range(-scale..scale))
        .collect();
    Ok(Tensor::from_shape(shape, data)?)
}

/// The MLP benchmark's state: the shared workload (model, fixed batch, plain SGD) and a backend
/// with factored gradients, as the trainer runs plain SGD without clipping.
struct Mlp {
    work: MlpStep,
    backend: Box<dyn StepBackend<f32>>,
}

impl Mlp {
    fn new(batch: usize, kind: BackendKind) -> Result<Mlp, CliError> {
        let work = MlpStep::new(batch)?;
        let mut backend = make_backend(kind)?;
        backend.set_factored_grads(true);
        Ok(Mlp { work, backend })
    }

    fn step(&mut self) -> Result<(), CliError> {
        let MlpStep {
            model,
            batch,
            optimizer,
        } = &mut self.work;
        let out = self
            .backend
            .train_step(model, batch, tapegrad_nn::rng::dropout_rng(0, 0))?;
        optimizer.step_grads(&mut model.params, out.grads, 0.01)?;
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

/// One result: a table label, the JSON object and the table's figures.
struct Report {
    label: String,
    json: serde_json::Map<String, serde_json::Value>,
    line: String,
}

fn report(
    label: String,
    fields: serde_json::Value,
    line: String,
    args: &BenchArgs,
    backend: &str,
) -> Report {
    let mut json = serde_json::Map::new();
    if let serde_json::Value::Object(map) = fields {
        let (workload, rest): (Vec<_>, Vec<_>) =
            map.into_iter().partition(|(k, _)| k == "workload");
        json.extend(workload);
        json.insert("threads".into(), args.threads.into());
        json.insert("backend".into(), backend.into());
        json.extend(rest);
        json.insert("simd".into(), simd_level().into());
    }
    Report { label, json, line }
}

/// Runs `tapegrad bench`.
pub fn run(args: BenchArgs) -> CliResult {
    if args.reps == Some(0) {
        return Err(CliError::Usage("--reps must be at least 1".into()));
    }
    let is_mlp = matches!(args.workload, Workload::Mlp { .. } | Workload::Gpt { .. });
    if args.backend == BackendArg::Compiled && !is_mlp {
        return Err(CliError::Usage(
            "--backend compiled applies to the mlp and gpt workloads only; chain, matmul, conv and peak time the eager engine and the kernels, and generate records no tape".into(),
        ));
    }
    crate::engine_flags::set_threads(args.threads)?;
    let kind = args.backend.kind();
    let backend = kind.name();
    let r = match args.workload {
        Workload::Mlp { batch } => {
            if batch == 0 {
                return Err(CliError::Usage("--batch must be at least 1".into()));
            }
            // The batch, and each layer's activations, their gradients and what backward keeps.
            let per_row = 784.0 + 3.0 * (256.0 + 128.0 + 10.0);
            ensure_memory(&format!("--batch {batch}"), 4.0 * per_row * batch as f64)?;
            let mut mlp = Mlp::new(batch, kind)?;
            let st = Stats::of(
                time_it(args.reps, || mlp.step())?
                    .into_iter()
                    .map(|s| s * 1e3)
                    .collect(),
            );
            let kept = mlp.backend.kept_bytes();
            let flops = MlpStep::gemm_flops(batch);
            let gflops = flops / (st.median * 1e-3) / 1e9;
            let mut fields = serde_json::json!({"workload": "mlp", "batch": batch});
            if let serde_json::Value::Object(m) = &mut fields {
                st.json("ms_per_step", "ms", m);
                m.insert("gflops".into(), gflops.into());
                m.insert("gemm_flops".into(), flops.into());
                m.insert("kept_bytes".into(), kept.into());
            }
            report(
                format!("mlp 784-256-128-10 batch {batch}"),
                fields,
                format!(
                    "{}, {gflops:.1} GFLOP/s in its products, {kept} bytes kept for backward",
                    st.text("ms/step", 4)
                ),
                &args,
                backend,
            )
        }
        Workload::Chain { numel } => {
            // The tape keeps the 2,000 recorded values until backward.
            ensure_memory(&format!("--numel {numel}"), 4.0 * 2000.0 * numel as f64)?;
            let x0 = Tensor::full(&Shape::new([numel])?, 1.0f32);
            let bias = Tensor::scalar(0.0001f32);
            let mut s = Session::new();
            let ops = 2000.0;
            let st = Stats::of(
                time_it(args.reps, || chain_step(&mut s, &x0, &bias))?
                    .into_iter()
                    .map(|t| t * 1e6 / ops)
                    .collect(),
            );
            let mut fields = serde_json::json!({"workload": "chain", "numel": numel});
            if let serde_json::Value::Object(m) = &mut fields {
                st.json("us_per_op", "us", m);
            }
            report(
                format!("chain 1000 x (x * 1.0001 + 0.0001), numel {numel}"),
                fields,
                format!(
                    "{}, forward + backward",
                    st.map(|us| us * 1e3).text("ns/op", 1)
                ),
                &args,
                backend,
            )
        }
        Workload::Matmul { n } => {
            if n == 0 {
                return Err(CliError::Usage("--n must be at least 1".into()));
            }
            ensure_memory(&format!("--n {n}"), 3.0 * 4.0 * (n as f64).powi(2))?;
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
            let a = random(&mut rng, &[n, n], 1.0)?;
            let b = random(&mut rng, &[n, n], 1.0)?;
            let flops = 2.0 * (n as f64).powi(3);
            let secs = time_it(args.reps, || {
                std::hint::black_box(matmul(&a, &b)?);
                Ok(())
            })?;
            let st = Stats::of(secs.into_iter().map(|t| flops / t / 1e9).collect());
            let mut fields = serde_json::json!({"workload": "matmul", "n": n});
            if let serde_json::Value::Object(m) = &mut fields {
                st.json("gflops", "gflops", m);
            }
            report(
                format!("sgemm {n} x {n} x {n}"),
                fields,
                st.text("GFLOP/s", 1),
                &args,
                backend,
            )
        }
        Workload::Conv { stride } => conv(&args, backend, stride)?,
        Workload::Gpt { batch, sizes } => {
            let [context, layers, embd, heads] = sizes.dims();
            gpt(&args, kind, [batch, context, layers, embd, heads])?
        }
        Workload::Generate { tokens, sizes } => {
            generate::generate(&args, backend, tokens, sizes.dims())?
        }
        Workload::Peak => {
            let bursts = args.reps.unwrap_or(50_000);
            let gflops = fma_peak_gflops(args.threads, bursts);
            report(
                "f32 FMA peak (register-resident chains)".into(),
                serde_json::json!({"workload": "peak", "gflops": gflops, "reps": bursts}),
                format!("{gflops:.1} GFLOP/s"),
                &args,
                backend,
            )
        }
    };
    if args.json {
        println!("{}", serde_json::Value::Object(r.json));
    } else {
        println!(
            "{:<48} threads {:<2} {backend:<8} {:<8} {}",
            r.label,
            args.threads,
            simd_level(),
            r.line
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The conv2d workload: forward + backward on a session tape, and the same-shape GEMMs (the
/// forward's weight (32 x 144) by each sample's columns (144 x oH oW, 784 at stride 1), three
/// times for forward, input and weight gradients) as the ceiling the convolution is measured
/// against. Padding 1 keeps the 28 x 28 image at stride 1 and halves it at stride 2.
fn conv(args: &BenchArgs, backend: &str, stride: usize) -> Result<Report, CliError> {
    const N: usize = 32;
    const C: usize = 16;
    const HW: usize = 28;
    const O: usize = 32;
    const K: usize = 3;
    if stride == 0 {
        return Err(CliError::Usage("--stride must be at least 1".into()));
    }
    // (28 + 2 padding - 3) / stride + 1 outputs per side.
    let out = (HW + 2 - K) / stride + 1;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let x0 = random(&mut rng, &[N, C, HW, HW], 1.0)?;
    let w0 = random(&mut rng, &[O, C, K, K], 0.1)?;
    let b0 = random(&mut rng, &[O], 0.1)?;
    let seed = random(&mut rng, &[N, O, out, out], 1.0)?;
    let mut s = Session::new();
    let options = Conv2d {
        padding: [1, 1],
        stride: [stride, stride],
        ..Conv2d::default()
    };
    let mut kept = 0;
    let secs = time_it(args.reps, || {
        s.reset();
        let x = s.parameter("x", x0.clone())?;
        let w = s.parameter("w", w0.clone())?;
        let b = s.parameter("b", b0.clone())?;
        let y = s.conv2d(x, w, Some(b), options.clone())?;
        kept = tapegrad_core::graph::tape_kept_bytes(s.tape());
        std::hint::black_box(s.backward_with(y, &seed)?);
        Ok(())
    })?;
    // Forward: N * O * out * out outputs, each C * 3 * 3 multiply-adds; backward: two more such
    // products (input and weight gradients); the bias gradient is a sum, not counted.
    let gemm_flops = 2.0 * (N * O * out * out * C * K * K) as f64;
    let flops = 3.0 * gemm_flops;
    let st = Stats::of(secs.iter().map(|t| flops / t / 1e9).collect());
    let ms = Stats::of(secs.iter().map(|t| t * 1e3).collect());
    let wm = random(&mut rng, &[O, C * K * K], 1.0)?;
    let cols = random(&mut rng, &[N, C * K * K, out * out], 1.0)?;
    let gemm_secs = time_it(args.reps, || {
        std::hint::black_box(batched_matmul(&wm, false, &cols, false)?);
        Ok(())
    })?;
    let gemm = Stats::of(gemm_secs.iter().map(|t| gemm_flops / t / 1e9).collect());
    let share = st.median / gemm.median;
    let mut fields = serde_json::json!({"workload": "conv", "input": [N, C, HW, HW], "weight": [O, C, K, K],
        "padding": 1, "stride": stride, "ms_per_step": ms.median, "ms_min": ms.min, "ms_max": ms.max});
    if let serde_json::Value::Object(m) = &mut fields {
        st.json("gflops", "gflops", m);
        m.insert("gemm_gflops".into(), gemm.median.into());
        m.insert("gemm_gflops_max".into(), gemm.max.into());
        m.insert("share_of_gemm".into(), share.into());
        m.insert("kept_bytes".into(), kept.into());
    }
    Ok(report(
        format!("conv2d (32,16,28,28) x 32x3x3 pad 1 stride {stride}, fwd + bwd"),
        fields,
        format!(
            "{:.2} ms/step, {}; same-shape GEMM {:.1} GFLOP/s, conv at {:.0}% of it",
            ms.median,
            st.text("GFLOP/s", 1),
            gemm.median,
            share * 100.0
        ),
        args,
        backend,
    ))
}

/// The model sizes of the gpt and generate workloads, the `train gpt` preset's by default.
#[derive(Args, Debug, Clone, Copy)]
pub struct GptSizes {
    #[arg(long, default_value_t = GptPreset::SHAKESPEARE.context)]
    context: usize,
    #[arg(long, default_value_t = GptPreset::SHAKESPEARE.layers)]
    layers: usize,
    #[arg(long, default_value_t = GptPreset::SHAKESPEARE.embd)]
    embd: usize,
    #[arg(long, default_value_t = GptPreset::SHAKESPEARE.heads)]
    heads: usize,
}

impl GptSizes {
    /// `[context, layers, embd, heads]`.
    fn dims(self) -> [usize; 4] {
        [self.context, self.layers, self.embd, self.heads]
    }
}

/// The preset's GPT at `[context, layers, embd, heads]` over `vocab` characters, without dropout:
/// the model `bench gpt` trains and `bench generate` samples from.
fn preset_gpt(vocab: usize, [context, layers, embd, heads]: [usize; 4]) -> tapegrad_nn::ModelSpec {
    tapegrad_nn::ModelSpec::Gpt {
        vocab,
        context,
        layers,
        heads,
        embd,
        mlp_ratio: GptPreset::SHAKESPEARE.mlp_ratio,
        dropout: 0.0,
        tie_weights: false,
    }
}

/// The gpt workload: `GptRun::train_step` (windows drawn, forward, backward, clipping, AdamW) of
/// the preset's model at the given sizes, f32, on the embedded text. FLOPs count the products:
/// `6 N` per token for the `N` weights of the linears (forward, input and weight gradients) and
/// `12 layers T E` per token for attention's two batched products over the full `T x T` scores.
fn gpt(args: &BenchArgs, kind: BackendKind, sizes: [usize; 5]) -> Result<Report, CliError> {
    use tapegrad_nn::data::text::{TextData, TextSource};
    use tapegrad_nn::gpt::{GptConfig, GptRun};
    let [batch, context, layers, embd, heads] = sizes;
    if sizes.contains(&0) {
        return Err(CliError::Usage(
            "--batch, --context, --layers, --embd and --heads must be at least 1".into(),
        ));
    }
    // Activations of every block and their gradients, a few dozen per token and width.
    let per_token = 64.0 * (layers * embd) as f64 + 4.0 * (context * heads * layers) as f64;
    ensure_memory(
        "--batch/--context/--embd",
        4.0 * per_token * (batch * context) as f64,
    )?;
    let data = TextData::load(&TextSource::Shakespeare, context)?;
    let spec = preset_gpt(data.vocab.len(), [context, layers, embd, heads]);
    let config = GptConfig::preset(TextSource::Shakespeare, spec, batch, 1500);
    let mut run = GptRun::<f32>::new(config, data, make_backend(kind)?)?;
    let st = Stats::of(
        time_it(args.reps, || {
            run.train_step()?;
            Ok(())
        })?
        .into_iter()
        .map(|s| s * 1e3)
        .collect(),
    );
    let tokens = (batch * context) as f64;
    let (e, l, v) = (embd as f64, layers as f64, run.data.vocab.len() as f64);
    let weights = 12.0 * l * e * e + v * e;
    let flops = tokens * (6.0 * weights + 12.0 * l * context as f64 * e);
    let gflops = flops / (st.median * 1e-3) / 1e9;
    let kept = run.kept_bytes();
    let mut fields = serde_json::json!({
        "workload": "gpt", "batch": batch, "context": context, "layers": layers,
        "embd": embd, "heads": heads,
    });
    if let serde_json::Value::Object(m) = &mut fields {
        st.json("ms_per_step", "ms", m);
        m.insert("tokens_per_s".into(), (tokens / (st.median * 1e-3)).into());
        m.insert("gflops".into(), gflops.into());
        m.insert("flops".into(), flops.into());
        m.insert("kept_bytes".into(), kept.into());
    }
    Ok(report(
        format!("gpt {layers}x{embd} heads {heads} batch {batch} context {context}"),
        fields,
        format!(
            "{}, {:.0} tokens/s, {gflops:.1} GFLOP/s, {kept} bytes kept for backward",
            st.text("ms/step", 2),
            tokens / (st.median * 1e-3)
        ),
        args,
        kind.name(),
    ))
}
