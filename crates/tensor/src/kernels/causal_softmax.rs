//! The causal attention softmax in place over a block of score rows: row `i` of each query
//! block keeps its first `i + 1` keys, known without a mask. The rows' loops run in vector
//! lanes (AVX2 or AVX-512 at run time), and bands of rows go to the threads.

use super::exp::exp_value;
use super::par_map::MIN_MAP_PER_THREAD;
use super::reduce::pairwise_sum;
use super::workers::for_each_band_mut;
use crate::Scalar;

/// Softmax of `scores * scale` over each row's kept prefix, in place on `p` (rows of `keys`
/// scores; query `i` of each block of `queries` rows keeps keys `j <= i`): the maximum of the
/// prefix, `exp` of the differences ([`exp_value`]), the prefix summed pairwise, each element
/// divided by the sum; the masked part is set to `0 / sum` (0, or NaN for a NaN row), never
/// compared or exponentiated. The bits depend on neither the thread count nor the CPU.
pub fn causal_softmax<S: Scalar>(p: &mut [S], queries: usize, keys: usize, scale: S) {
    if keys == 0 || queries == 0 {
        return;
    }
    // Rows are independent: bands of them go to the threads with the same bits.
    for_each_band_mut(p, keys, MIN_MAP_PER_THREAD.div_ceil(keys), |start, band| {
        let first_row = start / keys;
        pulp::Arch::new().dispatch(Band {
            first_row,
            queries,
            keys,
            scale,
            band,
        })
    });
}

/// The rows of `band`, the first of which is row `first_row` of the scores.
struct Band<'a, S> {
    first_row: usize,
    queries: usize,
    keys: usize,
    scale: S,
    band: &'a mut [S],
}

impl<S: Scalar> pulp::WithSimd for Band<'_, S> {
    type Output = ();
    // Inlined into pulp's `#[target_feature]` function, which is what lets the loops use it.
    #[inline(always)]
    fn with_simd<V: pulp::Simd>(self, _simd: V) {
        let Band {
            first_row,
            queries,
            keys,
            scale,
            band,
        } = self;
        for (r, row) in band.chunks_mut(keys).enumerate() {
            let end = ((first_row + r) % queries + 1).min(keys);
            // The maps run over whole blocks of lanes: the few masked scores past `end` that
            // this takes in are overwritten below, and a row's scalar tail would cost more.
            let padded = end.next_multiple_of(LANES).min(keys);
            // `+ 0` as a masked softmax adds its absent float mask (it turns -0 into +0).
            in_lanes(&mut row[..padded], |s| s * scale + S::ZERO);
            let m = first_nan_or_max(&row[..end]);
            in_lanes(&mut row[..padded], |s| exp_value(s - m));
            let (kept, masked) = row.split_at_mut(end);
            let total = pairwise_sum(kept);
            for s in kept.iter_mut() {
                *s /= total;
            }
            masked.fill(S::ZERO / total);
        }
    }
}

/// The width of the blocks the row loops work in: one AVX-512 register of f32, two of f64.
const LANES: usize = 16;

/// `x = f(x)` over `row`, block by block of [`LANES`] (a fixed-size inner loop, which
/// vectorizes without a scalar tail), then the rest one by one.
#[inline(always)]
fn in_lanes<S: Scalar>(row: &mut [S], f: impl Fn(S) -> S) {
    let mut blocks = row.chunks_exact_mut(LANES);
    for block in &mut blocks {
        let block: &mut [S; LANES] = block.try_into().unwrap_or_else(|_| unreachable!());
        for v in block.iter_mut() {
            *v = f(*v);
        }
    }
    for v in blocks.into_remainder() {
        *v = f(*v);
    }
}

/// The fold of `max_nan` over `row` from its first element (the first NaN if there is one),
/// in lanes so that it vectorizes. Without NaN, and with no -0 (whose order against +0 the
/// fold would decide), the largest element does not depend on the order it is found in.
#[inline(always)]
fn first_nan_or_max<S: Scalar>(row: &[S]) -> S {
    let Some(&first) = row.first() else {
        return S::ZERO;
    };
    let mut lanes = [first; LANES];
    let mut nan = false;
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            nan |= v.is_nan();
            *m = if v > *m { v } else { *m };
        }
    }
    for &v in chunks.remainder() {
        nan |= v.is_nan();
        lanes[0] = if v > lanes[0] { v } else { lanes[0] };
    }
    if nan {
        return row.iter().copied().find(|v| v.is_nan()).unwrap_or(first);
    }
    lanes
        .iter()
        .copied()
        .fold(first, |m, v| if v > m { v } else { m })
}
