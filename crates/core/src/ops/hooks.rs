//! What the op contract's optional hooks return (`OpRules::linear_vjp`): descriptions of a fast
//! path an executor may take instead of an op's own rule, giving that rule's bits exactly. The
//! executors read only these descriptions, never a particular op.

use tapegrad_tensor::kernels::sum_to;
use tapegrad_tensor::{Result, Scalar, Shape, Tensor};

/// A VJP that is a linear map of the cotangent alone (it reads no value): one part per argument,
/// each then summed down to its argument's shape where that argument was broadcast. Add is
/// `Binary(Pass, Pass)`, sub `Binary(Pass, Negate)`, neg `Unary(Negate)`, scale `Unary(Scale)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LinearVjp {
    Unary(LinearPart),
    Binary(LinearPart, LinearPart),
}

/// How a linear VJP makes one argument's contribution from the cotangent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LinearPart {
    /// The cotangent itself.
    Pass,
    /// `-cot` (a negation, not a product with -1, which would keep a NaN's sign).
    Negate,
    /// `cot * factor`.
    Scale(f64),
}

impl LinearPart {
    /// The contribution to an argument of shape `shape` from cotangent `g` (given up by the
    /// caller, so it is changed in place when unshared): the part applied, then summed down to
    /// `shape` if the argument was broadcast.
    #[inline(always)]
    pub fn apply<S: Scalar>(self, mut g: Tensor<S>, shape: &Shape) -> Result<Tensor<S>> {
        self.apply_in_place(&mut g);
        if g.shape() == shape {
            Ok(g)
        } else {
            sum_to(&g, shape)
        }
    }

    /// The part applied to `g` itself (copied first only if shared), before any `sum_to`.
    #[inline(always)]
    pub fn apply_in_place<S: Scalar>(self, g: &mut Tensor<S>) {
        // One element (scalar code) is written without a loop; the same operation either way.
        match self {
            LinearPart::Pass => {}
            LinearPart::Negate => match g.data_mut() {
                [v] => *v = -*v,
                data => {
                    for v in data {
                        *v = -*v;
                    }
                }
            },
            LinearPart::Scale(factor) => {
                let f = S::from_f64(factor);
                match g.data_mut() {
                    [v] => *v *= f,
                    data => {
                        for v in data {
                            *v *= f;
                        }
                    }
                }
            }
        }
    }
}
