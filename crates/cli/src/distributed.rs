//! `train --distributed`: makes the process one rank of a data-parallel job started by `mpiexec`
//! (a build with the `mpi` cargo feature). Owns the MPI side only: starting MPI, the bucketed
//! all-gather behind `tapegrad_nn::trainer::Exchange`, and which rank writes files; the step
//! itself (rank k runs micro-batch k, the sum in rank order) is the trainer's accumulation.

use crate::error::CliError;
use crate::train::TrainOptions;
use tapegrad_nn::Trainer;
use tapegrad_tensor::Scalar;

/// Joins the job when `--distributed` is given and returns whether this process is rank 0, the
/// one that prints, logs, plots and writes checkpoints. One rank (or no `mpiexec`) runs as one
/// process, with the run's own `--accumulate`.
pub(crate) fn attach<S: Scalar>(
    args: &TrainOptions,
    trainer: &mut Trainer<S>,
) -> Result<bool, CliError> {
    if !args.distributed {
        return Ok(true);
    }
    if !(args.bucket_mb > 0.0 && args.bucket_mb.is_finite()) {
        return Err(CliError::Usage(format!(
            "--bucket-mb needs a positive size in MiB, found {}",
            args.bucket_mb
        )));
    }
    join(args, trainer)
}

#[cfg(not(feature = "mpi"))]
fn join<S: Scalar>(_args: &TrainOptions, _trainer: &mut Trainer<S>) -> Result<bool, CliError> {
    Err(CliError::Usage(
        "--distributed needs a build with MPI: install MPICH (apt-get install mpich libmpich-dev \
         libclang-dev) and build with `cargo build --release --features mpi` (see docs/distributed.md)"
            .into(),
    ))
}

#[cfg(feature = "mpi")]
fn join<S: Scalar>(args: &TrainOptions, trainer: &mut Trainer<S>) -> Result<bool, CliError> {
    let mut exchange = mpi_exchange::MpiExchange::start(args.bucket_mb)?;
    let (rank, size) = (exchange.rank, exchange.size);
    let root = rank == 0;
    if size == 1 {
        tapegrad_nn::trainer::Exchange::finish(&mut exchange);
        if !args.quiet {
            println!(
                "note: --distributed on one rank (no mpiexec, or -n 1): running as one process"
            );
        }
        return Ok(true);
    }
    if args.resume.is_none() {
        if let Some(k) = args.accumulate.filter(|&k| k != size) {
            return Err(CliError::Usage(format!(
                "--accumulate {k} with --distributed on {size} ranks: a distributed step runs one \
                 micro-batch per rank; leave --accumulate out"
            )));
        }
        if size > trainer.config.batch_size {
            return Err(CliError::Usage(format!(
                "--distributed on {size} ranks needs a batch of at least {size} rows, found {}",
                trainer.config.batch_size
            )));
        }
        trainer.config.accumulate = size;
    }
    trainer.set_exchange(Box::new(exchange))?;
    if root && !args.quiet {
        println!(
            "distributed: {size} ranks, one micro-batch of the global batch each; gradients \
             exchanged in buckets of {} MiB and summed in rank order",
            args.bucket_mb
        );
    }
    Ok(root)
}

#[cfg(feature = "mpi")]
mod mpi_exchange {
    use crate::error::CliError;
    use mpi::environment::Universe;
    use mpi::topology::SimpleCommunicator;
    use mpi::traits::{Communicator, CommunicatorCollectives, Equivalence};
    use mpi::Threading;
    use tapegrad_nn::trainer::Exchange;
    use tapegrad_nn::{NnError, NnResult};

    /// MPI's world communicator, with the bucket size of the gradient exchange.
    pub(super) struct MpiExchange {
        world: SimpleCommunicator,
        pub(super) rank: usize,
        pub(super) size: usize,
        bucket_bytes: usize,
        /// Set by `finish` on every rank at the end of a good run: only then is MPI finalised
        /// (a collective). A rank that stops on an error exits without it, and `mpiexec` then
        /// ends the other ranks instead of leaving them waiting.
        done: bool,
        universe: Option<Universe>,
    }

    impl Drop for MpiExchange {
        fn drop(&mut self) {
            if !self.done {
                std::mem::forget(self.universe.take());
            }
        }
    }

    impl MpiExchange {
        pub(super) fn start(bucket_mb: f64) -> Result<Self, CliError> {
            // Funneled: the kernels' threads never call MPI, only the main thread does.
            let (universe, _) = mpi::initialize_with_threading(Threading::Funneled)
                .ok_or_else(|| CliError::Other("distributed: MPI was already started".into()))?;
            let world = universe.world();
            let rank = usize::try_from(world.rank()).unwrap_or(0);
            let size = usize::try_from(world.size()).unwrap_or(1);
            Ok(MpiExchange {
                world,
                rank,
                size,
                bucket_bytes: ((bucket_mb * 1024.0 * 1024.0) as usize).max(8),
                done: false,
                universe: Some(universe),
            })
        }

        /// Every rank's `local`, in rank order, exchanged in buckets of `bucket_bytes`: one
        /// all-gather per bucket into a fused buffer, then copied to its place in the result.
        fn gather<T: Equivalence + Copy + Default>(&self, local: &[T]) -> Vec<T> {
            let len = local.len();
            let per = (self.bucket_bytes / std::mem::size_of::<T>()).max(1);
            let mut out = vec![T::default(); self.size * len];
            let mut fused = vec![T::default(); self.size * per.min(len)];
            for start in (0..len).step_by(per) {
                let end = (start + per).min(len);
                let w = end - start;
                let buf = &mut fused[..self.size * w];
                self.world.all_gather_into(&local[start..end], buf);
                for r in 0..self.size {
                    out[r * len + start..r * len + end].copy_from_slice(&buf[r * w..(r + 1) * w]);
                }
            }
            out
        }
    }

    impl Exchange for MpiExchange {
        fn rank(&self) -> usize {
            self.rank
        }
        fn size(&self) -> usize {
            self.size
        }
        fn all_gather_f64(&mut self, local: &[f64]) -> NnResult<Vec<f64>> {
            Ok(self.gather(local))
        }
        fn all_gather_f32(&mut self, local: &[f32]) -> NnResult<Vec<f32>> {
            Ok(self.gather(local))
        }
        fn abort(&mut self, error: &NnError) {
            eprintln!("error: rank {} of {}: {error}", self.rank, self.size);
            eprintln!("error: ending every rank of the job");
            self.world.abort(2);
        }
        fn finish(&mut self) {
            self.done = true;
        }
    }
}
