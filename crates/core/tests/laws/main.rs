//! The laws of docs/design.md section 5, each checked on random programs built from every op, and
//! the tape's own sweep tests. One test binary; tests/README.md maps each file to its law.

#[path = "../support/graph_programs.rs"]
mod graph_support;
#[path = "../support/ops_nn.rs"]
mod ops_nn_support;

mod law1_executed_vs_reference;
mod law2_tape_vs_graph;
mod law3_lowered_executed;
mod law4_recompute;
mod law4_saved_bits;
mod law5_adjoint;
mod law6_finite_differences;
mod law7_audit;
mod law8_skipping;
mod nn_op_laws;
mod observed_sweeps;
mod op_hooks;
mod tape_backward_at;
mod tape_linear_steps;
