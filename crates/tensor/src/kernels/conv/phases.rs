//! The buffer the direct kernels read: one group's input, zero-padded and split into stride
//! phases (phase `(ry, rx)` holds the padded rows `ry, ry + sh, ...` and columns `rx, rx + sw,
//! ...`), each phase flattened row by row, so that every kernel tap of a run of output positions
//! reads a contiguous run. With unit stride the one phase is the padded image itself.

use super::direct::Flat;
use super::rows;
use super::Conv2dGeometry;
use crate::kernels::alloc::try_zeroed;
use crate::{Error, Result, Scalar};

/// How a group's channels (`channels x in_h x in_w`) are laid out in a buffer: padded by `pad`
/// (top, left), split into the phases of `stride` whose row residues are `rows` and column
/// residues `cols` (the phases some tap reads; the others are left out), each phase a plane of
/// `hq x wq`.
pub(super) struct Phases {
    channels: usize,
    stride: [usize; 2],
    pad: [usize; 2],
    in_h: usize,
    in_w: usize,
    rows: Vec<usize>,
    cols: Vec<usize>,
    /// Per column phase: the phase columns `first..end` that hold input columns, and the input
    /// column at `first` (fixed by the layout, so worked out once, not per image).
    col_runs: Vec<(usize, usize, usize)>,
    wq: usize,
    plane: usize,
    /// Elements per channel: one plane per phase.
    channel: usize,
    /// Elements of the planes of every channel.
    planes: usize,
}

fn too_big(what: impl std::fmt::Display) -> Error {
    Error::invalid("conv2d", format!("{what} has too many elements"))
}

impl Phases {
    /// The layout of `channels` channels of `in_hw` elements, padded by `pad` and split by
    /// `stride` into the phases of residues `rows` x `cols`, each a plane of `hq_wq`. Every
    /// padded position of those residues below `hq * stride` rows and `wq * stride` columns
    /// must be in its plane: `hq_wq` is at least the padded size divided by the stride, rounded up.
    pub(super) fn new(
        channels: usize,
        in_hw: [usize; 2],
        pad: [usize; 2],
        stride: [usize; 2],
        [rows, cols]: [Vec<usize>; 2],
        [hq, wq]: [usize; 2],
    ) -> Result<Phases> {
        let what = || format!("a padded copy of {channels} x {in_hw:?} in planes of {hq} x {wq}");
        let plane = hq.checked_mul(wq).ok_or_else(|| too_big(what()))?;
        let channel = plane
            .checked_mul(rows.len() * cols.len())
            .ok_or_else(|| too_big(what()))?;
        let planes = channel
            .checked_mul(channels)
            .ok_or_else(|| too_big(what()))?;
        let [sw, pw] = [stride[1], pad[1]];
        let col_runs = cols
            .iter()
            .map(|&rx| {
                let (first, end) = inside(rx, sw, pw, in_hw[1]);
                // An empty run's first position may lie past the padded input (and past usize).
                let ix0 = if first < end { first * sw + rx - pw } else { 0 };
                (first, end, ix0)
            })
            .collect();
        Ok(Phases {
            channels,
            stride,
            pad,
            in_h: in_hw[0],
            in_w: in_hw[1],
            rows,
            cols,
            col_runs,
            wq,
            plane,
            channel,
            planes,
        })
    }

    /// The buffer position of channel `c`, phase slot `(sy, sx)` (indices into `rows` and
    /// `cols`), phase row `qy` and column `qx`.
    pub(super) fn at(&self, c: usize, [sy, sx]: [usize; 2], [qy, qx]: [usize; 2]) -> usize {
        c * self.channel + (sy * self.cols.len() + sx) * self.plane + qy * self.wq + qx
    }

    /// A zeroed buffer of `len` elements (at least the planes; more for the kernels' reach),
    /// whose padding and slack [`Phases::copy_into`] leaves zero for every image.
    pub(super) fn buffer<S: Scalar>(&self, len: usize) -> Result<Vec<S>> {
        try_zeroed("conv2d", len.max(self.planes))
    }

    /// Copies a group's channels `x` (channels x in_h x in_w) into their places in `buf`; every
    /// other element keeps its value (zero). Each phase row is a gather from one input row (a
    /// de-interleave into both column phases at stride 2), compiled for the CPU's vectors.
    pub(super) fn copy_into<S: Scalar>(&self, x: &[S], buf: &mut [S]) {
        rows::vectorised(
            #[inline(always)]
            || self.copy_rows(x, buf),
        )
    }

    #[inline(always)]
    fn copy_rows<S: Scalar>(&self, x: &[S], buf: &mut [S]) {
        let [sh, sw] = self.stride;
        let [ph, pw] = self.pad;
        let in_len = self.in_h * self.in_w;
        if in_len == 0 {
            return;
        }
        let both_of_two = sw == 2 && self.cols == [0, 1];
        for (c, channel) in x.chunks(in_len).enumerate().take(self.channels) {
            for (sy, &ry) in self.rows.iter().enumerate() {
                let (first, end) = inside(ry, sh, ph, self.in_h);
                if first == end {
                    continue;
                }
                let rows_in = first * sh + ry - ph..(end - 1) * sh + ry - ph + 1;
                // One input row per phase row; a stride past the input has one (and the
                // chunk length saturates).
                let input = channel[rows_in.start * self.in_w..rows_in.end * self.in_w]
                    .chunks(sh.saturating_mul(self.in_w));
                if both_of_two {
                    // Both column phases, planes side by side: one pass over each row.
                    let both = &mut buf[self.at(c, [sy, 0], [0, 0])..][..2 * self.plane];
                    let (even, odd) = both.split_at_mut(self.plane);
                    let (even, odd) = (&mut even[first * self.wq..], &mut odd[first * self.wq..]);
                    let planes = even.chunks_mut(self.wq).zip(odd.chunks_mut(self.wq));
                    for (src, (even, odd)) in input.zip(planes) {
                        split_pairs(&src[..self.in_w], pw, even, odd);
                    }
                    continue;
                }
                for (sx, &(q0, q1, ix0)) in self.col_runs.iter().enumerate() {
                    if q0 == q1 {
                        continue;
                    }
                    let plane = &mut buf[self.at(c, [sy, sx], [first, 0])..]
                        [..self.plane - first * self.wq];
                    for (src, dst) in input.clone().zip(plane.chunks_mut(self.wq)) {
                        rows::gather(&src[ix0..], sw, &mut dst[q0..q1]);
                    }
                }
            }
        }
    }
}

/// Input row `src`, whose element `ix` is padded column `ix + pad`, into the even and odd padded
/// columns of stride 2: element `ix` to `even` or `odd` at `(ix + pad) / 2`.
#[inline(always)]
fn split_pairs<S: Copy>(src: &[S], pad: usize, even: &mut [S], odd: &mut [S]) {
    let mut src = src;
    if pad % 2 == 1 {
        if let Some((&first, rest)) = src.split_first() {
            odd[pad / 2] = first;
            src = rest;
        }
    }
    // Now src[0] is an even padded column, pad.div_ceil(2) in phase columns.
    let (q, n) = (pad.div_ceil(2), src.len() / 2);
    rows::deinterleave(
        src,
        &mut even[q..q + src.len().div_ceil(2)],
        &mut odd[q..q + n],
    );
}

/// The phase indices `first..end` of residue `r` (stride `s`) whose padded position `q * s + r`
/// holds an input element: lies in `pad..pad + len`.
pub(super) fn inside(r: usize, s: usize, pad: usize, len: usize) -> (usize, usize) {
    let first = pad.saturating_sub(r).div_ceil(s);
    let end = if pad + len > r {
        (pad + len - 1 - r) / s + 1
    } else {
        0
    };
    (first, end.max(first))
}

/// The forward pass's and weight gradient's view of a geometry: how each group's input is copied
/// and which runs of the copy its taps read. Tap `(c, ky, kx)` of output `(oy, ox)` reads padded
/// row `oy sh + ky dh`, which is row `oy + ky dh / sh` of the row phase `ky dh mod sh` (columns
/// alike): a flat position `oy wq + ox` plus an offset per tap.
pub(super) struct InputRuns {
    pub(super) phases: Phases,
    pub(super) flat: Flat,
}

impl InputRuns {
    /// The layout for `geo`, or `None` when it has no output or no taps.
    pub(super) fn new(geo: &Conv2dGeometry) -> Result<Option<InputRuns>> {
        if geo.out_len() == 0 || geo.col_rows() == 0 {
            return Ok(None);
        }
        let padded = |len: usize, pad: usize| {
            pad.checked_mul(2)
                .and_then(|p| p.checked_add(len))
                .ok_or_else(|| too_big(format!("the padded input of {geo:?}")))
        };
        let hp = padded(geo.in_h, geo.padding[0])?;
        let wp = padded(geo.in_w, geo.padding[1])?;
        let [sh, sw] = geo.stride;
        let [dh, dw] = geo.dilation;
        let [kh, kw] = geo.kernel;
        let rows = residues(kh, dh, sh);
        let cols = residues(kw, dw, sw);
        let phases = Phases::new(
            geo.group_in(),
            [geo.in_h, geo.in_w],
            geo.padding,
            geo.stride,
            [rows, cols],
            [hp.div_ceil(sh), wp.div_ceil(sw)],
        )?;
        // Every tap's residue is among the kept ones (`residues` lists exactly those).
        let slot = |residues: &[usize], r: usize| {
            residues.iter().position(|&v| v == r).ok_or_else(|| {
                Error::invalid("conv2d", format!("no stride phase {r} kept for {geo:?}"))
            })
        };
        let mut offsets = Vec::with_capacity(geo.col_rows());
        for c in 0..geo.group_in() {
            for ky in 0..kh {
                for kx in 0..kw {
                    let (y, x) = (ky * dh, kx * dw);
                    let sy = slot(&phases.rows, y % sh)?;
                    let sx = slot(&phases.cols, x % sw)?;
                    offsets.push(phases.at(c, [sy, sx], [y / sh, x / sw]));
                }
            }
        }
        // The taps of the last output read padded rows up to `hp - 1`, rows `(hp - 1) / sh` of
        // their phase at most: inside the `hp.div_ceil(sh)` rows of a plane (columns alike).
        let flat = Flat::new(phases.wq, [geo.out_h, geo.out_w], offsets)?;
        Ok(Some(InputRuns { phases, flat }))
    }

    /// A zeroed buffer for [`Phases::copy_into`] that every tap's run fits in.
    pub(super) fn buffer<S: Scalar>(&self) -> Result<Vec<S>> {
        self.phases.buffer(self.flat.reach())
    }
}

/// The residues modulo `stride` of the kernel offsets `k * dilation`, `k < kernel`, ascending.
fn residues(kernel: usize, dilation: usize, stride: usize) -> Vec<usize> {
    let mut r: Vec<usize> = (0..kernel).map(|k| k * dilation % stride).collect();
    r.sort_unstable();
    r.dedup();
    r
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::random_geometry::random_geometries;
    use super::*;

    /// The definition of [`Phases::copy_into`], one element at a time: every position of every
    /// kept phase whose padded position lies inside the input gets that input element.
    pub(in crate::kernels::conv) fn copy_reference<S: Scalar>(p: &Phases, x: &[S], buf: &mut [S]) {
        let ([sh, sw], [ph, pw]) = (p.stride, p.pad);
        let hq = p.plane / p.wq.max(1);
        for c in 0..p.channels {
            for (sy, &ry) in p.rows.iter().enumerate() {
                for (sx, &rx) in p.cols.iter().enumerate() {
                    for qy in 0..hq {
                        for qx in 0..p.wq {
                            let (py, px) = (qy * sh + ry, qx * sw + rx);
                            if (ph..ph + p.in_h).contains(&py) && (pw..pw + p.in_w).contains(&px) {
                                let i = (c * p.in_h + py - ph) * p.in_w + px - pw;
                                buf[p.at(c, [sy, sx], [qy, qx])] = x[i];
                            }
                        }
                    }
                }
            }
        }
    }

    /// Distinct values `offset + i` (exact in f32 below 2^24), so that any misplaced move shows.
    fn distinct<S: Scalar>(n: usize, offset: f64) -> Vec<S> {
        (0..n).map(|i| S::from_f64(offset + i as f64)).collect()
    }

    fn copies_agree<S: Scalar>(phases: &Phases, len: usize, what: &str) {
        let x = distinct::<S>(phases.channels * phases.in_h * phases.in_w, 1.0);
        // Both buffers start from the same non-zero values: what the copy does not write must
        // keep its value.
        let start = distinct::<S>(len.max(phases.planes), -1e6);
        let (mut fast, mut reference) = (start.clone(), start);
        phases.copy_into(&x, &mut fast);
        copy_reference(phases, &x, &mut reference);
        let bits = |v: &[S]| v.iter().map(|e| e.to_f64().to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fast), bits(&reference), "{what}");
    }

    /// The fast copy (de-interleaves, strided gathers, row copies) moves exactly the elements
    /// its definition does, for the forward pass's phase layouts and the input gradient's
    /// padded output gradient, f32 and f64.
    #[test]
    fn copy_matches_its_definition_on_random_geometries() {
        for geo in random_geometries(300, 0x9e37_79b9_7f4a_7c15) {
            if let Some(runs) = InputRuns::new(&geo).unwrap() {
                let len = runs.flat.reach();
                copies_agree::<f32>(&runs.phases, len, &format!("input of {geo:?}"));
                copies_agree::<f64>(&runs.phases, len, &format!("input of {geo:?}"));
            }
        }
    }
}
