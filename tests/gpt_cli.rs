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
