//! Element loops of the optimizers compiled for the widest vector instruction set the CPU has
//! (AVX2 or AVX-512 on x86-64, picked at run time by `pulp`, which `gemm` already brings in), so
//! they auto-vectorise beyond the SSE2 baseline. Rust never contracts `a * b + c` into a fused
//! multiply-add, so the results are bit-identical to the plain loops.

use pulp::{Arch, Simd, WithSimd};
use tapegrad_tensor::Scalar;

/// `p += a * g`, element by element (`a * g` rounded, then added).
pub(super) fn add_scaled<S: Scalar>(p: &mut [S], a: S, g: &[S]) {
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
