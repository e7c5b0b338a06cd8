//! Optimizers with PyTorch's update rules (SGD, Adam, AdamW, RMSProp, Adagrad), one file each,
//! behind `Optimizer`, which owns the per-parameter state (named slots such as `exp_avg`, saved in
//! checkpoints) and the step count. Updates are plain arithmetic on parameter tensors, outside any
//! tape. Each rule follows `torch.optim`'s single-tensor (`foreach=False`) code in operation order;
//! hyper-parameter arithmetic (bias corrections, step sizes) is done in f64 as Python does, then
//! rounded to the element type. PyTorch's vectorised CPU kernels may fuse a multiply-add, so the
//! last bit of an f32 result can differ from PyTorch's; the formula is the same.

mod adagrad;
mod adam;
mod config;
mod rmsprop;
mod sgd;

pub use config::OptimizerConfig;

use crate::grad::{outer_mismatch, Grad, OuterDims};
use crate::params::ParamSet;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// An optimizer: its configuration, how many steps it took, and per-parameter state slots.
#[derive(Debug, Clone, PartialEq)]
pub struct Optimizer<S> {
    config: OptimizerConfig,
    steps: u64,
    /// `state[param][slot]`, slots named by `config.slot_names()`; `None` until first written
    /// (PyTorch creates state lazily on the first step).
    state: Vec<Vec<Option<Tensor<S>>>>,
}

impl<S: Scalar> Optimizer<S> {
    /// A fresh optimizer for the trainable tensors of `params`.
    pub fn new(config: OptimizerConfig, params: &ParamSet<S>) -> Result<Self> {
        config.validate()?;
        let slots = config.slot_names().len();
        let state = params
            .trainable()
            .map(|p| {
                let mut slots = vec![None; slots];
                // Adagrad fills its sum at construction, as torch.optim.Adagrad.__init__ does.
                if let OptimizerConfig::Adagrad {
                    initial_accumulator_value,
                    ..
                } = config
                {
                    slots[0] = Some(Tensor::full(
                        p.value.shape(),
                        S::from_f64(initial_accumulator_value),
                    ));
                }
                slots
            })
            .collect();
        Ok(Optimizer {
            config,
            steps: 0,
            state,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &OptimizerConfig {
        &self.config
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// One update of every trainable tensor of `params` with `grads` (one per trainable tensor,
    /// in order) at learning rate `lr`.
    pub fn step(&mut self, params: &mut ParamSet<S>, grads: &[Tensor<S>], lr: f64) -> Result<()> {
        self.check_count(params, grads.len())?;
        // Every shape is checked before any tensor changes, so an error leaves the step undone.
        for (p, g) in params.trainable().zip(grads) {
            if p.value.shape() != g.shape() {
                return Err(Error::ShapeMismatch {
                    op: "optimizer",
                    expected: Box::new(p.value.shape().clone()),
                    found: Box::new(g.shape().clone()),
                });
            }
        }
        self.steps = self.steps.saturating_add(1);
        let step = self.steps;
        let tensors =
            params
                .trainable_mut()
                .zip(grads)
                .zip(&mut self.state)
                .map(|((p, g), slots)| {
                    let state = Slots {
                        slots,
                        shape: p.value.shape().clone(),
                    };
                    (p.value.data_mut(), g.data(), state)
                });
        // SGD's and Adam's element loops are spread over the threads as one job for the whole
        // step; the others update tensor by tensor.
        match self.config {
            OptimizerConfig::Sgd {
                momentum,
                dampening,
                nesterov,
                weight_decay,
                ..
            } => {
                let rule = sgd::SgdRule {
                    momentum,
                    dampening,
                    nesterov,
                    weight_decay,
                };
                sgd::update_all(rule, lr, tensors.collect());
            }
            OptimizerConfig::Adam {
                beta1,
                beta2,
                eps,
                weight_decay,
                ..
            }
            | OptimizerConfig::AdamW {
                beta1,
                beta2,
                eps,
                weight_decay,
                ..
            } => {
                let rule = adam::AdamRule {
                    beta1,
                    beta2,
                    eps,
                    weight_decay,
                    decoupled: matches!(self.config, OptimizerConfig::AdamW { .. }),
                };
                adam::update_all(&rule, lr, step, tensors.collect());
            }
            OptimizerConfig::RmsProp {
                alpha,
                eps,
                weight_decay,
                momentum,
                centered,
                ..
            } => {
                let rule = rmsprop::RmsPropRule {
                    alpha,
                    eps,
                    weight_decay,
                    momentum,
                    centered,
                };
                for (value, grad, state) in tensors {
                    rmsprop::update(&rule, lr, value, grad, state);
                }
            }
            OptimizerConfig::Adagrad {
                lr_decay,
                weight_decay,
                eps,
                ..
            } => {
                let rule = adagrad::AdagradRule {
                    lr_decay,
                    weight_decay,
                    eps,
                };
                for (value, grad, state) in tensors {
                    adagrad::update(&rule, lr, step, value, grad, state);
                }
            }
        }
        Ok(())
    }

    /// An error unless there are as many gradients (`grads`) and state entries as trainable
    /// tensors.
    fn check_count(&self, params: &ParamSet<S>, grads: usize) -> Result<()> {
        let count = params.trainable().count();
        if grads != count || self.state.len() != count {
            return Err(Error::invalid(
                "optimizer",
                format!(
                    "{grads} gradients and {} state entries for {count} trainable tensors",
                    self.state.len()
                ),
            ));
        }
        Ok(())
    }

    /// As [`Optimizer::step`] for gradients as a step hands them over. Every rule but plain SGD
    /// (no momentum, no weight decay) gets the dense gradients (`Grad::into_dense`). Plain SGD
    /// applies a factored gradient `Grad::Outer` without writing it:
    ///
    /// - one row: in one pass over the parameter, `p + (-lr) * (rows[i] * cols[j])`, the same
    ///   roundings in the same order as multiplying it out and stepping, so the same bits;
    /// - `B > 1` rows: as one GEMM that accumulates straight into the parameter,
    ///   `p := p + (-lr) * (rows^T cols)`, with the depth, thread split and kernel path of
    ///   linear's weight-gradient GEMM. gemm adds each depth block's sum `acc` as one fused
    ///   multiply-add `p + (-lr) * acc` where the dense step rounds the gradient, then `(-lr) * g`,
    ///   then the sum, so the bits differ from the dense step's by a few roundings: per element at
    ///   most `2 * gamma(B + 2) * (|p| + lr * sum_b |rows[b, i] * cols[b, j]|)`, `gamma(n) = n u /
    ///   (1 - n u)` (a test checks this bound on random shapes). Both backends hand over the same
    ///   factors, so they still agree bit for bit, and a run stays deterministic for a fixed
    ///   thread count (the GEMM's bits do not depend on it).
    pub fn step_grads(
        &mut self,
        params: &mut ParamSet<S>,
        grads: Vec<Grad<S>>,
        lr: f64,
    ) -> Result<()> {
        if !self.config.is_plain_sgd() || grads.iter().all(|g| matches!(g, Grad::Dense(_))) {
            let dense = Grad::all_dense(grads)?;
            return self.step(params, &dense, lr);
        }
        self.check_count(params, grads.len())?;
        // Every shape is checked before any tensor changes, so an error leaves the step undone.
        let mut checked = Vec::with_capacity(grads.len());
        for (p, g) in params.trainable().zip(&grads) {
            checked.push(match g {
                Grad::Dense(g) if p.value.shape() != g.shape() => {
                    return Err(Error::ShapeMismatch {
                        op: "optimizer",
                        expected: Box::new(p.value.shape().clone()),
                        found: Box::new(g.shape().clone()),
                    })
                }
                Grad::Dense(g) => Checked::Dense(g.data()),
                Grad::Outer { rows, cols } => {
                    let d = OuterDims::of(rows, cols)?;
                    if p.value.dims() != [d.out, d.inn] {
                        return Err(outer_mismatch(p.value.shape(), d));
                    }
                    Checked::Factored(d, rows.data(), cols.data())
                }
            });
        }
        self.steps = self.steps.saturating_add(1);
        let neg_lr = s::<S>(-lr);
        let mut dense = Vec::new();
        let each = params.trainable_mut().zip(checked).zip(&mut self.state);
        for ((p, g), slots) in each {
            match g {
                Checked::Dense(g) => {
                    let state = Slots {
                        slots,
                        shape: p.value.shape().clone(),
                    };
                    dense.push((p.value.data_mut(), g, state));
                }
                Checked::Factored(d, rows, cols) => {
                    sgd::step_factored(p.value.data_mut(), neg_lr, d, rows, cols)
                }
            }
        }
        // Only plain SGD gets here (checked on entry).
        sgd::update_all(sgd::SgdRule::PLAIN, lr, dense);
        Ok(())
    }

    /// Every present state tensor as `(slot name, parameter index, tensor)`.
    pub fn state_entries(&self) -> Vec<(&'static str, usize, &Tensor<S>)> {
        let names = self.config.slot_names();
        let mut out = Vec::new();
        for (i, slots) in self.state.iter().enumerate() {
            for (k, t) in slots.iter().enumerate() {
                if let Some(t) = t {
                    out.push((names[k], i, t));
                }
            }
        }
        out
    }

    /// Restores the step count and state (as read from a checkpoint). `lookup(slot, i)` returns
    /// the saved tensor for slot `slot` of trainable tensor `i`, if the file has it.
    pub fn restore(
        &mut self,
        steps: u64,
        mut lookup: impl FnMut(&'static str, usize) -> Option<Tensor<S>>,
    ) {
        let names = self.config.slot_names();
        self.steps = steps;
        for (i, slots) in self.state.iter_mut().enumerate() {
            for (k, slot) in slots.iter_mut().enumerate() {
                *slot = lookup(names[k], i);
            }
        }
    }

    /// The slots a checkpoint of this optimizer must hold after `steps` steps.
    pub fn required_slots(&self, steps: u64) -> Vec<&'static str> {
        self.config.required_slots(steps)
    }
}

/// A gradient whose shape `step_grads` has checked against its parameter.
enum Checked<'a, S> {
    Dense(&'a [S]),
    /// The sizes and data of `Grad::Outer`'s `rows` and `cols`.
    Factored(OuterDims, &'a [S], &'a [S]),
}

/// Rounds an f64 hyper-parameter to the element type (as PyTorch does with a Python float).
fn s<S: Scalar>(v: f64) -> S {
    S::from_f64(v)
}

/// The state slots of one parameter, created lazily with the parameter's shape.
struct Slots<'a, S> {
    slots: &'a mut [Option<Tensor<S>>],
    shape: Shape,
}

impl<'a, S: Scalar> Slots<'a, S> {
    /// Whether slot `k` exists yet.
    fn has(&self, k: usize) -> bool {
        self.slots[k].is_some()
    }

    /// Slot `k`, created as zeros on first use (PyTorch's `torch.zeros_like(p)`).
    fn zeroed(&mut self, k: usize) -> &mut [S] {
        let shape = &self.shape;
        self.slots[k]
            .get_or_insert_with(|| Tensor::zeros(shape))
            .data_mut()
    }

    /// Slot `k`, created as zeros on first use, for as long as the slots are borrowed.
    fn into_zeroed(self, k: usize) -> &'a mut [S] {
        let Slots { slots, shape } = self;
        slots[k]
            .get_or_insert_with(|| Tensor::zeros(&shape))
            .data_mut()
    }

    /// Slots `a` and `b` (distinct), each created as zeros on first use, for as long as the
    /// slots are lent.
    fn into_two(self, a: usize, b: usize) -> (&'a mut [S], &'a mut [S]) {
        let Slots { slots, shape } = self;
        for k in [a, b] {
            slots[k].get_or_insert_with(|| Tensor::zeros(&shape));
        }
        let (lo, hi) = slots.split_at_mut(a.max(b));
        let (first, second) = (
            lo[a.min(b)].as_mut().expect("created above").data_mut(),
            hi[0].as_mut().expect("created above").data_mut(),
        );
        if a < b {
            (first, second)
        } else {
            (second, first)
        }
    }

    /// The slots flagged in `wanted`, each created as zeros on first use; unflagged slots are
    /// neither created nor lent (`None`).
    fn some<const N: usize>(&mut self, wanted: [bool; N]) -> [Option<&mut [S]>; N] {
        let shape = &self.shape;
        let mut lent: [Option<&mut [S]>; N] = std::array::from_fn(|_| None);
        for ((slot, want), out) in self.slots.iter_mut().zip(wanted).zip(&mut lent) {
            if want {
                *out = Some(slot.get_or_insert_with(|| Tensor::zeros(shape)).data_mut());
            }
        }
        lent
    }
}
