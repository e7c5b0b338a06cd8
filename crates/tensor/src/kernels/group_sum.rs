//! How the normalisations walk their groups: per-group sums taken pairwise (so that the error of
//! a sum of n values grows like log n, not n) with a fixed order that depends only on the group's
//! layout, and elementwise maps; both run over segments of consecutive elements (a run of one
//! group, or a row whose element j belongs to group j) as slice loops that vectorize.

use crate::Scalar;
use std::ops::Range;

pub mod joint;

/// Independent running sums inside a block: a group's value at position k of its block is added
/// to lane `k % LANES`, so a block is LANES dependent chains (one SIMD register of f32), not one.
const LANES: usize = 8;
/// Values per block: `BLOCK / LANES` = 16 per lane, added left to right, before the block's sum
/// (its lanes folded by [`fold_lanes`]) joins the pairwise combination of blocks.
const BLOCK: usize = 128;

/// The sum of a block's lanes in a fixed tree: `lane[k] + lane[k + w]` for w = 4, 2, 1, that is
/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
#[inline(always)]
fn fold_lanes<S: Scalar>(mut lanes: [S; LANES]) -> S {
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        for k in 0..w {
            lanes[k] += lanes[k + w];
        }
    }
    lanes[0]
}

/// `[a[m] + b[m]]` for each of M sums.
#[inline(always)]
fn add_each<S: Scalar, const M: usize>(a: [S; M], b: [S; M]) -> [S; M] {
    std::array::from_fn(|m| a[m] + b[m])
}

/// M running sums of one group fed the same positions: the lanes of the current block, and the
/// sums of 2^k earlier blocks at level k (a binary counter, so equal-sized partial sums are
/// added together: pairwise summation, online). Level k holds a sum where bit k of `blocks`,
/// the count of full blocks, is set.
#[derive(Clone)]
struct CascadeSum<S, const M: usize> {
    lanes: [[S; LANES]; M],
    in_block: usize,
    blocks: usize,
    /// Levels 0 to `INLINE_LEVELS - 1`, in place: a group of fewer than 2^INLINE_LEVELS
    /// blocks (8,192 values) never touches the heap, where a normalisation over many short
    /// groups (a transformer's layer norm: rows of a few hundred) would allocate per group.
    levels: [[S; M]; INLINE_LEVELS],
    /// The levels above those, in order.
    more_levels: Vec<[S; M]>,
}

/// The levels a [`CascadeSum`] holds in place.
const INLINE_LEVELS: usize = 6;

impl<S: Scalar, const M: usize> CascadeSum<S, M> {
    fn new() -> Self {
        CascadeSum {
            lanes: [[S::ZERO; LANES]; M],
            in_block: 0,
            blocks: 0,
            levels: [[S::ZERO; M]; INLINE_LEVELS],
            more_levels: Vec::new(),
        }
    }

    /// The partial sum at `level` (set once bit `level` of `blocks` has been set).
    fn level(&self, level: usize) -> [S; M] {
        match level.checked_sub(INLINE_LEVELS) {
            None => self.levels[level],
            Some(k) => self.more_levels[k],
        }
    }

    /// Sets the partial sum at `level`; levels are first reached in increasing order, so one
    /// above all held so far is the next one.
    fn set_level(&mut self, level: usize, sum: [S; M]) {
        match level.checked_sub(INLINE_LEVELS) {
            None => self.levels[level] = sum,
            Some(k) => match self.more_levels.get_mut(k) {
                Some(slot) => *slot = sum,
                None => self.more_levels.push(sum),
            },
        }
    }

    /// Adds one value per sum: the definition `add_run` follows.
    #[cfg(test)]
    fn add(&mut self, v: [S; M]) {
        let lane = self.in_block % LANES;
        for (lanes, v) in self.lanes.iter_mut().zip(v) {
            lanes[lane] += v;
        }
        self.in_block += 1;
        if self.in_block == BLOCK {
            self.carry(self.lanes.map(fold_lanes));
            self.lanes = [[S::ZERO; LANES]; M];
        }
    }

    /// Adds `term(a[i], b[i], c[i])` for i in order, with the same additions as `add` one by
    /// one (`b` and `c` at least as long as `a`); the lanes stay in registers across blocks.
    #[inline(always)]
    fn add_run(&mut self, a: &[S], b: &[S], c: &[S], term: impl Fn(S, S, S) -> [S; M]) {
        let (b, c) = (&b[..a.len()], &c[..a.len()]);
        let mut lanes = self.lanes;
        let mut at = 0;
        while at < a.len() {
            let take = (BLOCK - self.in_block).min(a.len() - at);
            let piece = at..at + take;
            let (a, b, c) = (&a[piece.clone()], &b[piece.clone()], &c[piece]);
            fill(&mut lanes, self.in_block, [a, b, c], &term);
            self.in_block += take;
            at += take;
            if self.in_block == BLOCK {
                self.carry(lanes.map(fold_lanes));
                lanes = [[S::ZERO; LANES]; M];
            }
        }
        self.lanes = lanes;
    }

    /// A full block's sums join the levels: equal partial sums are added, earlier one first.
    fn carry(&mut self, block: [S; M]) {
        let mut carry = block;
        self.in_block = 0;
        let mut level = 0;
        while self.blocks >> level & 1 == 1 {
            carry = add_each(self.level(level), carry);
            level += 1;
        }
        self.set_level(level, carry);
        self.blocks += 1;
    }

    /// The totals: the partial sums from the largest (earliest) down, then the open block.
    fn total(&self) -> [S; M] {
        let held = (usize::BITS - self.blocks.leading_zeros()) as usize;
        let whole = (0..held)
            .rev()
            .filter(|&level| self.blocks >> level & 1 == 1)
            .map(|level| self.level(level))
            .reduce(add_each);
        let open = self.lanes.map(fold_lanes);
        match whole {
            Some(w) if self.in_block > 0 => add_each(w, open),
            Some(w) => w,
            None => open,
        }
    }
}

/// Adds `term(a[i], b[i], c[i])` for `[a, b, c]` (of one length) to `lanes`, the open block
/// holding `in_block` values, where all of them fit in the block.
#[inline(always)]
fn fill<S: Scalar, const M: usize>(
    lanes: &mut [[S; LANES]; M],
    in_block: usize,
    abc: [&[S]; 3],
    term: &impl Fn(S, S, S) -> [S; M],
) {
    for_each_lane(in_block, abc, |k, x, y, z| {
        let t = term(x, y, z);
        for m in 0..M {
            lanes[m][k] += t[m];
        }
    });
}

/// Calls `add(lane, a[i], b[i], c[i])` for `[a, b, c]` (of one length) in order, the lane of
/// element i being `(in_block + i) % LANES`: one by one up to a lane boundary, then whole
/// rounds of LANES values (the loop that vectorizes), then the rest from lane 0.
#[inline(always)]
fn for_each_lane<S: Scalar>(
    in_block: usize,
    [a, b, c]: [&[S]; 3],
    mut add: impl FnMut(usize, S, S, S),
) {
    let (b, c) = (&b[..a.len()], &c[..a.len()]);
    let first = in_block % LANES;
    let head = ((LANES - first) % LANES).min(a.len());
    for i in 0..head {
        add(first + i, a[i], b[i], c[i]);
    }
    let (ca, cb, cc) = (
        a[head..].chunks_exact(LANES),
        b[head..].chunks_exact(LANES),
        c[head..].chunks_exact(LANES),
    );
    let (ra, rb, rc) = (ca.remainder(), cb.remainder(), cc.remainder());
    for ((x, y), z) in ca.zip(cb).zip(cc) {
        for k in 0..LANES {
            add(k, x[k], y[k], z[k]);
        }
    }
    for (k, ((&x, &y), &z)) in ra.iter().zip(rb).zip(rc).enumerate() {
        add(k, x, y, z);
    }
}

/// `first.add_run(a, b, a, first_term)` and `second.add_run(a, b, a, second_term)` (the same
/// additions), in one loop where both open blocks are at the same lane, so that the terms share
/// their loads and common parts and the two sets of lanes add side by side.
#[inline(always)]
fn add_run_pair<S: Scalar, const MA: usize, const MB: usize>(
    first: &mut CascadeSum<S, MA>,
    second: &mut CascadeSum<S, MB>,
    a: &[S],
    b: &[S],
    first_term: impl Fn(S, S) -> [S; MA],
    second_term: impl Fn(S, S) -> [S; MB],
) {
    if first.in_block % LANES != second.in_block % LANES {
        first.add_run(a, b, a, |x, y, _| first_term(x, y));
        second.add_run(a, b, a, |x, y, _| second_term(x, y));
        return;
    }
    let b = &b[..a.len()];
    let (mut lanes_a, mut lanes_b) = (first.lanes, second.lanes);
    let mut at = 0;
    while at < a.len() {
        let room = (BLOCK - first.in_block).min(BLOCK - second.in_block);
        let take = room.min(a.len() - at);
        let (a, b) = (&a[at..at + take], &b[at..at + take]);
        for_each_lane(first.in_block, [a, b, a], |k, x, y, _| {
            let (t, u) = (first_term(x, y), second_term(x, y));
            for m in 0..MA {
                lanes_a[m][k] += t[m];
            }
            for m in 0..MB {
                lanes_b[m][k] += u[m];
            }
        });
        first.in_block += take;
        second.in_block += take;
        at += take;
        if first.in_block == BLOCK {
            first.carry(lanes_a.map(fold_lanes));
            lanes_a = [[S::ZERO; LANES]; MA];
        }
        if second.in_block == BLOCK {
            second.carry(lanes_b.map(fold_lanes));
            lanes_b = [[S::ZERO; LANES]; MB];
        }
    }
    first.lanes = lanes_a;
    second.lanes = lanes_b;
}

/// `(i / div) % modulo`: how an element's flat index maps to its statistics group or channel.
#[derive(Debug, Clone, Copy)]
pub struct IndexMap {
    pub div: usize,
    pub modulo: usize,
}

impl IndexMap {
    /// The definition, which `map_groups` and `group_sums` count out instead of dividing.
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
#[inline(always)]
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

/// `out[i] = f(a[i], b[i], [p[g] for p in per_group])` with `g = map.at(i)`, for i in
/// 0..out.len(); `a` and `b` are at least as long as `out` and each of `per_group` has at least
/// `map.modulo` values.
pub fn map_groups<S: Scalar, const K: usize>(
    map: IndexMap,
    out: &mut [S],
    a: &[S],
    b: &[S],
    per_group: [&[S]; K],
    f: impl Fn(S, S, [S; K]) -> S,
) {
    let n = out.len();
    let (a, b) = (&a[..n], &b[..n]);
    for_each_segment(map, n, |run, segment| {
        let (out, a, b) = (&mut out[run.clone()], &a[run.clone()], &b[run]);
        match segment {
            Segment::Same(g) => {
                let p = per_group.map(|p| p[g]);
                for (o, (&x, &y)) in out.iter_mut().zip(a.iter().zip(b)) {
                    *o = f(x, y, p);
                }
            }
            Segment::Ascending => {
                let len = out.len();
                let (a, b) = (&a[..len], &b[..len]);
                let ps = per_group.map(|p| &p[..len]);
                for (j, o) in out.iter_mut().enumerate() {
                    *o = f(a[j], b[j], ps.map(|p| p[j]));
                }
            }
        }
    })
}

/// M [`CascadeSum`]s per column of rows fed whole: every column gets one value per row, so all
/// share one block position, and a row adds to all of them at once (the same additions, per
/// column, as feeding each its values one by one). `lanes[m]` holds lane l of column j at
/// `l * columns + j`.
struct RowCascade<S, const M: usize> {
    columns: usize,
    lanes: [Vec<S>; M],
    in_block: usize,
    levels: Vec<Option<[Vec<S>; M]>>,
}

/// Folds `LANES` lanes of `columns` values each in place, as [`fold_lanes`] per column; the
/// sums are left in the first lane.
fn fold_lane_rows<S: Scalar>(lanes: &mut [S], columns: usize) {
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        let (low, high) = lanes.split_at_mut(w * columns);
        for (x, &y) in low.iter_mut().zip(&high[..w * columns]) {
            *x += y;
        }
    }
}

/// `a[j] += b[j]` for each column of each of M sums, earlier partial sum `a` first.
fn add_rows<S: Scalar, const M: usize>(a: &mut [Vec<S>; M], b: &[Vec<S>; M]) {
    for (a, b) in a.iter_mut().zip(b) {
        for (x, &y) in a.iter_mut().zip(b) {
            *x += y;
        }
    }
}

impl<S: Scalar, const M: usize> RowCascade<S, M> {
    fn new(columns: usize) -> Self {
        RowCascade {
            columns,
            lanes: std::array::from_fn(|_| vec![S::ZERO; LANES * columns]),
            in_block: 0,
            levels: Vec::new(),
        }
    }

    /// Adds `term(a[j], b[j], [p[j] for p in per_group])[m]` to sum m of column j.
    #[inline(always)]
    fn add_row<const K: usize>(
        &mut self,
        a: &[S],
        b: &[S],
        per_group: [&[S]; K],
        term: &impl Fn(S, S, [S; K]) -> [S; M],
    ) {
        let columns = self.columns;
        let (a, b) = (&a[..columns], &b[..columns]);
        let ps = per_group.map(|p| &p[..columns]);
        let lane = self.in_block % LANES;
        for (m, lanes) in self.lanes.iter_mut().enumerate() {
            let sums = &mut lanes[lane * columns..(lane + 1) * columns];
            for (j, s) in sums.iter_mut().enumerate() {
                *s += term(a[j], b[j], ps.map(|p| p[j]))[m];
            }
        }
        self.in_block += 1;
        if self.in_block == BLOCK {
            self.carry();
        }
    }

    /// As [`CascadeSum::carry`], per column.
    fn carry(&mut self) {
        let columns = self.columns;
        let mut carry: [Vec<S>; M] = std::array::from_fn(|m| {
            let lanes = &mut self.lanes[m];
            fold_lane_rows(lanes, columns);
            let block = lanes[..columns].to_vec();
            lanes.fill(S::ZERO);
            block
        });
        self.in_block = 0;
        for level in self.levels.iter_mut() {
            match level.take() {
                None => {
                    *level = Some(carry);
                    return;
                }
                Some(mut earlier) => {
                    add_rows(&mut earlier, &carry);
                    carry = earlier;
                }
            }
        }
        self.levels.push(Some(carry));
    }

    /// Per column, as [`CascadeSum::total`].
    fn totals(mut self) -> [Vec<S>; M] {
        let columns = self.columns;
        let open: [Vec<S>; M] = std::array::from_fn(|m| {
            let lanes = &mut self.lanes[m];
            fold_lane_rows(lanes, columns);
            lanes[..columns].to_vec()
        });
        let whole = self.levels.into_iter().rev().flatten().reduce(|mut a, b| {
            add_rows(&mut a, &b);
            a
        });
        match whole {
            Some(mut w) if self.in_block > 0 => {
                add_rows(&mut w, &open);
                w
            }
            Some(w) => w,
            None => open,
        }
    }
}

/// `sums[m][g] += term(a[i], b[i], [p[g] for p in per_group])[m]` with `g = map.at(i)` for i in
/// 0..a.len(), pairwise per group in `CascadeSum`'s order, each group in flat order
/// (`groups` is the map's `modulo`; `b` and `per_group` as for [`map_groups`]). M sums taken
/// in one walk are each exactly what a walk of its own gives.
pub fn group_sums<S: Scalar, const K: usize, const M: usize>(
    map: IndexMap,
    groups: usize,
    a: &[S],
    b: &[S],
    per_group: [&[S]; K],
    term: impl Fn(S, S, [S; K]) -> [S; M],
) -> [Vec<S>; M] {
    let n = a.len();
    if n == 0 {
        return std::array::from_fn(|_| vec![S::ZERO; groups]);
    }
    let b = &b[..n];
    let mut sums: Vec<CascadeSum<S, M>> = Vec::new();
    let mut rows: Option<RowCascade<S, M>> = None;
    for_each_segment(map, n, |run, segment| match segment {
        Segment::Same(g) => {
            if sums.is_empty() {
                sums = vec![CascadeSum::new(); groups];
            }
            let p = per_group.map(|p| p[g]);
            let (a, b) = (&a[run.clone()], &b[run]);
            sums[g].add_run(a, b, a, |x, y, _| term(x, y, p));
        }
        Segment::Ascending => rows.get_or_insert_with(|| RowCascade::new(groups)).add_row(
            &a[run.clone()],
            &b[run],
            per_group,
            &term,
        ),
    });
    match rows {
        Some(rows) => rows.totals(),
        None => totals(&sums),
    }
}

/// Sum m of each [`CascadeSum`] of `sums`, in order, for each m.
fn totals<S: Scalar, const M: usize>(sums: &[CascadeSum<S, M>]) -> [Vec<S>; M] {
    let totals: Vec<[S; M]> = sums.iter().map(CascadeSum::total).collect();
    std::array::from_fn(|m| totals.iter().map(|t| t[m]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The order every group sum follows, written out without `CascadeSum`: the values in
    /// blocks of 128; in a block, value k added left to right to lane k % 8 (lanes start at
    /// +0.0) and the lanes summed as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)); the
    /// full blocks split into runs of 2^k blocks by the binary digits of their count, largest
    /// first, each run summed as a balanced binary tree (left half + right half), the runs
    /// added left to right; then the open (partial) block's sum, if it has values.
    fn reference_sum(values: &[f32]) -> f32 {
        assert_eq!(
            (LANES, BLOCK),
            (8, 128),
            "the reference spells out 8 lanes of 16"
        );
        let block_sum = |block: &[f32]| {
            let mut l = [0.0f32; 8];
            for (k, &v) in block.iter().enumerate() {
                l[k % 8] += v;
            }
            ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
        };
        fn tree(sums: &[f32]) -> f32 {
            match sums {
                [one] => *one,
                _ => tree(&sums[..sums.len() / 2]) + tree(&sums[sums.len() / 2..]),
            }
        }
        let full = values.len() / 128;
        let blocks: Vec<f32> = values.chunks_exact(128).map(block_sum).collect();
        let mut start = 0;
        let mut whole: Option<f32> = None;
        for k in (0..usize::BITS).rev() {
            if full >> k & 1 == 1 {
                let run = tree(&blocks[start..start + (1 << k)]);
                whole = Some(whole.map_or(run, |w| w + run));
                start += 1 << k;
            }
        }
        let rest = &values[full * 128..];
        match whole {
            Some(w) if !rest.is_empty() => w + block_sum(rest),
            Some(w) => w,
            None => block_sum(rest),
        }
    }

    fn value(i: usize) -> f32 {
        1000.0 + (((i as u64 * 2_654_435_761) >> 8) % 65536) as f32 / 32768.0
    }

    #[test]
    fn one_by_one_sums_follow_the_stated_order() {
        for len in [
            0,
            1,
            7,
            8,
            9,
            127,
            128,
            129,
            255,
            256,
            257,
            384,
            128 * 7 + 3,
            // Around the levels held in place (`INLINE_LEVELS`) and past them.
            128 * 63 + 5,
            128 * 64,
            128 * 64 + 1,
            128 * 129 + 7,
            20_000,
        ] {
            let values: Vec<f32> = (0..len).map(|i| value(i * 3 + len) - 1000.5).collect();
            let mut sum = CascadeSum::<f32, 1>::new();
            values.iter().for_each(|&v| sum.add([v]));
            let want = reference_sum(&values);
            assert_eq!(sum.total()[0].to_bits(), want.to_bits(), "length {len}");
            // A run fed at once, and in uneven pieces, adds the same way.
            let mut whole = CascadeSum::<f32, 1>::new();
            whole.add_run(&values, &values, &values, |v, _, _| [v]);
            let mut pieces = CascadeSum::<f32, 1>::new();
            for piece in values.chunks(13) {
                pieces.add_run(piece, piece, piece, |v, _, _| [v]);
            }
            assert_eq!(whole.total()[0].to_bits(), want.to_bits(), "length {len}");
            assert_eq!(pieces.total()[0].to_bits(), want.to_bits(), "length {len}");
        }
    }

    #[test]
    fn long_f32_group_sums_stay_near_an_ulp() {
        // Two interleaved groups of 40000 positive values each: one running total per group is
        // tens of ulps off (a layer_norm over 16384 values with mean 1000 is 17 ulps off where
        // PyTorch's is 0.4); pairwise, a few at most.
        let n = 80_000;
        let values: Vec<f32> = (0..n).map(value).collect();
        let [sums] = group_sums(
            IndexMap { div: 1, modulo: 2 },
            2,
            &values,
            &values,
            [],
            |v, _, []| [v],
        );
        for (g, &got) in sums.iter().enumerate() {
            let exact: f64 = (g..n).step_by(2).map(|i| f64::from(value(i))).sum();
            let ulps = (f64::from(got) - exact).abs() / (exact * f64::from(f32::EPSILON));
            assert!(ulps <= 4.0, "group {g}: {got} vs {exact} ({ulps} ulps)");
        }
    }

    #[test]
    fn group_walks_add_each_group_in_flat_order() {
        // Runs of several elements per group add in the same order as one element at a time,
        // and that is the stated order of each group's values. Rows of a map with div 1 (whole
        // rows: fed row by row; a partial row: one by one) too; two sums in one walk are each
        // what one walk gives; maps see each element's group.
        for (div, modulo, n) in [
            (3, 2, 1000),
            (5, 3, 997),
            (40, 2, 5000),
            (200, 3, 200 * 7),
            (64, 7, 64 * 9 + 5),
            (1, 9, 9 * 100),
            (1, 9, 9 * 300),
            (1, 9, 9 * 100 + 4),
            (1, 1, 77),
            (1, 1, 1000),
        ] {
            let map = IndexMap { div, modulo };
            let xs: Vec<f32> = (0..n).map(|i| value(i) - 1000.5).collect();
            let ys: Vec<f32> = (0..n).map(|i| value(i + 7) - 1000.0).collect();
            let scale: Vec<f32> = (0..modulo).map(|g| 1.0 + g as f32 / 8.0).collect();
            let term = |x: f32, y: f32, s: f32| [x * s, x * y];
            let mut each = vec![CascadeSum::<f32, 2>::new(); modulo];
            for i in 0..n {
                let g = map.at(i);
                each[g].add(term(xs[i], ys[i], scale[g]));
            }
            let want: Vec<[f32; 2]> = each.iter().map(CascadeSum::total).collect();
            let got = group_sums(map, modulo, &xs, &ys, [&scale], |x, y, [s]| term(x, y, s));
            for m in 0..2 {
                let want_m: Vec<f32> = want.iter().map(|w| w[m]).collect();
                assert_eq!(got[m], want_m, "div {div}, modulo {modulo}, n {n}, sum {m}");
                let stated: Vec<f32> = (0..modulo)
                    .map(|g| {
                        let terms: Vec<f32> = (0..n)
                            .filter(|&i| map.at(i) == g)
                            .map(|i| term(xs[i], ys[i], scale[g])[m])
                            .collect();
                        reference_sum(&terms)
                    })
                    .collect();
                assert_eq!(got[m], stated, "div {div}, modulo {modulo}, n {n}, sum {m}");
            }
            let [alone] = group_sums(map, modulo, &xs, &ys, [], |x, y, []| [x * y]);
            assert_eq!(alone, got[1], "div {div}, modulo {modulo}, n {n}");
            let groups: Vec<f32> = (0..modulo).map(|g| g as f32).collect();
            let mut mapped = vec![0.0; n];
            map_groups(
                map,
                &mut mapped,
                &xs,
                &ys,
                [&scale, &groups],
                |x, y, [s, g]| x * s + y * 1e-3 + g * 10.0,
            );
            let divided: Vec<f32> = (0..n)
                .map(|i| {
                    let g = map.at(i);
                    xs[i] * scale[g] + ys[i] * 1e-3 + g as f32 * 10.0
                })
                .collect();
            assert_eq!(mapped, divided, "div {div}, modulo {modulo}");
        }
        // Exact on small integers whatever the length, block boundaries included.
        for len in [0, 1, 31, 32, 33, 64, 65, 127, 128, 129, 1000] {
            let v: Vec<f64> = (0..len).map(|i| (i % 7) as f64).collect();
            let [s] = group_sums(IndexMap { div: 1, modulo: 1 }, 1, &v, &v, [], |x, _, []| {
                [x]
            });
            let want: f64 = v.iter().sum();
            assert_eq!(s[0], want, "length {len}");
        }
    }
}
