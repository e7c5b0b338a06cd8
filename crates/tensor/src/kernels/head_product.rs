//! The products of one attention head, `out = w rhs` on small operands already in cache,
//! register-tiled over `out`'s rows and vectors of its columns. Each element is one chain of
//! fused multiply-adds over the depth in order, from +0 (the bits the `gemm` crate gives at these
//! sizes), and a causal extent skips the part of the product the mask makes zero.

use super::lanes::{cast, cast_mut, lanes, load, Lanes};
use super::matmul::{min_products_per_thread, BatchedProducts};
use super::workers::for_each_band_mut;
use crate::{Result, Scalar, Tensor};
use pulp::bytemuck;
use pulp::Simd;

/// Which part of `out = w rhs` a causal mask leaves to compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Extent {
    /// Every element, over the whole depth.
    Full,
    /// Causal scores: row `i` keeps columns `j <= i`, which get the full product's values; the
    /// rest of the row is +0.
    LowerColumns,
    /// Causal weights times values (`P V`, `dS K`): `w[i, l]` is zero for `l > i`, and row `i`'s
    /// sum may stop there.
    LowerWeights,
    /// Transposed causal weights (`P^T dY`, `dS^T Q`): `w[i, l]` is zero for `l < i`, and row
    /// `i`'s sum may start there.
    UpperWeights,
}

/// `out[i, j] = sum over l of w[i * w_rs + l * w_cs] * rhs[l * n + j]` for the `m x n` row-major
/// `out` and the `k x n` row-major `rhs`, each sum one fused multiply-add per `l` in order from
/// +0, within `extent`. Where the weights a causal extent skips are zero and `rhs` is finite,
/// every element equals the full product's (signed zeros aside), which is what `gemm` computes
/// for these operands; so the values depend neither on the CPU's vector width nor on the tiling.
///
/// # Panics
/// When an operand is too short for its dimensions and strides (a caller's bug, not input).
pub fn head_product<S: Scalar>(
    out: &mut [S],
    (m, n, k): (usize, usize, usize),
    (w, w_rs, w_cs): (&[S], usize, usize),
    rhs: &[S],
    extent: Extent,
) {
    if m == 0 || n == 0 {
        return;
    }
    let last_w = (m - 1)
        .checked_mul(w_rs)
        .and_then(|r| r.checked_add(k.saturating_sub(1).checked_mul(w_cs)?));
    assert!(
        out.len() >= m * n && rhs.len() >= k * n && (k == 0 || last_w.is_some_and(|i| i < w.len())),
        "head_product: an operand is too short for {m} x {n} x {k}"
    );
    fn run<S: Scalar, T: Lanes>(p: &Product<'_, S>, out: &mut [S]) -> bool {
        let (Some(w), Some(rhs), Some(out)) =
            (cast::<S, T>(p.w), cast::<S, T>(p.rhs), cast_mut(out))
        else {
            return false;
        };
        let p = Product {
            w,
            rhs,
            m: p.m,
            n: p.n,
            k: p.k,
            w_rs: p.w_rs,
            w_cs: p.w_cs,
            extent: p.extent,
        };
        pulp::Arch::new().dispatch(Tiles { p, out });
        true
    }
    let p = Product {
        m,
        n,
        k,
        w,
        w_rs,
        w_cs,
        rhs,
        extent,
    };
    if !run::<S, f32>(&p, out) && !run::<S, f64>(&p, out) {
        unreachable!("Scalar is f32 or f64");
    }
}

/// Batched `op(a) @ op(b)` as [`super::batched_matmul`] computes it (ranks >= 2, `op` transposing
/// the last two axes when its flag is set, batch dimensions broadcast), each product by
/// [`head_product`] within `extent` (over each product's rows): attention's products. Whole
/// products go to the threads, each on one thread, so the bits depend on neither the thread
/// count nor the CPU. A transposed `b` is copied transposed per product, since the tiles read
/// `op(b)`'s rows as vectors.
pub fn batched_head_product<S: Scalar>(
    a: &Tensor<S>,
    trans_a: bool,
    b: &Tensor<S>,
    trans_b: bool,
    extent: Extent,
) -> Result<Tensor<S>> {
    let plan = BatchedProducts::new(a, trans_a, b, trans_b)?;
    if plan.out_shape.numel() == 0 {
        return Ok(Tensor::zeros(&plan.out_shape));
    }
    let (m, n, k) = (plan.m, plan.n, plan.k);
    let (a_rs, a_cs) = plan.a_strides;
    let (a_mat, b_mat, mn) = (plan.a_mat, plan.b_mat, m * n);
    let (ad, bd) = (a.data(), b.data());
    let offsets = plan.offsets();
    let work = m.saturating_mul(n).saturating_mul(k);
    Ok(Tensor::from_writer(plan.out_shape.clone(), |out| {
        for_each_band_mut(out, mn, min_products_per_thread(work), |start, band| {
            let mut transposed = vec![S::ZERO; if trans_b { b_mat } else { 0 }];
            for (i, out) in band.chunks_mut(mn).enumerate() {
                let (ia, ib) = offsets[start / mn + i];
                let b = &bd[ib..ib + b_mat];
                let rhs = if trans_b {
                    // `b` is stored n x k; its transpose k x n.
                    for (j, row) in b.chunks_exact(k.max(1)).take(n).enumerate() {
                        for (l, &v) in row.iter().enumerate() {
                            transposed[l * n + j] = v;
                        }
                    }
                    &transposed[..]
                } else {
                    b
                };
                let w = (&ad[ia..ia + a_mat], a_rs, a_cs);
                head_product(out, (m, n, k), w, rhs, extent);
            }
        })
    }))
}

/// The operands and shape of one product.
struct Product<'a, T> {
    m: usize,
    n: usize,
    k: usize,
    w: &'a [T],
    w_rs: usize,
    w_cs: usize,
    rhs: &'a [T],
    extent: Extent,
}

struct Tiles<'a, T> {
    p: Product<'a, T>,
    out: &'a mut [T],
}

impl<T: Lanes> pulp::WithSimd for Tiles<'_, T> {
    type Output = ();
    // Inlined into pulp's `#[target_feature]` function, which is what lets the loops use it.
    #[inline(always)]
    fn with_simd<Sd: Simd>(self, simd: Sd) {
        // Rows of accumulators a tile holds, two vectors each, so that they, a depth step's two
        // vectors of `rhs` and its broadcast weights (which the compiler loads up front) fit
        // the registers: 32 vector registers with AVX-512, 16 with AVX2.
        if std::mem::size_of::<T::V<Sd>>() >= 64 {
            self.rows_in_tiles::<Sd, 8>(simd)
        } else {
            self.rows_in_tiles::<Sd, 4>(simd)
        }
    }
}

impl<T: Lanes> Tiles<'_, T> {
    #[inline(always)]
    fn rows_in_tiles<Sd: Simd, const R: usize>(self, simd: Sd) {
        let Tiles { p, out } = self;
        let mut i0 = 0;
        while i0 < p.m {
            let left = p.m - i0;
            i0 += if left >= R {
                p.rows::<Sd, R>(simd, i0, out)
            } else if left >= 4 {
                p.rows::<Sd, 4>(simd, i0, out)
            } else if left >= 2 {
                p.rows::<Sd, 2>(simd, i0, out)
            } else {
                p.rows::<Sd, 1>(simd, i0, out)
            };
        }
    }
}

impl<T: Lanes> Product<'_, T> {
    /// Rows `i0..i0 + RB` of `out`: whole tiles of two vectors, then of one, then the columns
    /// left one element at a time; returns `RB`.
    #[inline(always)]
    fn rows<Sd: Simd, const RB: usize>(&self, simd: Sd, i0: usize, out: &mut [T]) -> usize {
        let lanes = lanes::<T, Sd>();
        let (n, k) = (self.n, self.k);
        let depth = match self.extent {
            Extent::Full | Extent::LowerColumns => 0..k,
            Extent::LowerWeights => 0..k.min(i0 + RB),
            Extent::UpperWeights => i0.min(k)..k,
        };
        let columns = match self.extent {
            Extent::LowerColumns => n.min((i0 + RB).next_multiple_of(lanes)),
            _ => n,
        };
        let mut c = 0;
        while c + 2 * lanes <= columns {
            self.tile::<Sd, RB, 2>(simd, i0, c, depth.clone(), out);
            c += 2 * lanes;
        }
        while c + lanes <= columns {
            self.tile::<Sd, RB, 1>(simd, i0, c, depth.clone(), out);
            c += lanes;
        }
        for r in 0..RB {
            for j in c..columns {
                let mut acc = T::ZERO;
                for l in depth.clone() {
                    acc = T::fma_one(self.weight(i0 + r, l), self.rhs[l * n + j], acc);
                }
                out[(i0 + r) * n + j] = acc;
            }
        }
        if self.extent == Extent::LowerColumns {
            for i in i0..i0 + RB {
                out[i * n + (i + 1).min(n)..(i + 1) * n].fill(T::ZERO);
            }
        }
        RB
    }

    /// `w[i, l]`.
    #[inline(always)]
    fn weight(&self, i: usize, l: usize) -> T {
        // SAFETY: `head_product` asserted that the last element the strides address, at
        // (m - 1, k - 1), lies inside `w`, and every caller passes i < m, l < k.
        unsafe { *self.w.get_unchecked(i * self.w_rs + l * self.w_cs) }
    }

    /// The `RB x NV` vectors of `out` from row `i0`, column `c`, summed over `depth`.
    #[inline(always)]
    fn tile<Sd: Simd, const RB: usize, const NV: usize>(
        &self,
        simd: Sd,
        i0: usize,
        c: usize,
        depth: std::ops::Range<usize>,
        out: &mut [T],
    ) {
        let n = self.n;
        let zero = T::splat(simd, T::ZERO);
        let mut acc = [[zero; NV]; RB];
        for l in depth {
            // SAFETY: l < k and c + NV * lanes <= n, and `head_product` asserted k * n <= the
            // length of rhs.
            let x = unsafe { load::<T, T::V<Sd>, NV>(self.rhs, l * n + c) };
            for (r, acc) in acc.iter_mut().enumerate() {
                let w = T::splat(simd, self.weight(i0 + r, l));
                for (acc, &x) in acc.iter_mut().zip(&x) {
                    *acc = T::fma(simd, w, x, *acc);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let values: &[T] = bytemuck::cast_slice(acc);
            let at = (i0 + r) * n + c;
            out[at..at + values.len()].copy_from_slice(values);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition: one `mul_add` chain per element over the whole depth, in order from +0.
    fn reference<S: Scalar + Lanes>(
        (m, n, k): (usize, usize, usize),
        (w, w_rs, w_cs): (&[S], usize, usize),
        rhs: &[S],
    ) -> Vec<S> {
        let mut out = vec![S::ZERO; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut acc = S::ZERO;
                for l in 0..k {
                    acc = S::fma_one(w[i * w_rs + l * w_cs], rhs[l * n + j], acc);
                }
                out[i * n + j] = acc;
            }
        }
        out
    }

    /// Deterministic values in [-1, 1) that are rarely round.
    fn values<S: Scalar>(len: usize, seed: u64) -> Vec<S> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                S::from_f64((state >> 11) as f64 / (1u64 << 52) as f64 - 1.0)
            })
            .collect()
    }

    /// Zero `w[i, l]` where `keep(i, l)` is false.
    fn masked<S: Scalar>(
        w: &mut [S],
        (m, k): (usize, usize),
        (rs, cs): (usize, usize),
        keep: impl Fn(usize, usize) -> bool,
    ) {
        for i in 0..m {
            for l in 0..k {
                if !keep(i, l) {
                    w[i * rs + l * cs] = S::ZERO;
                }
            }
        }
    }

    fn check<S: Scalar + Lanes>(m: usize, n: usize, k: usize, transposed: bool) {
        let (rs, cs) = if transposed { (1, m) } else { (k, 1) };
        let w = values::<S>(m * k, (m * 131 + n * 17 + k) as u64);
        let rhs = values::<S>(k * n, (m + n * 7 + k * 3) as u64);
        let bits = |v: &[S]| v.iter().map(|x| x.to_f64().to_bits()).collect::<Vec<_>>();
        let run = |w: &[S], extent| {
            let mut out = values::<S>(m * n, 99);
            head_product(&mut out, (m, n, k), (w, rs, cs), &rhs, extent);
            out
        };
        let full = reference((m, n, k), (&w, rs, cs), &rhs);
        assert_eq!(
            bits(&run(&w, Extent::Full)),
            bits(&full),
            "full {m}x{n}x{k}"
        );

        let mut scores = full.clone();
        masked(&mut scores, (m, n), (n, 1), |i, j| j <= i);
        let lower = run(&w, Extent::LowerColumns);
        assert_eq!(bits(&lower), bits(&scores), "lower columns {m}x{n}x{k}");

        for (extent, keep) in [
            (
                Extent::LowerWeights,
                (|i, l| l <= i) as fn(usize, usize) -> bool,
            ),
            (Extent::UpperWeights, |i, l| l >= i),
        ] {
            let mut wm = w.clone();
            masked(&mut wm, (m, k), (rs, cs), keep);
            let want = reference((m, n, k), (&wm, rs, cs), &rhs);
            assert_eq!(
                bits(&run(&wm, extent)),
                bits(&want),
                "{extent:?} {m}x{n}x{k}"
            );
        }
    }

    #[test]
    fn every_extent_is_the_full_chain_on_every_shape() {
        for (m, n, k) in [
            (64, 64, 32),
            (64, 32, 64),
            (1, 1, 1),
            (5, 3, 7),
            (13, 29, 11),
            (40, 17, 40),
            (33, 48, 33),
            (7, 0, 3),
            (4, 5, 0),
        ] {
            for transposed in [false, true] {
                check::<f32>(m, n, k, transposed);
                check::<f64>(m, n, k, transposed);
            }
        }
    }

    /// The claim the attention ops rely on: on these shapes `gemm` sums each element as one chain
    /// in order too, so the full product has its bits, row-major weights or transposed.
    #[test]
    fn the_full_product_has_the_bits_of_gemm() {
        for (m, n, k) in [(64, 64, 32), (64, 32, 64), (48, 24, 48), (17, 9, 5)] {
            for transposed in [false, true] {
                let (rs, cs) = if transposed { (1, m) } else { (k, 1) };
                let w = values::<f32>(m * k, 5);
                let rhs = values::<f32>(k * n, 6);
                let mut ours = vec![0.0; m * n];
                head_product(&mut ours, (m, n, k), (&w, rs, cs), &rhs, Extent::Full);
                let mut theirs = vec![0.0; m * n];
                f32::gemm(
                    m,
                    n,
                    k,
                    &mut theirs,
                    n,
                    &w,
                    rs,
                    cs,
                    &rhs,
                    n,
                    1,
                    false,
                    1.0,
                    1,
                );
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&ours),
                    bits(&theirs),
                    "{m}x{n}x{k} transposed {transposed}"
                );
            }
        }
    }

    /// The same bits on one lane, on AVX2 and on AVX-512 (where this CPU has them): the vector
    /// width picks which elements a tile computes together, never an element's additions.
    #[test]
    fn the_bits_do_not_depend_on_the_vector_width() {
        use pulp::WithSimd;
        fn on<Sd: Simd>(
            simd: Sd,
            dims: (usize, usize, usize),
            w: &[f64],
            rhs: &[f64],
            extent: Extent,
        ) -> Vec<u64> {
            let (m, n, k) = dims;
            let mut out = vec![0.0; m * n];
            let p = Product {
                m,
                n,
                k,
                w,
                w_rs: k,
                w_cs: 1,
                rhs,
                extent,
            };
            Tiles { p, out: &mut out }.with_simd(simd);
            out.iter().map(|v| v.to_bits()).collect()
        }
        for dims @ (m, n, k) in [(64, 64, 32), (13, 29, 11), (33, 48, 33)] {
            let w = values::<f64>(m * k, 1);
            let rhs = values::<f64>(k * n, 2);
            for extent in [Extent::Full, Extent::LowerColumns] {
                let one_lane = on(pulp::Scalar::new(), dims, &w, &rhs, extent);
                #[cfg(target_arch = "x86_64")]
                {
                    if let Some(simd) = pulp::x86::V3::try_new() {
                        assert_eq!(on(simd, dims, &w, &rhs, extent), one_lane, "AVX2 {dims:?}");
                    }
                    if let Some(simd) = pulp::x86::V4::try_new() {
                        assert_eq!(
                            on(simd, dims, &w, &rhs, extent),
                            one_lane,
                            "AVX-512 {dims:?}"
                        );
                    }
                }
            }
        }
    }
}
