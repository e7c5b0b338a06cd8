//! The nn crate's tests of training as a whole, one test binary (one module per subject): layers,
//! data, optimizers, the trainer's determinism, accumulation and checkpoints, the laws on whole
//! models and `--verify-every`. Tests that set global state (the thread count, a counting
//! allocator) stay in binaries of their own: parallel_*.rs, steady_state.rs.

mod accumulate;
mod checkpoint_files;
mod data_pipeline;
mod determinism_resume;
mod layers_init_schedule;
mod model_laws;
mod nn_layers;
mod optim_formulas;
mod verify_steps;
