//! The row vector times matrix product of a one-row batch: `out = g W` for a row-major `W`, the
//! input gradient of a one-row linear layer. gemm runs this shape through its general driver,
//! whose fixed cost dwarfs a small layer's work (0.37 us for a 10 x 128 weight here); this
//! kernel adds the weight's rows into the output in order.

use crate::Scalar;

/// Rows of `w` added per pass over `out`: the output is loaded and stored once per four rows.
const ROWS: usize = 4;

/// `out[j] = sum over i of g[i] * w[i][j]` for the row-major `(g.len(), out.len())` matrix `w`,
/// each sum taken in row order from zero (`((0 + g0 w0j) + g1 w1j) + ...`). Every output element
/// is its own chain, so the vector width changes nothing: every CPU gives the same bits.
pub fn vecmat_rows<S: Scalar>(g: &[S], w: &[S], out: &mut [S]) {
    assert_eq!(
        w.len(),
        g.len() * out.len(),
        "vecmat_rows: w has the wrong length"
    );
    pulp::Arch::new().dispatch(VecMat { g, w, out });
}

struct VecMat<'a, S> {
    g: &'a [S],
    w: &'a [S],
    out: &'a mut [S],
}

impl<S: Scalar> pulp::WithSimd for VecMat<'_, S> {
    type Output = ();
    // Inlined into pulp's `#[target_feature]` function, which is what lets the loops use it.
    #[inline(always)]
    fn with_simd<V: pulp::Simd>(self, _simd: V) {
        let VecMat { g, w, out } = self;
        let n = out.len();
        out.fill(S::ZERO);
        if n == 0 {
            return;
        }
        let mut rows = w.chunks_exact(n).zip(g);
        // Four rows at a time, added one after the other to each element: the same order as
        // one row at a time.
        while rows.len() >= ROWS {
            let mut take = || rows.next().map(|(row, &gi)| (row, gi));
            let (Some((w0, g0)), Some((w1, g1)), Some((w2, g2)), Some((w3, g3))) =
                (take(), take(), take(), take())
            else {
                break;
            };
            let columns = w0.iter().zip(w1).zip(w2.iter().zip(w3));
            for (o, ((&a, &b), (&c, &d))) in out.iter_mut().zip(columns) {
                *o = (((*o + g0 * a) + g1 * b) + g2 * c) + g3 * d;
            }
        }
        for (row, &gi) in rows {
            for (o, &a) in out.iter_mut().zip(row) {
                *o += gi * a;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every element is its row-ordered sum, bit for bit, for any shape (whole blocks of
        /// four rows, a remainder, empty either way) and any finite values.
        #[test]
        fn every_element_is_its_row_ordered_sum_bit_for_bit(
            k in 0usize..19,
            n in 0usize..70,
            seed in any::<u64>(),
        ) {
            // Values of mixed signs and magnitudes from the seed, so rounding differs by order.
            let value = |i: usize| {
                let h = (seed ^ i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
                (h as f32 / (1u64 << 24) as f32 - 0.5) * 2f32.powi((h % 13) as i32 - 6)
            };
            let g: Vec<f32> = (0..k).map(|i| value(i + 1_000_003)).collect();
            let w: Vec<f32> = (0..k * n).map(value).collect();
            let mut out = vec![f32::NAN; n];
            vecmat_rows(&g, &w, &mut out);
            for (j, o) in out.iter().enumerate() {
                let want = (0..k).fold(0.0f32, |sum, i| sum + g[i] * w[i * n + j]);
                prop_assert_eq!(o.to_bits(), want.to_bits(), "k {}, n {}, column {}", k, n, j);
            }
        }
    }
}
