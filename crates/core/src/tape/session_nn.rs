//! Session methods for the neural-network ops (convolution, pooling, normalisation, indexing,
//! dropout, attention), with PyTorch's argument order; optional weight and bias are `Option<Var>`.
//! Batch norm in training mode also returns the batch statistics for the running-stats update.

use super::{Rule, Session, Var};
use crate::ops::nn::{
    batch_stats, AdaptiveAvgPool2d, AvgPool2d, BatchNorm, BatchStats, Conv1d, Conv2d, Dropout,
    Embedding, Gather, GroupNorm, IndexSelect, IndexTensor, LayerNorm, MaxPool2d, NnOp,
    QkvAttention, ScaledDotProductAttention, ScatterAdd, Select,
};
use crate::ops::Op;
use crate::Result;
use tapegrad_tensor::Scalar;

/// `[x, optional...]` with the absent ones left out.
fn with_optional(first: &[Var], optional: &[Option<Var>]) -> Vec<Var> {
    first
        .iter()
        .copied()
        .chain(optional.iter().flatten().copied())
        .collect()
}

impl<S: Scalar> Session<S> {
    fn nn(&mut self, op: impl Into<NnOp>, args: &[Var]) -> Result<Var> {
        self.apply(Op::Nn(Box::new(op.into())), args)
    }

    /// `F.conv1d(x, weight, bias, ...)`; `options.bias` is set from `bias`.
    pub fn conv1d(
        &mut self,
        x: Var,
        weight: Var,
        bias: Option<Var>,
        options: Conv1d,
    ) -> Result<Var> {
        let op = Conv1d {
            bias: bias.is_some(),
            ..options
        };
        self.nn(op, &with_optional(&[x, weight], &[bias]))
    }

    /// `F.conv2d(x, weight, bias, ...)`; `options.bias` is set from `bias`.
    pub fn conv2d(
        &mut self,
        x: Var,
        weight: Var,
        bias: Option<Var>,
        options: Conv2d,
    ) -> Result<Var> {
        let op = Conv2d {
            bias: bias.is_some(),
            ..options
        };
        self.nn(op, &with_optional(&[x, weight], &[bias]))
    }

    /// `F.max_pool2d` (see [`MaxPool2d::new`] for PyTorch's defaults).
    pub fn max_pool2d(&mut self, x: Var, options: MaxPool2d) -> Result<Var> {
        self.nn(options, &[x])
    }

    /// `F.avg_pool2d` (see [`AvgPool2d::new`] for PyTorch's defaults).
    pub fn avg_pool2d(&mut self, x: Var, options: AvgPool2d) -> Result<Var> {
        self.nn(options, &[x])
    }

    /// `F.adaptive_avg_pool2d(x, output_size)`.
    pub fn adaptive_avg_pool2d(&mut self, x: Var, output_size: [usize; 2]) -> Result<Var> {
        self.nn(AdaptiveAvgPool2d { output_size }, &[x])
    }

    /// `F.layer_norm(x, normalized_shape, weight, bias, eps)`.
    pub fn layer_norm(
        &mut self,
        x: Var,
        normalized_shape: &[usize],
        weight: Option<Var>,
        bias: Option<Var>,
        eps: f64,
    ) -> Result<Var> {
        let op = LayerNorm {
            normalized_shape: normalized_shape.to_vec(),
            eps,
            weight: weight.is_some(),
            bias: bias.is_some(),
        };
        self.nn(op, &with_optional(&[x], &[weight, bias]))
    }

    /// `F.group_norm(x, num_groups, weight, bias, eps)`.
    pub fn group_norm(
        &mut self,
        x: Var,
        num_groups: usize,
        weight: Option<Var>,
        bias: Option<Var>,
        eps: f64,
    ) -> Result<Var> {
        let op = GroupNorm {
            num_groups,
            eps,
            weight: weight.is_some(),
            bias: bias.is_some(),
        };
        self.nn(op, &with_optional(&[x], &[weight, bias]))
    }

    /// Batch norm in training mode: normalises with the batch statistics and returns them too,
    /// for `BatchNorm::running_update` (the running statistics are not the op's business).
    pub fn batch_norm_train(
        &mut self,
        x: Var,
        weight: Option<Var>,
        bias: Option<Var>,
        momentum: f64,
        eps: f64,
    ) -> Result<(Var, BatchStats<S>)> {
        let op = BatchNorm {
            training: true,
            momentum,
            eps,
            weight: weight.is_some(),
            bias: bias.is_some(),
        };
        let y = self.nn(op.clone(), &with_optional(&[x], &[weight, bias]))?;
        let input = self.value(x)?.shape().clone();
        // A recorded node kept the statistics of its own forward pass; under no_grad the value is
        // a plain leaf, so they are recomputed the same way.
        let stats = match &self.tape().node(y.id())?.rule {
            Rule::Op { saved, .. } => op.stats_from_aux(saved.aux(), &input)?,
            _ => batch_stats(self.value(x)?)?,
        };
        Ok((y, stats))
    }

    /// Batch norm in evaluation mode with the given running statistics.
    pub fn batch_norm_eval(
        &mut self,
        x: Var,
        running_mean: Var,
        running_var: Var,
        weight: Option<Var>,
        bias: Option<Var>,
        eps: f64,
    ) -> Result<Var> {
        let op = BatchNorm {
            eps,
            weight: weight.is_some(),
            bias: bias.is_some(),
            ..BatchNorm::new(false)
        };
        self.nn(
            op,
            &with_optional(&[x, running_mean, running_var], &[weight, bias]),
        )
    }

    /// `F.embedding(indices, weight)`.
    pub fn embedding(&mut self, indices: IndexTensor, weight: Var) -> Result<Var> {
        self.nn(Embedding::new(indices), &[weight])
    }

    /// `F.embedding(indices, weight, padding_idx)`: row `padding_idx` (negative counts from the
    /// end) gets no gradient.
    pub fn embedding_with_padding_idx(
        &mut self,
        indices: IndexTensor,
        weight: Var,
        padding_idx: isize,
    ) -> Result<Var> {
        let op = Embedding {
            indices,
            padding_idx: Some(padding_idx),
        };
        self.nn(op, &[weight])
    }

    /// `torch.index_select(x, dim, index)`.
    pub fn index_select(&mut self, x: Var, dim: isize, index: IndexTensor) -> Result<Var> {
        self.nn(IndexSelect { dim, index }, &[x])
    }

    /// `torch.gather(x, dim, index)`.
    pub fn gather(&mut self, x: Var, dim: isize, index: IndexTensor) -> Result<Var> {
        self.nn(Gather { dim, index }, &[x])
    }

    /// `torch.scatter_add(x, dim, index, src)`.
    pub fn scatter_add(&mut self, x: Var, dim: isize, index: IndexTensor, src: Var) -> Result<Var> {
        self.nn(ScatterAdd { dim, index }, &[x, src])
    }

    /// `torch.select(x, dim, index)`.
    pub fn select(&mut self, x: Var, dim: isize, index: isize) -> Result<Var> {
        self.nn(Select { dim, index }, &[x])
    }

    /// `F.dropout(x, p, training)` with the mask drawn from `seed`.
    pub fn dropout(&mut self, x: Var, p: f64, training: bool, seed: u64) -> Result<Var> {
        self.nn(Dropout { p, training, seed }, &[x])
    }

    /// `F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale)` with a
    /// boolean `attn_mask` (in `options`) or none; `options.float_mask` is cleared.
    pub fn scaled_dot_product_attention(
        &mut self,
        q: Var,
        k: Var,
        v: Var,
        options: ScaledDotProductAttention,
    ) -> Result<Var> {
        let op = ScaledDotProductAttention {
            float_mask: false,
            ..options
        };
        self.nn(op, &[q, k, v])
    }

    /// Multi-head self-attention on a packed `[..., T, 3E]` q|k|v projection, giving
    /// `[..., T, E]`: the heads' split, `scaled_dot_product_attention` and merge in one op
    /// ([`QkvAttention`]).
    pub fn qkv_attention(&mut self, qkv: Var, options: QkvAttention) -> Result<Var> {
        self.nn(options, &[qkv])
    }

    /// `F.scaled_dot_product_attention` with a float `attn_mask` tensor (added to the scores,
    /// broadcastable to them, differentiable); `options.float_mask` is set.
    pub fn scaled_dot_product_attention_with_mask(
        &mut self,
        q: Var,
        k: Var,
        v: Var,
        attn_mask: Var,
        options: ScaledDotProductAttention,
    ) -> Result<Var> {
        let op = ScaledDotProductAttention {
            float_mask: true,
            ..options
        };
        self.nn(op, &[q, k, v, attn_mask])
    }
}
