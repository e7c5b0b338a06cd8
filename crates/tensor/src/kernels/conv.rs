//! 2-D convolution: window-count arithmetic shared with pooling, the geometry of one convolution,
//! the choice between the direct kernels (`direct`, on the padded, phase-split copies of
//! `phases`) and per-sample, per-group GEMMs on im2col/col2im. Conv1d is the same code with a
//! height of 1.

use super::alloc::try_zeroed;
use super::matmul::{num_threads, row_bands, run_jobs, worth_threads};
use crate::{Error, Result, Scalar, Tensor};
use std::ops::Range;

mod direct;
mod grad_phases;
mod phases;
#[cfg(test)]
mod random_geometry;
mod rows;

/// The per-axis window parameters of a sliding-window op (convolution or pooling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
    pub dilation: usize,
}

impl Window {
    /// The extent one window covers: `dilation * (kernel - 1) + 1`, or an error on overflow.
    pub fn span(&self, op: &'static str) -> Result<usize> {
        self.dilation
            .checked_mul(self.kernel.saturating_sub(1))
            .and_then(|v| v.checked_add(1))
            .ok_or_else(|| {
                Error::invalid(
                    op,
                    format!(
                        "kernel size {} with dilation {} is too large",
                        self.kernel, self.dilation
                    ),
                )
            })
    }

    /// Number of windows along an axis of length `input`, PyTorch's `pooling_output_shape`:
    /// `(input + 2 padding - span (+ stride - 1 in ceil mode)) / stride + 1`, floored, where in
    /// ceil mode the last window must start inside the input or its left padding. In ceil mode a
    /// kernel may thus reach past the padded input (PyTorch pools a 1x1 input with kernel 2 and
    /// ceil_mode to 1x1); the span must still fit in `isize`, as the padded extent must.
    pub fn count(
        &self,
        op: &'static str,
        axis: &str,
        input: usize,
        ceil_mode: bool,
    ) -> Result<usize> {
        if self.kernel == 0 || self.stride == 0 || self.dilation == 0 {
            return Err(Error::invalid(
                op,
                format!(
                    "kernel size, stride and dilation must be positive, got kernel {}, stride {}, dilation {} along {axis}",
                    self.kernel, self.stride, self.dilation
                ),
            ));
        }
        let padded = self
            .padding
            .checked_mul(2)
            .and_then(|p| p.checked_add(input))
            // Window positions are computed in isize, so the padded extent must fit there.
            .filter(|&p| p <= isize::MAX as usize)
            .ok_or_else(|| {
                Error::invalid(
                    op,
                    format!("padding {} is too large along {axis}", self.padding),
                )
            })?;
        let span = self.span(op)?;
        // In u128: `padded + stride - 1` overflows usize for huge strides.
        let stride = self.stride as u128;
        let reach = padded as u128 + if ceil_mode { stride - 1 } else { 0 };
        if span as u128 > reach || span > isize::MAX as usize {
            let slack = if ceil_mode {
                format!(" plus stride {} - 1 (ceil_mode)", self.stride)
            } else {
                String::new()
            };
            return Err(Error::invalid(
                op,
                format!(
                    "kernel extent {span} (kernel {}, dilation {}) is larger than the padded input {padded}{slack} (input {input}, padding {}) along {axis}",
                    self.kernel, self.dilation, self.padding
                ),
            ));
        }
        let mut count = (reach - span as u128) / stride + 1;
        // In ceil mode a last window starting in the right padding would see only padding.
        if ceil_mode && (count - 1) * stride >= input as u128 + self.padding as u128 {
            count -= 1;
        }
        if count == 0 {
            return Err(Error::invalid(
                op,
                format!("no window fits an input of {input} along {axis}"),
            ));
        }
        // At most `reach / stride + 1 <= padded + 1`: it fits.
        Ok(count as usize)
    }
}

/// Everything about one 2-D convolution: input (N, C, H, W), weight (O, C / groups, kH, kW),
/// output (N, O, oH, oW).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dGeometry {
    pub batch: usize,
    pub in_channels: usize,
    pub in_h: usize,
    pub in_w: usize,
    pub out_channels: usize,
    pub groups: usize,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub out_h: usize,
    pub out_w: usize,
}

impl Conv2dGeometry {
    /// Validates the parameters and computes the output size. `input` is (N, C, H, W), `weight`
    /// (O, C / groups, kH, kW); errors name `op` and both shapes.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        op: &'static str,
        input: [usize; 4],
        weight: [usize; 4],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Result<Self> {
        let [batch, in_channels, in_h, in_w] = input;
        let [out_channels, group_in, kh, kw] = weight;
        let shapes = || format!("input {input:?}, weight {weight:?}");
        if groups == 0 {
            return Err(Error::invalid(
                op,
                format!("groups must be positive ({})", shapes()),
            ));
        }
        if in_channels % groups != 0 || out_channels % groups != 0 {
            return Err(Error::invalid(
                op,
                format!(
                    "groups {groups} must divide both the input channels {in_channels} and the output channels {out_channels} ({})",
                    shapes()
                ),
            ));
        }
        if group_in != in_channels / groups {
            return Err(Error::invalid(
                op,
                format!(
                    "weight expects {group_in} input channels per group but the input has {in_channels} channels in {groups} group(s) ({})",
                    shapes()
                ),
            ));
        }
        let along = |axis: usize| Window {
            kernel: weight[2 + axis],
            stride: stride[axis],
            padding: padding[axis],
            dilation: dilation[axis],
        };
        let out_h = along(0).count(op, "height", in_h, false)?;
        let out_w = along(1).count(op, "width", in_w, false)?;
        let geo = Conv2dGeometry {
            batch,
            in_channels,
            in_h,
            in_w,
            out_channels,
            groups,
            kernel: [kh, kw],
            stride,
            padding,
            dilation,
            out_h,
            out_w,
        };
        // Every product the methods below form (column buffer, per-channel and per-group sizes,
        // and the three tensors) must fit even where another factor is 0: bounding the product of
        // the non-zero factors of each bounds all its partial products.
        let products: [&[usize]; 6] = [
            &[group_in, kh, kw, out_h, out_w],
            &[batch, in_channels, in_h, in_w],
            &[out_channels, group_in, kh, kw],
            &[batch, out_channels, out_h, out_w],
            &[in_channels / groups, in_h, in_w],
            &[out_channels / groups, out_h, out_w],
        ];
        for dims in products {
            let mut nonzero = dims.iter().filter(|&&d| d != 0);
            if nonzero
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .is_none()
            {
                return Err(Error::invalid(
                    op,
                    format!("sizes {dims:?} have too many elements ({})", shapes()),
                ));
            }
        }
        Ok(geo)
    }

    /// Input channels per group.
    pub fn group_in(&self) -> usize {
        self.in_channels / self.groups
    }

    /// Output channels per group.
    pub fn group_out(&self) -> usize {
        self.out_channels / self.groups
    }

    /// Rows of a group's column matrix: `C / groups * kH * kW`.
    pub fn col_rows(&self) -> usize {
        self.group_in() * self.kernel[0] * self.kernel[1]
    }

    /// Output positions per channel: `oH * oW`.
    pub fn out_len(&self) -> usize {
        self.out_h * self.out_w
    }

    /// Input elements per channel: `H * W`.
    pub fn in_len(&self) -> usize {
        self.in_h * self.in_w
    }

    /// A 1x1 kernel with unit stride and no padding reads the input itself as its column matrix.
    fn is_pointwise(&self) -> bool {
        self.kernel == [1, 1] && self.stride == [1, 1] && self.padding == [0, 0]
    }

    /// Whether the direct kernels (`direct`) run this convolution: not when pointwise, and not for
    /// a strided 1x1 kernel, whose column matrix is a cheap gather of C rows and whose GEMMs beat
    /// the direct kernels (release build, one thread, (32, 64, 28, 28) x 128 1x1 at stride 2:
    /// forward 1.9 against 2.2 ms, input gradient 2.0 against 3.4, weight gradient 1.7 against 2.5).
    fn runs_direct(&self) -> bool {
        // 1x1: only with unit stride and padding (not pointwise). An empty batch has nothing to
        // copy, but the direct kernels' plans and buffers are sized by the image, not the batch
        // (an explicitly padded image may be huge when no sample has one).
        (self.kernel != [1, 1] || (self.stride == [1, 1] && self.padding != [0, 0]))
            && self.batch > 0
            && self.padded_copy_is_modest()
    }

    /// Whether the padded, phase-split copies the direct kernels read (`phases`, `grad_phases`:
    /// about `(len + 2 padding) / stride` positions per axis) stay near the input and output
    /// sizes. Padding far longer than the input, with a dilation or stride that still leaves a
    /// small output, would make them mostly zeros that no tap reads, terabytes for paddings of
    /// 2^40; the GEMM path's column matrix has one row per tap and a column per output instead.
    /// Ordinary convolutions (padding about half the kernel extent) are far inside the bound.
    fn padded_copy_is_modest(&self) -> bool {
        let axes = [
            (self.in_h, self.out_h, self.padding[0], self.stride[0]),
            (self.in_w, self.out_w, self.padding[1], self.stride[1]),
        ];
        axes.iter().all(|&(len, out, pad, stride)| {
            let phased = pad
                .saturating_mul(2)
                .saturating_add(len)
                .div_ceil(stride.max(1));
            phased <= len.saturating_add(out).saturating_mul(4).saturating_add(64)
        })
    }

    fn check_len<S: Scalar>(&self, what: &str, t: &Tensor<S>, expected: usize) -> Result<()> {
        if t.numel() != expected {
            return Err(Error::invalid(
                "conv",
                format!(
                    "{what} of shape {} does not match the convolution geometry {self:?}",
                    t.shape()
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn input_numel(&self) -> usize {
        self.batch * self.in_channels * self.in_len()
    }

    pub(super) fn weight_numel(&self) -> usize {
        self.out_channels * self.col_rows()
    }

    fn output_numel(&self) -> usize {
        self.batch * self.out_channels * self.out_len()
    }

    /// The range of output columns `o` whose input position `o * stride + offset` lies in
    /// `0..len` (offset may be negative).
    fn valid_range(out: usize, len: usize, stride: usize, offset: isize) -> (usize, usize) {
        let lo = if offset < 0 {
            (offset.unsigned_abs()).div_ceil(stride)
        } else {
            0
        };
        let end = len as isize - offset;
        let hi = if end <= 0 {
            0
        } else {
            (end as usize).div_ceil(stride)
        };
        let hi = hi.min(out);
        (lo.min(hi), hi)
    }

    /// Visits every row segment of a group's column matrix: for column row (channel, ki, kj) and
    /// output row `oy`, calls `f(start, valid)` where `start` is the segment's offset in the column
    /// matrix and `valid = Some((lo, hi, src))` says output columns `lo..hi` read input elements
    /// `src + (ox - lo) * stride_w`; every other column of the segment reads padding.
    fn visit_rows(&self, mut f: impl FnMut(usize, Option<(usize, usize, usize)>)) {
        let [kh, kw] = self.kernel;
        let [sh, sw] = self.stride;
        let [ph, pw] = self.padding;
        let [dh, dw] = self.dilation;
        let (ow, l) = (self.out_w, self.out_len());
        for c in 0..self.group_in() {
            for ki in 0..kh {
                for kj in 0..kw {
                    let row = ((c * kh + ki) * kw + kj) * l;
                    let w_off = (kj * dw) as isize - pw as isize;
                    let (lo, hi) = Self::valid_range(ow, self.in_w, sw, w_off);
                    for oy in 0..self.out_h {
                        let ih = (oy * sh + ki * dh) as isize - ph as isize;
                        let start = row + oy * ow;
                        if ih < 0 || ih as usize >= self.in_h || lo == hi {
                            f(start, None);
                        } else {
                            let first = (lo * sw) as isize + w_off;
                            let src = c * self.in_len() + ih as usize * self.in_w + first as usize;
                            f(start, Some((lo, hi, src)));
                        }
                    }
                }
            }
        }
    }

    /// Fills `col` (col_rows x out_len) from one group's input channels `x` (C/groups x H x W).
    fn im2col<S: Scalar>(&self, x: &[S], col: &mut [S]) {
        let (ow, sw) = (self.out_w, self.stride[1]);
        self.visit_rows(|start, valid| {
            let out = &mut col[start..start + ow];
            match valid {
                None => out.fill(S::ZERO),
                Some((lo, hi, src)) => {
                    out[..lo].fill(S::ZERO);
                    out[hi..].fill(S::ZERO);
                    if sw == 1 {
                        out[lo..hi].copy_from_slice(&x[src..src + (hi - lo)]);
                    } else {
                        for (k, o) in out[lo..hi].iter_mut().enumerate() {
                            *o = x[src + k * sw];
                        }
                    }
                }
            }
        });
    }

    /// Adds `col` (col_rows x out_len) back into one group's input gradient `dx` (the adjoint of
    /// `im2col`).
    fn col2im<S: Scalar>(&self, col: &[S], dx: &mut [S]) {
        let sw = self.stride[1];
        self.visit_rows(|start, valid| {
            if let Some((lo, hi, src)) = valid {
                let row = &col[start + lo..start + hi];
                for (k, &g) in row.iter().enumerate() {
                    dx[src + k * sw] += g;
                }
            }
        });
    }
}

/// `y[n, o] = sum_c w[o, c] * x[n, c] (+ b[o])`. Straight from a padded copy of each image, split
/// into stride phases when the stride is not 1 (see `forward_direct`), except for 1x1 kernels
/// that are pointwise (unit stride, no padding: one GEMM per sample and group on the input itself)
/// or strided (one GEMM per sample and group on the column matrix, see `runs_direct`).
pub fn conv2d_forward<S: Scalar>(
    geo: &Conv2dGeometry,
    x: &Tensor<S>,
    weight: &Tensor<S>,
    bias: Option<&Tensor<S>>,
) -> Result<Vec<S>> {
    conv2d_forward_on(geo, x, weight, bias, num_threads())
}

/// [`conv2d_forward`] into `out` (N x O x oH x oW elements), every element of which it sets:
/// `out` may hold anything before (a recycled buffer).
pub fn conv2d_forward_into<S: Scalar>(
    geo: &Conv2dGeometry,
    x: &Tensor<S>,
    weight: &Tensor<S>,
    bias: Option<&Tensor<S>>,
    out: &mut [S],
) -> Result<()> {
    forward_into_on(geo, x, weight, bias, out, num_threads())
}

fn conv2d_forward_on<S: Scalar>(
    geo: &Conv2dGeometry,
    x: &Tensor<S>,
    weight: &Tensor<S>,
    bias: Option<&Tensor<S>>,
    threads: usize,
) -> Result<Vec<S>> {
    let mut out = try_zeroed("conv2d", geo.output_numel())?;
    forward_into_on(geo, x, weight, bias, &mut out, threads)?;
    Ok(out)
}

/// Errors unless `out` has the `expected` number of elements.
fn check_out(geo: &Conv2dGeometry, what: &str, out: &[impl Copy], expected: usize) -> Result<()> {
    if out.len() != expected {
        return Err(Error::invalid(
            "conv",
            format!(
                "{what} buffer of {} elements does not match the convolution geometry {geo:?} ({expected} elements)",
                out.len()
            ),
        ));
    }
    Ok(())
}

/// Runs `f(samples, buffer, gemm_threads)` over bands of whole samples of `buffer` (`per_sample`
/// elements each): one band per thread, each with single-threaded GEMMs, when there are several
/// samples and threads and enough `work`; else one band whose GEMMs get every thread. A sample's
/// result never depends on the band it falls in, so every thread count gives the same bits.
fn over_samples<S: Scalar>(
    buffer: &mut [S],
    per_sample: usize,
    batch: usize,
    threads: usize,
    work: usize,
    f: impl Fn(Range<usize>, &mut [S], usize) -> Result<()> + Sync,
) -> Result<()> {
    // No sample, nothing to write; `f` would still size its column matrix by the image (which
    // an explicit padding may make huge).
    if batch == 0 {
        return Ok(());
    }
    let parts = threads.min(batch);
    if parts <= 1 || per_sample == 0 || !worth_threads(work) {
        return f(0..batch, buffer, threads);
    }
    let per_part = batch.div_ceil(parts);
    let f = &f;
    let jobs = buffer
        .chunks_mut(per_part * per_sample)
        .enumerate()
        .map(|(i, band)| {
            let first = i * per_part;
            Box::new(move || f(first..first + band.len() / per_sample, band, 1)) as Box<_>
        })
        .collect();
    run_jobs(jobs).into_iter().collect()
}

fn forward_into_on<S: Scalar>(
    geo: &Conv2dGeometry,
    x: &Tensor<S>,
    weight: &Tensor<S>,
    bias: Option<&Tensor<S>>,
    out: &mut [S],
    threads: usize,
) -> Result<()> {
    geo.check_len("input", x, geo.input_numel())?;
    geo.check_len("weight", weight, geo.weight_numel())?;
    if let Some(b) = bias {
        geo.check_len("bias", b, geo.out_channels)?;
    }
    check_out(geo, "output", out, geo.output_numel())?;
    if geo.runs_direct() {
        if let Some(runs) = phases::InputRuns::new(geo)? {
            return forward_direct(geo, &runs, x, weight, bias, out, threads);
        }
    }
    forward_gemm(geo, x, weight, bias, out, threads)
}

/// The forward pass as GEMMs on column matrices (or on the input itself when pointwise).
fn forward_gemm<S: Scalar>(
    geo: &Conv2dGeometry,
    x: &Tensor<S>,
    weight: &Tensor<S>,
    bias: Option<&Tensor<S>>,
    out: &mut [S],
    threads: usize,
) -> Result<()> {
    let (rows, l, og) = (geo.col_rows(), geo.out_len(), geo.group_out());
    let group_x = geo.group_in() * geo.in_len();
    let sample_out = geo.out_channels * l;
    let col_len = if geo.is_pointwise() { 0 } else { rows * l };
    let (xd, wd) = (x.data(), weight.data());
    let work = geo.output_numel().saturating_mul(rows);
    over_samples(
        out,
        sample_out,
        geo.batch,
        threads,
        work,
        |samples, band, gemm_threads| {
            let mut col = try_zeroed("conv2d", col_len)?;
            let first = samples.start;
            for n in samples {
                for g in 0..geo.groups {
                    let xs = &xd[(n * geo.groups + g) * group_x..][..group_x];
                    let rhs: &[S] = if geo.is_pointwise() {
                        xs
                    } else {
                        geo.im2col(xs, &mut col);
                        &col
                    };
                    let dst = &mut band[((n - first) * geo.out_channels + g * og) * l..][..og * l];
                    S::gemm(
                        og,
                        l,
                        rows,
                        dst,
                        l,
                        &wd[g * og * rows..],
                        rows,
                        1,
                        rhs,
                        l,
                        1,
                        false,
                        S::ONE,
                        gemm_threads,
                    );
                }
            }
            Ok(())
        },
    )?;
    if let Some(b) = bias {
        for (chunk, &bv) in out.chunks_mut(l.max(1)).zip(b.data().iter().cycle()) {
            for v in chunk {
                *v += bv;
            }
        }
    }
    Ok(())
}

/// The forward pass without a column matrix (see `direct` and `phases`): per image and group, the
/// input is copied into a zero-padded buffer (split into stride phases) and each output is the sum of its taps in order
/// (input channel, kernel row, kernel column), one fused multiply-add each, then `+ bias`.
/// Images are split over threads as in [`over_samples`]; an output never depends on the split.
fn forward_direct<S: Scalar>(
    geo: &Conv2dGeometry,
    runs: &phases::InputRuns,
    x: &Tensor<S>,
    weight: &Tensor<S>,
    bias: Option<&Tensor<S>>,
    out: &mut [S],
    threads: usize,
) -> Result<()> {
    let (taps, l, og) = (geo.col_rows(), geo.out_len(), geo.group_out());
    let group_x = geo.group_in() * geo.in_len();
    let sample_out = geo.out_channels * l;
    let (xd, wd) = (x.data(), weight.data());
    if og == 0 {
        return Ok(());
    }
    let weights: Vec<Vec<S>> = wd
        .chunks(og * taps)
        .map(|w| direct::taps_major(w, og, taps))
        .collect();
    let work = geo.output_numel().saturating_mul(taps);
    over_samples(
        out,
        sample_out,
        geo.batch,
        threads,
        work,
        |samples, band, _| {
            let mut xp = runs.buffer()?;
            let first = samples.start;
            for n in samples {
                for (g, wt) in weights.iter().enumerate() {
                    let xs = &xd[(n * geo.groups + g) * group_x..][..group_x];
                    runs.phases.copy_into(xs, &mut xp);
                    let dst = &mut band[((n - first) * geo.out_channels + g * og) * l..][..og * l];
                    let b = bias.map(|b| &b.data()[g * og..][..og]);
                    direct::forward(&runs.flat, &xp, wt, b, dst);
                }
            }
            Ok(())
        },
    )
}

/// Gradient with respect to the input. With unit stride it is itself a convolution: of the output
/// gradient, padded by `dilation * (kernel - 1) - padding`, with the weight flipped and its channel
/// axes swapped, on the forward pass's path. With a larger stride each stride phase of the input
/// is such a convolution with the taps of its phase (`grad_phases`), when the weight is finite;
/// so is the one phase of a unit stride whose padding exceeds the kernel extent. Otherwise
/// `col2im(W_g^T @ dy_g)` per sample and group.
pub fn conv2d_grad_input<S: Scalar>(
    geo: &Conv2dGeometry,
    grad_out: &Tensor<S>,
    weight: &Tensor<S>,
) -> Result<Vec<S>> {
    conv2d_grad_input_on(geo, grad_out, weight, num_threads())
}

/// [`conv2d_grad_input`] into `dx` (N x C x H x W elements), every element of which it sets:
/// `dx` may hold anything before (a recycled buffer).
pub fn conv2d_grad_input_into<S: Scalar>(
    geo: &Conv2dGeometry,
    grad_out: &Tensor<S>,
    weight: &Tensor<S>,
    dx: &mut [S],
) -> Result<()> {
    grad_input_into_on(geo, grad_out, weight, dx, num_threads())
}

fn conv2d_grad_input_on<S: Scalar>(
    geo: &Conv2dGeometry,
    grad_out: &Tensor<S>,
    weight: &Tensor<S>,
    threads: usize,
) -> Result<Vec<S>> {
    let mut dx = try_zeroed("conv2d", geo.input_numel())?;
    grad_input_into_on(geo, grad_out, weight, &mut dx, threads)?;
    Ok(dx)
}

fn grad_input_into_on<S: Scalar>(
    geo: &Conv2dGeometry,
    grad_out: &Tensor<S>,
    weight: &Tensor<S>,
    dx: &mut [S],
    threads: usize,
) -> Result<()> {
    geo.check_len("output gradient", grad_out, geo.output_numel())?;
    geo.check_len("weight", weight, geo.weight_numel())?;
    check_out(geo, "input gradient", dx, geo.input_numel())?;
    if !geo.is_pointwise() {
        if let Some(full) = geo.transposed() {
            let flipped = geo.flipped_weight(weight)?;
            return forward_into_on(&full, grad_out, &flipped, None, dx, threads);
        }
    }
    // A tap reading padding multiplies the weight by zero, which a non-finite weight would turn
    // into NaN where the column matrix adds nothing: such weights keep the column matrix. With
    // unit stride (padding past the kernel extent, so no transposed form) the plan has one phase.
    if geo.runs_direct() && direct::all_finite(weight.data()) {
        if let Some(plan) = grad_phases::GradPhases::new(geo)? {
            return grad_input_phases(geo, &plan, grad_out, weight, dx, threads);
        }
    }
    grad_input_gemm(geo, grad_out, weight, dx, threads)
}

/// The input gradient as `col2im(W_g^T @ dy_g)` (or one GEMM into `dx` when pointwise).
fn grad_input_gemm<S: Scalar>(
    geo: &Conv2dGeometry,
    grad_out: &Tensor<S>,
    weight: &Tensor<S>,
    dx: &mut [S],
    threads: usize,
) -> Result<()> {
    let (rows, l, og) = (geo.col_rows(), geo.out_len(), geo.group_out());
    let group_x = geo.group_in() * geo.in_len();
    let sample_x = geo.in_channels * geo.in_len();
    if !geo.is_pointwise() {
        // col2im adds into dx (a pointwise GEMM overwrites it).
        dx.fill(S::ZERO);
    }
    let col_len = if geo.is_pointwise() { 0 } else { rows * l };
    let (gd, wd) = (grad_out.data(), weight.data());
    let work = geo.output_numel().saturating_mul(rows);
    over_samples(
        dx,
        sample_x,
        geo.batch,
        threads,
        work,
        |samples, band, gemm_threads| {
            let mut col = try_zeroed("conv2d", col_len)?;
            let first = samples.start;
            for n in samples {
                for g in 0..geo.groups {
                    let dy = &gd[(n * geo.out_channels + g * og) * l..][..og * l];
                    let lhs = &wd[g * og * rows..];
                    let dxs = &mut band[((n - first) * geo.groups + g) * group_x..][..group_x];
                    if geo.is_pointwise() {
                        S::gemm(
                            rows,
                            l,
                            og,
                            dxs,
                            l,
                            lhs,
                            1,
                            rows,
                            dy,
                            l,
                            1,
                            false,
                            S::ONE,
                            gemm_threads,
                        );
                    } else {
                        S::gemm(
                            rows,
                            l,
                            og,
                            &mut col,
                            l,
                            lhs,
                            1,
                            rows,
                            dy,
                            l,
                            1,
                            false,
                            S::ONE,
                            gemm_threads,
                        );
                        geo.col2im(&col, dxs);
                    }
                }
            }
            Ok(())
        },
    )
}

/// The strided input gradient without a column matrix (see `grad_phases`): per image and group,
/// the output gradient is copied into a zero-padded buffer and each phase of the input gradient
/// is a forward pass of the direct kernels over it. Images are split over threads as in
/// [`over_samples`]; an element never depends on the split.
fn grad_input_phases<S: Scalar>(
    geo: &Conv2dGeometry,
    plan: &grad_phases::GradPhases,
    grad_out: &Tensor<S>,
    weight: &Tensor<S>,
    dx: &mut [S],
    threads: usize,
) -> Result<()> {
    let (l, og) = (geo.out_len(), geo.group_out());
    let group_x = geo.group_in() * geo.in_len();
    let sample_x = geo.in_channels * geo.in_len();
    let gd = grad_out.data();
    let weights: Vec<Vec<Vec<S>>> = (0..geo.groups)
        .map(|g| plan.weights(weight.data(), g))
        .collect();
    let work = geo.output_numel().saturating_mul(geo.col_rows());
    over_samples(
        dx,
        sample_x,
        geo.batch,
        threads,
        work,
        |samples, band, _| {
            let mut buf = plan.buffer()?;
            let mut tmp = plan.scratch()?;
            let first = samples.start;
            for n in samples {
                for (g, wt) in weights.iter().enumerate() {
                    let dy = &gd[(n * geo.out_channels + g * og) * l..][..og * l];
                    let dxs = &mut band[((n - first) * geo.groups + g) * group_x..][..group_x];
                    plan.run(dy, wt, &mut buf, &mut tmp, dxs);
                }
            }
            Ok(())
        },
    )
}

impl Conv2dGeometry {
    /// The geometry of the input gradient as a forward convolution, when the stride is 1 and the
    /// padding does not exceed the dilated kernel extent (so the new padding is not negative).
    fn transposed(&self) -> Option<Conv2dGeometry> {
        if self.stride != [1, 1] {
            return None;
        }
        let pad = |a: usize| (self.dilation[a] * (self.kernel[a] - 1)).checked_sub(self.padding[a]);
        let padding = [pad(0)?, pad(1)?];
        let full = Conv2dGeometry::new(
            "conv2d",
            [self.batch, self.out_channels, self.out_h, self.out_w],
            [
                self.in_channels,
                self.group_out(),
                self.kernel[0],
                self.kernel[1],
            ],
            [1, 1],
            padding,
            self.dilation,
            self.groups,
        )
        .ok()?;
        (full.out_h == self.in_h && full.out_w == self.in_w).then_some(full)
    }

    /// The weight (O, C/g, kH, kW) as (C, O/g, kH, kW), spatially flipped, group by group.
    /// Flipping both spatial axes reverses each (o, c) block of kH x kW taps.
    fn flipped_weight<S: Scalar>(&self, weight: &Tensor<S>) -> Result<Tensor<S>> {
        let (cg, og, [kh, kw]) = (self.group_in(), self.group_out(), self.kernel);
        let k2 = kh * kw;
        let wd = weight.data();
        let mut flipped = vec![S::ZERO; wd.len()];
        if k2 > 0 {
            // Source block (g, o, c) is block g*og*cg + o*cg + c; it lands at g*cg*og + c*og + o.
            for (src_index, src) in wd.chunks_exact(k2).enumerate() {
                let (g, rest) = (src_index / (og * cg), src_index % (og * cg));
                let (o, c) = (rest / cg, rest % cg);
                let dst_index = (g * cg + c) * og + o;
                let dst = &mut flipped[dst_index * k2..][..k2];
                for (d, &v) in dst.iter_mut().zip(src.iter().rev()) {
                    *d = v;
                }
            }
        }
        Tensor::new(&[self.in_channels, og, kh, kw], flipped)
    }
}

/// Gradient with respect to the weight: `sum_n dy_g @ col_g^T`, accumulated in sample order: with
/// a finite input by the direct kernels (see `grad_weight_direct`), else on column matrices.
/// With several threads each takes a band of output channels through every sample (each
/// rebuilding the column matrix), so every element sums the same terms in the same order as on
/// one thread.
pub fn conv2d_grad_weight<S: Scalar>(
    geo: &Conv2dGeometry,
    grad_out: &Tensor<S>,
    x: &Tensor<S>,
) -> Result<Vec<S>> {
    conv2d_grad_weight_on(geo, grad_out, x, num_threads())
}

fn conv2d_grad_weight_on<S: Scalar>(
    geo: &Conv2dGeometry,
    grad_out: &Tensor<S>,
    x: &Tensor<S>,
    threads: usize,
) -> Result<Vec<S>> {
    geo.check_len("output gradient", grad_out, geo.output_numel())?;
    geo.check_len("input", x, geo.input_numel())?;
    if geo.runs_direct() && direct::all_finite(x.data()) {
        if let Some(runs) = phases::InputRuns::new(geo)? {
            return grad_weight_direct(geo, &runs, grad_out, x, threads);
        }
    }
    grad_weight_gemm(geo, grad_out, x, threads)
}

/// The weight gradient as `sum_n dy_g @ col_g^T` (see [`conv2d_grad_weight`]).
fn grad_weight_gemm<S: Scalar>(
    geo: &Conv2dGeometry,
    grad_out: &Tensor<S>,
    x: &Tensor<S>,
    threads: usize,
) -> Result<Vec<S>> {
    let (rows, l, og) = (geo.col_rows(), geo.out_len(), geo.group_out());
    let group_x = geo.group_in() * geo.in_len();
    let mut dw = try_zeroed("conv2d", geo.weight_numel())?;
    let col_len = if geo.is_pointwise() { 0 } else { rows * l };
    let (gd, xd) = (grad_out.data(), x.data());
    if rows == 0 || og == 0 {
        return Ok(dw);
    }
    for (g, dw_g) in dw.chunks_mut(og * rows).enumerate() {
        // Output channels `first..` of group g, their rows of dw in `dst`.
        let band = |first: usize, dst: &mut [S], gemm_threads: usize| -> Result<()> {
            let band_rows = dst.len() / rows;
            let mut col = try_zeroed("conv2d", col_len)?;
            for n in 0..geo.batch {
                let xs = &xd[(n * geo.groups + g) * group_x..][..group_x];
                let rhs: &[S] = if geo.is_pointwise() {
                    xs
                } else {
                    geo.im2col(xs, &mut col);
                    &col
                };
                let dy = &gd[(n * geo.out_channels + g * og + first) * l..][..band_rows * l];
                S::gemm(
                    band_rows,
                    rows,
                    l,
                    dst,
                    rows,
                    dy,
                    l,
                    1,
                    rhs,
                    1,
                    l,
                    n > 0,
                    S::ONE,
                    gemm_threads,
                );
            }
            Ok(())
        };
        match row_bands(og, rows, l, threads) {
            Some((rows_per_part, _)) if geo.batch > 0 => {
                let band = &band;
                let jobs = dw_g
                    .chunks_mut(rows_per_part * rows)
                    .enumerate()
                    .map(|(i, dst)| Box::new(move || band(i * rows_per_part, dst, 1)) as Box<_>)
                    .collect();
                run_jobs(jobs).into_iter().collect::<Result<()>>()?
            }
            _ => band(0, dw_g, threads)?,
        }
    }
    Ok(dw)
}

/// The weight gradient without a column matrix (see `direct::weight_gradient` for
/// the order of its additions): images in order, each adding its own sums into `dw`. With several
/// threads each takes a band of output channels through every image, so each element sums the
/// same terms in the same order as on one thread.
fn grad_weight_direct<S: Scalar>(
    geo: &Conv2dGeometry,
    runs: &phases::InputRuns,
    grad_out: &Tensor<S>,
    x: &Tensor<S>,
    threads: usize,
) -> Result<Vec<S>> {
    let (taps, l, og) = (geo.col_rows(), geo.out_len(), geo.group_out());
    let group_x = geo.group_in() * geo.in_len();
    let mut dw = try_zeroed("conv2d", geo.weight_numel())?;
    let (gd, xd) = (grad_out.data(), x.data());
    if og == 0 || geo.batch == 0 {
        return Ok(dw);
    }
    for (g, dw_g) in dw.chunks_mut(og * taps).enumerate() {
        // Output channels `first..` of group g, their rows of dw in `dst`.
        let band = |first: usize, dst: &mut [S]| -> Result<()> {
            let band_rows = dst.len() / taps;
            let mut xp = runs.buffer()?;
            let mut dy_flat = try_zeroed("conv2d", runs.flat.flat_rows_len(band_rows)?)?;
            for n in 0..geo.batch {
                runs.phases
                    .copy_into(&xd[(n * geo.groups + g) * group_x..][..group_x], &mut xp);
                let dy = &gd[(n * geo.out_channels + g * og + first) * l..][..band_rows * l];
                direct::weight_gradient(&runs.flat, &xp, dy, &mut dy_flat, dst);
            }
            Ok(())
        };
        match row_bands(og, taps, l.saturating_mul(geo.batch), threads) {
            Some((rows_per_part, _)) => {
                let band = &band;
                let jobs = dw_g
                    .chunks_mut(rows_per_part * taps)
                    .enumerate()
                    .map(|(i, dst)| Box::new(move || band(i * rows_per_part, dst)) as Box<_>)
                    .collect();
                run_jobs(jobs).into_iter().collect::<Result<()>>()?
            }
            None => band(0, dw_g)?,
        }
    }
    Ok(dw)
}

/// Gradient with respect to the bias: the output gradient summed over samples and positions.
/// Each (sample, channel) row of positions is summed as 16 partial sums (partial sum `l` takes
/// positions `l, l + 16, ...` of the whole 16-wide chunks, in order, from zero), folded in halves
/// (`s[l] + s[l + 8]`, then a quarter, ...), then the remaining positions added in order; the rows
/// are added into the channel's gradient in sample order.
pub fn conv2d_grad_bias<S: Scalar>(geo: &Conv2dGeometry, grad_out: &Tensor<S>) -> Result<Vec<S>> {
    geo.check_len("output gradient", grad_out, geo.output_numel())?;
    let l = geo.out_len();
    let mut db = vec![S::ZERO; geo.out_channels];
    if l > 0 {
        for (chunk, o) in grad_out.data().chunks(l).zip((0..geo.out_channels).cycle()) {
            db[o] += row_sum(chunk);
        }
    }
    Ok(db)
}

/// The sum of `v` in the order [`conv2d_grad_bias`] documents: independent partial sums, so
/// that it runs at vector speed instead of one addition's latency per element.
fn row_sum<S: Scalar>(v: &[S]) -> S {
    const LANES: usize = 16;
    let mut acc = [S::ZERO; LANES];
    let mut chunks = v.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    let mut half = LANES / 2;
    while half > 0 {
        for l in 0..half {
            acc[l] += acc[l + half];
        }
        half /= 2;
    }
    chunks.remainder().iter().fold(acc[0], |s, &x| s + x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls `f(output index, input index, weight index)` for every multiply-add of the
    /// convolution's definition that reads inside the input, in row-major order of
    /// (sample, output channel, output row, output column, input channel, kernel row, kernel column).
    fn for_each_tap(geo: &Conv2dGeometry, mut f: impl FnMut(usize, usize, usize)) {
        let (og, cg) = (geo.group_out(), geo.group_in());
        let [kh, kw] = geo.kernel;
        for n in 0..geo.batch {
            for o in 0..geo.out_channels {
                for oy in 0..geo.out_h {
                    for ox in 0..geo.out_w {
                        let yi = ((n * geo.out_channels + o) * geo.out_h + oy) * geo.out_w + ox;
                        for c in 0..cg {
                            for ki in 0..kh {
                                for kj in 0..kw {
                                    let ih = (oy * geo.stride[0] + ki * geo.dilation[0]) as isize
                                        - geo.padding[0] as isize;
                                    let iw = (ox * geo.stride[1] + kj * geo.dilation[1]) as isize
                                        - geo.padding[1] as isize;
                                    if ih < 0
                                        || iw < 0
                                        || ih as usize >= geo.in_h
                                        || iw as usize >= geo.in_w
                                    {
                                        continue;
                                    }
                                    let ch = o / og * cg + c;
                                    let xi = ((n * geo.in_channels + ch) * geo.in_h + ih as usize)
                                        * geo.in_w
                                        + iw as usize;
                                    f(yi, xi, ((o * cg + c) * kh + ki) * kw + kj);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The forward pass from the definition, the obviously correct reference (each output starts
    /// at 0 and adds its taps in order).
    fn naive(geo: &Conv2dGeometry, x: &[f64], w: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; geo.output_numel()];
        for_each_tap(geo, |yi, xi, wi| out[yi] += x[xi] * w[wi]);
        out
    }

    fn values(n: usize, seed: u64) -> Vec<f64> {
        // Small integers keep every product and sum exact, so results compare with ==.
        (0..n)
            .map(|i| (((i as u64 * 7 + seed * 13) % 11) as f64) - 5.0)
            .collect()
    }

    #[test]
    fn gemm_convolution_matches_the_direct_loop() {
        let cases = [
            ([2, 4, 5, 7], [6, 2, 3, 2], [1, 2], [1, 0], [1, 2], 2),
            ([1, 3, 6, 6], [2, 3, 3, 3], [2, 2], [2, 1], [1, 1], 1),
            ([2, 2, 4, 4], [4, 2, 1, 1], [1, 1], [0, 0], [1, 1], 1),
            ([1, 4, 3, 9], [4, 1, 2, 3], [3, 2], [1, 3], [2, 1], 4),
        ];
        for (xs, ws, stride, padding, dilation, groups) in cases {
            let geo =
                Conv2dGeometry::new("conv2d", xs, ws, stride, padding, dilation, groups).unwrap();
            let x = Tensor::new(&xs, values(xs.iter().product(), 1)).unwrap();
            let w = Tensor::new(&ws, values(ws.iter().product(), 2)).unwrap();
            let want = naive(&geo, x.data(), w.data());
            let got = conv2d_forward(&geo, &x, &w, None).unwrap();
            assert_eq!(got, want, "{geo:?}");
            // The column-matrix path, which only pointwise and empty geometries take otherwise.
            let mut got = vec![0.0; geo.output_numel()];
            forward_gemm(&geo, &x, &w, None, &mut got, 2).unwrap();
            assert_eq!(got, want, "im2col, {geo:?}");
        }
    }

    /// The input gradient straight from the definition: each output gradient flows back to every
    /// input element its window read.
    fn naive_grad_input(geo: &Conv2dGeometry, dy: &[f64], w: &[f64]) -> Vec<f64> {
        let mut dx = vec![0.0; geo.input_numel()];
        for_each_tap(geo, |yi, xi, wi| dx[xi] += dy[yi] * w[wi]);
        dx
    }

    #[test]
    fn both_input_gradient_paths_match_the_definition() {
        let cases = [
            // Unit stride: the transposed-convolution path.
            ([2, 4, 5, 7], [6, 2, 3, 2], [1, 1], [1, 0], [1, 2], 2),
            ([1, 3, 6, 6], [2, 3, 3, 3], [1, 1], [2, 1], [1, 1], 1),
            // Padding beyond the kernel extent: one phase; strides 2 and 3: the phases.
            ([1, 2, 4, 4], [3, 2, 1, 2], [1, 1], [1, 1], [1, 1], 1),
            ([1, 4, 7, 9], [4, 1, 2, 3], [2, 3], [1, 1], [2, 1], 4),
        ];
        for (xs, ws, stride, padding, dilation, groups) in cases {
            let geo =
                Conv2dGeometry::new("conv2d", xs, ws, stride, padding, dilation, groups).unwrap();
            let w = Tensor::new(&ws, values(ws.iter().product(), 2)).unwrap();
            let dy = Tensor::new(
                &[xs[0], ws[0], geo.out_h, geo.out_w],
                values(geo.output_numel(), 3),
            )
            .unwrap();
            let want = naive_grad_input(&geo, dy.data(), w.data());
            let got = conv2d_grad_input(&geo, &dy, &w).unwrap();
            assert_eq!(got, want, "{geo:?}");
            let mut got = vec![0.0; geo.input_numel()];
            grad_input_gemm(&geo, &dy, &w, &mut got, 2).unwrap();
            assert_eq!(got, want, "col2im, {geo:?}");
            let x = Tensor::new(&xs, values(geo.input_numel(), 1)).unwrap();
            let got = grad_weight_gemm(&geo, &dy, &x, 2).unwrap();
            assert_eq!(
                got,
                naive_grad_weight(&geo, dy.data(), x.data()),
                "im2col weight gradient, {geo:?}"
            );
        }
    }

    /// The weight gradient from the definition: each output gradient times every input element
    /// its window read.
    fn naive_grad_weight(geo: &Conv2dGeometry, dy: &[f64], x: &[f64]) -> Vec<f64> {
        let mut dw = vec![0.0; geo.weight_numel()];
        for_each_tap(geo, |yi, xi, wi| dw[wi] += dy[yi] * x[xi]);
        dw
    }

    fn bits<S: Scalar>(v: &[S]) -> Vec<u64> {
        v.iter().map(|x| x.to_f64().to_bits()).collect()
    }

    /// Big enough that the forward pass and both gradients split over samples or output channels
    /// (see `over_samples` and `split_for`): every thread count gives the bits of one thread, and
    /// (exact small integers in f64) the definitions' values; f32 with arbitrary values checks
    /// the bits only.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "convolutions of about 10^7 multiply-adds, several times over"
    )]
    fn threads_split_samples_and_channels_without_changing_bits() {
        let cases = [
            // Unit stride (grad input = forward of the transposed geometry), bands of channels.
            ([2, 16, 24, 24], [64, 16, 3, 3], [1, 1], [1, 1], [1, 1], 1),
            // Stride 2 (split into phases), odd batch, groups.
            ([5, 16, 33, 31], [40, 8, 3, 3], [2, 2], [1, 1], [1, 1], 2),
            // Pointwise, batch 3 over 2 threads.
            ([3, 64, 16, 16], [48, 64, 1, 1], [1, 1], [0, 0], [1, 1], 1),
            // Single sample: the GEMM splits instead.
            ([1, 16, 24, 24], [64, 16, 3, 3], [1, 1], [1, 1], [1, 1], 1),
        ];
        for (xs, ws, stride, padding, dilation, groups) in cases {
            let geo =
                Conv2dGeometry::new("conv2d", xs, ws, stride, padding, dilation, groups).unwrap();
            let x = Tensor::new(&xs, values(xs.iter().product(), 1)).unwrap();
            let w = Tensor::new(&ws, values(ws.iter().product(), 2)).unwrap();
            let ys = [xs[0], ws[0], geo.out_h, geo.out_w];
            let dy = Tensor::new(&ys, values(geo.output_numel(), 3)).unwrap();
            let want = (
                naive(&geo, x.data(), w.data()),
                naive_grad_input(&geo, dy.data(), w.data()),
                naive_grad_weight(&geo, dy.data(), x.data()),
            );
            let xf = Tensor::new(
                &xs,
                x.data().iter().map(|v| (v * 0.37).sin() as f32).collect(),
            )
            .unwrap();
            let wf = Tensor::new(
                &ws,
                w.data().iter().map(|v| (v * 0.71).cos() as f32).collect(),
            )
            .unwrap();
            let dyf = Tensor::new(
                &ys,
                dy.data().iter().map(|v| (v * 0.53).sin() as f32).collect(),
            )
            .unwrap();
            let run64 = |t| {
                (
                    conv2d_forward_on(&geo, &x, &w, None, t).unwrap(),
                    conv2d_grad_input_on(&geo, &dy, &w, t).unwrap(),
                    conv2d_grad_weight_on(&geo, &dy, &x, t).unwrap(),
                )
            };
            let run32 = |t| {
                (
                    bits(&conv2d_forward_on(&geo, &xf, &wf, None, t).unwrap()),
                    bits(&conv2d_grad_input_on(&geo, &dyf, &wf, t).unwrap()),
                    bits(&conv2d_grad_weight_on(&geo, &dyf, &xf, t).unwrap()),
                )
            };
            let one32 = run32(1);
            for t in [1, 2, 3] {
                assert_eq!(run64(t), want, "f64, {t} threads, {geo:?}");
                assert!(run32(t) == one32, "f32, {t} threads vs 1, {geo:?}");
            }
        }
    }

    type Case = (
        [usize; 4],
        [usize; 4],
        [usize; 2],
        [usize; 2],
        [usize; 2],
        usize,
    );

    /// Forward (with a bias) and both gradients of `case` against the definitions, in f64 and
    /// in f32 on small integers (exact either way), on each of `threads`, and f32 on arbitrary
    /// values with the bits of one thread on each.
    fn direct_paths_match_the_definition(case: Case, threads: &[usize]) {
        let (xs, ws, stride, padding, dilation, groups) = case;
        let geo = Conv2dGeometry::new("conv2d", xs, ws, stride, padding, dilation, groups).unwrap();
        let x = Tensor::new(&xs, values(xs.iter().product(), 1)).unwrap();
        let w = Tensor::new(&ws, values(ws.iter().product(), 2)).unwrap();
        let b = Tensor::new(&[ws[0]], values(ws[0], 4)).unwrap();
        let ys = [xs[0], ws[0], geo.out_h, geo.out_w];
        let dy = Tensor::new(&ys, values(geo.output_numel(), 3)).unwrap();
        let mut want = naive(&geo, x.data(), w.data());
        for (i, v) in want.iter_mut().enumerate() {
            *v += b.data()[i / geo.out_len() % geo.out_channels];
        }
        let want_dx = naive_grad_input(&geo, dy.data(), w.data());
        let want_dw = naive_grad_weight(&geo, dy.data(), x.data());
        let f32s = |t: &Tensor<f64>, k: f64| {
            Tensor::new(
                t.shape().dims(),
                t.data().iter().map(|v| (v * k).sin() as f32).collect(),
            )
            .unwrap()
        };
        let (xf, wf, bf, dyf) = (
            f32s(&x, 0.37),
            f32s(&w, 0.71),
            f32s(&b, 0.2),
            f32s(&dy, 0.53),
        );
        let run32 = |t| {
            (
                bits(&conv2d_forward_on(&geo, &xf, &wf, Some(&bf), t).unwrap()),
                bits(&conv2d_grad_input_on(&geo, &dyf, &wf, t).unwrap()),
                bits(&conv2d_grad_weight_on(&geo, &dyf, &xf, t).unwrap()),
            )
        };
        let one32 = run32(1);
        // The f32 kernels on the same small integers: exact as well.
        let exact32 = |t: &Tensor<f64>| t.cast::<f32>();
        let (xi, wi, bi, dyi) = (exact32(&x), exact32(&w), exact32(&b), exact32(&dy));
        let as32 = |v: &[f64]| v.iter().map(|&v| v as f32).collect::<Vec<f32>>();
        let got = conv2d_forward_on(&geo, &xi, &wi, Some(&bi), 2).unwrap();
        assert_eq!(got, as32(&want), "f32 forward, {geo:?}");
        let got = conv2d_grad_input_on(&geo, &dyi, &wi, 2).unwrap();
        assert_eq!(got, as32(&want_dx), "f32 input gradient, {geo:?}");
        let got = conv2d_grad_weight_on(&geo, &dyi, &xi, 2).unwrap();
        assert_eq!(got, as32(&want_dw), "f32 weight gradient, {geo:?}");
        for &t in threads {
            let got = conv2d_forward_on(&geo, &x, &w, Some(&b), t).unwrap();
            assert_eq!(got, want, "forward, {t} threads, {geo:?}");
            let got = conv2d_grad_input_on(&geo, &dy, &w, t).unwrap();
            assert_eq!(got, want_dx, "input gradient, {t} threads, {geo:?}");
            let got = conv2d_grad_weight_on(&geo, &dy, &x, t).unwrap();
            assert_eq!(got, want_dw, "weight gradient, {t} threads, {geo:?}");
            assert!(run32(t) == one32, "f32, {t} threads vs 1, {geo:?}");
        }
    }

    /// The unit-stride paths without a column matrix (`direct`): remainder tiles of output
    /// channels (6 = 4 + 1 + 1 per group) and taps (not a multiple of 3), groups, dilation,
    /// padding past the kernel extent (the input gradient then takes `grad_phases`' one phase), a
    /// height-1 image (conv1d), a batch split unevenly over threads; forward with a bias.
    #[test]
    fn unit_stride_paths_match_the_definition_on_every_thread_count() {
        let cases = [
            ([3, 4, 9, 11], [12, 2, 3, 2], [1, 1], [1, 0], [1, 2], 2),
            ([5, 3, 7, 6], [6, 3, 2, 2], [1, 1], [3, 2], [1, 1], 1),
            ([3, 2, 1, 37], [5, 2, 1, 5], [1, 1], [0, 2], [1, 3], 1),
            ([2, 6, 8, 8], [6, 2, 3, 3], [1, 1], [2, 2], [2, 2], 3),
            ([7, 16, 12, 12], [20, 16, 3, 3], [1, 1], [1, 1], [1, 1], 1),
        ];
        for case in cases {
            direct_paths_match_the_definition(case, &[1, 2, 3, 4]);
        }
    }

    /// The strided paths without a column matrix (`phases`, `grad_phases`): strides 2 and 3 and
    /// unequal ones, padding 0, 1, 2 and past the kernel extent, odd sizes, 1x1 (which keeps the
    /// column matrix) and 1x3 (whose odd row phase no tap reads), 3x3, 5x5 and non-square
    /// kernels, dilation (2 with stride 2: every tap in one phase, the other input phases get no
    /// gradient), groups, a height-1 image, outputs narrower than a vector, several batch and
    /// channel counts.
    #[test]
    fn strided_paths_match_the_definition_on_every_thread_count() {
        let cases = [
            ([3, 4, 9, 11], [12, 2, 3, 3], [2, 2], [1, 1], [1, 1], 2),
            ([2, 3, 28, 28], [8, 3, 3, 3], [2, 2], [1, 1], [1, 1], 1),
            ([5, 3, 13, 7], [6, 3, 5, 5], [2, 2], [2, 2], [1, 1], 1),
            ([2, 5, 10, 9], [7, 5, 1, 1], [2, 2], [0, 0], [1, 1], 1),
            ([2, 5, 10, 9], [7, 5, 1, 3], [2, 2], [0, 1], [1, 1], 1),
            ([3, 2, 17, 16], [4, 2, 3, 2], [3, 3], [0, 1], [1, 1], 1),
            ([2, 4, 11, 13], [6, 4, 2, 3], [3, 2], [2, 0], [1, 1], 1),
            ([2, 2, 12, 12], [3, 2, 3, 3], [2, 2], [2, 2], [2, 2], 1),
            ([1, 6, 9, 9], [6, 2, 3, 3], [2, 3], [3, 4], [1, 2], 3),
            ([3, 2, 1, 37], [5, 2, 1, 5], [1, 2], [0, 2], [1, 1], 1),
            ([4, 1, 5, 6], [9, 1, 4, 4], [3, 2], [1, 2], [1, 1], 1),
            ([7, 16, 12, 12], [20, 16, 3, 3], [2, 2], [1, 1], [1, 1], 1),
        ];
        for case in cases {
            direct_paths_match_the_definition(case, &[1, 2, 3, 4]);
        }
    }

    /// Strides past the padded input (one output per axis): the input gradient's plan keeps only
    /// the residues that hold an input position (it once allocated one phase per residue).
    #[test]
    fn strides_longer_than_the_input_match_the_definition() {
        const MAX: usize = usize::MAX;
        const FAR: usize = 1 << 40;
        let cases = [
            ([2, 3, 5, 6], [4, 3, 3, 2], [MAX, FAR], [2, 1], [1, 1], 1),
            ([1, 2, 4, 3], [3, 2, 2, 2], [7, MAX - 1], [1, 0], [2, 1], 1),
            ([2, 4, 6, 5], [4, 2, 3, 3], [1 << 33, 9], [1, 3], [1, 2], 2),
            // Padding as long as the stride: three output rows, two of them all padding.
            ([1, 2, 3, 4], [2, 2, 2, 2], [FAR, 1], [FAR, 1], [1, 1], 1),
        ];
        for case in cases {
            direct_paths_match_the_definition(case, &[1, 2]);
            let (xs, ws, stride, padding, dilation, groups) = case;
            let geo =
                Conv2dGeometry::new("conv2d", xs, ws, stride, padding, dilation, groups).unwrap();
            let plan = grad_phases::GradPhases::new(&geo).unwrap().unwrap();
            let [rows, cols] = plan.axis_residues();
            assert!(rows <= xs[2].min(stride[0]), "{rows} row residues, {geo:?}");
            assert!(
                cols <= xs[3].min(stride[1]),
                "{cols} column residues, {geo:?}"
            );
        }
    }

    /// Padding and dilation far longer than the input with a small output (unit stride too): the
    /// direct kernels' padded copy had about 2^41 positions per row (an allocation error, or
    /// terabytes where memory is overcommitted); such geometries now take the GEMM path, whose
    /// column matrix has one column per output.
    #[test]
    fn huge_padding_with_a_small_output_matches_the_definition() {
        const FAR: usize = 1 << 40;
        let cases = [
            // Taps at -2^40, o + 1 and 2^40 + 2 + o: only the middle one reads the input.
            (
                [1, 1, 1, 4],
                [1, 1, 1, 3],
                [1, 1],
                [0, FAR],
                [1, FAR + 1],
                1,
            ),
            (
                [2, 2, 3, 4],
                [2, 1, 3, 3],
                [1, 3],
                [FAR, FAR],
                [FAR + 1, FAR + 1],
                2,
            ),
            (
                [1, 2, 4, 4],
                [3, 2, 3, 3],
                [2, 1],
                [FAR, 1],
                [FAR + 1, 1],
                1,
            ),
        ];
        for case in cases {
            let (xs, ws, stride, padding, dilation, groups) = case;
            let geo =
                Conv2dGeometry::new("conv2d", xs, ws, stride, padding, dilation, groups).unwrap();
            assert!(!geo.runs_direct(), "{geo:?}");
            direct_paths_match_the_definition(case, &[1, 2]);
        }
    }

    /// An empty batch of huge images (as an explicitly padded input can be): nothing to compute,
    /// and no plan or buffer sized by the image. The input gradient's plan listed 2^41 stride
    /// residues (an allocation abort) and the column matrix of its transposed form had a column
    /// per input position.
    #[test]
    fn an_empty_batch_of_huge_images_allocates_nothing() {
        let len = (1usize << 41) + 3;
        for (stride, out_w) in [(usize::MAX - 1, 1), (1, 3)] {
            let geo = Conv2dGeometry::new(
                "conv2d",
                [0, 1, 1, len],
                [1, 1, 1, 3],
                [1, stride],
                [0, 0],
                [1, 1 << 40],
                1,
            )
            .unwrap();
            assert_eq!((geo.out_h, geo.out_w), (1, out_w));
            let x = Tensor::<f64>::new(&[0, 1, 1, len], vec![]).unwrap();
            let w = Tensor::<f64>::new(&[1, 1, 1, 3], vec![1.0, 2.0, 3.0]).unwrap();
            let dy = Tensor::<f64>::new(&[0, 1, 1, out_w], vec![]).unwrap();
            for t in [1, 2] {
                assert!(conv2d_forward_on(&geo, &x, &w, None, t).unwrap().is_empty());
                assert!(conv2d_grad_input_on(&geo, &dy, &w, t).unwrap().is_empty());
                assert_eq!(conv2d_grad_weight_on(&geo, &dy, &x, t).unwrap(), [0.0; 3]);
            }
        }
    }

    /// Random geometries (a fixed sequence): strides 1 to 3, padding 0 to 2, kernels 1 to 5 per
    /// side, dilation 1 or 2, groups, sizes from the kernel extent up.
    #[test]
    #[cfg_attr(miri, ignore = "a hundred convolutions")]
    fn random_geometries_match_the_definition() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut draw = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let mut tried = 0;
        while tried < 100 {
            let groups = 1 + draw(2);
            let (cg, og) = (1 + draw(3), 1 + draw(7));
            let kernel = [1 + draw(5), 1 + draw(5)];
            let stride = [1 + draw(3), 1 + draw(3)];
            let padding = [draw(3), draw(3)];
            let dilation = [1 + draw(2), 1 + draw(2)];
            let extent = |a: usize| dilation[a] * (kernel[a] - 1) + 1;
            let h = extent(0).saturating_sub(2 * padding[0]).max(1) + draw(12);
            let w = extent(1).saturating_sub(2 * padding[1]).max(1) + draw(12);
            let case = (
                [1 + draw(3), cg * groups, h, w],
                [og * groups, cg, kernel[0], kernel[1]],
                stride,
                padding,
                dilation,
                groups,
            );
            let (xs, ws, ..) = case;
            if Conv2dGeometry::new("conv2d", xs, ws, stride, padding, dilation, groups).is_err() {
                continue;
            }
            direct_paths_match_the_definition(case, &[1, 3]);
            tried += 1;
        }
    }

    /// An infinite input element gives the weight gradient only the terms that read it: the
    /// positions past each row's end, which the unit-stride path multiplies by a zero output
    /// gradient, must not turn `0 * inf` into NaN, so that path is left for the column matrix.
    #[test]
    fn an_infinite_input_reaches_only_the_taps_that_read_it() {
        let geo = Conv2dGeometry::new(
            "conv2d",
            [2, 2, 5, 6],
            [3, 2, 3, 3],
            [1, 1],
            [1, 1],
            [1, 1],
            1,
        )
        .unwrap();
        let mut xv = values(geo.input_numel(), 1);
        // The last column of a row: tap column 0 (which reads one to the left) never reads it.
        xv[2 * 6 - 1] = f64::INFINITY;
        let x = Tensor::new(&[2, 2, 5, 6], xv).unwrap();
        let dy = Tensor::new(&[2, 3, 5, 6], values(geo.output_numel(), 3)).unwrap();
        let want = naive_grad_weight(&geo, dy.data(), x.data());
        let got = conv2d_grad_weight_on(&geo, &dy, &x, 1).unwrap();
        assert_eq!(canonical(&got), canonical(&want));
        assert!(got[0].is_finite() && got[3 * 3 * 2 - 3].is_finite());
    }

    /// Every NaN as the same NaN (its sign and payload are not the point).
    fn canonical(v: &[f64]) -> Vec<u64> {
        v.iter()
            .map(|x| if x.is_nan() { f64::NAN } else { *x }.to_bits())
            .collect()
    }

    /// Strided, non-finite values reach only the products of the definition: an infinite input
    /// element in the forward pass (direct: its padding reads are finite zeros times finite
    /// weights) and in the weight gradient (left for the column matrix), an infinite weight in
    /// the input gradient (left for col2im: the phases would multiply it by the zero padding of
    /// the output gradient, a NaN where the definition has no term).
    #[test]
    fn strided_non_finite_values_reach_only_the_taps_that_read_them() {
        let (xs, ws) = ([2, 2, 7, 8], [3, 2, 3, 3]);
        let geo = Conv2dGeometry::new("conv2d", xs, ws, [2, 2], [1, 1], [1, 1], 1).unwrap();
        let mut xv = values(geo.input_numel(), 1);
        xv[8 + 7] = f64::INFINITY;
        let x = Tensor::new(&xs, xv).unwrap();
        let mut wv = values(geo.weight_numel(), 2);
        // Tap (0, 0) of output (0, 0) reads the top-left padding.
        wv[0] = f64::NEG_INFINITY;
        let w = Tensor::new(&ws, wv).unwrap();
        let finite_w = Tensor::new(&ws, values(geo.weight_numel(), 2)).unwrap();
        let ys = [2, 3, geo.out_h, geo.out_w];
        let dy = Tensor::new(&ys, values(geo.output_numel(), 3)).unwrap();
        for t in [1, 2] {
            let got = conv2d_forward_on(&geo, &x, &finite_w, None, t).unwrap();
            let want = naive(&geo, x.data(), finite_w.data());
            assert_eq!(canonical(&got), canonical(&want), "forward");
            let got = conv2d_grad_weight_on(&geo, &dy, &x, t).unwrap();
            let want = naive_grad_weight(&geo, dy.data(), x.data());
            assert_eq!(canonical(&got), canonical(&want), "weight gradient");
            let got = conv2d_grad_input_on(&geo, &dy, &w, t).unwrap();
            let want = naive_grad_input(&geo, dy.data(), w.data());
            assert_eq!(canonical(&got), canonical(&want), "input gradient");
            // The first input row's first element is read by taps (1, 1) only.
            assert!(got[0].is_finite(), "input gradient at (0, 0)");
        }
    }

    #[test]
    fn bias_gradient_sums_every_position_of_its_channel() {
        let geo = Conv2dGeometry::new(
            "conv2d",
            [3, 2, 7, 5],
            [4, 2, 1, 1],
            [1, 1],
            [0, 0],
            [1, 1],
            1,
        )
        .unwrap();
        let dy = Tensor::new(&[3, 4, 7, 5], values(geo.output_numel(), 5)).unwrap();
        let mut want = vec![0.0; 4];
        for (i, v) in dy.data().iter().enumerate() {
            want[i / 35 % 4] += v;
        }
        assert_eq!(conv2d_grad_bias(&geo, &dy).unwrap(), want);
    }

    #[test]
    fn window_counts_follow_pytorch() {
        let w = |kernel, stride, padding, dilation| Window {
            kernel,
            stride,
            padding,
            dilation,
        };
        assert_eq!(w(3, 2, 1, 1).count("t", "h", 7, false).unwrap(), 4);
        assert_eq!(w(2, 2, 0, 1).count("t", "h", 5, false).unwrap(), 2);
        assert_eq!(w(2, 2, 0, 1).count("t", "h", 5, true).unwrap(), 3);
        assert_eq!(w(3, 2, 1, 1).count("t", "h", 6, false).unwrap(), 3);
        assert_eq!(w(3, 2, 1, 1).count("t", "h", 6, true).unwrap(), 4);
        // The ceil-mode window that would start in the right padding (at 6 - 1 = 5) is dropped.
        assert_eq!(w(2, 2, 1, 1).count("t", "h", 5, true).unwrap(), 3);
        assert!(w(5, 1, 0, 1).count("t", "h", 4, false).is_err());
        assert!(w(3, 1, usize::MAX, 1).count("t", "h", 4, false).is_err());
        assert!(w(usize::MAX, 1, 0, 2).count("t", "h", 4, false).is_err());
    }

    /// PyTorch's ceil mode adds `stride - 1` before flooring, so a kernel longer than the padded
    /// input still gets a window when the stride covers the difference: `max_pool2d` of a 1x1
    /// input with kernel 2 and ceil_mode is 1x1 (this was rejected as "kernel extent larger than
    /// the padded input").
    #[test]
    fn ceil_mode_windows_may_reach_past_the_padded_input() {
        let w = |kernel, stride, padding| Window {
            kernel,
            stride,
            padding,
            dilation: 1,
        };
        assert_eq!(w(2, 2, 0).count("t", "h", 1, true).unwrap(), 1);
        assert_eq!(w(3, 3, 0).count("t", "h", 1, true).unwrap(), 1);
        assert_eq!(w(3, 2, 0).count("t", "h", 2, true).unwrap(), 1);
        assert_eq!(w(1 << 33, 1 << 33, 5).count("t", "h", 4, true).unwrap(), 1);
        // Not when the stride does not cover it, and never in floor mode.
        assert!(w(3, 1, 0).count("t", "h", 1, true).is_err());
        assert!(w(2, 2, 0).count("t", "h", 1, false).is_err());
        // Huge strides: `padded + stride - 1` is formed without overflow.
        assert_eq!(w(2, usize::MAX, 0).count("t", "h", 1, true).unwrap(), 1);
        assert_eq!(w(1, usize::MAX, 0).count("t", "h", 3, true).unwrap(), 1);
        // The extent must still fit in isize.
        assert!(w(usize::MAX, usize::MAX, 0)
            .count("t", "h", 3, true)
            .is_err());
    }
}
