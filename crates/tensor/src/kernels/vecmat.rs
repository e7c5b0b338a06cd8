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

    /// The definition, one product at a time in row order.
    fn reference(g: &[f32], w: &[f32], n: usize) -> Vec<f32> {
        (0..n)
            .map(|j| {
                g.iter()
                    .enumerate()
                    .fold(0.0, |sum, (i, &gi)| sum + gi * w[i * n + j])
            })
            .collect()
    }

    #[test]
    fn every_element_is_its_row_ordered_sum_bit_for_bit() {
        let value =
            |i: usize| ((i * 7919 % 1000) as f32 / 250.0 - 2.0) * 1.37f32.powi((i % 7) as i32);
        for (k, n) in [
            (0, 5),
            (1, 1),
            (3, 17),
            (4, 16),
            (5, 33),
            (10, 128),
            (128, 256),
            (9, 0),
        ] {
            let g: Vec<f32> = (0..k).map(|i| value(i * 3 + 1)).collect();
            let w: Vec<f32> = (0..k * n).map(value).collect();
            let mut out = vec![f32::NAN; n];
            vecmat_rows(&g, &w, &mut out);
            let want = reference(&g, &w, n);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out), bits(&want), "k {k}, n {n}");
        }
    }
}
