//! The norms whose statistics groups are consecutive runs that tile the input once (layer
//! norm's rows) in bands of whole groups on the kernels' threads: the statistics, the output and
//! the input gradient band by band, and the weight's and bias's sums over every row as one more
//! job beside them. Every value has the bits of the one-thread walk.

use super::{rstd_of, Grouping};
use tapegrad_tensor::kernels::group_sum::joint::Joint;
use tapegrad_tensor::kernels::group_sum::IndexMap;
use tapegrad_tensor::kernels::par_map::MIN_MAP_PER_THREAD;
use tapegrad_tensor::kernels::{for_each_part, num_threads};
use tapegrad_tensor::Scalar;

/// Band jobs per thread in a VJP, so that the channel sums' job (about a third of the work)
/// and the bands share the threads evenly.
pub(super) const VJP_BANDS_PER_THREAD: usize = 2;

impl Grouping {
    /// Groups per band when `n` elements are worth splitting over the threads and bands of
    /// whole groups are independent: each group a run of `group_len` elements, the groups
    /// tiling the input once, and the channel pattern starting over with every group (so a
    /// band's channels are those of the whole walk). `None` otherwise.
    pub(super) fn groups_per_band(&self, n: usize, bands_per_thread: usize) -> Option<usize> {
        let threads = num_threads().min(n / MIN_MAP_PER_THREAD);
        let tiles_once = self.group_len > 0
            && self.group.div == self.group_len
            && self.group.modulo == self.groups
            && self.groups.checked_mul(self.group_len) == Some(n);
        let period = self.param.div.checked_mul(self.param.modulo)?;
        let channels_restart = period > 0 && self.group_len % period == 0;
        if threads < 2 || self.groups < 2 || !tiles_once || !channels_restart {
            return None;
        }
        Joint::of(self.group, self.param, n)?;
        Some(self.groups.div_ceil(threads * bands_per_thread))
    }

    /// This grouping over `groups` consecutive groups of its own.
    fn band(&self, groups: usize) -> Grouping {
        Grouping {
            groups,
            group: IndexMap {
                div: self.group.div,
                modulo: groups,
            },
            ..*self
        }
    }
}

/// `group_stats_forward`'s statistics and output in bands of `per_band` groups: `(mean, rstd)`
/// per group, the output written into `out`.
pub(super) fn forward<S: Scalar>(
    grouping: &Grouping,
    per_band: usize,
    eps: f64,
    x: &[S],
    [w, b]: [&[S]; 2],
    out: &mut [S],
) -> (Vec<S>, Vec<S>) {
    let (groups, len) = (grouping.groups, per_band * grouping.group_len);
    let mut mean = vec![S::ZERO; groups];
    let mut rstd = vec![S::ZERO; groups];
    let Some(joint) = Joint::of(grouping.group, grouping.param, x.len()) else {
        unreachable!("groups_per_band checked the joint walk");
    };
    let parts: Vec<_> = out
        .chunks_mut(len)
        .zip(x.chunks(len))
        .zip(mean.chunks_mut(per_band))
        .zip(rstd.chunks_mut(per_band))
        .collect();
    for_each_part(parts, |(((out, x), mean), rstd)| {
        let (m, var) = grouping.band(mean.len()).stats(x);
        mean.copy_from_slice(&m);
        rstd.copy_from_slice(&rstd_of(&var, eps));
        joint.map(out, x, x, [mean, rstd], [w, b], super::normalize_one);
    });
    (mean, rstd)
}

/// One job of a banded VJP.
enum VjpJob<'a, S> {
    /// The weight's and the bias's gradient sums over every element.
    Channels(&'a mut Option<[Vec<S>; 2]>),
    /// The input gradient of the groups from `first`, written into `dx`.
    Band { first: usize, dx: &'a mut [S] },
}

/// `Grouping::joint_vjp` in bands of `per_band` groups: the input gradient written into `dx`,
/// and the channel sums `[dw, db]` when `channel_sums` asks for them.
#[allow(clippy::too_many_arguments)]
pub(super) fn vjp<S: Scalar>(
    grouping: &Grouping,
    joint: &Joint,
    per_band: usize,
    x: &[S],
    g: &[S],
    [mean, rstd]: [&[S]; 2],
    w: &[S],
    channel_sums: bool,
    dx: &mut [S],
) -> Option<[Vec<S>; 2]> {
    let (groups, params, group_len) = (grouping.groups, grouping.params, grouping.group_len);
    let mut channels = None;
    let mut jobs = Vec::new();
    if channel_sums {
        jobs.push(VjpJob::Channels(&mut channels));
    }
    let bands = dx.chunks_mut(per_band * group_len).enumerate();
    jobs.extend(bands.map(|(i, dx)| VjpJob::Band {
        first: i * per_band,
        dx,
    }));
    for_each_part(jobs, |job| match job {
        VjpJob::Channels(out) => {
            let stats = [mean, rstd];
            let (_, sums) = joint.sums(groups, params, x, g, stats, w, no_terms, super::by_channel);
            *out = Some(sums);
        }
        VjpJob::Band { first, dx } => {
            let band = grouping.band(dx.len() / group_len);
            let at = first * group_len..first * group_len + dx.len();
            let (x, g) = (&x[at.clone()], &g[at]);
            let stats = [&mean[first..], &rstd[first..]];
            let (by_group, _) = joint.sums(
                band.groups,
                params,
                x,
                g,
                stats,
                w,
                super::by_group,
                no_terms,
            );
            let [a, b] = by_group.map(|sums| band.divided(sums));
            let per_group = [stats[0], stats[1], &a[..], &b[..]];
            joint.map(dx, x, g, per_group, [w], super::input_gradient);
        }
    });
    channels
}

/// No sums: the side of a joint walk a job leaves to another.
fn no_terms<S: Scalar>(_: S, _: S, _: [S; 2], _: S) -> [S; 0] {
    []
}
