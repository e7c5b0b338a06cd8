//! Normalisation layers over the ops layer's `layer_norm` and `batch_norm`, initialised as
//! PyTorch's: weight 1, bias 0; `BatchNorm2d` also keeps `running_mean` (0), `running_var` (1) and
//! `num_batches_tracked` (0) as buffers. In training mode batch norm normalises with the batch
//! statistics and schedules PyTorch's running update (`(1 - momentum) * running + momentum *
//! batch`, unbiased batch variance); in eval mode it uses the running statistics.

use super::{Builder, Ctx, Mode};
use crate::init::Init;
use crate::params::ParamId;
use tapegrad_core::ops::nn::{BatchNorm, BatchStats};
use tapegrad_core::Result;
use tapegrad_core::Var;
use tapegrad_tensor::{Scalar, Shape, Tensor};

/// `F.layer_norm` over the last dimensions `normalized_shape`, with learned scale and shift.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    pub normalized_shape: Vec<usize>,
    pub eps: f64,
    weight: ParamId,
    bias: ParamId,
}

impl LayerNorm {
    /// A layer norm with PyTorch's defaults (`eps = 1e-5`, affine).
    pub fn new<S: Scalar>(
        b: &mut Builder<'_, S>,
        prefix: &str,
        normalized_shape: &[usize],
    ) -> Result<Self> {
        Ok(LayerNorm {
            normalized_shape: normalized_shape.to_vec(),
            eps: 1e-5,
            weight: b.trainable(prefix, "weight", normalized_shape, Init::Constant(1.0))?,
            bias: b.trainable(prefix, "bias", normalized_shape, Init::Constant(0.0))?,
        })
    }

    /// Normalises over the last `normalized_shape.len()` dimensions.
    pub fn forward<S: Scalar>(&self, ctx: &mut Ctx<'_, S>, x: Var) -> Result<Var> {
        let (w, b) = (ctx.param(self.weight), ctx.param(self.bias));
        ctx.session()
            .layer_norm(x, &self.normalized_shape, Some(w), Some(b), self.eps)
    }
}

/// Batch normalisation over the channels of `(N, C, H, W)` inputs.
#[derive(Debug, Clone)]
pub struct BatchNorm2d {
    pub num_features: usize,
    pub eps: f64,
    pub momentum: f64,
    weight: ParamId,
    bias: ParamId,
    running_mean: ParamId,
    running_var: ParamId,
    num_batches_tracked: ParamId,
}

impl BatchNorm2d {
    /// A batch norm with PyTorch's defaults (`eps = 1e-5`, `momentum = 0.1`, affine, tracking).
    pub fn new<S: Scalar>(
        b: &mut Builder<'_, S>,
        prefix: &str,
        num_features: usize,
    ) -> Result<Self> {
        let c = [num_features];
        Ok(BatchNorm2d {
            num_features,
            eps: 1e-5,
            momentum: 0.1,
            weight: b.trainable(prefix, "weight", &c, Init::Constant(1.0))?,
            bias: b.trainable(prefix, "bias", &c, Init::Constant(0.0))?,
            running_mean: b.buffer(prefix, "running_mean", &c, Init::Constant(0.0))?,
            running_var: b.buffer(prefix, "running_var", &c, Init::Constant(1.0))?,
            num_batches_tracked: b.buffer(
                prefix,
                "num_batches_tracked",
                &[],
                Init::Constant(0.0),
            )?,
        })
    }

    /// Normalises with batch statistics (training) or running statistics (eval).
    pub fn forward<S: Scalar>(&self, ctx: &mut Ctx<'_, S>, x: Var) -> Result<Var> {
        let (w, b) = (ctx.param(self.weight), ctx.param(self.bias));
        let (rm, rv, nbt) = (
            ctx.param(self.running_mean),
            ctx.param(self.running_var),
            ctx.param(self.num_batches_tracked),
        );
        if ctx.mode() == Mode::Eval {
            return ctx
                .session()
                .batch_norm_eval(x, rm, rv, Some(w), Some(b), self.eps);
        }
        let (y, stats) =
            ctx.session()
                .batch_norm_train(x, Some(w), Some(b), self.momentum, self.eps)?;
        let running = RunningStats {
            node: y,
            input: ctx.session().value(x)?.shape().clone(),
            op: BatchNorm {
                momentum: self.momentum,
                eps: self.eps,
                ..BatchNorm::new(true)
            },
            mean: self.running_mean,
            var: self.running_var,
            tracked: self.num_batches_tracked,
        };
        let updates = {
            let s = ctx.session();
            running.updates(&stats, [s.value(rm)?, s.value(rv)?, s.value(nbt)?])?
        };
        for (id, value) in updates {
            ctx.update_buffer(id, value);
        }
        ctx.note_running_stats(running);
        Ok(y)
    }
}

/// A training-mode batch norm's running-statistics update: the node whose batch statistics feed
/// it and the buffers it sets. An eager pass applies it at once; a traced pass also keeps it, so
/// that the compiled backend redoes it each step from the statistics its saved graph kept (the
/// same statistics, so the same bits).
#[derive(Debug, Clone)]
pub struct RunningStats {
    /// The batch norm's output on the traced tape.
    pub node: Var,
    /// The shape of the batch norm's input.
    pub input: Shape,
    pub op: BatchNorm,
    pub mean: ParamId,
    pub var: ParamId,
    pub tracked: ParamId,
}

impl RunningStats {
    /// The new `running_mean`, `running_var` and `num_batches_tracked` from the batch statistics
    /// and the buffers' current values (in that order): PyTorch's momentum update.
    pub fn updates<S: Scalar>(
        &self,
        stats: &BatchStats<S>,
        [mean, var, tracked]: [&Tensor<S>; 3],
    ) -> Result<[(ParamId, Tensor<S>); 3]> {
        let (new_mean, new_var) = self.op.running_update(mean, var, stats)?;
        Ok([
            (self.mean, new_mean),
            (self.var, new_var),
            (self.tracked, Tensor::scalar(tracked.item()? + S::ONE)),
        ])
    }
}
