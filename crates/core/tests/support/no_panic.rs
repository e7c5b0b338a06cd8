//! Shared by the root tests that throw hostile or extreme arguments at ops: a call must neither
//! panic nor fail with an error that does not name its op.

use std::panic::{catch_unwind, AssertUnwindSafe};
use tapegrad_core::Op;

/// Runs `f`, failing with `what` if it panics or returns an error that does not name `op`.
pub fn no_panic_and_named<T, E: std::fmt::Display>(
    op: &Op,
    what: &str,
    f: impl FnOnce() -> Result<T, E>,
) -> Option<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Err(_) => panic!("{op}: {what} panicked"),
        Ok(Err(e)) => {
            let msg = e.to_string();
            assert!(
                msg.contains(op.name()),
                "{op}: {what}: the error does not name the op: {msg}"
            );
            None
        }
        Ok(Ok(v)) => Some(v),
    }
}
