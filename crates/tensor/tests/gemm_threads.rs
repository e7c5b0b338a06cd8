//! The `Scalar::gemm` hook on random shapes (m, n, k from 0 up, odd sizes, strided and transposed
//! operands, accumulate or not, the product scaled by one or by another factor): against a naive
//! triple loop, and bit-identical for every thread count, including the products large enough
//! that the output is cut into bands of rows or of columns (written in place between the padding
//! of each row), more bands than threads included.

mod common;

use common::*;
use tapegrad_tensor::{DType, Scalar};

struct Case {
    m: usize,
    n: usize,
    k: usize,
    trans_lhs: bool,
    trans_rhs: bool,
    accumulate: bool,
    /// The product's factor (`Scalar::gemm`'s `scale`), rounded to the element type.
    scale: f64,
}

/// `dst` (m x n, row stride n + 3, so the padding between rows must stay untouched) after the
/// product on `threads` threads, and the naive f64 result for the same inputs.
fn run<S: Scalar>(c: &Case, seed: u64, threads: usize) -> (Vec<S>, Vec<f64>) {
    let (m, n, k) = (c.m, c.n, c.k);
    let fill = |len, seed| -> Vec<S> {
        floats(len, seed, 1.0)
            .into_iter()
            .map(S::from_f64)
            .collect()
    };
    let lhs = fill(m * k, seed);
    let rhs = fill(k * n, seed + 1);
    let dst_rs = n + 3;
    let mut dst = fill(m * dst_rs, seed + 2);
    let start = dst.clone();
    // Row-major (rs, cs) of an r x c matrix, or of the transpose of a stored c x r one.
    let (lhs_rs, lhs_cs) = if c.trans_lhs { (1, m) } else { (k, 1) };
    let (rhs_rs, rhs_cs) = if c.trans_rhs { (1, k) } else { (n, 1) };
    S::gemm(
        m,
        n,
        k,
        &mut dst,
        dst_rs,
        &lhs,
        lhs_rs,
        lhs_cs,
        &rhs,
        rhs_rs,
        rhs_cs,
        c.accumulate,
        S::from_f64(c.scale),
        threads,
    );
    let mut want: Vec<f64> = start.iter().map(|v| v.to_f64()).collect();
    for i in 0..m {
        for j in 0..n {
            let total: f64 = (0..k)
                .map(|p| {
                    lhs[i * lhs_rs + p * lhs_cs].to_f64() * rhs[p * rhs_rs + j * rhs_cs].to_f64()
                })
                .sum();
            let slot = &mut want[i * dst_rs + j];
            let scaled = S::from_f64(c.scale).to_f64() * total;
            *slot = if c.accumulate { *slot + scaled } else { scaled };
        }
    }
    (dst, want)
}

fn check<S: Scalar>(c: &Case, seed: u64) {
    let tol = if S::DTYPE == DType::F32 { 1e-4 } else { 1e-12 };
    let (one, want) = run::<S>(c, seed, 1);
    for (i, (g, w)) in one.iter().zip(&want).enumerate() {
        // The product's rounding grows with its depth and with the factor it is scaled by.
        let size = 1.0 + c.scale.abs() * (c.k as f64).sqrt();
        assert!(
            (g.to_f64() - w).abs() <= tol * size,
            "element {i}: {g} vs {w}, m {} n {} k {}",
            c.m,
            c.n,
            c.k
        );
    }
    for threads in [2, 3, 4] {
        let (many, _) = run::<S>(c, seed, threads);
        assert!(
            same_bits(&one, &many),
            "{threads} threads differ from 1: m {} n {} k {} trans {} {} acc {} scale {}",
            c.m,
            c.n,
            c.k,
            c.trans_lhs,
            c.trans_rhs,
            c.accumulate,
            c.scale
        );
    }
}

#[test]
#[cfg_attr(miri, ignore = "products of up to 10^7 multiply-adds")]
fn random_shapes_match_the_naive_product_on_every_thread_count() {
    // xorshift: the shapes only need to be varied and reproducible.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |below: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % below as u64) as usize
    };
    let sizes = [0, 1, 2, 3, 7, 16, 17, 33, 63, 64, 65, 100, 129, 200, 257];
    let mut cases = vec![
        // The MLP's products at batch 32 and 256, forward and both gradients.
        (32, 784, 256),
        (256, 256, 128),
        (784, 256, 32),
        (32, 128, 10),
        (256, 784, 1),
        (1, 784, 256),
        // Bands either side of gemm's 64 x 64 small-product path.
        (130, 60, 90),
        (72, 70, 300),
        // Four rows: column bands.
        (4, 1000, 1000),
        // Column bands written in place (a row-major lhs packs nothing again), between rows
        // of padding, 2 to 4 bands, the last one narrower.
        (256, 128, 64),
        (100, 70, 300),
        // Too narrow for bands either way: gemm's own Rayon split.
        (9, 30000, 12),
    ];
    for _ in 0..40 {
        let (m, k, n) = (next(sizes.len()), next(sizes.len()), next(sizes.len()));
        cases.push((sizes[m], sizes[k], sizes[n]));
    }
    for (i, (m, k, n)) in cases.into_iter().enumerate() {
        let c = Case {
            m,
            n,
            k,
            trans_lhs: next(2) == 1,
            trans_rhs: next(2) == 1,
            accumulate: next(2) == 1,
            // A negative learning rate's worth, as plain SGD's fused update passes, or one.
            scale: [1.0, -0.037, 2.5][next(3)],
        };
        check::<f32>(&c, i as u64 * 10);
        check::<f64>(&c, i as u64 * 10 + 5);
    }
}

#[test]
#[cfg_attr(miri, ignore = "products of up to 10^7 multiply-adds")]
fn long_sides_cut_into_more_bands_than_threads_keep_the_bits() {
    // (m, k, n). Sides of 1,024 and more get two bands per thread on 2 threads (1030 rows: 4
    // bands of 264, the last 238), one per thread on 3 and 4. A row-major lhs makes column bands
    // free of repacking, so the same shape is cut into columns with it and into rows without.
    let shapes = [
        (1030, 40, 70),
        (70, 40, 1030),
        (1031, 33, 129),
        (129, 33, 1031),
    ];
    for (i, (m, k, n)) in shapes.into_iter().enumerate() {
        for trans_lhs in [false, true] {
            let c = Case {
                m,
                n,
                k,
                trans_lhs,
                trans_rhs: i % 2 == 1,
                accumulate: i >= 2,
                scale: if trans_lhs { -0.01 } else { 1.0 },
            };
            let seed = 1000 + i as u64 * 10 + trans_lhs as u64;
            check::<f32>(&c, seed);
            check::<f64>(&c, seed + 5);
        }
    }
}
