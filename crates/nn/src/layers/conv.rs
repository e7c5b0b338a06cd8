//! `Conv2d` and `MaxPool2d` layers over the ops layer's `conv2d` and `max_pool2d`. `Conv2d` is
//! initialised as PyTorch's `nn.Conv2d`: weight `kaiming_uniform_(a = sqrt(5))`, bias
//! `U(-1/sqrt(fan_in), 1/sqrt(fan_in))` with `fan_in = in_channels / groups * kh * kw`.

use super::{Builder, Ctx};
use crate::init::Init;
use crate::params::ParamId;
use tapegrad_core::ops::nn::{Conv2d as Conv2dOp, MaxPool2d as MaxPool2dOp};
use tapegrad_core::Var;
use tapegrad_tensor::{Error, Result, Scalar};

/// A 2-D convolution over `(N, C, H, W)` inputs.
#[derive(Debug, Clone)]
pub struct Conv2d {
    pub in_channels: usize,
    pub out_channels: usize,
    pub kernel_size: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    weight: ParamId,
    bias: Option<ParamId>,
}

impl Conv2d {
    /// A convolution with PyTorch's defaults (stride 1, no padding, dilation 1, one group) and
    /// default initialisation; see `with_stride` and `with_padding`.
    pub fn new<S: Scalar>(
        b: &mut Builder<'_, S>,
        prefix: &str,
        in_channels: usize,
        out_channels: usize,
        kernel_size: [usize; 2],
        bias: bool,
    ) -> Result<Self> {
        let (stride, padding) = ([1, 1], [0, 0]);
        if in_channels == 0 || out_channels == 0 || kernel_size.contains(&0) {
            return Err(Error::invalid(
                "conv2d",
                format!(
                    "channels and kernel size must be positive, found {in_channels} -> {out_channels}, kernel {kernel_size:?}"
                ),
            ));
        }
        let fan_in = in_channels * kernel_size[0] * kernel_size[1];
        let bound = 1.0 / (fan_in as f64).sqrt();
        let weight = b.trainable(
            prefix,
            "weight",
            &[out_channels, in_channels, kernel_size[0], kernel_size[1]],
            Init::KaimingUniform { a: 5f64.sqrt() },
        )?;
        let bias = if bias {
            Some(b.trainable(
                prefix,
                "bias",
                &[out_channels],
                Init::Uniform {
                    low: -bound,
                    high: bound,
                },
            )?)
        } else {
            None
        };
        Ok(Conv2d {
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            weight,
            bias,
        })
    }

    /// The same layer with another stride (each at least 1).
    pub fn with_stride(mut self, stride: [usize; 2]) -> Result<Self> {
        if stride.contains(&0) {
            return Err(Error::invalid(
                "conv2d",
                format!("stride must be positive, found {stride:?}"),
            ));
        }
        self.stride = stride;
        Ok(self)
    }

    /// The same layer with zero padding of `padding` on each side.
    pub fn with_padding(mut self, padding: [usize; 2]) -> Self {
        self.padding = padding;
        self
    }

    /// `conv2d(x, weight, bias)`.
    pub fn forward<S: Scalar>(&self, ctx: &mut Ctx<'_, S>, x: Var) -> Result<Var> {
        let w = ctx.param(self.weight);
        let b = self.bias.map(|id| ctx.param(id));
        let options = Conv2dOp {
            stride: self.stride,
            padding: self.padding,
            ..Conv2dOp::default()
        };
        ctx.session().conv2d(x, w, b, options)
    }
}

/// Max pooling with PyTorch's defaults (stride = kernel size, no padding, floor mode).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MaxPool2d {
    pub kernel_size: [usize; 2],
}

impl MaxPool2d {
    /// `max_pool2d(x, kernel_size)`.
    pub fn forward<S: Scalar>(&self, ctx: &mut Ctx<'_, S>, x: Var) -> Result<Var> {
        ctx.session()
            .max_pool2d(x, MaxPool2dOp::new(self.kernel_size))
    }
}
