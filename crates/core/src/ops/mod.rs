//! Every differentiable operation, defined once: shape rule, forward, VJP, JVP, the tensors its VJP
//! keeps ("saves") and its domain check. Ops are grouped in families, one file each; `Op` dispatches
//! to them with one exhaustive match per rule, so the tape and the graph share a single definition.

pub mod activation;
mod context;
pub mod elementwise;
mod hooks;
pub mod linalg;
mod list;
pub mod loss;
pub mod nn;
pub mod reduce;
pub mod structure;

pub use activation::{ActivationOp, GeluApproximate};
pub(crate) use context::emit_each;
pub use context::{
    ArgShapes, ArgValues, Arity, Aux, Forward, Grads, Mask, Saved, Saves, VjpContext,
};
pub use elementwise::ElementwiseOp;
pub use hooks::{LinearPart, LinearVjp};
pub use linalg::LinalgOp;
pub use list::{HasKind, NnKind, OpFamily, OpKind};
pub use loss::{class_labels, ClassLabel, ClassLossOptions, LossOp, Reduction};
pub use nn::NnOp;
pub use reduce::ReduceOp;
pub use structure::StructureOp;

use smallvec::SmallVec;
use tapegrad_tensor::kernels::alloc::ensure_allocatable;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// `Display` as the op's name alone, for the op structs without attributes.
macro_rules! display_by_name {
    ($($op:ty),* $(,)?) => {
        $(
            impl std::fmt::Display for $op {
                fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str(self.name())
                }
            }
        )*
    };
}
pub(crate) use display_by_name;

/// The op contract and `Display` of a family enum whose every variant holds an op struct: each
/// rule and hook dispatched by the family's `each!` macro (one plain `match`).
macro_rules! family_dispatch {
    ($family:ty, $each:ident) => {
        impl OpRules for $family {
            fn arity(&self) -> Arity {
                $each!(self, op => op.arity())
            }
            fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
                $each!(self, op => op.output_shape(inputs))
            }
            fn saves(&self) -> Saves {
                $each!(self, op => op.saves())
            }
            fn saves_for(&self, needs: &[bool]) -> Saves {
                $each!(self, op => op.saves_for(needs))
            }
            fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
                $each!(self, op => op.forward(x))
            }
            fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
                $each!(self, op => op.vjp(ctx, cot))
            }
            fn jvp<S: Scalar>(
                &self,
                x: &[&Tensor<S>],
                out: &Forward<S>,
                t: &[&Tensor<S>],
            ) -> Result<Tensor<S>> {
                $each!(self, op => op.jvp(x, out, t))
            }
            fn check_domain<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<()> {
                $each!(self, op => op.check_domain(x))
            }
            #[inline]
            fn linear_vjp(&self) -> Option<LinearVjp> {
                $each!(self, op => op.linear_vjp())
            }
            #[inline]
            fn forward_in_place<S: Scalar>(&self, x: &mut Tensor<S>) -> bool {
                $each!(self, op => op.forward_in_place(x))
            }
            #[inline]
            fn vjp_in_place<S: Scalar>(&self, y: &Tensor<S>, cot: &mut Tensor<S>) -> bool {
                $each!(self, op => op.vjp_in_place(y, cot))
            }
            #[inline]
            fn recomputable(&self) -> bool {
                $each!(self, op => op.recomputable())
            }
            fn recompute<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
                $each!(self, op => op.recompute(x))
            }
        }

        impl std::fmt::Display for $family {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                $each!(self, op => write!(f, "{op}"))
            }
        }
    };
}
pub(crate) use family_dispatch;

/// Declares an op family from one list of its ops: the enum, with one variant per op struct named
/// as the struct; the family's `each!` macro, one plain `match` over those variants that the
/// family's own code may use after the declaration; and the family's `OpRules` and `Display`
/// (`family_dispatch`). The leading `$` is passed in as a token, so that the `each!` it declares
/// can have metavariables of its own.
macro_rules! op_family {
    ($d:tt $(#[$meta:meta])* $vis:vis enum $family:ident { $($variant:ident),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq)]
        $vis enum $family {
            $($variant($variant)),+
        }

        macro_rules! each {
            ($d family:expr, $d op:ident => $d body:expr) => {
                match $d family {
                    $($family::$variant($d op) => $d body,)+
                }
            };
        }

        $crate::ops::family_dispatch!($family, each);
    };
}
pub(crate) use op_family;

/// The saves and JVP of a linear op whose VJP needs only shapes and attributes (the structural
/// and indexing ops): it keeps nothing, and its JVP is the op applied to the tangents. Expands to
/// those `OpRules` methods, in the op's `impl OpRules`.
macro_rules! linear_shell {
    () => {
        fn saves(&self) -> Saves {
            Saves::NOTHING
        }
        fn jvp<S: Scalar>(
            &self,
            _x: &[&Tensor<S>],
            _out: &Forward<S>,
            t: &[&Tensor<S>],
        ) -> Result<Tensor<S>> {
            Ok(self.forward(t)?.value)
        }
    };
}
pub(crate) use linear_shell;

/// A constant attribute in an op's element type.
fn s<S: Scalar>(v: f64) -> S {
    S::from_f64(v)
}

/// The rules every op family implements. Each method sees arguments already checked for arity.
/// The op's kind, hence its name, comes from the list of ops (`ops/list.rs`).
pub trait OpRules: HasKind {
    /// PyTorch's name of the op (`add`, `log_softmax`, `cross_entropy`, ...), from the list.
    #[inline]
    fn name(&self) -> &'static str {
        self.kind().label()
    }
    /// How many tensor arguments the op takes.
    fn arity(&self) -> Arity;
    /// The output shape, or an error naming the op and the offending shapes.
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape>;
    /// Which arguments (and whether the output) the VJP needs.
    fn saves(&self) -> Saves;
    /// What the VJP reads when it is asked only for the contributions flagged in `needs` (one
    /// flag per argument): by default all of [`OpRules::saves`]. An op whose VJP reads some
    /// argument only for another argument's contribution (linear's weight, for the input's)
    /// narrows it, so a pass that differentiates only what requires grad keeps less.
    fn saves_for(&self, _needs: &[bool]) -> Saves {
        self.saves()
    }
    /// Forward evaluation. Called only with shapes `output_shape` accepted.
    fn forward<S: Scalar>(&self, inputs: &[&Tensor<S>]) -> Result<Forward<S>>;
    /// Vector-Jacobian product: one contribution per argument (`None` only where `ctx.needs` is
    /// false), each of its argument's shape.
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>>;
    /// Jacobian-vector product: the output tangent given one tangent per argument.
    fn jvp<S: Scalar>(
        &self,
        inputs: &[&Tensor<S>],
        out: &Forward<S>,
        tangents: &[&Tensor<S>],
    ) -> Result<Tensor<S>>;
    /// Domain rules that checked evaluation enforces (e.g. `log` of a non-positive value).
    fn check_domain<S: Scalar>(&self, _inputs: &[&Tensor<S>]) -> Result<()> {
        Ok(())
    }

    // The optional hooks: fast paths an executor may take instead of `vjp` or `forward`, for
    // ops with the property each names. A hook must give the bits of the rule it replaces
    // (laws 1 and 4 hold the executors to them); an op without it runs through its rules.

    /// The VJP as a linear map of the cotangent alone ([`LinearVjp`]: per argument, the
    /// cotangent itself, negated or scaled by a constant), for an op whose VJP reads no value.
    /// The executed sweep then moves a cotangent nothing reads again into its parent's slot, or
    /// changes it in place, instead of calling `vjp` (debug builds check each such step against
    /// `vjp`, bit for bit). `None` by default.
    #[inline]
    fn linear_vjp(&self) -> Option<LinearVjp> {
        None
    }

    /// For a one-argument op whose output has its argument's shape and whose VJP reads only the
    /// output: writes the forward's value over the argument `x` itself (its buffer copied first
    /// if shared) and returns true. The saved graph uses it for an argument nothing reads later,
    /// sparing the output's buffer. False, `x` untouched, by default.
    #[inline]
    fn forward_in_place<S: Scalar>(&self, _x: &mut Tensor<S>) -> bool {
        false
    }

    /// For the ops of [`OpRules::forward_in_place`]: writes the argument's contribution over the
    /// cotangent `cot` itself, reading the saved output `y`, and returns true. The saved graph
    /// uses it for a cotangent nothing reads again. False, `cot` untouched, by default.
    #[inline]
    fn vjp_in_place<S: Scalar>(&self, _y: &Tensor<S>, _cot: &mut Tensor<S>) -> bool {
        false
    }
    /// Whether the saved graph may recompute this op's value during the backward instead of
    /// letting the later node that reads it keep it: an op whose forward is cheap beside the
    /// products around it (a normalisation, an activation read from its input), so a training
    /// step holds less memory for little time. False by default.
    #[inline]
    fn recomputable(&self) -> bool {
        false
    }
    /// The value recomputed for the backward from the forward's own arguments: `forward`'s value
    /// bit for bit, with any aux the op's VJP may then read instead of redoing that work (GELU's
    /// slope). `forward` by default.
    fn recompute<S: Scalar>(&self, inputs: &[&Tensor<S>]) -> Result<Forward<S>> {
        self.forward(inputs)
    }
}

/// A differentiable operation with its non-differentiable attributes.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Elementwise(ElementwiseOp),
    Activation(ActivationOp),
    Reduce(ReduceOp),
    Linalg(LinalgOp),
    Structure(StructureOp),
    Loss(LossOp),
    /// Boxed: the largest family (attention, pooling and embedding attributes), and a rare one,
    /// would make every `Op` (and so every tape node) half as large again.
    Nn(Box<NnOp>),
}

macro_rules! dispatch {
    ($self:expr, $op:ident => $body:expr) => {
        match $self {
            Op::Elementwise($op) => $body,
            Op::Activation($op) => $body,
            Op::Reduce($op) => $body,
            Op::Linalg($op) => $body,
            Op::Structure($op) => $body,
            Op::Loss($op) => $body,
            Op::Nn($op) => $body,
        }
    };
}

impl Op {
    /// PyTorch's name of the op.
    #[inline]
    pub fn name(&self) -> &'static str {
        self.kind().label()
    }

    /// The op's entry in the list of ops (`OpKind::ALL`).
    #[inline]
    pub fn kind(&self) -> OpKind {
        dispatch!(self, op => op.kind())
    }

    /// How many tensor arguments the op takes.
    #[inline]
    pub fn arity(&self) -> Arity {
        dispatch!(self, op => op.arity())
    }

    /// Which arguments (and whether the output) the VJP keeps.
    #[inline]
    pub fn saves(&self) -> Saves {
        dispatch!(self, op => op.saves())
    }

    /// What the VJP reads when only the contributions flagged in `needs` are asked for (see
    /// [`OpRules::saves_for`]).
    #[inline]
    pub fn saves_for(&self, needs: &[bool]) -> Saves {
        dispatch!(self, op => op.saves_for(needs))
    }

    #[inline]
    fn check_arity(&self, found: usize) -> Result<()> {
        let ok = match self.arity() {
            Arity::Exact(n) => found == n,
            Arity::AtLeast(n) => found >= n,
        };
        if ok {
            Ok(())
        } else {
            Err(self.arity_error(found))
        }
    }

    /// The error for `found` arguments (kept out of line: the check runs on every op).
    #[cold]
    #[inline(never)]
    fn arity_error(&self, found: usize) -> Error {
        Error::Arity {
            op: self.name(),
            expected: self.arity().min(),
            found,
        }
    }

    /// The output shape for arguments of these shapes.
    #[inline]
    pub fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        self.check_arity(inputs.len())?;
        dispatch!(self, op => op.output_shape(inputs))
    }

    /// Checks shapes, then evaluates.
    #[inline]
    pub fn forward<S: Scalar>(&self, inputs: &[&Tensor<S>]) -> Result<Forward<S>> {
        if let Op::Elementwise(op) = self {
            if op.forward_checks_shapes() {
                // The kernels check the shapes on the way (same errors as the shape rule), so
                // the most common ops skip the separate rule and the comparison after.
                self.check_arity(inputs.len())?;
                return op.forward(inputs);
            }
        }
        self.forward_checked(inputs)
    }

    /// Whether the op is an elementwise one whose kernels check every shape themselves (the
    /// most common ops, which have no auxiliary data): `plain_forward` then gives its value.
    #[inline]
    pub(crate) fn has_plain_forward(&self) -> bool {
        matches!(self, Op::Elementwise(op) if op.forward_checks_shapes())
    }

    /// The value alone, for an op where `has_plain_forward` holds: what `forward` returns as
    /// `Forward::new(value)`, arity checked, without the wrapper to unpack. For any other op,
    /// `forward`'s value (its auxiliary data dropped: callers check `has_plain_forward` first).
    #[inline(always)]
    pub(crate) fn plain_forward<S: Scalar>(&self, inputs: &[&Tensor<S>]) -> Result<Tensor<S>> {
        match self {
            Op::Elementwise(op) if op.forward_checks_shapes() => {
                self.check_arity(inputs.len())?;
                op.forward_value(inputs)
            }
            _ => self.forward(inputs).map(|forward| forward.value),
        }
    }

    /// `forward` for ops whose kernels do not check every shape themselves: the shape rule
    /// first, the result's shape compared with it after.
    #[inline(never)]
    fn forward_checked<S: Scalar>(&self, inputs: &[&Tensor<S>]) -> Result<Forward<S>> {
        let expected = self.output_shape(&shapes_of(inputs))?;
        // A shape argument may ask for far more than the machine holds (an outer product,
        // a broadcast, a padding): an error naming the op, not an allocation abort.
        ensure_allocatable::<S>(self.name(), &expected)?;
        // Checked where it lies and returned as is (no unwrap and re-wrap copies).
        let out = dispatch!(self, op => op.forward(inputs));
        if let Ok(out) = &out {
            if *out.value.shape() != expected {
                return Err(Error::ShapeMismatch {
                    op: self.name(),
                    expected: Box::new(expected),
                    found: Box::new(out.value.shape().clone()),
                });
            }
        }
        out
    }

    /// Checks the op's domain rules on these arguments (used by checked evaluation).
    pub fn check_domain<S: Scalar>(&self, inputs: &[&Tensor<S>]) -> Result<()> {
        self.output_shape(&shapes_of(inputs))?;
        dispatch!(self, op => op.check_domain(inputs))
    }

    /// The VJP, with every contribution's shape checked against its argument.
    pub fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        self.check_cotangent(ctx, cot)?;
        // Checked where it lies and returned as is: unwrapping and re-wrapping the inline list
        // would copy it twice per call.
        #[allow(unused_mut)]
        let mut grads = dispatch!(self, op => op.vjp(ctx, cot));
        #[cfg(feature = "fault-injection")]
        if let Ok(list) = &mut grads {
            crate::fault::apply(self.name(), list);
        }
        if let Ok(list) = &grads {
            self.check_grads(ctx, list)?;
        }
        grads
    }

    /// The op's linear VJP, if it has one ([`OpRules::linear_vjp`]).
    #[inline]
    pub fn linear_vjp(&self) -> Option<LinearVjp> {
        dispatch!(self, op => op.linear_vjp())
    }

    /// The forward written over its argument, if the op can ([`OpRules::forward_in_place`]).
    #[inline]
    pub fn forward_in_place<S: Scalar>(&self, x: &mut Tensor<S>) -> bool {
        dispatch!(self, op => op.forward_in_place(x))
    }

    /// The VJP written over the cotangent, if the op can ([`OpRules::vjp_in_place`]).
    #[inline]
    pub fn vjp_in_place<S: Scalar>(&self, y: &Tensor<S>, cot: &mut Tensor<S>) -> bool {
        dispatch!(self, op => op.vjp_in_place(y, cot))
    }

    /// Whether the saved graph may recompute the value in the backward
    /// ([`OpRules::recomputable`]).
    #[inline]
    pub fn recomputable(&self) -> bool {
        dispatch!(self, op => op.recomputable())
    }

    /// The value recomputed from the forward's arguments ([`OpRules::recompute`]).
    pub fn recompute<S: Scalar>(&self, inputs: &[&Tensor<S>]) -> Result<Forward<S>> {
        self.check_arity(inputs.len())?;
        dispatch!(self, op => op.recompute(inputs))
    }

    /// The cotangent has the output's shape.
    #[inline]
    fn check_cotangent<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<()> {
        if cot.shape() == ctx.output_shape {
            return Ok(());
        }
        Err(Error::ShapeMismatch {
            op: self.name(),
            expected: Box::new(ctx.output_shape.clone()),
            found: Box::new(cot.shape().clone()),
        })
    }

    /// One contribution per argument, each of its argument's shape, and none missing where needed.
    fn check_grads<S: Scalar>(&self, ctx: &VjpContext<'_, S>, grads: &Grads<S>) -> Result<()> {
        if grads.len() != ctx.input_shapes.len() {
            return Err(Error::invalid(
                self.name(),
                format!(
                    "vjp returned {} contributions for {} arguments",
                    grads.len(),
                    ctx.input_shapes.len()
                ),
            ));
        }
        for (i, g) in grads.iter().enumerate() {
            match g {
                Some(g) if g.shape() != &ctx.input_shapes[i] => {
                    return Err(Error::ShapeMismatch {
                        op: self.name(),
                        expected: Box::new(ctx.input_shapes[i].clone()),
                        found: Box::new(g.shape().clone()),
                    })
                }
                None if ctx.needs[i] => {
                    return Err(Error::invalid(
                        self.name(),
                        format!("vjp gave no contribution for argument {i}, which needs one"),
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The JVP, with arity and tangent shapes checked.
    pub fn jvp<S: Scalar>(
        &self,
        inputs: &[&Tensor<S>],
        out: &Forward<S>,
        tangents: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        self.check_arity(inputs.len())?;
        if tangents.len() != inputs.len() {
            return Err(Error::Arity {
                op: self.name(),
                expected: inputs.len(),
                found: tangents.len(),
            });
        }
        for (x, t) in inputs.iter().zip(tangents) {
            if x.shape() != t.shape() {
                return Err(Error::ShapeMismatch {
                    op: self.name(),
                    expected: Box::new(x.shape().clone()),
                    found: Box::new(t.shape().clone()),
                });
            }
        }
        dispatch!(self, op => op.jvp(inputs, out, tangents))
    }
}

/// The arguments' shapes, inline for up to four (plain pushes: cheaper than a generic `collect`).
#[inline]
fn shapes_of<'a, S: Scalar>(inputs: &[&'a Tensor<S>]) -> SmallVec<[&'a Shape; 4]> {
    let mut shapes = SmallVec::new();
    for t in inputs {
        shapes.push(t.shape());
    }
    shapes
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Elementwise(op) => write!(f, "{op}"),
            Op::Activation(op) => write!(f, "{op}"),
            Op::Reduce(op) => write!(f, "{op}"),
            Op::Linalg(op) => write!(f, "{op}"),
            Op::Structure(op) => write!(f, "{op}"),
            Op::Loss(op) => write!(f, "{op}"),
            Op::Nn(op) => write!(f, "{op}"),
        }
    }
}
