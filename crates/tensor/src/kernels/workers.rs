//! The helper threads that run independent jobs (bands of a product, samples of a convolution,
//! chunks of an element loop) next to the calling thread, and the spin-then-sleep hand-off that
//! makes a split pay on jobs of tens of microseconds. Results never depend on which thread runs a job.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long an idle helper keeps polling for the next batch before it sleeps. A training step
/// alternates products with serial element loops of tens to a few hundred microseconds; a helper
/// still polling takes the next product's band at once, where a sleeping one must be woken
/// through the kernel (tens of microseconds, more on a virtual machine whose idle vCPU halted).
const HELPER_SPIN: Duration = Duration::from_micros(500);
/// How long the caller polls for the helpers' last jobs (bands end within microseconds of each
/// other) before it yields its core between polls, in case it shares the core with a helper.
const CALLER_SPIN: Duration = Duration::from_micros(50);
/// Polls (a `spin_loop` hint each, a few microseconds together) between looks at the clock.
const POLLS_PER_CHECK: u32 = 256;

/// A job with its borrow erased; see `run_jobs` for why that is sound.
type Job = Box<dyn FnOnce() + Send + 'static>;

/// One `run_jobs` call: jobs are claimed by index, by the caller and any helper that joins.
struct Batch {
    jobs: Vec<Mutex<Option<Job>>>,
    next: AtomicUsize,
    /// Jobs not yet finished; reaching 0 means every job has run and returned.
    pending: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Helpers with an index below this may join.
    helpers: usize,
}

impl Batch {
    fn has_unclaimed(&self) -> bool {
        self.next.load(Ordering::Relaxed) < self.jobs.len()
    }

    /// Claims and runs jobs until none is left unclaimed.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::AcqRel);
            let Some(cell) = self.jobs.get(i) else {
                return;
            };
            let job = lock(cell).take();
            if let Some(job) = job {
                if let Err(payload) = catch_unwind(AssertUnwindSafe(job)) {
                    lock(&self.panic).get_or_insert(payload);
                }
            }
            // Release: the job's writes (its result slot) happen before the caller sees 0.
            self.pending.fetch_sub(1, Ordering::Release);
        }
    }
}

/// What helpers and callers share, under one lock (taken once per batch, never per job).
struct Board {
    active: Vec<Arc<Batch>>,
    sleepers: usize,
    spawned: usize,
}

static BOARD: Mutex<Board> = Mutex::new(Board {
    active: Vec::new(),
    sleepers: 0,
    spawned: 0,
});
static WAKE: Condvar = Condvar::new();
/// Bumped (under the lock) on every publish; idle helpers poll it before they sleep.
static EPOCH: AtomicU64 = AtomicU64::new(0);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means a job panicked while another thread held it; the data (job
    // cells, the board) stays consistent because every update is a single assignment.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn helper_loop(index: usize) {
    loop {
        let seen = EPOCH.load(Ordering::Acquire);
        let batch = lock(&BOARD)
            .active
            .iter()
            .find(|b| index < b.helpers && b.has_unclaimed())
            .cloned();
        if let Some(batch) = batch {
            batch.work();
            continue;
        }
        wait_for_publish(seen);
    }
}

/// Returns once `EPOCH` differs from `seen`: polling for `HELPER_SPIN` (yielding the core every
/// few microseconds, so a thread that shares it, the caller included, is not held up), then
/// asleep.
fn wait_for_publish(seen: u64) {
    let start = Instant::now();
    let mut polls = 0u32;
    while EPOCH.load(Ordering::Acquire) == seen {
        std::hint::spin_loop();
        polls = polls.wrapping_add(1);
        if polls % POLLS_PER_CHECK != 0 {
            continue;
        }
        if start.elapsed() < HELPER_SPIN {
            std::thread::yield_now();
            continue;
        }
        let mut board = lock(&BOARD);
        board.sleepers += 1;
        // The epoch is bumped under this lock, so a publish either came before this check or
        // will find `sleepers > 0` and notify.
        while EPOCH.load(Ordering::Acquire) == seen {
            board = WAKE.wait(board).unwrap_or_else(|e| e.into_inner());
        }
        board.sleepers -= 1;
        return;
    }
}

/// Starts helpers until `wanted` exist; returns how many there are (fewer if the OS refuses).
fn ensure_helpers(board: &mut Board, wanted: usize) -> usize {
    while board.spawned < wanted {
        let index = board.spawned;
        let started = std::thread::Builder::new()
            .name(format!("tapegrad-worker-{index}"))
            .spawn(move || helper_loop(index));
        if started.is_err() {
            break;
        }
        board.spawned += 1;
    }
    board.spawned
}

/// The job with its borrow's lifetime dropped from the type.
///
/// # Safety
/// The caller must run or drop the job before anything it borrows goes away.
unsafe fn erase<'b>(job: Box<dyn FnOnce() + Send + 'b>) -> Job {
    // SAFETY: only the lifetime changes (same vtable and layout); the caller keeps the borrow
    // alive for as long as the job exists.
    unsafe { std::mem::transmute::<Box<dyn FnOnce() + Send + 'b>, Job>(job) }
}

/// Runs `jobs` on the calling thread and up to `helpers` helper threads, each job exactly once,
/// and returns their results in order. The caller claims jobs too, so a helper that is slow to
/// wake never delays the product by more than the jobs the caller could not take; with no
/// helper available the jobs run one after the other (same results: the jobs are independent).
/// A panic in a job is resumed here once every job has finished.
///
/// Jobs write into memory the caller allocated (bands of one output, chunks of one slice): the
/// tensor pool is per thread, so a tensor made inside a job on a helper misses that helper's
/// pool every time and its buffer, dropped later by the caller, fills the caller's pool instead
/// (session 11 measured it: two gradients made side by side cost 33 page faults per MLP step).
pub(crate) fn run_jobs_on<'a, R: Send>(
    helpers: usize,
    jobs: Vec<Box<dyn FnOnce() -> R + Send + 'a>>,
) -> Vec<R> {
    let count = jobs.len();
    if count <= 1 || helpers == 0 {
        return jobs.into_iter().map(|job| job()).collect();
    }
    let mut results: Vec<Option<R>> = (0..count).map(|_| None).collect();
    let cells = jobs
        .into_iter()
        .zip(results.iter_mut())
        .map(|(job, slot)| {
            // SAFETY: the job borrows data that outlives this call (its captures and
            // `results`), and is run or dropped before this function returns or unwinds:
            // `pending` reaches 0 only once every job has been claimed (each index is claimed
            // once) and has returned, and this function waits for that below before touching
            // `results` or returning. Helpers that still hold the `Arc<Batch>` afterwards only
            // see empty cells and counters, which the Arc keeps alive by itself.
            let job = unsafe { erase(Box::new(move || *slot = Some(job()))) };
            Mutex::new(Some(job))
        })
        .collect();
    let batch = Arc::new(Batch {
        jobs: cells,
        next: AtomicUsize::new(0),
        pending: AtomicUsize::new(count),
        panic: Mutex::new(None),
        helpers,
    });
    {
        let mut board = lock(&BOARD);
        ensure_helpers(&mut board, helpers);
        board.active.push(batch.clone());
        EPOCH.fetch_add(1, Ordering::AcqRel);
        if board.sleepers > 0 {
            WAKE.notify_all();
        }
    }
    batch.work();
    let start = Instant::now();
    let mut polls = 0u32;
    while batch.pending.load(Ordering::Acquire) != 0 {
        polls = polls.wrapping_add(1);
        if polls % POLLS_PER_CHECK == 0 && start.elapsed() >= CALLER_SPIN {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    lock(&BOARD).active.retain(|b| !Arc::ptr_eq(b, &batch));
    if let Some(payload) = lock(&batch.panic).take() {
        resume_unwind(payload);
    }
    results
        .into_iter()
        .map(|r| r.expect("pending reached 0, so every job stored its result"))
        .collect()
}

/// Calls `f(start, chunk)` on consecutive chunks of `data` (`chunk` is `data[start..start +
/// chunk.len()]`) that together cover it once: one chunk per GEMM thread when every thread gets
/// at least `min_per_thread` elements, else one chunk, on this thread. For element loops whose
/// result does not depend on where the chunks are cut (each element computed on its own), so the
/// bits are the same for every thread count.
pub fn for_each_chunk_mut<T: Send>(
    data: &mut [T],
    min_per_thread: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    for_each_band_mut(data, 1, min_per_thread, f)
}

/// As [`for_each_chunk_mut`], with chunks cut only between whole units of `unit` elements (rows
/// of a matrix, say) and `min_units_per_thread` counted in units: one band of units per GEMM
/// thread when each gets that many, else one band, on this thread. `start` is an element offset
/// (a multiple of `unit`). A `data` whose length is not a multiple of `unit` (or a `unit` of 0)
/// is one band.
pub fn for_each_band_mut<T: Send>(
    data: &mut [T],
    unit: usize,
    min_units_per_thread: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let units = if unit == 0 || data.len() % unit != 0 {
        0
    } else {
        data.len() / unit
    };
    let threads = super::num_threads()
        .min(units / min_units_per_thread.max(1))
        .max(1);
    if threads == 1 {
        return f(0, data);
    }
    // Whole cache lines (16 four-byte elements) per band where the unit allows it, so two
    // threads write at most one shared line.
    let align = 16 / gcd(unit, 16);
    let per_band = units.div_ceil(threads).next_multiple_of(align) * unit;
    let f = &f;
    let jobs = data
        .chunks_mut(per_band)
        .enumerate()
        .map(|(i, chunk)| Box::new(move || f(i * per_band, chunk)) as Box<dyn FnOnce() + Send>)
        .collect();
    run_jobs_on(threads - 1, jobs);
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Calls `f` once on each of `parts` (independent pieces of work the caller has already cut,
/// about equal in size), spread over up to one GEMM thread per part: the caller takes parts too,
/// so with one thread they run in order on it.
pub fn for_each_part<P: Send>(parts: Vec<P>, f: impl Fn(P) + Sync) {
    let helpers = super::num_threads().min(parts.len()).saturating_sub(1);
    if helpers == 0 {
        return parts.into_iter().for_each(f);
    }
    let f = &f;
    let jobs = parts
        .into_iter()
        .map(|part| Box::new(move || f(part)) as Box<dyn FnOnce() + Send>)
        .collect();
    run_jobs_on(helpers, jobs);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two tests that set the process-wide thread count take turns (one counts the bands
    /// cut for 3 threads, which the other's reset to 1 would change under it).
    static THREAD_COUNT: Mutex<()> = Mutex::new(());

    #[test]
    fn every_job_runs_once_and_results_come_back_in_order() {
        let inputs: Vec<u64> = (0..37).collect();
        for helpers in [1, 2, 3] {
            let mut hits = vec![0u32; inputs.len()];
            let jobs = hits
                .iter_mut()
                .zip(&inputs)
                .map(|(hit, &x)| {
                    Box::new(move || {
                        *hit += 1;
                        x * x + 1
                    }) as Box<dyn FnOnce() -> u64 + Send>
                })
                .collect();
            let got = run_jobs_on(helpers, jobs);
            let want: Vec<u64> = inputs.iter().map(|x| x * x + 1).collect();
            assert_eq!(got, want, "{helpers} helpers");
            assert!(hits.iter().all(|&h| h == 1), "{helpers} helpers: {hits:?}");
        }
    }

    #[test]
    fn a_panicking_job_is_resumed_after_the_others_finish() {
        let done = AtomicUsize::new(0);
        let caught = catch_unwind(AssertUnwindSafe(|| {
            let jobs = (0..6)
                .map(|i| {
                    let done = &done;
                    Box::new(move || {
                        if i == 3 {
                            panic!("job 3 fails");
                        }
                        std::thread::sleep(Duration::from_millis(2));
                        done.fetch_add(1, Ordering::SeqCst);
                    }) as Box<dyn FnOnce() + Send>
                })
                .collect();
            run_jobs_on(2, jobs);
        }));
        let payload = caught.expect_err("the panic reaches the caller");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"job 3 fails"));
        assert_eq!(
            done.load(Ordering::SeqCst),
            5,
            "the other five jobs ran to the end"
        );
        // The helpers survive: the next batch still runs.
        let jobs = (0..4)
            .map(|i| Box::new(move || i * 2) as Box<dyn FnOnce() -> i32 + Send>)
            .collect();
        assert_eq!(run_jobs_on(2, jobs), vec![0, 2, 4, 6]);
    }

    #[test]
    fn chunks_cover_the_slice_once_at_their_offsets() {
        // Other unit tests give the same bits on any thread count, so changing it here is safe.
        let _turn = lock(&THREAD_COUNT);
        super::super::set_num_threads(3);
        for len in [0, 1, 15, 16, 17, 31, 32, 33, 100, 1000, 4099] {
            let mut data = vec![0usize; len];
            for_each_chunk_mut(&mut data, 1, |start, chunk| {
                for (i, x) in chunk.iter_mut().enumerate() {
                    *x += start + i + 1;
                }
            });
            let want: Vec<usize> = (1..=len).collect();
            assert_eq!(data, want, "len {len}");
        }
        super::super::set_num_threads(1);
    }

    #[test]
    fn bands_hold_whole_units_and_cover_the_slice_once() {
        let _turn = lock(&THREAD_COUNT);
        super::super::set_num_threads(3);
        for (len, unit) in [
            (0, 3),
            (30, 10),
            (2560, 10),
            (4096, 1),
            (999, 3),
            (1000, 7),
            (64, 0),
        ] {
            let mut data = vec![0usize; len];
            let starts = Mutex::new(Vec::new());
            for_each_band_mut(&mut data, unit, 2, |start, band| {
                lock(&starts).push((start, band.len()));
                for (i, x) in band.iter_mut().enumerate() {
                    *x += start + i + 1;
                }
            });
            let want: Vec<usize> = (1..=len).collect();
            assert_eq!(data, want, "len {len} unit {unit}");
            let starts = lock(&starts).clone();
            if unit > 0 && len % unit == 0 {
                assert!(
                    starts.iter().all(|&(s, l)| s % unit == 0 && l % unit == 0),
                    "len {len} unit {unit}: {starts:?}"
                );
            }
            if len == 2560 {
                assert_eq!(starts.len(), 3, "256 rows of 10 on 3 threads: {starts:?}");
            }
        }
        let parts: Vec<usize> = (0..5).collect();
        let seen = Mutex::new(vec![0u32; 5]);
        for_each_part(parts, |i| lock(&seen)[i] += 1);
        assert_eq!(*lock(&seen), vec![1; 5]);
        super::super::set_num_threads(1);
    }
}
