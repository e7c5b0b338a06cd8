//! The imperative front-end in PyTorch's vocabulary: parameters, inputs, constants, `detach`, a
//! no-grad switch, ops as methods returning `Result`, and `backward` returning gradients by parameter
//! name. `reset` starts the next step; handles from an earlier step are rejected.

use super::Tape;
use crate::ops::activation::{Gelu, LeakyRelu, Relu, Sigmoid, Silu, Softplus, Tanh};
use crate::ops::elementwise::{
    Abs, Add, Clamp, Cos, Div, Exp, Log, Maximum, Minimum, Mul, Neg, Pow, SafeLog, Scale, Sin,
    Sqrt, Sub, Where,
};
use crate::ops::linalg::{Linear, Matmul, Permute, Transpose};
use crate::ops::loss::{
    BinaryCrossEntropyWithLogits, CrossEntropy, CrossEntropyProbs, MseLoss, NllLoss,
};
use crate::ops::reduce::{Amax, LogSoftmax, LogSumExp, Mean, Softmax, Sum};
use crate::ops::structure::{BroadcastTo, Concat, Flatten, Reshape, Slice};
use crate::ops::{
    class_labels, ActivationOp, ClassLabel, ClassLossOptions, ElementwiseOp, GeluApproximate,
    LinalgOp, LossOp, Mask, Op, ReduceOp, Reduction, StructureOp,
};
use crate::{Error, Result};
use smallvec::SmallVec;
use std::sync::Arc;
use tapegrad_tensor::{Scalar, Tensor};

/// A handle to a value recorded in a session step. Cheap to copy; invalid after `reset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Var {
    id: usize,
    step: u64,
}

impl Var {
    /// The tape id of this value.
    pub fn id(self) -> usize {
        self.id
    }
}

/// Gradients returned by `backward`, one per parameter, in registration order.
#[derive(Debug, Clone, Default)]
pub struct Gradients<S> {
    entries: Vec<(String, Tensor<S>)>,
}

impl<S: Scalar> Gradients<S> {
    /// The gradient of the parameter called `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor<S>> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, g)| g)
    }

    /// `(name, gradient)` pairs in registration order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor<S>)> {
        self.entries.iter().map(|(n, g)| (n.as_str(), g))
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no parameter was registered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The gradients as owned pairs.
    pub fn into_vec(self) -> Vec<(String, Tensor<S>)> {
        self.entries
    }
}

/// An imperative autograd session over one tape.
pub struct Session<S> {
    tape: Tape<S>,
    step: u64,
    grad_enabled: bool,
    params: Vec<(String, usize)>,
}

impl<S: Scalar> Default for Session<S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: Scalar> Session<S> {
    /// A new session at step 0 with gradients enabled.
    pub fn new() -> Self {
        Session {
            tape: Tape::new(),
            step: 0,
            grad_enabled: true,
            params: Vec::new(),
        }
    }

    /// The underlying tape of the current step.
    pub fn tape(&self) -> &Tape<S> {
        &self.tape
    }

    /// The current step number (incremented by `reset`).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Clears the tape for the next step; every earlier handle becomes stale.
    pub fn reset(&mut self) {
        self.tape.clear();
        self.params.clear();
        self.step += 1;
    }

    fn handle(&self, id: usize) -> Var {
        Var {
            id,
            step: self.step,
        }
    }

    fn check(&self, v: Var) -> Result<usize> {
        if v.step != self.step {
            return Err(Error::StaleHandle {
                id: v.id,
                handle_step: v.step,
                session_step: self.step,
            });
        }
        // The bounds test of `Tape::node`, without building its `Result` of a reference.
        if v.id >= self.tape.len() {
            return Err(Error::BadId {
                context: "tape",
                id: v.id,
                len: self.tape.len(),
            });
        }
        Ok(v.id)
    }

    /// Registers a named trainable parameter (a leaf that requires grad) for this step.
    pub fn parameter(&mut self, name: impl Into<String>, value: Tensor<S>) -> Result<Var> {
        let name = name.into();
        if self.params.iter().any(|(n, _)| *n == name) {
            return Err(Error::invalid(
                "parameter",
                format!("a parameter named '{name}' is already registered in this step"),
            ));
        }
        let id = self.tape.leaf_named(name.clone(), value, self.grad_enabled);
        self.params.push((name, id));
        Ok(self.handle(id))
    }

    /// An input value (a leaf that does not require grad).
    pub fn input(&mut self, value: Tensor<S>) -> Var {
        let id = self.tape.leaf(value, false);
        self.handle(id)
    }

    /// A constant (same as an input; the name says intent).
    pub fn constant(&mut self, value: Tensor<S>) -> Var {
        self.input(value)
    }

    /// A named leaf that requires grad but is not a parameter (its gradient is read with `grad_of`).
    pub fn variable(&mut self, name: impl Into<String>, value: Tensor<S>) -> Var {
        let id = self.tape.leaf_named(name, value, self.grad_enabled);
        self.handle(id)
    }

    /// The same value cut off from the graph: no gradient flows through it.
    pub fn detach(&mut self, v: Var) -> Result<Var> {
        let id = self.check(v)?;
        let value = self.tape.value(id)?.clone();
        Ok(self.input(value))
    }

    /// Turns gradient recording on or off (PyTorch's `set_grad_enabled`).
    pub fn set_grad_enabled(&mut self, enabled: bool) {
        self.grad_enabled = enabled;
    }

    /// Anomaly mode: the first NaN or infinity in forward or backward becomes an error naming the node.
    pub fn set_detect_anomaly(&mut self, on: bool) {
        self.tape.set_detect_anomaly(on);
    }

    /// Whether gradient recording is on.
    pub fn grad_enabled(&self) -> bool {
        self.grad_enabled
    }

    /// Runs `f` with gradient recording off, then restores the previous setting.
    pub fn no_grad<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        let before = self.grad_enabled;
        self.grad_enabled = false;
        let r = f(self);
        self.grad_enabled = before;
        r
    }

    /// The value behind a handle.
    pub fn value(&self, v: Var) -> Result<&Tensor<S>> {
        let id = self.check(v)?;
        self.tape.value(id)
    }

    /// Names the node behind a handle (shown in errors, audits and anomaly reports).
    pub fn set_name(&mut self, v: Var, name: impl Into<String>) -> Result<()> {
        let id = self.check(v)?;
        self.tape.set_name(id, name)
    }

    /// Applies any op to handles.
    #[inline]
    pub fn apply(&mut self, op: Op, args: &[Var]) -> Result<Var> {
        // One and two arguments (most ops) pass their ids in arrays: recording an op allocates
        // nothing for them, and `Tape::apply` sees a length known at compile time.
        let id = match *args {
            [a] => {
                let ids = [self.check(a)?];
                self.record(op, &ids)?
            }
            [a, b] => {
                let ids = [self.check(a)?, self.check(b)?];
                self.record(op, &ids)?
            }
            _ => {
                let mut ids = SmallVec::<[usize; 4]>::new();
                for &v in args {
                    ids.push(self.check(v)?);
                }
                self.record(op, &ids)?
            }
        };
        Ok(self.handle(id))
    }

    /// Records `op` on checked ids: an op node while gradients are enabled, else a leaf.
    #[inline(always)]
    fn record(&mut self, op: Op, ids: &[usize]) -> Result<usize> {
        if self.grad_enabled {
            self.tape.apply(op, ids)
        } else {
            self.record_no_grad(op, ids)
        }
    }

    /// The value of `op` on checked ids as a leaf that does not require grad.
    #[inline(never)]
    fn record_no_grad(&mut self, op: Op, ids: &[usize]) -> Result<usize> {
        let inputs = ids
            .iter()
            .map(|&i| self.tape.value(i))
            .collect::<Result<SmallVec<[&Tensor<S>; 4]>>>()?;
        let value = op.forward(&inputs)?.value;
        drop(inputs);
        if self.tape.detect_anomaly() {
            super::anomaly::check_forward(&self.tape, op.name(), ids, &value)?;
        }
        Ok(self.tape.leaf(value, false))
    }

    /// Gradients of a one-element `loss` for every parameter of this step (seed 1).
    pub fn backward(&mut self, loss: Var) -> Result<Gradients<S>> {
        let id = self.check(loss)?;
        let value = self.tape.value(id)?;
        if value.numel() != 1 {
            return Err(Error::invalid(
                "backward",
                format!(
                    "an implicit seed needs a one-element output, but the output has shape {} (use backward_with)",
                    value.shape()
                ),
            ));
        }
        let seed = Tensor::ones(value.shape());
        self.backward_with(loss, &seed)
    }

    /// Gradients for every parameter of this step, from an explicit seed for `out`.
    pub fn backward_with(&mut self, out: Var, seed: &Tensor<S>) -> Result<Gradients<S>> {
        let id = self.check(out)?;
        // Only the parameters' slots are read, so the sweep frees every other cotangent early.
        let ids: Vec<usize> = self.params.iter().map(|&(_, pid)| pid).collect();
        let grads = self.tape.backward_at(id, seed, &ids)?;
        Ok(Gradients {
            entries: self
                .params
                .iter()
                .zip(grads)
                .map(|((n, _), g)| (n.clone(), g))
                .collect(),
        })
    }

    /// Gradients of every node of this step (for leaves made with `variable`).
    pub fn backward_all(&mut self, out: Var, seed: &Tensor<S>) -> Result<Vec<Tensor<S>>> {
        let id = self.check(out)?;
        self.tape.backward_all(id, seed)
    }

    /// The mask `value > threshold`, for `where_`.
    pub fn gt(&self, v: Var, threshold: f64) -> Result<Mask> {
        let t = S::from_f64(threshold);
        Ok(Mask::from_tensor(self.value(v)?, |x| x > t))
    }

    /// The mask `value < threshold`, for `where_`.
    pub fn lt(&self, v: Var, threshold: f64) -> Result<Mask> {
        let t = S::from_f64(threshold);
        Ok(Mask::from_tensor(self.value(v)?, |x| x < t))
    }
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:expr;)*) => {
        impl<S: Scalar> Session<S> {
            $($(#[$doc])* pub fn $name(&mut self, x: Var) -> Result<Var> { self.apply($op, &[x]) })*
        }
    };
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:expr;)*) => {
        impl<S: Scalar> Session<S> {
            $($(#[$doc])* pub fn $name(&mut self, a: Var, b: Var) -> Result<Var> { self.apply($op, &[a, b]) })*
        }
    };
}

unary_methods! {
    /// `-x`.
    neg => Op::Elementwise(ElementwiseOp::Neg(Neg));
    /// `|x|` (gradient 0 at 0).
    abs => Op::Elementwise(ElementwiseOp::Abs(Abs));
    /// `sqrt(x)`.
    sqrt => Op::Elementwise(ElementwiseOp::Sqrt(Sqrt));
    /// `exp(x)`.
    exp => Op::Elementwise(ElementwiseOp::Exp(Exp));
    /// `ln(x)`.
    log => Op::Elementwise(ElementwiseOp::Log(Log));
    /// `sin(x)`.
    sin => Op::Elementwise(ElementwiseOp::Sin(Sin));
    /// `cos(x)`.
    cos => Op::Elementwise(ElementwiseOp::Cos(Cos));
    /// `max(x, 0)`.
    relu => Op::Activation(ActivationOp::Relu(Relu));
    /// Logistic sigmoid.
    sigmoid => Op::Activation(ActivationOp::Sigmoid(Sigmoid));
    /// Hyperbolic tangent.
    tanh => Op::Activation(ActivationOp::Tanh(Tanh));
    /// `x * sigmoid(x)`.
    silu => Op::Activation(ActivationOp::Silu(Silu));
    /// Sum of all elements (a scalar).
    sum => Op::Reduce(ReduceOp::Sum(Sum { axes: None, keepdim: false }));
    /// Mean of all elements (a scalar).
    mean => Op::Reduce(ReduceOp::Mean(Mean { axes: None, keepdim: false }));
}

binary_methods! {
    /// `a + b` with broadcasting.
    add => Op::Elementwise(ElementwiseOp::Add(Add));
    /// `a - b` with broadcasting.
    sub => Op::Elementwise(ElementwiseOp::Sub(Sub));
    /// `a * b` with broadcasting.
    mul => Op::Elementwise(ElementwiseOp::Mul(Mul));
    /// `a / b` with broadcasting.
    div => Op::Elementwise(ElementwiseOp::Div(Div));
    /// Elementwise maximum (ties split the gradient).
    maximum => Op::Elementwise(ElementwiseOp::Maximum(Maximum));
    /// Elementwise minimum (ties split the gradient).
    minimum => Op::Elementwise(ElementwiseOp::Minimum(Minimum));
    /// `a @ b` (torch.matmul).
    matmul => Op::Linalg(LinalgOp::Matmul(Matmul));
    /// Mean squared error (mean reduction).
    mse_loss => Op::Loss(LossOp::MseLoss(MseLoss { reduction: Reduction::Mean }));
    /// Binary cross entropy with logits (mean reduction).
    binary_cross_entropy_with_logits => Op::Loss(LossOp::bce_with_logits(Reduction::Mean));
}

impl<S: Scalar> Session<S> {
    /// `x * factor`.
    pub fn scale(&mut self, x: Var, factor: f64) -> Result<Var> {
        self.apply(
            Op::Elementwise(ElementwiseOp::Scale(Scale { factor })),
            &[x],
        )
    }

    /// `log(max(x, eps))`.
    pub fn safe_log(&mut self, x: Var, eps: f64) -> Result<Var> {
        self.apply(
            Op::Elementwise(ElementwiseOp::SafeLog(SafeLog { eps })),
            &[x],
        )
    }

    /// `x ^ exponent`.
    pub fn pow(&mut self, x: Var, exponent: f64) -> Result<Var> {
        self.apply(Op::Elementwise(ElementwiseOp::Pow(Pow { exponent })), &[x])
    }

    /// Clamps into `[min, max]`.
    pub fn clamp(&mut self, x: Var, min: Option<f64>, max: Option<f64>) -> Result<Var> {
        self.apply(
            Op::Elementwise(ElementwiseOp::Clamp(Clamp { min, max })),
            &[x],
        )
    }

    /// `mask ? a : b`.
    pub fn where_(&mut self, mask: Mask, a: Var, b: Var) -> Result<Var> {
        self.apply(
            Op::Elementwise(ElementwiseOp::Where(Where { mask })),
            &[a, b],
        )
    }

    /// Leaky ReLU.
    pub fn leaky_relu(&mut self, x: Var, negative_slope: f64) -> Result<Var> {
        self.apply(
            Op::Activation(ActivationOp::LeakyRelu(LeakyRelu { negative_slope })),
            &[x],
        )
    }

    /// GELU, exact (`tanh = false`) or tanh-approximated.
    pub fn gelu(&mut self, x: Var, tanh: bool) -> Result<Var> {
        let approximate = if tanh {
            GeluApproximate::Tanh
        } else {
            GeluApproximate::None
        };
        self.apply(
            Op::Activation(ActivationOp::Gelu(Gelu { approximate })),
            &[x],
        )
    }

    /// Softplus with PyTorch's `beta` and `threshold`.
    pub fn softplus(&mut self, x: Var, beta: f64, threshold: f64) -> Result<Var> {
        self.apply(
            Op::Activation(ActivationOp::Softplus(Softplus { beta, threshold })),
            &[x],
        )
    }

    /// Sum over `axes`.
    pub fn sum_axes(&mut self, x: Var, axes: &[isize], keepdim: bool) -> Result<Var> {
        self.apply(
            Op::Reduce(ReduceOp::Sum(Sum {
                axes: Some(axes.to_vec()),
                keepdim,
            })),
            &[x],
        )
    }

    /// Mean over `axes`.
    pub fn mean_axes(&mut self, x: Var, axes: &[isize], keepdim: bool) -> Result<Var> {
        self.apply(
            Op::Reduce(ReduceOp::Mean(Mean {
                axes: Some(axes.to_vec()),
                keepdim,
            })),
            &[x],
        )
    }

    /// Max over `axes` (ties share the gradient).
    pub fn amax(&mut self, x: Var, axes: &[isize], keepdim: bool) -> Result<Var> {
        self.apply(
            Op::Reduce(ReduceOp::Amax(Amax {
                axes: Some(axes.to_vec()),
                keepdim,
            })),
            &[x],
        )
    }

    /// `log(sum(exp(x)))` over `axes` (torch.logsumexp), shifted by the maximum for stability.
    pub fn logsumexp(&mut self, x: Var, axes: &[isize], keepdim: bool) -> Result<Var> {
        self.apply(
            Op::Reduce(ReduceOp::LogSumExp(LogSumExp {
                axes: Some(axes.to_vec()),
                keepdim,
            })),
            &[x],
        )
    }

    /// Softmax along `axis`.
    pub fn softmax(&mut self, x: Var, axis: isize) -> Result<Var> {
        self.apply(Op::Reduce(ReduceOp::Softmax(Softmax { axis })), &[x])
    }

    /// Log-softmax along `axis`.
    pub fn log_softmax(&mut self, x: Var, axis: isize) -> Result<Var> {
        self.apply(Op::Reduce(ReduceOp::LogSoftmax(LogSoftmax { axis })), &[x])
    }

    /// `x @ w^T + b` (bias optional).
    pub fn linear(&mut self, x: Var, w: Var, b: Option<Var>) -> Result<Var> {
        match b {
            Some(b) => self.apply(
                Op::Linalg(LinalgOp::Linear(Linear { bias: true })),
                &[x, w, b],
            ),
            None => self.apply(
                Op::Linalg(LinalgOp::Linear(Linear { bias: false })),
                &[x, w],
            ),
        }
    }

    /// Swaps two axes.
    pub fn transpose(&mut self, x: Var, dim0: isize, dim1: isize) -> Result<Var> {
        self.apply(
            Op::Linalg(LinalgOp::Transpose(Transpose { dim0, dim1 })),
            &[x],
        )
    }

    /// Reorders axes.
    pub fn permute(&mut self, x: Var, dims: &[isize]) -> Result<Var> {
        self.apply(
            Op::Linalg(LinalgOp::Permute(Permute {
                dims: dims.to_vec(),
            })),
            &[x],
        )
    }

    /// New shape (one -1 is inferred).
    pub fn reshape(&mut self, x: Var, shape: &[isize]) -> Result<Var> {
        self.apply(
            Op::Structure(StructureOp::Reshape(Reshape {
                shape: shape.to_vec(),
            })),
            &[x],
        )
    }

    /// Merges axes `start_dim..=end_dim`.
    pub fn flatten(&mut self, x: Var, start_dim: isize, end_dim: isize) -> Result<Var> {
        self.apply(
            Op::Structure(StructureOp::Flatten(Flatten { start_dim, end_dim })),
            &[x],
        )
    }

    /// Broadcasts to `shape`.
    pub fn broadcast_to(&mut self, x: Var, shape: &[usize]) -> Result<Var> {
        self.apply(
            Op::Structure(StructureOp::BroadcastTo(BroadcastTo {
                shape: shape.to_vec(),
            })),
            &[x],
        )
    }

    /// Concatenates along `axis`.
    pub fn concat(&mut self, xs: &[Var], axis: isize) -> Result<Var> {
        self.apply(Op::Structure(StructureOp::Concat(Concat { axis })), xs)
    }

    /// Python-style slice along `axis`.
    pub fn slice(
        &mut self,
        x: Var,
        axis: isize,
        start: isize,
        end: isize,
        step: usize,
    ) -> Result<Var> {
        self.apply(
            Op::Structure(StructureOp::Slice(Slice {
                axis,
                start,
                end,
                step,
            })),
            &[x],
        )
    }

    /// Cross entropy of logits against class labels (mean reduction, no ignored label: every
    /// label must be a class index).
    pub fn cross_entropy<L: ClassLabel>(&mut self, logits: Var, targets: &[L]) -> Result<Var> {
        self.cross_entropy_with(logits, targets, &ClassLossOptions::default())
    }

    /// Cross entropy with PyTorch's keyword arguments: `reduction`, class `weight`,
    /// `ignore_index` (any integer: `Some(-100)` with -100 padding labels, as PyTorch users
    /// write) and `label_smoothing`. The logits are (C), (N, C) or (N, C, d1, ..., dk) with one
    /// label per position of (N, d1, ..., dk), row-major, of any integer type.
    pub fn cross_entropy_with<L: ClassLabel>(
        &mut self,
        logits: Var,
        targets: &[L],
        options: &ClassLossOptions,
    ) -> Result<Var> {
        let op = LossOp::CrossEntropy(CrossEntropy {
            targets: class_labels(targets),
            reduction: options.reduction,
            weight: options.weight.clone().map(Arc::new),
            ignore_index: options.ignore_index,
            label_smoothing: options.label_smoothing,
        });
        self.apply(Op::Loss(op), &[logits])
    }

    /// PyTorch's cross_entropy with a probability target: `target_probs` has the logits' shape
    /// ((C), (N, C) or (N, C, d1, ..., dk)) and is differentiable too; mean reduction.
    pub fn cross_entropy_probs(&mut self, logits: Var, target_probs: Var) -> Result<Var> {
        self.cross_entropy_probs_with(logits, target_probs, &ClassLossOptions::default())
    }

    /// cross_entropy_probs with PyTorch's keyword arguments `reduction`, class `weight` and
    /// `label_smoothing`; the mean divides by the number of positions, not by the weights.
    /// PyTorch rejects `ignore_index` with a probability target, and so does this method.
    pub fn cross_entropy_probs_with(
        &mut self,
        logits: Var,
        target_probs: Var,
        options: &ClassLossOptions,
    ) -> Result<Var> {
        if let Some(i) = options.ignore_index {
            return Err(Error::invalid(
                "cross_entropy_probs",
                format!("ignore_index ({i}) is not supported with probability targets"),
            ));
        }
        let op = LossOp::CrossEntropyProbs(CrossEntropyProbs {
            reduction: options.reduction,
            weight: options.weight.clone().map(Arc::new),
            label_smoothing: options.label_smoothing,
        });
        self.apply(Op::Loss(op), &[logits, target_probs])
    }

    /// binary_cross_entropy_with_logits with PyTorch's `reduction` and `pos_weight` (its shape
    /// must broadcast into the logits': `[C]` per class along the last axis, `[C, 1, 1]` along the
    /// third-to-last, `[1]` for all).
    pub fn binary_cross_entropy_with_logits_with(
        &mut self,
        logits: Var,
        targets: Var,
        reduction: Reduction,
        pos_weight: Option<&Tensor<f64>>,
    ) -> Result<Var> {
        let op = LossOp::BinaryCrossEntropyWithLogits(BinaryCrossEntropyWithLogits {
            reduction,
            pos_weight: pos_weight.map(|w| Arc::new(w.clone())),
            weight: None,
        });
        self.apply(Op::Loss(op), &[logits, targets])
    }

    /// binary_cross_entropy_with_logits with PyTorch's `weight` (a factor per element; its shape
    /// must broadcast into the logits', as PyTorch requires; not differentiated) besides
    /// `reduction` and `pos_weight`.
    pub fn binary_cross_entropy_with_logits_weighted(
        &mut self,
        logits: Var,
        targets: Var,
        reduction: Reduction,
        weight: &Tensor<f64>,
        pos_weight: Option<&Tensor<f64>>,
    ) -> Result<Var> {
        let op = LossOp::bce_with_logits_weighted(reduction, weight.clone(), pos_weight.cloned());
        self.apply(Op::Loss(op), &[logits, targets])
    }

    /// nll_loss with PyTorch's keyword arguments: `reduction`, class `weight` and `ignore_index`
    /// (any integer, as in `cross_entropy_with`); it has no `label_smoothing`: a non-zero one is
    /// an error.
    pub fn nll_loss_with<L: ClassLabel>(
        &mut self,
        log_probs: Var,
        targets: &[L],
        options: &ClassLossOptions,
    ) -> Result<Var> {
        if options.label_smoothing != 0.0 {
            return Err(Error::invalid(
                "nll_loss",
                format!(
                    "nll_loss has no label_smoothing (found {}); use cross_entropy on logits",
                    options.label_smoothing
                ),
            ));
        }
        let op = LossOp::NllLoss(NllLoss {
            targets: class_labels(targets),
            reduction: options.reduction,
            weight: options.weight.clone().map(Arc::new),
            ignore_index: options.ignore_index,
        });
        self.apply(Op::Loss(op), &[log_probs])
    }

    /// Negative log-likelihood of log-probabilities against class labels (mean reduction, no
    /// ignored label).
    pub fn nll_loss<L: ClassLabel>(&mut self, log_probs: Var, targets: &[L]) -> Result<Var> {
        self.nll_loss_with(log_probs, targets, &ClassLossOptions::default())
    }
}
