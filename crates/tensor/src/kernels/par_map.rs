//! Elementwise maps over one or two slices (into a new buffer or in place), spread over the GEMM
//! threads when the slices are long enough that the hand-off pays. Each element is computed on
//! its own, so the bits are the same for every thread count.

use super::workers::for_each_chunk_mut;

/// Elements per thread below which a map stays on the calling thread. A cheap map (relu, its
/// backward, an add) runs at memory speed, about 4 us for 16k f32 elements in L2 on a Zen 3
/// core: a few times the hand-off to a helper that is still polling (1-2 us), so a split pays
/// from there. Costly maps (exp, tanh) would pay from fewer, but the map does not know its cost.
pub const MIN_MAP_PER_THREAD: usize = 1 << 14;

/// Whether a map over `len` elements could be split at all (cheap to test before anything else,
/// so the short maps of the tape-overhead path pay one compare).
#[inline(always)]
fn long(len: usize) -> bool {
    len >= 2 * MIN_MAP_PER_THREAD
}

/// `dst[i] = f(src[i])` for every `i` (the slices have equal lengths; a longer one is cut to the
/// shorter, as `zip` would).
#[inline]
pub fn map_into<A: Copy + Sync, T: Send>(src: &[A], dst: &mut [T], f: impl Fn(A) -> T + Sync) {
    let len = src.len().min(dst.len());
    let (src, dst) = (&src[..len], &mut dst[..len]);
    if !long(len) {
        return map_serial(src, dst, &f);
    }
    for_each_chunk_mut(dst, MIN_MAP_PER_THREAD, |start, dst| {
        map_serial(&src[start..start + dst.len()], dst, &f)
    });
}

#[inline(always)]
fn map_serial<A: Copy, T>(src: &[A], dst: &mut [T], f: &impl Fn(A) -> T) {
    for (d, &v) in dst.iter_mut().zip(src) {
        *d = f(v);
    }
}

/// `dst[i] = f(a[i], b[i])` for every `i` (lengths as in [`map_into`]).
#[inline]
pub fn zip_map_into<A: Copy + Sync, B: Copy + Sync, T: Send>(
    a: &[A],
    b: &[B],
    dst: &mut [T],
    f: impl Fn(A, B) -> T + Sync,
) {
    let len = a.len().min(b.len()).min(dst.len());
    let (a, b, dst) = (&a[..len], &b[..len], &mut dst[..len]);
    if !long(len) {
        return zip_map_serial(a, b, dst, &f);
    }
    for_each_chunk_mut(dst, MIN_MAP_PER_THREAD, |start, dst| {
        let end = start + dst.len();
        zip_map_serial(&a[start..end], &b[start..end], dst, &f)
    });
}

#[inline(always)]
fn zip_map_serial<A: Copy, B: Copy, T>(a: &[A], b: &[B], dst: &mut [T], f: &impl Fn(A, B) -> T) {
    for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
        *d = f(x, y);
    }
}

/// `data[i] = f(data[i])` for every `i`.
#[inline]
pub fn map_in_place<T: Copy + Send>(data: &mut [T], f: impl Fn(T) -> T + Sync) {
    let serial = |data: &mut [T]| {
        for v in data {
            *v = f(*v);
        }
    };
    if !long(data.len()) {
        return serial(data);
    }
    for_each_chunk_mut(data, MIN_MAP_PER_THREAD, |_, data| serial(data));
}

/// `data[i] = f(data[i], other[i])` for every `i` (lengths as in [`map_into`]).
#[inline]
pub fn zip_in_place<T: Copy + Send, A: Copy + Sync>(
    data: &mut [T],
    other: &[A],
    f: impl Fn(T, A) -> T + Sync,
) {
    let len = data.len().min(other.len());
    let (data, other) = (&mut data[..len], &other[..len]);
    let serial = |data: &mut [T], other: &[A]| {
        for (v, &o) in data.iter_mut().zip(other) {
            *v = f(*v, o);
        }
    };
    if !long(len) {
        return serial(data, other);
    }
    for_each_chunk_mut(data, MIN_MAP_PER_THREAD, |start, data| {
        serial(data, &other[start..start + data.len()])
    });
}
