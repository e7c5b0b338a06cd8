//! Named regressions: hand-computed cases and the calls that once failed, each pinned as found.
//! One test binary.

mod extreme_structure;
mod hand_computed;
mod mutants;
mod tape;
