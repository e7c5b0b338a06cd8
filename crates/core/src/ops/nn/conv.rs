//! `conv1d` and `conv2d` (PyTorch's `F.conv1d`/`F.conv2d`): stride, padding (a number, "same" or
//! "valid", with `nn.Conv2d`'s `padding_mode`), dilation, groups and an optional bias, batched or
//! unbatched input. Forward and both VJPs run on the GEMM through the im2col kernels; conv1d is
//! conv2d on a height-1 image. Every rule is linear in each argument.

use super::pad::{AxisPad, NamedPadding, Pad, PaddingMode};
use super::{arity_with, expect_shape, when};
use crate::ops::{Arity, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::kernels::alloc::try_with_capacity;
use tapegrad_tensor::kernels::conv::{
    conv2d_forward, conv2d_forward_into, conv2d_grad_bias, conv2d_grad_input,
    conv2d_grad_input_into, conv2d_grad_weight, Conv2dGeometry,
};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// `F.conv2d(input, weight, bias, stride, padding, dilation, groups)`: input (N, C, H, W) or
/// (C, H, W), weight (O, C / groups, kH, kW), bias (O) when `bias` is set.
///
/// PyTorch's `padding` is a number, a pair or a string: `padding` holds the numbers and
/// `named_padding` the string (`padding="same"` or `"valid"`; `padding` must then stay `[0, 0]`).
/// `padding_mode` is `nn.Conv2d`'s (F.conv2d pads with zeros only): the module pads explicitly
/// with `F.pad(mode)` and convolves without padding, which is what this op does.
#[derive(Debug, Clone, PartialEq)]
pub struct Conv2d {
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
    pub bias: bool,
    pub named_padding: Option<NamedPadding>,
    pub padding_mode: PaddingMode,
}

impl Default for Conv2d {
    fn default() -> Self {
        Conv2d {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
            bias: false,
            named_padding: None,
            padding_mode: PaddingMode::Zeros,
        }
    }
}

/// `F.conv1d(input, weight, bias, stride, padding, dilation, groups)`: input (N, C, L) or (C, L),
/// weight (O, C / groups, K), bias (O) when `bias` is set; `named_padding` and `padding_mode`
/// as [`Conv2d`]'s.
#[derive(Debug, Clone, PartialEq)]
pub struct Conv1d {
    pub stride: usize,
    pub padding: usize,
    pub dilation: usize,
    pub groups: usize,
    pub bias: bool,
    pub named_padding: Option<NamedPadding>,
    pub padding_mode: PaddingMode,
}

impl Default for Conv1d {
    fn default() -> Self {
        Conv1d {
            stride: 1,
            padding: 0,
            dilation: 1,
            groups: 1,
            bias: false,
            named_padding: None,
            padding_mode: PaddingMode::Zeros,
        }
    }
}

/// The common form of both: a 2-D convolution over `spatial` trailing axes (1 or 2).
struct Spec {
    name: &'static str,
    spatial: usize,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
    bias: bool,
    named_padding: Option<NamedPadding>,
    padding_mode: PaddingMode,
}

/// A convolution's geometry (on the padded input when `pad` is set) and output shape.
struct Plan {
    geo: Conv2dGeometry,
    /// Explicit padding to apply first (any non-zero mode, and what one side of a zero padding
    /// has more than the other); the kernels pad the rest.
    pad: Option<Pad>,
    out: Shape,
}

impl Conv2d {
    fn spec(&self) -> Spec {
        Spec {
            name: "conv2d",
            spatial: 2,
            stride: self.stride,
            padding: self.padding,
            dilation: self.dilation,
            groups: self.groups,
            bias: self.bias,
            named_padding: self.named_padding,
            padding_mode: self.padding_mode,
        }
    }
}

impl Conv1d {
    fn spec(&self) -> Spec {
        Spec {
            name: "conv1d",
            spatial: 1,
            stride: [1, self.stride],
            padding: [0, self.padding],
            dilation: [1, self.dilation],
            groups: self.groups,
            bias: self.bias,
            named_padding: self.named_padding,
            padding_mode: self.padding_mode,
        }
    }
}

impl Spec {
    /// The per-axis `(before, after)` padding of (height, width), from the numbers or the name.
    fn resolve_padding(&self, kernel: [usize; 2], shapes: &str) -> Result<[(usize, usize); 2]> {
        let op = self.name;
        let Some(named) = self.named_padding else {
            return Ok(self.padding.map(|p| (p, p)));
        };
        if self.padding != [0, 0] {
            return Err(Error::invalid(
                op,
                format!(
                    "padding=\"{}\" cannot be combined with numeric padding {} ({shapes})",
                    named.name(),
                    self.show(self.padding)
                ),
            ));
        }
        match named {
            NamedPadding::Valid => Ok([(0, 0); 2]),
            NamedPadding::Same => {
                if self.stride != [1, 1] {
                    return Err(Error::invalid(
                        op,
                        format!(
                            "padding=\"same\" is not supported for strided convolutions, got stride {} ({shapes})",
                            self.show(self.stride)
                        ),
                    ));
                }
                let mut out = [(0, 0); 2];
                for a in 0..2 {
                    let total = kernel[a]
                        .saturating_sub(1)
                        .checked_mul(self.dilation[a])
                        .ok_or_else(|| {
                            Error::invalid(
                                op,
                                format!(
                                    "padding=\"same\" overflows with dilation {} ({shapes})",
                                    self.show(self.dilation)
                                ),
                            )
                        })?;
                    // PyTorch puts the odd element on the right (bottom).
                    out[a] = (total / 2, total - total / 2);
                }
                Ok(out)
            }
        }
    }

    /// An attribute as the user wrote it: one number for conv1d, a pair for conv2d.
    fn show(&self, v: [usize; 2]) -> String {
        if self.spatial == 1 {
            v[1].to_string()
        } else {
            format!("{v:?}")
        }
    }

    /// The geometry and output shape for these argument shapes.
    fn geometry(&self, shapes: &[&Shape]) -> Result<Plan> {
        let op = self.name;
        let (x, w) = (shapes[0], shapes[1]);
        let batched = x.rank() == self.spatial + 2;
        if !batched && x.rank() != self.spatial + 1 {
            return Err(Error::invalid(
                op,
                format!(
                    "expected a {}-D (batched) or {}-D (unbatched) input, found shape {x} (weight {w})",
                    self.spatial + 2,
                    self.spatial + 1
                ),
            ));
        }
        if w.rank() != self.spatial + 2 {
            return Err(Error::invalid(
                op,
                format!(
                    "expected a {}-D weight (out_channels, in_channels / groups, kernel...), found shape {w} (input {x})",
                    self.spatial + 2
                ),
            ));
        }
        let xd = x.dims();
        let (batch, rest) = if batched { (xd[0], &xd[1..]) } else { (1, xd) };
        let channels = rest[0];
        let (in_h, in_w) = if self.spatial == 2 {
            (rest[1], rest[2])
        } else {
            (1, rest[1])
        };
        let wd = w.dims();
        let (out_channels, group_in) = (wd[0], wd[1]);
        let (kh, kw) = if self.spatial == 2 {
            (wd[2], wd[3])
        } else {
            (1, wd[2])
        };
        let g = self.groups;
        if g == 0 || channels % g != 0 || out_channels % g != 0 {
            return Err(Error::invalid(
                op,
                format!(
                    "groups {g} must be positive and divide the input channels {channels} and the output channels {out_channels} (input {x}, weight {w})"
                ),
            ));
        }
        if group_in != channels / g {
            return Err(Error::invalid(
                op,
                format!(
                    "weight {w} expects {group_in} input channels per group, but input {x} has {channels} channels in {g} group(s)"
                ),
            ));
        }
        if self.bias {
            let expected = Shape::new([out_channels])?;
            expect_shape(op, "bias", shapes[2], &expected)?;
        }
        let shapes_text = format!("input {x}, weight {w}");
        let [(top, bottom), (left, right)] = self.resolve_padding([kh, kw], &shapes_text)?;
        // Zero padding goes to the kernels, all but what one side has more than the other (as
        // PyTorch's "same": the odd element is padded explicitly): an explicit copy of a huge
        // "same" padding (dilation 2^40) would need terabytes the kernels never read.
        let kernel_pad = if self.padding_mode == PaddingMode::Zeros {
            [top.min(bottom), left.min(right)]
        } else {
            [0, 0]
        };
        let [(top, bottom), (left, right)] = [
            (top - kernel_pad[0], bottom - kernel_pad[0]),
            (left - kernel_pad[1], right - kernel_pad[1]),
        ];
        let pad = if [top, bottom, left, right] == [0; 4] {
            None
        } else {
            let axis = |len, lo, hi| AxisPad { len, lo, hi };
            let names = if self.spatial == 2 {
                ["height", "width"]
            } else {
                ["height", "length"]
            };
            let pad = Pad::new(
                op,
                batch * channels,
                [axis(in_h, top, bottom), axis(in_w, left, right)],
                self.padding_mode,
                names,
            )
            .map_err(|e| with_shapes(e, &shapes_text))?;
            Some(pad)
        };
        let geo_in = match &pad {
            Some(p) => p.padded(),
            None => [in_h, in_w],
        };
        let geo = Conv2dGeometry::new(
            op,
            [batch, channels, geo_in[0], geo_in[1]],
            [out_channels, group_in, kh, kw],
            self.stride,
            kernel_pad,
            self.dilation,
            g,
        )
        .map_err(|e| with_shapes(e, &shapes_text))?;
        let mut dims = if batched { vec![batch] } else { vec![] };
        dims.push(out_channels);
        if self.spatial == 2 {
            dims.push(geo.out_h);
        }
        dims.push(geo.out_w);
        Ok(Plan {
            geo,
            pad,
            out: Shape::new(dims)?,
        })
    }

    fn shapes_of<'a, S: Scalar>(inputs: &[&'a Tensor<S>]) -> Vec<&'a Shape> {
        inputs.iter().map(|t| t.shape()).collect()
    }

    /// `x` as the kernels read it: explicitly padded when the plan says so.
    fn padded<S: Scalar>(&self, plan: &Plan, x: &Tensor<S>) -> Result<Tensor<S>> {
        match &plan.pad {
            Some(p) => p.apply(self.name, x),
            None => Ok(x.clone()),
        }
    }

    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        let plan = self.geometry(&Self::shapes_of(x))?;
        let bias = if self.bias { Some(x[2]) } else { None };
        let x0 = self.padded(&plan, x[0])?;
        let out = written(self.name, plan.out, |out| {
            conv2d_forward_into(&plan.geo, &x0, x[1], bias, out)
        })?;
        Ok(Forward::new(out))
    }

    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let op = self.name;
        let shapes: Vec<&Shape> = ctx.input_shapes.iter().collect();
        let plan = self.geometry(&shapes)?;
        let geo = &plan.geo;
        let shape = |i: usize| ctx.input_shapes[i].clone();
        let mut grads = smallvec![
            when(ctx, 0, || {
                let w = ctx.input(op, 1)?;
                match &plan.pad {
                    Some(p) => p.adjoint(&conv2d_grad_input(geo, cot, w)?, &shape(0)),
                    None => written(op, shape(0), |dx| conv2d_grad_input_into(geo, cot, w, dx)),
                }
            })?,
            when(ctx, 1, || {
                let x = self.padded(&plan, ctx.input(op, 0)?)?;
                let data = conv2d_grad_weight(geo, cot, &x)?;
                Tensor::from_shape(shape(1), data)
            })?,
        ];
        if self.bias {
            grads.push(when(ctx, 2, || {
                Tensor::from_shape(shape(2), conv2d_grad_bias(geo, cot)?)
            })?);
        }
        Ok(grads)
    }

    /// The convolution is bilinear in (input, weight) and affine in the bias, and padding is
    /// linear, so its tangent is `conv(pad(dx), w) + conv(pad(x), dw) + db`.
    fn jvp<S: Scalar>(&self, x: &[&Tensor<S>], t: &[&Tensor<S>]) -> Result<Tensor<S>> {
        let plan = self.geometry(&Self::shapes_of(x))?;
        let bias = if self.bias { Some(t[2]) } else { None };
        let mut data = conv2d_forward(&plan.geo, &self.padded(&plan, t[0])?, x[1], bias)?;
        let other = conv2d_forward(&plan.geo, &self.padded(&plan, x[0])?, t[1], None)?;
        for (d, o) in data.iter_mut().zip(other) {
            *d += o;
        }
        Tensor::from_shape(plan.out, data)
    }
}

/// A tensor of `shape` that `write` fills in place (in a recycled buffer, without a copy), or
/// `write`'s error. An output's size follows from attributes (padding), so a request that cannot
/// be met must be an error, not an allocation abort: the memory is reserved fallibly first (and
/// given back at once; the tensor then takes a recycled or a fresh buffer).
fn written<S: Scalar>(
    op: &'static str,
    shape: Shape,
    write: impl FnOnce(&mut [S]) -> Result<()>,
) -> Result<Tensor<S>> {
    drop(try_with_capacity::<S>(op, shape.numel())?);
    let mut result = Ok(());
    let t = Tensor::from_writer(shape, |out| result = write(out));
    result.map(|()| t)
}

/// Adds the argument shapes to a geometry error.
fn with_shapes(e: Error, shapes: &str) -> Error {
    match e {
        Error::Invalid { op, message } => Error::Invalid {
            op,
            message: format!("{message} ({shapes})"),
        },
        other => other,
    }
}

/// The GEMM kernels name `conv2d` in their errors (allocation failures); conv1d runs on them too,
/// so its errors get its own name back.
fn renamed<T>(name: &'static str, result: Result<T>) -> Result<T> {
    result.map_err(|e| match e {
        Error::Invalid { message, .. } => Error::Invalid { op: name, message },
        other => other,
    })
}

macro_rules! conv_rules {
    ($ty:ident) => {
        impl OpRules for $ty {
            fn arity(&self) -> Arity {
                arity_with(2, &[self.bias])
            }
            fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
                Ok(self.spec().geometry(inputs)?.out)
            }
            /// The input gradient needs the weight and the weight gradient needs the input.
            fn saves(&self) -> Saves {
                Saves::inputs(&[0, 1])
            }
            /// The input's gradient reads the weight, the weight's the input, the bias's
            /// neither (shapes come from the record).
            fn saves_for(&self, needs: &[bool]) -> Saves {
                Saves::each_for_the_other(needs)
            }
            fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
                renamed(self.name(), self.spec().forward(x))
            }
            fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
                renamed(self.name(), self.spec().vjp(ctx, cot))
            }
            fn jvp<S: Scalar>(
                &self,
                x: &[&Tensor<S>],
                _out: &Forward<S>,
                t: &[&Tensor<S>],
            ) -> Result<Tensor<S>> {
                renamed(self.name(), self.spec().jvp(x, t))
            }
        }
    };
}

conv_rules!(Conv2d);
conv_rules!(Conv1d);

/// PyTorch's text of `padding` and, when not zeros, `padding_mode`.
fn padding_text(spec: &Spec) -> String {
    let padding = match spec.named_padding {
        Some(n) => format!("\"{}\"", n.name()),
        None => spec.show(spec.padding),
    };
    match spec.padding_mode {
        PaddingMode::Zeros => padding,
        mode => format!("{padding}, padding_mode=\"{}\"", mode.name()),
    }
}

impl std::fmt::Display for Conv2d {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "conv2d(stride={:?}, padding={}, dilation={:?}, groups={}, bias={})",
            self.stride,
            padding_text(&self.spec()),
            self.dilation,
            self.groups,
            self.bias
        )
    }
}

impl std::fmt::Display for Conv1d {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "conv1d(stride={}, padding={}, dilation={}, groups={}, bias={})",
            self.stride,
            padding_text(&self.spec()),
            self.dilation,
            self.groups,
            self.bias
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::Saved;

    /// `padding="same"` with an odd total (an even kernel, an odd dilation) pads one element more
    /// on the right. Only that element is padded explicitly, as PyTorch does; the whole padding
    /// would be 2^40 elements per row for dilation 2^40 + 1 (an allocation error, or terabytes).
    /// Every tap then reads padding, so the output is the bias and only the bias has a gradient.
    #[test]
    fn same_padding_with_a_huge_odd_total_pads_one_element_explicitly() {
        let op = Conv1d {
            dilation: (1 << 40) + 1,
            bias: true,
            named_padding: Some(NamedPadding::Same),
            ..Conv1d::default()
        };
        let x = Tensor::<f64>::new(&[1, 1, 3], vec![1.0, 2.0, 3.0]).unwrap();
        let w = Tensor::<f64>::new(&[1, 1, 2], vec![4.0, 5.0]).unwrap();
        let b = Tensor::<f64>::new(&[1], vec![6.0]).unwrap();
        let plan = op
            .spec()
            .geometry(&[x.shape(), w.shape(), b.shape()])
            .unwrap();
        let pad = plan.pad.unwrap();
        assert_eq!(pad.padded(), [1, 4]);
        assert_eq!(plan.geo.padding, [0, 1 << 39]);
        let fwd = OpRules::forward(&op, &[&x, &w, &b]).unwrap();
        assert_eq!(
            (fwd.value.dims(), fwd.value.data()),
            (&[1, 1, 3][..], &[6.0; 3][..])
        );
        let cot = Tensor::<f64>::new(&[1, 1, 3], vec![1.0, -2.0, 4.0]).unwrap();
        let saved = Saved::keep(op.saves(), &[&x, &w, &b], &fwd, [true; 3]);
        let grads = OpRules::vjp(&op, &saved.context(), &cot).unwrap();
        let data = |i: usize| grads[i].as_ref().unwrap().data().to_vec();
        assert_eq!(
            (data(0), data(1), data(2)),
            (vec![0.0; 3], vec![0.0; 2], vec![3.0])
        );
    }
}
