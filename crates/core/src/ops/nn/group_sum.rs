//! How the normalisations walk their groups: per-group sums taken pairwise (so that the error of
//! a sum of n values grows like log n, not n), each group seeing its elements in flat order, and
//! elementwise maps; both run over segments of consecutive elements (a run of one group, or a
//! row whose element j belongs to group j), not one group lookup per element.

use std::ops::Range;
use tapegrad_tensor::Scalar;

/// Values added left to right before a block's sum joins the pairwise combination.
const BLOCK: usize = 32;

/// One running sum: the current block, and the sums of 2^k earlier blocks at level k (a binary
/// counter, so equal-sized partial sums are added together: pairwise summation, online).
#[derive(Clone)]
struct CascadeSum<S> {
    block: S,
    in_block: usize,
    levels: Vec<Option<S>>,
}

impl<S: Scalar> CascadeSum<S> {
    fn new() -> Self {
        CascadeSum {
            block: S::ZERO,
            in_block: 0,
            levels: Vec::new(),
        }
    }

    /// Adds one value: the definition `add_run` follows.
    #[cfg(test)]
    fn add(&mut self, v: S) {
        self.block += v;
        self.in_block += 1;
        if self.in_block == BLOCK {
            self.carry();
        }
    }

    /// Adds `f(i)` for the indices of `run` in order, with the same additions as `add` one by
    /// one: the open block is filled by a plain fold between carries.
    #[inline]
    fn add_run(&mut self, run: Range<usize>, f: impl Fn(usize) -> S) {
        let mut i = run.start;
        while i < run.end {
            let take = (BLOCK - self.in_block).min(run.end - i);
            self.block = (i..i + take).fold(self.block, |a, j| a + f(j));
            self.in_block += take;
            i += take;
            if self.in_block == BLOCK {
                self.carry();
            }
        }
    }

    /// The full block joins the levels: equal partial sums are added, earlier one first.
    fn carry(&mut self) {
        let mut carry = std::mem::replace(&mut self.block, S::ZERO);
        self.in_block = 0;
        for level in self.levels.iter_mut() {
            match level.take() {
                None => {
                    *level = Some(carry);
                    return;
                }
                Some(earlier) => carry = earlier + carry,
            }
        }
        self.levels.push(Some(carry));
    }

    /// The total: the partial sums from the largest (earliest) down, then the open block.
    fn total(&self) -> S {
        let whole = self
            .levels
            .iter()
            .rev()
            .flatten()
            .copied()
            .reduce(|a, b| a + b);
        match whole {
            Some(w) if self.in_block > 0 => w + self.block,
            Some(w) => w,
            None => self.block,
        }
    }
}

/// `(i / div) % modulo`: how an element's flat index maps to its statistics group or channel.
#[derive(Debug, Clone, Copy)]
pub(super) struct IndexMap {
    pub div: usize,
    pub modulo: usize,
}

impl IndexMap {
    /// The definition, which `iter` and `group_sums` count out instead of dividing.
    #[cfg(test)]
    pub fn at(&self, i: usize) -> usize {
        (i / self.div) % self.modulo
    }
}

/// A segment of consecutive elements under an [`IndexMap`].
#[derive(Debug, Clone, Copy, PartialEq)]
enum Segment {
    /// Every element is in this group.
    Same(usize),
    /// Element `start + j` is in group `j` (a row of a map with `div` 1).
    Ascending,
}

/// Calls `f` on the segments of `0..n` in order: rows of `modulo` elements when each element
/// has its own group (`div` 1, whole rows), else runs of `div` elements sharing one group.
fn for_each_segment(map: IndexMap, n: usize, mut f: impl FnMut(Range<usize>, Segment)) {
    let (div, modulo) = (map.div.max(1), map.modulo.max(1));
    if div == 1 && modulo > 1 && n % modulo == 0 {
        for start in (0..n).step_by(modulo) {
            f(start..start + modulo, Segment::Ascending);
        }
        return;
    }
    let (mut start, mut g) = (0, 0);
    while start < n {
        let end = start.saturating_add(div).min(n);
        f(start..end, Segment::Same(g));
        start = end;
        g += 1;
        if g == modulo {
            g = 0;
        }
    }
}

/// `out[i] = f(i, g)` with `g = map.at(i)`, for i in 0..n.
pub(super) fn map_groups<S: Scalar>(
    map: IndexMap,
    n: usize,
    f: impl Fn(usize, usize) -> S,
) -> Vec<S> {
    let mut out = vec![S::ZERO; n];
    for_each_segment(map, n, |run, segment| {
        let slots = out[run.clone()].iter_mut().zip(run);
        match segment {
            Segment::Same(g) => slots.for_each(|(o, i)| *o = f(i, g)),
            Segment::Ascending => slots.enumerate().for_each(|(j, (o, i))| *o = f(i, j)),
        }
    });
    out
}

/// One [`CascadeSum`] per column of rows fed whole: every column gets one value per row, so all
/// share one block count, and a row adds to all of them at once (the same additions, per
/// column, as feeding each its values one by one).
struct RowCascade<S> {
    block: Vec<S>,
    in_block: usize,
    levels: Vec<Option<Vec<S>>>,
}

impl<S: Scalar> RowCascade<S> {
    fn new(columns: usize) -> Self {
        RowCascade {
            block: vec![S::ZERO; columns],
            in_block: 0,
            levels: Vec::new(),
        }
    }

    /// Adds `f(start + j, j)` to column j.
    fn add_row(&mut self, start: usize, f: &impl Fn(usize, usize) -> S) {
        for (j, b) in self.block.iter_mut().enumerate() {
            *b += f(start + j, j);
        }
        self.in_block += 1;
        if self.in_block == BLOCK {
            let columns = self.block.len();
            let mut carry = std::mem::replace(&mut self.block, vec![S::ZERO; columns]);
            self.in_block = 0;
            for level in self.levels.iter_mut() {
                match level.take() {
                    None => {
                        *level = Some(carry);
                        return;
                    }
                    Some(earlier) => {
                        for (c, e) in carry.iter_mut().zip(earlier) {
                            *c = e + *c;
                        }
                    }
                }
            }
            self.levels.push(Some(carry));
        }
    }

    /// Per column, as [`CascadeSum::total`].
    fn totals(self) -> Vec<S> {
        let whole = self.levels.into_iter().rev().flatten().reduce(|mut a, b| {
            for (x, y) in a.iter_mut().zip(b) {
                *x += y;
            }
            a
        });
        match whole {
            Some(mut w) if self.in_block > 0 => {
                for (x, y) in w.iter_mut().zip(&self.block) {
                    *x += *y;
                }
                w
            }
            Some(w) => w,
            None => self.block,
        }
    }
}

/// `sums[g] += f(i, g)` with `g = group.at(i)` for i in 0..n, pairwise per group, each group in
/// flat order (`groups` is the map's `modulo`).
pub(super) fn group_sums<S: Scalar>(
    n: usize,
    groups: usize,
    group: IndexMap,
    f: impl Fn(usize, usize) -> S,
) -> Vec<S> {
    let mut sums = vec![CascadeSum::new(); groups];
    let mut rows: Option<RowCascade<S>> = None;
    for_each_segment(group, n, |run, segment| match segment {
        Segment::Same(g) => sums[g].add_run(run, |i| f(i, g)),
        Segment::Ascending => rows
            .get_or_insert_with(|| RowCascade::new(groups))
            .add_row(run.start, &f),
    });
    match rows {
        Some(rows) => rows.totals(),
        None => sums.iter().map(CascadeSum::total).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_f32_group_sums_stay_near_an_ulp() {
        // Two interleaved groups of 40000 positive values each: one running total per group was
        // tens of ulps off (a layer_norm over 16384 values with mean 1000 was 17 ulps off where
        // PyTorch's was 0.4); pairwise, a few at most.
        let n = 80_000;
        let value =
            |i: usize| 1000.0 + (((i as u64 * 2_654_435_761) >> 8) % 65536) as f32 / 32768.0;
        let sums = group_sums(n, 2, IndexMap { div: 1, modulo: 2 }, |i, _| value(i));
        for (g, &got) in sums.iter().enumerate() {
            let exact: f64 = (g..n).step_by(2).map(|i| f64::from(value(i))).sum();
            let ulps = (f64::from(got) - exact).abs() / (exact * f64::from(f32::EPSILON));
            assert!(ulps <= 4.0, "group {g}: {got} vs {exact} ({ulps} ulps)");
        }
        // Runs of several elements per group add in the same order as one element at a time.
        // Rows of a map with div 1 (whole rows: fed row by row; a partial row: one by one) too.
        for (div, modulo, n) in [
            (3, 2, 1000),
            (5, 3, 997),
            (40, 2, 5000),
            (64, 7, 64 * 9 + 5),
            (1, 9, 9 * 100),
            (1, 9, 9 * 100 + 4),
            (1, 1, 77),
        ] {
            let map = IndexMap { div, modulo };
            let mut each = vec![CascadeSum::new(); modulo];
            for i in 0..n {
                each[map.at(i)].add(value(i));
            }
            let want: Vec<f32> = each.iter().map(CascadeSum::total).collect();
            let got = group_sums(n, modulo, map, |i, g| {
                assert_eq!(g, map.at(i), "the group handed to f");
                value(i)
            });
            assert_eq!(got, want, "div {div}, modulo {modulo}, n {n}");
            let mapped = map_groups(map, n, |i, g| (i * 10 + g) as f32);
            let divided: Vec<f32> = (0..n).map(|i| (i * 10 + map.at(i)) as f32).collect();
            assert_eq!(mapped, divided, "div {div}, modulo {modulo}");
        }
        // Exact on small integers whatever the length, block boundaries included.
        for len in [0, 1, 31, 32, 33, 64, 65, 1000] {
            let s = group_sums(len, 1, IndexMap { div: 1, modulo: 1 }, |i, _| {
                (i % 7) as f64
            });
            let want: f64 = (0..len).map(|i| (i % 7) as f64).sum();
            assert_eq!(s[0], want, "length {len}");
        }
    }
}
