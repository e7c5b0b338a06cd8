//! Runs the `tapegrad` binary from root tests: raw output, success or failure with the other
//! stream in the assertion message, and a fresh temporary folder per call.
// Each test binary uses a subset of these helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs `tapegrad args` in `dir`.
pub fn tapegrad(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tapegrad"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the tapegrad binary runs")
}

/// Runs `tapegrad args` in `dir`, asserts it succeeds, and returns its stdout.
pub fn ok(args: &[&str], dir: &Path) -> String {
    let out = tapegrad(args, dir);
    assert!(
        out.status.success(),
        "tapegrad {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `tapegrad args` in `dir`, asserts it fails, and returns its stderr.
pub fn fails(args: &[&str], dir: &Path) -> String {
    let out = tapegrad(args, dir);
    assert!(
        !out.status.success(),
        "tapegrad {args:?} should fail: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).unwrap()
}

/// An empty folder `tapegrad-TAG-PID-N` under the system temporary folder, fresh on every call:
/// tests run in parallel threads of one process, and two of them asking for the same tag must not
/// share (and remove) one folder.
pub fn tempdir(tag: &str) -> PathBuf {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("tapegrad-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
