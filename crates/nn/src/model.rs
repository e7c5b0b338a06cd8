//! `ModelSpec` (a serialisable description of an architecture, stored in checkpoints) and
//! `Model` (the spec built: a `Sequential` plus its `ParamSet`), with the MLP builder. Building a
//! spec with a seed always gives the same parameters.

use crate::gpt::{gpt, GptShape};
use crate::layers::{
    Activation, BatchNorm2d, Builder, Conv2d, Ctx, Dropout, Layer, Linear, MaxPool2d, Sequential,
};
use crate::params::ParamSet;
use crate::rng::init_rng;
use serde::{Deserialize, Serialize};
use tapegrad_core::Var;
use tapegrad_core::{Error, Result};
use tapegrad_tensor::Scalar;

/// An architecture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelSpec {
    /// `inputs -> hidden[0] -> ... -> outputs`, the activation (and dropout, if `dropout` is not
    /// 0; outside `[0, 1)` it is an error) after every hidden layer.
    Mlp {
        inputs: usize,
        hidden: Vec<usize>,
        outputs: usize,
        activation: Activation,
        dropout: f64,
    },
    /// A small CNN on images of shape `image = [channels, height, width]` given as flat rows:
    /// for each entry of `channels`, a 3x3 convolution (padding 1), batch norm if `batch_norm`,
    /// ReLU and 2x2 max pooling; then flatten, dropout if not 0, and a linear layer.
    Cnn {
        image: [usize; 3],
        channels: Vec<usize>,
        outputs: usize,
        batch_norm: bool,
        dropout: f64,
    },
    /// nanoGPT's GPT (see [`crate::gpt::model`]): `[batch, time]` token ids in, logits
    /// `[batch * time, vocab]` out.
    Gpt {
        vocab: usize,
        context: usize,
        layers: usize,
        heads: usize,
        embd: usize,
        mlp_ratio: usize,
        dropout: f64,
        tie_weights: bool,
    },
}

impl ModelSpec {
    /// A short name for tables and plots.
    pub fn name(&self) -> String {
        match self {
            ModelSpec::Mlp {
                inputs,
                hidden,
                outputs,
                ..
            } => {
                let mut sizes = vec![inputs.to_string()];
                sizes.extend(hidden.iter().map(|h| h.to_string()));
                sizes.push(outputs.to_string());
                format!("mlp {}", sizes.join("-"))
            }
            ModelSpec::Cnn {
                image,
                channels,
                outputs,
                ..
            } => {
                let convs: Vec<String> = channels.iter().map(|c| format!("conv{c}")).collect();
                format!(
                    "cnn {}x{}x{} {} -> {outputs}",
                    image[0],
                    image[1],
                    image[2],
                    convs.join("-")
                )
            }
            ModelSpec::Gpt {
                layers,
                heads,
                embd,
                context,
                ..
            } => format!("gpt {layers} layers x {embd} wide, {heads} heads, context {context}"),
        }
    }

    /// The GPT's sizes, when this is one.
    pub fn gpt_shape(&self) -> Option<GptShape> {
        match *self {
            ModelSpec::Gpt {
                vocab,
                context,
                layers,
                heads,
                embd,
                mlp_ratio,
                dropout,
                tie_weights,
            } => Some(GptShape {
                vocab,
                context,
                layers,
                heads,
                embd,
                mlp_ratio,
                dropout,
                tie_weights,
            }),
            _ => None,
        }
    }

    /// Number of input features the model expects per row (saturating: `Model::new` rejects
    /// an image whose size overflows).
    pub fn inputs(&self) -> usize {
        match self {
            ModelSpec::Mlp { inputs, .. } => *inputs,
            ModelSpec::Cnn { image, .. } => image
                .iter()
                .try_fold(1usize, |n, &d| n.checked_mul(d))
                .unwrap_or(usize::MAX),
            ModelSpec::Gpt { context, .. } => *context,
        }
    }

    /// A lower bound on the number of parameter elements `Model::new` allocates (weights and
    /// biases of the linear and convolution layers), without allocating; `None` on overflow.
    /// Lets a reader cap a size declared in a file against the tensors the file holds.
    pub fn min_params(&self) -> Option<usize> {
        let dense = |a: usize, b: usize| a.checked_mul(b)?.checked_add(b);
        match self {
            ModelSpec::Mlp {
                inputs,
                hidden,
                outputs,
                ..
            } => {
                let sizes: Vec<usize> = std::iter::once(*inputs)
                    .chain(hidden.iter().copied())
                    .chain([*outputs])
                    .collect();
                sizes
                    .windows(2)
                    .try_fold(0usize, |n, w| n.checked_add(dense(w[0], w[1])?))
            }
            ModelSpec::Cnn {
                image: [c, h, w],
                channels,
                outputs,
                ..
            } => {
                let (mut h, mut w, mut prev, mut n) = (*h, *w, *c, 0usize);
                for &ch in channels {
                    n = n.checked_add(dense(prev.checked_mul(9)?, ch)?)?;
                    (h, w, prev) = (h / 2, w / 2, ch);
                }
                n.checked_add(dense(prev.checked_mul(h)?.checked_mul(w)?, *outputs)?)
            }
            ModelSpec::Gpt { .. } => self.gpt_shape()?.params(),
        }
    }

    /// Number of outputs per row.
    pub fn outputs(&self) -> usize {
        match self {
            ModelSpec::Mlp { outputs, .. } | ModelSpec::Cnn { outputs, .. } => *outputs,
            ModelSpec::Gpt { vocab, .. } => *vocab,
        }
    }
}

/// A built model: its layers and their tensors.
#[derive(Debug, Clone)]
pub struct Model<S> {
    pub spec: ModelSpec,
    pub params: ParamSet<S>,
    pub net: Sequential,
}

impl<S: Scalar> Model<S> {
    /// Builds `spec`, drawing initial parameters from the seed's initialisation stream.
    pub fn new(spec: &ModelSpec, seed: u64) -> Result<Self> {
        let mut params = ParamSet::new();
        let mut rng = init_rng(seed);
        let mut b = Builder::new(&mut params, &mut rng);
        let net = match spec {
            ModelSpec::Mlp {
                inputs,
                hidden,
                outputs,
                activation,
                dropout,
            } => {
                let mut sizes = vec![*inputs];
                sizes.extend(hidden);
                sizes.push(*outputs);
                mlp(&mut b, &sizes, *activation, *dropout)?
            }
            ModelSpec::Cnn {
                image,
                channels,
                outputs,
                batch_norm,
                dropout,
            } => cnn(&mut b, *image, channels, *outputs, *batch_norm, *dropout)?,
            ModelSpec::Gpt { .. } => {
                let shape = spec
                    .gpt_shape()
                    .ok_or_else(|| Error::invalid("gpt", "the spec has no gpt shape"))?;
                gpt(&mut b, &shape)?
            }
        };
        Ok(Model {
            spec: spec.clone(),
            params,
            net,
        })
    }

    /// Runs the model on `x` in `ctx`.
    pub fn forward(&self, ctx: &mut Ctx<'_, S>, x: Var) -> Result<Var> {
        self.net.forward(ctx, x)
    }

    /// The layer stack in PyTorch's style.
    pub fn describe(&self) -> String {
        self.net.describe()
    }
}

/// An MLP with layer widths `sizes` (`sizes[0]` inputs, last outputs): `Linear` layers with
/// `activation` (and `Dropout(dropout)` when positive) between them. Tensors are named as in a
/// PyTorch `nn.Sequential`: `0.weight`, `0.bias`, `2.weight`, ...
pub fn mlp<S: Scalar>(
    b: &mut Builder<'_, S>,
    sizes: &[usize],
    activation: Activation,
    dropout: f64,
) -> Result<Sequential> {
    if sizes.len() < 2 || sizes.contains(&0) {
        return Err(Error::invalid(
            "mlp",
            format!("needs at least an input and an output width, all positive, found {sizes:?}"),
        ));
    }
    let mut net = Sequential::new();
    for (i, w) in sizes.windows(2).enumerate() {
        let prefix = net.layers.len().to_string();
        net.push(Layer::Linear(Linear::new(b, &prefix, w[0], w[1], true)?));
        if i + 2 < sizes.len() {
            net.push(Layer::Activation(activation));
            if dropout != 0.0 {
                net.push(Layer::Dropout(Dropout::new(dropout)?));
            }
        }
    }
    Ok(net)
}

/// The CNN of [`ModelSpec::Cnn`]; tensors named by their index in the `Sequential`, as PyTorch.
pub fn cnn<S: Scalar>(
    b: &mut Builder<'_, S>,
    image: [usize; 3],
    channels: &[usize],
    outputs: usize,
    batch_norm: bool,
    dropout: f64,
) -> Result<Sequential> {
    let [c, mut h, mut w] = image;
    if image.contains(&0) || outputs == 0 || channels.contains(&0) {
        return Err(Error::invalid(
            "cnn",
            format!(
                "image {image:?}, channels {channels:?} and outputs {outputs} must be positive"
            ),
        ));
    }
    let mut net = Sequential::new();
    // The casts are lossless once the layers below exist: the first convolution's weight
    // [ch, c, 3, 3] and the flattened width bound c, h and w far below isize::MAX (Shape::new).
    net.push(Layer::Reshape(vec![-1, c as isize, h as isize, w as isize]));
    let mut prev = c;
    for &ch in channels {
        if h < 2 || w < 2 {
            return Err(Error::invalid(
                "cnn",
                format!(
                    "{} poolings by 2 do not fit an image of {}x{}",
                    channels.len(),
                    image[1],
                    image[2]
                ),
            ));
        }
        let prefix = net.layers.len().to_string();
        let conv = Conv2d::new(b, &prefix, prev, ch, [3, 3], true)?.with_padding([1, 1]);
        net.push(Layer::Conv2d(conv));
        if batch_norm {
            let prefix = net.layers.len().to_string();
            net.push(Layer::BatchNorm2d(BatchNorm2d::new(b, &prefix, ch)?));
        }
        net.push(Layer::Activation(Activation::Relu));
        net.push(Layer::MaxPool2d(MaxPool2d {
            kernel_size: [2, 2],
        }));
        (h, w, prev) = (h / 2, w / 2, ch);
    }
    net.push(Layer::Flatten {
        start_dim: 1,
        end_dim: -1,
    });
    if dropout != 0.0 {
        net.push(Layer::Dropout(Dropout::new(dropout)?));
    }
    let flat = prev
        .checked_mul(h)
        .and_then(|n| n.checked_mul(w))
        .ok_or_else(|| {
            Error::invalid(
                "cnn",
                format!("{prev} channels of {h}x{w} overflow the flattened width"),
            )
        })?;
    let prefix = net.layers.len().to_string();
    net.push(Layer::Linear(Linear::new(b, &prefix, flat, outputs, true)?));
    Ok(net)
}
