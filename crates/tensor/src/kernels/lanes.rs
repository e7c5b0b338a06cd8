//! What the register-tiled kernels (direct convolution, attention's head products) share: the
//! element types they have vector code for through pulp's `Simd` (AVX2, AVX-512, or one element
//! at a time), a generic slice viewed as its concrete type, and unaligned vector loads.

use crate::Scalar;
use pulp::bytemuck::Pod;
use pulp::Simd;
use std::any::TypeId;

/// f32 and f64, with their vector type and the two vector operations the tiles use.
pub(crate) trait Lanes: Scalar + Pod {
    type V<Sd: Simd>: Copy + Pod;
    fn splat<Sd: Simd>(simd: Sd, v: Self) -> Self::V<Sd>;
    /// `a * b + c`, one rounding.
    fn fma<Sd: Simd>(simd: Sd, a: Self::V<Sd>, b: Self::V<Sd>, c: Self::V<Sd>) -> Self::V<Sd>;
    /// `a * b + c` of one element, one rounding (an instruction inside pulp's dispatch).
    fn fma_one(a: Self, b: Self, c: Self) -> Self;
}

impl Lanes for f32 {
    type V<Sd: Simd> = Sd::f32s;
    #[inline(always)]
    fn splat<Sd: Simd>(simd: Sd, v: f32) -> Sd::f32s {
        simd.splat_f32s(v)
    }
    #[inline(always)]
    fn fma<Sd: Simd>(simd: Sd, a: Sd::f32s, b: Sd::f32s, c: Sd::f32s) -> Sd::f32s {
        simd.mul_add_f32s(a, b, c)
    }
    #[inline(always)]
    fn fma_one(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

impl Lanes for f64 {
    type V<Sd: Simd> = Sd::f64s;
    #[inline(always)]
    fn splat<Sd: Simd>(simd: Sd, v: f64) -> Sd::f64s {
        simd.splat_f64s(v)
    }
    #[inline(always)]
    fn fma<Sd: Simd>(simd: Sd, a: Sd::f64s, b: Sd::f64s, c: Sd::f64s) -> Sd::f64s {
        simd.mul_add_f64s(a, b, c)
    }
    #[inline(always)]
    fn fma_one(a: f64, b: f64, c: f64) -> f64 {
        a.mul_add(b, c)
    }
}

/// Elements of `T` in one vector `T::V<Sd>`.
#[inline(always)]
pub(crate) fn lanes<T: Lanes, Sd: Simd>() -> usize {
    std::mem::size_of::<T::V<Sd>>() / std::mem::size_of::<T>()
}

/// `v` as a slice of `T` when `S` is `T`.
pub(crate) fn cast<S: Scalar, T: Scalar>(v: &[S]) -> Option<&[T]> {
    // SAFETY: S and T are the same type, so the pointer, length and lifetime stay valid.
    (TypeId::of::<S>() == TypeId::of::<T>())
        .then(|| unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<T>(), v.len()) })
}

/// [`cast`] for a mutable slice.
pub(crate) fn cast_mut<S: Scalar, T: Scalar>(v: &mut [S]) -> Option<&mut [T]> {
    // SAFETY: S and T are the same type; the borrow of `v` moves into the result.
    (TypeId::of::<S>() == TypeId::of::<T>())
        .then(|| unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<T>(), v.len()) })
}

/// The `N` vectors of `v` from `at` (unaligned).
///
/// # Safety
/// `at + N * lanes <= v.len()`, where a vector `V` holds `lanes` elements `T`.
#[inline(always)]
pub(crate) unsafe fn load<T: Pod, V: Pod, const N: usize>(v: &[T], at: usize) -> [V; N] {
    let lanes = std::mem::size_of::<V>() / std::mem::size_of::<T>();
    // SAFETY: the caller's bound keeps every vector inside `v`; V is Pod, so any bits are valid.
    std::array::from_fn(|i| unsafe { v.as_ptr().add(at + i * lanes).cast::<V>().read_unaligned() })
}
