//! The causal attention softmax in place over a block of score rows: row `i` of each query
//! block keeps its first `i + 1` keys, known without a mask. The rows' loops run in vector
//! lanes (AVX2 or AVX-512 at run time), and bands of rows go to the threads.

use super::exp::exp_value;
use super::par_map::MIN_MAP_PER_THREAD;
use super::reduce::{pairwise_span, pairwise_sum, pairwise_sums_by};
use super::workers::for_each_band_mut;
use crate::Scalar;

/// Softmax of `scores * scale` over each row's kept prefix, in place on `p` (rows of `keys`
/// scores; query `i` of each block of `queries` rows keeps keys `j <= i`): the maximum of the
/// prefix, `exp` of the differences ([`exp_value`]), the prefix summed pairwise, each element
/// divided by the sum; the masked part is set to `0 / sum` (0, or NaN for a NaN row), never
/// compared or summed (the few masked scores a row's last block of lanes takes in are
/// exponentiated and then overwritten). The bits depend on neither the thread count nor the
/// CPU.
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
        let rows = band.len() / keys;
        for first in (0..rows).step_by(SUM_ROWS) {
            let group = (rows - first).min(SUM_ROWS);
            let row_at = |g: usize| (first + g) * keys;
            let mut ends = [0; SUM_ROWS];
            for (g, end) in ends.iter_mut().enumerate().take(group) {
                let row = &mut band[row_at(g)..row_at(g) + keys];
                *end = ((first_row + first + g) % queries + 1).min(keys);
                // The maps run over whole blocks of lanes: the few masked scores past `end` that
                // this takes in are overwritten below, and a row's scalar tail would cost more.
                let padded = end.next_multiple_of(LANES).min(keys);
                // `+ 0` as a masked softmax adds its absent float mask (it turns -0 into +0).
                in_lanes(&mut row[..padded], |s| s * scale + S::ZERO);
                let m = first_nan_or_max(&row[..*end]);
                in_lanes(&mut row[..padded], |s| exp_value(s - m));
            }
            // The group's sums together when their pairwise orders share one tree: each kept
            // prefix padded with zeros (over masked scores, overwritten below) to that tree's span.
            let span = pairwise_span(ends[0]);
            let together = group == SUM_ROWS
                && span <= keys
                && ends.iter().all(|&end| pairwise_span(end) == span);
            let totals: [S; SUM_ROWS] = if together {
                for (g, &end) in ends.iter().enumerate() {
                    band[row_at(g) + end..row_at(g) + span].fill(S::ZERO);
                }
                let band = &*band;
                pairwise_sums_by::<S, SUM_ROWS>(span, &|g, j| band[row_at(g) + j])
            } else {
                std::array::from_fn(|g| {
                    let start = row_at(g);
                    if g < group {
                        pairwise_sum(&band[start..start + ends[g]])
                    } else {
                        S::ZERO
                    }
                })
            };
            for g in 0..group {
                let row = &mut band[row_at(g)..row_at(g) + keys];
                let (kept, masked) = row.split_at_mut(ends[g]);
                for s in kept.iter_mut() {
                    *s /= totals[g];
                }
                masked.fill(S::ZERO / totals[g]);
            }
        }
    }
}

/// How many rows take their sums together (their additions interleaved).
const SUM_ROWS: usize = 8;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::exp::exp_value;

    /// The definition, one row at a time: `max_nan` folded left to right over the kept prefix,
    /// `exp` of each scaled difference, the prefix summed pairwise, each element divided, the
    /// rest `0 / sum`.
    fn reference<S: Scalar>(p: &[S], queries: usize, keys: usize, scale: S) -> Vec<S> {
        let mut out = p.to_vec();
        for (r, row) in out.chunks_mut(keys).enumerate() {
            let end = (r % queries + 1).min(keys);
            let z: Vec<S> = row[..end].iter().map(|&s| s * scale + S::ZERO).collect();
            let m = z[1..].iter().fold(z[0], |m, &v| m.max_nan(v));
            let e: Vec<S> = z.iter().map(|&v| exp_value(v - m)).collect();
            let total = pairwise_sum(&e);
            for (o, v) in row.iter_mut().zip(e.iter().map(|&v| v / total)) {
                *o = v;
            }
            row[end..].fill(S::ZERO / total);
        }
        out
    }

    /// Scores from a fixed word stream, spread over [-spread, spread), with each row's
    /// largest value at a different position.
    fn scores<S: Scalar>(n: usize, spread: f64, salt: u64) -> Vec<S> {
        let mut state = salt;
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let unit = (state >> 11) as f64 / (1u64 << 53) as f64;
                S::from_f64(spread * (2.0 * unit - 1.0))
            })
            .collect()
    }

    fn same_bits<S: Scalar>(got: &[S], want: &[S]) -> bool {
        got.iter().zip(want).all(|(a, b)| {
            a.to_f64().to_bits() == b.to_f64().to_bits() || (a.is_nan() && b.is_nan())
        })
    }

    fn check<S: Scalar>() {
        // Key counts around the 16-lane blocks; more queries than keys, so rows also run past
        // the keys (kept prefix = every key) and wrap to a new block of queries.
        for keys in [1, 2, 15, 16, 17, 31, 33, 47, 64, 70] {
            for (queries, spread) in [(keys, 3.0), (keys + 5, 40.0), (3, 1.0)] {
                let p: Vec<S> = scores(2 * queries * keys, spread, keys as u64);
                let scale = S::from_f64(0.37);
                let mut got = p.clone();
                causal_softmax(&mut got, queries, keys, scale);
                let want = reference(&p, queries, keys, scale);
                assert!(same_bits(&got, &want), "keys {keys}, queries {queries}");
            }
        }
        // A NaN score makes its row NaN, masked part included, and leaves the others alone.
        let keys = 20;
        let mut p: Vec<S> = scores(keys * keys, 5.0, 9);
        p[10 * keys + 5] = S::from_f64(f64::NAN);
        let want = reference(&p, keys, keys, S::ONE);
        causal_softmax(&mut p, keys, keys, S::ONE);
        assert!(p[10 * keys..11 * keys].iter().all(|v| v.is_nan()));
        assert!(p[..10 * keys]
            .iter()
            .chain(&p[11 * keys..])
            .all(|v| !v.is_nan()));
        assert!(same_bits(&p, &want));
    }

    #[test]
    fn rows_have_the_bits_of_the_definition() {
        check::<f32>();
        check::<f64>();
    }
}
