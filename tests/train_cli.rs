//! `tapegrad train`, `eval` and `predict` end to end through the binary: the default digits run
//! and `train mlp` reach their targets, resume through the CLI gives the same checkpoint bytes as
//! a straight run, bad checkpoints and flags give clear errors, and the log, plot and
//! predictions are written.

mod cli_support;

use cli_support::{fails, ok, tapegrad, tempdir};

/// The `after` cell of the summary row that starts with `label`.
fn after(summary: &str, label: &str) -> f64 {
    let line = summary
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no '{label}' row in:\n{summary}"));
    line.split_whitespace()
        .last()
        .unwrap()
        .trim_end_matches('%')
        .parse()
        .unwrap()
}

#[test]
fn default_run_reaches_95_percent_on_digits() {
    let dir = tempdir("cli-digits");
    let out = ok(&["train", "--quiet"], &dir);
    let acc = after(&out, "validation accuracy");
    assert!(acc >= 95.0, "validation accuracy {acc}%:\n{out}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn mlp_preset_reaches_rmse_below_3_5_mpg() {
    let dir = tempdir("cli-mpg");
    let out = ok(&["train", "mlp", "--quiet"], &dir);
    let rmse = after(&out, "validation RMSE (mpg)");
    assert!(rmse < 3.5, "validation RMSE {rmse} mpg:\n{out}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn resume_through_the_cli_matches_a_straight_run_byte_for_byte() {
    let dir = tempdir("cli-resume");
    let common = [
        "--optimizer",
        "sgd",
        "--lr",
        "0.05",
        "--dropout",
        "0.1",
        "--seed",
        "4",
    ];
    // The mlp preset anneals with a cosine schedule, so the first run is planned for 54 steps.
    let mut first = vec![
        "train",
        "mlp",
        "--steps",
        "23",
        "--schedule-steps",
        "54",
        "--save",
        "n.st",
        "--quiet",
    ];
    first.extend(common);
    ok(&first, &dir);
    ok(
        &[
            "train",
            "--resume",
            "n.st",
            "--steps",
            "31",
            "--save",
            "resumed.st",
            "--quiet",
        ],
        &dir,
    );
    let mut straight = vec![
        "train",
        "mlp",
        "--steps",
        "54",
        "--save",
        "straight.st",
        "--quiet",
    ];
    straight.extend(common);
    ok(&straight, &dir);
    let a = std::fs::read(dir.join("resumed.st")).unwrap();
    let b = std::fs::read(dir.join("straight.st")).unwrap();
    assert!(a == b, "resumed and straight checkpoints differ");
    let e = fails(
        &["train", "--resume", "n.st", "--steps", "5", "--lr", "0.1"],
        &dir,
    );
    assert!(
        e.contains("--resume continues the run") && e.contains("--lr"),
        "{e}"
    );
    let e = fails(&["train", "--resume", "n.st"], &dir);
    assert!(e.contains("--steps N or --epochs N"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_checkpoints_give_clear_errors_and_stay_untouched() {
    let dir = tempdir("cli-bad");
    ok(
        &[
            "train", "mlp", "--steps", "5", "--save", "good.st", "--quiet",
        ],
        &dir,
    );
    let bytes = std::fs::read(dir.join("good.st")).unwrap();
    std::fs::write(dir.join("cut.st"), &bytes[..bytes.len() / 2]).unwrap();
    for args in [
        vec!["eval", "--load", "cut.st"],
        vec![
            "train", "--resume", "cut.st", "--steps", "3", "--save", "cut.st",
        ],
        vec!["predict", "--load", "cut.st", "--csv", "nothing.csv"],
    ] {
        let e = fails(&args, &dir);
        assert!(
            e.contains("checkpoint cut.st") && e.contains("truncated or corrupted"),
            "{args:?}: {e}"
        );
    }
    assert_eq!(
        std::fs::read(dir.join("cut.st")).unwrap(),
        &bytes[..bytes.len() / 2]
    );
    let e = fails(&["eval", "--load", "absent.st"], &dir);
    assert!(e.contains("absent.st"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn compiled_backend_matches_eager() {
    let dir = tempdir("cli-backends");
    let run = [
        "train",
        "--steps",
        "50",
        "--dropout",
        "0.2",
        "--quiet",
        "--save",
    ];
    ok(&[&run[..], &["eager.st"]].concat(), &dir);
    ok(
        &[&run[..], &["compiled.st", "--backend", "compiled"]].concat(),
        &dir,
    );
    let a = std::fs::read(dir.join("eager.st")).unwrap();
    let b = std::fs::read(dir.join("compiled.st")).unwrap();
    assert!(a == b, "eager and compiled checkpoints differ");
    let eval = ok(
        &["eval", "--load", "compiled.st", "--backend", "compiled"],
        &dir,
    );
    assert_eq!(eval, ok(&["eval", "--load", "compiled.st"], &dir));
    // The CNN with dropout and batch norms: the running statistics (buffers in the checkpoint)
    // match too. 50 steps cross the epoch's last, shorter batch (1438 rows = 44 x 32 + 30),
    // which the compiled backend traces as a second plan.
    let cnn = [&run[..6], &["--model", "cnn", "--save"]].concat();
    ok(&[&cnn[..], &["cnn-eager.st"]].concat(), &dir);
    ok(
        &[&cnn[..], &["cnn-compiled.st", "--backend", "compiled"]].concat(),
        &dir,
    );
    let a = std::fs::read(dir.join("cnn-eager.st")).unwrap();
    let b = std::fs::read(dir.join("cnn-compiled.st")).unwrap();
    assert!(a == b, "eager and compiled CNN checkpoints differ");
    // Two threads split the convolutions and products and give one thread's bits.
    ok(
        &[
            &cnn[..],
            &["cnn-2t.st", "--backend", "compiled", "--threads", "2"],
        ]
        .concat(),
        &dir,
    );
    let c = std::fs::read(dir.join("cnn-2t.st")).unwrap();
    assert!(
        a == c,
        "the CNN checkpoint on 2 threads differs from 1 thread's"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn cnn_trains_and_evaluates() {
    let dir = tempdir("cli-cnn");
    let out = ok(
        &[
            "train", "--model", "cnn", "--steps", "30", "--quiet", "--save", "cnn.st",
        ],
        &dir,
    );
    let acc = after(&out, "validation accuracy");
    assert!(
        acc > 50.0,
        "30 CNN steps should be well above chance, got {acc}%\n{out}"
    );
    let eval = ok(&["eval", "--load", "cnn.st"], &dir);
    assert!(
        eval.contains("cnn 1x8x8 conv16-conv32 -> 10 at step 30"),
        "{eval}"
    );
    // Evaluation of a batch-norm model runs compiled too (running statistics are inputs).
    assert_eq!(
        eval,
        ok(&["eval", "--load", "cnn.st", "--backend", "compiled"], &dir)
    );
    assert_eq!(
        eval,
        ok(&["eval", "--load", "cnn.st", "--threads", "2"], &dir)
    );
    let e = fails(&["eval", "--load", "cnn.st", "--threads", "0"], &dir);
    assert!(e.contains("--threads must be at least 1"), "{e}");
    let e = fails(&["train", "mlp", "--model", "cnn"], &dir);
    assert!(e.contains("--model cnn is for the digits images"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn log_plot_eval_and_predict() {
    let dir = tempdir("cli-outputs");
    let out = ok(
        &[
            "train",
            "--epochs",
            "2",
            "--save",
            "d.st",
            "--log",
            "run.jsonl",
            "--plot",
            "loss.svg",
            "--eval-every",
            "30",
        ],
        &dir,
    );
    assert!(out.contains("before: validation loss"), "{out}");
    let log = std::fs::read_to_string(dir.join("run.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let train: Vec<_> = records.iter().filter(|r| r["split"] == "train").collect();
    assert_eq!(train.len(), 90, "2 epochs of 45 batches");
    assert_eq!(train[0]["step"], 1);
    for key in ["loss", "metric", "seconds", "lr"] {
        assert!(train[0][key].is_number(), "{key} in {}", train[0]);
    }
    // Evaluations at step 0, 30, 60 and at the end.
    let evals: Vec<u64> = records
        .iter()
        .filter(|r| r["split"] == "validation")
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    assert_eq!(evals, [0, 30, 60, 90]);
    let svg = std::fs::read_to_string(dir.join("loss.svg")).unwrap();
    assert!(
        svg.starts_with("<svg")
            && svg.trim_end().ends_with("</svg>")
            && svg.matches("<polyline").count() == 3
    );

    let eval = ok(&["eval", "--load", "d.st"], &dir);
    assert!(eval.contains("validation split (359 rows"), "{eval}");
    let final_acc = records
        .iter()
        .rev()
        .find(|r| r["split"] == "validation")
        .unwrap()["metric"]
        .as_f64()
        .unwrap();
    assert!(
        eval.contains(&format!("accuracy {:.2}%", 100.0 * final_acc)),
        "{eval} vs {final_acc}"
    );

    let rows: String = std::iter::repeat_n(
        "0,0,5,13,9,1,0,0,0,0,13,15,10,15,5,0,0,3,15,2,0,11,8,0,0,4,12,0,0,8,8,0,0,5,8,0,0,9,8,0,0,4,11,0,1,12,7,0,0,2,14,5,10,12,0,0,0,0,6,13,10,0,0,0,0\n",
        3,
    )
    .collect();
    std::fs::write(dir.join("rows.csv"), rows).unwrap();
    ok(
        &[
            "predict",
            "--load",
            "d.st",
            "--csv",
            "rows.csv",
            "--no-header",
            "--out",
            "pred.csv",
        ],
        &dir,
    );
    let pred = std::fs::read_to_string(dir.join("pred.csv")).unwrap();
    let lines: Vec<&str> = pred.lines().collect();
    assert_eq!(lines[0], "row,prediction,probability");
    assert_eq!(lines.len(), 4);
    assert!(
        lines[1].starts_with("0,0,"),
        "the first digit of the data set is a 0: {pred}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_users_csv_file_trains_and_predicts() {
    let dir = tempdir("cli-csv");
    // y = 2a - b + 1 with a text column to ignore.
    let mut text = String::from("a,b,note,y\n");
    for i in 0..120 {
        let (a, b) = ((i % 11) as f64 / 3.0, (i % 7) as f64 / 2.0);
        text.push_str(&format!("{a},{b},row{i},{}\n", 2.0 * a - b + 1.0));
    }
    std::fs::write(dir.join("t.csv"), &text).unwrap();
    let out = ok(
        &[
            "train", "--csv", "t.csv", "--target", "y", "--epochs", "150", "--save", "t.st",
        ],
        &dir,
    );
    assert!(
        out.contains("note: text columns left out of the features: note"),
        "{out}"
    );
    let rmse = after(&out, "validation RMSE");
    assert!(
        rmse < 0.2,
        "a linear target should be learned well, got RMSE {rmse}\n{out}"
    );
    let p = tapegrad(&["predict", "--load", "t.st", "--csv", "t.csv"], &dir);
    assert!(p.status.success());
    assert_eq!(String::from_utf8(p.stdout).unwrap().lines().count(), 121);
    assert!(String::from_utf8(p.stderr)
        .unwrap()
        .contains("rmse against column 'y'"));
    let e = fails(&["train", "--csv", "t.csv", "--target", "z"], &dir);
    assert!(e.contains("no column 'z'"), "{e}");
    let e = fails(&["train", "--csv", "t.csv"], &dir);
    assert!(e.contains("--csv needs --target"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn label_smoothing_trains_resumes_and_is_checked() {
    let dir = tempdir("cli-smoothing");
    let run = ["train", "--steps", "30", "--quiet", "--label-smoothing"];
    ok(
        &[&run[..], &["0.1", "--save", "smoothed.st"]].concat(),
        &dir,
    );
    ok(
        &["train", "--steps", "30", "--quiet", "--save", "plain.st"],
        &dir,
    );
    let (a, b) = (
        std::fs::read(dir.join("smoothed.st")).unwrap(),
        std::fs::read(dir.join("plain.st")).unwrap(),
    );
    assert!(
        a != b,
        "--label-smoothing 0.1 trained the same parameters as none"
    );
    // The checkpoint keeps it: --resume takes no --label-smoothing of its own.
    let e = fails(
        &[
            "train",
            "--resume",
            "smoothed.st",
            "--label-smoothing",
            "0.2",
        ],
        &dir,
    );
    assert!(e.contains("--label-smoothing"), "{e}");
    ok(
        &[
            "train",
            "--resume",
            "smoothed.st",
            "--steps",
            "5",
            "--quiet",
        ],
        &dir,
    );
    let e = fails(
        &["train", "mlp", "--label-smoothing", "0.1", "--steps", "1"],
        &dir,
    );
    assert!(
        e.contains("label smoothing") && e.contains("classification"),
        "{e}"
    );
    let e = fails(&["train", "--label-smoothing", "1.5", "--steps", "1"], &dir);
    assert!(e.contains("between 0 and 1"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_model_too_large_to_allocate_is_an_error_not_an_abort() {
    let dir = tempdir("cli-huge");
    // A first layer of 64 x 10^12 weights: a valid shape that no machine can hold.
    let e = fails(
        &["train", "--hidden", "1000000000000", "--steps", "1"],
        &dir,
    );
    assert!(
        e.contains("cannot allocate") && e.contains("[1000000000000, 64]"),
        "{e}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn negative_and_out_of_range_values_are_checked_before_the_first_step() {
    let dir = tempdir("cli-ranges");
    for (args, says) in [
        (&["--lr", "-1"][..], "invalid learning rate: -1"),
        (&["--weight-decay", "-1"], "invalid weight decay: -1"),
        (
            &["--dropout", "-0.5"],
            "dropout: probability must lie in [0, 1), found -0.5",
        ),
        (&["--model", "cnn", "--dropout", "-0.5"], "found -0.5"),
        (&["--clip", "-1"], "max_norm must be positive, found -1"),
        (&["--clip", "0"], "max_norm must be positive, found 0"),
        (&["--val-fraction", "-0.2"], "found -0.2"),
        (&["--eval-every", "0"], "--eval-every needs a positive N"),
        (
            &["--schedule", "cosine", "--schedule-steps", "0"],
            "--schedule-steps needs a positive N",
        ),
        (&["--threads", "0"], "--threads must be at least 1"),
    ] {
        let out = tapegrad(&[&["train", "--steps", "1"][..], args].concat(), &dir);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(!out.status.success(), "{args:?} trained: {stdout}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        // Rejected up front: no evaluation or step ran first.
        assert!(!stdout.contains("validation"), "{args:?}: {stdout}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_reader_that_closes_stdout_ends_the_run_quietly() {
    // `tapegrad train | head -0`: our stdout is closed before the first line is written.
    let dir = tempdir("closed-stdout");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tapegrad"))
        .args(["train", "--steps", "5"])
        .current_dir(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}
