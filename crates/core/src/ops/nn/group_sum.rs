//! Per-group sums for the normalisations, fed one element at a time in flat order (a group's
//! elements may be interleaved with other groups'), taken pairwise so that the error of a sum of
//! n values grows like log n, not n.

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

    #[inline]
    fn add(&mut self, v: S) {
        self.block += v;
        self.in_block += 1;
        if self.in_block == BLOCK {
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

    /// `at(0), at(1), ...` without a division per element (endless: zip it with the elements).
    pub fn iter(&self) -> GroupIndices {
        GroupIndices {
            group: 0,
            left: self.div.max(1),
            div: self.div.max(1),
            modulo: self.modulo.max(1),
        }
    }
}

/// The groups of consecutive flat indices under an [`IndexMap`], counted, not divided.
pub(super) struct GroupIndices {
    group: usize,
    left: usize,
    div: usize,
    modulo: usize,
}

impl Iterator for GroupIndices {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        let g = self.group;
        self.left -= 1;
        if self.left == 0 {
            self.left = self.div;
            self.group += 1;
            if self.group == self.modulo {
                self.group = 0;
            }
        }
        Some(g)
    }
}

/// `sums[g] += f(i, g)` with `g = group.at(i)` for i in 0..n, pairwise per group. A group holds
/// runs of `div` consecutive elements, so the group is counted once per run, not divided out per
/// element; each group still sees its elements in flat order.
pub(super) fn group_sums<S: Scalar>(
    n: usize,
    groups: usize,
    group: IndexMap,
    f: impl Fn(usize, usize) -> S,
) -> Vec<S> {
    let mut sums = vec![CascadeSum::new(); groups];
    let (div, modulo) = (group.div.max(1), group.modulo.max(1));
    let (mut start, mut g) = (0, 0);
    while start < n {
        let end = start.saturating_add(div).min(n);
        let sum = &mut sums[g];
        for i in start..end {
            sum.add(f(i, g));
        }
        start = end;
        g += 1;
        if g == modulo {
            g = 0;
        }
    }
    sums.iter().map(CascadeSum::total).collect()
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
        for (div, modulo, n) in [
            (3, 2, 1000),
            (5, 3, 997),
            (40, 2, 5000),
            (64, 7, 64 * 9 + 5),
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
            let counted: Vec<usize> = map.iter().take(n).collect();
            let divided: Vec<usize> = (0..n).map(|i| map.at(i)).collect();
            assert_eq!(counted, divided, "div {div}, modulo {modulo}");
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
