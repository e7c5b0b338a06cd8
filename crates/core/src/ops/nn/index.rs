//! Indexing ops whose indices are attributes (`IndexTensor`: a shape plus `Arc<Vec<usize>>`, not
//! differentiable): `embedding` (gradients of repeated indices accumulate; `padding_idx`), `index_select`,
//! `gather`, `scatter_add` and `select`. An out-of-range index is `Error::Index` naming it and the bound.

use super::{index_i64, when};
use crate::ops::{linear_shell, Arity, Forward, Grads, OpRules, Saves, VjpContext};
use smallvec::smallvec;
use std::sync::Arc;
use tapegrad_tensor::kernels::softmax::split_at_axis;
use tapegrad_tensor::{normalize_axis, Error, Result, Scalar, Shape, Tensor};

/// A tensor of indices with a shape: an op attribute, never differentiated.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexTensor {
    pub shape: Shape,
    pub data: Arc<Vec<usize>>,
}

impl IndexTensor {
    /// Indices of shape `dims`, row-major; errors when the length does not match.
    pub fn new(dims: &[usize], data: Vec<usize>) -> Result<Self> {
        let shape = Shape::for_op("indices", dims)?;
        if data.len() != shape.numel() {
            return Err(Error::DataLength {
                op: "index",
                len: data.len(),
                numel: shape.numel(),
                shape: Box::new(shape),
            });
        }
        Ok(IndexTensor {
            shape,
            data: Arc::new(data),
        })
    }

    /// A 1-D index vector.
    pub fn vector(data: Vec<usize>) -> Self {
        IndexTensor {
            // A shape rejects only lengths beyond isize::MAX / 16, which no Vec<usize> can reach.
            shape: Shape::new([data.len()]).unwrap_or_default(),
            data: Arc::new(data),
        }
    }

    /// An error naming the first index `>= bound`.
    fn check_bound(&self, op: &'static str, bound: usize) -> Result<()> {
        match self.data.iter().find(|&&i| i >= bound) {
            Some(&i) => Err(Error::Index {
                op,
                what: "index",
                index: index_i64(i),
                bound,
            }),
            None => Ok(()),
        }
    }

    /// An error unless the shape's element count matches the data (fields are public).
    fn check_len(&self, op: &'static str) -> Result<()> {
        if self.data.len() != self.shape.numel() {
            return Err(Error::DataLength {
                op,
                len: self.data.len(),
                numel: self.shape.numel(),
                shape: Box::new(self.shape.clone()),
            });
        }
        Ok(())
    }
}

impl std::fmt::Display for IndexTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const SHOWN: usize = 8;
        write!(f, "{}[", self.shape)?;
        for (i, v) in self.data.iter().take(SHOWN).enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{v}")?;
        }
        if self.data.len() > SHOWN {
            write!(f, ", ...")?;
        }
        write!(f, "]")
    }
}

/// `F.embedding(indices, weight, padding_idx)`: rows of a (num_embeddings, embedding_dim) weight
/// picked by `indices` (PyTorch calls them `input`); the output has shape
/// `indices.shape + [embedding_dim]`.
///
/// `padding_idx` (negative counts from the end, as PyTorch; it must lie in
/// `-num_embeddings..num_embeddings`): the forward pass is unchanged, but that row of the weight
/// gets no gradient, as in PyTorch. The op then treats the row as a constant, so its JVP gives
/// that row's tangent no effect either (keeping JVP and VJP adjoint); finite differences in that
/// row do not match, by design.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedding {
    pub indices: IndexTensor,
    pub padding_idx: Option<isize>,
}

impl Embedding {
    /// `F.embedding` without `padding_idx`.
    pub fn new(indices: IndexTensor) -> Self {
        Embedding {
            indices,
            padding_idx: None,
        }
    }
}

/// `torch.index_select(input, dim, index)` with a 0-D or 1-D `index`.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexSelect {
    pub dim: isize,
    pub index: IndexTensor,
}

/// `torch.gather(input, dim, index)`: `out[p] = input[p with p[dim] = index[p]]`; `index` has the
/// input's rank and no larger extent off `dim`; the output has the index's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Gather {
    pub dim: isize,
    pub index: IndexTensor,
}

/// `torch.scatter_add(input, dim, index, src)`, arguments `(input, src)`:
/// `out = input; out[p with p[dim] = index[p]] += src[p]` for every position `p` of `index`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScatterAdd {
    pub dim: isize,
    pub index: IndexTensor,
}

/// `torch.select(input, dim, index)`: the slice at `index` (negative counts from the end), with
/// axis `dim` removed.
#[derive(Debug, Clone, PartialEq)]
pub struct Select {
    pub dim: isize,
    pub index: isize,
}

/// `out[(o, j, i)] = x[(o, index[j], i)]` over (outer, len, inner) blocks: index_select's kernel.
fn take_along<S: Scalar>(
    x: &[S],
    outer: usize,
    len: usize,
    inner: usize,
    index: &[usize],
) -> Vec<S> {
    // An empty output has nothing to copy, but its outer blocks may number 2^40 (a zero after
    // the axis): walking them would hang.
    if index.is_empty() || inner == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(outer * index.len() * inner);
    for o in 0..outer {
        for &j in index {
            let start = (o * len + j) * inner;
            out.extend_from_slice(&x[start..start + inner]);
        }
    }
    out
}

/// The adjoint of `take_along`: adds each output block back to its source row, in order, so
/// repeated indices accumulate.
fn put_along<S: Scalar>(
    g: &[S],
    outer: usize,
    len: usize,
    inner: usize,
    index: &[usize],
) -> Vec<S> {
    let mut dx = vec![S::ZERO; outer * len * inner];
    // Nothing to add (as in `take_along`, the outer blocks of an empty tensor may be many).
    if index.is_empty() || inner == 0 || dx.is_empty() {
        return dx;
    }
    let k = index.len();
    for o in 0..outer {
        for (jj, &j) in index.iter().enumerate() {
            let src = &g[(o * k + jj) * inner..][..inner];
            let dst = &mut dx[(o * len + j) * inner..][..inner];
            for (d, &v) in dst.iter_mut().zip(src) {
                *d += v;
            }
        }
    }
    dx
}

impl Embedding {
    fn check(&self, w: &Shape) -> Result<(usize, usize)> {
        let op = "embedding";
        self.indices.check_len(op)?;
        if w.rank() != 2 {
            return Err(Error::invalid(
                op,
                format!(
                    "weight must be 2-D (num_embeddings, embedding_dim), found {w} (indices {})",
                    self.indices.shape
                ),
            ));
        }
        self.indices.check_bound(op, w.dims()[0])?;
        self.padding_row(w.dims()[0])?;
        Ok((w.dims()[0], w.dims()[1]))
    }

    /// This op's padding row, if it has one (see `padding_row_of`).
    fn padding_row(&self, rows: usize) -> Result<Option<usize>> {
        self.padding_idx
            .map(|p| Self::padding_row_of(p, rows))
            .transpose()
    }

    /// `padding_idx` normalised as PyTorch (`+ num_embeddings` when negative) for a table of
    /// `rows` rows, or an error naming it and the bound. The `Embedding` layer uses it too.
    pub fn padding_row_of(padding_idx: isize, rows: usize) -> Result<usize> {
        let n = isize::try_from(rows).unwrap_or(isize::MAX);
        if padding_idx >= n || padding_idx < -n {
            return Err(Error::Index {
                op: "embedding",
                what: "padding_idx",
                index: padding_idx as i64,
                bound: rows,
            });
        }
        Ok(if padding_idx < 0 {
            (padding_idx + n) as usize
        } else {
            padding_idx as usize
        })
    }

    /// Zeroes the padding row of a weight-shaped gradient or tangent.
    fn clear_padding_row<S: Scalar>(&self, data: &mut [S], rows: usize, dim: usize) -> Result<()> {
        if let Some(r) = self.padding_row(rows)? {
            data[r * dim..(r + 1) * dim].fill(S::ZERO);
        }
        Ok(())
    }
}

impl OpRules for Embedding {
    fn arity(&self) -> Arity {
        Arity::Exact(1)
    }
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        let (_, d) = self.check(inputs[0])?;
        let mut dims = self.indices.shape.dims().to_vec();
        dims.push(d);
        // Zero-size indices beside a huge table width can make a shape that does not exist.
        Shape::for_op(self.name(), dims)
    }
    fn saves(&self) -> Saves {
        Saves::NOTHING
    }
    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        let shape = self.output_shape(&[x[0].shape()])?;
        let (v, d) = self.check(x[0].shape())?;
        let data = take_along(x[0].data(), 1, v, d, &self.indices.data);
        Ok(Forward::new(Tensor::from_shape(shape, data)?))
    }
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let w = &ctx.input_shapes[0];
        let (v, d) = self.check(w)?;
        let mut data = put_along(cot.data(), 1, v, d, &self.indices.data);
        self.clear_padding_row(&mut data, v, d)?;
        Ok(smallvec![Some(Tensor::from_shape(w.clone(), data)?)])
    }
    fn jvp<S: Scalar>(
        &self,
        _x: &[&Tensor<S>],
        _out: &Forward<S>,
        t: &[&Tensor<S>],
    ) -> Result<Tensor<S>> {
        if self.padding_idx.is_none() {
            return Ok(self.forward(t)?.value);
        }
        let (v, d) = self.check(t[0].shape())?;
        let mut tangent = t[0].data().to_vec();
        self.clear_padding_row(&mut tangent, v, d)?;
        Ok(self
            .forward(&[&Tensor::from_shape(t[0].shape().clone(), tangent)?])?
            .value)
    }
}

impl IndexSelect {
    /// (axis, outer, len, inner) of the input and the output shape.
    fn geometry(&self, x: &Shape) -> Result<(usize, usize, usize, Shape)> {
        let op = "index_select";
        self.index.check_len(op)?;
        if self.index.shape.rank() > 1 {
            return Err(Error::invalid(
                op,
                format!(
                    "index must be 0-D or 1-D, found shape {} (input {x})",
                    self.index.shape
                ),
            ));
        }
        let axis = normalize_axis(op, self.dim, x.rank())?;
        let (outer, len, inner) = split_at_axis(x.dims(), axis);
        self.index.check_bound(op, len)?;
        let mut dims = x.dims().to_vec();
        dims[axis] = self.index.data.len();
        // More indices than the axis had can make a zero-size shape whose other dims are huge
        // too large to exist.
        Ok((outer, len, inner, Shape::for_op(op, dims)?))
    }
}

impl OpRules for IndexSelect {
    fn arity(&self) -> Arity {
        Arity::Exact(1)
    }
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        Ok(self.geometry(inputs[0])?.3)
    }
    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        let (outer, len, inner, shape) = self.geometry(x[0].shape())?;
        let data = take_along(x[0].data(), outer, len, inner, &self.index.data);
        Ok(Forward::new(Tensor::from_shape(shape, data)?))
    }
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let x = &ctx.input_shapes[0];
        let (outer, len, inner, _) = self.geometry(x)?;
        let data = put_along(cot.data(), outer, len, inner, &self.index.data);
        Ok(smallvec![Some(Tensor::from_shape(x.clone(), data)?)])
    }
    linear_shell!();
}

/// Visits every position of `index` (row-major), giving `(position, offset into target)` where
/// the target offset uses `index[position]` on axis `axis` and the position's own coordinate on
/// every other axis, and the source offset of the same coordinates in a tensor of `source` dims.
fn walk_index(
    index: &IndexTensor,
    axis: usize,
    target: &Shape,
    source: &Shape,
    mut f: impl FnMut(usize, usize, usize),
) {
    if index.data.is_empty() {
        return;
    }
    let dims = index.shape.dims();
    let (ts, ss) = (target.strides(), source.strides());
    let mut coord = vec![0usize; dims.len()];
    for (lin, &ix) in index.data.iter().enumerate() {
        let (mut t, mut s) = (0, 0);
        for (d, &c) in coord.iter().enumerate() {
            t += if d == axis { ix } else { c } * ts[d];
            s += c * ss[d];
        }
        f(lin, t, s);
        for d in (0..dims.len()).rev() {
            coord[d] += 1;
            if coord[d] < dims[d] {
                break;
            }
            coord[d] = 0;
        }
    }
}

/// Checks the rules shared by gather and scatter_add: `index` has `target`'s rank, no larger
/// extent than `target` off `axis` (nor than `source` anywhere), and in-range values.
fn check_scatter_index(
    op: &'static str,
    index: &IndexTensor,
    dim: isize,
    target: &Shape,
    source: Option<&Shape>,
) -> Result<usize> {
    index.check_len(op)?;
    let axis = normalize_axis(op, dim, target.rank())?;
    let ix = &index.shape;
    let fits = ix.rank() == target.rank()
        && ix
            .dims()
            .iter()
            .zip(target.dims())
            .enumerate()
            .all(|(d, (&i, &t))| d == axis || i <= t)
        && source.is_none_or(|s| {
            s.rank() == ix.rank() && ix.dims().iter().zip(s.dims()).all(|(&i, &s)| i <= s)
        });
    if !fits {
        let src = source.map(|s| format!(", src {s}")).unwrap_or_default();
        return Err(Error::invalid(
            op,
            format!(
                "index of shape {ix} does not fit input {target}{src} along dim {dim} (same rank, no larger extent off dim)"
            ),
        ));
    }
    index.check_bound(op, target.dims()[axis])?;
    Ok(axis)
}

impl Gather {
    fn gather<S: Scalar>(&self, x: &Tensor<S>) -> Result<Tensor<S>> {
        let axis = check_scatter_index("gather", &self.index, self.dim, x.shape(), None)?;
        let mut out = vec![S::ZERO; self.index.shape.numel()];
        let src = x.data();
        walk_index(
            &self.index,
            axis,
            x.shape(),
            &self.index.shape,
            |lin, t, _| {
                out[lin] = src[t];
            },
        );
        Tensor::from_shape(self.index.shape.clone(), out)
    }
}

impl OpRules for Gather {
    fn arity(&self) -> Arity {
        Arity::Exact(1)
    }
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        check_scatter_index(self.name(), &self.index, self.dim, inputs[0], None)?;
        Ok(self.index.shape.clone())
    }
    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        Ok(Forward::new(self.gather(x[0])?))
    }
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let x = &ctx.input_shapes[0];
        let axis = check_scatter_index(self.name(), &self.index, self.dim, x, None)?;
        let mut dx = vec![S::ZERO; x.numel()];
        let g = cot.data();
        walk_index(&self.index, axis, x, &self.index.shape, |lin, t, _| {
            dx[t] += g[lin];
        });
        Ok(smallvec![Some(Tensor::from_shape(x.clone(), dx)?)])
    }
    linear_shell!();
}

impl ScatterAdd {
    fn axis(&self, input: &Shape, src: &Shape) -> Result<usize> {
        check_scatter_index("scatter_add", &self.index, self.dim, input, Some(src))
    }

    fn scatter<S: Scalar>(&self, input: &Tensor<S>, src: &Tensor<S>) -> Result<Tensor<S>> {
        let axis = self.axis(input.shape(), src.shape())?;
        let mut out = input.clone();
        let (o, s) = (out.data_mut(), src.data());
        walk_index(&self.index, axis, input.shape(), src.shape(), |_, t, si| {
            o[t] += s[si];
        });
        Ok(out)
    }
}

impl OpRules for ScatterAdd {
    fn arity(&self) -> Arity {
        Arity::Exact(2)
    }
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        self.axis(inputs[0], inputs[1])?;
        Ok(inputs[0].clone())
    }
    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        Ok(Forward::new(self.scatter(x[0], x[1])?))
    }
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let (input, src) = (&ctx.input_shapes[0], &ctx.input_shapes[1]);
        let axis = self.axis(input, src)?;
        Ok(smallvec![
            when(ctx, 0, || Ok(cot.clone()))?,
            when(ctx, 1, || {
                // Positions of src outside the index's extent do not reach the output.
                let mut ds = vec![S::ZERO; src.numel()];
                let g = cot.data();
                walk_index(&self.index, axis, input, src, |_, t, si| ds[si] = g[t]);
                Tensor::from_shape(src.clone(), ds)
            })?,
        ])
    }
    linear_shell!();
}

impl Select {
    /// (outer, len, inner, chosen position) and the output shape.
    fn geometry(&self, x: &Shape) -> Result<(usize, usize, usize, usize, Shape)> {
        let op = "select";
        let axis = normalize_axis(op, self.dim, x.rank())?;
        let (outer, len, inner) = split_at_axis(x.dims(), axis);
        let at = if self.index < 0 {
            self.index.checked_add(len as isize)
        } else {
            Some(self.index)
        };
        let at = match at {
            Some(a) if a >= 0 && (a as usize) < len => a as usize,
            _ => {
                return Err(Error::Index {
                    op,
                    what: "index",
                    index: self.index as i64,
                    bound: len,
                })
            }
        };
        let mut dims = x.dims().to_vec();
        dims.remove(axis);
        Ok((outer, len, inner, at, Shape::new(dims)?))
    }

    fn select<S: Scalar>(&self, x: &Tensor<S>) -> Result<Tensor<S>> {
        let (outer, len, inner, at, shape) = self.geometry(x.shape())?;
        Tensor::from_shape(shape, take_along(x.data(), outer, len, inner, &[at]))
    }
}

impl OpRules for Select {
    fn arity(&self) -> Arity {
        Arity::Exact(1)
    }
    fn output_shape(&self, inputs: &[&Shape]) -> Result<Shape> {
        Ok(self.geometry(inputs[0])?.4)
    }
    fn forward<S: Scalar>(&self, x: &[&Tensor<S>]) -> Result<Forward<S>> {
        Ok(Forward::new(self.select(x[0])?))
    }
    fn vjp<S: Scalar>(&self, ctx: &VjpContext<'_, S>, cot: &Tensor<S>) -> Result<Grads<S>> {
        let x = &ctx.input_shapes[0];
        let (outer, len, inner, at, _) = self.geometry(x)?;
        if cot.numel() != outer * inner {
            let data = put_along(cot.data(), outer, len, inner, &[at]);
            return Ok(smallvec![Some(Tensor::from_shape(x.clone(), data)?)]);
        }
        // `put_along`'s values (the chosen block is the cotangent, the rest 0), each element
        // written once into a pooled buffer rather than added onto freshly zeroed pages.
        let g = cot.data();
        Ok(smallvec![Some(Tensor::from_writer(x.clone(), |dx| {
            if inner == 0 {
                return;
            }
            for (o, blocks) in dx.chunks_exact_mut(len * inner).enumerate() {
                for (j, block) in blocks.chunks_exact_mut(inner).enumerate() {
                    if j == at {
                        // `0 + v`, as put_along adds onto zeros (-0 becomes +0).
                        let src = &g[o * inner..(o + 1) * inner];
                        for (d, &v) in block.iter_mut().zip(src) {
                            *d = S::ZERO + v;
                        }
                    } else {
                        block.fill(S::ZERO);
                    }
                }
            }
        }))])
    }
    linear_shell!();
}

impl std::fmt::Display for Embedding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "embedding(indices={}", self.indices)?;
        match self.padding_idx {
            Some(p) => write!(f, ", padding_idx={p})"),
            None => write!(f, ")"),
        }
    }
}

/// `Display` of the ops with a `dim` and an `index`: `name(dim=.., index=..)`.
macro_rules! display_dim_index {
    ($($op:ty),*) => {
        $(
            impl std::fmt::Display for $op {
                fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    write!(f, "{}(dim={}, index={})", self.name(), self.dim, self.index)
                }
            }
        )*
    };
}

display_dim_index!(IndexSelect, Gather, ScatterAdd, Select);
