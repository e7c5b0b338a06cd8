//! Checkpoints: a run's parameters, buffers, optimizer state and data statistics in one
//! safetensors file, with a metadata header (format version, preset, dtype, step, seed, the run's
//! config, the data-order position and a checksum of everything). Files are written atomically
//! (temporary file in the same folder, fsync, rename, fsync of the folder), so a failed save
//! leaves the previous file intact. Reading checks the checksum, the format, the dtype, and every
//! tensor's name and shape against the model, and says which one differs.

use crate::backend::Backend;
use crate::data::{BatchOrder, Prepared, Standardizer, Task};
use crate::error::{NnError, NnResult};
use crate::model::Model;
use crate::optim::Optimizer;
use crate::trainer::{TrainConfig, Trainer};
use std::path::{Path, PathBuf};
use tapegrad_tensor::{DType, Scalar};

pub(crate) mod container;

use container::{f64_stored, to_json, Contents, Verified};
pub use container::{write_atomic, FORMAT, FORMAT_VERSION};

/// The metadata of a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    pub format_version: u32,
    pub preset: String,
    pub dtype: DType,
    /// Optimizer steps taken.
    pub step: u64,
    pub seed: u64,
    pub config: TrainConfig,
    /// Data-order position: completed epochs and the cursor in the current epoch's shuffle.
    pub epoch: u64,
    pub cursor: usize,
    pub task: Task,
    pub feature_names: Vec<String>,
    /// The layer stack, for people reading the file.
    pub model: String,
}

/// The data statistics stored beside the model and optimizer state.
const DATA_TENSORS: [&str; 4] = [
    "data.feature_mean",
    "data.feature_std",
    "data.target_mean",
    "data.target_std",
];

/// Saves `trainer` to `path` atomically.
pub fn save<S: Scalar>(path: impl AsRef<Path>, trainer: &Trainer<S>) -> NnResult<()> {
    let mut file = Contents::new(
        &trainer.config.preset,
        trainer.step,
        trainer.config.seed,
        &trainer.model,
        &trainer.optimizer,
    );
    let data = &trainer.data;
    file.tensors
        .insert(DATA_TENSORS[0].into(), f64_stored(&data.features.mean));
    file.tensors
        .insert(DATA_TENSORS[1].into(), f64_stored(&data.features.std));
    if let Some(t) = &data.target {
        file.tensors
            .insert(DATA_TENSORS[2].into(), f64_stored(&t.mean));
        file.tensors
            .insert(DATA_TENSORS[3].into(), f64_stored(&t.std));
    }
    file.meta
        .insert("epoch".into(), trainer.order.epoch().to_string());
    file.meta
        .insert("cursor".into(), trainer.order.cursor().to_string());
    file.meta.insert("config".into(), to_json(&trainer.config)?);
    file.meta.insert("task".into(), to_json(&data.task)?);
    file.meta
        .insert("features".into(), to_json(&data.feature_names)?);
    file.write(path.as_ref())
}

/// A checkpoint read from disk and checked for corruption.
pub struct Checkpoint {
    pub path: PathBuf,
    pub header: Header,
    file: Verified,
}

impl Checkpoint {
    /// Reads and verifies the file at `path` (never modifies it).
    pub fn read(path: impl AsRef<Path>) -> NnResult<Checkpoint> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| NnError::io(path, e))?;
        Checkpoint::from_bytes(path, &bytes)
    }

    /// Verifies a checkpoint's `bytes` as `read` does; `path` only names the file in messages.
    pub fn from_bytes(path: impl AsRef<Path>, bytes: &[u8]) -> NnResult<Checkpoint> {
        let path = path.as_ref();
        let file = Verified::from_bytes(path, bytes, "tapegrad checkpoint")?;
        let preset = file.field("preset")?.clone();
        if preset == crate::gpt::checkpoint::PRESET {
            return Err(file.err(
                "this is a GPT checkpoint (preset 'gpt'): `train gpt --resume`, `eval` and \
                 `generate` read it"
                    .into(),
            ));
        }
        let header = Header {
            format_version: FORMAT_VERSION,
            preset,
            dtype: file.dtype,
            step: file.step,
            seed: file.parse("seed")?,
            config: file.json("config")?,
            epoch: file.parse("epoch")?,
            cursor: file.parse("cursor")?,
            task: file.json("task")?,
            feature_names: file.json("features")?,
            model: file.field("model")?.clone(),
        };
        // Readers size their outputs by the task and their inputs by the feature names: both
        // must agree with the model the config describes (`predict` indexes rows by them).
        let (outputs, inputs) = (header.config.model.outputs(), header.config.model.inputs());
        if header.task.outputs() != outputs || header.feature_names.len() != inputs {
            return Err(file.err(format!(
                "the task has {} outputs and {} feature names, but the model {} has {outputs} outputs and {inputs} inputs",
                header.task.outputs(),
                header.feature_names.len(),
                header.config.model.name()
            )));
        }
        Ok(Checkpoint {
            path: path.to_path_buf(),
            header,
            file,
        })
    }

    fn err(&self, message: String) -> NnError {
        self.file.err(message)
    }

    /// The model, built from the stored spec and filled with the stored tensors.
    pub fn model<S: Scalar>(&self) -> NnResult<Model<S>> {
        self.file.expect_dtype::<S>()?;
        self.model_from(&self.header.config)
    }

    /// Fills a model built from `config` with the stored tensors, checking names and shapes.
    pub fn model_from<S: Scalar>(&self, config: &TrainConfig) -> NnResult<Model<S>> {
        self.file.model(&config.model, config.seed)
    }

    /// The optimizer state for `model`, as saved.
    pub fn optimizer<S: Scalar>(&self, model: &Model<S>) -> NnResult<Optimizer<S>> {
        self.file.optimizer(self.header.config.optimizer, model)
    }

    /// The feature statistics and, for regression, the target statistics.
    pub fn standardizers(&self) -> NnResult<(Standardizer, Option<Standardizer>)> {
        let width = self.header.feature_names.len();
        let features = Standardizer {
            mean: self.file.f64_vec("data.feature_mean", width)?,
            std: self.file.f64_vec("data.feature_std", width)?,
        };
        let target = match self.header.task {
            Task::Regression => Some(Standardizer {
                mean: self.file.f64_vec("data.target_mean", 1)?,
                std: self.file.f64_vec("data.target_std", 1)?,
            }),
            Task::Classification { .. } => None,
        };
        Ok((features, target))
    }

    /// Rejects tensors the model, optimizer and data statistics do not account for.
    fn check_no_extra<S: Scalar>(&self, model: &Model<S>) -> NnResult<()> {
        let slots = self.header.config.optimizer.slot_names();
        self.file.check_no_extra(model, slots, &DATA_TENSORS)
    }

    /// A trainer that continues this run where it stopped: same data (reloaded and checked against
    /// the stored statistics), parameters, optimizer state and data-order position.
    pub fn resume<S: Scalar>(&self, backend: Box<dyn Backend<S>>) -> NnResult<Trainer<S>> {
        let model = self.model::<S>()?;
        let optimizer = self.optimizer(&model)?;
        self.check_no_extra(&model)?;
        let config = self.header.config.clone();
        let data = Prepared::<S>::new(&config.data.load()?, config.val_fraction, config.seed)?;
        let (features, target) = self.standardizers()?;
        if data.features != features
            || data.target != target
            || data.feature_names != self.header.feature_names
        {
            return Err(self.err(format!(
                "the data from {} differs from the data this checkpoint was trained on (feature columns or statistics changed)",
                config.data.describe()
            )));
        }
        let order = BatchOrder::at(
            data.train.len(),
            config.batch_size,
            config.seed,
            self.header.epoch,
            self.header.cursor,
        )?;
        Trainer::from_parts(
            config,
            model,
            optimizer,
            data,
            order,
            self.header.step,
            backend,
        )
    }

    /// The model for evaluation or prediction, with every stored tensor checked.
    pub fn inference_model<S: Scalar>(&self) -> NnResult<Model<S>> {
        let model = self.model::<S>()?;
        self.optimizer(&model)?;
        self.check_no_extra(&model)?;
        Ok(model)
    }
}
