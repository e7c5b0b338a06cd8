//! `tapegrad train gpt`, `eval` and `generate` through the binary on a tiny model: resume and the
//! compiled backend give the eager run's checkpoint byte for byte, the same seed samples the same
//! text, and bad text files, prompts and sampling flags are clear errors.

mod cli_support;

use cli_support::{fails, ok, tempdir};

/// A small run of the preset (sizes cut down so the test takes seconds).
const TINY: &[&str] = &[
    "train",
    "gpt",
    "--layers",
    "1",
    "--embd",
    "16",
    "--heads",
    "2",
    "--context",
    "8",
    "--batch-size",
    "4",
    "--quiet",
];

fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    TINY.iter().copied().chain(extra.iter().copied()).collect()
}

#[test]
fn resume_and_the_compiled_backend_give_the_same_checkpoint_bytes() {
    let d = tempdir("gpt-resume");
    ok(&with(&["--steps", "6", "--save", "straight.st"]), &d);
    ok(
        &with(&["--steps", "3", "--schedule-steps", "6", "--save", "half.st"]),
        &d,
    );
    ok(
        &[
            "train", "--resume", "half.st", "--steps", "3", "--save", "half.st", "--quiet",
        ],
        &d,
    );
    // The straight run planned 6 steps, so its schedule equals the resumed one's.
    let straight = std::fs::read(d.join("straight.st")).unwrap();
    assert_eq!(straight, std::fs::read(d.join("half.st")).unwrap());
    ok(
        &with(&[
            "--steps",
            "6",
            "--save",
            "compiled.st",
            "--backend",
            "compiled",
        ]),
        &d,
    );
    assert_eq!(straight, std::fs::read(d.join("compiled.st")).unwrap());
    ok(
        &with(&["--steps", "6", "--save", "threads.st", "--threads", "2"]),
        &d,
    );
    assert_eq!(straight, std::fs::read(d.join("threads.st")).unwrap());

    let e = ok(&["eval", "--load", "straight.st"], &d);
    assert!(e.contains("loss ") && e.contains("perplexity "), "{e}");
    let a = ok(
        &[
            "generate",
            "--load",
            "straight.st",
            "--tokens",
            "40",
            "--seed",
            "3",
            "--prompt",
            "ROMEO:",
        ],
        &d,
    );
    let b = ok(
        &[
            "generate",
            "--load",
            "straight.st",
            "--tokens",
            "40",
            "--seed",
            "3",
            "--prompt",
            "ROMEO:",
        ],
        &d,
    );
    assert_eq!(a, b);
    assert!(a.starts_with("ROMEO:") && a.chars().count() >= 46, "{a}");
    let c = ok(
        &[
            "generate",
            "--load",
            "straight.st",
            "--tokens",
            "40",
            "--seed",
            "4",
            "--top-k",
            "5",
        ],
        &d,
    );
    assert_ne!(a, c);
}

#[test]
fn bad_text_prompts_and_sampling_flags_are_clear_errors() {
    let d = tempdir("gpt-errors");
    std::fs::write(d.join("bad.txt"), b"abc\xff\xfedef").unwrap();
    let e = fails(&with(&["--text", "bad.txt", "--steps", "1"]), &d);
    assert!(
        e.contains("bad.txt") && e.contains("not UTF-8") && e.contains("offset 3"),
        "{e}"
    );
    std::fs::write(d.join("empty.txt"), b"").unwrap();
    let e = fails(&with(&["--text", "empty.txt", "--steps", "1"]), &d);
    assert!(e.contains("empty.txt") && e.contains("empty"), "{e}");
    std::fs::write(d.join("short.txt"), b"to be or not").unwrap();
    let e = fails(&with(&["--text", "short.txt", "--steps", "1"]), &d);
    assert!(
        e.contains("short.txt") && e.contains("shorter than a window"),
        "{e}"
    );
    std::fs::write(d.join("val.txt"), "to be or not to be, ".repeat(3)).unwrap();
    let e = fails(&with(&["--text", "val.txt", "--steps", "1"]), &d);
    assert!(
        e.contains("val.txt") && e.contains("validation part"),
        "{e}"
    );
    let e = fails(&["train", "gpt", "--heads", "3", "--steps", "1"], &d);
    assert!(e.contains("multiple of the heads 3"), "{e}");
    let e = fails(&["train", "--layers", "2"], &d);
    assert!(e.contains("--layers apply to the gpt preset"), "{e}");

    std::fs::write(
        d.join("own.txt"),
        "the quick brown fox jumps over the lazy dog. ".repeat(40),
    )
    .unwrap();
    ok(
        &with(&["--text", "own.txt", "--steps", "2", "--save", "own.st"]),
        &d,
    );
    let e = fails(&["generate", "--load", "own.st", "--prompt", "Zebra"], &d);
    assert!(
        e.contains("'Z'") && e.contains("position 0") && e.contains("vocabulary"),
        "{e}"
    );
    let e = fails(&["generate", "--load", "own.st", "--temperature", "0"], &d);
    assert!(e.contains("--temperature") && e.contains("positive"), "{e}");
    let e = fails(&["generate", "--load", "own.st", "--temperature", "-1"], &d);
    assert!(e.contains("--temperature"), "{e}");
    let e = fails(&["generate", "--load", "own.st", "--top-k", "0"], &d);
    assert!(e.contains("--top-k"), "{e}");
    let e = fails(
        &[
            "train", "--resume", "own.st", "--steps", "1", "--layers", "3",
        ],
        &d,
    );
    assert!(e.contains("remove --layers"), "{e}");
}

#[test]
fn verify_every_checks_the_gpt_and_leaves_its_bits() {
    let d = tempdir("gpt-verify");
    let run = |extra: &[&str]| {
        let mut a = with(&["--steps", "4", "--dropout", "0.1"]);
        a.extend_from_slice(extra);
        ok(&a, &d)
    };
    run(&["--save", "plain.st"]);
    let plain = std::fs::read(d.join("plain.st")).unwrap();
    let out = run(&["--save", "v.st", "--verify-every", "2", "--log", "v.jsonl"]);
    assert!(
        out.contains("verified 2 steps (8 checks, 8 passed)"),
        "{out}"
    );
    assert_eq!(plain, std::fs::read(d.join("v.st")).unwrap());
    let log = std::fs::read_to_string(d.join("v.jsonl")).unwrap();
    let checks: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["split"] == "verify")
        .collect();
    assert_eq!(checks.len(), 2, "{log}");
    assert!(checks.iter().all(|v| v["passed"] == true), "{log}");
    let out = run(&[
        "--save",
        "vc.st",
        "--verify-every",
        "2",
        "--backend",
        "compiled",
    ]);
    assert!(
        out.contains("verified 2 steps (10 checks, 10 passed)"),
        "{out}"
    );
    assert_eq!(plain, std::fs::read(d.join("vc.st")).unwrap());
}

#[test]
fn accumulate_resumes_bit_exact_on_both_backends() {
    let d = tempdir("gpt-accumulate");
    // A batch of 4 windows in 3 micro-batches of 2, 1 and 1.
    ok(
        &with(&["--steps", "4", "--accumulate", "3", "--save", "acc.st"]),
        &d,
    );
    let straight = std::fs::read(d.join("acc.st")).unwrap();
    ok(
        &with(&[
            "--steps",
            "2",
            "--schedule-steps",
            "4",
            "--accumulate",
            "3",
            "--save",
            "half.st",
        ]),
        &d,
    );
    ok(
        &[
            "train", "--resume", "half.st", "--steps", "2", "--save", "half.st", "--quiet",
        ],
        &d,
    );
    assert_eq!(straight, std::fs::read(d.join("half.st")).unwrap());
    ok(
        &with(&[
            "--steps",
            "4",
            "--accumulate",
            "3",
            "--backend",
            "compiled",
            "--save",
            "c.st",
        ]),
        &d,
    );
    assert_eq!(straight, std::fs::read(d.join("c.st")).unwrap());
    ok(&with(&["--steps", "4", "--save", "one.st"]), &d);
    assert_ne!(straight, std::fs::read(d.join("one.st")).unwrap());

    let e = fails(&with(&["--steps", "1", "--accumulate", "5"]), &d);
    assert!(e.contains("--accumulate 5 needs 1 to 4"), "{e}");
    let e = fails(
        &with(&["--steps", "1", "--accumulate", "2", "--verify-every", "1"]),
        &d,
    );
    assert!(
        e.contains("--verify-every") && e.contains("--accumulate"),
        "{e}"
    );
    let e = fails(
        &[
            "train",
            "--resume",
            "acc.st",
            "--steps",
            "1",
            "--accumulate",
            "2",
        ],
        &d,
    );
    assert!(e.contains("remove --accumulate"), "{e}");
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The PyTorch fixture of `crates/nn/tests/gpt/pytorch.rs`: 2 layers, 2 heads, width 16,
/// context 8, 11 tokens.
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/crates/nn/tests/fixtures/gpt_tiny.safetensors"
);

#[test]
fn init_from_loads_pytorch_weights_and_names_the_flag_to_set() {
    let d = tempdir("gpt-init");
    // A text of 11 distinct characters, as the fixture's vocabulary.
    let text: String = (0..400)
        .map(|i| b"abcdefghij "[(i * 7) % 11] as char)
        .collect();
    std::fs::write(d.join("t.txt"), text).unwrap();
    let base = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "train",
            "gpt",
            "--text",
            "t.txt",
            "--batch-size",
            "4",
            "--init-from",
            FIXTURE,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let sizes = [
        "--layers",
        "2",
        "--heads",
        "2",
        "--embd",
        "16",
        "--context",
        "8",
    ];
    let mut good = sizes.to_vec();
    good.extend(["--steps", "2", "--save", "init.st"]);
    let out = ok(&args(&base(&good)), &d);
    assert!(
        out.contains("init: 29 tensors from") && out.contains("gpt_tiny.safetensors"),
        "{out}"
    );
    let e = ok(&["eval", "--load", "init.st"], &d);
    assert!(e.contains("loss "), "{e}");

    let mut wrong = sizes.to_vec();
    wrong[7] = "16";
    wrong.extend(["--steps", "1"]);
    let e = fails(&args(&base(&wrong)), &d);
    assert!(
        e.contains("transformer.wpe.weight has shape [8, 16]") && e.contains("--context 8"),
        "{e}"
    );
    let mut wrong = sizes.to_vec();
    wrong[1] = "1";
    wrong.extend(["--steps", "1"]);
    let e = fails(&args(&base(&wrong)), &d);
    assert!(e.contains("--layers 2"), "{e}");
    let mut tied = sizes.to_vec();
    tied.extend(["--steps", "1", "--tie-weights"]);
    let e = fails(&args(&base(&tied)), &d);
    assert!(e.contains("leave out --tie-weights"), "{e}");
    let e = fails(&["train", "--init-from", "x.safetensors"], &d);
    assert!(e.contains("--init-from apply to the gpt preset"), "{e}");
    let e = fails(
        &[
            "train",
            "--resume",
            "init.st",
            "--steps",
            "1",
            "--init-from",
            FIXTURE,
        ],
        &d,
    );
    assert!(e.contains("remove --init-from"), "{e}");
}
