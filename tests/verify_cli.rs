//! `tapegrad train --verify-every N` end to end: each preset and a CSV run verify every law on
//! their steps, report them in the summary and as JSON lines in the log, and write the same
//! checkpoint bytes as without the flag (eager and compiled, MLP and the CNN with batch norm
//! and dropout); bad flag values are usage errors.

mod cli_support;

use cli_support::{fails, ok, tempdir};

/// The `after` cell of the summary row that starts with `label`.
fn after<'a>(summary: &'a str, label: &str) -> &'a str {
    let line = summary
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no '{label}' row in:\n{summary}"));
    line.split_whitespace().last().unwrap()
}

/// The log's verification records.
fn verify_lines(log: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["split"] == "verify")
        .collect()
}

#[test]
fn every_preset_passes_and_reports_its_checks() {
    let dir = tempdir("verify-presets");
    let csv = dir.join("table.csv");
    let mut text = String::from("a,b,c,y\n");
    for i in 0..60 {
        let (a, b, c) = (i as f64 * 0.1, (i % 7) as f64, ((i * 13) % 11) as f64);
        text.push_str(&format!("{a},{b},{c},{}\n", 2.0 * a - b + 0.5 * c));
    }
    std::fs::write(&csv, text).unwrap();
    let csv = csv.to_str().unwrap();
    let runs: [(&[&str], u64); 5] = [
        (&["train", "--steps", "6"], 4),
        (&["train", "--steps", "6", "--backend", "compiled"], 5),
        (
            &[
                "train",
                "--model",
                "cnn",
                "--steps",
                "6",
                "--dropout",
                "0.2",
            ],
            4,
        ),
        (
            &[
                "train",
                "mlp",
                "--steps",
                "6",
                "--dtype",
                "f64",
                "--backend",
                "compiled",
            ],
            5,
        ),
        (&["train", "--csv", csv, "--target", "y", "--steps", "6"], 4),
    ];
    for (args, laws) in runs {
        let log = dir.join("run.jsonl");
        let mut args = args.to_vec();
        args.extend(["--verify-every", "3", "--log", log.to_str().unwrap()]);
        let out = ok(&args, &dir);
        assert!(out.contains("verify: laws"), "{out}");
        let checks = 2 * laws;
        assert_eq!(
            after(&out, "verify: checks passed"),
            format!("{checks}/{checks}"),
            "{out}"
        );
        let worst: f64 = after(&out, "verify: worst rel. error").parse().unwrap();
        assert!(worst < 1e-3, "{args:?}: {worst}");
        assert!(
            out.contains(&format!(
                "verified 2 steps ({checks} checks, {checks} passed)"
            )),
            "{out}"
        );
        let lines = verify_lines(&log);
        assert_eq!(lines.len(), 2, "{args:?}");
        assert_eq!(lines[0]["step"], 3);
        assert_eq!(lines[1]["step"], 6);
        for line in &lines {
            assert_eq!(line["passed"], true, "{line}");
            let laws_seen: Vec<u64> = line["checks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["law"].as_u64().unwrap())
                .collect();
            assert_eq!(laws_seen.len() as u64, laws, "{line}");
            assert!(laws_seen.contains(&7) && laws_seen.contains(&5) && laws_seen.contains(&6));
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn verifying_leaves_the_checkpoint_bytes_unchanged() {
    let dir = tempdir("verify-bits");
    for model in ["mlp", "cnn"] {
        for backend in ["eager", "compiled"] {
            let common = [
                "train",
                "--model",
                model,
                "--backend",
                backend,
                "--steps",
                "5",
                "--dropout",
                "0.3",
                "--quiet",
                "--save",
            ];
            let plain = dir.join(format!("{model}-{backend}-plain.safetensors"));
            let checked = dir.join(format!("{model}-{backend}-verified.safetensors"));
            let mut a = common.to_vec();
            a.push(plain.to_str().unwrap());
            ok(&a, &dir);
            let mut b = common.to_vec();
            b.extend([checked.to_str().unwrap(), "--verify-every", "2"]);
            ok(&b, &dir);
            let (x, y) = (
                std::fs::read(&plain).unwrap(),
                std::fs::read(&checked).unwrap(),
            );
            assert!(x == y, "{model} {backend}: the checkpoints differ");
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_verify_flags_are_usage_errors() {
    let dir = tempdir("verify-flags");
    let err = fails(&["train", "--steps", "1", "--verify-every", "0"], &dir);
    assert!(err.contains("--verify-every needs a positive N"), "{err}");
    let err = fails(&["train", "--steps", "1", "--verify-warn"], &dir);
    assert!(err.contains("--verify-every"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}
