//! Element loops of parameter updates (the optimizers' `p += a * g` and its outer-product form)
//! compiled for the widest vector instruction set the CPU has
//! (AVX2 or AVX-512 on x86-64, picked at run time by `pulp`, which `gemm` already brings in), so
//! they auto-vectorise beyond the SSE2 baseline, and the spread of one step's element loops over
//! the GEMM threads. Rust never contracts `a * b + c` into a fused multiply-add, so the results
//! are bit-identical to the plain loops, for every thread count (each element is computed on its
//! own).

use super::{for_each_part, num_threads};
use crate::Scalar;
use pulp::{Arch, Simd, WithSimd};

/// Elements per thread below which a split loses to the hand-off: at memory speed a pass over
/// 32k f32 elements (read two, write one) takes about 10 us, a few times the hand-off to a
/// helper that is still polling.
pub const MIN_PER_THREAD: usize = 1 << 15;

/// Weight elements per thread below which [`add_scaled_outer`] stays on one thread. Higher than
/// [`MIN_PER_THREAD`]: the weight it updates is the one the next forward product reads on the
/// calling thread, so a band updated on another core must travel back through the caches. At
/// batch 1 the MLP's 256 x 784 first weight (200k elements, 800 KB) updated on two threads cost
/// more than on one (AVX-512 EPYC: a step's median 24.8-35.3 us split, 24.0-24.8 us
/// not, eight interleaved rounds of `bench mlp --batch 1 --threads 2`).
const MIN_OUTER_PER_THREAD: usize = 1 << 18;

/// A run of elements of one tensor (and of its state) that an update treats on its own, and can
/// be cut in two at any element.
pub trait Piece: Sized + Send {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The first `at` elements and the rest.
    fn cut(self, at: usize) -> (Self, Self);
}

/// Calls `update` on every element of `pieces` (one per tensor, in order) exactly once: one
/// call per piece on this thread when the step is short or there is one GEMM thread, else the
/// pieces' elements together cut into one equal run per thread (whole cache lines each, cutting
/// tensors where a run ends), so one hand-off covers every tensor of the step and no thread waits
/// on a large tensor the other has.
pub fn spread<P: Piece>(pieces: Vec<P>, update: impl Fn(P) + Sync) {
    let total: usize = pieces.iter().map(Piece::len).sum();
    let threads = num_threads().min(total / MIN_PER_THREAD).max(1);
    if threads == 1 {
        return pieces.into_iter().for_each(update);
    }
    let per_thread = total.div_ceil(threads).next_multiple_of(16);
    let mut runs: Vec<Vec<P>> = Vec::with_capacity(threads);
    let mut run = Vec::new();
    let mut room = per_thread;
    for mut piece in pieces {
        while piece.len() > room {
            let (head, rest) = piece.cut(room);
            run.push(head);
            runs.push(std::mem::take(&mut run));
            room = per_thread;
            piece = rest;
        }
        room -= piece.len();
        run.push(piece);
    }
    runs.push(run);
    for_each_part(runs, |run| run.into_iter().for_each(&update));
}

/// `p += a * g`, element by element (`a * g` rounded, then added), on this thread.
pub fn add_scaled<S: Scalar>(p: &mut [S], a: S, g: &[S]) {
    struct AddScaled<'a, S> {
        p: &'a mut [S],
        a: S,
        g: &'a [S],
    }
    impl<S: Scalar> WithSimd for AddScaled<'_, S> {
        type Output = ();
        // Inlined into pulp's `#[target_feature]` function, which is what lets the loop use it.
        #[inline(always)]
        fn with_simd<V: Simd>(self, _simd: V) {
            let a = self.a;
            for (p, &g) in self.p.iter_mut().zip(self.g) {
                *p += a * g;
            }
        }
    }
    Arch::new().dispatch(AddScaled { p, a, g });
}

/// `p += a * (rows[i] * cols[j])` for the row-major `(rows.len(), cols.len())` matrix `p`: the
/// plain SGD update by an outer-product gradient, with each product rounded as
/// `kernels::outer_product` rounds it and then scaled and added as [`add_scaled`] does, so the
/// bits equal those two passes while the gradient is never written. Long ones are cut into bands
/// of whole rows, one per GEMM thread (each element is computed on its own).
///
/// Every row reads all of `cols` again, so where `cols` starts matters: off a 32-byte boundary,
/// half of those vector loads would straddle two cache lines (15% slower on a 256 x 784 weight
/// on Zen 3). `cols` is a whole one-row tensor's data, and tensor buffers start on a 64-byte
/// boundary (`tapegrad_tensor::BUFFER_ALIGN`), so it is read in place.
pub fn add_scaled_outer<S: Scalar>(p: &mut [S], a: S, rows: &[S], cols: &[S]) {
    let threads = num_threads().min(p.len() / MIN_OUTER_PER_THREAD).max(1);
    if threads == 1 || cols.is_empty() {
        return add_scaled_outer_here(p, a, rows, cols);
    }
    let band = rows.len().div_ceil(threads);
    let parts: Vec<(&mut [S], &[S])> = p
        .chunks_mut(band * cols.len())
        .zip(rows.chunks(band))
        .collect();
    for_each_part(parts, |(p, rows)| add_scaled_outer_here(p, a, rows, cols));
}

/// [`add_scaled_outer`] on this thread.
fn add_scaled_outer_here<S: Scalar>(p: &mut [S], a: S, rows: &[S], cols: &[S]) {
    struct AddScaledOuter<'a, S> {
        p: &'a mut [S],
        a: S,
        rows: &'a [S],
        cols: &'a [S],
    }
    impl<S: Scalar> WithSimd for AddScaledOuter<'_, S> {
        type Output = ();
        // Inlined into pulp's `#[target_feature]` function, which is what lets the loop use it.
        #[inline(always)]
        fn with_simd<V: Simd>(self, _simd: V) {
            let AddScaledOuter { p, a, rows, cols } = self;
            if cols.is_empty() {
                return;
            }
            for (row, &gi) in p.chunks_exact_mut(cols.len()).zip(rows) {
                for (p, &xj) in row.iter_mut().zip(cols) {
                    *p += a * (gi * xj);
                }
            }
        }
    }
    Arch::new().dispatch(AddScaledOuter { p, a, rows, cols });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::set_num_threads;

    /// A run of `(tensor index, element index)` labels, to see where `spread` cut.
    struct Labels(Vec<(usize, usize)>);

    impl Piece for Labels {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn cut(mut self, at: usize) -> (Self, Self) {
            let rest = self.0.split_off(at);
            (self, Labels(rest))
        }
    }

    #[test]
    fn spread_updates_every_element_once_in_equal_runs() {
        let lens = [3 * MIN_PER_THREAD + 17, 5, 0, MIN_PER_THREAD / 3, 1];
        for threads in [1, 2, 3, 4] {
            // Other tests give the same bits on any thread count, so changing it here is safe.
            set_num_threads(threads);
            let pieces = lens
                .iter()
                .enumerate()
                .map(|(t, &len)| Labels((0..len).map(|i| (t, i)).collect()))
                .collect();
            let seen = std::sync::Mutex::new(Vec::new());
            spread(pieces, |piece| seen.lock().unwrap().extend(piece.0));
            let mut seen = seen.into_inner().unwrap();
            seen.sort_unstable();
            let want: Vec<(usize, usize)> = lens
                .iter()
                .enumerate()
                .flat_map(|(t, &len)| (0..len).map(move |i| (t, i)))
                .collect();
            assert!(
                seen == want,
                "{threads} threads: an element missed or repeated"
            );
        }
        set_num_threads(1);
    }

    /// The outer-product update gives the plain loop's bits wherever `cols` starts.
    #[test]
    fn outer_update_gives_the_plain_loops_bits_at_every_alignment() {
        let (rows_n, cols_n) = (11, 37);
        let rows: Vec<f32> = (0..rows_n).map(|i| 0.3 - 0.07 * i as f32).collect();
        let backing: Vec<f32> = (0..cols_n + 16).map(|j| (j as f32 * 0.61).sin()).collect();
        let start: Vec<f32> = (0..rows_n * cols_n)
            .map(|k| (k as f32 * 0.13).cos())
            .collect();
        let a = -0.01f32;
        for offset in 0..16 {
            let cols = &backing[offset..offset + cols_n];
            let mut want = start.clone();
            for (row, &gi) in want.chunks_exact_mut(cols_n).zip(&rows) {
                for (p, &xj) in row.iter_mut().zip(cols) {
                    *p += a * (gi * xj);
                }
            }
            let mut got = start.clone();
            add_scaled_outer(&mut got, a, &rows, cols);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got),
                bits(&want),
                "cols {offset} elements into its buffer"
            );
        }
    }
}
