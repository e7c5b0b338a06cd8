//! Each op family's forward, VJP, JVP, saves and errors, against hand-computed values and the
//! definitions. One test binary; tests/README.md maps each file to its family.

#[path = "../support/no_panic.rs"]
mod op_support;
#[path = "../support/ops_nn.rs"]
mod ops_nn_support;

mod activation_and_loss;
mod anomaly;
mod errors;
mod logsumexp;
mod loss_forms;
mod loss_options;
mod nn;
mod nn_attention;
mod nn_attention_broadcast;
mod nn_index;
mod nn_norm;
mod nn_options;
mod nn_options_attention;
mod nn_qkv_attention;
mod reduce_linalg_structure;
mod threads_vjp;
