//! `train --distributed` and `train gpt --distributed`: makes the process one rank of a
//! data-parallel job started by `mpiexec` (a build with the `mpi` cargo feature). Owns the MPI
//! side only: the two flags, starting MPI, the bucketed exchange behind
//! `tapegrad_nn::exchange::Exchange` (a shared-memory window on one host, `node_window`, else
//! all-gathers), and which rank writes files; the step itself (rank k runs
//! micro-batch k, the sum in rank order) is `tapegrad_nn::exchange`'s, for both runs.

use crate::error::CliError;
use crate::train::TrainOptions;
use tapegrad_nn::exchange::Exchange;
use tapegrad_nn::gpt::GptRun;
use tapegrad_nn::{NnResult, Trainer};
use tapegrad_tensor::Scalar;

/// The flags of a data-parallel run, the same for every preset.
#[derive(Debug, clap::Args)]
pub struct DistributedFlags {
    /// Run as one rank of a data-parallel job: `mpiexec -n N tapegrad train ... --distributed`
    /// (a build with `--features mpi`). Rank k runs micro-batch k of each batch; the parameters
    /// are bit for bit those of `--accumulate N` in one process. Only rank 0 writes files.
    #[arg(long)]
    pub distributed: bool,
    /// --distributed: gradients are exchanged in fused buckets of this many MiB.
    #[arg(long, value_name = "MB", default_value_t = 25.0)]
    pub bucket_mb: f64,
}

/// A run that can be one rank of a data-parallel job: the tabular trainer and the GPT's run.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) trait Rank {
    /// Rows (windows) per optimizer step: the global batch.
    fn batch_size(&self) -> usize;
    /// Sets the micro-batches per step (one per rank).
    fn set_micro_batches(&mut self, k: usize);
    /// Checks that every rank holds rank 0's run and keeps the exchange.
    fn join(&mut self, exchange: Box<dyn Exchange>) -> NnResult<()>;
}

impl<S: Scalar> Rank for Trainer<S> {
    fn batch_size(&self) -> usize {
        self.config.batch_size
    }
    fn set_micro_batches(&mut self, k: usize) {
        self.config.accumulate = k;
    }
    fn join(&mut self, exchange: Box<dyn Exchange>) -> NnResult<()> {
        self.set_exchange(exchange)
    }
}

impl<S: Scalar> Rank for GptRun<S> {
    fn batch_size(&self) -> usize {
        self.config.batch_size
    }
    fn set_micro_batches(&mut self, k: usize) {
        self.config.accumulate = k;
    }
    fn join(&mut self, exchange: Box<dyn Exchange>) -> NnResult<()> {
        self.set_exchange(exchange)
    }
}

/// Joins the job when `--distributed` is given and returns whether this process is rank 0, the
/// one that prints, logs, plots and writes checkpoints. One rank (or no `mpiexec`) runs as one
/// process, with the run's own `--accumulate`.
pub(crate) fn attach(args: &TrainOptions, run: &mut impl Rank) -> Result<bool, CliError> {
    let flags = &args.dist;
    if !flags.distributed {
        return Ok(true);
    }
    if !(flags.bucket_mb > 0.0 && flags.bucket_mb.is_finite()) {
        return Err(CliError::Usage(format!(
            "--bucket-mb needs a positive size in MiB, found {}",
            flags.bucket_mb
        )));
    }
    join(args, run)
}

#[cfg(not(feature = "mpi"))]
fn join(_args: &TrainOptions, _run: &mut impl Rank) -> Result<bool, CliError> {
    Err(CliError::Usage(
        "--distributed needs a build with MPI: install MPICH (apt-get install mpich libmpich-dev \
         libclang-dev) and build with `cargo build --release --features mpi` (see docs/distributed.md)"
            .into(),
    ))
}

#[cfg(feature = "mpi")]
fn join(args: &TrainOptions, run: &mut impl Rank) -> Result<bool, CliError> {
    let mut exchange = mpi_exchange::MpiExchange::start(args.dist.bucket_mb)?;
    let (rank, size) = (exchange.rank, exchange.size);
    let root = rank == 0;
    if size == 1 {
        exchange.finish();
        if !args.quiet {
            println!(
                "note: --distributed on one rank (no mpiexec, or -n 1): running as one process"
            );
        }
        return Ok(true);
    }
    if args.verify_every.is_some() {
        return Err(CliError::Usage(
            "--verify-every checks a step recorded on one tape; it does not run with \
             --distributed on more than one rank"
                .into(),
        ));
    }
    if args.resume.is_none() {
        if let Some(k) = args.accumulate.filter(|&k| k != size) {
            return Err(CliError::Usage(format!(
                "--accumulate {k} with --distributed on {size} ranks: a distributed step runs one \
                 micro-batch per rank; leave --accumulate out"
            )));
        }
        if size > run.batch_size() {
            return Err(CliError::Usage(format!(
                "--distributed on {size} ranks needs a batch of at least {size} rows, found {}",
                run.batch_size()
            )));
        }
        run.set_micro_batches(size);
    }
    run.join(Box::new(exchange))?;
    if root && !args.quiet {
        println!(
            "distributed: {size} ranks, one micro-batch of the global batch each; gradients \
             exchanged in buckets of {} MiB and summed in rank order",
            args.dist.bucket_mb
        );
    }
    Ok(root)
}

#[cfg(feature = "mpi")]
#[allow(unsafe_code)]
mod node_window;

#[cfg(feature = "mpi")]
mod mpi_exchange {
    use super::node_window::NodeWindow;
    use crate::error::CliError;
    use mpi::collective::SystemOperation;
    use mpi::environment::Universe;
    use mpi::topology::SimpleCommunicator;
    use mpi::traits::{Communicator, CommunicatorCollectives, Equivalence};
    use mpi::Threading;
    use std::ops::{Add, Mul};
    use std::time::{Duration, Instant};
    use tapegrad_nn::exchange::{gather_after, Concatenated, Exchange, Gathered, Work};
    use tapegrad_nn::{NnError, NnResult};

    /// `TAPEGRAD_DDP_OVERLAP=0` exchanges every bucket after the backward instead of during it
    /// (for measuring what the overlap gains; the bits are the same).
    const OVERLAP_ENV: &str = "TAPEGRAD_DDP_OVERLAP";
    /// `TAPEGRAD_DDP_PROFILE=1` times each step's exchange and, on the same buckets, a blocking
    /// all-gather with the rank-order sum against a plain `MPI_Allreduce` (whose result is
    /// dropped), and every rank prints its own means at the end: the slower rank's wait is the
    /// exchange its step did not hide, the faster one's adds the time it waited for the other.
    /// For measurements only: it adds both.
    const PROFILE_ENV: &str = "TAPEGRAD_DDP_PROFILE";
    /// `TAPEGRAD_DDP_SHARED=0` keeps the all-gather on one host too, where the buckets otherwise
    /// go through a shared-memory window (`NodeWindow`; the bits are the same).
    const SHARED_ENV: &str = "TAPEGRAD_DDP_SHARED";

    /// MPI's world communicator, with the bucket size of the gradient exchange.
    pub(super) struct MpiExchange {
        world: SimpleCommunicator,
        pub(super) rank: usize,
        pub(super) size: usize,
        bucket_bytes: usize,
        overlap: bool,
        /// The ranks' host communicator when they all share one host (and `TAPEGRAD_DDP_SHARED`
        /// is not 0), with the window the buckets go through once the first step made it.
        node: Option<mpi::topology::SimpleCommunicator>,
        window: Option<NodeWindow>,
        profile: Option<Profile>,
        /// Set by `finish` on every rank at the end of a good run: only then is MPI finalised
        /// (a collective). A rank that stops on an error exits without it, and `mpiexec` then
        /// ends the other ranks instead of leaving them waiting.
        done: bool,
        universe: Option<Universe>,
    }

    /// Time summed over the steps of a profiled run (`TAPEGRAD_DDP_PROFILE`).
    #[derive(Default)]
    struct Profile {
        steps: u32,
        buckets: usize,
        /// Running the step (forward and backward, starting the buckets on the way).
        work: Duration,
        /// Waiting for the exchange after the step: the communication the step did not hide.
        wait: Duration,
        /// The same buckets again, blocking: all-gather and the sum in rank order...
        gather_sum: Duration,
        /// ... and a plain all-reduce.
        all_reduce: Duration,
    }

    impl Drop for MpiExchange {
        fn drop(&mut self) {
            if !self.done {
                std::mem::forget(self.universe.take());
            }
        }
    }

    /// Ends every rank of the job after naming `what` on this one.
    fn end_job(world: &SimpleCommunicator, rank: usize, size: usize, what: &str) -> ! {
        eprintln!("error: rank {rank} of {size}: {what}");
        eprintln!("error: ending every rank of the job");
        world.abort(2)
    }

    /// `local` (every rank's, concatenated in rank order) summed in rank order, as the trainer
    /// folds it: the work the fixed order adds to an all-gather.
    fn rank_order_sum<T: Copy + Add<Output = T> + Mul<Output = T>>(
        all: &[T],
        size: usize,
    ) -> Vec<T> {
        let len = all.len() / size.max(1);
        let mut acc = all[..len].to_vec();
        for r in 1..size {
            for (a, &v) in acc.iter_mut().zip(&all[r * len..(r + 1) * len]) {
                *a = *a + v;
            }
        }
        acc
    }

    /// What is wrong with bucket `b` of `len` values handed over where bucket `next` was due.
    fn handed_over(b: usize, len: usize, next: usize, lens: &[usize]) -> String {
        format!(
            "bucket {b} of {len} values handed over as bucket {next} of {:?}",
            lens.get(next)
        )
    }

    /// Why a rank's part of an exchange cannot go on: its step failed, or it handed over its
    /// buckets wrongly or not all of them.
    fn problem(
        result: &NnResult<()>,
        fault: Option<String>,
        next: usize,
        lens: &[usize],
    ) -> Option<String> {
        match (result, fault) {
            (Err(e), _) => Some(e.to_string()),
            (Ok(()), Some(f)) => Some(format!("exchange: {f}")),
            (Ok(()), None) if next != lens.len() => Some(format!(
                "exchange: {next} of {} buckets were handed over",
                lens.len()
            )),
            _ => None,
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
            let env = |name: &str| std::env::var(name).ok();
            let overlap = env(OVERLAP_ENV).is_none_or(|v| v != "0");
            // Collective, so every rank takes part whatever its environment says; ranks whose
            // settings differ are told at the start-of-run check (`mode`).
            let host = (size > 1).then(|| NodeWindow::node_of(&world)).flatten();
            let node = host.filter(|_| overlap && env(SHARED_ENV).is_none_or(|v| v != "0"));
            Ok(MpiExchange {
                world,
                rank,
                size,
                bucket_bytes: ((bucket_mb * 1024.0 * 1024.0) as usize).max(8),
                overlap,
                node,
                window: None,
                profile: env(PROFILE_ENV)
                    .is_some_and(|v| v == "1")
                    .then(Profile::default),
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

        /// `Exchange::overlap_f32`: on one host each bucket is written into the shared window as
        /// `work` hands it over and read back after one barrier (`NodeWindow`); otherwise each
        /// bucket's all-gather starts (non-blocking) then, and all are waited for once `work` is
        /// done. Buckets start in bucket order on every rank, as MPI's collectives must. A failed
        /// `work`, or buckets handed over out of order, end the job: requests in flight cannot
        /// be dropped and the other ranks would wait at the barrier.
        fn overlap<T>(&mut self, lens: &[usize], work: Work<'_, T>) -> NnResult<Gathered<'_, T>>
        where
            T: Equivalence + Copy + Default + Add<Output = T> + Mul<Output = T> + 'static,
        {
            let started = Instant::now();
            let (size, rank) = (self.size, self.rank);
            // This rank's buckets, kept for the profile's blocking runs of the same exchange.
            let mut kept: Option<Vec<Vec<T>>> = self.profile.is_some().then(Vec::new);
            let mut keep = |values: &Vec<T>| {
                if let Some(kept) = kept.as_mut() {
                    kept.push(values.clone());
                }
            };
            // Every rank's buckets: in the window's half, or all-gathered into vectors.
            let mut half = None;
            let mut gathered: Vec<Vec<T>> = Vec::new();
            let worked;
            let shared = self.window_for::<T>(lens);
            if let (true, Some(window), Some(node)) =
                (shared, self.window.as_mut(), self.node.as_ref())
            {
                let mut next = 0;
                let mut fault = None;
                let result = work(&mut |b, values| {
                    keep(&values);
                    if b != next || !window.put(rank, b, &values) {
                        fault.get_or_insert(handed_over(b, values.len(), next, lens));
                        return;
                    }
                    next += 1;
                });
                if let Some(problem) = problem(&result, fault, next, lens) {
                    end_job(&self.world, rank, size, &problem);
                }
                worked = started.elapsed();
                half = Some(window.arrive(node));
            } else if self.overlap {
                gathered = lens.iter().map(|&l| vec![T::default(); size * l]).collect();
                // Filled by the buckets handed over, which MPI then sends from.
                let mut send: Vec<Vec<T>> = lens.iter().map(|_| Vec::new()).collect();
                let world = &self.world;
                worked = mpi::request::scope(|scope| {
                    let mut sends = send.iter_mut();
                    let mut recvs = gathered.iter_mut();
                    let mut pending = Vec::with_capacity(lens.len());
                    let mut next = 0;
                    let mut fault = None;
                    let result = work(&mut |b, values| {
                        keep(&values);
                        let (Some(s), Some(r)) = (sends.next(), recvs.next()) else {
                            fault.get_or_insert(format!("bucket {b} handed over after the last"));
                            return;
                        };
                        if b != next || values.len() != lens[next] {
                            fault.get_or_insert(handed_over(b, values.len(), next, lens));
                            return;
                        }
                        *s = values;
                        let s: &[T] = s;
                        pending.push(world.immediate_all_gather_into(scope, s, &mut r[..]));
                        next += 1;
                        // MPICH moves non-blocking collectives on only inside MPI calls: test
                        // the ones in flight, so earlier buckets progress during the backward.
                        pending = std::mem::take(&mut pending)
                            .into_iter()
                            .filter_map(|q| q.test().err())
                            .collect();
                    });
                    if let Some(problem) = problem(&result, fault, next, lens) {
                        end_job(world, rank, size, &problem);
                    }
                    let worked = started.elapsed();
                    for q in pending {
                        q.wait();
                    }
                    worked
                });
            } else {
                let mut done = Duration::ZERO;
                gathered = gather_after(
                    lens,
                    &mut |sink| {
                        let r = work(&mut |b, values| {
                            keep(&values);
                            sink(b, values);
                        });
                        done = started.elapsed();
                        r
                    },
                    &mut |v| Ok(self.gather(v)),
                )?;
                worked = done;
            }
            if let Some(mut p) = self.profile.take() {
                p.steps += 1;
                p.buckets = lens.len();
                p.work += worked;
                p.wait += started.elapsed().saturating_sub(worked);
                // The same buckets, blocking, each way after a barrier (so that neither
                // measures the other ranks arriving late).
                let mine = kept.unwrap_or_default();
                self.world.barrier();
                let t = Instant::now();
                for (local, &l) in mine.iter().zip(lens) {
                    let mut all = vec![T::default(); size * l];
                    self.world.all_gather_into(&local[..], &mut all[..]);
                    std::hint::black_box(rank_order_sum(&all, size));
                }
                p.gather_sum += t.elapsed();
                self.world.barrier();
                let t = Instant::now();
                for local in &mine {
                    let mut sum = vec![T::default(); local.len()];
                    self.world
                        .all_reduce_into(&local[..], &mut sum[..], SystemOperation::sum());
                    std::hint::black_box(sum);
                }
                p.all_reduce += t.elapsed();
                self.profile = Some(p);
            }
            match half.and_then(|h| self.window.as_ref()?.parts::<T>(h)) {
                Some(parts) => Ok(Box::new(parts)),
                None => Ok(Box::new(Concatenated::new(lens, size, gathered)?)),
            }
        }

        /// Whether this step's buckets go through the shared window, making it for `lens` of
        /// `T` when the last one was made for others. Collective (every rank has the same
        /// buckets); when MPI cannot make one the run keeps the all-gather from then on.
        fn window_for<T>(&mut self, lens: &[usize]) -> bool {
            let Some(node) = &self.node else {
                return false;
            };
            let elem = std::mem::size_of::<T>();
            if self.window.as_ref().is_some_and(|w| w.fits(lens, elem)) {
                return true;
            }
            if let Some(old) = self.window.take() {
                old.free();
            }
            self.window = NodeWindow::open(node, lens, elem);
            if self.window.is_none() {
                self.node = None;
            }
            self.window.is_some()
        }

        /// Prints this rank's profile means (at the end of a profiled run).
        fn report(&self) {
            let Some(p) = &self.profile else { return };
            if p.steps == 0 {
                return;
            }
            let ms = |d: Duration| d.as_secs_f64() * 1e3 / f64::from(p.steps);
            println!(
                "distributed profile (rank {} of {}, {} steps, {} buckets, {}): per step \
                 {:.3} ms step, {:.3} ms waiting for the exchange after it; the same buckets \
                 blocking: all-gather + rank-order sum {:.3} ms, MPI_Allreduce {:.3} ms",
                self.rank,
                self.size,
                p.steps,
                p.buckets,
                match (&self.window, self.overlap) {
                    (Some(_), _) => "through the shared window",
                    (None, true) => "all-gathers during the backward",
                    (None, false) => "all-gathers after the backward",
                },
                ms(p.work),
                ms(p.wait),
                ms(p.gather_sum),
                ms(p.all_reduce),
            );
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
        fn bucket_bytes(&self) -> usize {
            self.bucket_bytes
        }
        fn mode(&self) -> u64 {
            u64::from(self.overlap)
                | u64::from(self.node.is_some()) << 1
                | u64::from(self.profile.is_some()) << 2
        }
        fn overlap_f32(
            &mut self,
            lens: &[usize],
            work: Work<'_, f32>,
        ) -> NnResult<Gathered<'_, f32>> {
            self.overlap(lens, work)
        }
        fn overlap_f64(
            &mut self,
            lens: &[usize],
            work: Work<'_, f64>,
        ) -> NnResult<Gathered<'_, f64>> {
            self.overlap(lens, work)
        }
        fn abort(&mut self, error: &NnError) {
            end_job(&self.world, self.rank, self.size, &error.to_string());
        }
        fn disagree(&mut self, _error: &NnError) {
            // Every rank found the disagreement together, so every rank returns its error,
            // prints it and finalises MPI (a collective that all of them reach) before it
            // exits. An abort here could end the job before `mpiexec` forwarded another rank's
            // line, however the ranks were synchronised first.
            self.done = true;
        }
        fn finish(&mut self) {
            self.report();
            if let Some(window) = self.window.take() {
                window.free();
            }
            self.done = true;
        }
    }
}
