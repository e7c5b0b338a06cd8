//! Square sgemm, n x n x n, timed side by side for tapegrad's matmul and the Rust GEMM crates
//! (`gemm` as tapegrad calls it, `matrixmultiply` with its threading feature, `faer`), at a chosen
//! thread count. One JSON object per (crate, n) on stdout; see README.md.
//!
//! Usage: gemm-peers [--threads T] [--sizes 512,1024] [--seconds S] [--mlp-shapes] [--cpu-time]
//! Run once per thread count: matrixmultiply reads MATMUL_NUM_THREADS once per process.

use gemm_peers::values;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// `--cpu-time`: time each rep by the calling thread's CPU clock instead of the wall clock, which
/// leaves out the time other processes hold the core (meaningful at one thread only, where every
/// crate runs on the calling thread).
static CPU_TIME: AtomicBool = AtomicBool::new(false);

/// The calling thread's CPU time.
fn thread_cpu_time() -> Duration {
    gemm_peers::cpu_time(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// A stopwatch on the wall clock, or on the thread's CPU clock under `--cpu-time`.
fn stopwatch() -> impl Fn() -> Duration {
    let cpu = CPU_TIME.load(Ordering::Relaxed);
    let (wall, start_cpu) = (
        Instant::now(),
        if cpu {
            thread_cpu_time()
        } else {
            Duration::ZERO
        },
    );
    move || {
        if cpu {
            thread_cpu_time() - start_cpu
        } else {
            wall.elapsed()
        }
    }
}

struct Args {
    mlp_shapes: bool,
    threads: usize,
    sizes: Vec<usize>,
    seconds: f64,
}

fn parse_args() -> Args {
    let mut args = Args {
        mlp_shapes: false,
        threads: 1,
        sizes: vec![512, 1024],
        seconds: 1.5,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--mlp-shapes" {
            args.mlp_shapes = true;
            continue;
        }
        if flag == "--cpu-time" {
            CPU_TIME.store(true, Ordering::Relaxed);
            continue;
        }
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--threads" => args.threads = value.parse().expect("--threads: a positive integer"),
            "--sizes" => {
                args.sizes = value
                    .split(',')
                    .map(|s| s.parse().expect("--sizes: comma-separated integers"))
                    .collect()
            }
            "--seconds" => args.seconds = value.parse().expect("--seconds: a number"),
            other => panic!("unknown flag {other}"),
        }
    }
    assert!(args.threads >= 1, "--threads must be at least 1");
    args
}

/// Runs `f` for warm-up, then at least 10 reps and at least `seconds`; returns per-rep times.
fn time(seconds: f64, mut f: impl FnMut()) -> Vec<Duration> {
    for _ in 0..3 {
        f();
    }
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 10 || start.elapsed().as_secs_f64() < seconds {
        let t = stopwatch();
        f();
        times.push(t());
    }
    times
}

fn report(
    name: &str,
    n: usize,
    threads: usize,
    avx512: &str,
    check: f64,
    mut times: Vec<Duration>,
) {
    times.sort();
    let flop = 2.0 * (n as f64).powi(3);
    let gflops = |d: Duration| flop / d.as_secs_f64() / 1e9;
    let median = times[times.len() / 2];
    println!(
        "{{\"crate\": \"{name}\", \"n\": {n}, \"threads\": {threads}, \"reps\": {}, \
         \"median_gflops\": {:.1}, \"best_gflops\": {:.1}, \"worst_gflops\": {:.1}, \
         \"median_ms\": {:.3}, \"min_ms\": {:.3}, \"avx512_path\": \"{avx512}\", \"max_abs_diff_vs_gemm\": {check:e}}}",
        times.len(),
        gflops(median),
        gflops(times[0]),
        gflops(*times.last().unwrap()),
        median.as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
    );
}

fn max_diff(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() as f64)
        .fold(0.0, f64::max)
}

/// A named product `op(a) op(b)`: (name, a, transpose a, b, transpose b).
type Product<'a> = (
    &'a str,
    &'a tapegrad_tensor::Tensor<f32>,
    bool,
    &'a tapegrad_tensor::Tensor<f32>,
    bool,
);

/// tapegrad's products of one MLP 784-256-128-10 training step at batch 1, 32 and 256, as the
/// eager and compiled engines call them (forward `x W^T`, then `dy W` and `dy^T x`), timed alone.
fn mlp_shapes(args: &Args) {
    use tapegrad_tensor::kernels::{batched_matmul, set_num_threads};
    set_num_threads(args.threads);
    for batch in [1usize, 32, 256] {
        for (fan_in, fan_out) in [(784usize, 256usize), (256, 128), (128, 10)] {
            let x =
                tapegrad_tensor::Tensor::new(&[batch, fan_in], values(batch * fan_in, 3)).unwrap();
            let w = tapegrad_tensor::Tensor::new(&[fan_out, fan_in], values(fan_out * fan_in, 4))
                .unwrap();
            let dy = tapegrad_tensor::Tensor::new(&[batch, fan_out], values(batch * fan_out, 5))
                .unwrap();
            let products: [Product; 3] = [
                ("x W^T", &x, false, &w, true),
                ("dy W", &dy, false, &w, false),
                ("dy^T x", &dy, true, &x, false),
            ];
            for (name, a, ta, b, tb) in products {
                let mut times = time(args.seconds, || {
                    std::hint::black_box(batched_matmul(a, ta, b, tb).unwrap());
                });
                times.sort();
                println!(
                    "{{\"product\": \"{name}\", \"batch\": {batch}, \"layer\": [{fan_in}, {fan_out}], \"threads\": {}, \"min_us\": {:.1}, \"median_us\": {:.1}}}",
                    args.threads,
                    times[0].as_secs_f64() * 1e6,
                    times[times.len() / 2].as_secs_f64() * 1e6
                );
            }
        }
    }
}

fn main() {
    let args = parse_args();
    if args.mlp_shapes {
        return mlp_shapes(&args);
    }
    let t = args.threads;
    // matrixmultiply reads this once, on its first threaded call.
    std::env::set_var("MATMUL_NUM_THREADS", t.to_string());
    let has_avx512 = std::arch::is_x86_feature_detected!("avx512f");
    let avx = |compiled_in: bool| match (compiled_in, has_avx512) {
        (true, true) => "yes",
        (true, false) => "available, cpu lacks avx512f",
        (false, _) => "no",
    };
    eprintln!(
        "# threads {t}, cpu avx512f: {has_avx512}, avx2+fma: {}",
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    );
    for &n in &args.sizes {
        let a = values(n * n, 1);
        let b = values(n * n, 2);
        let mut reference = vec![0.0f32; n * n];

        // gemm 0.19 exactly as tapegrad used to call it: Rayon(threads) above 48^3, row-major.
        let par = if t > 1 {
            gemm::Parallelism::Rayon(t)
        } else {
            gemm::Parallelism::None
        };
        let gemm_call = |dst: &mut [f32]| unsafe {
            // SAFETY: a, b, dst are n x n row-major and uniquely borrowed / only read.
            gemm::gemm(
                n,
                n,
                n,
                dst.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr(),
                1,
                n as isize,
                b.as_ptr(),
                1,
                n as isize,
                1.0f32,
                1.0f32,
                false,
                false,
                false,
                par,
            )
        };
        gemm_call(&mut reference);
        let mut dst = vec![0.0f32; n * n];
        let times = time(args.seconds, || gemm_call(&mut dst));
        report(
            "gemm 0.19 (x86-v4)",
            n,
            t,
            avx(true),
            max_diff(&dst, &reference),
            times,
        );

        let times = time(args.seconds, || gemm_peers::mm_square(n, &a, &b, &mut dst));
        // matrixmultiply's avx512 kernel needs rustc >= 1.89 and its default `avx512` feature.
        report(
            "matrixmultiply 0.3 (threading)",
            n,
            t,
            avx(true),
            max_diff(&dst, &reference),
            times,
        );

        let fa = faer::MatRef::from_row_major_slice(&a, n, n);
        let fb = faer::MatRef::from_row_major_slice(&b, n, n);
        let mut fc = faer::Mat::<f32>::zeros(n, n);
        let fpar = if t > 1 {
            faer::Par::rayon(t)
        } else {
            faer::Par::Seq
        };
        let times = time(args.seconds, || {
            faer::linalg::matmul::matmul(fc.as_mut(), faer::Accum::Replace, fa, fb, 1.0, fpar)
        });
        let fdst: Vec<f32> = (0..n * n).map(|i| fc[(i / n, i % n)]).collect();
        report(
            "faer 0.22",
            n,
            t,
            avx(true),
            max_diff(&fdst, &reference),
            times,
        );

        tapegrad_tensor::kernels::set_num_threads(t);
        let ta = tapegrad_tensor::Tensor::new(&[n, n], a.clone()).unwrap();
        let tb = tapegrad_tensor::Tensor::new(&[n, n], b.clone()).unwrap();
        let mut out = tapegrad_tensor::kernels::matmul(&ta, &tb).unwrap();
        let times = time(args.seconds, || {
            out = tapegrad_tensor::kernels::matmul(&ta, &tb).unwrap();
        });
        report(
            "tapegrad matmul",
            n,
            t,
            avx(true),
            max_diff(out.data(), &reference),
            times,
        );
    }
}
