//! Graph-file form of the elementwise family: torch names, with `factor` for scale, `exponent`
//! for pow, `min`/`max` for clamp, `eps` for safe_log and `condition` (a boolean mask) for where.

use super::super::attrs::{not_writable, AttrWriter, Attrs};
use crate::ops::elementwise::{
    Abs, Add, Clamp, Cos, Div, Exp, Log, Maximum, Minimum, Mul, Neg, Pow, SafeLog, Scale, Sin,
    Sqrt, Sub, Where,
};
use crate::ops::{ElementwiseOp as E, Op, OpKind as K};
use crate::Result;

pub(super) fn parse(kind: K, _args: usize, a: &mut Attrs) -> Result<Op> {
    let op = match kind {
        K::Add => E::Add(Add),
        K::Sub => E::Sub(Sub),
        K::Mul => E::Mul(Mul),
        K::Div => E::Div(Div),
        K::Neg => E::Neg(Neg),
        K::Scale => E::Scale(Scale {
            factor: a.f64_req("factor")?,
        }),
        K::Abs => E::Abs(Abs),
        K::Sqrt => E::Sqrt(Sqrt),
        K::Exp => E::Exp(Exp),
        K::Log => E::Log(Log),
        K::SafeLog => E::SafeLog(SafeLog {
            eps: a.f64_req("eps")?,
        }),
        K::Sin => E::Sin(Sin),
        K::Cos => E::Cos(Cos),
        K::Pow => E::Pow(Pow {
            exponent: a.f64_req("exponent")?,
        }),
        K::Clamp => E::Clamp(Clamp {
            min: a.f64("min")?,
            max: a.f64("max")?,
        }),
        K::Maximum => E::Maximum(Maximum),
        K::Minimum => E::Minimum(Minimum),
        K::Where => E::Where(Where {
            mask: a.mask_req("condition")?,
        }),
        other => return Err(not_writable(other.label())),
    };
    Ok(Op::Elementwise(op))
}

pub(super) fn write(op: &E, w: &mut AttrWriter) -> Result<()> {
    #[allow(unreachable_patterns)]
    match op {
        E::Add(Add)
        | E::Sub(Sub)
        | E::Mul(Mul)
        | E::Div(Div)
        | E::Neg(Neg)
        | E::Abs(Abs)
        | E::Sqrt(Sqrt)
        | E::Exp(Exp)
        | E::Log(Log) => {}
        E::Sin(Sin) | E::Cos(Cos) | E::Maximum(Maximum) | E::Minimum(Minimum) => {}
        E::Scale(Scale { factor }) => w.f64("factor", *factor),
        E::SafeLog(SafeLog { eps }) => w.f64("eps", *eps),
        E::Pow(Pow { exponent }) => w.f64("exponent", *exponent),
        E::Clamp(Clamp { min, max }) => {
            w.opt_f64("min", *min);
            w.opt_f64("max", *max);
        }
        E::Where(Where { mask }) => w.mask("condition", mask),
        other => return Err(not_writable(crate::ops::OpRules::name(other))),
    }
    Ok(())
}
