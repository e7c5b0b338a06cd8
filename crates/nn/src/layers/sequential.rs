//! `Layer` (every layer kind behind one enum, so forward can be generic over the element type)
//! and `Sequential`, which runs its layers in order.

use super::{
    Activation, BatchNorm2d, CausalSelfAttention, Conv2d, Ctx, Dropout, Embedding, LayerNorm,
    Linear, MaxPool2d, Residual, TokenPosition,
};
use tapegrad_core::Result;
use tapegrad_core::Var;
use tapegrad_tensor::Scalar;

/// One layer of a model.
#[derive(Debug, Clone)]
pub enum Layer {
    Linear(Linear),
    Conv2d(Conv2d),
    MaxPool2d(MaxPool2d),
    LayerNorm(LayerNorm),
    BatchNorm2d(BatchNorm2d),
    Embedding(Embedding),
    Activation(Activation),
    Dropout(Dropout),
    /// Merges axes `start_dim..=end_dim` (PyTorch's `nn.Flatten`, default `1..=-1`).
    Flatten {
        start_dim: isize,
        end_dim: isize,
    },
    /// Reshapes to a fixed shape (one `-1` is inferred), e.g. `[-1, 1, 8, 8]`.
    Reshape(Vec<isize>),
    Sequential(Sequential),
    /// `x + body(x)`.
    Residual(Residual),
    CausalSelfAttention(CausalSelfAttention),
    TokenPosition(TokenPosition),
}

impl Layer {
    /// Runs the layer.
    pub fn forward<S: Scalar>(&self, ctx: &mut Ctx<'_, S>, x: Var) -> Result<Var> {
        match self {
            Layer::Linear(l) => l.forward(ctx, x),
            Layer::Conv2d(l) => l.forward(ctx, x),
            Layer::MaxPool2d(l) => l.forward(ctx, x),
            Layer::LayerNorm(l) => l.forward(ctx, x),
            Layer::BatchNorm2d(l) => l.forward(ctx, x),
            Layer::Embedding(l) => l.forward(ctx, x),
            Layer::Activation(a) => a.forward(ctx, x),
            Layer::Dropout(d) => d.forward(ctx, x),
            Layer::Flatten { start_dim, end_dim } => ctx.session().flatten(x, *start_dim, *end_dim),
            Layer::Reshape(shape) => ctx.session().reshape(x, shape),
            Layer::Sequential(s) => s.forward(ctx, x),
            Layer::Residual(r) => r.forward(ctx, x),
            Layer::CausalSelfAttention(a) => a.forward(ctx, x),
            Layer::TokenPosition(t) => t.forward(ctx, x),
        }
    }

    /// A one-line description in PyTorch's style.
    pub fn describe(&self) -> String {
        match self {
            Layer::Linear(l) => format!("Linear({}, {})", l.in_features, l.out_features),
            Layer::Conv2d(c) => format!(
                "Conv2d({}, {}, kernel={:?}, stride={:?}, padding={})",
                c.in_channels,
                c.out_channels,
                c.kernel_size,
                c.stride,
                c.padding_text()
            ),
            Layer::MaxPool2d(p) => format!("MaxPool2d({:?})", p.kernel_size),
            Layer::LayerNorm(n) => format!("LayerNorm({:?})", n.normalized_shape),
            Layer::BatchNorm2d(n) => format!("BatchNorm2d({})", n.num_features),
            Layer::Embedding(e) => match e.padding_idx {
                Some(p) => format!(
                    "Embedding({}, {}, padding_idx={p})",
                    e.num_embeddings, e.dim
                ),
                None => format!("Embedding({}, {})", e.num_embeddings, e.dim),
            },
            Layer::Activation(a) => format!("{}()", a.name()),
            Layer::Dropout(d) => format!("Dropout(p={})", d.p),
            Layer::Flatten { start_dim, end_dim } => format!("Flatten({start_dim}, {end_dim})"),
            Layer::Reshape(s) => format!("Reshape({s:?})"),
            Layer::Sequential(s) => s.describe(),
            Layer::Residual(r) => format!("Residual({})", r.body.describe()),
            Layer::CausalSelfAttention(a) => {
                format!("CausalSelfAttention({}, heads={})", a.embd, a.heads)
            }
            Layer::TokenPosition(t) => format!(
                "TokenPosition(vocab={}, context={}, {})",
                t.wte.num_embeddings, t.context, t.dim
            ),
        }
    }
}

/// Layers run one after another.
#[derive(Debug, Clone, Default)]
pub struct Sequential {
    pub layers: Vec<Layer>,
}

impl Sequential {
    /// An empty stack.
    pub fn new() -> Self {
        Sequential { layers: Vec::new() }
    }

    /// Appends a layer.
    pub fn push(&mut self, layer: Layer) {
        self.layers.push(layer);
    }

    /// Runs every layer in order.
    pub fn forward<S: Scalar>(&self, ctx: &mut Ctx<'_, S>, mut x: Var) -> Result<Var> {
        for layer in &self.layers {
            x = layer.forward(ctx, x)?;
        }
        Ok(x)
    }

    /// `Sequential(a -> b -> ...)`.
    pub fn describe(&self) -> String {
        let inner: Vec<String> = self.layers.iter().map(Layer::describe).collect();
        format!("Sequential({})", inner.join(" -> "))
    }
}
