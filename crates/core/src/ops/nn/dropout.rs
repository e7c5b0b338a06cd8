//! `dropout` with an explicit seed: the keep-mask is a pure function of (seed, element count, p),
//! drawn from ChaCha8 (a counter-based stream cipher generator), so the same seed gives the same
//! mask, the VJP regenerates it instead of saving it, and evaluation mode is the identity.

use crate::ops::{Arity, Forward, Grads, OpRules, Saves, VjpContext};
use rand::{Rng, SeedableRng};
use smallvec::smallvec;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// `F.dropout(input, p, training)` with the generator made explicit: in training mode each element
/// is zeroed with probability `p` and the survivors are scaled by `1 / (1 - p)` (all zeros when
/// `p = 1`); the mask comes from `seed`. A training loop must pass a fresh seed each step (for
/// instance a base seed plus the step number) to draw fresh masks.
#[derive(Debug, Clone, PartialEq)]
pub struct Dropout {
    pub p: f64,
    pub training: bool,
    pub seed: u64,
}

/// The keep-mask dropout uses for `n` elements: element `i` is kept when the `i`-th uniform draw
/// in `[0, 1)` of ChaCha8 seeded with `seed` is at least `p`.
pub fn dropout_mask(seed: u64, n: usize, p: f64) -> Vec<bool> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random::<f64>() >= p).collect()
}

impl Dropout {
    fn check(&self, x: &Shape) -> Result<()> {
        if !(0.0..=1.0).contains(&self.p) {
            return Err(Error::invalid(
                "dropout",
                format!(
                    "dropout probability has to be between 0 and 1, but got {} (input {x})",
                    self.p
                ),
            ));
        }
        Ok(())
    }

    /// The map `x -> x * mask * scale` (also its own VJP and JVP: it is linear and diagonal).
    fn apply<S: Scalar>(&self, x: &Tensor<S>) -> Result<Tensor<S>> {
        self.check(x.shape())?;
        if !self.training {
            return Ok(x.clone());
        }
        let scale = if self.p < 1.0 {
            S::from_f64(1.0 / (1.0 - self.p))
        } else {
            S::ZERO
        };
        let mask = dropout_mask(self.seed, x.numel(), self.p);
        let data = x
            .data()
            .iter()
            .zip(mask)
            .map(|(&v, keep)| if keep { v * scale } else { S::ZERO })
            .collect();
        Tensor::from_shape(x.shape().clone(), data)
    }
}

impl OpRules for Dropout {
    fn arity(&self) -> Arity {
        Arity::Exact(1)
    }
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        self.check(inputs[0])?;
        Ok(inputs[0].clone())
    }
    /// Nothing: the VJP regenerates the mask from the seed.
    fn saves(&self) -> Saves {
        Saves::NOTHING
    }
    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        Ok(Forward::new(self.apply(x[0])?))
    }
    fn vjp<S: Scalar>(&self, _ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        Ok(smallvec![Some(self.apply(cot)?)])
    }
    fn jvp<S: Scalar>(
        &self,
        _x: &[&Tensor<S>],
        _out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        self.apply(t[0])
    }
}

impl std::fmt::Display for Dropout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "dropout(p={}, training={}, seed={})",
            self.p, self.training, self.seed
        )
    }
}
