//! `tapegrad bench` through the binary: each workload's `--json` object carries the fields that
//! `bench/compare.py` reads (figure, spread, repetitions, threads, backend, SIMD path), the
//! compiled backend keeps no more bytes for backward than the eager tape, and bad flags are usage
//! errors, not panics. Timings are only checked to be positive: their size belongs to benchmarks.

mod cli_support;

use cli_support::{fails, ok, tempdir};
use serde_json::Value;

/// The one JSON object `tapegrad bench ARGS --json --reps 2` prints.
fn bench_json(args: &[&str]) -> Value {
    let dir = tempdir("bench");
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--json", "--reps", "2"]);
    let out = ok(&all, &dir);
    std::fs::remove_dir_all(dir).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "one JSON line expected, got:\n{out}");
    serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// Asserts the median, its spread fields and the repetition count, and returns the median.
fn spread(v: &Value, key: &str, unit: &str) -> f64 {
    let get = |k: &str| {
        v[k].as_f64()
            .unwrap_or_else(|| panic!("no number '{k}' in {v}"))
    };
    let (min, q1, median, q3, max) = (
        get(&format!("{unit}_min")),
        get(&format!("{unit}_q1")),
        get(key),
        get(&format!("{unit}_q3")),
        get(&format!("{unit}_max")),
    );
    assert!(
        0.0 < min && min <= q1 && q1 <= median && median <= q3 && q3 <= max && max.is_finite(),
        "spread out of order in {v}"
    );
    assert_eq!(v["reps"], 2, "{v}");
    median
}

/// The fields every workload reports, whatever its figure.
fn common(v: &Value, workload: &str, threads: u64, backend: &str) {
    assert_eq!(v["workload"], workload, "{v}");
    assert_eq!(v["threads"], threads, "{v}");
    assert_eq!(v["backend"], backend, "{v}");
    let simd = v["simd"]
        .as_str()
        .unwrap_or_else(|| panic!("no simd in {v}"));
    assert!(
        ["avx512f", "avx2+fma", "neon", "scalar"].contains(&simd),
        "unknown simd {simd}"
    );
}

#[test]
fn mlp_reports_time_and_compiled_keeps_only_what_backward_reads() {
    let eager = bench_json(&["mlp", "--batch", "3"]);
    let compiled = bench_json(&["mlp", "--batch", "3", "--backend", "compiled"]);
    common(&eager, "mlp", 1, "eager");
    common(&compiled, "mlp", 1, "compiled");
    for v in [&eager, &compiled] {
        assert_eq!(v["batch"], 3, "{v}");
        spread(v, "ms_per_step", "ms");
    }
    let kept = |v: &Value| v["kept_bytes"].as_u64().unwrap();
    // The parameters alone are 235,146 f32 values; backward keeps at least those.
    assert!(kept(&eager) >= 4 * 235_146, "{eager}");
    assert!(
        kept(&compiled) <= kept(&eager),
        "compiled keeps {} bytes, eager {}",
        kept(&compiled),
        kept(&eager)
    );
    // The compiled pass keeps only what the gradients read: not the first layer's weight (its
    // input needs no gradient), which alone is more than everything it keeps.
    assert!(kept(&compiled) < 4 * 256 * 784, "{compiled}");
}

#[test]
fn chain_and_matmul_report_their_figures_on_two_threads() {
    let chain = bench_json(&["chain", "--numel", "4", "--threads", "2"]);
    common(&chain, "chain", 2, "eager");
    assert_eq!(chain["numel"], 4, "{chain}");
    spread(&chain, "us_per_op", "us");

    let mm = bench_json(&["matmul", "--n", "24", "--threads", "2"]);
    common(&mm, "matmul", 2, "eager");
    assert_eq!(mm["n"], 24, "{mm}");
    spread(&mm, "gflops", "gflops");
}

#[test]
fn peak_and_mlp_report_gflops_against_the_machine() {
    let peak = bench_json(&["peak", "--threads", "2"]);
    common(&peak, "peak", 2, "eager");
    assert_eq!(peak["reps"], 2, "{peak}");
    let gflops = peak["gflops"].as_f64().unwrap();
    assert!(gflops.is_finite() && gflops > 0.0, "{peak}");

    // The products of a batch-4 step of 784-256-128-10: forward and weight gradients of all
    // three layers, input gradients of the last two, two flops per multiply-add.
    let mlp = bench_json(&["mlp", "--batch", "4"]);
    let per_row = 784 * 256 + 256 * 128 + 128 * 10;
    let flops = 2 * 4 * (2 * per_row + 256 * 128 + 128 * 10);
    assert_eq!(mlp["gemm_flops"].as_f64(), Some(flops as f64), "{mlp}");
    let expected = flops as f64 / (spread(&mlp, "ms_per_step", "ms") * 1e-3) / 1e9;
    let reported = mlp["gflops"].as_f64().unwrap();
    assert!((reported - expected).abs() <= 1e-9 * expected, "{mlp}");
}

/// The fields `bench/gpt_compare.py` reads from `bench gpt --json`: the shape, the step's product
/// flops (nanoGPT's count over the embedded text's 76-character vocabulary), the spread and the
/// bytes kept, on both backends; the compiled step keeps less than the eager tape.
#[test]
fn gpt_reports_the_fields_gpt_compare_reads() {
    let (batch, context, layers, embd, heads) = (2u64, 8u64, 1u64, 16u64, 2u64);
    let shape = [
        "gpt",
        "--batch",
        "2",
        "--context",
        "8",
        "--layers",
        "1",
        "--embd",
        "16",
        "--heads",
        "2",
    ];
    let mut kept = Vec::new();
    for backend in ["eager", "compiled"] {
        let mut args = shape.to_vec();
        args.extend(["--backend", backend]);
        let v = bench_json(&args);
        common(&v, "gpt", 1, backend);
        for (key, size) in [
            ("batch", batch),
            ("context", context),
            ("layers", layers),
            ("embd", embd),
            ("heads", heads),
        ] {
            assert_eq!(v[key], size, "{v}");
        }
        let tokens = (batch * context) as f64;
        let (e, l, vocab) = (embd as f64, layers as f64, 76.0);
        let weights = 12.0 * l * e * e + vocab * e;
        let flops = tokens * (6.0 * weights + 12.0 * l * context as f64 * e);
        assert_eq!(v["flops"].as_f64(), Some(flops), "{v}");
        let ms = spread(&v, "ms_per_step", "ms");
        let gflops = v["gflops"].as_f64().unwrap();
        assert!(
            (gflops - flops / (ms * 1e-3) / 1e9).abs() <= 1e-9 * gflops,
            "{v}"
        );
        kept.push(
            v["kept_bytes"]
                .as_u64()
                .unwrap_or_else(|| panic!("no kept_bytes in {v}")),
        );
    }
    assert!(
        0 < kept[1] && kept[1] < kept[0],
        "compiled keeps {} bytes, eager {}",
        kept[1],
        kept[0]
    );
}

#[test]
fn generate_reports_tokens_per_second_at_the_presets_sizes() {
    let v = bench_json(&["generate", "--tokens", "20"]);
    common(&v, "generate", 1, "eager");
    for (key, size) in [
        ("tokens", 20),
        ("context", 64),
        ("layers", 4),
        ("embd", 128),
        ("heads", 4),
    ] {
        assert_eq!(v[key], size, "{v}");
    }
    // ms_per_step is per generated token; tokens/s is its median's inverse.
    let ms = spread(&v, "ms_per_step", "ms");
    let tokens_per_s = v["tokens_per_s"].as_f64().unwrap();
    assert!(tokens_per_s > 0.0 && tokens_per_s.is_finite(), "{v}");
    assert!((tokens_per_s * ms * 1e-3 - 1.0).abs() <= 1e-9, "{v}");
}

#[test]
fn bad_flags_are_usage_errors() {
    let dir = tempdir("bench-flags");
    for (args, says) in [
        (&["bench", "mlp", "--reps", "0"][..], "--reps"),
        (&["bench", "mlp", "--threads", "0"], "--threads"),
        (&["bench", "mlp", "--batch", "0"], "--batch"),
        (&["bench", "matmul", "--n", "0"], "--n"),
        (
            &["bench", "chain", "--backend", "compiled"],
            "mlp and gpt workloads only",
        ),
        (
            &["bench", "conv", "--backend", "compiled"],
            "mlp and gpt workloads only",
        ),
        (
            &["bench", "peak", "--backend", "compiled"],
            "mlp and gpt workloads only",
        ),
        (
            &["bench", "generate", "--backend", "compiled"],
            "generate records no tape",
        ),
        (&["bench", "generate", "--tokens", "0"], "--tokens"),
        (
            &["bench", "generate", "--heads", "3"],
            "the width 128 must be a multiple of the heads 3",
        ),
        (&["bench", "mlp", "--backend", "jit"], "jit"),
        // Sizes no machine can hold: refused before allocating, not an allocation abort.
        (
            &["bench", "chain", "--numel", "100000000000000"],
            "--numel 100000000000000 needs about",
        ),
        (
            &["bench", "matmul", "--n", "10000000"],
            "--n 10000000 needs about",
        ),
        (
            &["bench", "mlp", "--batch", "100000000000"],
            "--batch 100000000000 needs about",
        ),
        (
            &["bench", "generate", "--embd", "100000000"],
            "--layers/--embd/--context needs about",
        ),
    ] {
        let err = fails(args, &dir);
        assert!(err.contains(says), "tapegrad {args:?}: {err}");
        assert!(
            !err.contains("panicked"),
            "tapegrad {args:?} panicked: {err}"
        );
    }
    std::fs::remove_dir_all(dir).unwrap();
}
