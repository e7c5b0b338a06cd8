//! Linear algebra: matmul (PyTorch semantics, batch broadcasting), linear (x W^T + b), transpose
//! and permute. VJPs use transposed GEMMs and never materialise a transposed copy of an operand.

use super::{Arity, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use tapegrad_tensor::kernels::layout::inverse_permutation;
use tapegrad_tensor::kernels::{
    batched_matmul, broadcast_shape, column_sums, matvec_rows, outer_product, permute, sum_to,
    transpose, vecmat_rows,
};
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// Linear-algebra and axis-reordering ops.
#[derive(Debug, Clone, PartialEq)]
pub enum LinalgOp {
    /// `a @ b` (torch.matmul).
    Matmul,
    /// `x @ w^T (+ b)`: arguments (x, w) or (x, w, b), as torch.nn.functional.linear.
    Linear { bias: bool },
    /// Swaps two axes.
    Transpose { dim0: isize, dim1: isize },
    /// Output axis i is input axis dims[i].
    Permute { dims: Vec<isize> },
}

use LinalgOp as L;

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

/// Normalises one signed dimension against `shape` (a rank-0 shape accepts 0 and -1, as PyTorch).
fn resolve_dim(op: &'static str, what: &str, d: isize, shape: &Shape) -> Result<usize> {
    let r = shape.rank().max(1) as isize;
    let a = if d < 0 { d.saturating_add(r) } else { d };
    if a < 0 || a >= r {
        return Err(Error::invalid(
            op,
            format!("{what} {d} is out of range for input of shape {shape}"),
        ));
    }
    Ok(a as usize)
}

/// The normalised permutation, checked to be one.
fn resolve_permutation(dims: &[isize], shape: &Shape) -> Result<Vec<usize>> {
    let rank = shape.rank();
    let fail = || {
        Error::invalid(
            "permute",
            format!("dims {dims:?} is not a permutation of the axes of shape {shape}"),
        )
    };
    if dims.len() != rank {
        return Err(fail());
    }
    let mut seen = vec![false; rank];
    let mut out = Vec::with_capacity(rank);
    for &d in dims {
        let r = rank as isize;
        let a = if d < 0 { d.saturating_add(r) } else { d };
        if a < 0 || a >= r || seen[a as usize] {
            return Err(fail());
        }
        seen[a as usize] = true;
        out.push(a as usize);
    }
    Ok(out)
}

/// Rows of `x` seen as a matrix `(prod(leading dims), last dim)`.
fn as_rows(shape: &Shape) -> [usize; 2] {
    let r = shape.rank();
    [shape.dims()[..r - 1].iter().product(), shape.dim(r - 1)]
}

/// `a` and `b` as operands of rank >= 2: a 1-D `a` becomes a row, a 1-D `b` a column, as in
/// torch.matmul. Reshapes share buffers.
fn promote_operands<S: Scalar>(a: &Tensor<S>, b: &Tensor<S>) -> Result<(Tensor<S>, Tensor<S>)> {
    let a2 = if a.rank() == 1 {
        a.reshape(&[1, a.dims()[0]])?
    } else {
        a.clone()
    };
    let b2 = if b.rank() == 1 {
        b.reshape(&[b.dims()[0], 1])?
    } else {
        b.clone()
    };
    Ok((a2, b2))
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

/// `a @ b` with torch.matmul's rules. The promoted operands go through one batched GEMM and the
/// result is reshaped to the output shape, which drops the axes added for 1-D operands. (Not
/// `kernels::matmul`: for a 1-D `a` and a matrix `b` it removes the wrong axis and errors.)
fn matmul_forward<S: Scalar>(a: &Tensor<S>, b: &Tensor<S>) -> Result<Tensor<S>> {
    let shape = matmul_shape(a.shape(), b.shape())?;
    let (a2, b2) = promote_operands(a, b)?;
    batched_matmul(&a2, false, &b2, false)?.reshape_to(&shape)
}

/// `g w`: linear's input gradient from the `(rows, out)` cotangent and the `(out, in)` weight. A
/// one-row cotangent runs on our row-vector kernel (`vecmat_rows`: each element summed in row
/// order), as gemm's general driver costs more than a small layer's whole product.
fn linear_input_grad<S: Scalar>(g2: &Tensor<S>, w: &Tensor<S>) -> Result<Tensor<S>> {
    if let ([1, out], [w_out, inn]) = (g2.dims(), w.dims()) {
        if out == w_out {
            let shape = Shape::new([1, *inn])?;
            return Ok(Tensor::from_writer(shape, |d| {
                vecmat_rows(g2.data(), w.data(), d)
            }));
        }
    }
    batched_matmul(g2, false, w, false)
}

/// `x @ w^T (+ b)` on the flattened `(rows, in)` view of `x`; returns `(rows, out)`. With a
/// bias, the output starts as the bias in every row and the GEMM accumulates the product into
/// it, which saves the separate pass adding the bias to the product.
fn linear_rows<S: Scalar>(
    x2: &Tensor<S>,
    w: &Tensor<S>,
    b: Option<&Tensor<S>>,
) -> Result<Tensor<S>> {
    // The callers check shapes first; this keeps the indexing below an error, never a panic.
    if x2.rank() != 2 || w.rank() != 2 {
        return Err(Error::invalid(
            "linear",
            format!(
                "expected a (rows, in) input and an (out, in) weight, found {} and {}",
                x2.shape(),
                w.shape()
            ),
        ));
    }
    let (rows, inn) = (x2.dims()[0], x2.dims()[1]);
    let out = w.dims()[0];
    if rows == 1 && w.dims()[1] == inn && b.is_none_or(|b| b.dims() == [out]) {
        // A batch of one: a matrix-vector product, on our kernel rather than gemm's (see
        // `matvec_rows`); every output element is written.
        return Ok(Tensor::from_writer(Shape::new([1, out])?, |d| {
            matvec_rows(w.data(), x2.data(), b.map(|b| b.data()), d)
        }));
    }
    let Some(b) = b else {
        return batched_matmul(x2, false, w, true);
    };
    if w.dims()[1] != inn || b.dims() != [out] {
        return Err(Error::invalid(
            "linear",
            format!(
                "input shape {} and weight shape {} with bias shape {} are incompatible",
                x2.shape(),
                w.shape(),
                b.shape()
            ),
        ));
    }
    if packs_less_transposed(rows, out) {
        return linear_rows_transposed(x2, w, b);
    }
    // The output starts as the bias in every row (which overwrites a recycled buffer whole)
    // and the GEMM accumulates the product into it. W^T is W read with its strides swapped
    // (row stride 1, column stride `in`), never copied.
    Ok(Tensor::from_writer(Shape::new([rows, out])?, |d| {
        if out == 0 {
            return;
        }
        for row in d.chunks_exact_mut(out) {
            row.copy_from_slice(b.data());
        }
        S::gemm(
            rows,
            out,
            inn,
            d,
            out,
            x2.data(),
            inn,
            1,
            w.data(),
            1,
            inn,
            true,
            S::ONE,
            tapegrad_tensor::kernels::num_threads(),
        );
    }))
}

/// Whether `x W^T` costs less packing computed as `(W x^T)^T`. gemm runs a row-major product
/// as its column-major transpose and packs the operand that spans the output's rows
/// (contiguous dimension) unless that operand is contiguous along them: for `x W^T` that is W,
/// read across its rows (all `out * in` elements, every call), for `W x^T` it is x (`rows * in`).
/// Fewer rows than outputs make x the smaller one; a single row stays on gemm's
/// matrix-vector path, which packs nothing.
fn packs_less_transposed(rows: usize, out: usize) -> bool {
    rows > 1 && rows < out
}

/// `x W^T + b` as the transpose of `W x^T + b^T`: the GEMM writes the `(out, rows)` product into
/// a scratch buffer whose rows start as the bias elements, and one blocked transpose gives the
/// `(rows, out)` result. Every element is the same dot product of a row of x and a row of W
/// added to its bias, so the values are the ones `linear` defines (the order of the additions
/// inside the dot product is gemm's, as in the other orientation).
fn linear_rows_transposed<S: Scalar>(
    x2: &Tensor<S>,
    w: &Tensor<S>,
    b: &Tensor<S>,
) -> Result<Tensor<S>> {
    let (rows, inn) = (x2.dims()[0], x2.dims()[1]);
    let out = w.dims()[0];
    let product = Tensor::from_writer(Shape::new([out, rows])?, |d| {
        if rows == 0 {
            return;
        }
        for (row, &bias) in d.chunks_exact_mut(rows).zip(b.data()) {
            row.fill(bias);
        }
        // W row-major is the left operand as stored; x^T is x read with its strides swapped.
        S::gemm(
            out,
            rows,
            inn,
            d,
            rows,
            w.data(),
            inn,
            1,
            x2.data(),
            1,
            inn,
            true,
            S::ONE,
            tapegrad_tensor::kernels::num_threads(),
        );
    });
    transpose(&product, 0, 1)
}

/// The weight gradient `g^T x` of linear, `(out, in)` from `g` `(rows, out)` and `x` `(rows,
/// in)`. One row (a batch of one) is an outer product, a vectorised loop instead of a GEMM
/// with k = 1 (packing, edge kernels); each element is the single rounded product the GEMM
/// stores, sign of zero included (a test checks the bits). Public so that a gradient handed over
/// as these two factors (`tapegrad_nn::Grad::Outer`) is multiplied out with these very bits.
pub fn linear_weight_grad<S: Scalar>(g2: &Tensor<S>, x2: &Tensor<S>) -> Result<Tensor<S>> {
    if g2.rank() != 2 || x2.rank() != 2 || g2.dims()[0] != x2.dims()[0] {
        return Err(Error::invalid(
            "linear",
            format!(
                "a weight gradient needs (rows, out) and (rows, in) factors, found {} and {}",
                g2.shape(),
                x2.shape()
            ),
        ));
    }
    let (rows, out, inn) = (g2.dims()[0], g2.dims()[1], x2.dims()[1]);
    if rows != 1 {
        return batched_matmul(g2, true, x2, false);
    }
    // Every (row, column) product is written, so a recycled buffer needs no zeroing.
    Ok(Tensor::from_writer(Shape::new([out, inn])?, |d| {
        outer_product(g2.data(), x2.data(), d)
    }))
}

/// The bias gradient of linear: `g` `(rows, out)` summed over its rows, row by row in order
/// (as `sum_axes` over axis 0 adds them), without the general reduction's strided walk; long
/// ones split by columns over the GEMM threads (`kernels::column_sums`), same bits.
fn linear_bias_grad<S: Scalar>(g2: &Tensor<S>) -> Result<Tensor<S>> {
    column_sums(g2)
}

impl OpRules for LinalgOp {
    fn name(&self) -> &'static str {
        match self {
            L::Matmul => "matmul",
            L::Linear { .. } => "linear",
            L::Transpose { .. } => "transpose",
            L::Permute { .. } => "permute",
        }
    }

    fn arity(&self) -> Arity {
        match self {
            L::Matmul => Arity::Exact(2),
            L::Linear { bias } => Arity::Exact(if *bias { 3 } else { 2 }),
            L::Transpose { .. } | L::Permute { .. } => Arity::Exact(1),
        }
    }

    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        match self {
            L::Matmul => matmul_shape(inputs[0], inputs[1]),
            L::Linear { bias } => linear_shape(inputs[0], inputs[1], bias.then(|| inputs[2])),
            L::Transpose { dim0, dim1 } => {
                let s = inputs[0];
                let a = resolve_dim("transpose", "dim0", *dim0, s)?;
                let b = resolve_dim("transpose", "dim1", *dim1, s)?;
                let mut dims = s.dims().to_vec();
                if s.rank() > 0 {
                    dims.swap(a, b);
                }
                Shape::new(dims)
            }
            L::Permute { dims } => {
                let s = inputs[0];
                let p = resolve_permutation(dims, s)?;
                Shape::new(p.iter().map(|&d| s.dim(d)).collect::<Vec<_>>())
            }
        }
    }

    fn saves(&self) -> Saves {
        match self {
            L::Matmul | L::Linear { .. } => Saves::inputs(&[0, 1]),
            L::Transpose { .. } | L::Permute { .. } => Saves::NOTHING,
        }
    }

    /// Matmul and linear read each operand only for the other's contribution (the bias's needs
    /// neither), so a first layer whose input needs no gradient keeps its input but not its
    /// weight, as PyTorch's autograd does.
    fn saves_for(&self, needs: &[bool]) -> Saves {
        match self {
            L::Matmul | L::Linear { .. } => Saves::each_for_the_other(needs),
            _ => self.saves(),
        }
    }

    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        let out = match self {
            L::Matmul => matmul_forward(x[0], x[1])?,
            L::Linear { bias } => {
                let shape = linear_shape(x[0].shape(), x[1].shape(), bias.then(|| x[2].shape()))?;
                let x2 = x[0].reshape(&as_rows(x[0].shape()))?;
                linear_rows(&x2, x[1], bias.then(|| x[2]))?.reshape_to(&shape)?
            }
            L::Transpose { .. } | L::Permute { .. } => self.reorder(x[0], false)?,
        };
        Ok(Forward::new(out))
    }

    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let name = self.name();
        Ok(match self {
            L::Matmul => {
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
                smallvec![da, db]
            }
            L::Linear { bias } => {
                let x_shape = &ctx.input_shapes[0];
                let g2 = cot.reshape(&as_rows(cot.shape()))?;
                let dx = if ctx.needs(0) {
                    let w = ctx.input(name, 1)?;
                    Some(linear_input_grad(&g2, w)?.reshape_to(x_shape)?)
                } else {
                    None
                };
                let dw = if ctx.needs(1) {
                    let x = ctx.input(name, 0)?;
                    let x2 = x.reshape(&as_rows(x.shape()))?;
                    Some(linear_weight_grad(&g2, &x2)?)
                } else {
                    None
                };
                let mut grads = smallvec![dx, dw];
                if *bias {
                    grads.push(if ctx.needs(2) {
                        Some(linear_bias_grad(&g2)?)
                    } else {
                        None
                    });
                }
                grads
            }
            L::Transpose { .. } | L::Permute { .. } => {
                smallvec![if ctx.needs(0) {
                    Some(self.reorder(cot, true)?)
                } else {
                    None
                }]
            }
        })
    }

    fn jvp<S: Scalar>(
        &self,
        x: &[&Tensor<S>],
        out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        let name = self.name();
        Ok(match self {
            L::Matmul => {
                let l = matmul_forward(t[0], x[1])?;
                let r = matmul_forward(x[0], t[1])?;
                l.zip_map(&r, name, |l, r| l + r)?
            }
            L::Linear { bias } => {
                let rows = as_rows(x[0].shape());
                let (x2, t2) = (x[0].reshape(&rows)?, t[0].reshape(&rows)?);
                // d(x W^T + b) = dx W^T + x dW^T + db
                let l = linear_rows(&t2, x[1], bias.then(|| t[2]))?;
                let r = batched_matmul(&x2, false, t[1], true)?;
                l.zip_map(&r, name, |l, r| l + r)?
                    .reshape_to(out.value.shape())?
            }
            L::Transpose { .. } | L::Permute { .. } => self.reorder(t[0], false)?,
        })
    }
}

impl LinalgOp {
    /// Applies the axis reordering of transpose/permute, or its inverse.
    fn reorder<S: Scalar>(&self, t: &Tensor<S>, inverse: bool) -> Result<Tensor<S>> {
        match self {
            L::Transpose { dim0, dim1 } => {
                let a = resolve_dim("transpose", "dim0", *dim0, t.shape())?;
                let b = resolve_dim("transpose", "dim1", *dim1, t.shape())?;
                if t.rank() == 0 || a == b {
                    Ok(t.clone())
                } else {
                    transpose(t, a, b)
                }
            }
            L::Permute { dims } => {
                let p = resolve_permutation(dims, t.shape())?;
                if inverse {
                    permute(t, &inverse_permutation(&p))
                } else {
                    permute(t, &p)
                }
            }
            _ => Err(Error::invalid(self.name(), "is not an axis reordering")),
        }
    }
}

impl std::fmt::Display for LinalgOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            L::Matmul => f.write_str("matmul"),
            L::Linear { bias } => write!(f, "linear(bias={bias})"),
            L::Transpose { dim0, dim1 } => write!(f, "transpose(dim0={dim0}, dim1={dim1})"),
            L::Permute { dims } => write!(f, "permute(dims={dims:?})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tapegrad_tensor::kernels::sum_axes;

    /// Values with both signs, exact zeros of both signs and magnitudes whose products round.
    fn awkward(n: usize, salt: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let k = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(salt) >> 24;
                match k % 5 {
                    0 => 0.0,
                    1 => -0.0,
                    _ => (k as f32 - 128.0) / 7.3,
                }
            })
            .collect()
    }

    fn bits(t: &Tensor<f32>) -> Vec<u32> {
        t.data().iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn batch_of_one_weight_grad_is_the_gemm_bit_for_bit() {
        let g = Tensor::new(&[1, 7], awkward(7, 1)).unwrap();
        let x = Tensor::new(&[1, 13], awkward(13, 2)).unwrap();
        let gemm = batched_matmul(&g, true, &x, false).unwrap();
        let outer = linear_weight_grad(&g, &x).unwrap();
        assert_eq!(outer.dims(), &[7, 13]);
        assert_eq!(bits(&outer), bits(&gemm));
    }

    #[test]
    fn bias_grad_is_the_row_sum_bit_for_bit() {
        let g = Tensor::new(&[9, 5], awkward(45, 3)).unwrap();
        let reference = sum_axes(&g, &[0], false).unwrap();
        assert_eq!(bits(&linear_bias_grad(&g).unwrap()), bits(&reference));
    }

    #[test]
    fn both_linear_orientations_give_the_same_values() {
        // (rows, in, out) on both sides of the orientation rule, with ragged register tiles;
        // small integers make every sum exact, so any order of the additions gives these values.
        for (rows, inn, out) in [(3, 9, 20), (17, 40, 33), (32, 70, 64), (2, 5, 3)] {
            let ints = |n: usize, salt: usize| -> Vec<f32> {
                (0..n).map(|i| ((i * 7 + salt) % 11) as f32 - 5.0).collect()
            };
            let x = Tensor::new(&[rows, inn], ints(rows * inn, 1)).unwrap();
            let w = Tensor::new(&[out, inn], ints(out * inn, 2)).unwrap();
            let b = Tensor::new(&[out], ints(out, 3)).unwrap();
            let plain = batched_matmul(&x, false, &w, true).unwrap();
            let expected: Vec<f32> = plain
                .data()
                .chunks(out)
                .flat_map(|r| r.iter().zip(b.data()).map(|(p, b)| p + b))
                .collect();
            let y = linear_rows(&x, &w, Some(&b)).unwrap();
            assert_eq!(y.dims(), &[rows, out]);
            assert_eq!(y.data(), &expected[..], "({rows}, {inn}, {out})");
            let t = linear_rows_transposed(&x, &w, &b).unwrap();
            assert_eq!(t.data(), &expected[..], "({rows}, {inn}, {out}) transposed");
        }
    }

    #[test]
    fn orientation_rule_packs_the_smaller_operand() {
        assert!(packs_less_transposed(32, 256));
        assert!(!packs_less_transposed(256, 256));
        assert!(!packs_less_transposed(32, 10));
        assert!(!packs_less_transposed(1, 256));
    }

    #[test]
    fn fused_bias_equals_product_plus_bias_on_small_integers() {
        // Small integers make every sum exact, so any order of the additions gives these values.
        let x = Tensor::new(&[3, 4], (0..12).map(|v| v as f32 - 5.0).collect()).unwrap();
        let w = Tensor::new(&[2, 4], vec![1.0, -2.0, 0.0, 3.0, 2.0, 1.0, -1.0, 0.5]).unwrap();
        let b = Tensor::new(&[2], vec![10.0, -20.0]).unwrap();
        let y = linear_rows(&x, &w, Some(&b)).unwrap();
        let plain = batched_matmul(&x, false, &w, true).unwrap();
        let expected: Vec<f32> = plain
            .data()
            .chunks(2)
            .flat_map(|r| [r[0] + 10.0, r[1] - 20.0])
            .collect();
        assert_eq!(y.data(), &expected[..]);
        let empty = Tensor::new(&[3, 0], vec![]).unwrap();
        let w0 = Tensor::new(&[2, 0], vec![]).unwrap();
        let only_bias = linear_rows(&empty, &w0, Some(&b)).unwrap();
        assert_eq!(only_bias.data(), &[10.0, -20.0, 10.0, -20.0, 10.0, -20.0]);
    }

    #[test]
    fn linear_rows_rejects_operands_that_are_not_matrices() {
        let x = Tensor::new(&[1, 4], vec![1.0f32; 4]).unwrap();
        let w = Tensor::new(&[2, 4], vec![1.0f32; 8]).unwrap();
        let v = Tensor::new(&[4], vec![1.0f32; 4]).unwrap();
        for (x, w) in [(&v, &w), (&x, &v)] {
            let err = linear_rows(x, w, None).unwrap_err().to_string();
            assert!(err.contains("linear") && err.contains("[4]"), "{err}");
        }
    }

    #[test]
    fn weight_grad_rejects_factors_that_do_not_pair_up() {
        let g = Tensor::new(&[3, 2], vec![1.0f32; 6]).unwrap();
        let x = Tensor::new(&[2, 4], vec![1.0f32; 8]).unwrap();
        let v = Tensor::new(&[6], vec![1.0f32; 6]).unwrap();
        // Three rows against two, and a factor that is not a matrix.
        for (g, x, says) in [(&g, &x, "[2, 4]"), (&v, &x, "[6]")] {
            let err = linear_weight_grad(g, x).unwrap_err().to_string();
            assert!(err.contains("linear") && err.contains(says), "{err}");
        }
    }
}
