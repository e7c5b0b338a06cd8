//! 2-D pooling over the last two axes of (N, C, H, W) or (C, H, W) inputs, as PyTorch:
//! `max_pool2d` (the first maximum in row-major window order takes the gradient; NaN wins),
//! `avg_pool2d` (count_include_pad either way, ceil_mode) and `adaptive_avg_pool2d`.

use crate::ops::{Arity, Aux, Forward, OpRules, Saves, VjpContext};
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

/// `F.avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad)`.
#[derive(Debug, Clone, PartialEq)]
pub struct AvgPool2d {
    pub kernel_size: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub ceil_mode: bool,
    pub count_include_pad: bool,
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
    super::product(op, x.dims())?;
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

fn pooled_shape(x: &Shape, out_h: usize, out_w: usize) -> Result<Shape> {
    let mut dims = x.dims().to_vec();
    let r = dims.len();
    dims[r - 2] = out_h;
    dims[r - 1] = out_w;
    Shape::new(dims)
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

/// The valid input positions of window `o` along one axis: `start + k * dilation` for the `k`
/// that land in `0..len`, found arithmetically so that a huge kernel costs nothing extra.
/// `Window::count` keeps every position within `isize`.
fn window_positions(win: &Window, o: usize, len: usize) -> impl Iterator<Item = usize> {
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
    (first..end.max(first)).map(move |k| (start + (k * d) as isize) as usize)
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
            if let Some(o) = (0..out).find(|&o| window_positions(&win, o, len).next().is_none()) {
                return Err(Error::invalid(
                    op,
                    format!("window {o} along {axis} covers only padding (input {x}, {self})"),
                ));
            }
        }
        Ok((p, [oh, ow], pooled_shape(x, oh, ow)?))
    }
}

impl OpRules for MaxPool2d {
    fn name(&self) -> &'static str {
        "max_pool2d"
    }
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
        let mut out = Vec::with_capacity(shape.numel());
        let mut argmax = Vec::with_capacity(shape.numel());
        for base in (0..p.planes).map(|i| i * plane) {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut best: Option<(usize, S)> = None;
                    for ih in window_positions(&wh, oy, p.h) {
                        for iw in window_positions(&ww, ox, p.w) {
                            let i = base + ih * p.w + iw;
                            let v = src[i];
                            // PyTorch's rule: strictly greater (so the first maximum wins) or NaN;
                            // the first position is the default even when it is -inf.
                            match best {
                                Some((_, m)) if !(v > m || v.is_nan()) => {}
                                _ => best = Some((i, v)),
                            }
                        }
                    }
                    let (i, v) = best.ok_or_else(|| {
                        Error::invalid(
                            "max_pool2d",
                            "empty pooling window (checked by the shape rule)",
                        )
                    })?;
                    out.push(v);
                    argmax.push(i);
                }
            }
        }
        Ok(Forward {
            value: Tensor::from_shape(shape, out)?,
            aux: Aux::Indices(Arc::new(argmax)),
        })
    }
    fn vjp<S: Scalar>(
        &self,
        ctx: &VjpContext<'_, S>,
        cot: &Tensor<S>,
    ) -> Result<Vec<Option<Tensor<S>>>> {
        let argmax = argmax_of(ctx.aux, cot.numel(), &ctx.input_shapes[0])?;
        let mut dx = vec![S::ZERO; ctx.input_shapes[0].numel()];
        for (&i, &g) in argmax.iter().zip(cot.data()) {
            dx[i] += g;
        }
        Ok(vec![Some(Tensor::from_shape(
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

fn argmax_of<'a, S>(aux: &'a Aux<S>, outputs: usize, input: &Shape) -> Result<&'a [usize]> {
    match aux {
        Aux::Indices(ix) if ix.len() == outputs && ix.iter().all(|&i| i < input.numel()) => Ok(ix),
        _ => Err(Error::invalid(
            "max_pool2d",
            format!("the saved argmax positions do not match {outputs} outputs of input {input}"),
        )),
    }
}

/// One averaging window along an axis: the clipped input range and PyTorch's divisor extent.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: usize,
    end: usize,
    /// The window's extent including padding (but not past it), for count_include_pad.
    padded_extent: usize,
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

    fn spans(win: &Window, out: usize, len: usize) -> Vec<Span> {
        (0..out)
            .map(|o| {
                let start = (o * win.stride) as isize - win.padding as isize;
                let end = (start + win.kernel as isize).min((len + win.padding) as isize);
                let padded_extent = (end - start) as usize;
                let start = start.max(0) as usize;
                let end = (end.max(0) as usize).min(len);
                Span {
                    start,
                    end: end.max(start),
                    padded_extent,
                }
            })
            .collect()
    }

    /// Per-axis spans and the output shape.
    fn geometry(&self, x: &Shape) -> Result<(Planes, [Vec<Span>; 2], Shape)> {
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
        let shape = pooled_shape(x, oh, ow)?;
        Ok((
            p,
            [Self::spans(&wh, oh, p.h), Self::spans(&ww, ow, p.w)],
            shape,
        ))
    }

    fn divisor(&self, sh: &Span, sw: &Span) -> usize {
        if self.count_include_pad {
            sh.padded_extent * sw.padded_extent
        } else {
            (sh.end - sh.start) * (sw.end - sw.start)
        }
    }

    /// The forward map, also the JVP (the op is linear).
    fn pool<S: Scalar>(&self, x: &Tensor<S>) -> Result<Tensor<S>> {
        let (p, [hs, ws], shape) = self.geometry(x.shape())?;
        let src = x.data();
        let mut out = Vec::with_capacity(shape.numel());
        for base in (0..p.planes).map(|i| i * p.h * p.w) {
            for sh in &hs {
                for sw in &ws {
                    let div = self.divisor(sh, sw);
                    if div == 0 {
                        out.push(S::ZERO);
                        continue;
                    }
                    let mut acc = S::ZERO;
                    for ih in sh.start..sh.end {
                        let row = base + ih * p.w;
                        for &v in &src[row + sw.start..row + sw.end] {
                            acc += v;
                        }
                    }
                    out.push(acc / S::from_usize(div));
                }
            }
        }
        Tensor::from_shape(shape, out)
    }
}

impl OpRules for AvgPool2d {
    fn name(&self) -> &'static str {
        "avg_pool2d"
    }
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
    fn vjp<S: Scalar>(
        &self,
        ctx: &VjpContext<'_, S>,
        cot: &Tensor<S>,
    ) -> Result<Vec<Option<Tensor<S>>>> {
        let in_shape = &ctx.input_shapes[0];
        let (p, [hs, ws], _) = self.geometry(in_shape)?;
        let mut dx = vec![S::ZERO; in_shape.numel()];
        let mut g = cot.data().iter();
        for base in (0..p.planes).map(|i| i * p.h * p.w) {
            for sh in &hs {
                for sw in &ws {
                    let gv = *g.next().ok_or_else(|| {
                        Error::invalid("avg_pool2d", "cotangent shorter than the output")
                    })?;
                    let div = self.divisor(sh, sw);
                    if div == 0 {
                        continue;
                    }
                    let share = gv / S::from_usize(div);
                    for ih in sh.start..sh.end {
                        let row = base + ih * p.w;
                        for d in &mut dx[row + sw.start..row + sw.end] {
                            *d += share;
                        }
                    }
                }
            }
        }
        Ok(vec![Some(Tensor::from_shape(in_shape.clone(), dx)?)])
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
        let shape = pooled_shape(x, oh, ow)?;
        let axes = [
            AdaptiveAxis { len: p.h, out: oh },
            AdaptiveAxis { len: p.w, out: ow },
        ];
        Ok((p, axes, shape))
    }

    fn pool<S: Scalar>(&self, x: &Tensor<S>) -> Result<Tensor<S>> {
        let (p, [hs, ws], shape) = self.geometry(x.shape())?;
        let src = x.data();
        let mut out = try_with_capacity(self.name(), shape.numel())?;
        for base in (0..p.planes).map(|i| i * p.h * p.w) {
            for (h0, h1) in hs.spans() {
                for (w0, w1) in ws.spans() {
                    let mut acc = S::ZERO;
                    for ih in h0..h1 {
                        let row = base + ih * p.w;
                        for &v in &src[row + w0..row + w1] {
                            acc += v;
                        }
                    }
                    out.push(acc / S::from_usize((h1 - h0) * (w1 - w0)));
                }
            }
        }
        Tensor::from_shape(shape, out)
    }
}

impl OpRules for AdaptiveAvgPool2d {
    fn name(&self) -> &'static str {
        "adaptive_avg_pool2d"
    }
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
    fn vjp<S: Scalar>(
        &self,
        ctx: &VjpContext<'_, S>,
        cot: &Tensor<S>,
    ) -> Result<Vec<Option<Tensor<S>>>> {
        let in_shape = &ctx.input_shapes[0];
        let (p, [hs, ws], _) = self.geometry(in_shape)?;
        let mut dx = vec![S::ZERO; in_shape.numel()];
        let mut g = cot.data().iter();
        for base in (0..p.planes).map(|i| i * p.h * p.w) {
            for (h0, h1) in hs.spans() {
                for (w0, w1) in ws.spans() {
                    let gv = *g.next().ok_or_else(|| {
                        Error::invalid("adaptive_avg_pool2d", "cotangent shorter than the output")
                    })?;
                    let share = gv / S::from_usize((h1 - h0) * (w1 - w0));
                    for ih in h0..h1 {
                        let row = base + ih * p.w;
                        for d in &mut dx[row + w0..row + w1] {
                            *d += share;
                        }
                    }
                }
            }
        }
        Ok(vec![Some(Tensor::from_shape(in_shape.clone(), dx)?)])
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
            "avg_pool2d(kernel_size={:?}, stride={:?}, padding={:?}, ceil_mode={}, count_include_pad={})",
            self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad
        )
    }
}

impl std::fmt::Display for AdaptiveAvgPool2d {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "adaptive_avg_pool2d(output_size={:?})", self.output_size)
    }
}
