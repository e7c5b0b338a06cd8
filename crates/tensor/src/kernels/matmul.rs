//! Matrix products on the `gemm` crate: PyTorch's `matmul` semantics (1-D promotion, batch
//! broadcasting) and a batched product with optional transposes, which the VJPs use so that no
//! transposed copy is ever materialised. Also the process-wide GEMM thread count.

use super::broadcast::{broadcast_shape, broadcast_strides};
use super::strided_walk;
use super::workers::for_each_band_mut;
use crate::{Error, Result, Scalar, Shape, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};

static THREADS: AtomicUsize = AtomicUsize::new(1);

/// Sets how many threads a large GEMM may use (1 = single-threaded; the default).
pub fn set_num_threads(n: usize) {
    THREADS.store(n.max(1), Ordering::Relaxed);
}

/// The GEMM thread count.
pub fn num_threads() -> usize {
    THREADS.load(Ordering::Relaxed)
}

/// How one product is spread over threads: the rows (or columns) of the output cut into `parts`
/// bands of `per_part` rows (columns; the last band may be narrower), each an independent
/// single-threaded GEMM claimed by whichever thread is free (a long side gets two bands per
/// thread, see `MIN_ROWS_PER_EXTRA_BAND`), or the whole product handed to gemm's own Rayon split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Split {
    Serial,
    Rows { rows_per_part: usize, parts: usize },
    Cols { cols_per_part: usize, parts: usize },
    Gemm(usize),
}

/// Below this many multiply-adds (about 50 us of single-threaded GEMM) the hand-off to a second
/// thread (a wake-up, tens of microseconds on a busy machine) eats most of what the split saves;
/// on the MLP it splits the 784-wide layer's products from batch 32 and everything but the
/// 10-wide layer at batch 256 (see bench/gemm_peers/README.md, `--mlp-shapes`).
const MIN_PARALLEL_WORK: usize = 128 * 128 * 128;
/// A band narrower than this (rows or columns) wastes the GEMM's register tile (8 wide in gemm's
/// f32 AVX2 and AVX-512 microkernels).
const MIN_ROWS_PER_PART: usize = 8;
/// The widest output band whose row-major lhs gemm 0.19 reads in place instead of packing: it
/// packs its (transposed) rhs only past `get_rhs_packing_threshold() * MR` rows, 128 * MR with
/// MR = 8 (f64, AVX2), 16 (f32, AVX2) and more with the AVX-512 kernels: the smallest of these,
/// so that the rule holds on every vector path. (The scalar fallback packs from 512; there this
/// only makes the cost estimate optimistic, never the result different.)
const UNPACKED_LHS_COLS: usize = 1024;
/// A side long enough to give every thread two bands of at least this many rows (columns) is cut
/// into two bands per thread: a thread that loses its core for a while (another process, a late
/// wake-up) then leaves its second band to a thread that is free, instead of holding up the whole
/// product. Each extra band packs the shared operand once more, which at this width costs about
/// 0.25% more instructions on a 1024^3 product (callgrind, bench/gemm_peers `square-probe`).
const MIN_ROWS_PER_EXTRA_BAND: usize = 256;

/// Runs `jobs` on up to [`num_threads`] threads; see [`run_jobs_on_threads`].
pub(crate) fn run_jobs<'a, R: Send>(jobs: Vec<Box<dyn FnOnce() -> R + Send + 'a>>) -> Vec<R> {
    run_jobs_on_threads(num_threads(), jobs)
}

/// Runs `jobs`, each on its own thread where one is free, on at most `threads` threads: the
/// caller runs jobs itself and up to `threads - 1` helper threads (kept polling for a while
/// between products, see `workers`) take the rest. Unlike `rayon::join` from outside a pool,
/// which queues both halves and parks the caller until a worker has been woken and has finished,
/// the caller never waits for a wake-up: a job no helper has claimed by the time the caller is
/// free runs on the caller.
pub(crate) fn run_jobs_on_threads<'a, R: Send>(
    threads: usize,
    jobs: Vec<Box<dyn FnOnce() -> R + Send + 'a>>,
) -> Vec<R> {
    let helpers = threads.min(jobs.len()).saturating_sub(1);
    super::workers::run_jobs_on(helpers, jobs)
}

/// Whether `work` multiply-adds are enough to hand part of them to another thread.
pub(crate) fn worth_threads(work: usize) -> bool {
    work >= MIN_PARALLEL_WORK
}

/// How many of a batch's small products, each `work` multiply-adds, a thread should get at
/// least when whole products go to the threads (each product on one thread, so the bits do not
/// depend on the thread count).
pub fn min_products_per_thread(work: usize) -> usize {
    (MIN_PARALLEL_WORK / 2).div_ceil(work.max(1))
}

/// The split for an m x k by k x n product on `threads` threads; `lhs_row_major` says whether
/// lhs is stored with column stride 1 (not a transposed view).
///
/// A band of rows (columns) is computed with exactly the additions, in the same order, as the same
/// rows (columns) of the whole product, provided gemm 0.19 takes the same kernel path for both:
/// it picks a different path (and a different depth blocking, hence different rounding) for
/// k <= 2, for m or n <= 1, for m * n <= 256 and for m, n both <= 64. Bands are only cut where
/// every band stays on the whole product's path, so the result is bit-identical for every thread
/// count.
pub(crate) fn split_for(
    m: usize,
    n: usize,
    k: usize,
    threads: usize,
    lhs_row_major: bool,
) -> Split {
    let work = m.saturating_mul(n).saturating_mul(k);
    if threads <= 1 || work < MIN_PARALLEL_WORK {
        return Split::Serial;
    }
    // What a cut costs on top of the product, in packed elements: gemm transposes a row-major
    // product, so rhs (k x n) is the operand it packs per block of output rows, and each row
    // band packs all of it again. A column band packs lhs (m x k) again when lhs is a transposed
    // view; a row-major lhs gemm reads in place for bands of up to `UNPACKED_LHS_COLS` columns,
    // so such column bands cost no extra instructions, only one more read of lhs each. Ties go
    // to rows. Take the cheaper cut that keeps gemm's kernel path. (Measured with callgrind,
    // bench/gemm_peers split-probe / square-probe, instructions over the whole product: the
    // MLP's x W^T at batch 256, 256 x 256 x 784, +4.3% as row halves, +0.02% as column halves;
    // 1024^3 +0.2% and +0.00%.)
    let cols_packing_free = |per_part: usize| lhs_row_major && per_part <= UNPACKED_LHS_COLS;
    let rows =
        bands(m, k, band_count(m, threads), |rows| (rows, n)).map(|(rows_per_part, parts)| {
            Split::Rows {
                rows_per_part,
                parts,
            }
        });
    let cols =
        bands(n, k, band_count(n, threads), |cols| (m, cols)).map(|(cols_per_part, parts)| {
            Split::Cols {
                cols_per_part,
                parts,
            }
        });
    let row_extra = k.saturating_mul(n);
    let col_extra = match cols {
        Some(Split::Cols { cols_per_part, .. }) if cols_packing_free(cols_per_part) => 0,
        _ => m.saturating_mul(k),
    };
    let preferred = if row_extra <= col_extra {
        rows.or(cols)
    } else {
        cols.or(rows)
    };
    // Fewer than 2 * 8 rows and columns (or a band off gemm's path): gemm's own split, which
    // divides its cache blocks among threads without changing any element's additions.
    preferred.unwrap_or(Split::Gemm(threads))
}

/// How many bands a side of length `len` is cut into on `threads` threads (before `bands` caps
/// it by the side's length): one per thread, or two where each still has
/// `MIN_ROWS_PER_EXTRA_BAND` rows.
fn band_count(len: usize, threads: usize) -> usize {
    let doubled = threads.saturating_mul(2);
    if len / doubled >= MIN_ROWS_PER_EXTRA_BAND {
        doubled
    } else {
        threads
    }
}

/// Row bands `(rows_per_part, parts)` for an m x n x k product on `threads` threads, whichever cut
/// `split_for` would prefer: for callers whose rows carry their own work (the convolution's
/// weight gradient builds its column matrix once per band, not once per product).
pub(crate) fn row_bands(m: usize, n: usize, k: usize, threads: usize) -> Option<(usize, usize)> {
    let work = m.saturating_mul(n).saturating_mul(k);
    if threads <= 1 || work < MIN_PARALLEL_WORK {
        return None;
    }
    bands(m, k, threads, |rows| (rows, n))
}

/// Up to `wanted` bands of a side of length `len`: `(per_part, parts)` with at least two parts,
/// or `None` when the side is too short or a band would leave the whole product's kernel path
/// (`dims` maps a band width to the band's (rows, cols)).
fn bands(
    len: usize,
    k: usize,
    wanted: usize,
    dims: impl Fn(usize) -> (usize, usize),
) -> Option<(usize, usize)> {
    let parts = wanted.min(len / MIN_ROWS_PER_PART);
    if parts < 2 {
        return None;
    }
    let even = len.div_ceil(parts);
    // Whole register tiles per band, unless rounding would unbalance small bands.
    let per_part = if even >= 4 * MIN_ROWS_PER_PART {
        even.next_multiple_of(MIN_ROWS_PER_PART)
    } else {
        even
    };
    let parts = len.div_ceil(per_part);
    let last = len - (parts - 1) * per_part;
    let whole = dims(len);
    let same = |w: usize| {
        let (r, c) = dims(w);
        same_gemm_path(whole.0, whole.1, k, r, c)
    };
    (parts >= 2 && same(per_part) && same(last)).then_some((per_part, parts))
}

/// Whether gemm 0.19 multiplies an r x c band of an m x n x k product on the same kernel path as
/// the whole product (see `gemm_common::gemm::gemm_basic_generic`). Each condition is monotone in
/// r and c, so bands between the narrowest and the whole also agree.
fn same_gemm_path(m: usize, n: usize, k: usize, r: usize, c: usize) -> bool {
    let path = |rows: usize, cols: usize| {
        (
            k <= 2,
            rows <= 1 || cols <= 1,
            rows * cols <= 16 * 16,
            rows <= 64 && cols <= 64,
        )
    };
    path(r, c) == path(m, n)
}

/// `a @ b` with PyTorch's rules: 1-D operands are promoted (and the added axis removed), batch
/// dimensions broadcast.
pub fn matmul<S: Scalar>(a: &Tensor<S>, b: &Tensor<S>) -> Result<Tensor<S>> {
    if a.rank() == 0 || b.rank() == 0 {
        return Err(Error::invalid(
            "matmul",
            format!(
                "both operands need at least one dimension, got {} and {}",
                a.shape(),
                b.shape()
            ),
        ));
    }
    let a2 = if a.rank() == 1 {
        a.reshape(&[1, a.dims()[0]])?
    } else {
        a.clone()
    };
    let b2 = if b.rank() == 1 {
        b.reshape(&[b.dims()[0], 1])?
    } else {
        b.clone()
    };
    let out = batched_matmul(&a2, false, &b2, false).map_err(|e| match e {
        Error::ShapeMismatch { .. } | Error::Broadcast { .. } => Error::Broadcast {
            op: "matmul",
            lhs: Box::new(a.shape().clone()),
            rhs: Box::new(b.shape().clone()),
        },
        other => other,
    })?;
    // Drop the axes that promotion added: b's column axis (last), then a's row axis (second to
    // last before b's removal, so last after it when b was 1-D).
    let mut dims = out.dims().to_vec();
    let r = dims.len();
    match (a.rank() == 1, b.rank() == 1) {
        (true, true) => dims.truncate(r - 2),
        (true, false) => {
            dims.remove(r - 2);
        }
        (false, true) => {
            dims.pop();
        }
        (false, false) => {}
    }
    out.reshape(&dims)
}

/// The products of a batched `op(a) @ op(b)` (operands of rank >= 2, `op` transposing the last
/// two axes when its flag is set, batch dimensions broadcast): their sizes, the output's shape,
/// each operand's strides as one matrix, and where each product's operands start.
pub(crate) struct BatchedProducts {
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) out_shape: Shape,
    /// Elements of one matrix of `a` and of `b` as stored.
    pub(crate) a_mat: usize,
    pub(crate) b_mat: usize,
    /// Row and column strides of `op(a)` and `op(b)` within their matrices.
    pub(crate) a_strides: (usize, usize),
    pub(crate) b_strides: (usize, usize),
    batch: Shape,
    a_batch_strides: Vec<usize>,
    b_batch_strides: Vec<usize>,
}

impl BatchedProducts {
    pub(crate) fn new<S: Scalar>(
        a: &Tensor<S>,
        trans_a: bool,
        b: &Tensor<S>,
        trans_b: bool,
    ) -> Result<BatchedProducts> {
        if a.rank() < 2 || b.rank() < 2 {
            return Err(Error::invalid(
                "matmul",
                format!(
                    "batched operands need rank >= 2, got {} and {}",
                    a.shape(),
                    b.shape()
                ),
            ));
        }
        let (ra, rb) = (a.rank(), b.rank());
        let (a_rows, a_cols) = (a.dims()[ra - 2], a.dims()[ra - 1]);
        let (b_rows, b_cols) = (b.dims()[rb - 2], b.dims()[rb - 1]);
        let (m, k) = if trans_a {
            (a_cols, a_rows)
        } else {
            (a_rows, a_cols)
        };
        let (k2, n) = if trans_b {
            (b_cols, b_rows)
        } else {
            (b_rows, b_cols)
        };
        if k != k2 {
            return Err(Error::Broadcast {
                op: "matmul",
                lhs: Box::new(a.shape().clone()),
                rhs: Box::new(b.shape().clone()),
            });
        }
        let a_batch = Shape::new(&a.dims()[..ra - 2])?;
        let b_batch = Shape::new(&b.dims()[..rb - 2])?;
        let batch =
            broadcast_shape("matmul", &a_batch, &b_batch).map_err(|_| Error::Broadcast {
                op: "matmul",
                lhs: Box::new(a.shape().clone()),
                rhs: Box::new(b.shape().clone()),
            })?;
        let mut out_dims = batch.dims().to_vec();
        out_dims.extend([m, n]);
        let out_shape = Shape::new(out_dims)?;
        let a_mat = a_rows * a_cols;
        let b_mat = b_rows * b_cols;
        let scaled = |strides: Vec<usize>, by: usize| strides.iter().map(|s| s * by).collect();
        let a_batch_strides = scaled(broadcast_strides(&a_batch, &batch), a_mat);
        let b_batch_strides = scaled(broadcast_strides(&b_batch, &batch), b_mat);
        // Row-major a is (rs = cols, cs = 1); its transpose swaps the two.
        let a_strides = if trans_a { (1, a_cols) } else { (a_cols, 1) };
        let b_strides = if trans_b { (1, b_cols) } else { (b_cols, 1) };
        Ok(BatchedProducts {
            m,
            n,
            k,
            out_shape,
            a_mat,
            b_mat,
            a_strides,
            b_strides,
            batch,
            a_batch_strides,
            b_batch_strides,
        })
    }

    /// How many products.
    pub(crate) fn count(&self) -> usize {
        self.batch.numel()
    }

    /// `f(product, (offset in a, offset in b))` for every product, in order.
    pub(crate) fn for_each(&self, mut f: impl FnMut(usize, (usize, usize))) {
        let strides = [&self.a_batch_strides[..], &self.b_batch_strides[..]];
        strided_walk(self.batch.dims(), strides, |lin, [ia, ib]| f(lin, (ia, ib)))
    }

    /// Where each product's operands start, in order.
    pub(crate) fn offsets(&self) -> Vec<(usize, usize)> {
        let mut offsets = Vec::with_capacity(self.count());
        self.for_each(|_, at| offsets.push(at));
        offsets
    }
}

/// Batched `op(a) @ op(b)` for operands of rank >= 2, where `op` transposes the last two axes when
/// its flag is set. Batch dimensions broadcast.
pub fn batched_matmul<S: Scalar>(
    a: &Tensor<S>,
    trans_a: bool,
    b: &Tensor<S>,
    trans_b: bool,
) -> Result<Tensor<S>> {
    let plan = BatchedProducts::new(a, trans_a, b, trans_b)?;
    if plan.out_shape.numel() == 0 {
        return Ok(Tensor::zeros(&plan.out_shape));
    }
    let (m, n, k) = (plan.m, plan.n, plan.k);
    let ((a_rs, a_cs), (b_rs, b_cs)) = (plan.a_strides, plan.b_strides);
    let (a_mat, b_mat) = (plan.a_mat, plan.b_mat);
    let (ad, bd) = (a.data(), b.data());
    let mn = m * n;
    // One product of the batch, from the operands at offsets `ia` and `ib`, into `out`. Without
    // accumulation the GEMM overwrites every element (zeros when k = 0) and every product is
    // visited, so the output's (possibly recycled) buffer needs no zeroing first.
    let product = |out: &mut [S], (ia, ib): (usize, usize), threads: usize| {
        S::gemm(
            m,
            n,
            k,
            out,
            n,
            &ad[ia..ia + a_mat],
            a_rs,
            a_cs,
            &bd[ib..ib + b_mat],
            b_rs,
            b_cs,
            false,
            S::ONE,
            threads,
        )
    };
    let threads = num_threads();
    let product_work = m.saturating_mul(n).saturating_mul(k);
    // Many products each too small to split (attention's per-head products): whole products
    // go to the threads instead, each on one thread as it would be alone, so the bits do not
    // depend on the thread count.
    let products = plan.count();
    if threads > 1
        && !worth_threads(product_work)
        && worth_threads(product_work.saturating_mul(products))
    {
        let offsets = plan.offsets();
        let min_per_thread = min_products_per_thread(product_work);
        return Ok(Tensor::from_writer(plan.out_shape.clone(), |out| {
            for_each_band_mut(out, mn, min_per_thread, |start, band| {
                for (i, out) in band.chunks_mut(mn).enumerate() {
                    product(out, offsets[start / mn + i], 1);
                }
            })
        }));
    }
    Ok(Tensor::from_writer(plan.out_shape.clone(), |out| {
        plan.for_each(|lin, at| product(&mut out[lin * mn..(lin + 1) * mn], at, threads))
    }))
}

/// The outer product `out[i * x.len() + j] = g[i] * x[j]` (`out` is `g.len() x x.len()`,
/// row-major): the weight gradient of a one-row linear layer. Each element is the single rounded
/// product a k = 1 GEMM stores, so the bits are the GEMM's; compiled for the CPU's widest vector
/// instructions (AVX2 or AVX-512, picked at run time), since at batch 1 this write of the whole
/// weight-sized gradient is most of the backward pass.
pub fn outer_product<S: Scalar>(g: &[S], x: &[S], out: &mut [S]) {
    struct Outer<'a, S> {
        g: &'a [S],
        x: &'a [S],
        out: &'a mut [S],
    }
    impl<S: Scalar> pulp::WithSimd for Outer<'_, S> {
        type Output = ();
        // Inlined into pulp's `#[target_feature]` function, which is what lets the loop use it.
        #[inline(always)]
        fn with_simd<V: pulp::Simd>(self, _simd: V) {
            let Outer { g, x, out } = self;
            if x.is_empty() {
                return;
            }
            for (row, &gi) in out.chunks_exact_mut(x.len()).zip(g) {
                for (o, &xj) in row.iter_mut().zip(x) {
                    *o = gi * xj;
                }
            }
        }
    }
    assert_eq!(
        out.len(),
        g.len() * x.len(),
        "outer_product: out has the wrong length"
    );
    pulp::Arch::new().dispatch(Outer { g, x, out });
}

/// `out[o] = bias[o] + dot(w row o, x)` for the row-major `(out.len(), x.len())` matrix `w`
/// (`bias[o] +` left out without a bias): the forward pass of a one-row linear layer. gemm runs
/// this shape on a dot-product kernel whose two partial sums each wait for the previous
/// multiply-add, so it reads the weight at a fraction of the memory speed; here four rows go
/// at once, each with `lanes` independent partial sums (16 f32 or 8 f64: one AVX-512 register,
/// two AVX2 ones), compiled for the CPU's widest vector instructions.
///
/// The order of the additions is fixed by this code, not by the vector width, so every CPU
/// gives the same bits: partial sum `l` adds `w[j] * x[j]` for `j = l, l + lanes, ...` over
/// the whole `lanes`-wide chunks, in order, starting from zero; the partial sums are folded in
/// halves (`s[l] + s[l + lanes / 2]`, then a quarter, ...); then the remaining `x.len() % lanes`
/// products are added in order; then the result is added to the bias.
pub fn matvec_rows<S: Scalar>(w: &[S], x: &[S], bias: Option<&[S]>, out: &mut [S]) {
    assert_eq!(
        w.len(),
        out.len() * x.len(),
        "matvec_rows: w has the wrong length"
    );
    assert!(
        bias.is_none_or(|b| b.len() == out.len()),
        "matvec_rows: bias has the wrong length"
    );
    if std::mem::size_of::<S>() <= 4 {
        pulp::Arch::new().dispatch(MatVec::<S, 16> { w, x, bias, out });
    } else {
        pulp::Arch::new().dispatch(MatVec::<S, 8> { w, x, bias, out });
    }
}

struct MatVec<'a, S, const LANES: usize> {
    w: &'a [S],
    x: &'a [S],
    bias: Option<&'a [S]>,
    out: &'a mut [S],
}

/// Rows of `w` read together: one stream of `x` serves four, and their `4 * LANES` partial
/// sums are independent chains, enough to hide the addition latency.
const MATVEC_ROWS: usize = 4;

impl<S: Scalar, const LANES: usize> pulp::WithSimd for MatVec<'_, S, LANES> {
    type Output = ();
    // Inlined into pulp's `#[target_feature]` function, which is what lets the loops use it.
    #[inline(always)]
    fn with_simd<V: pulp::Simd>(self, _simd: V) {
        let MatVec { w, x, bias, out } = self;
        let k = x.len();
        let whole = k / LANES * LANES;
        #[inline(always)]
        fn finish<S: Scalar, const LANES: usize>(
            lanes: [S; LANES],
            row_tail: &[S],
            x_tail: &[S],
            bias: Option<S>,
        ) -> S {
            let mut sum = fold_lanes(lanes);
            for (&a, &b) in row_tail.iter().zip(x_tail) {
                sum += a * b;
            }
            match bias {
                Some(b) => b + sum,
                None => sum,
            }
        }
        let finish = |o: usize, lanes: [S; LANES]| {
            finish(
                lanes,
                &w[o * k + whole..(o + 1) * k],
                &x[whole..],
                bias.map(|b| b[o]),
            )
        };
        let mut o = 0;
        while o + MATVEC_ROWS <= out.len() {
            let row = |r: usize| w[(o + r) * k..(o + r) * k + whole].chunks_exact(LANES);
            let mut acc = [[S::ZERO; LANES]; MATVEC_ROWS];
            let chunks = x[..whole].chunks_exact(LANES).zip(row(0)).zip(row(1));
            for (((xc, w0), w1), (w2, w3)) in chunks.zip(row(2).zip(row(3))) {
                for l in 0..LANES {
                    acc[0][l] += w0[l] * xc[l];
                    acc[1][l] += w1[l] * xc[l];
                    acc[2][l] += w2[l] * xc[l];
                    acc[3][l] += w3[l] * xc[l];
                }
            }
            for (r, acc) in acc.into_iter().enumerate() {
                out[o + r] = finish(o + r, acc);
            }
            o += MATVEC_ROWS;
        }
        while o < out.len() {
            let row = &w[o * k..o * k + whole];
            let mut acc = [S::ZERO; LANES];
            for (wc, xc) in row.chunks_exact(LANES).zip(x[..whole].chunks_exact(LANES)) {
                for l in 0..LANES {
                    acc[l] += wc[l] * xc[l];
                }
            }
            out[o] = finish(o, acc);
            o += 1;
        }
    }
}

/// The partial sums of [`matvec_rows`] folded in halves: `s[l] += s[l + n / 2]`, and so on.
#[inline(always)]
fn fold_lanes<S: Scalar, const LANES: usize>(mut s: [S; LANES]) -> S {
    let mut half = LANES / 2;
    while half > 0 {
        for l in 0..half {
            s[l] += s[l + half];
        }
        half /= 2;
    }
    s[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dims: &[usize], v: &[f64]) -> Tensor<f64> {
        Tensor::new(dims, v.to_vec()).unwrap()
    }

    #[test]
    fn long_sides_get_two_bands_per_thread_and_short_ones_one() {
        use Split::{Cols, Rows, Serial};
        let rows = |rows_per_part, parts| Rows {
            rows_per_part,
            parts,
        };
        let cols = |cols_per_part, parts| Cols {
            cols_per_part,
            parts,
        };
        // (m, n, k, threads, lhs row-major) -> the cut, each with why.
        let cases = [
            // Row-major lhs: column bands repack nothing; 4 bands of 256 on 2 threads.
            ((1024, 1024, 1024, 2, true), cols(256, 4)),
            // Transposed lhs: both cuts repack 1024^2 elements and rows win the tie.
            ((1024, 1024, 1024, 2, false), rows(256, 4)),
            // 512 rows make only 128-row bands at two per thread: one band per thread.
            ((512, 512, 512, 2, false), rows(256, 2)),
            // Column bands when lhs is the smaller repack; 4 threads need 2,048 columns to double.
            ((64, 2048, 512, 4, false), cols(256, 8)),
            ((64, 2040, 512, 4, false), cols(512, 4)),
            // One thread, or too little work: no split at all.
            ((1024, 1024, 1024, 1, true), Serial),
            ((100, 100, 100, 2, true), Serial),
            // The MLP's x W^T at batch 256 (row-major x): column halves, where rows would repack W.
            ((256, 256, 784, 2, true), cols(128, 2)),
            // Bands wider than gemm reads in place: each cut repacks 8192 x 16, rows win the tie.
            ((8192, 8192, 16, 2, true), rows(2048, 4)),
        ];
        for ((m, n, k, threads, lhs_row_major), want) in cases {
            assert_eq!(
                split_for(m, n, k, threads, lhs_row_major),
                want,
                "split_for({m}, {n}, {k}, {threads}, {lhs_row_major})"
            );
        }
    }

    #[test]
    fn one_dimensional_operands_follow_torch_matmul() {
        let v = t(&[2], &[1.0, 2.0]);
        let m = t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(matmul(&v, &v).unwrap().dims(), &[] as &[usize]);
        assert_eq!(matmul(&v, &v).unwrap().data(), &[5.0]);
        let vm = matmul(&v, &m).unwrap();
        assert_eq!((vm.dims(), vm.data()), (&[2usize][..], &[7.0, 10.0][..]));
        let mv = matmul(&m, &v).unwrap();
        assert_eq!((mv.dims(), mv.data()), (&[2usize][..], &[5.0, 11.0][..]));
        let batched = t(&[3, 2, 4], &[1.0; 24]);
        let vb = matmul(&t(&[2], &[1.0, 1.0]), &batched).unwrap();
        assert_eq!(vb.dims(), &[3, 4]);
        assert!(vb.data().iter().all(|&x| x == 2.0));
    }

    /// [`matvec_rows`]'s documented order of additions, one row at a time, in plain scalar code.
    fn matvec_reference<S: Scalar>(
        rows: usize,
        w: &[S],
        x: &[S],
        bias: Option<&[S]>,
        lanes: usize,
    ) -> Vec<S> {
        let k = x.len();
        let whole = k / lanes * lanes;
        (0..rows)
            .map(|o| {
                let row = &w[o * k..(o + 1) * k];
                let mut s = vec![S::ZERO; lanes];
                for j in 0..whole {
                    s[j % lanes] += row[j] * x[j];
                }
                let mut half = lanes / 2;
                while half > 0 {
                    for l in 0..half {
                        let upper = s[l + half];
                        s[l] += upper;
                    }
                    half /= 2;
                }
                let mut sum = s[0];
                for j in whole..k {
                    sum += row[j] * x[j];
                }
                bias.map_or(sum, |b| b[o] + sum)
            })
            .collect()
    }

    #[test]
    fn matvec_rows_adds_in_its_documented_order_on_every_shape() {
        // Row counts around the four-row groups, lengths around the 16 (8) lanes, with and
        // without a bias; rounding values, so a different order of additions shows in the bits.
        let value =
            |i: usize, salt: usize| ((i * 2_654_435_761 + salt) % 1999) as f64 / 97.0 - 10.3;
        for (rows, k) in [
            (1, 1),
            (3, 15),
            (4, 16),
            (5, 17),
            (9, 40),
            (13, 784),
            (2, 0),
        ] {
            let w64: Vec<f64> = (0..rows * k).map(|i| value(i, 1)).collect();
            let x64: Vec<f64> = (0..k).map(|i| value(i, 2)).collect();
            let b64: Vec<f64> = (0..rows).map(|i| value(i, 3)).collect();
            let (w32, x32, b32): (Vec<f32>, Vec<f32>, Vec<f32>) = (
                w64.iter().map(|&v| v as f32).collect(),
                x64.iter().map(|&v| v as f32).collect(),
                b64.iter().map(|&v| v as f32).collect(),
            );
            for bias in [true, false] {
                let mut out = vec![f32::NAN; rows];
                matvec_rows(&w32, &x32, bias.then_some(&b32[..]), &mut out);
                let want = matvec_reference(rows, &w32, &x32, bias.then_some(&b32[..]), 16);
                let bits = |v: &[f32]| v.iter().map(|e| e.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&out), bits(&want), "f32 ({rows}, {k}) bias {bias}");
                let mut out = vec![f64::NAN; rows];
                matvec_rows(&w64, &x64, bias.then_some(&b64[..]), &mut out);
                let want = matvec_reference(rows, &w64, &x64, bias.then_some(&b64[..]), 8);
                let bits = |v: &[f64]| v.iter().map(|e| e.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&out), bits(&want), "f64 ({rows}, {k}) bias {bias}");
            }
        }
    }

    #[test]
    fn matvec_rows_is_the_product_on_small_integers() {
        // Every sum exact, so gemm's order and ours must give the same values.
        let (rows, k) = (7, 37);
        let ints = |n: usize, salt: usize| -> Vec<f32> {
            (0..n).map(|i| ((i * 7 + salt) % 11) as f32 - 5.0).collect()
        };
        let w = Tensor::new(&[rows, k], ints(rows * k, 1)).unwrap();
        let x = Tensor::new(&[1, k], ints(k, 2)).unwrap();
        let gemm = batched_matmul(&x, false, &w, true).unwrap();
        let mut out = vec![f32::NAN; rows];
        matvec_rows(w.data(), x.data(), None, &mut out);
        assert_eq!(&out[..], gemm.data());
    }

    #[test]
    fn outer_product_is_the_k1_gemm_bit_for_bit() {
        // Lengths around the 8- and 16-lane vector bodies and their scalar tails; values with
        // both signs, zeros of both signs, a subnormal product and an overflow to infinity.
        let value = |i: usize, salt: usize| match (i * 2_654_435_761 + salt) % 11 {
            0 => 0.0f32,
            1 => -0.0,
            2 => 1e-30,
            3 => 3e30,
            k => (k as f32 - 6.5) / 3.7,
        };
        for (rows, cols) in [
            (1, 1),
            (3, 7),
            (5, 16),
            (9, 31),
            (17, 33),
            (2, 64),
            (40, 129),
        ] {
            let g: Vec<f32> = (0..rows).map(|i| value(i, 1)).collect();
            let x: Vec<f32> = (0..cols).map(|i| value(i, 5)).collect();
            let mut out = vec![f32::NAN; rows * cols];
            outer_product(&g, &x, &mut out);
            let gt = Tensor::new(&[1, rows], g.clone()).unwrap();
            let xt = Tensor::new(&[1, cols], x.clone()).unwrap();
            let gemm = batched_matmul(&gt, true, &xt, false).unwrap();
            let bits = |v: &[f32]| v.iter().map(|e| e.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out), bits(gemm.data()), "({rows}, {cols}) vs gemm");
            let plain: Vec<f32> = g
                .iter()
                .flat_map(|&a| x.iter().map(move |&b| a * b))
                .collect();
            assert_eq!(bits(&out), bits(&plain), "({rows}, {cols}) vs plain");
        }
    }
}
