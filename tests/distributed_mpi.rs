//! `train --accumulate K` and `train --distributed` through the binary. Always: K = 1 writes the
//! checkpoint bytes of a run without the flag. With the `mpi` feature (`cargo test --features
//! mpi --test distributed_mpi`, MPICH's `mpiexec` on the PATH): law 10 of `docs/design.md`, N
//! ranks give the checkpoint bytes of `--accumulate N` in one process, for N = 2 and 3, the MLP
//! and the CNN, eager and compiled, with gradient buckets through the shared window, all-gathered
//! during the backward (`TAPEGRAD_DDP_SHARED=0`) or after it (`TAPEGRAD_DDP_OVERLAP=0`); resuming on N ranks; ranks that disagree on the data stop
//! with an error on every rank; a killed rank ends the job in bounded time. The same for a tiny
//! `train gpt`: law 10 on 2 and 3 ranks, eager and compiled, f32 and f64; resume on 2 ranks; a
//! rank given another `--text` is an error on every rank.

mod cli_support;

use cli_support::{ok, tempdir};

#[test]
fn accumulate_one_writes_the_bytes_of_a_run_without_the_flag() {
    let dir = tempdir("acc-one");
    let run = ["train", "--steps", "5", "--dropout", "0.2", "--quiet"];
    ok(&[&run[..], &["--save", "plain.st"]].concat(), &dir);
    ok(
        &[&run[..], &["--accumulate", "1", "--save", "k1.st"]].concat(),
        &dir,
    );
    let plain = std::fs::read(dir.join("plain.st")).unwrap();
    assert_eq!(plain, std::fs::read(dir.join("k1.st")).unwrap());
    std::fs::remove_dir_all(dir).unwrap();
}

#[cfg(not(feature = "mpi"))]
#[test]
fn distributed_without_the_feature_says_how_to_build_it() {
    let dir = tempdir("dist-nofeature");
    let err = cli_support::fails(&["train", "--steps", "1", "--distributed"], &dir);
    assert!(err.contains("--features mpi"), "{err}");
    let gpt = [TINY_GPT, &["--steps", "1", "--distributed"]].concat();
    let err = cli_support::fails(&gpt, &dir);
    assert!(err.contains("--features mpi"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A GPT small enough for a debug-ish test build: 7 windows a step, so 2 ranks run 4 and 3 and
/// 3 ranks run 3, 2 and 2 (uneven on purpose), with dropout on.
const TINY_GPT: &[&str] = &[
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
    "7",
    "--dropout",
    "0.1",
    "--quiet",
];

#[cfg(feature = "mpi")]
mod mpi {
    use super::cli_support::{ok, tempdir};
    use super::TINY_GPT;
    use std::path::Path;
    use std::process::{Command, Output};

    /// `mpiexec -n ranks tapegrad args` in `dir`.
    fn mpiexec(ranks: usize, args: &[&str], dir: &Path) -> Output {
        mpiexec_env(ranks, args, dir, &[])
    }

    /// `mpiexec -n ranks tapegrad args` in `dir`, with `env` set for every rank.
    fn mpiexec_env(ranks: usize, args: &[&str], dir: &Path, env: &[(&str, &str)]) -> Output {
        Command::new("mpiexec")
            .envs(env.iter().copied())
            .arg("-n")
            .arg(ranks.to_string())
            .arg(env!("CARGO_BIN_EXE_tapegrad"))
            .args(args)
            .current_dir(dir)
            .output()
            .expect("mpiexec runs (install MPICH: apt-get install mpich libmpich-dev)")
    }

    fn mpi_ok(ranks: usize, args: &[&str], dir: &Path) -> String {
        mpi_ok_env(ranks, args, dir, &[])
    }

    fn mpi_ok_env(ranks: usize, args: &[&str], dir: &Path, env: &[(&str, &str)]) -> String {
        let out = mpiexec_env(ranks, args, dir, env);
        assert!(
            out.status.success(),
            "mpiexec -n {ranks} tapegrad {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn same_bytes(dir: &Path, a: &str, b: &str, what: &str) {
        let (x, y) = (
            std::fs::read(dir.join(a)).unwrap(),
            std::fs::read(dir.join(b)).unwrap(),
        );
        assert!(x == y, "{what}: {a} and {b} differ");
    }

    #[test]
    fn n_ranks_give_the_bits_of_accumulate_n_in_one_process() {
        let dir = tempdir("dist-law10");
        // 27-row batches: with 2 ranks the micro-batches are 14 and 13 rows (uneven on purpose).
        let mlp: &[&str] = &["train", "--dropout", "0.2", "--batch-size", "27"];
        let cnn: &[&str] = &["train", "--model", "cnn", "--dropout", "0.1", "--clip", "1"];
        for (name, model) in [("mlp", mlp), ("cnn", cnn)] {
            for backend in ["eager", "compiled"] {
                for n in [2usize, 3] {
                    let k = n.to_string();
                    let common =
                        [model, &["--steps", "6", "--quiet", "--backend", backend]].concat();
                    let one = format!("{name}-{backend}-{n}-one.st");
                    let dist = format!("{name}-{backend}-{n}-dist.st");
                    ok(
                        &[&common[..], &["--accumulate", &k, "--save", &one]].concat(),
                        &dir,
                    );
                    let out = mpi_ok(
                        n,
                        &[&common[..], &["--distributed", "--save", &dist]].concat(),
                        &dir,
                    );
                    // Only rank 0 prints its summary.
                    assert_eq!(out.matches("validation loss").count(), 1, "{out}");
                    same_bytes(&dir, &one, &dist, &format!("{name} {backend} on {n} ranks"));
                }
            }
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn small_buckets_and_f64_change_nothing() {
        let dir = tempdir("dist-buckets");
        let common: &[&str] = &["train", "--steps", "4", "--quiet", "--dtype", "f64"];
        ok(
            &[common, &["--accumulate", "2", "--save", "one.st"]].concat(),
            &dir,
        );
        // 0.01 MiB buckets: the MLP's f64 gradients go in 2 all-gathers (the last layer's
        // tensors and the first bias, then the first weight), started during the backward.
        let dist = ["--distributed", "--bucket-mb", "0.01", "--save", "dist.st"];
        mpi_ok(2, &[common, &dist[..]].concat(), &dir);
        same_bytes(&dir, "one.st", "dist.st", "f64, small buckets");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn buckets_through_the_window_or_all_gathered_during_or_after_the_backward_change_nothing() {
        let dir = tempdir("dist-overlap");
        for backend in ["eager", "compiled"] {
            let common = [
                "train",
                "--model",
                "cnn",
                "--steps",
                "3",
                "--quiet",
                "--backend",
                backend,
            ];
            let one = format!("{backend}-one.st");
            ok(
                &[&common[..], &["--accumulate", "3", "--save", &one]].concat(),
                &dir,
            );
            // 1 KiB buckets: three, the last also carrying the batch norms' running statistics;
            // through the shared window (the default on one host), all-gathered during the
            // backward (as on several hosts), or all-gathered after it.
            let paths: [(&str, &[(&str, &str)]); 3] = [
                ("window", &[]),
                ("during", &[("TAPEGRAD_DDP_SHARED", "0")]),
                ("after", &[("TAPEGRAD_DDP_OVERLAP", "0")]),
            ];
            for (path, env) in paths {
                let dist = format!("{backend}-{path}.st");
                let flags = ["--distributed", "--bucket-mb", "0.001", "--save", &dist];
                mpi_ok_env(3, &[&common[..], &flags[..]].concat(), &dir, env);
                let what = format!("{backend}, small buckets, exchanged {path}");
                same_bytes(&dir, &one, &dist, &what);
            }
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn resume_on_n_ranks_gives_the_uninterrupted_bits() {
        let dir = tempdir("dist-resume");
        let model: &[&str] = &["train", "--model", "cnn", "--quiet"];
        mpi_ok(
            2,
            &[
                model,
                &["--steps", "6", "--distributed", "--save", "straight.st"],
            ]
            .concat(),
            &dir,
        );
        mpi_ok(
            2,
            &[
                model,
                &["--steps", "3", "--distributed", "--save", "half.st"],
            ]
            .concat(),
            &dir,
        );
        let resume = [
            "train",
            "--resume",
            "half.st",
            "--steps",
            "3",
            "--distributed",
            "--save",
            "resumed.st",
        ];
        let out = mpi_ok(2, &resume, &dir);
        // Only rank 0 prints, from the first line on.
        assert_eq!(out.matches("resuming half.st").count(), 1, "{out}");
        same_bytes(&dir, "straight.st", "resumed.st", "resume on 2 ranks");
        // The saved run has 2 micro-batches per step: 3 ranks cannot continue it.
        let out = mpiexec(3, &resume, &dir);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("run it on 2 ranks"),
            "{err}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn one_rank_runs_as_one_process_and_says_so() {
        let dir = tempdir("dist-one");
        let out = ok(
            &["train", "--steps", "3", "--distributed", "--save", "d.st"],
            &dir,
        );
        assert!(out.contains("running as one process"), "{out}");
        ok(
            &["train", "--steps", "3", "--quiet", "--save", "p.st"],
            &dir,
        );
        same_bytes(&dir, "p.st", "d.st", "--distributed on one rank");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn ranks_with_different_data_stop_with_an_error_on_every_rank() {
        let dir = tempdir("dist-data");
        let table = |last: &str| format!("a,b,y\n1,2,3\n2,1,4\n3,3,5\n4,0,{last}\n5,5,1\n6,1,2\n");
        // The same flags (the same file name) in two folders holding different tables.
        for (sub, last) in [("a", "6"), ("b", "7")] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
            std::fs::write(dir.join(sub).join("t.csv"), table(last)).unwrap();
        }
        let run = [
            "train",
            "--csv",
            "t.csv",
            "--target",
            "y",
            "--batch-size",
            "2",
            "--steps",
            "2",
            "--distributed",
        ];
        let ranks = [
            (&["-wdir", "a"][..], &run[..]),
            (&["-wdir", "b"][..], &run[..]),
        ];
        fails_on_both_ranks(&dir, ranks, "rank 1's data differ from rank 0's");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn ranks_with_different_bucket_sizes_or_exchange_modes_stop_with_an_error_on_every_rank() {
        let dir = tempdir("dist-buckets");
        let run = ["train", "--model", "cnn", "--steps", "2", "--distributed"];
        let small = [&run[..], &["--bucket-mb", "0.001"]].concat();
        let what = "rank 1's configuration differs from rank 0's (other flags such as --bucket-mb";
        fails_on_both_ranks(&dir, [(&[][..], &run[..]), (&[][..], &small[..])], what);
        // The same flags, but rank 1 told to exchange by all-gathers instead of the window.
        let all_gathers = ["-env", "TAPEGRAD_DDP_SHARED", "0"];
        fails_on_both_ranks(
            &dir,
            [(&[][..], &run[..]), (&all_gathers[..], &run[..])],
            what,
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Runs two ranks in `dir`, each with its `mpiexec` options and its arguments, and checks
    /// that the job fails with `what` on both.
    fn fails_on_both_ranks(dir: &Path, ranks: [(&[&str], &[&str]); 2], what: &str) {
        let bin = env!("CARGO_BIN_EXE_tapegrad");
        let [(options0, args0), (options1, args1)] = ranks;
        let out = Command::new("mpiexec")
            .args(["-n", "1"])
            .args(options0)
            .arg(bin)
            .args(args0)
            .args([":", "-n", "1"])
            .args(options1)
            .arg(bin)
            .args(args1)
            .current_dir(dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert_eq!(err.matches(what).count(), 2, "{err}");
    }

    /// The process of `rank` running in `dir` (MPICH gives each rank `PMI_RANK` in its
    /// environment).
    fn rank_pid(dir: &Path, rank: usize) -> Option<String> {
        let want = format!("PMI_RANK={rank}");
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid = e.file_name().to_string_lossy().to_string();
            pid.parse::<u32>().ok()?;
            let cwd = std::fs::read_link(e.path().join("cwd")).ok()?;
            let env = std::fs::read(e.path().join("environ")).ok()?;
            let exe = std::fs::read_link(e.path().join("exe")).ok()?;
            let ours = cwd == dir && exe.ends_with("tapegrad");
            let rank_here = env.split(|&b| b == 0).any(|v| v == want.as_bytes());
            (ours && rank_here).then_some(pid)
        })
    }

    #[test]
    fn a_killed_rank_ends_the_job_in_bounded_time_and_the_checkpoint_stays_valid() {
        use std::time::{Duration, Instant};
        let dir = tempdir("dist-kill").canonicalize().unwrap();
        let mut job = Command::new("mpiexec")
            .args(["-n", "2", env!("CARGO_BIN_EXE_tapegrad")])
            .args(["train", "--model", "cnn", "--steps", "1000000", "--quiet"])
            .args(["--save", "run.st", "--save-every", "3", "--distributed"])
            .current_dir(&dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let wait_for = |what: &str, done: &mut dyn FnMut() -> bool| {
            let start = Instant::now();
            while !done() {
                assert!(
                    start.elapsed() < Duration::from_secs(120),
                    "waited 120 s for {what}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        wait_for("the first checkpoint", &mut || dir.join("run.st").exists());
        let mut pid = None;
        wait_for("rank 1's process", &mut || {
            pid = rank_pid(&dir, 1);
            pid.is_some()
        });
        let killed = Command::new("kill")
            .args(["-KILL", pid.as_deref().unwrap()])
            .status()
            .unwrap();
        assert!(killed.success());
        let mut status = None;
        wait_for("the job to end after the kill", &mut || {
            status = job.try_wait().unwrap();
            status.is_some()
        });
        let mut err = String::new();
        std::io::Read::read_to_string(job.stdout.as_mut().unwrap(), &mut err).unwrap();
        std::io::Read::read_to_string(job.stderr.as_mut().unwrap(), &mut err).unwrap();
        assert!(!status.unwrap().success(), "{err}");
        // MPICH's mpiexec names the rank that died and how.
        assert!(err.contains("BAD TERMINATION"), "{err}");
        // The last checkpoint loads and continues, here in one process (2 micro-batches a step).
        let out = ok(&["train", "--resume", "run.st", "--steps", "2"], &dir);
        assert!(out.contains("resuming"), "{out}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn gpt_on_n_ranks_gives_the_bits_of_accumulate_n_in_one_process() {
        let dir = tempdir("dist-gpt-law10");
        // f64 with 1 KiB buckets (several all-gathers started during the backward) on the
        // compiled backend; f32 with the default buckets (one) on the eager one.
        let eager: &[&str] = &["--backend", "eager"];
        let compiled: &[&str] = &["--backend", "compiled", "--dtype", "f64"];
        for (backend, flags, buckets) in [("eager", eager, "25"), ("compiled", compiled, "0.001")] {
            for n in [2usize, 3] {
                let k = n.to_string();
                let common = [TINY_GPT, flags, &["--steps", "3"]].concat();
                let one = format!("gpt-{backend}-{n}-one.st");
                let dist = format!("gpt-{backend}-{n}-dist.st");
                ok(
                    &[&common[..], &["--accumulate", &k, "--save", &one]].concat(),
                    &dir,
                );
                let flags = ["--distributed", "--bucket-mb", buckets, "--save", &dist];
                let out = mpi_ok(n, &[&common[..], &flags[..]].concat(), &dir);
                // Only rank 0 prints its summary.
                assert_eq!(out.matches("validation loss").count(), 1, "{out}");
                same_bytes(&dir, &one, &dist, &format!("gpt {backend} on {n} ranks"));
            }
        }
        // One micro-batch per rank: another --accumulate is a usage error.
        let out = mpiexec(
            2,
            &[
                TINY_GPT,
                &["--steps", "1", "--accumulate", "3", "--distributed"],
            ]
            .concat(),
            &dir,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("--accumulate 3 with --distributed on 2 ranks"),
            "{err}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn gpt_resume_on_n_ranks_gives_the_uninterrupted_bits() {
        let dir = tempdir("dist-gpt-resume");
        let run = |steps: &str, save: &str| {
            let flags = ["--steps", steps, "--schedule-steps", "4", "--save", save];
            mpi_ok(
                2,
                &[TINY_GPT, &flags[..], &["--distributed"]].concat(),
                &dir,
            );
        };
        run("4", "straight.st");
        run("2", "half.st");
        let resume = [
            "train",
            "--resume",
            "half.st",
            "--steps",
            "2",
            "--distributed",
            "--save",
            "resumed.st",
        ];
        let out = mpi_ok(2, &resume, &dir);
        assert_eq!(out.matches("resuming half.st").count(), 1, "{out}");
        same_bytes(&dir, "straight.st", "resumed.st", "gpt resume on 2 ranks");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn gpt_ranks_with_different_text_stop_with_an_error_on_every_rank() {
        let dir = tempdir("dist-gpt-text");
        // The same flags (the same file name) in two folders holding texts of the same
        // characters in another order: the vocabulary and the model agree, the text does not.
        let line = "to be, or not to be: that is the question.\n";
        for (sub, text) in [("a", line.to_string()), ("b", line.chars().rev().collect())] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
            std::fs::write(dir.join(sub).join("t.txt"), text.repeat(20)).unwrap();
        }
        let run = [
            TINY_GPT,
            &["--text", "t.txt", "--steps", "2", "--distributed"],
        ]
        .concat();
        let ranks = [
            (&["-wdir", "a"][..], &run[..]),
            (&["-wdir", "b"][..], &run[..]),
        ];
        fails_on_both_ranks(&dir, ranks, "rank 1's text differs from rank 0's");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
