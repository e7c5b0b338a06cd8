//! One walk that follows a normalisation's statistics groups and its channels at once, where the
//! layout allows (runs in one group and one channel; rows in one group whose element j is
//! channel j), so that a forward output or a gradient's sums over both take a single pass.

use super::{add_run_pair, totals, CascadeSum, IndexMap, RowCascade};
use crate::Scalar;
use std::ops::Range;

/// The pieces in which elements meet a statistics map and a channel map.
#[derive(Debug, Clone, Copy)]
pub struct Joint {
    group: IndexMap,
    param: IndexMap,
    pieces: Pieces,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Pieces {
    /// Runs of this many elements (the channel map's `div`), each in one group and one channel.
    Runs(usize),
    /// Rows of this many elements (the channel map's `modulo`), each in one group, element j
    /// being channel j.
    Rows(usize),
}

/// The channel of a piece's elements.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Channel {
    One(usize),
    /// Element j is channel j.
    Ascending,
}

impl Joint {
    /// The joint walk of `n` elements under a group map and a channel map, or `None` where no
    /// piece layout serves both (the caller then walks them one after the other).
    pub fn of(group: IndexMap, param: IndexMap, n: usize) -> Option<Joint> {
        let (gd, pd, pm) = (group.div.max(1), param.div.max(1), param.modulo.max(1));
        let pieces = if pd > 1 && gd % pd == 0 {
            // Group boundaries fall on channel-run boundaries.
            Pieces::Runs(pd)
        } else if pd == 1 && pm > 1 && gd % pm == 0 && n % pm == 0 {
            Pieces::Rows(pm)
        } else {
            return None;
        };
        Some(Joint {
            group,
            param,
            pieces,
        })
    }

    /// Calls `f(range, group, channel)` on the pieces of `0..n` in order.
    #[inline(always)]
    fn for_each_piece(&self, n: usize, mut f: impl FnMut(Range<usize>, usize, Channel)) {
        let (gd, gm) = (self.group.div.max(1), self.group.modulo.max(1));
        let (pd, pm) = (self.param.div.max(1), self.param.modulo.max(1));
        match self.pieces {
            Pieces::Runs(len) => {
                for start in (0..n).step_by(len) {
                    let channel = Channel::One((start / pd) % pm);
                    f(start..(start + len).min(n), (start / gd) % gm, channel);
                }
            }
            Pieces::Rows(len) => {
                for start in (0..n).step_by(len) {
                    f(start..start + len, (start / gd) % gm, Channel::Ascending);
                }
            }
        }
    }

    /// `out[i] = f(a[i], b[i], [p[g] for p in per_group], [q[c] for q in per_channel])` with g
    /// and c element i's group and channel, for i in 0..out.len(); `a` and `b` are at least as
    /// long as `out`, `per_group` and `per_channel` at least as long as their map's `modulo`.
    #[allow(clippy::too_many_arguments)]
    pub fn map<S: Scalar, const K: usize, const L: usize>(
        &self,
        out: &mut [S],
        a: &[S],
        b: &[S],
        per_group: [&[S]; K],
        per_channel: [&[S]; L],
        f: impl Fn(S, S, [S; K], [S; L]) -> S,
    ) {
        let n = out.len();
        let (a, b) = (&a[..n], &b[..n]);
        self.for_each_piece(n, |run, g, channel| {
            let (out, a, b) = (&mut out[run.clone()], &a[run.clone()], &b[run]);
            let p = per_group.map(|p| p[g]);
            match channel {
                Channel::One(c) => {
                    let q = per_channel.map(|q| q[c]);
                    for (o, (&x, &y)) in out.iter_mut().zip(a.iter().zip(b)) {
                        *o = f(x, y, p, q);
                    }
                }
                Channel::Ascending => {
                    let len = out.len();
                    let (a, b) = (&a[..len], &b[..len]);
                    let qs = per_channel.map(|q| &q[..len]);
                    for (j, o) in out.iter_mut().enumerate() {
                        *o = f(a[j], b[j], p, qs.map(|q| q[j]));
                    }
                }
            }
        })
    }

    /// Per group, `group_term(a[i], b[i], [p[g] for p in per_group], w[c])` summed over its
    /// elements, and per channel, `channel_term` of the same summed over its elements: each sum
    /// in [`super::group_sums`]'s order and bit for bit what it gives, from one pass over the
    /// data (`groups` and `channels` are the maps' `modulo`; `w` has one value per channel).
    #[allow(clippy::too_many_arguments)]
    pub fn sums<S: Scalar, const K: usize, const MG: usize, const MC: usize>(
        &self,
        groups: usize,
        channels: usize,
        a: &[S],
        b: &[S],
        per_group: [&[S]; K],
        w: &[S],
        group_term: impl Fn(S, S, [S; K], S) -> [S; MG],
        channel_term: impl Fn(S, S, [S; K], S) -> [S; MC],
    ) -> ([Vec<S>; MG], [Vec<S>; MC]) {
        let n = a.len();
        if n == 0 {
            let by_group = std::array::from_fn(|_| vec![S::ZERO; groups]);
            return (by_group, std::array::from_fn(|_| vec![S::ZERO; channels]));
        }
        let b = &b[..n];
        let mut by_group = vec![CascadeSum::<S, MG>::new(); groups];
        match self.pieces {
            Pieces::Runs(_) => {
                let mut by_channel = vec![CascadeSum::<S, MC>::new(); channels];
                self.for_each_piece(n, |run, g, channel| {
                    let Channel::One(c) = channel else {
                        return;
                    };
                    let (a, b, p, wc) = (&a[run.clone()], &b[run], per_group.map(|p| p[g]), w[c]);
                    add_run_pair(
                        &mut by_group[g],
                        &mut by_channel[c],
                        a,
                        b,
                        |x, y| group_term(x, y, p, wc),
                        |x, y| channel_term(x, y, p, wc),
                    );
                });
                (totals(&by_group), totals(&by_channel))
            }
            Pieces::Rows(len) => {
                let mut rows = RowCascade::<S, MC>::new(len);
                let w = &w[..len];
                self.for_each_piece(n, |run, g, _| {
                    let (a, b, p) = (&a[run.clone()], &b[run], per_group.map(|p| p[g]));
                    by_group[g].add_run(a, b, w, |x, y, wc| group_term(x, y, p, wc));
                    rows.add_row(a, b, [w], &|x, y, [wc]| channel_term(x, y, p, wc));
                });
                (totals(&by_group), rows.totals())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{group_sums, map_groups};
    use super::*;

    #[test]
    fn one_walk_gives_what_the_walks_of_each_map_give() {
        let value =
            |i: usize| ((i * 7919 % 1000) as f32 / 250.0 - 2.0) * 1.5f32.powi((i % 5) as i32);
        // (group div, group modulo, channel div, channel modulo, n, the pieces expected)
        for (gd, gm, pd, pm, n, pieces) in [
            (512, 16, 256, 2, 512 * 16, Some(Pieces::Runs(256))), // group_norm
            (24, 4, 3, 8, 24 * 4 * 3, Some(Pieces::Runs(3))), // lanes of groups and channels apart
            (16, 4, 8, 8, 64 * 40, Some(Pieces::Runs(8))),    // together, blocks apart
            (5, 3, 5, 3, 5 * 3 * 4 + 2, Some(Pieces::Runs(5))), // batch_norm, partial run
            (300, 7, 300, 1, 300 * 7, Some(Pieces::Runs(300))), // one channel
            (40, 9, 1, 40, 40 * 9, Some(Pieces::Rows(40))),   // layer_norm
            (40, 3, 1, 40, 40 * 400, Some(Pieces::Rows(40))), // layer_norm, blocks of rows
            (1, 6, 1, 6, 6 * 50, None),                       // batch_norm of (N, C)
            (2, 6, 1, 4, 48, None),                           // group_norm of (N, C)
        ] {
            let (group, param) = (
                IndexMap {
                    div: gd,
                    modulo: gm,
                },
                IndexMap {
                    div: pd,
                    modulo: pm,
                },
            );
            let joint = Joint::of(group, param, n);
            assert_eq!(joint.map(|j| j.pieces), pieces, "{group:?} {param:?}");
            let Some(joint) = joint else { continue };
            let xs: Vec<f32> = (0..n).map(value).collect();
            let ys: Vec<f32> = (0..n).map(|i| value(i * 3 + 1)).collect();
            let means: Vec<f32> = (0..gm).map(|g| g as f32 * 0.25 - 1.0).collect();
            let ws: Vec<f32> = (0..pm).map(|c| 1.0 + c as f32 / 16.0).collect();
            let bs: Vec<f32> = (0..pm).map(|c| c as f32 / 3.0 - 0.5).collect();
            let group_term = |x: f32, y: f32, [m]: [f32; 1], w: f32| [y * w, y * w * (x - m)];
            let channel_term = |x: f32, y: f32, [m]: [f32; 1], _: f32| [y * (x - m), y];
            let (by_group, by_channel) =
                joint.sums(gm, pm, &xs, &ys, [&means], &ws, group_term, channel_term);
            // The same terms, per element, through each map's own walk.
            let at = |map: IndexMap, i: usize| (i / map.div) % map.modulo;
            let wy: Vec<f32> = (0..n).map(|i| ys[i] * ws[at(param, i)]).collect();
            let want_group =
                group_sums(group, gm, &xs, &wy, [&means], |x, v, [m]| [v, v * (x - m)]);
            let centered: Vec<f32> = (0..n).map(|i| xs[i] - means[at(group, i)]).collect();
            let want_channel = group_sums(param, pm, &centered, &ys, [], |d, y, []| [y * d, y]);
            assert_eq!(by_group, want_group, "{group:?} {param:?}");
            assert_eq!(by_channel, want_channel, "{group:?} {param:?}");
            let mut got = vec![0.0; n];
            joint.map(
                &mut got,
                &xs,
                &ys,
                [&means],
                [&ws, &bs],
                |x, y, [m], [w, b]| (x - m) * w + b * y,
            );
            let want: Vec<f32> = (0..n)
                .map(|i| {
                    let (g, c) = (at(group, i), at(param, i));
                    (xs[i] - means[g]) * ws[c] + bs[c] * ys[i]
                })
                .collect();
            assert_eq!(got, want, "{group:?} {param:?}");
            let mut mapped = vec![0.0; n];
            map_groups(group, &mut mapped, &xs, &xs, [&means], |x, _, [m]| x - m);
            assert_eq!(mapped, centered);
        }
    }
}
