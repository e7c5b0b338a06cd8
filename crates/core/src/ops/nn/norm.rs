//! Normalisation: `layer_norm` (trailing `normalized_shape`), `batch_norm` (training: batch
//! statistics, left in `Aux` with a pure running-statistics update; evaluation: running statistics
//! as arguments) and `group_norm`. All share one core: statistics per group, per-channel affine.

mod bands;

use super::{arity_with, check_eps, expect_shape, when};
use crate::ops::{Arity, Aux, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::kernels::alloc::try_with_capacity;
use tapegrad_tensor::kernels::group_sum::joint::Joint;
use tapegrad_tensor::kernels::group_sum::{group_sums, map_groups, IndexMap};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// `F.layer_norm(input, normalized_shape, weight, bias, eps)`: statistics over the trailing
/// `normalized_shape` axes; `weight` and `bias` (each of `normalized_shape`) are optional arguments
/// that follow the input in that order.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerNorm {
    pub normalized_shape: Vec<usize>,
    pub eps: f64,
    pub weight: bool,
    pub bias: bool,
}

/// `F.batch_norm` on (N, C, *) with channel axis 1.
///
/// Training (`training = true`): arguments `(input, [weight], [bias])`; normalises with the batch
/// mean and biased variance per channel, which the forward pass also leaves in `Aux` as
/// `[mean, var, rstd]`. The running-statistics update with `momentum` is not a differentiable
/// output: read it with [`BatchNorm::running_update`]. Fewer than two values per channel is an
/// error, as in PyTorch.
///
/// Evaluation (`training = false`): arguments `(input, running_mean, running_var, [weight],
/// [bias])`; every argument is differentiable (the nn layer simply does not ask for the running
/// statistics' gradients).
#[derive(Debug, Clone, PartialEq)]
pub struct BatchNorm {
    pub training: bool,
    pub momentum: f64,
    pub eps: f64,
    pub weight: bool,
    pub bias: bool,
}

/// `F.group_norm(input, num_groups, weight, bias, eps)` on (N, C, *): statistics per sample over
/// each group of `C / num_groups` channels; weight and bias are per channel (C).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupNorm {
    pub num_groups: usize,
    pub eps: f64,
    pub weight: bool,
    pub bias: bool,
}

/// How a normalisation groups elements: `groups` statistics groups of `group_len` elements each,
/// and `params` affine parameters (channels).
#[derive(Debug, Clone, Copy)]
struct Grouping {
    groups: usize,
    group_len: usize,
    group: IndexMap,
    params: usize,
    param: IndexMap,
}

impl Grouping {
    fn new(
        groups: usize,
        group_len: usize,
        group: IndexMap,
        params: usize,
        param: IndexMap,
    ) -> Self {
        // Divisors of zero only arise for empty tensors, where no index is ever mapped.
        let fix = |m: IndexMap| IndexMap {
            div: m.div.max(1),
            modulo: m.modulo.max(1),
        };
        Grouping {
            groups,
            group_len,
            group: fix(group),
            params,
            param: fix(param),
        }
    }

    /// `self`, once the per-group state (statistics and their pairwise sums) is known to fit in
    /// memory. It is sized by the input's shape, not its data, so an empty input of huge extent
    /// (layer_norm on [2^40, 0], batch_norm on [0, 2^40]) would otherwise abort on an
    /// allocation of terabytes; reserving it first makes that an error naming the op. Only
    /// checked when the groups outnumber the input's elements (never for a non-empty input of
    /// ordinary layout). Per-channel sums need no check: they are made only for the gradients of
    /// affine or running-statistics arguments of that size, already in memory.
    fn fits(self, op: &'static str, numel: usize) -> Result<Self> {
        // The largest state per group: a pairwise sum (a value, a count, a level vector) and the
        // statistics kept beside it.
        const BYTES_PER_GROUP: usize = 64;
        if self.groups > numel {
            try_with_capacity::<[u8; BYTES_PER_GROUP]>(op, self.groups)?;
        }
        Ok(self)
    }

    /// Per-group mean and biased variance, two-pass for accuracy, each sum pairwise
    /// (`group_sums`) and divided by the count (not multiplied by a rounded reciprocal).
    fn stats<S: Scalar>(&self, x: &[S]) -> (Vec<S>, Vec<S>) {
        let [sum] = group_sums(self.group, self.groups, x, x, [], |v, _, []| [v]);
        let mean = self.divided(sum);
        let [squares] = group_sums(self.group, self.groups, x, x, [&mean], |v, _, [m]| {
            let d = v - m;
            [d * d]
        });
        (mean, self.divided(squares))
    }

    /// Group sums divided by `group_len` (left as they are, zeros, for empty groups).
    fn divided<S: Scalar>(&self, mut sums: Vec<S>) -> Vec<S> {
        if self.group_len > 0 {
            let len = S::from_usize(self.group_len);
            sums.iter_mut().for_each(|s| *s /= len);
        }
        sums
    }

    fn xhat<S: Scalar>(&self, x: &Tensor<S>, mean: &[S], rstd: &[S]) -> Tensor<S> {
        let v = x.data();
        mapped(x.shape(), self.group, v, v, [mean, rstd], |v, _, [m, r]| {
            (v - m) * r
        })
    }

    /// `y = xhat * w[c] + b[c]`; a missing weight is 1 and a missing bias -0, the exact
    /// identities (`h * 1 == h` and `h + -0 == h` bit for bit, signed zeros and NaNs included).
    fn affine<S: Scalar>(&self, xhat: &Tensor<S>, w: Option<&[S]>, b: Option<&[S]>) -> Tensor<S> {
        let ones = self.filler(w, S::ONE);
        let zeros = self.filler(b, -S::ZERO);
        let (w, b) = (w.unwrap_or(&ones), b.unwrap_or(&zeros));
        let h = xhat.data();
        mapped(xhat.shape(), self.param, h, h, [w, b], |h, _, [w, b]| {
            h * w + b
        })
    }

    /// `y = (x - mean[g]) * rstd[g] * w[c] + b[c]`: [`Grouping::xhat`] then
    /// [`Grouping::affine`], in one pass where one walk follows both maps (the same bits).
    fn normalized<S: Scalar>(
        &self,
        x: &Tensor<S>,
        mean: &[S],
        rstd: &[S],
        w: Option<&[S]>,
        b: Option<&[S]>,
    ) -> Tensor<S> {
        let Some(joint) = Joint::of(self.group, self.param, x.numel()) else {
            return self.affine(&self.xhat(x, mean, rstd), w, b);
        };
        let ones = self.filler(w, S::ONE);
        let zeros = self.filler(b, -S::ZERO);
        let (w, b) = (w.unwrap_or(&ones), b.unwrap_or(&zeros));
        let v = x.data();
        Tensor::from_writer(x.shape().clone(), |out| {
            joint.map(out, v, v, [mean, rstd], [w, b], normalize_one)
        })
    }

    /// The input's gradient given the output's, `g`, and the sums of the weight's and the
    /// bias's gradients (`[dw, db]`) where `channel_sums` asks for them, from one walk of the
    /// data for the sums and one for the gradient: the same values as
    /// [`Grouping::normalize_derivative`] of `g * w` and [`Grouping::per_param`] of `g * xhat`
    /// and `g`, with `xhat` and `g * w` computed where they are used instead of kept.
    #[allow(clippy::too_many_arguments)]
    fn joint_vjp<S: Scalar>(
        &self,
        joint: &Joint,
        x: &Tensor<S>,
        g: &[S],
        mean: &[S],
        rstd: &[S],
        w: Option<&[S]>,
        channel_sums: bool,
    ) -> (Tensor<S>, Option<[Vec<S>; 2]>) {
        let ones = self.filler(w, S::ONE);
        let w = w.unwrap_or(&ones);
        let (xs, stats) = (x.data(), [mean, rstd]);
        let (groups, params) = (self.groups, self.params);
        if let Some(per_band) = self.groups_per_band(xs.len(), bands::VJP_BANDS_PER_THREAD) {
            let mut channel = None;
            let dx = Tensor::from_writer(x.shape().clone(), |dx| {
                channel = bands::vjp(self, joint, per_band, xs, g, stats, w, channel_sums, dx)
            });
            return (dx, channel);
        }
        let ([a, b], channel) = if channel_sums {
            let (a_b, [dw, db]) = joint.sums(groups, params, xs, g, stats, w, by_group, by_channel);
            (a_b, Some([dw, db]))
        } else {
            let (a_b, []) = joint.sums(groups, params, xs, g, stats, w, by_group, |_, _, _, _| []);
            (a_b, None)
        };
        let (a, b) = (self.divided(a), self.divided(b));
        let dx = Tensor::from_writer(x.shape().clone(), |out| {
            joint.map(out, xs, g, [mean, rstd, &a, &b], [w], input_gradient)
        });
        (dx, channel)
    }

    /// `value` per parameter where `given` is absent (nothing allocated where it is present,
    /// nor for an empty input, whose maps read no parameter: its parameter count may be huge,
    /// as layer_norm's over [0, 2^28, 2^28] with no weight).
    fn filler<S: Scalar>(&self, given: Option<&[S]>, value: S) -> Vec<S> {
        match given {
            None if !self.is_empty() => vec![value; self.params],
            _ => Vec::new(),
        }
    }

    /// Whether the input has no element (no group, or groups of none).
    fn is_empty(&self) -> bool {
        self.groups == 0 || self.group_len == 0
    }

    /// The tangent (and, by symmetry of the projection, the cotangent) of `xhat` given that of
    /// `x`: `rstd * (d - mean(d) - xhat * mean(d * xhat))` per group; both means from one walk.
    fn normalize_derivative<S: Scalar>(&self, d: &[S], xhat: &Tensor<S>, rstd: &[S]) -> Tensor<S> {
        let h = xhat.data();
        let [a, b] = group_sums(self.group, self.groups, d, h, [], |v, h, []| [v, v * h]);
        let (a, b) = (self.divided(a), self.divided(b));
        mapped(
            xhat.shape(),
            self.group,
            d,
            h,
            [rstd, &a, &b],
            |v, h, [r, a, b]| r * (v - a - h * b),
        )
    }

    /// `sum over elements i of channel c of term(a[i], b[i], [p[c] for p in per_param])`
    /// (pairwise, see `group_sums`), M sums from one walk.
    fn per_param<S: Scalar, const K: usize, const M: usize>(
        &self,
        a: &[S],
        b: &[S],
        per_param: [&[S]; K],
        term: impl Fn(S, S, [S; K]) -> [S; M],
    ) -> [Vec<S>; M] {
        group_sums(self.param, self.params, a, b, per_param, term)
    }
}

/// An element of the normalised output, `(x - mean) * rstd * w + b`.
fn normalize_one<S: Scalar>(x: S, _: S, [m, r]: [S; 2], [w, b]: [S; 2]) -> S {
    (x - m) * r * w + b
}

/// Per group, the terms of the input gradient's sums: `gh = g * w` and `gh * xhat`.
fn by_group<S: Scalar>(x: S, g: S, [m, r]: [S; 2], w: S) -> [S; 2] {
    let gh = g * w;
    [gh, gh * ((x - m) * r)]
}

/// Per channel, the terms of the weight's and the bias's gradients: `g * xhat` and `g`.
fn by_channel<S: Scalar>(x: S, g: S, [m, r]: [S; 2], _: S) -> [S; 2] {
    [g * ((x - m) * r), g]
}

/// An element of the input gradient, `rstd * (g * w - mean(gh) - xhat * mean(gh * xhat))`, from
/// the group means `a` and `b` of [`by_group`]'s terms.
fn input_gradient<S: Scalar>(x: S, g: S, [m, r, a, b]: [S; 4], [w]: [S; 1]) -> S {
    let h = (x - m) * r;
    r * (g * w - a - h * b)
}

fn rstd_of<S: Scalar>(var: &[S], eps: f64) -> Vec<S> {
    let e = S::from_f64(eps);
    var.iter().map(|&v| S::ONE / (v + e).sqrt()).collect()
}

/// The affine arguments present after the `first` ones, by index.
fn affine_args<'a, S: Scalar>(
    x: &[&'a Tensor<S>],
    first: usize,
    weight: bool,
    bias: bool,
) -> (Option<&'a [S]>, Option<&'a [S]>) {
    let w = weight.then(|| x[first].data());
    let b = bias.then(|| x[first + usize::from(weight)].data());
    (w, b)
}

/// The statistics a forward pass left in `Aux::Tensors`, checked for count and length.
fn aux_tensors<'a, S: Scalar>(
    op: &'static str,
    aux: &'a Aux<S>,
    count: usize,
    len: usize,
) -> Result<&'a [Tensor<S>]> {
    match aux {
        Aux::Tensors(ts) if ts.len() == count && ts.iter().all(|t| t.numel() == len) => Ok(ts),
        _ => Err(Error::invalid(
            op,
            format!("the forward statistics ({count} tensors of {len} elements) are missing"),
        )),
    }
}

/// The shared VJP of the statistics-normalising ops: inputs `(x, [w], [b])` at argument indices
/// `0, w_at, w_at + weight`, with the statistics `mean` and `rstd` from the forward pass.
#[allow(clippy::too_many_arguments)]
fn normalized_vjp<S: Scalar>(
    op: &'static str,
    grouping: &Grouping,
    ctx: &VjpContext<'_, S>,
    cot: &Tensor<S>,
    mean: &[S],
    rstd: &[S],
    weight: bool,
    bias: bool,
) -> Result<Grads<S>> {
    let x = ctx.input(op, 0)?;
    let g = cot.data();
    let w = if weight {
        Some(ctx.input(op, 1)?.data())
    } else {
        None
    };
    let bias_at = 1 + usize::from(weight);
    let (need_w, need_b) = (weight && ctx.needs(1), bias && ctx.needs(bias_at));
    let (dx, dw, db) = match Joint::of(grouping.group, grouping.param, g.len()) {
        Some(joint) if ctx.needs(0) => {
            let (dx, sums) = grouping.joint_vjp(&joint, x, g, mean, rstd, w, need_w || need_b);
            let [dw, db] = sums.map_or([None, None], |sums| sums.map(Some));
            (Some(dx), dw.filter(|_| need_w), db.filter(|_| need_b))
        }
        _ => {
            let xhat = grouping.xhat(x, mean, rstd);
            let dx = ctx.needs(0).then(|| match w {
                Some(w) => {
                    let gh = mapped(x.shape(), grouping.param, g, g, [w], |v, _, [w]| v * w);
                    grouping.normalize_derivative(gh.data(), &xhat, rstd)
                }
                None => grouping.normalize_derivative(g, &xhat, rstd),
            });
            // The weight's and the bias's gradients from one walk when both are needed.
            let h = xhat.data();
            let (dw, db) = match (need_w, need_b) {
                (true, true) => {
                    let [dw, db] = grouping.per_param(g, h, [], |v, h, []| [v * h, v]);
                    (Some(dw), Some(db))
                }
                (true, false) => {
                    let [dw] = grouping.per_param(g, h, [], |v, h, []| [v * h]);
                    (Some(dw), None)
                }
                (false, true) => {
                    let [db] = grouping.per_param(g, g, [], |v, _, []| [v]);
                    (None, Some(db))
                }
                (false, false) => (None, None),
            };
            (dx, dw, db)
        }
    };
    let mut grads = smallvec![dx];
    if weight {
        grads.push(match dw {
            Some(dw) => Some(Tensor::from_shape(ctx.input_shapes[1].clone(), dw)?),
            None => None,
        });
    }
    if bias {
        grads.push(match db {
            Some(db) => Some(Tensor::from_shape(ctx.input_shapes[bias_at].clone(), db)?),
            None => None,
        });
    }
    Ok(grads)
}

/// The shared JVP: `normalize_derivative(dx) * w + xhat * dw + db`.
#[allow(clippy::too_many_arguments)]
fn normalized_jvp<S: Scalar>(
    grouping: &Grouping,
    x: &[&Tensor<S>],
    t: &[&Tensor<S>],
    mean: &[S],
    rstd: &[S],
    weight: bool,
    bias: bool,
) -> Result<Tensor<S>> {
    let xhat = grouping.xhat(x[0], mean, rstd);
    let dh = grouping.normalize_derivative(t[0].data(), &xhat, rstd);
    let (dh, h) = (dh.data(), xhat.data());
    let (w, _) = affine_args(x, 1, weight, bias);
    let (tw, tb) = affine_args(t, 1, weight, bias);
    let ones = grouping.filler(w, S::ONE);
    let w = w.unwrap_or(&ones);
    let (has_tw, has_tb) = (tw.is_some(), tb.is_some());
    // Absent tangents are skipped, not added as zeros (`h * 0` is NaN for an infinite `h`).
    let (tw, tb) = (tw.unwrap_or(w), tb.unwrap_or(w));
    let shape = x[0].shape();
    Ok(mapped(
        shape,
        grouping.param,
        dh,
        h,
        [w, tw, tb],
        |d, h, [w, tw, tb]| {
            let mut y = d * w;
            if has_tw {
                y += h * tw;
            }
            if has_tb {
                y += tb;
            }
            y
        },
    ))
}

/// The forward of the norms whose statistics come from the input alone (layer and group norm):
/// mean and variance per group, normalise, per-channel affine; `[mean, rstd]` per group go to
/// `Aux` for the VJP and JVP.
fn group_stats_forward<S: Scalar>(
    grouping: &Grouping,
    eps: f64,
    x: &[&Tensor<S>],
    weight: bool,
    bias: bool,
) -> Result<Forward<S>> {
    let (w, b) = affine_args(x, 1, weight, bias);
    let (y, mean, rstd) = match grouping.groups_per_band(x[0].numel(), 1) {
        Some(per_band) => {
            let ones = grouping.filler(w, S::ONE);
            let zeros = grouping.filler(b, -S::ZERO);
            let affine = [w.unwrap_or(&ones), b.unwrap_or(&zeros)];
            let (mut mean, mut rstd) = (Vec::new(), Vec::new());
            let y = Tensor::from_writer(x[0].shape().clone(), |out| {
                (mean, rstd) = bands::forward(grouping, per_band, eps, x[0].data(), affine, out)
            });
            (y, mean, rstd)
        }
        None => {
            let (mean, var) = grouping.stats(x[0].data());
            let rstd = rstd_of(&var, eps);
            let y = grouping.normalized(x[0], &mean, &rstd, w, b);
            (y, mean, rstd)
        }
    };
    let stats = Shape::new([grouping.groups])?;
    Ok(Forward {
        value: y,
        aux: Aux::Tensors(vec![
            Tensor::from_shape(stats.clone(), mean)?,
            Tensor::from_shape(stats, rstd)?,
        ]),
    })
}

/// The VJP of [`group_stats_forward`], from the `[mean, rstd]` it left.
fn group_stats_vjp<S: Scalar>(
    op: &'static str,
    grouping: &Grouping,
    ctx: &VjpContext<'_, S>,
    cot: &Tensor<S>,
    weight: bool,
    bias: bool,
) -> Result<Grads<S>> {
    let st = aux_tensors(op, ctx.aux, 2, grouping.groups)?;
    let (mean, rstd) = (st[0].data(), st[1].data());
    normalized_vjp(op, grouping, ctx, cot, mean, rstd, weight, bias)
}

/// The JVP of [`group_stats_forward`], from the `[mean, rstd]` it left.
fn group_stats_jvp<S: Scalar>(
    op: &'static str,
    grouping: &Grouping,
    x: &[&Tensor<S>],
    out: &Forward<S>,
    t: &[&Tensor<S>],
    weight: bool,
    bias: bool,
) -> Result<Tensor<S>> {
    let st = aux_tensors(op, &out.aux, 2, grouping.groups)?;
    normalized_jvp(grouping, x, t, st[0].data(), st[1].data(), weight, bias)
}

/// Checks the optional `(weight, bias)` argument shapes against the parameter shape.
fn check_affine_shapes(
    op: &'static str,
    affine: &[&Shape],
    weight: bool,
    param: &Shape,
) -> Result<()> {
    for (i, shape) in affine.iter().enumerate() {
        let what = if weight && i == 0 { "weight" } else { "bias" };
        expect_shape(op, what, shape, param)?;
    }
    Ok(())
}

/// Saves for (x, [w], [b]): the input and the weight, never the bias.
fn saves_input_and_weight(weight: bool) -> Saves {
    if weight {
        Saves::inputs(&[0, 1])
    } else {
        Saves::inputs(&[0])
    }
}

/// The op contract of a norm whose statistics are those of a `Grouping` (layer and group norm):
/// the op supplies `grouping` and `param_shape`; the forward leaves `[mean, rstd]` per group in
/// `Aux`, as PyTorch's `native_layer_norm` and `native_group_norm` do.
macro_rules! group_stats_rules {
    ($op:ty) => {
        impl OpRules for $op {
            fn arity(&self) -> Arity {
                arity_with(1, &[self.weight, self.bias])
            }
            fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
                let param = self.param_shape(inputs[0])?;
                check_affine_shapes(self.name(), &inputs[1..], self.weight, &param)?;
                Ok(inputs[0].clone())
            }
            fn saves(&self) -> Saves {
                saves_input_and_weight(self.weight)
            }
            /// The input and weight are kept anyway; the normalised value is two passes over them.
            fn recomputable(&self) -> bool {
                true
            }
            fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
                let grouping = self.grouping(x[0].shape())?;
                group_stats_forward(&grouping, self.eps, x, self.weight, self.bias)
            }
            fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
                let grouping = self.grouping(&ctx.input_shapes[0])?;
                group_stats_vjp(self.name(), &grouping, ctx, cot, self.weight, self.bias)
            }
            fn jvp<S: Scalar>(
                &self,
                x: &[&Tensor<S>],
                out: &Forward<S>,
                t: &[&Tensor<S>],
            ) -> Result<Tensor<S>> {
                let grouping = self.grouping(x[0].shape())?;
                group_stats_jvp(self.name(), &grouping, x, out, t, self.weight, self.bias)
            }
        }
    };
}

impl LayerNorm {
    fn grouping(&self, x: &Shape) -> Result<Grouping> {
        let op = "layer_norm";
        check_eps(op, self.eps)?;
        let k = self.normalized_shape.len();
        let dims = x.dims();
        if k > dims.len() || dims[dims.len() - k..] != self.normalized_shape[..] {
            return Err(Error::invalid(
                op,
                format!(
                    "normalized_shape {:?} must equal the trailing dimensions of input {x}",
                    self.normalized_shape
                ),
            ));
        }
        let len: usize = self.normalized_shape.iter().product();
        let rows: usize = dims[..dims.len() - k].iter().product();
        let row = IndexMap {
            div: len,
            modulo: rows,
        };
        let col = IndexMap {
            div: 1,
            modulo: len,
        };
        Grouping::new(rows, len, row, len, col).fits(op, x.numel())
    }
}

impl LayerNorm {
    /// The shape of `weight` and `bias`: `normalized_shape`.
    fn param_shape(&self, x: &Shape) -> Result<Shape> {
        self.grouping(x)?;
        Shape::for_op("layer_norm", &self.normalized_shape)
    }
}

group_stats_rules!(LayerNorm);

impl GroupNorm {
    fn grouping(&self, x: &Shape) -> Result<Grouping> {
        let op = "group_norm";
        check_eps(op, self.eps)?;
        let dims = x.dims();
        if dims.len() < 2 {
            return Err(Error::invalid(
                op,
                format!("expected an input of shape (N, C, *), found {x}"),
            ));
        }
        let (n, c) = (dims[0], dims[1]);
        let g = self.num_groups;
        if g == 0 || c % g != 0 {
            return Err(Error::invalid(
                op,
                format!("num_groups {g} must be positive and divide the {c} channels of input {x}"),
            ));
        }
        let spatial: usize = dims[2..].iter().product();
        let group_len = c / g * spatial;
        // With channels, g <= c and n * g <= numel; without, any g divides 0 and the (empty)
        // input has no groups, so a huge num_groups neither overflows nor allocates.
        let groups = if c == 0 { 0 } else { n * g };
        Grouping::new(
            groups,
            group_len,
            IndexMap {
                div: group_len,
                modulo: groups,
            },
            c,
            IndexMap {
                div: spatial,
                modulo: c,
            },
        )
        .fits(op, x.numel())
    }
}

impl GroupNorm {
    /// The shape of `weight` and `bias`: one per channel.
    fn param_shape(&self, x: &Shape) -> Result<Shape> {
        Shape::new([self.grouping(x)?.params])
    }
}

group_stats_rules!(GroupNorm);

/// Per-channel batch statistics of a batch-norm input: the mean, the biased variance used for
/// normalising, and how many values each channel had.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchStats<S> {
    pub mean: Tensor<S>,
    pub var: Tensor<S>,
    pub count: usize,
}

/// The channel grouping of an (N, C, *) input: one group per channel across batch and space.
fn channel_grouping(op: &'static str, x: &Shape) -> Result<Grouping> {
    let dims = x.dims();
    if dims.len() < 2 {
        return Err(Error::invalid(
            op,
            format!("expected an input of shape (N, C, *), found {x}"),
        ));
    }
    let c = dims[1];
    let spatial: usize = dims[2..].iter().product();
    let channel = IndexMap {
        div: spatial,
        modulo: c,
    };
    Grouping::new(c, dims[0] * spatial, channel, c, channel).fits(op, x.numel())
}

/// The batch mean and biased variance per channel of an (N, C, *) input, computed exactly as
/// `batch_norm` does in training mode.
pub fn batch_stats<S: Scalar>(x: &Tensor<S>) -> Result<BatchStats<S>> {
    let grouping = channel_grouping("batch_norm", x.shape())?;
    let (mean, var) = grouping.stats(x.data());
    let c = Shape::new([grouping.groups])?;
    Ok(BatchStats {
        mean: Tensor::from_shape(c.clone(), mean)?,
        var: Tensor::from_shape(c, var)?,
        count: grouping.group_len,
    })
}

impl BatchNorm {
    /// PyTorch's defaults: momentum 0.1, eps 1e-5, affine.
    pub fn new(training: bool) -> Self {
        BatchNorm {
            training,
            momentum: 0.1,
            eps: 1e-5,
            weight: true,
            bias: true,
        }
    }

    /// Index of the first affine argument.
    fn affine_at(&self) -> usize {
        if self.training {
            1
        } else {
            3
        }
    }

    fn grouping(&self, x: &Shape) -> Result<Grouping> {
        let op = "batch_norm";
        check_eps(op, self.eps)?;
        if !(self.momentum.is_finite() && (0.0..=1.0).contains(&self.momentum)) {
            return Err(Error::invalid(
                op,
                format!("momentum must lie in [0, 1], got {}", self.momentum),
            ));
        }
        let grouping = channel_grouping(op, x)?;
        if self.training && grouping.group_len == 1 {
            return Err(Error::invalid(
                op,
                format!("expected more than 1 value per channel when training, got input size {x}"),
            ));
        }
        Ok(grouping)
    }

    /// The batch statistics a training-mode forward pass left in its `Aux`, for an input of
    /// shape `input`.
    pub fn stats_from_aux<S: Scalar>(&self, aux: &Aux<S>, input: &Shape) -> Result<BatchStats<S>> {
        let grouping = self.grouping(input)?;
        let st = aux_tensors("batch_norm", aux, 3, grouping.groups)?;
        Ok(BatchStats {
            mean: st[0].clone(),
            var: st[1].clone(),
            count: grouping.group_len,
        })
    }

    /// PyTorch's running-statistics update, as a pure function:
    /// `mean' = (1 - momentum) mean + momentum batch_mean` and
    /// `var' = (1 - momentum) var + momentum batch_var * count / (count - 1)` (the unbiased batch
    /// variance). With fewer than two values per channel the statistics are returned unchanged.
    pub fn running_update<S: Scalar>(
        &self,
        running_mean: &Tensor<S>,
        running_var: &Tensor<S>,
        stats: &BatchStats<S>,
    ) -> Result<(Tensor<S>, Tensor<S>)> {
        let op = "batch_norm";
        for (what, t) in [("running_mean", running_mean), ("running_var", running_var)] {
            expect_shape(op, what, t.shape(), stats.mean.shape())?;
        }
        if stats.var.shape() != stats.mean.shape() {
            return Err(Error::invalid(
                op,
                format!(
                    "batch mean {} and variance {} differ in shape",
                    stats.mean.shape(),
                    stats.var.shape()
                ),
            ));
        }
        if stats.count < 2 {
            return Ok((running_mean.clone(), running_var.clone()));
        }
        let m = S::from_f64(self.momentum);
        let keep = S::ONE - m;
        let unbias = S::from_usize(stats.count) / S::from_usize(stats.count - 1);
        let mean = running_mean.zip_map(&stats.mean, op, |r, b| keep * r + m * b)?;
        let var = running_var.zip_map(&stats.var, op, |r, b| keep * r + m * (b * unbias))?;
        Ok((mean, var))
    }

    /// Evaluation mode: `(x, running_mean, running_var, [w], [b])`, per-channel `rstd`.
    fn eval_rstd<S: Scalar>(&self, running_var: &Tensor<S>) -> Vec<S> {
        rstd_of(running_var.data(), self.eps)
    }
}

impl OpRules for BatchNorm {
    fn arity(&self) -> Arity {
        arity_with(self.affine_at(), &[self.weight, self.bias])
    }
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        let grouping = self.grouping(inputs[0])?;
        let param = Shape::new([grouping.params])?;
        let at = self.affine_at();
        for (what, shape) in ["running_mean", "running_var"].iter().zip(&inputs[1..at]) {
            expect_shape(self.name(), what, shape, &param)?;
        }
        check_affine_shapes(self.name(), &inputs[at..], self.weight, &param)?;
        Ok(inputs[0].clone())
    }
    fn saves(&self) -> Saves {
        match (self.training, self.weight) {
            (true, w) => saves_input_and_weight(w),
            (false, true) => Saves::inputs(&[0, 1, 2, 3]),
            (false, false) => Saves::inputs(&[0, 1, 2]),
        }
    }
    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        let grouping = self.grouping(x[0].shape())?;
        let (w, b) = affine_args(x, self.affine_at(), self.weight, self.bias);
        if !self.training {
            let rstd = self.eval_rstd(x[2]);
            let y = grouping.normalized(x[0], x[1].data(), &rstd, w, b);
            return Ok(Forward::new(y));
        }
        let (mean, var) = grouping.stats(x[0].data());
        let rstd = rstd_of(&var, self.eps);
        let y = grouping.normalized(x[0], &mean, &rstd, w, b);
        let c = Shape::new([grouping.groups])?;
        Ok(Forward {
            value: y,
            aux: Aux::Tensors(vec![
                Tensor::from_shape(c.clone(), mean)?,
                Tensor::from_shape(c.clone(), var)?,
                Tensor::from_shape(c, rstd)?,
            ]),
        })
    }
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let op = self.name();
        let grouping = self.grouping(&ctx.input_shapes[0])?;
        if self.training {
            let st = aux_tensors(op, ctx.aux, 3, grouping.groups)?;
            return normalized_vjp(
                op,
                &grouping,
                ctx,
                cot,
                st[0].data(),
                st[2].data(),
                self.weight,
                self.bias,
            );
        }
        // y = (x - m) * rstd(v) * w + b with rstd(v) = (v + eps)^(-1/2).
        let x = ctx.input(op, 0)?.data();
        let m = ctx.input(op, 1)?.data();
        let rstd = self.eval_rstd(ctx.input(op, 2)?);
        let w = if self.weight {
            Some(ctx.input(op, 3)?.data())
        } else {
            None
        };
        let g = cot.data();
        // gw_i = g_i * w_c, the cotangent of xhat.
        let gw_tensor;
        let gw = match w {
            Some(w) => {
                gw_tensor = mapped(cot.shape(), grouping.param, g, g, [w], |v, _, [w]| v * w);
                gw_tensor.data()
            }
            None => g,
        };
        let shape = |i: usize| ctx.input_shapes[i].clone();
        let half = S::from_f64(0.5);
        let (param, params) = (grouping.param, grouping.params);
        let mut grads = smallvec![
            when(ctx, 0, || {
                Ok(mapped(&shape(0), param, gw, gw, [&rstd], |v, _, [r]| v * r))
            })?,
            when(ctx, 1, || {
                let [dm] = group_sums(param, params, gw, gw, [&rstd], |v, _, [r]| [v * r]);
                Tensor::from_shape(shape(1), dm.into_iter().map(|v| -v).collect())
            })?,
            when(ctx, 2, || {
                let [dv] = group_sums(param, params, gw, x, [m, &rstd], |v, x, [m, r]| {
                    [v * (x - m) * (r * r * r)]
                });
                Tensor::from_shape(shape(2), dv.into_iter().map(|v| -(v * half)).collect())
            })?,
        ];
        if self.weight {
            grads.push(when(ctx, 3, || {
                let [dw] = group_sums(param, params, g, x, [m, &rstd], |v, x, [m, r]| {
                    [v * ((x - m) * r)]
                });
                Tensor::from_shape(shape(3), dw)
            })?);
        }
        if self.bias {
            let at = 3 + usize::from(self.weight);
            grads.push(when(ctx, at, || {
                let [db] = group_sums(param, params, g, g, [], |v, _, []| [v]);
                Tensor::from_shape(shape(at), db)
            })?);
        }
        Ok(grads)
    }
    fn jvp<S: Scalar>(
        &self,
        x: &[&Tensor<S>],
        out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        let grouping = self.grouping(x[0].shape())?;
        if self.training {
            let st = aux_tensors(self.name(), &out.aux, 3, grouping.groups)?;
            return normalized_jvp(
                &grouping,
                x,
                t,
                st[0].data(),
                st[2].data(),
                self.weight,
                self.bias,
            );
        }
        let (xs, m) = (x[0].data(), x[1].data());
        let rstd = self.eval_rstd(x[2]);
        let (w, _) = affine_args(x, 3, self.weight, self.bias);
        let (tw, tb) = affine_args(t, 3, self.weight, self.bias);
        let half = S::from_f64(0.5);
        let ones = grouping.filler(w, S::ONE);
        let w = w.unwrap_or(&ones);
        let (has_tw, has_tb) = (tw.is_some(), tb.is_some());
        // Absent tangents are skipped, not added as zeros (`h * 0` is NaN for an infinite `h`).
        let (tw, tb) = (tw.unwrap_or(w), tb.unwrap_or(w));
        let (tm, tv) = (t[1].data(), t[2].data());
        let per_channel = [m, &rstd[..], w, tw, tb, tm, tv];
        let shape = x[0].shape();
        Ok(mapped(
            shape,
            grouping.param,
            xs,
            t[0].data(),
            per_channel,
            |x, tx, p| {
                let [m, r, w, tw, tb, tm, tv] = p;
                let centered = x - m;
                // d xhat = (dx - dm) * rstd - (x - m) * rstd^3 * dv / 2
                let dh = (tx - tm) * r - centered * (r * r * r) * tv * half;
                let mut y = dh * w;
                if has_tw {
                    y += centered * r * tw;
                }
                if has_tb {
                    y += tb;
                }
                y
            },
        ))
    }
    /// Evaluation mode needs `running_var + eps > 0`.
    fn check_domain<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<()> {
        if self.training {
            return Ok(());
        }
        let e = S::from_f64(self.eps);
        if let Some(i) = x[2]
            .data()
            .iter()
            .position(|&v| v + e <= S::ZERO || (v + e).is_nan())
        {
            return Err(Error::Domain {
                op: "batch_norm",
                index: i,
                message: format!(
                    "running_var {} plus eps {} is not positive (running_var shape {})",
                    x[2].data()[i],
                    self.eps,
                    x[2].shape()
                ),
            });
        }
        Ok(())
    }
}

impl std::fmt::Display for LayerNorm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "layer_norm(normalized_shape={:?}, eps={}, weight={}, bias={})",
            self.normalized_shape, self.eps, self.weight, self.bias
        )
    }
}

impl std::fmt::Display for BatchNorm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "batch_norm(training={}, momentum={}, eps={}, weight={}, bias={})",
            self.training, self.momentum, self.eps, self.weight, self.bias
        )
    }
}

impl std::fmt::Display for GroupNorm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "group_norm(num_groups={}, eps={}, weight={}, bias={})",
            self.num_groups, self.eps, self.weight, self.bias
        )
    }
}

/// `f` over the elements as [`map_groups`] maps it, written straight into a tensor's buffer.
fn mapped<S: Scalar, const K: usize>(
    shape: &Shape,
    map: IndexMap,
    a: &[S],
    b: &[S],
    per_group: [&[S]; K],
    f: impl Fn(S, S, [S; K]) -> S,
) -> Tensor<S> {
    Tensor::from_writer(shape.clone(), |out| {
        map_groups(map, out, a, b, per_group, f)
    })
}
