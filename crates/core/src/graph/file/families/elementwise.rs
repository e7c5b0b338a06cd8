//! Graph-file form of the elementwise family: torch names, with `factor` for scale, `exponent`
//! for pow, `min`/`max` for clamp, `eps` for safe_log and `condition` (a boolean mask) for where.

use super::super::attrs::{not_writable, AttrWriter, Attrs};
use crate::ops::{ElementwiseOp as E, Op, OpKind as K};
use crate::Result;

pub(super) fn parse(kind: K, _args: usize, a: &mut Attrs) -> Result<Op> {
    let op = match kind {
        K::Add => E::Add,
        K::Sub => E::Sub,
        K::Mul => E::Mul,
        K::Div => E::Div,
        K::Neg => E::Neg,
        K::Scale => E::Scale {
            factor: a.f64_req("factor")?,
        },
        K::Abs => E::Abs,
        K::Sqrt => E::Sqrt,
        K::Exp => E::Exp,
        K::Log => E::Log,
        K::SafeLog => E::SafeLog {
            eps: a.f64_req("eps")?,
        },
        K::Sin => E::Sin,
        K::Cos => E::Cos,
        K::Pow => E::Pow {
            exponent: a.f64_req("exponent")?,
        },
        K::Clamp => E::Clamp {
            min: a.f64("min")?,
            max: a.f64("max")?,
        },
        K::Maximum => E::Maximum,
        K::Minimum => E::Minimum,
        K::Where => E::Where {
            mask: a.mask_req("condition")?,
        },
        other => return Err(not_writable(other.label())),
    };
    Ok(Op::Elementwise(op))
}

pub(super) fn write(op: &E, w: &mut AttrWriter) -> Result<()> {
    #[allow(unreachable_patterns)]
    match op {
        E::Add | E::Sub | E::Mul | E::Div | E::Neg | E::Abs | E::Sqrt | E::Exp | E::Log => {}
        E::Sin | E::Cos | E::Maximum | E::Minimum => {}
        E::Scale { factor } => w.f64("factor", *factor),
        E::SafeLog { eps } => w.f64("eps", *eps),
        E::Pow { exponent } => w.f64("exponent", *exponent),
        E::Clamp { min, max } => {
            w.opt_f64("min", *min);
            w.opt_f64("max", *max);
        }
        E::Where { mask } => w.mask("condition", mask),
        other => return Err(not_writable(crate::ops::OpRules::name(other))),
    }
    Ok(())
}
