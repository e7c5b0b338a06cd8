//! `Conv2d` and `MaxPool2d` layers over the ops layer's `conv2d` and `max_pool2d`. `Conv2d` is
//! initialised as PyTorch's `nn.Conv2d`: weight `kaiming_uniform_(a = sqrt(5))`, bias
//! `U(-1/sqrt(fan_in), 1/sqrt(fan_in))` with `fan_in = in_channels / groups * kh * kw`.

use super::{Builder, Ctx};
use crate::init::Init;
use crate::params::ParamId;
use tapegrad_core::ops::nn::{
    Conv2d as Conv2dOp, MaxPool2d as MaxPool2dOp, NamedPadding, PaddingMode,
};
use tapegrad_core::Var;
use tapegrad_core::{Error, Result};
use tapegrad_tensor::Scalar;

/// A 2-D convolution over `(N, C, H, W)` inputs.
#[derive(Debug, Clone)]
pub struct Conv2d {
    pub in_channels: usize,
    pub out_channels: usize,
    pub kernel_size: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    /// `padding="same"` or `"valid"` (then `padding` is `[0, 0]`).
    pub named_padding: Option<NamedPadding>,
    pub padding_mode: PaddingMode,
    weight: ParamId,
    bias: Option<ParamId>,
}

impl Conv2d {
    /// A convolution with PyTorch's defaults (stride 1, no padding, dilation 1, one group,
    /// zeros padding mode) and default initialisation; see `with_stride`, `with_padding`,
    /// `with_named_padding` and `with_padding_mode`.
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
            named_padding: None,
            padding_mode: PaddingMode::Zeros,
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

    /// The same layer with padding of `padding` on each side (replacing a named padding).
    pub fn with_padding(mut self, padding: [usize; 2]) -> Self {
        self.padding = padding;
        self.named_padding = None;
        self
    }

    /// The same layer with PyTorch's `padding="same"` or `"valid"`; "same" needs stride 1.
    pub fn with_named_padding(mut self, padding: NamedPadding) -> Result<Self> {
        if padding == NamedPadding::Same && self.stride != [1, 1] {
            return Err(Error::invalid(
                "conv2d",
                format!(
                    "padding=\"same\" is not supported for strided convolutions, got stride {:?}",
                    self.stride
                ),
            ));
        }
        self.padding = [0, 0];
        self.named_padding = Some(padding);
        Ok(self)
    }

    /// The padding as `describe` shows it: the pair or the name, then a non-default mode.
    pub fn padding_text(&self) -> String {
        let padding = match self.named_padding {
            Some(n) => format!("\"{}\"", n.name()),
            None => format!("{:?}", self.padding),
        };
        match self.padding_mode {
            PaddingMode::Zeros => padding,
            mode => format!("{padding}, padding_mode=\"{}\"", mode.name()),
        }
    }

    /// The same layer with `nn.Conv2d`'s `padding_mode` (what the padding holds).
    pub fn with_padding_mode(mut self, mode: PaddingMode) -> Self {
        self.padding_mode = mode;
        self
    }

    /// `conv2d(x, weight, bias)`.
    pub fn forward<S: Scalar>(&self, ctx: &mut Ctx<'_, S>, x: Var) -> Result<Var> {
        let w = ctx.param(self.weight);
        let b = self.bias.map(|id| ctx.param(id));
        let options = Conv2dOp {
            stride: self.stride,
            padding: self.padding,
            named_padding: self.named_padding,
            padding_mode: self.padding_mode,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::Mode;
    use crate::params::ParamSet;
    use crate::rng::{dropout_rng, init_rng};
    use tapegrad_core::Session;
    use tapegrad_tensor::Tensor;

    /// `nn.Conv2d(2, 3, (2, 3), padding="same", padding_mode="circular")` keeps the spatial size
    /// and passes the options to the op.
    #[test]
    fn same_padding_and_padding_mode_reach_the_op() {
        let mut params = ParamSet::<f64>::new();
        let conv = Conv2d::new(
            &mut Builder::new(&mut params, &mut init_rng(1)),
            "conv",
            2,
            3,
            [2, 3],
            true,
        )
        .unwrap()
        .with_named_padding(NamedPadding::Same)
        .unwrap()
        .with_padding_mode(PaddingMode::Circular);
        assert_eq!(conv.padding_text(), "\"same\", padding_mode=\"circular\"");
        let mut s = Session::new();
        let mut ctx = Ctx::new(&mut s, &params, Mode::Train, dropout_rng(0, 0)).unwrap();
        let x = ctx.session().input(Tensor::ones(
            &tapegrad_tensor::Shape::new([1, 2, 4, 5]).unwrap(),
        ));
        let y = conv.forward(&mut ctx, x).unwrap();
        let out = ctx.session().value(y).unwrap().clone();
        assert_eq!(out.dims(), &[1, 3, 4, 5]);
        // Circular padding of a constant image is constant, so every output of a channel is the
        // same: the sum of its kernel plus its bias.
        for ch in out.data().chunks(20) {
            assert!(ch.iter().all(|&v| (v - ch[0]).abs() < 1e-12), "{ch:?}");
        }
        // with_padding switches back to numbers.
        assert_eq!(
            conv.with_padding([1, 0]).padding_text(),
            "[1, 0], padding_mode=\"circular\""
        );
    }

    #[test]
    fn same_padding_needs_stride_one() {
        let mut params = ParamSet::<f64>::new();
        let e = Conv2d::new(
            &mut Builder::new(&mut params, &mut init_rng(1)),
            "conv",
            1,
            1,
            [3, 3],
            false,
        )
        .unwrap()
        .with_stride([1, 2])
        .unwrap()
        .with_named_padding(NamedPadding::Same)
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("conv2d") && e.contains("\"same\"") && e.contains("[1, 2]"),
            "{e}"
        );
    }
}
