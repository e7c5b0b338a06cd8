//! The products behind `linear` (`x W^T + b`) and its gradients, on `(rows, features)` views:
//! which GEMM orientation packs less, the batch-of-one matrix-vector paths, and the bias sums.
//! Every path gives the values `linear` defines; the choice between them depends only on shapes.

use super::matmul::{run_jobs_on_threads, worth_threads};
use super::par_map::MIN_MAP_PER_THREAD;
use super::workers::for_each_band_mut;
use super::{
    batched_matmul, column_sums, matvec_rows, num_threads, outer_product, transpose, vecmat_rows,
};
use crate::{Error, Result, Scalar, Shape, Tensor};

/// `g w`: linear's input gradient from the `(rows, out)` cotangent and the `(out, in)` weight. A
/// one-row cotangent runs on our row-vector kernel (`vecmat_rows`: each element summed in row
/// order), as gemm's general driver costs more than a small layer's whole product.
pub fn linear_input_grad<S: Scalar>(g2: &Tensor<S>, w: &Tensor<S>) -> Result<Tensor<S>> {
    if let ([1, out], [w_out, inn]) = (g2.dims(), w.dims()) {
        if out == w_out {
            let shape = Shape::new([1, *inn])?;
            return Ok(Tensor::from_writer(shape, |d| {
                vecmat_rows(g2.data(), w.data(), d)
            }));
        }
    }
    batched_matmul(g2, false, w, false)
}

/// `x @ w^T (+ b)` on the flattened `(rows, in)` view of `x`; returns `(rows, out)`. With a
/// bias, the output starts as the bias in every row and the GEMM accumulates the product into
/// it, which saves the separate pass adding the bias to the product.
pub fn linear_rows<S: Scalar>(
    x2: &Tensor<S>,
    w: &Tensor<S>,
    b: Option<&Tensor<S>>,
) -> Result<Tensor<S>> {
    // The callers check shapes first; this keeps the indexing below an error, never a panic.
    if x2.rank() != 2 || w.rank() != 2 {
        return Err(Error::invalid(
            "linear",
            format!(
                "expected a (rows, in) input and an (out, in) weight, found {} and {}",
                x2.shape(),
                w.shape()
            ),
        ));
    }
    let (rows, inn) = (x2.dims()[0], x2.dims()[1]);
    let out = w.dims()[0];
    if rows == 1 && w.dims()[1] == inn && b.is_none_or(|b| b.dims() == [out]) {
        // A batch of one: a matrix-vector product, on our kernel rather than gemm's (see
        // `matvec_rows`); every output element is written.
        return Ok(Tensor::from_writer(Shape::new([1, out])?, |d| {
            matvec_rows(w.data(), x2.data(), b.map(|b| b.data()), d)
        }));
    }
    let Some(b) = b else {
        return batched_matmul(x2, false, w, true);
    };
    if w.dims()[1] != inn || b.dims() != [out] {
        return Err(Error::invalid(
            "linear",
            format!(
                "input shape {} and weight shape {} with bias shape {} are incompatible",
                x2.shape(),
                w.shape(),
                b.shape()
            ),
        ));
    }
    if packs_less_transposed(rows, out) {
        return linear_rows_transposed(x2, w, b);
    }
    // The output starts as the bias in every row (which overwrites a recycled buffer whole)
    // and the GEMM accumulates the product into it. W^T is W read with its strides swapped
    // (row stride 1, column stride `in`), never copied.
    Ok(Tensor::from_writer(Shape::new([rows, out])?, |d| {
        if out == 0 {
            return;
        }
        // On the GEMM threads where long: a pass over cold memory as long as the output.
        for_each_band_mut(d, out, MIN_MAP_PER_THREAD.div_ceil(out), |_, band| {
            for row in band.chunks_exact_mut(out) {
                row.copy_from_slice(b.data());
            }
        });
        S::gemm(
            rows,
            out,
            inn,
            d,
            out,
            x2.data(),
            inn,
            1,
            w.data(),
            1,
            inn,
            true,
            S::ONE,
            num_threads(),
        );
    }))
}

/// Whether `x W^T` costs less packing computed as `(W x^T)^T`. gemm runs a row-major product
/// as its column-major transpose and packs the operand that spans the output's rows
/// (contiguous dimension) unless that operand is contiguous along them: for `x W^T` that is W,
/// read across its rows (all `out * in` elements, every call), for `W x^T` it is x (`rows * in`).
/// Fewer rows than outputs make x the smaller one; a single row stays on gemm's
/// matrix-vector path, which packs nothing.
fn packs_less_transposed(rows: usize, out: usize) -> bool {
    rows > 1 && rows < out
}

/// `x W^T + b` as the transpose of `W x^T + b^T`: the GEMM writes the `(out, rows)` product into
/// a scratch buffer whose rows start as the bias elements, and one blocked transpose gives the
/// `(rows, out)` result. Every element is the same dot product of a row of x and a row of W
/// added to its bias, so the values are the ones `linear` defines (the order of the additions
/// inside the dot product is gemm's, as in the other orientation).
fn linear_rows_transposed<S: Scalar>(
    x2: &Tensor<S>,
    w: &Tensor<S>,
    b: &Tensor<S>,
) -> Result<Tensor<S>> {
    let (rows, inn) = (x2.dims()[0], x2.dims()[1]);
    let out = w.dims()[0];
    let product = Tensor::from_writer(Shape::new([out, rows])?, |d| {
        if rows == 0 {
            return;
        }
        for (row, &bias) in d.chunks_exact_mut(rows).zip(b.data()) {
            row.fill(bias);
        }
        // W row-major is the left operand as stored; x^T is x read with its strides swapped.
        S::gemm(
            out,
            rows,
            inn,
            d,
            rows,
            w.data(),
            inn,
            1,
            x2.data(),
            1,
            inn,
            true,
            S::ONE,
            num_threads(),
        );
    });
    transpose(&product, 0, 1)
}

/// The weight gradient `g^T x` of linear, `(out, in)` from `g` `(rows, out)` and `x` `(rows,
/// in)`. One row (a batch of one) is an outer product, a vectorised loop instead of a GEMM
/// with k = 1 (packing, edge kernels); each element is the single rounded product the GEMM
/// stores, sign of zero included (a test checks the bits). Public so that a gradient handed over
/// as these two factors (`tapegrad_nn::Grad::Outer`) is multiplied out with these very bits.
pub fn linear_weight_grad<S: Scalar>(g2: &Tensor<S>, x2: &Tensor<S>) -> Result<Tensor<S>> {
    if g2.rank() != 2 || x2.rank() != 2 || g2.dims()[0] != x2.dims()[0] {
        return Err(Error::invalid(
            "linear",
            format!(
                "a weight gradient needs (rows, out) and (rows, in) factors, found {} and {}",
                g2.shape(),
                x2.shape()
            ),
        ));
    }
    let (rows, out, inn) = (g2.dims()[0], g2.dims()[1], x2.dims()[1]);
    if rows != 1 {
        return batched_matmul(g2, true, x2, false);
    }
    // Every (row, column) product is written, so a recycled buffer needs no zeroing.
    Ok(Tensor::from_writer(Shape::new([out, inn])?, |d| {
        outer_product(g2.data(), x2.data(), d)
    }))
}

/// Linear's gradients from one backward: the input gradient `g w` when `w` is given, the weight
/// gradient `g^T x` when `x2` is, the bias gradient when `bias` is set, each with the bits of
/// [`linear_input_grad`], [`linear_weight_grad`] and [`linear_bias_grad`] (on one thread as on
/// any count).
///
/// The two products are independent and equal in work. On two or more GEMM threads, where
/// [`grads_side_by_side`] says it pays, they run as two jobs on the kernels' worker threads, each a
/// single-threaded GEMM: a product too small to cut into bands still gets a second core, and a
/// mid-sized one saves the band hand-offs and the second packing of its shared operand. Both
/// outputs are allocated here, on the calling thread, so their buffers come from (and return
/// to) this thread's pool; a tensor made inside a job on a helper would miss the helper's pool
/// every step (see `workers::run_jobs_on`).
#[allow(clippy::type_complexity)]
pub fn linear_grads<S: Scalar>(
    g2: &Tensor<S>,
    w: Option<&Tensor<S>>,
    x2: Option<&Tensor<S>>,
    bias: bool,
) -> Result<(Option<Tensor<S>>, Option<Tensor<S>>, Option<Tensor<S>>)> {
    let (dx, dw) = match (w, x2) {
        (Some(w), Some(x2)) => match side_by_side(g2, w, x2) {
            Some(dims) => {
                let (dx, dw) = input_and_weight_grads(g2, w, x2, dims)?;
                (Some(dx), Some(dw))
            }
            None => (
                Some(linear_input_grad(g2, w)?),
                Some(linear_weight_grad(g2, x2)?),
            ),
        },
        (w, x2) => (
            w.map(|w| linear_input_grad(g2, w)).transpose()?,
            x2.map(|x2| linear_weight_grad(g2, x2)).transpose()?,
        ),
    };
    let db = bias.then(|| linear_bias_grad(g2)).transpose()?;
    Ok((dx, dw, db))
}

/// Multiply-adds per product below which the two jobs' hand-off (publishing them, a helper's
/// wake-up) costs about what running the second product on another core saves: about 5 us of
/// single-threaded GEMM. (Measured on the 2-core AVX2 EPYC under load, both gradients: 256 x 10 x
/// 128, 0.33M each, 15-26 us side by side against 26-35 us one after the other; 128 x 32 x 64,
/// 0.26M, 18-22 against 21-23; 32 x 10 x 128, 41k, no gain.)
const MIN_SIDE_BY_SIDE: usize = 1 << 18;
/// The most one product's depth may exceed the other's for a split-sized pair to run side by
/// side: the input gradient's depth is `out`, the weight gradient's `rows`, and a GEMM of small
/// depth mostly writes its output, so a lopsided pair leaves one core idle while the other
/// finishes, where bands of each product keep both busy. (Same machine, against both products cut
/// into bands: balanced pairs from 2M to 268M multiply-adds 2-24% faster side by side; 32 x 256 x
/// 784, depths 8x apart, from 2% slower to 33% faster; 1024 x 16 x 1024, 64x apart, 3-9% slower;
/// 2048 x 32 x 512 (64x) and 64 x 1024 x 1024 (16x) either way. bench/PERFORMANCE.md, 2026-12-02.)
const MAX_DEPTH_RATIO: usize = 8;

/// `(rows, out, in)` when `g2` `(rows, out)`, `w` `(out, in)` and `x2` `(rows, in)` fit together
/// and [`grads_side_by_side`] holds for them.
fn side_by_side<S: Scalar>(
    g2: &Tensor<S>,
    w: &Tensor<S>,
    x2: &Tensor<S>,
) -> Option<(usize, usize, usize)> {
    let (&[rows, out], &[w_out, inn], &[x_rows, x_in]) = (g2.dims(), w.dims(), x2.dims()) else {
        return None;
    };
    let fit = w_out == out && x_rows == rows && x_in == inn;
    (fit && grads_side_by_side(rows, out, inn)).then_some((rows, out, inn))
}

/// Whether [`linear_grads`], asked for both, runs the input and weight gradients of a layer with
/// `rows` rows, `out` outputs and `inn` inputs side by side on the current GEMM thread count:
/// with two threads or more and more than one row (one row takes the matrix-vector paths), for
/// every product too small to cut into bands (`worth_threads`) from `MIN_SIDE_BY_SIDE`
/// multiply-adds up, and on exactly two threads for larger ones whose depths are within
/// `MAX_DEPTH_RATIO` of each other (on more threads, bands give each product every core, where a
/// job has one). Side by side, each product is one GEMM on one thread: no band hand-offs, no
/// operand packed once per band. Public so that tests can tell which path a shape takes.
pub fn grads_side_by_side(rows: usize, out: usize, inn: usize) -> bool {
    let threads = num_threads();
    if threads < 2 || rows <= 1 {
        return false;
    }
    let work = rows.saturating_mul(out).saturating_mul(inn);
    if !worth_threads(work) {
        return work >= MIN_SIDE_BY_SIDE;
    }
    let (shallow, deep) = (rows.min(out), rows.max(out));
    threads == 2 && deep <= shallow.saturating_mul(MAX_DEPTH_RATIO)
}

/// `g w` and `g^T x` as two jobs, each the single-threaded GEMM that `batched_matmul` runs for
/// it (same operands, strides and depth), so each has the bits of the one-thread product.
fn input_and_weight_grads<S: Scalar>(
    g2: &Tensor<S>,
    w: &Tensor<S>,
    x2: &Tensor<S>,
    (rows, out, inn): (usize, usize, usize),
) -> Result<(Tensor<S>, Tensor<S>)> {
    let (dx_shape, dw_shape) = (Shape::new([rows, inn])?, Shape::new([out, inn])?);
    let (g, w, x) = (g2.data(), w.data(), x2.data());
    // Each GEMM below overwrites every element of its output (no accumulation), so the
    // (possibly recycled) buffers are left as they come.
    let mut dx = Tensor::from_writer(dx_shape, |_| {});
    let mut dw = Tensor::from_writer(dw_shape, |_| {});
    let (dx_out, dw_out) = (dx.data_mut(), dw.data_mut());
    let jobs: Vec<Box<dyn FnOnce() + Send + '_>> = vec![
        // dX (rows, in) = G (rows, out) W (out, in), both row-major as stored.
        Box::new(|| {
            S::gemm(
                rows,
                inn,
                out,
                dx_out,
                inn,
                g,
                out,
                1,
                w,
                inn,
                1,
                false,
                S::ONE,
                1,
            )
        }),
        // dW (out, in) = G^T (out, rows) X (rows, in): G read transposed in place.
        Box::new(|| {
            S::gemm(
                out,
                inn,
                rows,
                dw_out,
                inn,
                g,
                1,
                out,
                x,
                inn,
                1,
                false,
                S::ONE,
                1,
            )
        }),
    ];
    run_jobs_on_threads(2, jobs);
    Ok((dx, dw))
}

/// The bias gradient of linear: `g` `(rows, out)` summed over its rows, row by row in order
/// (as `sum_axes` over axis 0 adds them), without the general reduction's strided walk; long
/// ones split by columns over the GEMM threads (`kernels::column_sums`), same bits.
pub fn linear_bias_grad<S: Scalar>(g2: &Tensor<S>) -> Result<Tensor<S>> {
    column_sums(g2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::sum_axes;

    /// Values with both signs, exact zeros of both signs and magnitudes whose products round.
    fn awkward(n: usize, salt: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let k = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(salt) >> 24;
                match k % 5 {
                    0 => 0.0,
                    1 => -0.0,
                    _ => (k as f32 - 128.0) / 7.3,
                }
            })
            .collect()
    }

    fn bits(t: &Tensor<f32>) -> Vec<u32> {
        t.data().iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn batch_of_one_weight_grad_is_the_gemm_bit_for_bit() {
        let g = Tensor::new(&[1, 7], awkward(7, 1)).unwrap();
        let x = Tensor::new(&[1, 13], awkward(13, 2)).unwrap();
        let gemm = batched_matmul(&g, true, &x, false).unwrap();
        let outer = linear_weight_grad(&g, &x).unwrap();
        assert_eq!(outer.dims(), &[7, 13]);
        assert_eq!(bits(&outer), bits(&gemm));
    }

    #[test]
    fn bias_grad_is_the_row_sum_bit_for_bit() {
        let g = Tensor::new(&[9, 5], awkward(45, 3)).unwrap();
        let reference = sum_axes(&g, &[0], false).unwrap();
        assert_eq!(bits(&linear_bias_grad(&g).unwrap()), bits(&reference));
    }

    #[test]
    fn both_linear_orientations_give_the_same_values() {
        // (rows, in, out) on both sides of the orientation rule, with ragged register tiles;
        // small integers make every sum exact, so any order of the additions gives these values.
        for (rows, inn, out) in [(3, 9, 20), (17, 40, 33), (32, 70, 64), (2, 5, 3)] {
            let ints = |n: usize, salt: usize| -> Vec<f32> {
                (0..n).map(|i| ((i * 7 + salt) % 11) as f32 - 5.0).collect()
            };
            let x = Tensor::new(&[rows, inn], ints(rows * inn, 1)).unwrap();
            let w = Tensor::new(&[out, inn], ints(out * inn, 2)).unwrap();
            let b = Tensor::new(&[out], ints(out, 3)).unwrap();
            let plain = batched_matmul(&x, false, &w, true).unwrap();
            let expected: Vec<f32> = plain
                .data()
                .chunks(out)
                .flat_map(|r| r.iter().zip(b.data()).map(|(p, b)| p + b))
                .collect();
            let y = linear_rows(&x, &w, Some(&b)).unwrap();
            assert_eq!(y.dims(), &[rows, out]);
            assert_eq!(y.data(), &expected[..], "({rows}, {inn}, {out})");
            let t = linear_rows_transposed(&x, &w, &b).unwrap();
            assert_eq!(t.data(), &expected[..], "({rows}, {inn}, {out}) transposed");
        }
    }

    #[test]
    fn orientation_rule_packs_the_smaller_operand() {
        assert!(packs_less_transposed(32, 256));
        assert!(!packs_less_transposed(256, 256));
        assert!(!packs_less_transposed(32, 10));
        assert!(!packs_less_transposed(1, 256));
    }

    #[test]
    fn fused_bias_equals_product_plus_bias_on_small_integers() {
        // Small integers make every sum exact, so any order of the additions gives these values.
        let x = Tensor::new(&[3, 4], (0..12).map(|v| v as f32 - 5.0).collect()).unwrap();
        let w = Tensor::new(&[2, 4], vec![1.0, -2.0, 0.0, 3.0, 2.0, 1.0, -1.0, 0.5]).unwrap();
        let b = Tensor::new(&[2], vec![10.0, -20.0]).unwrap();
        let y = linear_rows(&x, &w, Some(&b)).unwrap();
        let plain = batched_matmul(&x, false, &w, true).unwrap();
        let expected: Vec<f32> = plain
            .data()
            .chunks(2)
            .flat_map(|r| [r[0] + 10.0, r[1] - 20.0])
            .collect();
        assert_eq!(y.data(), &expected[..]);
        let empty = Tensor::new(&[3, 0], vec![]).unwrap();
        let w0 = Tensor::new(&[2, 0], vec![]).unwrap();
        let only_bias = linear_rows(&empty, &w0, Some(&b)).unwrap();
        assert_eq!(only_bias.data(), &[10.0, -20.0, 10.0, -20.0, 10.0, -20.0]);
    }

    #[test]
    fn linear_rows_rejects_operands_that_are_not_matrices() {
        let x = Tensor::new(&[1, 4], vec![1.0f32; 4]).unwrap();
        let w = Tensor::new(&[2, 4], vec![1.0f32; 8]).unwrap();
        let v = Tensor::new(&[4], vec![1.0f32; 4]).unwrap();
        for (x, w) in [(&v, &w), (&x, &v)] {
            let err = linear_rows(x, w, None).unwrap_err().to_string();
            assert!(err.contains("linear") && err.contains("[4]"), "{err}");
        }
    }

    #[test]
    fn weight_grad_rejects_factors_that_do_not_pair_up() {
        let g = Tensor::new(&[3, 2], vec![1.0f32; 6]).unwrap();
        let x = Tensor::new(&[2, 4], vec![1.0f32; 8]).unwrap();
        let v = Tensor::new(&[6], vec![1.0f32; 6]).unwrap();
        // Three rows against two, and a factor that is not a matrix.
        for (g, x, says) in [(&g, &x, "[2, 4]"), (&v, &x, "[6]")] {
            let err = linear_weight_grad(g, x).unwrap_err().to_string();
            assert!(err.contains("linear") && err.contains(says), "{err}");
        }
    }
}
