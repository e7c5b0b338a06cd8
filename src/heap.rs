//! Heap settings for the `tapegrad` binary: on glibc, freed tensor buffers stay in the process
//! heap, so each training step reuses the last step's memory instead of taking fresh pages from
//! the kernel (which zeroes them and faults them in: 88k page faults per 200 eager batch-256 steps).

/// Keeps buffers up to 32 MiB on the heap and the heap's free top up to 512 MiB.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn keep_freed_buffers() {
    use std::ffi::c_int;
    // glibc's malloc.h parameter numbers.
    const M_TRIM_THRESHOLD: c_int = -1;
    const M_MMAP_THRESHOLD: c_int = -3;
    unsafe extern "C" {
        fn mallopt(param: c_int, value: c_int) -> c_int;
    }
    // SAFETY: `mallopt` only changes two allocator thresholds (32 MiB is glibc's largest
    // accepted mmap threshold); it takes no pointers, and glibc serialises it with the allocator
    // itself. A rejected value returns 0 and leaves glibc's default, which is still correct.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 32 << 20);
        mallopt(M_TRIM_THRESHOLD, 512 << 20);
    }
}

/// Other platforms keep their allocator's defaults.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn keep_freed_buffers() {}
