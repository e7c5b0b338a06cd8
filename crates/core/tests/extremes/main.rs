//! Extreme arguments: huge, zero-size and hostile shapes and attributes; nothing may panic,
//! errors name the op. One test binary.

#[path = "../support/no_panic.rs"]
mod op_support;
#[path = "../support/term_model.rs"]
mod term_model;

mod structure;
mod unallocatable_results;
mod windows;
