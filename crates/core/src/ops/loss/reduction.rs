//! How a loss reduces its per-element (or per-sample) terms: PyTorch's `reduction` argument, with
//! the forward, the tangent and the cotangent each element receives, for every loss alike. The
//! sums are pairwise, in `sum`'s blocked order.

use tapegrad_tensor::kernels::pairwise_sum;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// How a loss reduces over elements: PyTorch's `reduction` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    None,
    Mean,
    Sum,
}

impl Reduction {
    /// PyTorch's spelling of the attribute.
    pub fn name(self) -> &'static str {
        match self {
            Reduction::None => "none",
            Reduction::Mean => "mean",
            Reduction::Sum => "sum",
        }
    }

    /// The loss's shape: the per-element (or per-sample) shape for `none`, a scalar otherwise.
    pub(super) fn output_shape(self, unreduced: Shape) -> Shape {
        match self {
            Reduction::None => unreduced,
            Reduction::Mean | Reduction::Sum => Shape::scalar(),
        }
    }

    /// Reduces per-element losses. The mean of no elements is NaN (0/0), as in PyTorch. `sum`
    /// and `mean` add the terms in `sum`'s blocked pairwise order (a float32 mean of 20k squared
    /// errors is then within an ulp or two, where one running total is 8-33 ulps off).
    pub(super) fn forward<S: Scalar>(self, per: Vec<S>, unreduced: &Shape) -> Result<Tensor<S>> {
        let count = S::from_usize(per.len());
        self.forward_by(per, unreduced, count)
    }

    /// As `forward`, with the mean's divisor given (a class-label loss's total weight).
    pub(super) fn forward_by<S: Scalar>(
        self,
        per: Vec<S>,
        unreduced: &Shape,
        divisor: S,
    ) -> Result<Tensor<S>> {
        match self {
            Reduction::None => Tensor::from_shape(unreduced.clone(), per),
            Reduction::Sum => Ok(Tensor::scalar(pairwise_sum(&per))),
            Reduction::Mean => Ok(Tensor::scalar(pairwise_sum(&per) / divisor)),
        }
    }

    /// Reduces per-element tangents. The mean divides each term before summing, so the tangent of
    /// an empty mean is 0 (an empty sum) rather than 0/0: the output is the constant NaN whatever
    /// the input, and 0 keeps the JVP adjoint to the VJP, which has no element to give.
    pub(super) fn tangent<S: Scalar>(self, per: Vec<S>, unreduced: &Shape) -> Result<Tensor<S>> {
        let n = S::from_usize(per.len());
        self.tangent_by(per, unreduced, n, |_| true)
    }

    /// As `tangent`, with the mean's divisor given and only the `counted` elements in the mean
    /// (an ignored sample's 0 would be 0/0 when nothing is counted).
    pub(super) fn tangent_by<S: Scalar>(
        self,
        per: Vec<S>,
        unreduced: &Shape,
        divisor: S,
        counted: impl Fn(usize) -> bool,
    ) -> Result<Tensor<S>> {
        match self {
            Reduction::None => Tensor::from_shape(unreduced.clone(), per),
            Reduction::Sum => Ok(Tensor::scalar(pairwise_sum(&per))),
            Reduction::Mean => {
                let terms: Vec<S> = per
                    .into_iter()
                    .enumerate()
                    .filter(|&(i, _)| counted(i))
                    .map(|(_, c)| c / divisor)
                    .collect();
                Ok(Tensor::scalar(pairwise_sum(&terms)))
            }
        }
    }

    /// The cotangent each of `count` elements receives: its own entry for `none`, the scalar for
    /// `sum`, the scalar divided by `count` for `mean`.
    pub(super) fn weights<'a, S: Scalar>(
        self,
        op: &'static str,
        cot: &'a Tensor<S>,
        unreduced: &Shape,
    ) -> Result<Weights<'a, S>> {
        self.weights_by(op, cot, unreduced, S::from_usize(unreduced.numel()))
    }

    /// As `weights`, with the mean's divisor given.
    pub(super) fn weights_by<'a, S: Scalar>(
        self,
        op: &'static str,
        cot: &'a Tensor<S>,
        unreduced: &Shape,
        divisor: S,
    ) -> Result<Weights<'a, S>> {
        let expected = self.output_shape(unreduced.clone());
        if *cot.shape() != expected {
            return Err(Error::ShapeMismatch {
                op,
                expected: Box::new(expected),
                found: Box::new(cot.shape().clone()),
            });
        }
        Ok(match self {
            Reduction::None => Weights::Each(cot.data()),
            Reduction::Sum => Weights::All(cot.data()[0]),
            Reduction::Mean => Weights::All(cot.data()[0] / divisor),
        })
    }
}

impl std::fmt::Display for Reduction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Per-element cotangents: a slice for `none`, one shared value otherwise.
pub(super) enum Weights<'a, S> {
    Each(&'a [S]),
    All(S),
}

impl<S: Scalar> Weights<'_, S> {
    pub(super) fn at(&self, i: usize) -> S {
        match self {
            Weights::Each(w) => w[i],
            Weights::All(w) => *w,
        }
    }
}
