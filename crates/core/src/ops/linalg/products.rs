//! The products: matmul (torch.matmul's rules: rank-1 operands promoted, batch axes broadcast)
//! and linear (`x @ w^T (+ b)`). Each VJP reads an operand only for the other's contribution
//! (`saves_for`), as PyTorch's autograd does.

use crate::ops::{Arity, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::kernels::linear::{linear_grads, linear_rows};
use tapegrad_tensor::kernels::{batched_matmul, broadcast_shape, matmul, sum_to};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// `a @ b` (torch.matmul).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Matmul;

impl OpRules for Matmul {
    fn arity(&self) -> Arity {
        Arity::Exact(2)
    }

    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        matmul_shape(inputs[0], inputs[1])
    }

    fn saves(&self) -> Saves {
        Saves::inputs(&[0, 1])
    }

    /// Each operand is read only for the other's contribution, so a first layer whose input
    /// needs no gradient keeps its input but not its weight.
    fn saves_for(&self, needs: &[bool]) -> Saves {
        Saves::each_for_the_other(needs)
    }

    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        // The op's own shape rule first, so a mismatch is reported in its words.
        matmul_shape(x[0].shape(), x[1].shape())?;
        Ok(Forward::new(matmul(x[0], x[1])?))
    }

    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let name = self.name();
        // Each operand is read only for the other's contribution (see `saves_for`).
        let (a_shape, b_shape) = (&ctx.input_shapes[0], &ctx.input_shapes[1]);
        // An empty output gives zero gradients. The products below would still be sized
        // by the broadcast batch: [1, 3, 1] @ [2^40, 1, 0] made a [2^40, 3, 1] product
        // (an allocation abort) to sum back to a's [1, 3, 1] zeros.
        if cot.numel() == 0 {
            let zeros = |i: usize, s: &Shape| ctx.needs(i).then(|| Tensor::zeros(s));
            return Ok(smallvec![zeros(0, a_shape), zeros(1, b_shape)]);
        }
        let a2_shape = promoted_shape(a_shape, true)?;
        let b2_shape = promoted_shape(b_shape, false)?;
        let g2 = promote_cotangent(a_shape, b_shape, &a2_shape, &b2_shape, cot)?;
        let da = if ctx.needs(0) {
            // dA = G @ B^T, with broadcast batch axes summed back.
            let b2 = ctx.input(name, 1)?.reshape_to(&b2_shape)?;
            let full = batched_matmul(&g2, false, &b2, true)?;
            Some(sum_to(&full, &a2_shape)?.reshape_to(a_shape)?)
        } else {
            None
        };
        let db = if ctx.needs(1) {
            let a2 = ctx.input(name, 0)?.reshape_to(&a2_shape)?;
            let full = if b2_shape.rank() == 2 && a2.rank() > 2 {
                // A shared matrix: fold a's batch into rows so one GEMM does the sum.
                let a_rows = a2.reshape(&as_rows(a2.shape()))?;
                let g_rows = g2.reshape(&as_rows(g2.shape()))?;
                batched_matmul(&a_rows, true, &g_rows, false)?
            } else {
                sum_to(&batched_matmul(&a2, true, &g2, false)?, &b2_shape)?
            };
            Some(full.reshape_to(b_shape)?)
        } else {
            None
        };
        Ok(smallvec![da, db])
    }

    fn jvp<S: Scalar>(
        &self,
        x: &[&Tensor<S>],
        _out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        let l = matmul(t[0], x[1])?;
        let r = matmul(x[0], t[1])?;
        l.zip_map(&r, self.name(), |l, r| l + r)
    }
}

impl std::fmt::Display for Matmul {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("matmul")
    }
}

/// `x @ w^T (+ b)`: arguments (x, w) or (x, w, b), as torch.nn.functional.linear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Linear {
    pub bias: bool,
}

impl OpRules for Linear {
    fn arity(&self) -> Arity {
        Arity::Exact(if self.bias { 3 } else { 2 })
    }

    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        linear_shape(inputs[0], inputs[1], self.bias.then(|| inputs[2]))
    }

    fn saves(&self) -> Saves {
        Saves::inputs(&[0, 1])
    }

    /// Each operand is read only for the other's contribution (the bias's needs neither), so a
    /// first layer whose input needs no gradient keeps its input but not its weight.
    fn saves_for(&self, needs: &[bool]) -> Saves {
        Saves::each_for_the_other(needs)
    }

    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        let bias = self.bias;
        let shape = linear_shape(x[0].shape(), x[1].shape(), bias.then(|| x[2].shape()))?;
        let x2 = x[0].reshape(&as_rows(x[0].shape()))?;
        let out = linear_rows(&x2, x[1], bias.then(|| x[2]))?.reshape_to(&shape)?;
        Ok(Forward::new(out))
    }

    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let (name, bias) = (self.name(), self.bias);
        let x_shape = &ctx.input_shapes[0];
        let g2 = cot.reshape(&as_rows(cot.shape()))?;
        // Each operand is read only for the other's gradient (see `saves_for`).
        let w = if ctx.needs(0) {
            Some(ctx.input(name, 1)?)
        } else {
            None
        };
        let x2 = if ctx.needs(1) {
            let x = ctx.input(name, 0)?;
            Some(x.reshape(&as_rows(x.shape()))?)
        } else {
            None
        };
        let (dx, dw, db) = linear_grads(&g2, w, x2.as_ref(), bias && ctx.needs(2))?;
        let mut grads = smallvec![dx.map(|d| d.reshape_to(x_shape)).transpose()?, dw];
        if bias {
            grads.push(db);
        }
        Ok(grads)
    }

    fn jvp<S: Scalar>(
        &self,
        x: &[&Tensor<S>],
        out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        let rows = as_rows(x[0].shape());
        let (x2, t2) = (x[0].reshape(&rows)?, t[0].reshape(&rows)?);
        // d(x W^T + b) = dx W^T + x dW^T + db
        let l = linear_rows(&t2, x[1], self.bias.then(|| t[2]))?;
        let r = batched_matmul(&x2, false, t[1], true)?;
        l.zip_map(&r, self.name(), |l, r| l + r)?
            .reshape_to(out.value.shape())
    }
}

impl std::fmt::Display for Linear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "linear(bias={})", self.bias)
    }
}

/// The output shape of `a @ b` under torch.matmul's rules.
fn matmul_shape(a: &Shape, b: &Shape) -> Result<Shape> {
    let fail = |why: String| {
        Error::invalid(
            "matmul",
            format!("cannot multiply shapes {a} and {b}: {why}"),
        )
    };
    if a.rank() == 0 || b.rank() == 0 {
        return Err(fail("both operands need at least one dimension".into()));
    }
    let (ra, rb) = (a.rank(), b.rank());
    let k_a = a.dims()[ra - 1];
    let k_b = b.dims()[rb.saturating_sub(2)];
    if k_a != k_b {
        return Err(fail(format!(
            "contraction dimensions {k_a} and {k_b} differ"
        )));
    }
    let a_batch = Shape::new(&a.dims()[..ra.saturating_sub(2)])?;
    let b_batch = Shape::new(&b.dims()[..rb.saturating_sub(2)])?;
    let batch = broadcast_shape("matmul", &a_batch, &b_batch).map_err(|_| {
        fail(format!(
            "batch dimensions {a_batch} and {b_batch} do not broadcast"
        ))
    })?;
    let mut dims = batch.dims().to_vec();
    if ra >= 2 {
        dims.push(a.dims()[ra - 2]);
    }
    if rb >= 2 {
        dims.push(b.dims()[rb - 1]);
    }
    Shape::new(dims).map_err(|_| fail("the result has too many elements".into()))
}

/// The output shape of `linear(x, w[, b])`.
fn linear_shape(x: &Shape, w: &Shape, b: Option<&Shape>) -> Result<Shape> {
    let fail = |why: String| {
        Error::invalid(
            "linear",
            format!("input shape {x} and weight shape {w} are incompatible: {why}"),
        )
    };
    if x.rank() == 0 {
        return Err(fail("the input needs at least one dimension".into()));
    }
    if w.rank() != 2 {
        return Err(fail(
            "the weight must be (out_features, in_features)".into(),
        ));
    }
    let (out, inn) = (w.dim(0), w.dim(1));
    if x.dim(x.rank() - 1) != inn {
        return Err(fail(format!(
            "the input's last dimension {} differs from in_features {inn}",
            x.dim(x.rank() - 1)
        )));
    }
    if let Some(b) = b {
        if b.dims() != [out] {
            return Err(Error::invalid(
                "linear",
                format!(
                    "bias shape {b} does not match weight shape {w} (input shape {x}, expected bias [{out}])"
                ),
            ));
        }
    }
    let mut dims = x.dims().to_vec();
    dims[x.rank() - 1] = out;
    // A zero-size input with huge leading dims and more outputs than inputs can make a shape
    // that does not exist.
    Shape::new(dims).map_err(|_| fail("the result has too many elements".into()))
}

/// Rows of `x` seen as a matrix `(prod(leading dims), last dim)`.
fn as_rows(shape: &Shape) -> [usize; 2] {
    let r = shape.rank();
    [shape.dims()[..r - 1].iter().product(), shape.dim(r - 1)]
}

/// The shape torch.matmul gives an operand of rank 1: a row for the left one, a column for the
/// right one; other shapes as they are.
fn promoted_shape(shape: &Shape, left: bool) -> Result<Shape> {
    match (shape.rank(), left) {
        (1, true) => Shape::new([1, shape.dim(0)]),
        (1, false) => Shape::new([shape.dim(0), 1]),
        _ => Ok(shape.clone()),
    }
}

/// The output-shaped `g` with the axes promotion added restored, for operands of shapes `a` and
/// `b` promoted to `a2` and `b2`. Needs shapes only, so a VJP asked for one operand's
/// contribution reads only the other operand's value.
fn promote_cotangent<S: Scalar>(
    a: &Shape,
    b: &Shape,
    a2: &Shape,
    b2: &Shape,
    g: &Tensor<S>,
) -> Result<Tensor<S>> {
    let batch_rank = g.rank() - usize::from(a.rank() >= 2) - usize::from(b.rank() >= 2);
    let mut dims = g.dims()[..batch_rank].to_vec();
    dims.push(a2.dim(a2.rank() - 2));
    dims.push(b2.dim(b2.rank() - 1));
    g.reshape(&dims)
}
