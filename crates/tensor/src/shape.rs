//! `Shape`: a list of dimensions, outermost first, with its element count computed once and checked
//! for overflow at construction. Also the helpers that turn PyTorch-style signed axes into indices.

use crate::{Error, Result};
use std::fmt;

/// Shapes up to this rank live inline; recording an op then allocates nothing for its shape.
const INLINE_RANK: usize = 4;

#[derive(Clone)]
enum Dims {
    Inline { len: u8, dims: [usize; INLINE_RANK] },
    Heap(Box<[usize]>),
}

/// Dimensions of a tensor, outermost first. `[]` is a scalar; a dimension may be zero.
#[derive(Clone)]
pub struct Shape {
    dims: Dims,
    numel: usize,
}

/// The scalar shape. (A derived `Default` gave `[]` with a count of 0, unlike `Shape::scalar()`.)
impl Default for Shape {
    fn default() -> Shape {
        Shape::scalar()
    }
}

impl PartialEq for Shape {
    // Always inlined, the slice comparison kept out of line: LLVM left the whole function out
    // of line, a call on a check that runs several times per recorded op.
    #[inline(always)]
    fn eq(&self, other: &Shape) -> bool {
        match (&self.dims, &other.dims) {
            // Unused inline slots are always zero (`new` and `scalar` build them so), so whole
            // arrays compare: no slice `memcmp` call on a check that runs several times per op.
            (Dims::Inline { len: a, dims: x }, Dims::Inline { len: b, dims: y }) => {
                a == b && x == y
            }
            _ => self.dims_eq(other),
        }
    }
}

impl Shape {
    /// Dimension lists compared as slices (a shape of rank above the inline four).
    #[inline(never)]
    fn dims_eq(&self, other: &Shape) -> bool {
        self.dims() == other.dims()
    }
}

impl Eq for Shape {}

impl std::hash::Hash for Shape {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.dims().hash(state);
    }
}

impl Shape {
    /// A shape from its dimensions; errors when the element count overflows `usize`. The error
    /// names `Shape::new`; [`Shape::for_op`] names the op whose shape it is.
    pub fn new(dims: impl AsRef<[usize]>) -> Result<Shape> {
        Shape::for_op("Shape::new", dims)
    }

    /// [`Shape::new`] for the result or attribute of `op`, which an overflow error names.
    pub fn for_op(op: &'static str, dims: impl AsRef<[usize]>) -> Result<Shape> {
        let dims = dims.as_ref();
        // The bound is on the product of the non-zero dims, not on numel: strides are products of
        // trailing dims, so `[0, usize::MAX, 2]` (numel 0) would overflow in `strides()`, and
        // checking the running product instead made validity depend on the order of the dims.
        let mut nonzero: usize = 1;
        for &d in dims.iter().filter(|&&d| d > 0) {
            nonzero = nonzero.checked_mul(d).ok_or_else(|| Error::Overflow {
                op,
                dims: dims.to_vec(),
            })?;
        }
        // Byte counts are computed from numel later; keep headroom so `numel * 8` cannot overflow.
        if nonzero > isize::MAX as usize / 16 {
            return Err(Error::Overflow {
                op,
                dims: dims.to_vec(),
            });
        }
        let numel = if dims.contains(&0) { 0 } else { nonzero };
        let dims = if dims.len() <= INLINE_RANK {
            let mut inline = [0; INLINE_RANK];
            inline[..dims.len()].copy_from_slice(dims);
            Dims::Inline {
                len: dims.len() as u8,
                dims: inline,
            }
        } else {
            Dims::Heap(dims.into())
        };
        Ok(Shape { dims, numel })
    }

    /// The scalar shape `[]`.
    pub fn scalar() -> Shape {
        Shape {
            dims: Dims::Inline {
                len: 0,
                dims: [0; INLINE_RANK],
            },
            numel: 1,
        }
    }

    /// The dimensions, outermost first.
    #[inline]
    pub fn dims(&self) -> &[usize] {
        match &self.dims {
            Dims::Inline { len, dims } => &dims[..*len as usize],
            Dims::Heap(dims) => dims,
        }
    }

    /// Number of dimensions.
    #[inline]
    pub fn rank(&self) -> usize {
        self.dims().len()
    }

    /// Number of elements (1 for a scalar, 0 if any dimension is 0).
    #[inline]
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Row-major strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        let dims = self.dims();
        let mut strides = vec![1; dims.len()];
        for i in (0..dims.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * dims[i + 1];
        }
        strides
    }

    /// Dimension `axis`, which must already be normalised.
    pub fn dim(&self, axis: usize) -> usize {
        self.dims()[axis]
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.dims().iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}

/// Turns a PyTorch-style axis (negative counts from the end) into an index below `rank`.
pub fn normalize_axis(op: &'static str, axis: isize, rank: usize) -> Result<usize> {
    let r = rank as isize;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(Error::Axis { op, axis, rank });
    }
    Ok(a as usize)
}

/// Normalises a list of axes, sorted ascending; a repeated axis is an error.
pub fn normalize_axes(op: &'static str, axes: &[isize], rank: usize) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        out.push(normalize_axis(op, a, rank)?);
    }
    out.sort_unstable();
    for w in out.windows(2) {
        if w[0] == w[1] {
            return Err(Error::invalid(
                op,
                format!("axis {} is repeated in {axes:?}", w[0]),
            ));
        }
    }
    Ok(out)
}
