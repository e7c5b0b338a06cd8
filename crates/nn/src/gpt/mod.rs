//! The GPT language model: its layers and names (`model`), character-level text data with seeded
//! windows (`text`), the run that trains it (`run`), its checkpoints (`checkpoint`) and sampling
//! with a key/value cache (`generate`).

pub mod checkpoint;
pub mod generate;
pub mod model;
pub mod run;

pub use model::{gpt, GptShape};
pub use run::{GptConfig, GptRun, GptStep};
