//! Graph-file form of the activation family: torch.nn.functional names, with `negative_slope`
//! (default 0.01), `approximate` ("none" or "tanh") and softplus's `beta`/`threshold` (1, 20).

use super::super::attrs::{not_writable, AttrWriter, Attrs};
use crate::ops::activation::{Gelu, LeakyRelu, Relu, Sigmoid, Silu, Softplus, Tanh};
use crate::ops::{ActivationOp as A, GeluApproximate, Op, OpKind as K};
use crate::Result;

pub(super) fn parse(kind: K, _args: usize, a: &mut Attrs) -> Result<Op> {
    let op = match kind {
        K::Relu => A::Relu(Relu),
        K::LeakyRelu => A::LeakyRelu(LeakyRelu {
            negative_slope: a.f64_or("negative_slope", 0.01)?,
        }),
        K::Sigmoid => A::Sigmoid(Sigmoid),
        K::Tanh => A::Tanh(Tanh),
        K::Gelu => A::Gelu(Gelu {
            approximate: match a.choice("approximate", &["none", "tanh"], "none")? {
                "tanh" => GeluApproximate::Tanh,
                _ => GeluApproximate::None,
            },
        }),
        K::Softplus => A::Softplus(Softplus {
            beta: a.f64_or("beta", 1.0)?,
            threshold: a.f64_or("threshold", 20.0)?,
        }),
        K::Silu => A::Silu(Silu),
        other => return Err(not_writable(other.label())),
    };
    Ok(Op::Activation(op))
}

pub(super) fn write(op: &A, w: &mut AttrWriter) -> Result<()> {
    #[allow(unreachable_patterns)]
    match op {
        A::Relu(Relu) | A::Sigmoid(Sigmoid) | A::Tanh(Tanh) | A::Silu(Silu) => {}
        A::LeakyRelu(LeakyRelu { negative_slope }) => w.f64("negative_slope", *negative_slope),
        A::Gelu(Gelu { approximate }) => w.str("approximate", approximate.name()),
        A::Softplus(Softplus { beta, threshold }) => {
            w.f64("beta", *beta);
            w.f64("threshold", *threshold);
        }
        other => return Err(not_writable(crate::ops::OpRules::name(other))),
    }
    Ok(())
}
