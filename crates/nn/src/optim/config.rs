//! `OptimizerConfig`: which optimizer and its hyper-parameters, with PyTorch's names and defaults;
//! serialisable so checkpoints record it.

use serde::{Deserialize, Serialize};
use tapegrad_tensor::{Error, Result};

/// An optimizer and its hyper-parameters (`lr` is the base rate before any schedule).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum OptimizerConfig {
    Sgd {
        lr: f64,
        momentum: f64,
        dampening: f64,
        nesterov: bool,
        weight_decay: f64,
    },
    Adam {
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
    },
    #[serde(rename = "adamw")]
    AdamW {
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
    },
    #[serde(rename = "rmsprop")]
    RmsProp {
        lr: f64,
        alpha: f64,
        eps: f64,
        weight_decay: f64,
        momentum: f64,
        centered: bool,
    },
    Adagrad {
        lr: f64,
        lr_decay: f64,
        weight_decay: f64,
        initial_accumulator_value: f64,
        eps: f64,
    },
}

impl OptimizerConfig {
    /// PyTorch's defaults for the optimizer called `name` (`sgd`, `adam`, `adamw`, `rmsprop`,
    /// `adagrad`), with learning rate `lr`. SGD gets momentum 0.9 here (PyTorch's default is 0).
    pub fn by_name(name: &str, lr: f64) -> Result<Self> {
        Ok(match name.to_ascii_lowercase().as_str() {
            "sgd" => OptimizerConfig::Sgd {
                lr,
                momentum: 0.9,
                dampening: 0.0,
                nesterov: false,
                weight_decay: 0.0,
            },
            "adam" => OptimizerConfig::Adam {
                lr,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.0,
            },
            "adamw" => OptimizerConfig::AdamW {
                lr,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 1e-2,
            },
            "rmsprop" => OptimizerConfig::RmsProp {
                lr,
                alpha: 0.99,
                eps: 1e-8,
                weight_decay: 0.0,
                momentum: 0.0,
                centered: false,
            },
            "adagrad" => OptimizerConfig::Adagrad {
                lr,
                lr_decay: 0.0,
                weight_decay: 0.0,
                initial_accumulator_value: 0.0,
                eps: 1e-10,
            },
            other => {
                return Err(Error::invalid(
                    "optimizer",
                    format!(
                    "unknown optimizer '{other}' (expected sgd, adam, adamw, rmsprop or adagrad)"
                ),
                ))
            }
        })
    }

    /// The lower-case name.
    pub fn name(&self) -> &'static str {
        match self {
            OptimizerConfig::Sgd { .. } => "sgd",
            OptimizerConfig::Adam { .. } => "adam",
            OptimizerConfig::AdamW { .. } => "adamw",
            OptimizerConfig::RmsProp { .. } => "rmsprop",
            OptimizerConfig::Adagrad { .. } => "adagrad",
        }
    }

    /// Plain SGD: no momentum and no weight decay, so a step is `p + (-lr) * g` and nothing
    /// else (what `Optimizer::step_grads` can apply to a factored gradient).
    pub fn is_plain_sgd(&self) -> bool {
        matches!(*self, OptimizerConfig::Sgd { momentum, weight_decay, .. }
            if momentum == 0.0 && weight_decay == 0.0)
    }

    /// The base learning rate.
    pub fn lr(&self) -> f64 {
        match *self {
            OptimizerConfig::Sgd { lr, .. }
            | OptimizerConfig::Adam { lr, .. }
            | OptimizerConfig::AdamW { lr, .. }
            | OptimizerConfig::RmsProp { lr, .. }
            | OptimizerConfig::Adagrad { lr, .. } => lr,
        }
    }

    /// The same optimizer with base learning rate `lr`.
    pub fn with_lr(mut self, new_lr: f64) -> Self {
        match &mut self {
            OptimizerConfig::Sgd { lr, .. }
            | OptimizerConfig::Adam { lr, .. }
            | OptimizerConfig::AdamW { lr, .. }
            | OptimizerConfig::RmsProp { lr, .. }
            | OptimizerConfig::Adagrad { lr, .. } => *lr = new_lr,
        }
        self
    }

    /// The names of the per-parameter state slots, as in PyTorch's `state_dict`.
    pub fn slot_names(&self) -> &'static [&'static str] {
        match self {
            OptimizerConfig::Sgd { .. } => &["momentum_buffer"],
            OptimizerConfig::Adam { .. } | OptimizerConfig::AdamW { .. } => {
                &["exp_avg", "exp_avg_sq"]
            }
            OptimizerConfig::RmsProp { .. } => &["square_avg", "momentum_buffer", "grad_avg"],
            OptimizerConfig::Adagrad { .. } => &["sum"],
        }
    }

    /// The slots that exist after `steps` steps.
    pub fn required_slots(&self, steps: u64) -> Vec<&'static str> {
        let started = steps > 0;
        match *self {
            OptimizerConfig::Sgd { momentum, .. } => {
                if started && momentum != 0.0 {
                    vec!["momentum_buffer"]
                } else {
                    vec![]
                }
            }
            OptimizerConfig::Adam { .. } | OptimizerConfig::AdamW { .. } => {
                if started {
                    vec!["exp_avg", "exp_avg_sq"]
                } else {
                    vec![]
                }
            }
            OptimizerConfig::RmsProp {
                momentum, centered, ..
            } => {
                let mut v = Vec::new();
                if started {
                    v.push("square_avg");
                    if momentum > 0.0 {
                        v.push("momentum_buffer");
                    }
                    if centered {
                        v.push("grad_avg");
                    }
                }
                v
            }
            OptimizerConfig::Adagrad { .. } => vec!["sum"],
        }
    }

    /// Rejects hyper-parameters PyTorch rejects.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, v: f64| {
            Err(Error::invalid(
                "optimizer",
                format!("{}: invalid {what}: {v}", self.name()),
            ))
        };
        let lr = self.lr();
        if !non_negative(lr) || !lr.is_finite() {
            return bad("learning rate", lr);
        }
        match *self {
            OptimizerConfig::Sgd {
                momentum,
                dampening,
                nesterov,
                weight_decay,
                ..
            } => {
                if !non_negative(momentum) {
                    return bad("momentum", momentum);
                }
                if !non_negative(weight_decay) {
                    return bad("weight decay", weight_decay);
                }
                if nesterov && (momentum <= 0.0 || dampening != 0.0) {
                    return Err(Error::invalid(
                        "optimizer",
                        "sgd: nesterov momentum requires a momentum and zero dampening",
                    ));
                }
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
                if !(0.0..1.0).contains(&beta1) {
                    return bad("beta1", beta1);
                }
                if !(0.0..1.0).contains(&beta2) {
                    return bad("beta2", beta2);
                }
                if !non_negative(eps) {
                    return bad("epsilon", eps);
                }
                if !non_negative(weight_decay) {
                    return bad("weight decay", weight_decay);
                }
            }
            OptimizerConfig::RmsProp {
                alpha,
                eps,
                weight_decay,
                momentum,
                ..
            } => {
                if !non_negative(alpha) {
                    return bad("alpha", alpha);
                }
                if !non_negative(eps) {
                    return bad("epsilon", eps);
                }
                if !non_negative(weight_decay) {
                    return bad("weight decay", weight_decay);
                }
                if !non_negative(momentum) {
                    return bad("momentum", momentum);
                }
            }
            OptimizerConfig::Adagrad {
                lr_decay,
                weight_decay,
                initial_accumulator_value,
                eps,
                ..
            } => {
                if !non_negative(lr_decay) {
                    return bad("lr decay", lr_decay);
                }
                if !non_negative(weight_decay) {
                    return bad("weight decay", weight_decay);
                }
                if !non_negative(initial_accumulator_value) {
                    return bad("initial accumulator value", initial_accumulator_value);
                }
                if !non_negative(eps) {
                    return bad("epsilon", eps);
                }
            }
        }
        Ok(())
    }
}

/// `v >= 0`, false for NaN (so a NaN hyper-parameter is rejected).
fn non_negative(v: f64) -> bool {
    v >= 0.0
}
