//! 2-D pooling over the last two axes of (N, C, H, W) or (C, H, W) inputs, as PyTorch:
//! `max_pool2d` (the first maximum in row-major window order takes the gradient; NaN wins),
//! `avg_pool2d` (count_include_pad either way, ceil_mode, divisor_override) and
//! `adaptive_avg_pool2d`.

use crate::ops::{Arity, Aux, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use std::sync::Arc;
use tapegrad_tensor::kernels::alloc::try_with_capacity;
use tapegrad_tensor::kernels::conv::Window;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// `F.max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode)`. Padding is -inf.
#[derive(Debug, Clone, PartialEq)]
pub struct MaxPool2d {
    pub kernel_size: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub ceil_mode: bool,
}

impl MaxPool2d {
    /// PyTorch's defaults: stride = kernel_size, no padding, no dilation, floor mode.
    pub fn new(kernel_size: [usize; 2]) -> Self {
        MaxPool2d {
            kernel_size,
            stride: kernel_size,
            padding: [0, 0],
            dilation: [1, 1],
            ceil_mode: false,
        }
    }
}

/// `F.avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad,
/// divisor_override)`. With `divisor_override` every window's sum is divided by it instead of
/// the window size (`count_include_pad` then has no effect); like PyTorch it must be non-zero
/// and may be negative. A window that covers only padding gives 0 whatever the divisor.
#[derive(Debug, Clone, PartialEq)]
pub struct AvgPool2d {
    pub kernel_size: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub ceil_mode: bool,
    pub count_include_pad: bool,
    pub divisor_override: Option<i64>,
}

impl AvgPool2d {
    /// PyTorch's defaults: stride = kernel_size, no padding, floor mode, count_include_pad.
    pub fn new(kernel_size: [usize; 2]) -> Self {
        AvgPool2d {
            kernel_size,
            stride: kernel_size,
            padding: [0, 0],
            ceil_mode: false,
            count_include_pad: true,
            divisor_override: None,
        }
    }
}

/// `F.adaptive_avg_pool2d(input, output_size)`: output cell i averages input rows
/// `floor(i H / oH) .. ceil((i + 1) H / oH)` (likewise for columns).
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveAvgPool2d {
    pub output_size: [usize; 2],
}

/// The input viewed as `planes` images of `h x w`.
#[derive(Debug, Clone, Copy)]
struct Planes {
    planes: usize,
    h: usize,
    w: usize,
}

fn planes(op: &'static str, x: &Shape) -> Result<Planes> {
    let r = x.rank();
    if r != 3 && r != 4 {
        return Err(Error::invalid(
            op,
            format!("expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, found shape {x}"),
        ));
    }
    let (h, w) = (x.dims()[r - 2], x.dims()[r - 1]);
    if h == 0 || w == 0 {
        return Err(Error::invalid(
            op,
            format!("the spatial size of input {x} must be non-zero"),
        ));
    }
    Ok(Planes {
        planes: x.dims()[..r - 2].iter().product(),
        h,
        w,
    })
}

fn pooled_shape(op: &'static str, x: &Shape, out_h: usize, out_w: usize) -> Result<Shape> {
    let mut dims = x.dims().to_vec();
    let r = dims.len();
    dims[r - 2] = out_h;
    dims[r - 1] = out_w;
    // The output size comes from attributes, so a shape that cannot exist names the op.
    Shape::new(dims).map_err(|e| Error::invalid(op, format!("output {e} (input {x})")))
}

/// PyTorch rejects padding beyond half the kernel: such windows could see only padding.
fn check_padding(op: &'static str, kernel: [usize; 2], padding: [usize; 2]) -> Result<()> {
    if padding[0] > kernel[0] / 2 || padding[1] > kernel[1] / 2 {
        return Err(Error::invalid(
            op,
            format!("padding {padding:?} must be at most half of kernel_size {kernel:?}"),
        ));
    }
    Ok(())
}

/// The valid input positions of window `o` along one axis, `first + k * dilation` for `k` in
/// `0..count`, as `(first, count)`: the positions `start + k * dilation` that land in `0..len`,
/// found arithmetically so that a huge kernel costs nothing extra (`count` 0: none, and `first`
/// means nothing). `Window::count` keeps every position within `isize`.
fn window_run(win: &Window, o: usize, len: usize) -> (usize, usize) {
    let start = (o * win.stride) as isize - win.padding as isize;
    let d = win.dilation;
    let first = if start < 0 {
        start.unsigned_abs().div_ceil(d)
    } else {
        0
    };
    let room = len as isize - start;
    let end = if room <= 0 {
        0
    } else {
        (room as usize).div_ceil(d).min(win.kernel)
    };
    if end <= first {
        return (0, 0);
    }
    ((start + (first * d) as isize) as usize, end - first)
}

/// The windows that reach into the padding on either side (the others lie inside the input and
/// are never empty): few, however long the axis.
fn edge_windows(win: &Window, out: usize, len: usize) -> impl Iterator<Item = usize> {
    // Window o starts at o * stride - padding and ends at that plus span (at most the padded
    // length, which fits in isize).
    let span = win.dilation * (win.kernel - 1) + 1;
    let inside_from = win.padding.div_ceil(win.stride).min(out);
    let inside_to = match (len + win.padding).checked_sub(span) {
        Some(room) => (room / win.stride + 1).min(out),
        None => 0,
    };
    (0..inside_from).chain(inside_to.max(inside_from)..out)
}

impl MaxPool2d {
    fn windows(&self) -> [Window; 2] {
        [0, 1].map(|a| Window {
            kernel: self.kernel_size[a],
            stride: self.stride[a],
            padding: self.padding[a],
            dilation: self.dilation[a],
        })
    }

    fn geometry(&self, x: &Shape) -> Result<(Planes, [usize; 2], Shape)> {
        let op = self.name();
        let p = planes(op, x)?;
        check_padding(op, self.kernel_size, self.padding)?;
        let [wh, ww] = self.windows();
        let with_shape = |e: Error| match e {
            Error::Invalid { op, message } => Error::Invalid {
                op,
                message: format!("{message} (input {x})"),
            },
            other => other,
        };
        let oh = wh
            .count(op, "height", p.h, self.ceil_mode)
            .map_err(with_shape)?;
        let ow = ww
            .count(op, "width", p.w, self.ceil_mode)
            .map_err(with_shape)?;
        // With dilation a window can skip over a small input entirely; its max would be undefined.
        for (win, out, len, axis) in [(wh, oh, p.h, "height"), (ww, ow, p.w, "width")] {
            let mut edges = edge_windows(&win, out, len);
            if let Some(o) = edges.find(|&o| window_run(&win, o, len).1 == 0) {
                return Err(Error::invalid(
                    op,
                    format!("window {o} along {axis} covers only padding (input {x}, {self})"),
                ));
            }
        }
        Ok((p, [oh, ow], pooled_shape(self.name(), x, oh, ow)?))
    }
}

impl OpRules for MaxPool2d {
    fn arity(&self) -> Arity {
        Arity::Exact(1)
    }
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        Ok(self.geometry(inputs[0])?.2)
    }
    /// The VJP needs only the argmax positions, which the forward pass leaves in `Aux::Indices`.
    fn saves(&self) -> Saves {
        Saves::NOTHING
    }
    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        let (p, [oh, ow], shape) = self.geometry(x[0].shape())?;
        let [wh, ww] = self.windows();
        let src = x[0].data();
        let plane = p.h * p.w;
        // Each axis's windows worked out once, not once per output element.
        let rows: Vec<(usize, usize)> = (0..oh).map(|o| window_run(&wh, o, p.h)).collect();
        let cols: Vec<(usize, usize)> = (0..ow).map(|o| window_run(&ww, o, p.w)).collect();
        if shape.numel() > 0 && rows.iter().chain(&cols).any(|&(_, n)| n == 0) {
            return Err(Error::invalid(
                "max_pool2d",
                "empty pooling window (checked by the shape rule)",
            ));
        }
        let (dh, dw) = (wh.dilation, ww.dilation);
        let mut out = Vec::with_capacity(shape.numel());
        let mut argmax = Vec::with_capacity(shape.numel());
        for base in (0..p.planes).map(|i| i * plane) {
            for &(y0, ny) in &rows {
                for &(x0, nx) in &cols {
                    let first = base + y0 * p.w + x0;
                    // A window of one row never steps down a row, and its dilation may be huge.
                    let row_step = if ny > 1 { dh * p.w } else { 0 };
                    let (at, best) = window_max(src, first, [ny, nx], [row_step, dw]);
                    out.push(best);
                    argmax.push(at);
                }
            }
        }
        Ok(Forward {
            value: Tensor::from_shape(shape, out)?,
            aux: Aux::Indices(Arc::new(argmax)),
        })
    }
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let argmax = argmax_of(ctx.aux, cot.numel(), &ctx.input_shapes[0])?;
        let mut dx = vec![S::ZERO; ctx.input_shapes[0].numel()];
        for (&i, &g) in argmax.iter().zip(cot.data()) {
            dx[i] += g;
        }
        Ok(smallvec![Some(Tensor::from_shape(
            ctx.input_shapes[0].clone(),
            dx,
        )?)])
    }
    fn jvp<S: Scalar>(
        &self,
        x: &[&Tensor<S>],
        out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        let argmax = argmax_of(&out.aux, out.value.numel(), x[0].shape())?;
        let data = argmax.iter().map(|&i| t[0].data()[i]).collect();
        Tensor::from_shape(out.value.shape().clone(), data)
    }
}

/// The maximum of `src` over a window of `rows x cols` positions (at least one), `first + ky *
/// row_step + kx * col_step`, and where it is, by PyTorch's rule: a later element replaces the
/// maximum when it is strictly greater or NaN, so the first maximum wins, the last NaN wins, and
/// the first position stands when nothing beats it.
///
/// Without NaN that is a running `v > best` on which both the value and the position are
/// selected, which compiles to a max and a conditional move: no branch for the predictor to miss
/// (after a ReLU, whether the next element is greater is a coin toss). A window holding a NaN is
/// walked again by the rule as written.
#[inline]
fn window_max<S: Scalar>(
    src: &[S],
    first: usize,
    [rows, cols]: [usize; 2],
    [row_step, col_step]: [usize; 2],
) -> (usize, S) {
    let (mut at, mut best) = (first, src[first]);
    let mut nan = false;
    for ky in 0..rows {
        let row = first + ky * row_step;
        for i in (0..cols).map(|kx| row + kx * col_step) {
            let v = src[i];
            nan |= v.is_nan();
            let greater = v > best;
            at = if greater { i } else { at };
            best = if greater { v } else { best };
        }
    }
    if nan {
        (at, best) = (first, src[first]);
        for ky in 0..rows {
            let row = first + ky * row_step;
            for i in (0..cols).map(|kx| row + kx * col_step) {
                let v = src[i];
                if v > best || v.is_nan() {
                    (at, best) = (i, v);
                }
            }
        }
    }
    (at, best)
}

fn argmax_of<'a, S>(aux: &'a Aux<S>, outputs: usize, input: &Shape) -> Result<&'a [usize]> {
    match aux {
        Aux::Indices(ix) if ix.len() == outputs && ix.iter().all(|&i| i < input.numel()) => Ok(ix),
        _ => Err(Error::invalid(
            "max_pool2d",
            format!("the saved argmax positions do not match {outputs} outputs of input {input}"),
        )),
    }
}

/// One averaging window of a plane: its input rows and columns, and what its sum is divided by;
/// `None` for a window that covers only padding (its output is 0 and it passes no gradient).
struct Rect<S> {
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    div: Option<S>,
}

/// The forward of both average pools: each window's sum over its divisor, plane by plane, the
/// windows of a plane given by `rects` in row-major output order.
fn average_rects<S: Scalar, I: Iterator<Item = Rect<S>>>(
    op: &'static str,
    p: Planes,
    x: &Tensor<S>,
    shape: Shape,
    rects: impl Fn() -> I,
) -> Result<Tensor<S>> {
    let src = x.data();
    let mut out = try_with_capacity(op, shape.numel())?;
    // An empty output may still have one huge extent: do not walk its windows.
    if shape.numel() == 0 {
        return Tensor::from_shape(shape, out);
    }
    for base in (0..p.planes).map(|i| i * p.h * p.w) {
        for r in rects() {
            let Some(div) = r.div else {
                out.push(S::ZERO);
                continue;
            };
            let mut acc = S::ZERO;
            for ih in r.rows {
                let row = base + ih * p.w;
                for &v in &src[row + r.cols.start..row + r.cols.end] {
                    acc += v;
                }
            }
            out.push(acc / div);
        }
    }
    Tensor::from_shape(shape, out)
}

/// The adjoint of [`average_rects`]: each window's cotangent over its divisor, added to every
/// input the window covers.
fn spread_rects<S: Scalar, I: Iterator<Item = Rect<S>>>(
    op: &'static str,
    p: Planes,
    cot: &Tensor<S>,
    in_shape: &Shape,
    out_shape: &Shape,
    rects: impl Fn() -> I,
) -> Result<Tensor<S>> {
    let mut dx = vec![S::ZERO; in_shape.numel()];
    if out_shape.numel() == 0 {
        return Tensor::from_shape(in_shape.clone(), dx);
    }
    let mut g = cot.data().iter();
    for base in (0..p.planes).map(|i| i * p.h * p.w) {
        for r in rects() {
            let gv = *g
                .next()
                .ok_or_else(|| Error::invalid(op, "cotangent shorter than the output"))?;
            let Some(div) = r.div else {
                continue;
            };
            let share = gv / div;
            for ih in r.rows {
                let row = base + ih * p.w;
                for d in &mut dx[row + r.cols.start..row + r.cols.end] {
                    *d += share;
                }
            }
        }
    }
    Tensor::from_shape(in_shape.clone(), dx)
}

/// One averaging window along an axis: the clipped input range and PyTorch's divisor extent.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: usize,
    end: usize,
    /// The window's extent including padding (but not past it), for count_include_pad.
    padded_extent: usize,
}

/// The op contract of an average pool given by its windows (`geometry` and `rects`): the op is
/// linear, so its forward map is also its JVP, and its VJP spreads each output's cotangent back
/// over its window with the same divisor. Nothing is saved.
macro_rules! window_average_rules {
    ($op:ty) => {
        impl $op {
            fn pool<S: Scalar>(&self, x: &Tensor<S>) -> Result<Tensor<S>> {
                let (p, axes, shape) = self.geometry(x.shape())?;
                average_rects(self.name(), p, x, shape, || self.rects(axes))
            }
        }

        impl OpRules for $op {
            fn arity(&self) -> Arity {
                Arity::Exact(1)
            }
            fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
                Ok(self.geometry(inputs[0])?.2)
            }
            fn saves(&self) -> Saves {
                Saves::NOTHING
            }
            fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
                Ok(Forward::new(self.pool(x[0])?))
            }
            fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
                let in_shape = &ctx.input_shapes[0];
                let (p, axes, out_shape) = self.geometry(in_shape)?;
                let dx = spread_rects(self.name(), p, cot, in_shape, &out_shape, || {
                    self.rects(axes)
                })?;
                Ok(smallvec![Some(dx)])
            }
            fn jvp<S: Scalar>(
                &self,
                _x: &[&Tensor<S>],
                _out: &Forward<S>,
                t: &[&Tensor<S>],
            ) -> Result<Tensor<S>> {
                self.pool(t[0])
            }
        }
    };
}

/// One axis of an average pool: `out` windows over `len` inputs.
#[derive(Debug, Clone, Copy)]
struct AvgAxis {
    win: Window,
    out: usize,
    len: usize,
}

impl AvgAxis {
    /// Each window's clipped input range and padded extent, computed on the fly.
    fn spans(self) -> impl Iterator<Item = Span> + Clone {
        let AvgAxis { win, out, len } = self;
        (0..out).map(move |o| {
            let start = (o * win.stride) as isize - win.padding as isize;
            // In ceil mode the kernel may reach past the padded input (and its end past isize).
            let end = start
                .saturating_add(win.kernel as isize)
                .min((len + win.padding) as isize);
            let padded_extent = (end - start) as usize;
            let start = start.max(0) as usize;
            let end = (end.max(0) as usize).min(len);
            Span {
                start,
                end: end.max(start),
                padded_extent,
            }
        })
    }
}

impl AvgPool2d {
    fn windows(&self) -> [Window; 2] {
        [0, 1].map(|a| Window {
            kernel: self.kernel_size[a],
            stride: self.stride[a],
            padding: self.padding[a],
            dilation: 1,
        })
    }

    /// Per-axis windows and the output shape.
    fn geometry(&self, x: &Shape) -> Result<(Planes, [AvgAxis; 2], Shape)> {
        let op = self.name();
        if self.divisor_override == Some(0) {
            return Err(Error::invalid(
                op,
                format!("divisor_override must be non-zero, got 0 (input {x})"),
            ));
        }
        let p = planes(op, x)?;
        check_padding(op, self.kernel_size, self.padding)?;
        let [wh, ww] = self.windows();
        let with_shape = |e: Error| match e {
            Error::Invalid { op, message } => Error::Invalid {
                op,
                message: format!("{message} (input {x})"),
            },
            other => other,
        };
        let oh = wh
            .count(op, "height", p.h, self.ceil_mode)
            .map_err(with_shape)?;
        let ow = ww
            .count(op, "width", p.w, self.ceil_mode)
            .map_err(with_shape)?;
        let shape = pooled_shape(self.name(), x, oh, ow)?;
        let axes = [
            AvgAxis {
                win: wh,
                out: oh,
                len: p.h,
            },
            AvgAxis {
                win: ww,
                out: ow,
                len: p.w,
            },
        ];
        Ok((p, axes, shape))
    }

    /// What window `(sh, sw)`'s sum is divided by; `None` for a window that covers only
    /// padding, whose output is 0 (PyTorch skips it before choosing a divisor).
    fn divisor<S: Scalar>(&self, sh: &Span, sw: &Span) -> Option<S> {
        let inside = (sh.end - sh.start) * (sw.end - sw.start);
        if inside == 0 {
            return None;
        }
        Some(match self.divisor_override {
            Some(d) => S::from_f64(d as f64),
            // Each extent fits in isize, their product (huge kernels and padding) may not.
            None if self.count_include_pad => {
                S::from_f64((sh.padded_extent as u128 * sw.padded_extent as u128) as f64)
            }
            None => S::from_usize(inside),
        })
    }

    /// Every window of one plane, row-major, with what its sum is divided by.
    fn rects<S: Scalar>(&self, [hs, ws]: [AvgAxis; 2]) -> impl Iterator<Item = Rect<S>> + '_ {
        hs.spans().flat_map(move |sh| {
            ws.spans().map(move |sw| Rect {
                rows: sh.start..sh.end,
                cols: sw.start..sw.end,
                div: self.divisor(&sh, &sw),
            })
        })
    }
}

window_average_rules!(AvgPool2d);

/// One axis of an adaptive pool: `out` windows over `len` inputs.
#[derive(Debug, Clone, Copy)]
struct AdaptiveAxis {
    len: usize,
    out: usize,
}

impl AdaptiveAxis {
    /// PyTorch's adaptive windows: `floor(i len / out) .. ceil((i + 1) len / out)`, computed on
    /// the fly (an attribute-sized list could be huge even when the output is empty).
    fn spans(self) -> impl Iterator<Item = (usize, usize)> + Clone {
        let (l, o) = (self.len as u128, self.out as u128);
        (0..o).map(move |i| ((i * l / o) as usize, ((i + 1) * l).div_ceil(o) as usize))
    }
}

impl AdaptiveAvgPool2d {
    fn geometry(&self, x: &Shape) -> Result<(Planes, [AdaptiveAxis; 2], Shape)> {
        let p = planes(self.name(), x)?;
        let [oh, ow] = self.output_size;
        let shape = pooled_shape(self.name(), x, oh, ow)?;
        let axes = [
            AdaptiveAxis { len: p.h, out: oh },
            AdaptiveAxis { len: p.w, out: ow },
        ];
        Ok((p, axes, shape))
    }

    /// Every window of one plane, row-major, divided by its size.
    fn rects<S: Scalar>(&self, [hs, ws]: [AdaptiveAxis; 2]) -> impl Iterator<Item = Rect<S>> {
        hs.spans().flat_map(move |(h0, h1)| {
            ws.spans().map(move |(w0, w1)| Rect {
                rows: h0..h1,
                cols: w0..w1,
                div: Some(S::from_usize((h1 - h0) * (w1 - w0))),
            })
        })
    }
}

window_average_rules!(AdaptiveAvgPool2d);

impl std::fmt::Display for MaxPool2d {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "max_pool2d(kernel_size={:?}, stride={:?}, padding={:?}, dilation={:?}, ceil_mode={})",
            self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode
        )
    }
}

impl std::fmt::Display for AvgPool2d {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "avg_pool2d(kernel_size={:?}, stride={:?}, padding={:?}, ceil_mode={}, count_include_pad={}",
            self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad
        )?;
        match self.divisor_override {
            Some(d) => write!(f, ", divisor_override={d})"),
            None => write!(f, ")"),
        }
    }
}

impl std::fmt::Display for AdaptiveAvgPool2d {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "adaptive_avg_pool2d(output_size={:?})", self.output_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With count_include_pad the divisor is the product of two padded extents, each below
    /// isize::MAX but not their product: kernels of 2^40 half in the padding overflowed it.
    #[test]
    fn huge_padded_windows_divide_by_the_exact_product() {
        let op = AvgPool2d {
            kernel_size: [1 << 40, 1 << 40],
            stride: [usize::MAX, usize::MAX],
            padding: [1 << 39, 1 << 39],
            ceil_mode: false,
            count_include_pad: true,
            divisor_override: None,
        };
        let x = Tensor::<f64>::new(&[1, 1, 1], vec![3.0]).unwrap();
        let y = op.forward(&[&x]).unwrap().value;
        // The window runs from -2^39 to min(2^39, 1 + 2^39) along each axis.
        let extent = (1u128 << 40) as f64;
        assert_eq!(y.dims(), &[1, 1, 1]);
        assert_eq!(y.data(), &[3.0 / (extent * extent)]);
    }

    /// PyTorch's ceil mode: a 1x1 input pooled by a 2x2 kernel gives one window, whose
    /// count_include_pad divisor stops at the padded input's end.
    #[test]
    fn ceil_mode_pools_a_kernel_longer_than_the_input() {
        let x = Tensor::<f64>::new(&[1, 1, 1], vec![5.0]).unwrap();
        let max = MaxPool2d {
            ceil_mode: true,
            ..MaxPool2d::new([2, 2])
        };
        assert_eq!(max.forward(&[&x]).unwrap().value.data(), &[5.0]);
        let avg = AvgPool2d {
            ceil_mode: true,
            ..AvgPool2d::new([2, 2])
        };
        let y = avg.forward(&[&x]).unwrap().value;
        assert_eq!((y.dims(), y.data()), (&[1, 1, 1][..], &[5.0][..]));
    }

    /// `window_max` gives the value and position of PyTorch's rule written out (strictly greater
    /// or NaN replaces), bit for bit, on windows mixing ties, signed zeros, infinities and NaNs.
    #[test]
    fn window_max_follows_the_strictly_greater_or_nan_rule() {
        let specials = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            2.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            let len = 1 + (state % 9) as usize;
            let src: Vec<f64> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    specials[(state % 8) as usize]
                })
                .collect();
            let (mut want_at, mut want) = (0, src[0]);
            for (i, &v) in src.iter().enumerate() {
                if v > want || v.is_nan() {
                    (want_at, want) = (i, v);
                }
            }
            let (at, got) = window_max(&src, 0, [1, len], [0, 1]);
            assert_eq!((at, got.to_bits()), (want_at, want.to_bits()), "{src:?}");
        }
    }

    /// A window's run (first position, count) holds exactly the positions `start + k *
    /// dilation`, `k < kernel`, that land inside the input, in order.
    #[test]
    fn window_runs_hold_the_positions_inside_the_input() {
        for len in 1..7 {
            for kernel in 1..5 {
                for stride in 1..4 {
                    for padding in 0..=kernel / 2 {
                        for dilation in 1..4 {
                            let win = Window {
                                kernel,
                                stride,
                                padding,
                                dilation,
                            };
                            let Ok(out) = win.count("t", "h", len, true) else {
                                continue;
                            };
                            for o in 0..out {
                                let start = (o * stride) as isize - padding as isize;
                                let inside: Vec<usize> = (0..kernel)
                                    .map(|k| start + (k * dilation) as isize)
                                    .filter(|&i| 0 <= i && i < len as isize)
                                    .map(|i| i as usize)
                                    .collect();
                                let (first, n) = window_run(&win, o, len);
                                let run: Vec<usize> =
                                    (0..n).map(|k| first + k * dilation).collect();
                                assert_eq!(run, inside, "{win:?} len {len} o {o}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// The edge windows are exactly the windows that reach outside the input, so checking only
    /// them finds an empty window whenever there is one.
    #[test]
    fn edge_windows_cover_every_window_that_leaves_the_input() {
        for len in 1..7 {
            for kernel in 1..5 {
                for stride in 1..4 {
                    for padding in 0..=kernel / 2 {
                        for dilation in 1..4 {
                            let win = Window {
                                kernel,
                                stride,
                                padding,
                                dilation,
                            };
                            let Ok(out) = win.count("t", "h", len, false) else {
                                continue;
                            };
                            let span = dilation * (kernel - 1) + 1;
                            let edges: Vec<usize> = edge_windows(&win, out, len).collect();
                            for o in 0..out {
                                let start = (o * stride) as isize - padding as isize;
                                let outside = start < 0 || start + span as isize > len as isize;
                                assert_eq!(edges.contains(&o), outside, "{win:?} len {len} o {o}");
                            }
                        }
                    }
                }
            }
        }
    }
}
