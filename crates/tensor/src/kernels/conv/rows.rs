//! Moves of one row between an image and its stride phases: the strided gather of the phase copy
//! (a de-interleave at stride 2) and the strided scatter of the input gradient (an interleave at
//! stride 2). Values are only moved, never combined, so any order of the moves gives the same bits.

/// Runs `f` in a function compiled for the widest vector instructions pulp finds on this CPU, so
/// that the loops of the moves `f` inlines are vectorised with them (AVX2 here: a de-interleave
/// of 16 f32 is four loads, four shuffles and four stores), not with the baseline x86-64 the
/// crate is built for.
#[inline(always)]
pub(super) fn vectorised<R>(f: impl FnOnce() -> R) -> R {
    struct Job<F>(F);
    impl<R, F: FnOnce() -> R> pulp::WithSimd for Job<F> {
        type Output = R;
        // Inlined into pulp's `#[target_feature]` function, and `f` with it.
        #[inline(always)]
        fn with_simd<Sd: pulp::Simd>(self, _: Sd) -> R {
            (self.0)()
        }
    }
    pulp::Arch::new().dispatch(Job(f))
}

/// `dst[j] = src[j * stride]` for every `j < dst.len()`; `src` must reach that far.
#[inline(always)]
pub(super) fn gather<S: Copy>(src: &[S], stride: usize, dst: &mut [S]) {
    let Some(last) = dst.len().checked_sub(1) else {
        return;
    };
    if stride == 1 {
        dst.copy_from_slice(&src[..dst.len()]);
        return;
    }
    // Checked once here, so the loop's accesses need no checks of their own.
    let src = &src[..last * stride + 1];
    for (j, d) in dst.iter_mut().enumerate() {
        *d = src[j * stride];
    }
}

/// `dst[j * stride] = src[j]` for every `j < src.len()`; `dst` must reach that far. The other
/// elements of `dst` keep their values.
#[inline(always)]
pub(super) fn scatter<S: Copy>(src: &[S], stride: usize, dst: &mut [S]) {
    let Some(last) = src.len().checked_sub(1) else {
        return;
    };
    if stride == 1 {
        dst[..src.len()].copy_from_slice(src);
        return;
    }
    let dst = &mut dst[..last * stride + 1];
    for (j, &s) in src.iter().enumerate() {
        dst[j * stride] = s;
    }
}

/// `even[j] = src[2 j]` and `odd[j] = src[2 j + 1]` for every `j < odd.len()`, and, when `even`
/// is one longer, its last element from `src[2 odd.len()]`; `src` must reach that far.
#[inline(always)]
pub(super) fn deinterleave<S: Copy>(src: &[S], even: &mut [S], odd: &mut [S]) {
    let n = odd.len();
    // Checked once here, so the loop's accesses need no checks of their own.
    let (pairs, even_n) = (&src[..2 * n], &mut even[..n]);
    for j in 0..n {
        even_n[j] = pairs[2 * j];
        odd[j] = pairs[2 * j + 1];
    }
    if let Some(last) = even.get_mut(n) {
        *last = src[2 * n];
    }
}

/// `dst[2 j] = even[j]` and `dst[2 j + 1] = odd[j]` for every `j < odd.len()`, and, when `even`
/// is one longer, `dst[2 odd.len()]` its last element; `dst` must reach that far.
#[inline(always)]
pub(super) fn interleave<S: Copy>(even: &[S], odd: &[S], dst: &mut [S]) {
    let n = odd.len();
    let (pairs, even_n) = (&mut dst[..2 * n], &even[..n]);
    for j in 0..n {
        pairs[2 * j] = even_n[j];
        pairs[2 * j + 1] = odd[j];
    }
    if let Some(&last) = even.get(n) {
        dst[2 * n] = last;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every move against its one-line definition, on lengths around the block (empty, shorter
    /// than a block, whole blocks, blocks and a tail) and strides 1 to 4.
    #[test]
    fn moves_match_their_definitions() {
        for n in 0..40 {
            let src: Vec<u32> = (1..=(4 * n + 4) as u32).collect();
            for stride in 1..=4 {
                let mut dst = vec![0; n];
                gather(&src, stride, &mut dst);
                let want: Vec<u32> = (0..n).map(|j| src[j * stride]).collect();
                assert_eq!(dst, want, "gather n {n} stride {stride}");

                let mut dst = vec![0; 4 * n + 4];
                let mut want = dst.clone();
                scatter(&src[..n], stride, &mut dst);
                for j in 0..n {
                    want[j * stride] = src[j];
                }
                assert_eq!(dst, want, "scatter n {n} stride {stride}");
            }
            for longer in [0, 1] {
                let (mut even, mut odd) = (vec![0; n + longer], vec![0; n]);
                vectorised(|| deinterleave(&src, &mut even, &mut odd));
                let want_even: Vec<u32> = (0..n + longer).map(|j| src[2 * j]).collect();
                let want_odd: Vec<u32> = (0..n).map(|j| src[2 * j + 1]).collect();
                assert_eq!((&even, &odd), (&want_even, &want_odd), "deinterleave n {n}");

                let mut dst = vec![0; 2 * n + 2];
                vectorised(|| interleave(&even, &odd, &mut dst));
                let mut want = src[..2 * n + longer].to_vec();
                want.resize(2 * n + 2, 0);
                assert_eq!(dst, want, "interleave n {n}");
            }
        }
    }
}
