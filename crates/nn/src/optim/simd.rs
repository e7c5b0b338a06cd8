//! Element loops of the optimizers compiled for the widest vector instruction set the CPU has
//! (AVX2 or AVX-512 on x86-64, picked at run time by `pulp`, which `gemm` already brings in), so
//! they auto-vectorise beyond the SSE2 baseline, and spread over the GEMM threads when long. Rust
//! never contracts `a * b + c` into a fused multiply-add, so the results are bit-identical to the
//! plain loops, for every thread count (each element is computed on its own).

use pulp::{Arch, Simd, WithSimd};
use tapegrad_tensor::kernels::for_each_chunk_mut;
use tapegrad_tensor::Scalar;

/// Elements per thread below which a split loses to the hand-off: at memory speed a pass over
/// 32k f32 elements (read two, write one) takes about 10 us, a few times the hand-off to a
/// helper that is still polling.
const MIN_PER_THREAD: usize = 1 << 15;

/// `p += a * g`, element by element (`a * g` rounded, then added).
pub(super) fn add_scaled<S: Scalar>(p: &mut [S], a: S, g: &[S]) {
    // Callers pass equal lengths (the optimizer checks shapes); zip's truncation, as before.
    let len = p.len().min(g.len());
    let (p, g) = (&mut p[..len], &g[..len]);
    for_each_chunk_mut(p, MIN_PER_THREAD, |start, p| {
        add_scaled_serial(p, a, &g[start..start + p.len()])
    });
}

fn add_scaled_serial<S: Scalar>(p: &mut [S], a: S, g: &[S]) {
    struct AddScaled<'a, S> {
        p: &'a mut [S],
        a: S,
        g: &'a [S],
    }
    impl<S: Scalar> WithSimd for AddScaled<'_, S> {
        type Output = ();
        // Inlined into pulp's `#[target_feature]` function, which is what lets the loop use it.
        #[inline(always)]
        fn with_simd<V: Simd>(self, _simd: V) {
            let a = self.a;
            for (p, &g) in self.p.iter_mut().zip(self.g) {
                *p += a * g;
            }
        }
    }
    Arch::new().dispatch(AddScaled { p, a, g });
}

#[cfg(test)]
mod tests {
    use super::*;
    use tapegrad_tensor::kernels::set_num_threads;

    #[test]
    fn add_scaled_matches_the_plain_loop_bit_for_bit_on_every_thread_count() {
        // Long enough to be cut into chunks at 2 and 3 threads, with an odd tail.
        let len = 3 * MIN_PER_THREAD + 17;
        let value = |i: usize, salt: usize| ((i * 2654435761 + salt) % 1000) as f32 / 7.0 - 71.0;
        let p0: Vec<f32> = (0..len).map(|i| value(i, 1)).collect();
        let g: Vec<f32> = (0..len).map(|i| value(i, 2) * 1e-3).collect();
        let a = -0.0123f32;
        let want: Vec<u32> = p0
            .iter()
            .zip(&g)
            .map(|(&p, &g)| (p + a * g).to_bits())
            .collect();
        for threads in [1, 2, 3] {
            // Other tests give the same bits on any thread count, so changing it here is safe.
            set_num_threads(threads);
            let mut p = p0.clone();
            add_scaled(&mut p, a, &g);
            let got: Vec<u32> = p.iter().map(|v| v.to_bits()).collect();
            assert!(got == want, "{threads} threads differ from the plain loop");
        }
        set_num_threads(1);
    }
}
