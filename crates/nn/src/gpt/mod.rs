//! The GPT language model: its layers and names (`model`), character-level text data with seeded
//! windows (`text`), the run that trains it (`run`), its checkpoints (`checkpoint`), sampling
//! with a key/value cache (`generate`) and weights saved by PyTorch (`import`).

pub mod checkpoint;
pub mod generate;
pub mod import;
pub mod model;
mod preset;
pub mod run;

pub use model::{gpt, GptShape};
pub use preset::GptPreset;
pub use run::{GptConfig, GptRun, GptStep};
