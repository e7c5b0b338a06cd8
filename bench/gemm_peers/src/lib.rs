//! What the gemm-peers binaries share: the deterministic operand values, the square
//! matrixmultiply call and the CPU clocks, so that every binary times the same inputs the same way.

/// Deterministic values in [-1, 1) (xorshift; `seed` picks the sequence).
pub fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// `dst = a b` for row-major n x n matrices, by `matrixmultiply::sgemm` (its own threading,
/// `MATMUL_NUM_THREADS`).
pub fn mm_square(n: usize, a: &[f32], b: &[f32], dst: &mut [f32]) {
    assert!(a.len() >= n * n && b.len() >= n * n && dst.len() >= n * n);
    // SAFETY: the three slices hold at least n x n elements (checked above), read with row
    // stride n and column stride 1; `dst` is uniquely borrowed for the call.
    unsafe {
        matrixmultiply::sgemm(
            n,
            n,
            n,
            1.0,
            a.as_ptr(),
            n as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            dst.as_mut_ptr(),
            n as isize,
            1,
        )
    }
}

/// The CPU time of `clock` (`libc::CLOCK_THREAD_CPUTIME_ID` or `CLOCK_PROCESS_CPUTIME_ID`).
pub fn cpu_time(clock: libc::clockid_t) -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime({clock})");
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
