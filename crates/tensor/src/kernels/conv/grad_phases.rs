//! The input gradient of a strided convolution without a column matrix. Along one axis, padded
//! input position `R` receives the output gradient at `(R - k d) / s` from each tap `k` with
//! `k d = R (mod s)`: the input positions of one residue modulo the stride (one phase) see only
//! that residue's taps, at unit stride. So each phase is a forward pass of the direct kernels over
//! a zero-padded copy of the output gradient with those taps, then interleaved into the gradient.
//! A unit stride whose padding exceeds the kernel extent (no transposed form) is the one phase.

use super::direct::{self, Flat};
use super::phases::{inside, Phases};
use super::rows;
use super::Conv2dGeometry;
use crate::kernels::alloc::try_zeroed;
use crate::{Result, Scalar};

/// The input positions of one residue along one axis and the taps that reach them.
struct AxisPhase {
    residue: usize,
    /// Phase indices `first..first + count` (padded position `q s + residue`) are input positions.
    first: usize,
    count: usize,
    /// The kernel indices of this residue, descending (so that their reads ascend).
    taps: Vec<usize>,
}

/// The phases of one axis, the zero rows the output gradient needs before its first row (`lead`,
/// the largest `k d / s`), and the phase positions up to which some phase reads.
fn axis_phases(
    kernel: usize,
    dilation: usize,
    stride: usize,
    pad: usize,
    len: usize,
) -> (Vec<AxisPhase>, usize, usize) {
    // Only residues that hold an input position get a phase, ascending: a stride or padding can
    // be any size, but there are at most `len` such residues.
    let pad_residue = pad % stride;
    let mut residues: Vec<usize> = (0..len.min(stride))
        .map(|i| match stride - pad_residue {
            left if i < left => pad_residue + i,
            left => i - left,
        })
        .collect();
    residues.sort_unstable();
    let phases: Vec<AxisPhase> = residues
        .into_iter()
        .map(|residue| {
            let (first, end) = inside(residue, stride, pad, len);
            let taps = (0..kernel)
                .rev()
                .filter(|k| k * dilation % stride == residue)
                .collect();
            AxisPhase {
                residue,
                first,
                count: end - first,
                taps,
            }
        })
        .collect();
    let end = phases.iter().map(|p| p.first + p.count).max().unwrap_or(0);
    (phases, (kernel - 1) * dilation / stride, end)
}

/// One phase of the input gradient: its rows and columns (indices into the axis phases) and the
/// runs its taps read, `None` when no tap reaches it (its gradient is zero).
struct Phase {
    rows: usize,
    cols: usize,
    flat: Option<Flat>,
}

/// The plan of a strided input gradient: the layout of each group's padded output gradient and
/// the phases, each a forward pass whose output channels are the group's input channels and
/// whose taps are `(o, ky, kx)` for the group's output channels `o` and the phase's kernel rows
/// `ky` and columns `kx` (descending), in that order.
pub(super) struct GradPhases {
    geo: Conv2dGeometry,
    dy: Phases,
    rows: Vec<AxisPhase>,
    cols: Vec<AxisPhase>,
    phases: Vec<Phase>,
    /// Elements of the padded output gradient buffer (every phase's reach).
    len: usize,
    /// The most positions per channel of the phases of one row residue together.
    most_row_positions: usize,
}

impl GradPhases {
    /// The plan for `geo`, or `None` when it has no outputs, inputs or taps.
    pub(super) fn new(geo: &Conv2dGeometry) -> Result<Option<GradPhases>> {
        if geo.out_len() == 0 || geo.in_len() == 0 || geo.col_rows() == 0 || geo.group_out() == 0 {
            return Ok(None);
        }
        let [kh, kw] = geo.kernel;
        let [sh, sw] = geo.stride;
        let [dh, dw] = geo.dilation;
        let (rows, lead_y, end_y) = axis_phases(kh, dh, sh, geo.padding[0], geo.in_h);
        let (cols, lead_x, end_x) = axis_phases(kw, dw, sw, geo.padding[1], geo.in_w);
        // Phase row `k` of residue r reads output gradient row `first + k - ky dh / sh`: stored
        // at `lead` rows down, rows up to `lead + end_y - 1` are read, zero past the gradient.
        let plane = [lead_y + geo.out_h.max(end_y), lead_x + geo.out_w.max(end_x)];
        let og = geo.group_out();
        let dy = Phases::new(
            og,
            [geo.out_h, geo.out_w],
            [lead_y, lead_x],
            [1, 1],
            [vec![0], vec![0]],
            plane,
        )?;
        let mut phases = Vec::with_capacity(rows.len() * cols.len());
        let (mut len, mut most_row_positions) = (0, 0);
        for (ri, ry) in rows.iter().enumerate() {
            let mut row_positions = 0;
            for (ci, rx) in cols.iter().enumerate() {
                if ry.count == 0 || rx.count == 0 {
                    continue;
                }
                row_positions += ry.count * rx.count;
                most_row_positions = most_row_positions.max(row_positions);
                let flat = if ry.taps.is_empty() || rx.taps.is_empty() {
                    None
                } else {
                    let mut offsets = Vec::with_capacity(og * ry.taps.len() * rx.taps.len());
                    for o in 0..og {
                        for &ky in &ry.taps {
                            for &kx in &rx.taps {
                                let at = [
                                    ry.first + lead_y - ky * dh / sh,
                                    rx.first + lead_x - kx * dw / sw,
                                ];
                                offsets.push(dy.at(o, [0, 0], at));
                            }
                        }
                    }
                    let flat = Flat::new(plane[1], [ry.count, rx.count], offsets)?;
                    len = len.max(flat.reach());
                    Some(flat)
                };
                phases.push(Phase {
                    rows: ri,
                    cols: ci,
                    flat,
                });
            }
        }
        Ok(Some(GradPhases {
            geo: *geo,
            dy,
            rows,
            cols,
            phases,
            len,
            most_row_positions,
        }))
    }

    /// The residues planned along each axis (tests bound them by the input's extent).
    #[cfg(test)]
    pub(super) fn axis_residues(&self) -> [usize; 2] {
        [self.rows.len(), self.cols.len()]
    }

    /// Group `g`'s weights for each phase (in the order of [`GradPhases::run`]'s `weights`), taps
    /// major: row `t` holds tap `t`'s weights for each of the group's input channels.
    pub(super) fn weights<S: Scalar>(&self, w: &[S], g: usize) -> Vec<Vec<S>> {
        let geo = &self.geo;
        let (og, cg, [kh, kw]) = (geo.group_out(), geo.group_in(), geo.kernel);
        self.phases
            .iter()
            .map(|phase| {
                let (ry, rx) = (&self.rows[phase.rows], &self.cols[phase.cols]);
                let mut wt = Vec::with_capacity(og * ry.taps.len() * rx.taps.len() * cg);
                for o in 0..og {
                    for &ky in &ry.taps {
                        for &kx in &rx.taps {
                            let tap = ((g * og + o) * cg * kh + ky) * kw + kx;
                            wt.extend((0..cg).map(|c| w[tap + c * kh * kw]));
                        }
                    }
                }
                wt
            })
            .collect()
    }

    /// A zeroed buffer for the padded output gradient of one group.
    pub(super) fn buffer<S: Scalar>(&self) -> Result<Vec<S>> {
        self.dy.buffer(self.len)
    }

    /// Scratch for the gradients of the phases of one row residue.
    pub(super) fn scratch<S: Scalar>(&self) -> Result<Vec<S>> {
        try_zeroed(
            "conv2d",
            self.geo.group_in().saturating_mul(self.most_row_positions),
        )
    }

    /// Sets one group's input gradient `dx` (C/groups x H x W) of one image from its output
    /// gradient `dy` (O/groups x oH x oW): element by element, the sum over the taps of its phase
    /// in order of `dy * w`, from zero, one fused multiply-add each (zero for the padding rows
    /// and columns of the copy, which the taps read at the borders). `weights` is
    /// [`GradPhases::weights`] of the group, `buf` [`GradPhases::buffer`], `tmp`
    /// [`GradPhases::scratch`].
    pub(super) fn run<S: Scalar>(
        &self,
        dy: &[S],
        weights: &[Vec<S>],
        buf: &mut [S],
        tmp: &mut [S],
        dx: &mut [S],
    ) {
        let cg = self.geo.group_in();
        self.dy.copy_into(dy, buf);
        // A stride past the kernel's extent leaves phases that no tap reaches (most of them at
        // stride 28 on a 3x3 kernel): their positions are zeroed once here, in one pass, and
        // the phases skipped, instead of a per-phase fill and scatter of a few elements.
        if self.phases.iter().any(|p| p.flat.is_none()) {
            dx[..cg * self.geo.in_len()].fill(S::ZERO);
        }
        // The phases of one row residue (consecutive in `phases`) are computed side by side in
        // `tmp`, then moved into their rows of `dx` together.
        let (mut phases, mut weights) = (self.phases.as_slice(), weights);
        while let Some(lead) = phases.first() {
            let same = phases.iter().take_while(|p| p.rows == lead.rows).count();
            let (row_phases, rest) = phases.split_at(same);
            let (row_weights, rest_weights) = weights.split_at(same.min(weights.len()));
            let mut at = 0;
            for (phase, wt) in row_phases.iter().zip(row_weights) {
                let n = self.rows[phase.rows].count * self.cols[phase.cols].count;
                if let Some(flat) = &phase.flat {
                    direct::forward(flat, buf, wt, None, &mut tmp[at..][..cg * n]);
                }
                at += cg * n;
            }
            if row_phases.iter().any(|p| p.flat.is_some()) {
                rows::vectorised(
                    #[inline(always)]
                    || self.scatter_rows(row_phases, &tmp[..at], dx),
                );
            }
            (phases, weights) = (rest, rest_weights);
        }
    }

    /// Moves the gradients of `row_phases` (phases of one row residue, each `cg` channels of
    /// its rows x columns, one after the other in `tmp`) into their places in `dx`: phase
    /// position `(k, j)` is input row `(first_y + k) sh + residue - pad` (columns alike). At
    /// column stride 2 with both column phases, each input row is one interleave of two rows.
    #[inline(always)]
    fn scatter_rows<S: Scalar>(&self, row_phases: &[Phase], tmp: &[S], dx: &mut [S]) {
        let geo = &self.geo;
        let [sh, sw] = geo.stride;
        let [ph, pw] = geo.padding;
        let (cg, in_len, in_w) = (geo.group_in(), geo.in_len(), geo.in_w);
        let Some(lead) = row_phases.first() else {
            return;
        };
        let ry = &self.rows[lead.rows];
        let iy0 = ry.first * sh + ry.residue - ph;
        let n_y = ry.count;
        // Input rows `sh` apart; a stride past the input leaves one row (the step saturates).
        let row_step = sh.saturating_mul(in_w);
        if let [first, second] = row_phases {
            if sw == 2 && first.flat.is_some() && second.flat.is_some() {
                // Both column phases: the one whose first column is input column 0 gives the
                // even columns, the other the odd ones, each row one interleave.
                let (a, b) = (&self.cols[first.cols], &self.cols[second.cols]);
                let b_at = cg * n_y * a.count;
                let [(even, even_at), (odd, odd_at)] = if a.first * sw + a.residue == pw {
                    [(a.count, 0), (b.count, b_at)]
                } else {
                    [(b.count, b_at), (a.count, 0)]
                };
                for (c, channel) in dx.chunks_mut(in_len).take(cg).enumerate() {
                    let even_rows = tmp[even_at + c * n_y * even..][..n_y * even].chunks(even);
                    let odd_rows = tmp[odd_at + c * n_y * odd..][..n_y * odd].chunks(odd);
                    let dx_rows = channel[iy0 * in_w..].chunks_mut(row_step);
                    for ((e, o), row) in even_rows.zip(odd_rows).zip(dx_rows) {
                        rows::interleave(e, o, &mut row[..in_w]);
                    }
                }
                return;
            }
        }
        let mut at = 0;
        for phase in row_phases {
            let rx = &self.cols[phase.cols];
            if phase.flat.is_none() {
                // Zeroed by `run`; nothing of it is in `tmp`.
                at += cg * n_y * rx.count;
                continue;
            }
            let ix0 = rx.first * sw + rx.residue - pw;
            for (c, channel) in dx.chunks_mut(in_len).take(cg).enumerate() {
                let src_rows = tmp[at + c * n_y * rx.count..][..n_y * rx.count].chunks(rx.count);
                let dx_rows = channel[iy0 * in_w..].chunks_mut(row_step);
                for (src, row) in src_rows.zip(dx_rows) {
                    rows::scatter(src, sw, &mut row[ix0..in_w]);
                }
            }
            at += cg * n_y * rx.count;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::direct::tests::values;
    use super::super::phases::tests::copy_reference;
    use super::super::random_geometry::random_geometries;
    use super::*;

    fn bits<T: Scalar>(v: &[T]) -> Vec<u64> {
        v.iter().map(|x| x.to_f64().to_bits()).collect()
    }

    /// Each phase's forward pass on pulp's one-lane path gives the bits of the dispatched one
    /// (see `direct`'s test of the same name): the phases' taps are another set of offsets.
    fn widths_agree<T: Scalar>(geo: &Conv2dGeometry) {
        let plan = GradPhases::new(geo).unwrap().unwrap();
        let (og, cg) = (geo.group_out(), geo.group_in());
        let mut buf = plan.buffer::<T>().unwrap();
        plan.dy
            .copy_into(&values::<T>(og * geo.out_len(), 1), &mut buf);
        let weights = plan.weights(&values::<T>(geo.weight_numel(), 2), 0);
        let mut phases_run = 0;
        for (phase, wt) in plan.phases.iter().zip(&weights) {
            let Some(flat) = &phase.flat else { continue };
            let n = plan.rows[phase.rows].count * plan.cols[phase.cols].count;
            let mut dispatched = vec![T::ZERO; cg * n];
            direct::forward(flat, &buf, wt, None, &mut dispatched);
            let mut one_lane = vec![T::ZERO; cg * n];
            direct::forward_one_lane(flat, &buf, wt, None, &mut one_lane);
            assert_eq!(bits(&dispatched), bits(&one_lane), "{geo:?}");
            phases_run += 1;
        }
        assert!(phases_run > 1, "{geo:?}");
    }

    #[test]
    fn every_vector_width_gives_the_same_bits() {
        // 7 input channels (a 6-tile and a 1-tile as the phases' output channels), phases of
        // 1 to 9 taps per output channel, rows that leave partial tiles.
        let cases = [
            ([1, 7, 13, 11], [3, 7, 3, 3], [2, 2], [1, 1], [1, 1]),
            ([1, 7, 14, 17], [2, 7, 5, 4], [3, 2], [2, 0], [1, 1]),
        ];
        for (xs, ws, stride, padding, dilation) in cases {
            let geo = Conv2dGeometry::new("conv2d", xs, ws, stride, padding, dilation, 1).unwrap();
            widths_agree::<f32>(&geo);
            widths_agree::<f64>(&geo);
        }
    }

    /// [`GradPhases::run`] by its definition: the output gradient copied element by element,
    /// each phase's forward pass, and each of its positions moved to its input position.
    fn run_reference<T: Scalar>(plan: &GradPhases, dy: &[T], weights: &[Vec<T>], dx: &mut [T]) {
        let geo = &plan.geo;
        let ([sh, sw], [ph, pw]) = (geo.stride, geo.padding);
        let cg = geo.group_in();
        let mut buf = plan.buffer::<T>().unwrap();
        copy_reference(&plan.dy, dy, &mut buf);
        for (phase, wt) in plan.phases.iter().zip(weights) {
            let (ry, rx) = (&plan.rows[phase.rows], &plan.cols[phase.cols]);
            let n = ry.count * rx.count;
            let mut out = vec![T::ZERO; cg * n];
            if let Some(flat) = &phase.flat {
                direct::forward(flat, &buf, wt, None, &mut out);
            }
            for c in 0..cg {
                for k in 0..ry.count {
                    for j in 0..rx.count {
                        let iy = (ry.first + k) * sh + ry.residue - ph;
                        let ix = (rx.first + j) * sw + rx.residue - pw;
                        dx[(c * geo.in_h + iy) * geo.in_w + ix] =
                            out[(c * ry.count + k) * rx.count + j];
                    }
                }
            }
        }
    }

    fn runs_agree<T: Scalar>(geo: &Conv2dGeometry) {
        let Some(plan) = GradPhases::new(geo).unwrap() else {
            return;
        };
        let (og, cg) = (geo.group_out(), geo.group_in());
        // Distinct output gradient values (exact in f32), so a misplaced move shows.
        let dy: Vec<T> = (0..og * geo.out_len())
            .map(|i| T::from_f64(i as f64 + 1.0))
            .collect();
        let weights = plan.weights(&values::<T>(geo.weight_numel(), 2), 0);
        let (mut buf, mut tmp) = (plan.buffer::<T>().unwrap(), plan.scratch::<T>().unwrap());
        // NaN where nothing was written: every element must be set, by both.
        let mut fast = vec![T::from_f64(f64::NAN); cg * geo.in_len()];
        plan.run(&dy, &weights, &mut buf, &mut tmp, &mut fast);
        let mut reference = fast.clone();
        reference.fill(T::from_f64(f64::NAN));
        run_reference(&plan, &dy, &weights, &mut reference);
        assert!(fast.iter().all(|v| !v.to_f64().is_nan()), "{geo:?}");
        assert_eq!(bits(&fast), bits(&reference), "{geo:?}");
    }

    /// The phases' interleaves and strided scatters (and the output gradient's copy) move
    /// exactly what the definition does, every input gradient element once, f32 and f64.
    #[test]
    fn run_matches_its_definition_on_random_geometries() {
        for geo in random_geometries(300, 0x2545_f491_4f6c_dd1d) {
            runs_agree::<f32>(&geo);
            runs_agree::<f64>(&geo);
        }
    }
}
