//! Where the classes of a class loss's input lie: PyTorch's (C), (N, C) and (N, C, d1, ..., dk)
//! forms, the last with its class axis moved last ("rows" of C logits, one per position) so that
//! one row formula serves every form. The (C) and (N, C) forms are rows already and are not copied.

use std::borrow::Cow;
use tapegrad_tensor::kernels::transpose;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// The rows and classes of a class loss's input, after checking its rank and its number of
/// per-position targets.
pub(super) struct Classes {
    /// Rows of C logits: 1 for a single (C) sample, N for (N, C), N·d1···dk for a spatial input.
    pub(super) n: usize,
    pub(super) c: usize,
    /// Shape of the unreduced loss: (), (N) or (N, d1, ..., dk).
    pub(super) per_sample: Shape,
    /// The shape the row formulas work on: the input's own for (C) and (N, C), (rows, C) for a
    /// spatial input.
    pub(super) rows_shape: Shape,
    /// For a spatial input: N and the positions per sample, d1···dk.
    spatial: Option<(usize, usize)>,
}

impl Classes {
    /// Reads the layout of an input of `shape` for `op`, whose `targets` count (one per
    /// position, called `what` in the error) must be its rows.
    pub(super) fn new(op: &'static str, shape: &Shape, targets: usize, what: &str) -> Result<Self> {
        let cl = Classes::of(op, shape)?;
        let n = cl.n;
        if targets != n {
            let at = if cl.is_spatial() {
                format!(" (one per position of {})", cl.per_sample)
            } else {
                String::new()
            };
            return Err(Error::invalid(
                op,
                format!("input of shape {shape} needs {n} {what}{at}, found {targets}"),
            ));
        }
        Ok(cl)
    }

    /// The layout of an input of `shape` for `op`: an error for a 0-d input.
    pub(super) fn of(op: &'static str, shape: &Shape) -> Result<Self> {
        let (c, per_sample, spatial) = match *shape.dims() {
            [c] => (c, Shape::scalar(), None),
            [n, c] => (c, Shape::for_op(op, [n])?, None),
            [n, c, ref rest @ ..] if !rest.is_empty() => {
                let mut dims = vec![n];
                dims.extend_from_slice(rest);
                let positions = Shape::for_op(op, rest)?.numel();
                (c, Shape::for_op(op, dims)?, Some((n, positions)))
            }
            _ => {
                return Err(Error::invalid(
                    op,
                    format!(
                        "input must have shape (C), (N, C) or (N, C, d1, ..., dk), found {shape}"
                    ),
                ))
            }
        };
        let n = per_sample.numel();
        let rows_shape = match spatial {
            Some(_) => Shape::for_op(op, [n, c])?,
            None => shape.clone(),
        };
        Ok(Classes {
            n,
            c,
            per_sample,
            rows_shape,
            spatial,
        })
    }

    /// `x` (of the input's shape) as rows of C: itself for (C) and (N, C); for a spatial input the
    /// class axis moved last (the (C, P) planes of each sample transposed by the layout kernel),
    /// row `b·P + s` holding position `s` of sample `b`.
    pub(super) fn to_rows<'a, S: Scalar>(&self, x: &'a Tensor<S>) -> Result<Cow<'a, Tensor<S>>> {
        let Some((batch, positions)) = self.spatial else {
            return Ok(Cow::Borrowed(x));
        };
        let planes = x.reshape(&[batch, self.c, positions])?;
        Ok(Cow::Owned(
            transpose(&planes, 1, 2)?.reshape_to(&self.rows_shape)?,
        ))
    }

    /// Whether the input is (N, C, d1, ..., dk).
    pub(super) fn is_spatial(&self) -> bool {
        self.spatial.is_some()
    }

    /// The inverse of `to_rows`: rows of C back in the input's `shape`.
    pub(super) fn rows_to_input<S: Scalar>(
        &self,
        rows: Tensor<S>,
        shape: &Shape,
    ) -> Result<Tensor<S>> {
        let Some((batch, positions)) = self.spatial else {
            return Ok(rows);
        };
        let by_position = rows.reshape(&[batch, positions, self.c])?;
        transpose(&by_position, 1, 2)?.reshape_to(shape)
    }
}
