//! The data an op's rules exchange with the engines: arity, what a VJP saves, the forward result
//! with its auxiliary data, the saved record a node keeps, and the context a VJP reads from.

use smallvec::SmallVec;
use std::sync::Arc;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// Number of tensor arguments an op takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arity {
    Exact(usize),
    AtLeast(usize),
}

impl Arity {
    /// The smallest accepted count.
    pub fn min(self) -> usize {
        match self {
            Arity::Exact(n) | Arity::AtLeast(n) => n,
        }
    }
}

/// Which tensors a VJP needs: a bit per argument (bit i = argument i) and the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Saves {
    pub inputs: u64,
    pub output: bool,
}

impl Saves {
    /// Keeps nothing (linear ops whose VJP needs only shapes).
    pub const NOTHING: Saves = Saves {
        inputs: 0,
        output: false,
    };
    /// Keeps only the output (relu, exp, softmax, ...).
    pub const OUTPUT: Saves = Saves {
        inputs: 0,
        output: true,
    };

    /// Keeps the listed arguments.
    pub const fn inputs(indices: &[usize]) -> Saves {
        let mut mask = 0u64;
        let mut i = 0;
        while i < indices.len() {
            assert!(
                indices[i] < 64,
                "Saves::inputs: argument index must be below 64"
            );
            mask |= 1 << indices[i];
            i += 1;
        }
        Saves {
            inputs: mask,
            output: false,
        }
    }

    /// For a VJP bilinear in arguments 0 and 1 (matmul, linear, convolution), asked for the
    /// contributions flagged in `needs`: each of the two is kept only when the other's
    /// contribution is asked for (that is the only one that reads it).
    pub fn each_for_the_other(needs: &[bool]) -> Saves {
        let need = |i: usize| needs.get(i).copied().unwrap_or(true);
        match (need(0), need(1)) {
            (true, true) => Saves::inputs(&[0, 1]),
            (true, false) => Saves::inputs(&[1]),
            (false, true) => Saves::inputs(&[0]),
            (false, false) => Saves::NOTHING,
        }
    }

    /// Keeps every argument (for variadic ops).
    pub const ALL_INPUTS: Saves = Saves {
        inputs: u64::MAX,
        output: false,
    };

    /// Also keeps the output.
    pub const fn with_output(self) -> Saves {
        Saves {
            inputs: self.inputs,
            output: true,
        }
    }

    /// Whether argument `i` is kept.
    pub fn keeps_input(&self, i: usize) -> bool {
        i < 64 && self.inputs & (1 << i) != 0
    }
}

/// A boolean mask with a shape, for `where` and dropout-like ops (not differentiable).
#[derive(Debug, Clone, PartialEq)]
pub struct Mask {
    pub shape: Shape,
    pub data: Arc<Vec<bool>>,
}

impl Mask {
    /// A mask from a shape and row-major booleans.
    pub fn new(dims: &[usize], data: Vec<bool>) -> Result<Mask> {
        let shape = Shape::for_op("mask", dims)?;
        if data.len() != shape.numel() {
            return Err(Error::DataLength {
                op: "mask",
                len: data.len(),
                numel: shape.numel(),
                shape: Box::new(shape),
            });
        }
        Ok(Mask {
            shape,
            data: Arc::new(data),
        })
    }

    /// The mask `pred(x)` of a tensor's elements.
    pub fn from_tensor<S: Scalar>(t: &Tensor<S>, pred: impl Fn(S) -> bool) -> Mask {
        Mask {
            shape: t.shape().clone(),
            data: Arc::new(t.data().iter().map(|&v| pred(v)).collect()),
        }
    }
}

/// Data a forward pass computes for its VJP beyond the output (statistics, argmax positions).
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Aux<S> {
    #[default]
    None,
    Tensors(Vec<Tensor<S>>),
    Indices(Arc<Vec<usize>>),
}

impl<S: Scalar> Aux<S> {
    /// Bytes held, for memory accounting.
    pub fn nbytes(&self) -> usize {
        match self {
            Aux::None => 0,
            Aux::Tensors(ts) => ts.iter().map(|t| t.nbytes()).sum(),
            Aux::Indices(ix) => ix.len() * std::mem::size_of::<usize>(),
        }
    }
}

/// The result of a forward evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct Forward<S> {
    pub value: Tensor<S>,
    pub aux: Aux<S>,
}

impl<S> Forward<S> {
    /// A forward result with no auxiliary data.
    pub fn new(value: Tensor<S>) -> Self {
        Forward {
            value,
            aux: Aux::None,
        }
    }
}

/// A VJP's result: one optional contribution per argument, inline for up to three arguments so a
/// backward step allocates nothing for the list itself.
pub type Grads<S> = SmallVec<[Option<Tensor<S>>; 3]>;

/// Hands each present contribution of `grads` to `emit` with its argument's index, in order.
pub(crate) fn emit_each<S>(grads: Grads<S>, mut emit: impl FnMut(usize, Tensor<S>)) {
    for (i, g) in grads.into_iter().enumerate() {
        if let Some(g) = g {
            emit(i, g);
        }
    }
}

/// What a node of the saved graph (or a standalone VJP call) keeps for its VJP: only what the op's
/// `saves` asked for, plus shapes. A tape node keeps less: see `tape::NodeSaved`.
#[derive(Debug, Clone)]
pub struct Saved<S> {
    pub inputs: SmallVec<[Option<Tensor<S>>; 3]>,
    pub input_shapes: SmallVec<[Shape; 3]>,
    pub output: Option<Tensor<S>>,
    pub output_shape: Shape,
    pub aux: Aux<S>,
    pub needs: SmallVec<[bool; 4]>,
}

impl<S: Scalar> Saved<S> {
    /// Keeps what `saves` asks for from one forward evaluation.
    pub fn keep(
        saves: Saves,
        inputs: &[&Tensor<S>],
        forward: &Forward<S>,
        needs: impl IntoIterator<Item = bool>,
    ) -> Self {
        let mut saved = Saved::empty();
        saved.fill(
            saves,
            inputs.iter().copied(),
            &forward.value,
            || forward.aux.clone(),
            needs,
        );
        saved
    }

    /// A record that keeps nothing yet, for `fill`.
    fn empty() -> Self {
        Saved {
            inputs: SmallVec::new(),
            input_shapes: SmallVec::new(),
            output: None,
            output_shape: Shape::scalar(),
            aux: Aux::None,
            needs: SmallVec::new(),
        }
    }

    /// Fills an `empty` record. `aux` is called only when some argument needs a gradient.
    fn fill<'t>(
        &mut self,
        saves: Saves,
        inputs: impl Iterator<Item = &'t Tensor<S>>,
        output: &Tensor<S>,
        aux: impl FnOnce() -> Aux<S>,
        needs: impl IntoIterator<Item = bool>,
    ) where
        S: 't,
    {
        // Plain pushes: `SmallVec`'s generic `extend` costs more than the few elements it copies.
        for n in needs {
            self.needs.push(n);
        }
        // A VJP that no argument needs will never run: keep shapes only.
        let any_needed = self.needs.iter().any(|&n| n);
        let saves = if any_needed { saves } else { Saves::NOTHING };
        for (i, t) in inputs.enumerate() {
            self.inputs.push(saves.keeps_input(i).then(|| t.clone()));
            self.input_shapes.push(t.shape().clone());
        }
        self.output_shape = output.shape().clone();
        if saves.output {
            self.output = Some(output.clone());
        }
        if any_needed {
            self.aux = aux();
        }
    }

    /// The context a VJP reads.
    pub fn context(&self) -> VjpContext<'_, S> {
        VjpContext {
            inputs: ArgValues::Kept(&self.inputs),
            input_shapes: ArgShapes::Shapes(&self.input_shapes),
            output: self.output.as_ref(),
            output_shape: &self.output_shape,
            aux: &self.aux,
            needs: &self.needs,
        }
    }

    /// Bytes of tensor data kept (shared buffers counted once per reference).
    pub fn nbytes(&self) -> usize {
        self.inputs
            .iter()
            .flatten()
            .map(|t| t.nbytes())
            .sum::<usize>()
            + self.output.as_ref().map_or(0, |t| t.nbytes())
            + self.aux.nbytes()
    }
}

/// The arguments a VJP may read: the copies a saved record keeps, or the argument values
/// themselves (a tape reads its nodes' values in place, so recording an op copies nothing).
#[derive(Debug)]
pub enum ArgValues<'a, S> {
    /// A record's copies, `None` where the op's `saves` did not ask for the argument.
    Kept(&'a [Option<Tensor<S>>]),
    /// Every argument's value; only those `keep` names may be read.
    Values {
        values: &'a [&'a Tensor<S>],
        keep: Saves,
    },
}

impl<S> Clone for ArgValues<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for ArgValues<'_, S> {}

impl<'a, S> ArgValues<'a, S> {
    /// Argument `i` if it was kept for the VJP.
    #[inline]
    pub fn get(self, i: usize) -> Option<&'a Tensor<S>> {
        match self {
            ArgValues::Kept(kept) => kept.get(i).and_then(|t| t.as_ref()),
            ArgValues::Values { values, keep } => {
                if keep.keeps_input(i) {
                    values.get(i).copied()
                } else {
                    None
                }
            }
        }
    }

    /// The kept arguments, in argument order.
    pub fn iter(self) -> impl Iterator<Item = &'a Tensor<S>> {
        let len = match self {
            ArgValues::Kept(kept) => kept.len(),
            ArgValues::Values { values, .. } => values.len(),
        };
        (0..len).filter_map(move |i| self.get(i))
    }
}

/// Every argument's shape: a record's own list, or read off the argument values.
#[derive(Debug)]
pub enum ArgShapes<'a, S> {
    Shapes(&'a [Shape]),
    Values(&'a [&'a Tensor<S>]),
}

impl<S> Clone for ArgShapes<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for ArgShapes<'_, S> {}

impl<'a, S: Scalar> ArgShapes<'a, S> {
    /// Number of arguments.
    #[inline]
    pub fn len(self) -> usize {
        match self {
            ArgShapes::Shapes(s) => s.len(),
            ArgShapes::Values(v) => v.len(),
        }
    }

    /// True for an op without arguments.
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// The shape of argument `i`.
    #[inline]
    pub fn get(self, i: usize) -> Option<&'a Shape> {
        match self {
            ArgShapes::Shapes(s) => s.get(i),
            ArgShapes::Values(v) => v.get(i).map(|t| t.shape()),
        }
    }

    /// The first argument's shape.
    pub fn first(self) -> Option<&'a Shape> {
        self.get(0)
    }

    /// The shapes in argument order.
    pub fn iter(self) -> impl Iterator<Item = &'a Shape> {
        (0..self.len()).filter_map(move |i| self.get(i))
    }
}

impl<S: Scalar> std::ops::Index<usize> for ArgShapes<'_, S> {
    type Output = Shape;

    #[inline]
    fn index(&self, i: usize) -> &Shape {
        match *self {
            ArgShapes::Shapes(s) => &s[i],
            ArgShapes::Values(v) => v[i].shape(),
        }
    }
}

/// What a VJP may read: the saved arguments, all argument shapes, the saved output, auxiliary data,
/// and which arguments need a gradient.
#[derive(Debug)]
pub struct VjpContext<'a, S> {
    pub inputs: ArgValues<'a, S>,
    pub input_shapes: ArgShapes<'a, S>,
    pub output: Option<&'a Tensor<S>>,
    pub output_shape: &'a Shape,
    pub aux: &'a Aux<S>,
    pub needs: &'a [bool],
}

impl<S> Clone for VjpContext<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for VjpContext<'_, S> {}

impl<'a, S: Scalar> VjpContext<'a, S> {
    /// Saved argument `i`; an error if the op did not declare it in `saves`.
    pub fn input(&self, op: &'static str, i: usize) -> Result<&'a Tensor<S>> {
        self.inputs
            .get(i)
            .ok_or_else(|| Error::invalid(op, format!("argument {i} was not saved for the vjp")))
    }

    /// The saved output; an error if the op did not declare it in `saves`.
    pub fn output(&self, op: &'static str) -> Result<&'a Tensor<S>> {
        self.output
            .ok_or_else(|| Error::invalid(op, "the output was not saved for the vjp"))
    }

    /// Whether argument `i` needs a gradient.
    pub fn needs(&self, i: usize) -> bool {
        self.needs.get(i).copied().unwrap_or(false)
    }
}
