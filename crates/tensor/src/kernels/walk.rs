//! The strided walk: visits every index of a row-major shape in order, tracking one offset per
//! operand from per-operand strides (0 on broadcast axes). All general kernels are built on it.

/// Calls `f(linear_index, offsets)` for each index of `dims` in row-major order, where `offsets[k]`
/// is the dot product of the index with `strides[k]`.
pub(crate) fn strided_walk<const N: usize>(
    dims: &[usize],
    strides: [&[usize]; N],
    mut f: impl FnMut(usize, [usize; N]),
) {
    let rank = dims.len();
    if dims.contains(&0) {
        return;
    }
    if rank == 0 {
        f(0, [0; N]);
        return;
    }
    let inner = dims[rank - 1];
    let mut inner_strides = [0usize; N];
    for k in 0..N {
        inner_strides[k] = strides[k][rank - 1];
    }
    let mut index = vec![0usize; rank - 1];
    let mut base = [0usize; N];
    let mut linear = 0usize;
    loop {
        let mut off = base;
        for _ in 0..inner {
            f(linear, off);
            linear += 1;
            for k in 0..N {
                off[k] += inner_strides[k];
            }
        }
        // Odometer increment over the outer axes.
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            index[d] += 1;
            for k in 0..N {
                base[k] += strides[k][d];
            }
            if index[d] < dims[d] {
                break;
            }
            for k in 0..N {
                base[k] -= strides[k][d] * dims[d];
            }
            index[d] = 0;
        }
    }
}
