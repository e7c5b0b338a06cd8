//! Random op sequences through the session API: leaves of small random shapes (zeros included)
//! and special values, then every op family (nn included) with random attributes and wiring,
//! no-grad, detach, anomaly mode, reset (so stale handles), and backward. Property: every call is
//! an `Err` or a result of the shape the op's shape rule gives; gradients have their parameters'
//! shapes; on a zero-preserving tape the executed sweep equals the reference sweep (law 1).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;
use tapegrad_core::ops::activation::{Gelu, LeakyRelu, Relu, Sigmoid, Silu, Softplus, Tanh};
use tapegrad_core::ops::elementwise::{
    Abs, Add, Clamp, Cos, Div, Exp, Log, Maximum, Minimum, Mul, Neg, Pow, SafeLog, Scale, Sin,
    Sqrt, Sub, Where,
};
use tapegrad_core::ops::linalg::{Linear, Matmul, Permute, Transpose};
use tapegrad_core::ops::loss::MseLoss;
use tapegrad_core::ops::nn::{
    AdaptiveAvgPool2d, AvgPool2d, Conv1d, Conv2d, Dropout, Embedding, Gather, GroupNorm,
    IndexSelect, IndexTensor, LayerNorm, MaxPool2d, NamedPadding, NnOp, PaddingMode,
    ScaledDotProductAttention, ScatterAdd, Select,
};
use tapegrad_core::ops::reduce::{LogSoftmax, Softmax};
use tapegrad_core::ops::structure::{BroadcastTo, Concat, Flatten, Reshape, Slice};
use tapegrad_core::ops::{
    ActivationOp, ElementwiseOp, GeluApproximate, LinalgOp, LossOp, Mask, OpKind, ReduceOp,
    Reduction, StructureOp,
};
use tapegrad_core::{audit, Op, Scalar, Session, Shape, Tensor, Var};

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Val {
    Zero,
    NegZero,
    One,
    NegOne,
    Small(i8),
    Inf,
    NegInf,
    Nan,
    Huge,
    Tiny,
}

impl Val {
    fn get(self) -> f64 {
        match self {
            Val::Zero => 0.0,
            Val::NegZero => -0.0,
            Val::One => 1.0,
            Val::NegOne => -1.0,
            Val::Small(i) => f64::from(i) / 8.0,
            Val::Inf => f64::INFINITY,
            Val::NegInf => f64::NEG_INFINITY,
            Val::Nan => f64::NAN,
            Val::Huge => 1e300,
            Val::Tiny => 1e-300,
        }
    }
}

/// Dimensions 0..=4, rank at most 5: every tensor stays small.
fn dims(raw: &[u8]) -> Vec<usize> {
    raw.iter().take(5).map(|&d| usize::from(d % 5)).collect()
}

fn red(r: u8) -> Reduction {
    [Reduction::None, Reduction::Mean, Reduction::Sum][usize::from(r % 3)]
}

fn small(v: u8) -> usize {
    usize::from(v % 4)
}

fn pair(v: [u8; 2]) -> [usize; 2] {
    [small(v[0]), small(v[1])]
}

/// Indices mostly in range, sometimes not; `raw` skips the length check (the fields are public).
#[derive(Arbitrary, Debug)]
struct Index {
    dims: Vec<u8>,
    data: Vec<u8>,
    raw: bool,
}

impl Index {
    fn get(&self) -> Option<IndexTensor> {
        let dims = dims(&self.dims);
        let data: Vec<usize> = self
            .data
            .iter()
            .take(64)
            .map(|&i| usize::from(i % 6))
            .collect();
        if self.raw {
            Some(IndexTensor {
                shape: Shape::new(&dims).ok()?,
                data: Arc::new(data),
            })
        } else {
            let n = Shape::new(&dims).ok()?.numel();
            let data = (0..n).map(|i| data.get(i).copied().unwrap_or(0)).collect();
            IndexTensor::new(&dims, data).ok()
        }
    }
}

#[derive(Arbitrary, Debug)]
struct RawMask {
    dims: Vec<u8>,
    data: Vec<bool>,
}

impl RawMask {
    fn get(&self) -> Option<Mask> {
        Some(Mask {
            shape: Shape::new(dims(&self.dims)).ok()?,
            data: Arc::new(self.data.iter().take(64).copied().collect()),
        })
    }
}

#[derive(Arbitrary, Debug)]
struct Leaf {
    kind: u8,
    dims: Vec<u8>,
    fill: Vec<Val>,
}

#[derive(Arbitrary, Debug)]
enum Step {
    Leaf(Leaf),
    Unary(u8, u8),
    Binary(u8, u8, u8),
    Scale(u8, Val),
    SafeLog(u8, Val),
    Pow(u8, Val),
    Clamp(u8, Option<Val>, Option<Val>),
    Where(u8, Val, u8, u8),
    WhereRaw(RawMask, u8, u8),
    LeakyRelu(u8, Val),
    Gelu(u8, bool),
    Softplus(u8, Val, Val),
    Reduce(u8, u8, Option<Vec<i8>>, bool),
    Softmax(u8, i8, bool),
    Linear(u8, u8, Option<u8>),
    Transpose(u8, i8, i8),
    Permute(u8, Vec<i8>),
    Reshape(u8, Vec<i8>),
    Flatten(u8, i8, i8),
    BroadcastTo(u8, Vec<u8>),
    Concat(Vec<u8>, i8),
    Slice(u8, i8, i8, i8, u8),
    ClassLoss(u8, Vec<u8>, u8, bool),
    PairLoss(u8, u8, u8, bool),
    Conv1d(u8, u8, Option<u8>, [u8; 4], u8),
    Conv2d(u8, u8, Option<u8>, [[u8; 2]; 3], u8, u8),
    MaxPool(u8, [[u8; 2]; 4], bool),
    AvgPool(u8, [[u8; 2]; 3], bool, bool, Option<i8>),
    AdaptivePool(u8, [u8; 2]),
    LayerNorm(u8, Vec<u8>, Option<u8>, Option<u8>, Val),
    GroupNorm(u8, u8, Option<u8>, Option<u8>, Val),
    BatchNormTrain(u8, Option<u8>, Option<u8>, Val, Val),
    BatchNormEval(u8, u8, u8, Option<u8>, Option<u8>, Val),
    Embedding(Index, u8, Option<i8>),
    IndexSelect(u8, i8, Index),
    Gather(u8, i8, Index),
    ScatterAdd(u8, i8, Index, u8),
    Select(u8, i8, i8),
    Dropout(u8, Val, bool, u64),
    /// Query, key, value, causal, scale, boolean mask, float mask (a fourth argument),
    /// dropout probability and seed.
    Attention(u8, u8, u8, bool, Option<Val>, Option<RawMask>, Option<u8>, Option<Val>, u64),
    Detach(u8),
    NoGrad(bool),
    Anomaly(bool),
    Reset,
    Backward(u8),
}

#[derive(Arbitrary, Debug)]
struct Program {
    f32: bool,
    steps: Vec<Step>,
    out: u8,
    seed: Val,
}

struct Run<S: Scalar> {
    s: Session<S>,
    /// Anomaly mode makes the executed sweep fail on a non-finite gradient (by design; the
    /// reference sweep has no such check), so law 1 is compared only without it.
    anomaly: bool,
    vars: Vec<Var>,
    params: Vec<(String, Shape)>,
}

impl<S: Scalar> Run<S> {
    fn var(&self, i: u8) -> Option<Var> {
        (!self.vars.is_empty()).then(|| self.vars[usize::from(i) % self.vars.len()])
    }

    /// Applies `op`; a success must have the shape the op's shape rule gives.
    fn apply(&mut self, op: Op, args: &[u8]) {
        let Some(vars) = args
            .iter()
            .map(|&a| self.var(a))
            .collect::<Option<Vec<_>>>()
        else {
            return;
        };
        if let Ok(v) = self.s.apply(op.clone(), &vars) {
            let shapes: Vec<Shape> = vars
                .iter()
                .map(|&a| {
                    self.s
                        .value(a)
                        .expect("a used handle is live")
                        .shape()
                        .clone()
                })
                .collect();
            let refs: Vec<&Shape> = shapes.iter().collect();
            let rule = op
                .output_shape(&refs)
                .expect("shape rule of a successful op");
            assert_eq!(self.s.value(v).unwrap().shape(), &rule, "{op}");
            self.vars.push(v);
        }
    }

    fn opt(&self, i: Option<u8>) -> Option<Option<Var>> {
        match i {
            None => Some(None),
            Some(i) => self.var(i).map(Some),
        }
    }

    fn leaf(&mut self, leaf: &Leaf) {
        let Ok(shape) = Shape::new(dims(&leaf.dims)) else {
            return;
        };
        let data: Vec<S> = (0..shape.numel())
            .map(|i| {
                let v = leaf.fill.get(i % leaf.fill.len().max(1)).copied();
                // Distinct finite values where the fill runs out, so ties are not the rule.
                S::from_f64(v.map_or(i as f64 * 0.37 - 1.0, Val::get))
            })
            .collect();
        let t = Tensor::from_shape(shape.clone(), data).expect("data of the shape's length");
        let v = match leaf.kind % 4 {
            0 => {
                let name = format!("p{}", self.params.len());
                match self.s.parameter(name.clone(), t) {
                    Ok(v) => {
                        self.params.push((name, shape));
                        v
                    }
                    Err(_) => return,
                }
            }
            1 => self.s.input(t),
            2 => self.s.constant(t),
            _ => self.s.variable("v", t),
        };
        self.vars.push(v);
    }

    fn step(&mut self, step: &Step) {
        use Step as K;
        let el = Op::Elementwise;
        match step {
            K::Leaf(leaf) => self.leaf(leaf),
            K::Unary(which, x) => {
                let ops = [
                    el(ElementwiseOp::Neg(Neg)),
                    el(ElementwiseOp::Abs(Abs)),
                    el(ElementwiseOp::Sqrt(Sqrt)),
                    el(ElementwiseOp::Exp(Exp)),
                    el(ElementwiseOp::Log(Log)),
                    el(ElementwiseOp::Sin(Sin)),
                    el(ElementwiseOp::Cos(Cos)),
                    Op::Activation(ActivationOp::Relu(Relu)),
                    Op::Activation(ActivationOp::Sigmoid(Sigmoid)),
                    Op::Activation(ActivationOp::Tanh(Tanh)),
                    Op::Activation(ActivationOp::Silu(Silu)),
                ];
                let op = ops[usize::from(*which) % ops.len()].clone();
                self.apply(op, &[*x]);
            }
            K::Binary(which, a, b) => {
                let ops = [
                    el(ElementwiseOp::Add(Add)),
                    el(ElementwiseOp::Sub(Sub)),
                    el(ElementwiseOp::Mul(Mul)),
                    el(ElementwiseOp::Div(Div)),
                    el(ElementwiseOp::Maximum(Maximum)),
                    el(ElementwiseOp::Minimum(Minimum)),
                    Op::Linalg(LinalgOp::Matmul(Matmul)),
                ];
                let op = ops[usize::from(*which) % ops.len()].clone();
                self.apply(op, &[*a, *b]);
            }
            K::Scale(x, v) => {
                self.apply(el(ElementwiseOp::Scale(Scale { factor: v.get() })), &[*x])
            }
            K::SafeLog(x, v) => {
                self.apply(el(ElementwiseOp::SafeLog(SafeLog { eps: v.get() })), &[*x])
            }
            K::Pow(x, v) => {
                self.apply(el(ElementwiseOp::Pow(Pow { exponent: v.get() })), &[*x])
            }
            K::Clamp(x, lo, hi) => self.apply(
                el(ElementwiseOp::Clamp(Clamp {
                    min: lo.map(Val::get),
                    max: hi.map(Val::get),
                })),
                &[*x],
            ),
            K::Where(m, t, a, b) => {
                let Some(m) = self.var(*m) else { return };
                let Ok(mask) = self.s.gt(m, t.get()) else {
                    return;
                };
                self.apply(el(ElementwiseOp::Where(Where { mask })), &[*a, *b]);
            }
            K::WhereRaw(mask, a, b) => {
                if let Some(mask) = mask.get() {
                    self.apply(el(ElementwiseOp::Where(Where { mask })), &[*a, *b]);
                }
            }
            K::LeakyRelu(x, v) => self.apply(
                Op::Activation(ActivationOp::LeakyRelu(LeakyRelu {
                    negative_slope: v.get(),
                })),
                &[*x],
            ),
            K::Gelu(x, tanh) => {
                let approximate = if *tanh {
                    GeluApproximate::Tanh
                } else {
                    GeluApproximate::None
                };
                self.apply(Op::Activation(ActivationOp::Gelu(Gelu { approximate })), &[*x]);
            }
            K::Softplus(x, beta, threshold) => self.apply(
                Op::Activation(ActivationOp::Softplus(Softplus {
                    beta: beta.get(),
                    threshold: threshold.get(),
                })),
                &[*x],
            ),
            K::Reduce(which, x, axes, keepdim) => {
                let axes = axes
                    .as_ref()
                    .map(|a| a.iter().take(6).map(|&i| isize::from(i % 7)).collect());
                // Every reduction over axes in the list of ops (sum, mean, amax, ...).
                let kinds: Vec<OpKind> = OpKind::ALL
                    .iter()
                    .copied()
                    .filter(|&k| ReduceOp::over_axes(k, None, false).is_some())
                    .collect();
                let kind = kinds[usize::from(*which) % kinds.len()];
                if let Some(op) = ReduceOp::over_axes(kind, axes, *keepdim) {
                    self.apply(Op::Reduce(op), &[*x]);
                }
            }
            K::Softmax(x, axis, log) => {
                let axis = isize::from(*axis % 7);
                let op = if *log {
                    ReduceOp::LogSoftmax(LogSoftmax { axis })
                } else {
                    ReduceOp::Softmax(Softmax { axis })
                };
                self.apply(Op::Reduce(op), &[*x]);
            }
            K::Linear(x, w, b) => match b {
                Some(b) => self.apply(
                    Op::Linalg(LinalgOp::Linear(Linear { bias: true })),
                    &[*x, *w, *b],
                ),
                None => self.apply(
                    Op::Linalg(LinalgOp::Linear(Linear { bias: false })),
                    &[*x, *w],
                ),
            },
            K::Transpose(x, d0, d1) => self.apply(
                Op::Linalg(LinalgOp::Transpose(Transpose {
                    dim0: isize::from(*d0 % 7),
                    dim1: isize::from(*d1 % 7),
                })),
                &[*x],
            ),
            K::Permute(x, d) => self.apply(
                Op::Linalg(LinalgOp::Permute(Permute {
                    dims: d.iter().take(6).map(|&i| isize::from(i % 7)).collect(),
                })),
                &[*x],
            ),
            K::Reshape(x, d) => self.apply(
                Op::Structure(StructureOp::Reshape(Reshape {
                    shape: d.iter().take(6).map(|&i| isize::from(i % 9)).collect(),
                })),
                &[*x],
            ),
            K::Flatten(x, s, e) => self.apply(
                Op::Structure(StructureOp::Flatten(Flatten {
                    start_dim: isize::from(*s % 7),
                    end_dim: isize::from(*e % 7),
                })),
                &[*x],
            ),
            K::BroadcastTo(x, d) => self.apply(
                Op::Structure(StructureOp::BroadcastTo(BroadcastTo { shape: dims(d) })),
                &[*x],
            ),
            K::Concat(xs, axis) => {
                let xs: Vec<u8> = xs.iter().take(4).copied().collect();
                self.apply(
                    Op::Structure(StructureOp::Concat(Concat {
                        axis: isize::from(*axis % 7),
                    })),
                    &xs,
                );
            }
            K::Slice(x, axis, start, end, step) => self.apply(
                Op::Structure(StructureOp::Slice(Slice {
                    axis: isize::from(*axis % 7),
                    start: isize::from(*start % 9),
                    end: isize::from(*end % 9),
                    step: usize::from(*step % 4),
                })),
                &[*x],
            ),
            K::ClassLoss(x, targets, r, nll) => {
                let targets = Arc::new(
                    targets
                        .iter()
                        .take(8)
                        .map(|&t| usize::from(t % 6))
                        .collect(),
                );
                let reduction = red(*r);
                let op = if *nll {
                    LossOp::nll_loss(targets, reduction)
                } else {
                    LossOp::cross_entropy(targets, reduction)
                };
                self.apply(Op::Loss(op), &[*x]);
            }
            K::PairLoss(a, b, r, bce) => {
                let reduction = red(*r);
                let op = if *bce {
                    LossOp::bce_with_logits(reduction)
                } else {
                    LossOp::MseLoss(MseLoss { reduction })
                };
                self.apply(Op::Loss(op), &[*a, *b]);
            }
            K::Conv1d(x, w, b, [s, p, d, g], padding_kind) => {
                let (named_padding, padding_mode) = padding_kind_of(*padding_kind);
                let op = Conv1d {
                    stride: small(*s),
                    padding: small(*p),
                    dilation: small(*d),
                    groups: small(*g),
                    bias: b.is_some(),
                    named_padding,
                    padding_mode,
                };
                let args: Vec<u8> = [*x, *w].into_iter().chain(*b).collect();
                self.apply(Op::Nn(Box::new(NnOp::Conv1d(op))), &args);
            }
            K::Conv2d(x, w, b, [s, p, d], g, padding_kind) => {
                let (named_padding, padding_mode) = padding_kind_of(*padding_kind);
                let op = Conv2d {
                    stride: pair(*s),
                    padding: pair(*p),
                    dilation: pair(*d),
                    groups: small(*g),
                    bias: b.is_some(),
                    named_padding,
                    padding_mode,
                };
                let args: Vec<u8> = [*x, *w].into_iter().chain(*b).collect();
                self.apply(Op::Nn(Box::new(NnOp::Conv2d(op))), &args);
            }
            K::MaxPool(x, [k, s, p, d], ceil_mode) => {
                let op = MaxPool2d {
                    kernel_size: pair(*k),
                    stride: pair(*s),
                    padding: pair(*p),
                    dilation: pair(*d),
                    ceil_mode: *ceil_mode,
                };
                self.apply(Op::Nn(Box::new(NnOp::MaxPool2d(op))), &[*x]);
            }
            K::AvgPool(x, [k, s, p], ceil_mode, count_include_pad, divisor) => {
                let op = AvgPool2d {
                    kernel_size: pair(*k),
                    stride: pair(*s),
                    padding: pair(*p),
                    ceil_mode: *ceil_mode,
                    count_include_pad: *count_include_pad,
                    divisor_override: divisor.map(i64::from),
                };
                self.apply(Op::Nn(Box::new(NnOp::AvgPool2d(op))), &[*x]);
            }
            K::AdaptivePool(x, size) => {
                let op = AdaptiveAvgPool2d {
                    output_size: pair(*size),
                };
                self.apply(Op::Nn(Box::new(NnOp::AdaptiveAvgPool2d(op))), &[*x]);
            }
            K::LayerNorm(x, shape, w, b, eps) => {
                let op = LayerNorm {
                    normalized_shape: dims(shape),
                    eps: eps.get(),
                    weight: w.is_some(),
                    bias: b.is_some(),
                };
                let args: Vec<u8> = [*x].into_iter().chain(*w).chain(*b).collect();
                self.apply(Op::Nn(Box::new(NnOp::LayerNorm(op))), &args);
            }
            K::GroupNorm(x, groups, w, b, eps) => {
                let op = GroupNorm {
                    num_groups: small(*groups),
                    eps: eps.get(),
                    weight: w.is_some(),
                    bias: b.is_some(),
                };
                let args: Vec<u8> = [*x].into_iter().chain(*w).chain(*b).collect();
                self.apply(Op::Nn(Box::new(NnOp::GroupNorm(op))), &args);
            }
            K::BatchNormTrain(x, w, b, momentum, eps) => {
                let (Some(x), Some(w), Some(b)) = (self.var(*x), self.opt(*w), self.opt(*b)) else {
                    return;
                };
                if let Ok((y, stats)) = self.s.batch_norm_train(x, w, b, momentum.get(), eps.get())
                {
                    let shape = self.s.value(x).unwrap().shape().clone();
                    assert_eq!(self.s.value(y).unwrap().shape(), &shape);
                    assert_eq!(stats.mean.shape(), stats.var.shape());
                    self.vars.push(y);
                }
            }
            K::BatchNormEval(x, m, v, w, b, eps) => {
                let (Some(x), Some(m), Some(v), Some(w), Some(b)) = (
                    self.var(*x),
                    self.var(*m),
                    self.var(*v),
                    self.opt(*w),
                    self.opt(*b),
                ) else {
                    return;
                };
                if let Ok(y) = self.s.batch_norm_eval(x, m, v, w, b, eps.get()) {
                    let shape = self.s.value(x).unwrap().shape().clone();
                    assert_eq!(self.s.value(y).unwrap().shape(), &shape);
                    self.vars.push(y);
                }
            }
            K::Embedding(ix, w, padding_idx) => {
                if let Some(indices) = ix.get() {
                    let op = Embedding {
                        indices,
                        padding_idx: padding_idx.map(isize::from),
                    };
                    self.apply(Op::Nn(Box::new(NnOp::Embedding(op))), &[*w]);
                }
            }
            K::IndexSelect(x, dim, ix) => {
                if let Some(index) = ix.get() {
                    let op = IndexSelect {
                        dim: isize::from(*dim % 7),
                        index,
                    };
                    self.apply(Op::Nn(Box::new(NnOp::IndexSelect(op))), &[*x]);
                }
            }
            K::Gather(x, dim, ix) => {
                if let Some(index) = ix.get() {
                    let op = Gather {
                        dim: isize::from(*dim % 7),
                        index,
                    };
                    self.apply(Op::Nn(Box::new(NnOp::Gather(op))), &[*x]);
                }
            }
            K::ScatterAdd(x, dim, ix, src) => {
                if let Some(index) = ix.get() {
                    let op = ScatterAdd {
                        dim: isize::from(*dim % 7),
                        index,
                    };
                    self.apply(Op::Nn(Box::new(NnOp::ScatterAdd(op))), &[*x, *src]);
                }
            }
            K::Select(x, dim, index) => {
                let op = Select {
                    dim: isize::from(*dim % 7),
                    index: isize::from(*index % 7),
                };
                self.apply(Op::Nn(Box::new(NnOp::Select(op))), &[*x]);
            }
            K::Dropout(x, p, training, seed) => {
                let op = Dropout {
                    p: p.get(),
                    training: *training,
                    seed: *seed,
                };
                self.apply(Op::Nn(Box::new(NnOp::Dropout(op))), &[*x]);
            }
            K::Attention(q, k, v, is_causal, scale, mask, float_mask, dropout_p, seed) => {
                let op = ScaledDotProductAttention {
                    is_causal: *is_causal,
                    scale: scale.map(Val::get),
                    attn_mask: mask.as_ref().and_then(RawMask::get),
                    float_mask: float_mask.is_some(),
                    dropout_p: dropout_p.map_or(0.0, Val::get),
                    seed: *seed,
                };
                let args: Vec<u8> = [*q, *k, *v].into_iter().chain(*float_mask).collect();
                self.apply(Op::Nn(Box::new(NnOp::ScaledDotProductAttention(op))), &args);
            }
            K::Detach(x) => {
                if let Some(x) = self.var(*x) {
                    if let Ok(d) = self.s.detach(x) {
                        self.vars.push(d);
                    }
                }
            }
            K::NoGrad(on) => self.s.set_grad_enabled(!on),
            K::Anomaly(on) => {
                self.s.set_detect_anomaly(*on);
                self.anomaly = *on;
            }
            K::Reset => {
                self.s.reset();
                self.params.clear();
            }
            K::Backward(x) => {
                if let Some(x) = self.var(*x) {
                    let _ = self.s.backward(x);
                }
            }
        }
    }

    /// Backward from `out` with a seed of `seed` everywhere: gradient shapes, and law 1 on
    /// zero-preserving tapes.
    fn finish(&mut self, out: u8, seed: Val) {
        let Some(out) = self.var(out) else { return };
        let Ok(value) = self.s.value(out) else { return };
        let seed = Tensor::full(value.shape(), S::from_f64(seed.get()));
        if let Ok(grads) = self.s.backward_with(out, &seed) {
            assert_eq!(grads.len(), self.params.len());
            for ((name, g), (pname, shape)) in grads.iter().zip(&self.params) {
                assert_eq!(name, pname);
                assert_eq!(g.shape(), shape, "gradient of {name}");
            }
        }
        let tape = self.s.tape();
        if self.anomaly || !audit(tape).is_zero_preserving() {
            return;
        }
        let executed = tape.backward_all(out.id(), &seed);
        let reference = tape
            .one_hot(out.id(), &seed)
            .and_then(|g| tape.backward_from(g));
        match (executed, reference) {
            (Ok(e), Ok(r)) => {
                assert_eq!(e.len(), r.len());
                for (i, (a, b)) in e.iter().zip(&r).enumerate() {
                    assert_eq!(a.shape(), b.shape());
                    let equal = a
                        .data()
                        .iter()
                        .zip(b.data())
                        .all(|(x, y)| x == y || (x.to_f64().is_nan() && y.to_f64().is_nan()));
                    assert!(equal, "law 1: node {i}: executed {a:?} vs reference {b:?}");
                }
            }
            (Err(_), Err(_)) => {}
            (e, r) => panic!(
                "law 1: executed {:?} but reference {:?}",
                e.is_ok(),
                r.is_ok()
            ),
        }
    }
}

fn run<S: Scalar>(p: &Program) {
    let mut r = Run::<S> {
        s: Session::new(),
        anomaly: false,
        vars: Vec::new(),
        params: Vec::new(),
    };
    for step in p.steps.iter().take(48) {
        r.step(step);
    }
    r.finish(p.out, p.seed);
}

/// A convolution's padding rule from one byte: numeric padding or `same` / `valid`, crossed with
/// the four padding modes.
fn padding_kind_of(b: u8) -> (Option<NamedPadding>, PaddingMode) {
    let named = match b % 3 {
        0 => None,
        1 => Some(NamedPadding::Same),
        _ => Some(NamedPadding::Valid),
    };
    let mode = match (b / 3) % 4 {
        0 => PaddingMode::Zeros,
        1 => PaddingMode::Reflect,
        2 => PaddingMode::Replicate,
        _ => PaddingMode::Circular,
    };
    (named, mode)
}

fuzz_target!(|p: Program| {
    if p.f32 {
        run::<f32>(&p);
    } else {
        run::<f64>(&p);
    }
});
