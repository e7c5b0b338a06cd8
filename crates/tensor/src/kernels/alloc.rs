//! Fallible buffer allocation for kernels whose output size follows from attributes (padding,
//! output sizes) rather than from tensors already in memory: an impossible request becomes an
//! error naming the op instead of an allocation abort.

use crate::{Error, Result, Scalar};

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
