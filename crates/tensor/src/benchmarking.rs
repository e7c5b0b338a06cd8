//! Benchmark support, used by no kernel: the measured ceiling of this machine, how many f32
//! fused multiply-adds per second one core (or several at once) retires on the widest vector path
//! pulp dispatches to. Benchmarks divide by it, so a figure says how close it runs to the hardware.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Independent accumulator chains: more than an FMA's latency times the FMA ports (4 x 2 on Zen 3,
/// Skylake-X and later), fewer than the 16 vector registers AVX2 has, so nothing spills.
const CHAINS: usize = 12;

/// Fused multiply-adds per vector lane per inner-loop call, between reads of the clock.
const ROUNDS: usize = 4096;

/// Peak f32 throughput in GFLOP/s (a multiply-add counts as two) of `threads` cores running
/// register-resident FMA chains at the same time: `bursts` rounds (at least one) in which every
/// thread starts one burst together (a burst is `CHAINS * ROUNDS` vector FMAs, about 8 us on a
/// 3 GHz AVX2 core), the best round's flops over its wall time, from the first thread's start to
/// the last thread's end. What no kernel on this CPU can beat, whatever its blocking. A round
/// whose bursts did not overlap (a thread started late, or shared its core) counts its whole
/// span, so the figure is never more than the cores delivered at once.
pub fn fma_peak_gflops(threads: usize, bursts: usize) -> f64 {
    let threads = threads.max(1);
    let rounds = bursts.max(1);
    let start_line = StartLine::new(threads);
    let spans: Vec<Vec<Span>> = std::thread::scope(|scope| {
        let probes: Vec<_> = (0..threads)
            .map(|_| scope.spawn(|| timed_bursts(rounds, &start_line)))
            .collect();
        // A probe thread cannot panic (no indexing, one allocation up front), so a join error
        // is impossible; an empty list (no rounds) keeps this function total.
        probes
            .into_iter()
            .map(|p| p.join().unwrap_or_default())
            .collect()
    });
    let lanes = spans.first().and_then(|s| s.first()).map_or(0, |s| s.lanes);
    let flops = (2 * CHAINS * ROUNDS * lanes * threads) as f64;
    (0..rounds)
        .filter_map(|r| {
            let round: Vec<&Span> = spans.iter().filter_map(|s| s.get(r)).collect();
            let first = round.iter().map(|s| s.start).min()?;
            let last = round.iter().map(|s| s.end).max()?;
            let secs = last.duration_since(first).as_secs_f64();
            Some(flops / secs.max(1e-9) / 1e9)
        })
        .fold(0.0, f64::max)
}

/// When one burst of one thread started and ended, and the lane count it ran on.
#[derive(Clone, Copy)]
struct Span {
    start: Instant,
    end: Instant,
    lanes: usize,
}

/// `rounds` bursts of one thread, each started when every thread has reached the start line.
fn timed_bursts(rounds: usize, start_line: &StartLine) -> Vec<Span> {
    let mut spans = Vec::with_capacity(rounds);
    let mut sink = 0.0f32;
    for _ in 0..rounds {
        start_line.wait();
        let start = Instant::now();
        let (lanes, value) = pulp::Arch::new().dispatch(Chains {
            multiplier: std::hint::black_box(0.999_999),
            addend: std::hint::black_box(1e-7),
        });
        let end = Instant::now();
        sink += value;
        spans.push(Span { start, end, lanes });
    }
    std::hint::black_box(sink);
    spans
}

/// A reusable barrier that spins (bursts are microseconds, a sleeping barrier's wake-up is tens)
/// and yields its core while it waits, so more threads than cores still make progress.
struct StartLine {
    threads: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
}

impl StartLine {
    fn new(threads: usize) -> Self {
        StartLine {
            threads,
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
        }
    }

    /// Returns once all `threads` threads have called `wait` for this round.
    fn wait(&self) {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.threads {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::AcqRel);
            return;
        }
        let mut polls = 0u32;
        while self.generation.load(Ordering::Acquire) == generation {
            polls = polls.wrapping_add(1);
            if polls % 256 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// `CHAINS` independent `acc = acc * multiplier + addend` chains, `ROUNDS` steps each; returns
/// the lane count of the vector type it ran on and a value that depends on every chain.
struct Chains {
    multiplier: f32,
    addend: f32,
}

impl pulp::WithSimd for Chains {
    type Output = (usize, f32);

    // Inlined into pulp's `#[target_feature]` function, which is what lets the loop use FMA.
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) -> (usize, f32) {
        let lanes = std::mem::size_of::<S::f32s>() / std::mem::size_of::<f32>();
        let m = simd.splat_f32s(self.multiplier);
        let a = simd.splat_f32s(self.addend);
        let mut acc = [simd.splat_f32s(1.0); CHAINS];
        for _ in 0..ROUNDS {
            for chain in acc.iter_mut() {
                *chain = simd.mul_add_f32s(*chain, m, a);
            }
        }
        let mut total = simd.splat_f32s(0.0);
        for chain in acc {
            total = simd.add_f32s(total, chain);
        }
        (lanes, simd.reduce_sum_f32s(total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_reports_a_positive_finite_rate_for_each_thread_count() {
        // Five threads on a 2-core CI machine: the start line must not stall when threads
        // outnumber cores.
        for threads in [0, 1, 2, 5] {
            let gflops = fma_peak_gflops(threads, 20);
            assert!(gflops.is_finite() && gflops > 0.0, "{threads}: {gflops}");
        }
        assert!(
            fma_peak_gflops(2, 0) > 0.0,
            "zero bursts still time one round"
        );
    }

    #[test]
    fn the_chains_compute_what_they_claim() {
        // With multiplier 1 and addend 0 every lane stays 1; with multiplier 0 every lane is the
        // addend after one round. The sum over CHAINS chains of `lanes` lanes pins both the lane
        // count the rate is computed from and the arithmetic.
        let run = |multiplier, addend| pulp::Arch::new().dispatch(Chains { multiplier, addend });
        let (lanes, ones) = run(1.0, 0.0);
        assert!(matches!(lanes, 1 | 4 | 8 | 16), "{lanes} lanes");
        assert_eq!(ones, (CHAINS * lanes) as f32);
        assert_eq!(run(0.0, 0.5), (lanes, 0.5 * (CHAINS * lanes) as f32));
    }
}
