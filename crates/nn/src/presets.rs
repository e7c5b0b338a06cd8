//! The defaults of `tapegrad train`'s table and image presets (digits, Auto MPG, a user's CSV
//! file): widths, optimizer, learning rate, schedule, batch size and length, as named values that
//! the command line only overrides. The GPT preset's defaults are [`crate::gpt::GptConfig::preset`].

use crate::data::DataSource;
use crate::layers::Activation;
use crate::model::ModelSpec;
use crate::schedule::Decay;

/// How the learning rate decays after warm-up, before the run's length fixes its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecayKind {
    /// The base rate throughout.
    Constant,
    /// `StepLR`: decay by `gamma` every `step_size` steps.
    Step,
    /// `CosineAnnealingLR` to zero over the steps after warm-up.
    Cosine,
}

/// What a run's schedule is built from: its length and the flags that shape the decay.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DecayOptions {
    /// The steps after warm-up that a cosine schedule anneals over (default: the rest of the run).
    pub cosine_steps: Option<u64>,
    /// The step schedule's interval (default: a third of the run).
    pub step_size: Option<u64>,
    /// The step schedule's factor (default 0.1).
    pub gamma: Option<f64>,
}

impl DecayKind {
    /// The decay of a run of `steps` steps whose first `warmup` steps warm up.
    pub fn build(self, steps: u64, warmup: u64, options: DecayOptions) -> Decay {
        match self {
            DecayKind::Constant => Decay::Constant,
            DecayKind::Step => Decay::Step {
                step_size: options.step_size.unwrap_or((steps / 3).max(1)),
                gamma: options.gamma.unwrap_or(0.1),
            },
            DecayKind::Cosine => Decay::Cosine {
                t_max: options
                    .cosine_steps
                    .unwrap_or(steps.saturating_sub(warmup))
                    .max(1),
                eta_min: 0.0,
            },
        }
    }
}

/// A preset's defaults; every field has a `tapegrad train` flag that overrides it.
#[derive(Debug, Clone, PartialEq)]
pub struct PresetDefaults {
    /// The name in the header, the checkpoint and the log.
    pub name: &'static str,
    /// The MLP's hidden widths.
    pub hidden: &'static [usize],
    /// The MLP's activation between layers.
    pub activation: Activation,
    /// The optimizer's name, as `OptimizerConfig::by_name` takes it.
    pub optimizer: &'static str,
    pub lr: f64,
    pub decay: DecayKind,
    pub batch_size: usize,
    /// Passes over the training split.
    pub epochs: u64,
    /// The fraction of rows held out for validation.
    pub val_fraction: f64,
    /// Seed for initialisation, split, shuffling and dropout.
    pub seed: u64,
}

/// `tapegrad train` (or `train digits`): the 8x8 digits images, 64-128-10 MLP with Adam.
pub const DIGITS: PresetDefaults = PresetDefaults {
    name: "digits",
    hidden: &[128],
    activation: Activation::Relu,
    optimizer: "adam",
    lr: 0.001,
    decay: DecayKind::Constant,
    batch_size: 32,
    epochs: 20,
    val_fraction: 0.2,
    seed: 0,
};

/// `tapegrad train mlp`: Auto MPG regression, 7-32-1 MLP with Adam and cosine decay.
pub const AUTO_MPG: PresetDefaults = PresetDefaults {
    name: "mlp",
    hidden: &[32],
    activation: Activation::Relu,
    optimizer: "adam",
    lr: 0.01,
    decay: DecayKind::Cosine,
    batch_size: 32,
    epochs: 100,
    val_fraction: 0.2,
    seed: 0,
};

/// `tapegrad train --csv FILE`: a user's table, with the Auto MPG preset's training defaults.
pub const CSV: PresetDefaults = PresetDefaults {
    name: "csv",
    ..AUTO_MPG
};

impl PresetDefaults {
    /// The defaults of the preset that trains on `data`.
    pub fn of(data: &DataSource) -> &'static PresetDefaults {
        match data {
            DataSource::Digits => &DIGITS,
            DataSource::AutoMpg => &AUTO_MPG,
            DataSource::Csv { .. } => &CSV,
        }
    }
}

/// The digits preset's CNN (`--model cnn`): two 3x3 convolutions of 16 and 32 channels with batch
/// norm, on the 1 x 8 x 8 images.
pub fn digits_cnn(outputs: usize, dropout: f64) -> ModelSpec {
    ModelSpec::Cnn {
        image: [1, 8, 8],
        channels: vec![16, 32],
        outputs,
        batch_norm: true,
        dropout,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_data_source_has_its_preset() {
        assert_eq!(PresetDefaults::of(&DataSource::Digits).name, "digits");
        assert_eq!(PresetDefaults::of(&DataSource::AutoMpg).name, "mlp");
        let csv = DataSource::Csv {
            path: "t.csv".into(),
            target: "y".into(),
            task: crate::data::TaskKind::Regression,
        };
        assert_eq!(PresetDefaults::of(&csv).name, "csv");
        assert_eq!(PresetDefaults::of(&csv).lr, AUTO_MPG.lr);
    }

    #[test]
    fn decays_take_the_run_length_unless_told() {
        let none = DecayOptions::default();
        assert_eq!(
            DecayKind::Cosine.build(100, 10, none),
            Decay::Cosine {
                t_max: 90,
                eta_min: 0.0
            }
        );
        assert_eq!(
            DecayKind::Step.build(100, 0, none),
            Decay::Step {
                step_size: 33,
                gamma: 0.1
            }
        );
        let told = DecayOptions {
            cosine_steps: Some(500),
            step_size: Some(7),
            gamma: Some(0.5),
        };
        assert_eq!(
            DecayKind::Cosine.build(100, 10, told),
            Decay::Cosine {
                t_max: 500,
                eta_min: 0.0
            }
        );
        assert_eq!(
            DecayKind::Step.build(2, 0, none),
            Decay::Step {
                step_size: 1,
                gamma: 0.1
            }
        );
        assert_eq!(DecayKind::Constant.build(0, 0, told), Decay::Constant);
    }
}
