//! Nothing lost: `tapegrad train --save F --save-every 1` is killed (SIGKILL) at seeded random
//! moments: 70% while a save is under way (its temporary file exists), the rest at a random time
//! in the run; after each kill the file at F must be the last complete
//! checkpoint (it reads, its checksum, names, shapes and dtypes check out, its step never goes
//! back), and `--resume` from it, killed again or not, must finish the run with a checkpoint
//! byte-identical to an uninterrupted run's. A temporary file left by a kill must not break the
//! next save. Rounds: `TAPEGRAD_KILL_ROUNDS` (default 10), seed: `TAPEGRAD_KILL_SEED` (default 1).

mod cli_support;

use cli_support::tempdir;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tapegrad::nn::checkpoint::Checkpoint;
use tapegrad::tensor::DType;

/// Steps of the whole run.
const TOTAL: u64 = 30;
const CKPT: &str = "ck.st";
const TMP: &str = ".ck.st.tmp";

fn env_or(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number")),
        Err(_) => default,
    }
}

/// A fresh run of the whole schedule (dropout and Adam, so the data order, the dropout stream and
/// the optimizer state all have to survive the kill), saving after every step.
fn fresh_args(save: &str) -> Vec<String> {
    [
        "train",
        "mlp",
        "--steps",
        &TOTAL.to_string(),
        "--dropout",
        "0.1",
        "--seed",
        "5",
        "--save-every",
        "1",
        "--save",
        save,
        "--quiet",
    ]
    .map(String::from)
    .to_vec()
}

/// Continues the run in `ck.st` to step `TOTAL`, saving after every step.
fn resume_args(from_step: u64) -> Vec<String> {
    [
        "train",
        "--resume",
        CKPT,
        "--steps",
        &(TOTAL - from_step).to_string(),
        "--save-every",
        "1",
        "--save",
        CKPT,
        "--quiet",
    ]
    .map(String::from)
    .to_vec()
}

fn command(args: &[String], dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tapegrad"));
    c.args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

/// Runs to completion; panics with its error output on failure.
fn run(args: &[String], dir: &Path) {
    let out = command(args, dir)
        .output()
        .expect("the tapegrad binary runs");
    assert!(
        out.status.success(),
        "tapegrad {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// When to kill a run.
#[derive(Debug, Clone, Copy)]
enum KillAt {
    /// This long after it started.
    After(Duration),
    /// When its temporary checkpoint file appears for the `nth` time (a save has begun and not
    /// yet renamed), plus `extra`, which lands anywhere from the write to the next step.
    InSave { nth: u64, extra: Duration },
}

/// Starts the run and SIGKILLs it at `at`, unless it finishes first; says whether it was killed.
fn run_and_kill(args: &[String], dir: &Path, at: KillAt) -> bool {
    let tmp = dir.join(TMP);
    let mut child = command(args, dir)
        .stderr(Stdio::null())
        .spawn()
        .expect("the tapegrad binary starts");
    let started = Instant::now();
    let (mut seen, mut was_there) = (0, false);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "tapegrad {args:?} failed: {status}");
            return false;
        }
        let now = match at {
            KillAt::After(delay) => started.elapsed() >= delay,
            KillAt::InSave { nth, extra } => {
                let there = tmp.exists();
                seen += u64::from(there && !was_there);
                was_there = there;
                if seen >= nth {
                    std::thread::sleep(extra);
                }
                seen >= nth
            }
        };
        if now {
            break;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    let _ = child.kill();
    let status = child.wait().unwrap();
    // It may have exited on its own between the last poll and the kill.
    !status.success()
}

/// The checkpoint at `path` reads and validates completely; returns its step.
fn validate(path: &Path, reference: &Checkpoint) -> u64 {
    let ckpt = Checkpoint::read(path)
        .unwrap_or_else(|e| panic!("the checkpoint left by a kill does not load: {e}"));
    let h = &ckpt.header;
    assert_eq!(h.dtype, DType::F32);
    assert_eq!(h.config, reference.header.config, "a different run");
    assert!((1..=TOTAL).contains(&h.step), "step {}", h.step);
    // Every tensor: model parameters, optimizer slots for this step, data statistics, nothing else.
    ckpt.inference_model::<f32>()
        .unwrap_or_else(|e| panic!("the checkpoint at step {} is inconsistent: {e}", h.step));
    h.step
}

/// Files in `dir` other than the checkpoint and its temporary file are a bug.
fn check_listing(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            name == CKPT || name == TMP || name == "straight.st",
            "unexpected file {name}"
        );
    }
}

#[test]
fn killed_saves_leave_the_last_complete_checkpoint_and_resume_finishes_the_run() {
    let rounds = env_or("TAPEGRAD_KILL_ROUNDS", 10);
    let mut rng = ChaCha8Rng::seed_from_u64(env_or("TAPEGRAD_KILL_SEED", 1));
    let base = tempdir("kill-base");
    let started = Instant::now();
    run(&fresh_args("straight.st"), &base);
    // Random kill moments are drawn up to a little past the uninterrupted run's length on this
    // machine, so a few land after the run ended.
    let window = started.elapsed().mul_f64(1.1);
    let straight_bytes = std::fs::read(base.join("straight.st")).unwrap();
    let reference = Checkpoint::read(base.join("straight.st")).unwrap();
    assert_eq!(reference.header.step, TOTAL);

    let (mut kills, mut torn_saves, mut lost_before_first_save, mut resumes) = (0, 0, 0, 0);
    for round in 0..rounds {
        let dir = tempdir(&format!("round{round}"));
        let ckpt = dir.join(CKPT);
        // The step of the last checkpoint seen: a later one may never be older.
        let mut last: Option<u64> = None;
        loop {
            let args = match last {
                None => fresh_args(CKPT),
                Some(step) => resume_args(step),
            };
            if last == Some(TOTAL) {
                break;
            }
            // Half of the resumed runs are killed again; every fresh one is.
            let kill = last.is_none() || rng.random_bool(0.5);
            if !kill {
                run(&args, &dir);
                resumes += 1;
                last = Some(validate(&ckpt, &reference));
                continue;
            }
            let at = if rng.random_bool(0.7) {
                KillAt::InSave {
                    nth: rng.random_range(1..=TOTAL - last.unwrap_or(0)),
                    extra: Duration::from_micros(rng.random_range(0..3000)),
                }
            } else {
                KillAt::After(window.mul_f64(rng.random_range(0.0..1.0)))
            };
            let killed = run_and_kill(&args, &dir, at);
            kills += u32::from(killed);
            resumes += u32::from(last.is_some());
            check_listing(&dir);
            if dir.join(TMP).exists() {
                torn_saves += 1;
            }
            if !ckpt.exists() {
                // Killed before its first save: nothing was saved, so nothing is lost.
                assert!(last.is_none(), "round {round}: the checkpoint vanished");
                lost_before_first_save += 1;
                continue;
            }
            let step = validate(&ckpt, &reference);
            if let Some(before) = last {
                assert!(step >= before, "round {round}: step {step} after {before}");
            }
            last = Some(step);
        }
        let bytes = std::fs::read(&ckpt).unwrap();
        assert!(
            bytes == straight_bytes,
            "round {round}: the resumed run's final checkpoint differs from the straight run's"
        );
        assert!(
            !dir.join(TMP).exists(),
            "round {round}: a temporary file outlived the final save"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
    std::fs::remove_dir_all(&base).unwrap();
    println!(
        "{rounds} rounds: {kills} kills, {torn_saves} left a torn temporary file (killed inside a \
         save), {lost_before_first_save} before the first save, {resumes} resumed runs; every \
         checkpoint loaded and every run finished byte-identical to the straight run"
    );
}

#[test]
fn save_every_needs_save_and_a_positive_count() {
    let dir = tempdir("kill-flags");
    for (args, expected) in [
        (
            vec!["train", "mlp", "--steps", "2", "--save-every", "1"],
            "--save-every N needs --save FILE",
        ),
        (
            vec![
                "train",
                "mlp",
                "--steps",
                "2",
                "--save-every",
                "0",
                "--save",
                "a.st",
            ],
            "--save-every needs a positive N",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tapegrad"))
            .args(&args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains(expected), "{e}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn intermediate_saves_change_nothing() {
    // The kill test above checks the mid-run checkpoints themselves; here, a run that saves every
    // 2 steps ends with the same bytes as one that saves only at the end.
    let dir = tempdir("kill-every");
    let args = |extra: &[&str]| -> Vec<String> {
        let mut a = vec![
            "train",
            "mlp",
            "--steps",
            "7",
            "--dropout",
            "0.1",
            "--quiet",
        ];
        a.extend(extra);
        a.into_iter().map(String::from).collect()
    };
    run(&args(&["--save-every", "2", "--save", "a.st"]), &dir);
    run(&args(&["--save", "b.st"]), &dir);
    assert_eq!(Checkpoint::read(dir.join("a.st")).unwrap().header.step, 7);
    assert!(std::fs::read(dir.join("a.st")).unwrap() == std::fs::read(dir.join("b.st")).unwrap());
    assert!(!dir.join(".a.st.tmp").exists());
    std::fs::remove_dir_all(dir).unwrap();
}
