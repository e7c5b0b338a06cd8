//! Learning-rate schedules, indexed by optimizer step `t` (0 for the first update): an optional
//! linear warm-up, then constant, step decay or cosine annealing. Each is a closed form of its
//! PyTorch scheduler, so the rate at step `t` needs no history and resuming needs only `t`.

use serde::{Deserialize, Serialize};
use tapegrad_core::{Error, Result};

/// The shape of the schedule after warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Decay {
    /// The base rate throughout.
    Constant,
    /// `StepLR`: `lr * gamma^floor(t / step_size)`.
    Step { step_size: u64, gamma: f64 },
    /// `CosineAnnealingLR` (closed form): `eta_min + (lr - eta_min) * (1 + cos(pi * t / t_max)) / 2`
    /// for `t <= t_max`, `eta_min` after.
    Cosine { t_max: u64, eta_min: f64 },
}

/// A learning-rate schedule.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// Linear warm-up over this many steps: step `t < warmup` uses `lr * (t + 1) / (warmup + 1)`
    /// (PyTorch's `LinearLR` with `start_factor = 1 / (warmup + 1)`, `total_iters = warmup`);
    /// the decay then starts at its own step 0.
    pub warmup: u64,
    pub decay: Decay,
}

impl Default for Schedule {
    fn default() -> Self {
        Schedule {
            warmup: 0,
            decay: Decay::Constant,
        }
    }
}

impl Schedule {
    /// Rejects schedules that would divide by zero or grow without bound.
    pub fn validate(&self) -> Result<()> {
        match self.decay {
            Decay::Step { step_size: 0, .. } => Err(Error::invalid(
                "schedule",
                "step decay needs a step size of at least 1",
            )),
            Decay::Step { gamma, .. } if !(gamma > 0.0 && gamma.is_finite()) => {
                Err(Error::invalid(
                    "schedule",
                    format!("step decay needs a positive finite gamma, found {gamma}"),
                ))
            }
            Decay::Cosine { t_max: 0, .. } => Err(Error::invalid(
                "schedule",
                "cosine annealing needs t_max of at least 1",
            )),
            _ => Ok(()),
        }
    }

    /// The learning rate for optimizer step `t` given base rate `base`.
    pub fn lr(&self, base: f64, t: u64) -> f64 {
        if t < self.warmup {
            // In f64: `warmup + 1` overflows u64 at `--warmup 18446744073709551615`.
            return base * (t + 1) as f64 / (self.warmup as f64 + 1.0);
        }
        let t = t - self.warmup;
        match self.decay {
            Decay::Constant => base,
            Decay::Step { step_size, gamma } => {
                base * gamma.powi(i32::try_from(t / step_size.max(1)).unwrap_or(i32::MAX))
            }
            Decay::Cosine { t_max, eta_min } => {
                let t = t.min(t_max) as f64;
                eta_min
                    + (base - eta_min)
                        * (1.0 + (std::f64::consts::PI * t / t_max.max(1) as f64).cos())
                        / 2.0
            }
        }
    }

    /// A short description, e.g. `cosine(t_max=900) after 50 warm-up steps`.
    pub fn describe(&self) -> String {
        let decay = match self.decay {
            Decay::Constant => "constant".to_string(),
            Decay::Step { step_size, gamma } => format!("step(size={step_size}, gamma={gamma})"),
            Decay::Cosine { t_max, eta_min } => format!("cosine(t_max={t_max}, eta_min={eta_min})"),
        };
        if self.warmup > 0 {
            format!("{decay} after {} warm-up steps", self.warmup)
        } else {
            decay
        }
    }
}
