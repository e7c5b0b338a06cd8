//! Fallible buffer allocation for kernels whose output size follows from attributes (padding,
//! output sizes) rather than from tensors already in memory: an impossible request becomes an
//! error naming the op instead of an allocation abort.

use crate::{Error, Result, Scalar, Shape};

/// Results at least this large are reserved fallibly before an op computes them. Below it an
/// allocation failure means the machine is out of memory altogether; above it, a shape argument
/// (a broadcast, an outer product) asked for more than the machine has, which is the caller's
/// error to report. The probe (a map and unmap of address space) costs microseconds, nothing
/// beside filling 64 MiB.
const PROBE_BYTES: usize = 64 << 20;

/// An empty vector with room for `n` elements, or an error when the memory cannot be reserved.
pub fn try_with_capacity<T>(op: &'static str, n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        Error::invalid(
            op,
            format!(
                "cannot allocate {n} elements of {} bytes",
                std::mem::size_of::<T>()
            ),
        )
    })?;
    Ok(v)
}

/// `n` zeros, or an error when the memory cannot be reserved.
pub fn try_zeroed<S: Scalar>(op: &'static str, n: usize) -> Result<Vec<S>> {
    let mut v = try_with_capacity(op, n)?;
    v.resize(n, S::ZERO);
    Ok(v)
}

/// Checks that a result of `shape` can be allocated, by one fallible reservation (freed at once)
/// when it is large; an error naming `op` and the shape otherwise.
pub fn ensure_allocatable<S: Scalar>(op: &'static str, shape: &Shape) -> Result<()> {
    let bytes = shape.numel().saturating_mul(std::mem::size_of::<S>());
    if bytes < PROBE_BYTES || Vec::<u8>::new().try_reserve_exact(bytes).is_ok() {
        return Ok(());
    }
    Err(Error::invalid(
        op,
        format!(
            "cannot allocate a tensor of shape {shape}: {bytes} bytes of {}",
            S::DTYPE.name()
        ),
    ))
}
