//! The `Scalar` trait: the element types tapegrad computes in (f32 and f64), with the math functions
//! the kernels need and the hook into the GEMM library, so that kernels are written once, generically.

use std::fmt::{Debug, Display};
use std::iter::Sum;
use std::ops::{Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Sub, SubAssign};

/// Element type tag, used by files and checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
}

impl DType {
    /// The lower-case name used in files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A floating-point element type.
pub trait Scalar:
    Copy
    + Debug
    + Display
    + Default
    + PartialEq
    + PartialOrd
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
    + Sum
{
    /// The tag of this type.
    const DTYPE: DType;
    /// Additive identity.
    const ZERO: Self;
    /// Multiplicative identity.
    const ONE: Self;
    /// Positive infinity.
    const INFINITY: Self;
    /// Negative infinity.
    const NEG_INFINITY: Self;

    /// Rounds an f64 to this type.
    fn from_f64(v: f64) -> Self;
    /// Widens to f64 (exact).
    fn to_f64(self) -> f64;
    /// Converts a count (exact below 2^24 for f32).
    fn from_usize(v: usize) -> Self {
        Self::from_f64(v as f64)
    }

    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn ln_1p(self) -> Self;
    fn sqrt(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn tanh(self) -> Self;
    fn erf(self) -> Self;
    /// 1 - erf(x), without the cancellation of computing it so for large x.
    fn erfc(self) -> Self;
    fn abs(self) -> Self;
    fn powf(self, e: Self) -> Self;
    fn is_finite(self) -> bool;
    fn is_nan(self) -> bool;
    /// Maximum that propagates NaN (as PyTorch's `maximum`).
    fn max_nan(self, other: Self) -> Self {
        if self.is_nan() || other.is_nan() {
            if self.is_nan() {
                self
            } else {
                other
            }
        } else if other > self {
            other
        } else {
            self
        }
    }
    /// Minimum that propagates NaN (as PyTorch's `minimum`).
    fn min_nan(self, other: Self) -> Self {
        if self.is_nan() || other.is_nan() {
            if self.is_nan() {
                self
            } else {
                other
            }
        } else if other < self {
            other
        } else {
            self
        }
    }

    /// `dst := (accumulate ? dst : 0) + scale * (lhs * rhs)` for an m x k by k x n product, each
    /// operand given by its row stride and column stride in elements.
    ///
    /// With `scale` one the bits are those of the plain product (added to `dst`). Otherwise gemm
    /// folds the scale into its own roundings (on its blocked path each depth block's sum is
    /// scaled and added in one fused multiply-add, `dst + scale * block`; its small-depth and
    /// vector paths scale the rhs elements first), so `scale` costs no pass of its own, but the
    /// result is not `dst + fl(scale * fl(lhs * rhs))` bit for bit. Plain SGD uses it to add
    /// `-lr` times a linear layer's weight gradient straight into the weight.
    ///
    /// Callers guarantee every index `r * rs + c * cs` addressed by the shapes lies inside its slice;
    /// [`crate::kernels::matmul::matmul`] checks this before calling. `threads` caps the threads the
    /// product may use (1 = this thread only, as a caller that already runs in parallel wants);
    /// the result is bit-identical for every thread count.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        m: usize,
        n: usize,
        k: usize,
        dst: &mut [Self],
        dst_rs: usize,
        lhs: &[Self],
        lhs_rs: usize,
        lhs_cs: usize,
        rhs: &[Self],
        rhs_rs: usize,
        rhs_cs: usize,
        accumulate: bool,
        scale: Self,
        threads: usize,
    );
}

/// The output of a product split into column bands, shared by the bands' jobs, each of which
/// writes only its own columns (see the `Split::Cols` arm of `Scalar::gemm`).
struct BandPtr<T>(*mut T);

// SAFETY: the pointer is only dereferenced by band jobs that write disjoint elements while the
// `&mut` slice it came from stays borrowed (see its use); `T` itself is `Send`.
unsafe impl<T: Send> Sync for BandPtr<T> {}

/// `dst := (accumulate ? dst : 0) + scale * (lhs * rhs)` through the `gemm` crate, for an m x n x k product
/// whose operands are given as (pointer, row stride, column stride) and whose `dst` rows are
/// contiguous (column stride 1). The one place tapegrad calls into `gemm`.
///
/// # Safety
/// Every element the product addresses through these pointers and strides lies inside its
/// allocation; the m x n elements of `dst` are distinct, alias neither operand, and no other
/// thread reads or writes them during the call.
unsafe fn row_major_gemm<S: Scalar>(
    (m, n, k): (usize, usize, usize),
    (dst, dst_rs): (*mut S, usize),
    (accumulate, scale): (bool, S),
    (lhs, lhs_rs, lhs_cs): (*const S, usize, usize),
    (rhs, rhs_rs, rhs_cs): (*const S, usize, usize),
    parallelism: gemm::Parallelism,
) {
    // SAFETY: the caller's contract is exactly gemm's: in-bounds strided access, and a `dst`
    // no one else touches meanwhile.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_rs as isize,
            accumulate,
            lhs,
            lhs_cs as isize,
            lhs_rs as isize,
            rhs,
            rhs_cs as isize,
            rhs_rs as isize,
            // gemm's `alpha` scales `dst` (read only when accumulating), `beta` the product.
            S::ONE,
            scale,
            false,
            false,
            false,
            parallelism,
        )
    }
}

macro_rules! impl_scalar {
    ($t:ty, $dtype:expr, $erf:path, $erfc:path) => {
        impl Scalar for $t {
            const DTYPE: DType = $dtype;
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const INFINITY: Self = <$t>::INFINITY;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;

            #[inline]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline]
            fn ln_1p(self) -> Self {
                <$t>::ln_1p(self)
            }
            #[inline]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline]
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            #[inline]
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            #[inline]
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            #[inline]
            fn erf(self) -> Self {
                $erf(self)
            }
            #[inline]
            fn erfc(self) -> Self {
                $erfc(self)
            }
            #[inline]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline]
            fn powf(self, e: Self) -> Self {
                <$t>::powf(self, e)
            }
            #[inline]
            fn is_finite(self) -> bool {
                <$t>::is_finite(self)
            }
            #[inline]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }

            fn gemm(
                m: usize,
                n: usize,
                k: usize,
                dst: &mut [Self],
                dst_rs: usize,
                lhs: &[Self],
                lhs_rs: usize,
                lhs_cs: usize,
                rhs: &[Self],
                rhs_rs: usize,
                rhs_cs: usize,
                accumulate: bool,
                scale: Self,
                threads: usize,
            ) {
                if m == 0 || n == 0 {
                    return;
                }
                if k == 0 {
                    if !accumulate {
                        for r in 0..m {
                            dst[r * dst_rs..r * dst_rs + n].fill(0.0);
                        }
                    }
                    return;
                }
                // The bounds below are what makes the raw-pointer call sound; they are cheap next to
                // the product itself and turn a caller's stride mistake into a panic, not UB. The
                // arithmetic is checked: a wrapped product would let an out-of-bounds stride pass.
                let last = |rows: usize, rs: usize, cols: usize, cs: usize| {
                    (rows - 1)
                        .checked_mul(rs)
                        .and_then(|r| (cols - 1).checked_mul(cs).and_then(|c| r.checked_add(c)))
                };
                assert!(
                    last(m, dst_rs, n, 1).is_some_and(|i| i < dst.len()),
                    "gemm: dst too small"
                );
                // Overlapping rows would have two threads write one element.
                assert!(m == 1 || dst_rs >= n, "gemm: dst rows overlap");
                assert!(
                    last(m, lhs_rs, k, lhs_cs).is_some_and(|i| i < lhs.len()),
                    "gemm: lhs too small"
                );
                assert!(
                    last(k, rhs_rs, n, rhs_cs).is_some_and(|i| i < rhs.len()),
                    "gemm: rhs too small"
                );
                use crate::kernels::matmul::{split_for, Split};
                let parallelism = match split_for(m, n, k, threads, lhs_cs == 1) {
                    Split::Serial => gemm::Parallelism::None,
                    Split::Gemm(threads) => gemm::Parallelism::Rayon(threads),
                    Split::Rows {
                        rows_per_part,
                        parts,
                    } => {
                        // Row bands of `dst` are disjoint slices (each ends where the next band's
                        // first row starts), so this needs no unsafe of its own; each band is a
                        // single-threaded product of the same rows of lhs with all of rhs.
                        let jobs = dst
                            .chunks_mut(rows_per_part * dst_rs)
                            .take(parts)
                            .enumerate()
                            .map(|(part, dst_band)| {
                                let r0 = part * rows_per_part;
                                let rows = rows_per_part.min(m - r0);
                                let lhs_band = &lhs[r0 * lhs_rs..];
                                Box::new(move || {
                                    Self::gemm(
                                        rows, n, k, dst_band, dst_rs, lhs_band, lhs_rs, lhs_cs,
                                        rhs, rhs_rs, rhs_cs, accumulate, scale, 1,
                                    )
                                }) as Box<dyn FnOnce() + Send + '_>
                            })
                            .collect();
                        crate::kernels::matmul::run_jobs_on_threads(threads, jobs);
                        return;
                    }
                    Split::Cols {
                        cols_per_part,
                        parts,
                    } => {
                        // Column bands of `dst` interleave in memory, so no band is a slice of its
                        // own: each band's single-threaded product writes its columns in place
                        // through a raw pointer, with the whole product's strides (no compact
                        // copy, and the same gemm call as the whole product's columns).
                        let dst_ptr = BandPtr(dst.as_mut_ptr());
                        let dst_ptr = &dst_ptr;
                        let jobs = (0..parts)
                            .map(|part| {
                                let c0 = part * cols_per_part;
                                let width = cols_per_part.min(n - c0);
                                let rhs_band = &rhs[c0 * rhs_cs..];
                                Box::new(move || {
                                    // SAFETY: the asserts above prove that every (row, column)
                                    // of the m x n product lies inside `dst` and that no two
                                    // share an element; this band writes (and, accumulating,
                                    // reads) only rows 0..m of columns c0..c0 + width, which
                                    // no other band touches, and `c0 < n` keeps the offset
                                    // inside the allocation. `dst` stays uniquely borrowed by
                                    // this call, which returns only after
                                    // `run_jobs_on_threads` has seen every band finish, so
                                    // nothing else reads or writes it meanwhile. lhs and this
                                    // band's rhs (in bounds by the asserts: column
                                    // c0 + width - 1 < n) are only read.
                                    unsafe {
                                        row_major_gemm(
                                            (m, width, k),
                                            (dst_ptr.0.add(c0), dst_rs),
                                            (accumulate, scale),
                                            (lhs.as_ptr(), lhs_rs, lhs_cs),
                                            (rhs_band.as_ptr(), rhs_rs, rhs_cs),
                                            gemm::Parallelism::None,
                                        )
                                    }
                                }) as Box<dyn FnOnce() + Send + '_>
                            })
                            .collect();
                        crate::kernels::matmul::run_jobs_on_threads(threads, jobs);
                        return;
                    }
                };
                // SAFETY: the asserts above prove every element the product reads or writes lies
                // inside `dst`, `lhs` and `rhs` (m, n, k >= 1 here, so `- 1` cannot wrap) and that
                // no two (row, column) pairs of `dst` share an element, so the threads gemm may
                // split the rows over never write the same place; `dst` is uniquely borrowed and
                // cannot alias the inputs, which are only read.
                unsafe {
                    row_major_gemm(
                        (m, n, k),
                        (dst.as_mut_ptr(), dst_rs),
                        (accumulate, scale),
                        (lhs.as_ptr(), lhs_rs, lhs_cs),
                        (rhs.as_ptr(), rhs_rs, rhs_cs),
                        parallelism,
                    )
                }
            }
        }
    };
}

impl_scalar!(f32, DType::F32, libm::erff, libm::erfcf);
impl_scalar!(f64, DType::F64, libm::erf, libm::erfc);
