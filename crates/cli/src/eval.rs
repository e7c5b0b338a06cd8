//! `tapegrad eval --load PATH`: reloads a checkpoint and its data (checked against the statistics
//! stored with it) and reports the loss and metric on the validation (or training) split; for a
//! GPT checkpoint, the validation loss per character and the perplexity.

use crate::engine_flags::{by_dtype, EngineFlags};
use crate::error::CliResult;
use clap::ValueEnum;
use std::path::PathBuf;
use tapegrad_nn::checkpoint::Checkpoint;
use tapegrad_nn::data::DataSource;
use tapegrad_nn::gpt::checkpoint::GptCheckpoint;
use tapegrad_nn::summary::format_metric;
use tapegrad_nn::trainer::metric_name;
use tapegrad_nn::{make_backend, Which};
use tapegrad_tensor::Scalar;

/// Which split `eval` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SplitArg {
    Validation,
    Train,
}

/// Arguments of `tapegrad eval`.
#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// The checkpoint to evaluate.
    #[arg(long)]
    pub load: PathBuf,
    /// The split to report.
    #[arg(long, value_enum, default_value = "validation")]
    pub split: SplitArg,
    #[command(flatten)]
    pub engine: EngineFlags,
}

/// Runs `tapegrad eval`.
pub fn run(args: EvalArgs) -> CliResult {
    args.engine.apply()?;
    if crate::train_gpt::is_gpt_checkpoint(&args.load) {
        let ckpt = GptCheckpoint::read(&args.load)?;
        return by_dtype!(ckpt.dtype, eval_gpt(&args, &ckpt));
    }
    let ckpt = Checkpoint::read(&args.load)?;
    by_dtype!(ckpt.header.dtype, eval_typed(&args, &ckpt))
}

fn eval_typed<S: Scalar>(args: &EvalArgs, ckpt: &Checkpoint) -> CliResult {
    let mut trainer = ckpt.resume::<S>(make_backend::<S>(args.engine.backend())?)?;
    let (which, split, rows) = match args.split {
        SplitArg::Validation => (Which::Validation, "validation", trainer.data.val.len()),
        SplitArg::Train => (Which::Train, "train", trainer.data.train.len()),
    };
    let e = trainer.evaluate(which)?;
    let metric = metric_name(&trainer.data.task);
    let unit = match (&trainer.config.data, metric) {
        (DataSource::AutoMpg, "rmse") => " (mpg)",
        _ => "",
    };
    println!(
        "{}: {} at step {}, {split} split ({rows} rows of {})",
        args.load.display(),
        trainer.model.spec.name(),
        trainer.step,
        trainer.config.data.describe()
    );
    println!("loss {:.6}", e.loss);
    println!("{metric}{unit} {}", format_metric(metric, e.metric));
    Ok(std::process::ExitCode::SUCCESS)
}

/// A GPT checkpoint: the validation loss per character on the run's fixed windows, and the
/// perplexity (`--split train` is not offered: the training windows are drawn per step).
fn eval_gpt<S: Scalar>(args: &EvalArgs, ckpt: &GptCheckpoint) -> CliResult {
    if args.split == SplitArg::Train {
        return Err(crate::error::CliError::Usage(
            "a gpt checkpoint is evaluated on its validation text; remove --split train".into(),
        ));
    }
    let mut run = ckpt.resume::<S>(make_backend::<S>(args.engine.backend())?)?;
    let loss = run.evaluate()?;
    println!(
        "{}: {} at step {}, validation text (the last {} characters of {}, {} windows)",
        args.load.display(),
        run.model.spec.name(),
        run.step,
        run.data.val.len(),
        run.config.text.describe(),
        run.config.val_windows
    );
    println!("loss {loss:.6} nats/char");
    println!("perplexity {:.4}", loss.exp());
    Ok(std::process::ExitCode::SUCCESS)
}
