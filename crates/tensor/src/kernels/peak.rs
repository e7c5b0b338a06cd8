//! The measured ceiling of this machine: how many f32 fused multiply-adds per second one core (or
//! several at once) retires on the widest vector path pulp dispatches to. Benchmarks divide by it,
//! so a figure can say how close it runs to the hardware, not only to another library.

use std::time::Instant;

/// Independent accumulator chains: more than an FMA's latency times the FMA ports (4 x 2 on Zen 3,
/// Skylake-X and later), fewer than the 16 vector registers AVX2 has, so nothing spills.
const CHAINS: usize = 12;

/// Fused multiply-adds per vector lane per inner-loop call, between reads of the clock.
const ROUNDS: usize = 4096;

/// Peak f32 throughput in GFLOP/s (a multiply-add counts as two) of `threads` cores running
/// register-resident FMA chains at the same time, `bursts` timed bursts each (a burst is
/// `CHAINS * ROUNDS` vector FMAs, about 8 us on a 3 GHz AVX2 core): each thread's best burst,
/// summed over the threads. What no kernel on this CPU can beat, whatever its blocking.
pub fn fma_peak_gflops(threads: usize, bursts: usize) -> f64 {
    let threads = threads.max(1);
    std::thread::scope(|scope| {
        let probes: Vec<_> = (0..threads)
            .map(|_| scope.spawn(move || one_core_peak(bursts)))
            .collect();
        // A probe thread cannot panic (no indexing, no allocation in its loop), so a join error
        // is impossible; counting it as zero keeps this function total.
        probes.into_iter().map(|p| p.join().unwrap_or(0.0)).sum()
    })
}

/// The best of `bursts` (at least one) bursts of one thread, in GFLOP/s.
fn one_core_peak(bursts: usize) -> f64 {
    let mut best: f64 = 0.0;
    let mut sink = 0.0f32;
    for _ in 0..bursts.max(1) {
        let t0 = Instant::now();
        let (lanes, value) = pulp::Arch::new().dispatch(Chains {
            multiplier: std::hint::black_box(0.999_999),
            addend: std::hint::black_box(1e-7),
        });
        let secs = t0.elapsed().as_secs_f64();
        sink += value;
        let flops = (2 * CHAINS * ROUNDS * lanes) as f64;
        best = best.max(flops / secs.max(1e-9) / 1e9);
    }
    std::hint::black_box(sink);
    best
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
        for threads in [0, 1, 2] {
            let gflops = fma_peak_gflops(threads, 20);
            assert!(gflops.is_finite() && gflops > 0.0, "{threads}: {gflops}");
        }
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
