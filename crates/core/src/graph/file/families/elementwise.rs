//! Graph-file form of the elementwise family: torch names, with `factor` for scale, `exponent`
//! for pow, `min`/`max` for clamp, `eps` for safe_log and `condition` (a boolean mask) for where.

use super::super::attrs::{not_writable, AttrWriter, Attrs};
use crate::ops::{ElementwiseOp as E, Op};
use tapegrad_tensor::Result;

pub(super) const OPS: &[&str] = &[
    "add", "sub", "mul", "div", "neg", "scale", "abs", "sqrt", "exp", "log", "safe_log", "sin",
    "cos", "pow", "clamp", "maximum", "minimum", "where",
];

pub(super) fn parse(name: &'static str, _args: usize, a: &mut Attrs) -> Result<Op> {
    let op = match name {
        "add" => E::Add,
        "sub" => E::Sub,
        "mul" => E::Mul,
        "div" => E::Div,
        "neg" => E::Neg,
        "scale" => E::Scale {
            factor: a.f64_req("factor")?,
        },
        "abs" => E::Abs,
        "sqrt" => E::Sqrt,
        "exp" => E::Exp,
        "log" => E::Log,
        "safe_log" => E::SafeLog {
            eps: a.f64_req("eps")?,
        },
        "sin" => E::Sin,
        "cos" => E::Cos,
        "pow" => E::Pow {
            exponent: a.f64_req("exponent")?,
        },
        "clamp" => E::Clamp {
            min: a.f64("min")?,
            max: a.f64("max")?,
        },
        "maximum" => E::Maximum,
        "minimum" => E::Minimum,
        "where" => E::Where {
            mask: a.mask_req("condition")?,
        },
        other => return Err(not_writable(other)),
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
