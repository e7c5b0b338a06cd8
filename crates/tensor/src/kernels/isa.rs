//! Which vector instruction set the GEMM and optimizer kernels run on this CPU, named the way
//! `tapegrad bench` reports it, so that a benchmark figure always says which code path it timed.

/// The widest kernel path the `gemm` crate (0.19, built with its `x86-v4` feature) and `pulp`
/// dispatch to at run time on this CPU: `"avx512f"`, `"avx2+fma"`, `"neon"` or `"scalar"`.
///
/// It mirrors gemm's own rule (avx512f if detected, else fma, else scalar on x86; neon on
/// aarch64), so a machine without AVX-512 reports the AVX2 path it really takes.
pub fn simd_level() -> &'static str {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "avx512f";
        }
        // gemm tests fma alone for its AVX2 + FMA kernels.
        if std::arch::is_x86_feature_detected!("fma") {
            return "avx2+fma";
        }
        "scalar"
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            return "neon";
        }
        "scalar"
    }
    #[cfg(not(any(target_arch = "x86", target_arch = "x86_64", target_arch = "aarch64")))]
    {
        "scalar"
    }
}
