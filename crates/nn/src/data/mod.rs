//! Data: a CSV reader (`csv`), tables turned into numeric data sets with a chosen target
//! (`dataset`), the embedded Auto MPG and digits tables (`embedded`), standardisation fitted on the
//! training split (`standardize`), the seeded split and per-epoch shuffled mini-batch order
//! (`order`), the prepared train/validation tensors a trainer consumes (`prepared`), and
//! character-level text for language models (`text`).

mod csv;
mod dataset;
pub mod embedded;
mod order;
mod prepared;
mod source;
mod standardize;
pub mod text;

pub use csv::{parse_csv, Table};
pub use dataset::{Dataset, Targets, TaskKind};
pub use order::{split_indices, BatchOrder};
pub use prepared::{standardize_rows, Batch, BatchTargets, Prepared, Split, SplitTargets, Task};
pub use source::DataSource;
pub use standardize::Standardizer;
