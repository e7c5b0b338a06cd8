//! `Tensor<S>`: a shape plus a shared, row-major, contiguous buffer. Cloning shares the buffer
//! (an `AlignedBuf`: count and elements in one allocation, the elements 64-byte aligned), writing
//! through `data_mut` copies it only when it is shared. The last holder of a buffer hands it to
//! the thread's [`crate::pool`], and new tensors take their buffers from there. A one-element
//! tensor holds its element itself.

use crate::buffer::AlignedBuf;
use crate::{pool, Error, Result, Scalar, Shape};

/// A dense row-major tensor whose buffer is shared between clones (copy-on-write).
#[derive(Clone, PartialEq)]
pub struct Tensor<S> {
    shape: Shape,
    data: Buffer<S>,
}

/// The elements: one held in the tensor itself, or a shared allocation with how to give it back
/// to the pool when its last holder drops it. (`Tensor<S>` has no `Scalar` bound, so a `Drop`
/// impl could not reach the pool for `S` without this function pointer, set where `S: Scalar`
/// is known.) The element of `One` sits beside the function pointer's niche, so the enum is no
/// larger than `Shared` alone and a tensor stays 72 bytes.
#[derive(Clone)]
enum Buffer<S> {
    /// A one-element buffer: scalar code then makes and drops its values without an
    /// allocation, a count or a pool round trip, and a clone copies the element (the copy that
    /// copy-on-write would make on a write anyway).
    One(S),
    Shared {
        /// `None` only while the buffer is being dropped (it has gone to the pool or been
        /// freed): taking it out by value lets `Drop` hand it over without a placeholder.
        elems: Option<AlignedBuf<S>>,
        give_back: fn(AlignedBuf<S>),
    },
}

impl<S: Scalar> Buffer<S> {
    fn new(elems: AlignedBuf<S>) -> Self {
        Buffer::Shared {
            elems: Some(elems),
            give_back: pool::give_back::<S>,
        }
    }

    /// The one-element buffer holding `v`.
    #[inline(always)]
    fn one(v: S) -> Self {
        Buffer::One(v)
    }

    /// What a buffer for the caller to overwrite holds before it is written: NaN in debug
    /// builds, so a kernel that misses an element fails its tests instead of leaking another
    /// tensor's values; zeros otherwise, as safe code must.
    #[inline(always)]
    fn unwritten() -> S {
        if cfg!(debug_assertions) {
            S::from_f64(f64::NAN)
        } else {
            S::ZERO
        }
    }

    /// A recycled (or, for one element, inline) unshared buffer of `len` elements for the
    /// caller to overwrite, if the pool has one. Its stale values are replaced by NaN in debug
    /// builds, so a kernel that misses an element fails its tests instead of leaking another
    /// tensor's values.
    #[inline(always)]
    fn recycled(len: usize) -> Option<Self> {
        if len == 1 {
            return Some(Buffer::one(Self::unwritten()));
        }
        let mut buf = Buffer::new(pool::take::<S>(len)?);
        if cfg!(debug_assertions) {
            buf.elems_mut().fill(Self::unwritten());
        }
        Some(buf)
    }

    /// An unshared buffer of `len` elements for the caller to overwrite: inline, recycled, else
    /// fresh (zeroed, as safe code must; NaN in debug builds, as a recycled one).
    #[inline]
    fn for_overwrite(len: usize) -> Self {
        Buffer::recycled(len)
            .unwrap_or_else(|| Buffer::new(AlignedBuf::filled(len, Self::unwritten())))
    }

    /// `len` copies of `v`.
    fn filled(len: usize, v: S) -> Self {
        if len == 1 {
            return Buffer::one(v);
        }
        match pool::take::<S>(len) {
            Some(elems) => {
                let mut buf = Buffer::new(elems);
                buf.elems_mut().fill(v);
                buf
            }
            None => Buffer::new(AlignedBuf::filled(len, v)),
        }
    }

    /// A buffer holding `src` (one copy).
    fn copied(src: &[S]) -> Self {
        if let [v] = *src {
            return Buffer::one(v);
        }
        match pool::take::<S>(src.len()) {
            Some(elems) => {
                let mut buf = Buffer::new(elems);
                buf.elems_mut().copy_from_slice(src);
                buf
            }
            None => Buffer::new(AlignedBuf::copied(src)),
        }
    }

    /// The elements, copied into a buffer of their own first if another tensor shares them.
    /// Inlined: kernels call this on every fresh output, which is unshared.
    #[inline(always)]
    fn elems_mut(&mut self) -> &mut [S] {
        // No `Weak` is ever made of a tensor buffer, so one strong count means unshared.
        if matches!(self, Buffer::Shared { elems: Some(e), .. } if !e.is_unique()) {
            self.unshare();
        }
        // Unshared now, so `get_mut` succeeds (the copy stays out of line: see `unshare`).
        match self {
            Buffer::One(v) => std::slice::from_mut(v),
            Buffer::Shared { elems: Some(e), .. } => e.get_mut().unwrap_or_default(),
            Buffer::Shared { elems: None, .. } => &mut [],
        }
    }

    /// Replaces a shared buffer by a copy of its own (out of line: fresh outputs never need it).
    #[cold]
    #[inline(never)]
    fn unshare(&mut self) {
        *self = Buffer::copied(self.elems());
    }
}

impl<S> Buffer<S> {
    /// The elements (none only mid-drop, where nothing reads them).
    #[inline]
    fn elems(&self) -> &[S] {
        match self {
            Buffer::One(v) => std::slice::from_ref(v),
            Buffer::Shared { elems, .. } => elems.as_ref().map_or(&[], AlignedBuf::as_slice),
        }
    }
}

impl<S> Drop for Buffer<S> {
    #[inline]
    fn drop(&mut self) {
        if let Buffer::Shared { elems, give_back } = self {
            if let Some(elems) = elems.take() {
                give_back(elems);
            }
        }
    }
}

impl<S: PartialEq> PartialEq for Buffer<S> {
    fn eq(&self, other: &Self) -> bool {
        self.elems() == other.elems()
    }
}

impl<S: Scalar> Tensor<S> {
    /// A tensor from a shape and row-major data; errors when the lengths differ.
    pub fn new(dims: &[usize], data: Vec<S>) -> Result<Self> {
        let shape = Shape::for_op("Tensor::new", dims)?;
        Self::from_shape(shape, data)
    }

    /// A tensor from an already-built shape and row-major data. The elements are copied into the
    /// shared buffer; kernels on hot paths build the buffer in place with
    /// [`Tensor::from_iter_exact`] or [`Tensor::from_writer`] instead.
    pub fn from_shape(shape: Shape, data: Vec<S>) -> Result<Self> {
        if data.len() != shape.numel() {
            return Err(Error::DataLength {
                op: "tensor",
                len: data.len(),
                numel: shape.numel(),
                shape: Box::new(shape),
            });
        }
        Ok(Tensor {
            shape,
            data: Buffer::copied(&data),
        })
    }

    /// A tensor whose elements are produced by an exact-size iterator, written straight into the
    /// shared buffer (a recycled one when the pool has one); errors when the count differs from
    /// the shape's. The count is what the iterator yields, not what its `len()` claims: an
    /// iterator whose `len()` is wrong cannot leave stale elements or make a short buffer.
    pub fn from_iter_exact<I>(shape: Shape, iter: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        I::IntoIter: ExactSizeIterator,
    {
        let mut iter = iter.into_iter();
        let numel = shape.numel();
        let mut data = Buffer::for_overwrite(numel);
        let mut written = 0;
        for (d, v) in data.elems_mut().iter_mut().zip(&mut iter) {
            *d = v;
            written += 1;
        }
        // Anything left over is counted, for the error (`zip` polls the buffer's side first, so
        // nothing was lost when it ran out).
        let yielded = written + iter.count();
        if yielded != numel {
            return Err(Error::DataLength {
                op: "tensor",
                len: yielded,
                numel,
                shape: Box::new(shape),
            });
        }
        Ok(Tensor { shape, data })
    }

    /// The one-element tensor of `shape` (whose count must be 1) holding `v`: what a kernel
    /// makes from one element, without a buffer to fetch or a loop to set up.
    #[inline(always)]
    pub(crate) fn one_element(shape: Shape, v: S) -> Self {
        debug_assert_eq!(shape.numel(), 1, "one_element of shape {shape}");
        Tensor {
            shape,
            data: Buffer::one(v),
        }
    }

    /// The element of a tensor that holds exactly one in itself (the inline one-element buffer).
    #[inline(always)]
    pub(crate) fn the_one(&self) -> Option<S> {
        match self.data {
            Buffer::One(v) => Some(v),
            Buffer::Shared { .. } => None,
        }
    }

    /// A tensor whose every element `write` sets, in a buffer taken from the pool when it has
    /// one. The buffer holds arbitrary values when `write` starts (stale ones from a dropped
    /// tensor, zeros, or NaN in debug builds), so `write` must overwrite all of it; kernels that
    /// accumulate into their output use [`Tensor::zeros_with`].
    #[inline]
    pub fn from_writer(shape: Shape, write: impl FnOnce(&mut [S])) -> Self {
        let mut data = Buffer::for_overwrite(shape.numel());
        write(data.elems_mut());
        Tensor { shape, data }
    }

    /// Zeros whose buffer the caller fills at once through `fill` (which sees it unshared), for
    /// kernels that accumulate into their output.
    pub fn zeros_with(shape: Shape, fill: impl FnOnce(&mut [S])) -> Self {
        let mut t = Self::zeros(&shape);
        fill(t.data_mut());
        t
    }

    /// A tensor from f64 values, rounded to `S`.
    pub fn from_f64(dims: &[usize], data: &[f64]) -> Result<Self> {
        Self::new(dims, data.iter().map(|&v| S::from_f64(v)).collect())
    }

    /// A 0-dimensional tensor.
    pub fn scalar(v: S) -> Self {
        Tensor {
            shape: Shape::scalar(),
            data: Buffer::filled(1, v),
        }
    }

    /// A tensor with every element `v`.
    pub fn full(shape: &Shape, v: S) -> Self {
        Tensor {
            shape: shape.clone(),
            data: Buffer::filled(shape.numel(), v),
        }
    }

    /// All zeros.
    pub fn zeros(shape: &Shape) -> Self {
        Self::full(shape, S::ZERO)
    }

    /// All ones.
    pub fn ones(shape: &Shape) -> Self {
        Self::full(shape, S::ONE)
    }

    /// The shape.
    #[inline]
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The dimensions.
    #[inline]
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// Number of dimensions.
    #[inline]
    pub fn rank(&self) -> usize {
        self.shape.rank()
    }

    /// Number of elements.
    #[inline]
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }

    /// The row-major elements. When there are two or more, the first sits on a
    /// [`crate::BUFFER_ALIGN`]-byte boundary (a one-element tensor holds its element itself).
    #[inline]
    pub fn data(&self) -> &[S] {
        self.data.elems()
    }

    /// Mutable elements; copies the buffer first if another tensor shares it.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [S] {
        self.data.elems_mut()
    }

    /// The buffer as an owned vector (a copy: the shared buffer is not a `Vec`).
    pub fn into_vec(self) -> Vec<S> {
        self.data().to_vec()
    }

    /// Elements widened to f64.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        self.data().iter().map(|v| v.to_f64()).collect()
    }

    /// Converts to another element type (rounding when narrowing).
    pub fn cast<T: Scalar>(&self) -> Tensor<T> {
        let src = self.data();
        Tensor::from_writer(self.shape.clone(), |dst| {
            for (d, v) in dst.iter_mut().zip(src) {
                *d = T::from_f64(v.to_f64());
            }
        })
    }

    /// The single element of a one-element tensor.
    pub fn item(&self) -> Result<S> {
        if self.numel() != 1 {
            return Err(Error::invalid(
                "item",
                format!(
                    "tensor of shape {} has {} elements, not 1",
                    self.shape,
                    self.numel()
                ),
            ));
        }
        Ok(self.data()[0])
    }

    /// Same buffer, new shape with the same element count (shares the buffer).
    pub fn reshape(&self, dims: &[usize]) -> Result<Self> {
        let shape = Shape::for_op("reshape", dims)?;
        self.reshape_to(&shape)
    }

    /// As [`Tensor::reshape`] with a prepared shape.
    pub fn reshape_to(&self, shape: &Shape) -> Result<Self> {
        if shape.numel() != self.numel() {
            return Err(Error::invalid(
                "reshape",
                format!(
                    "cannot reshape {} ({} elements) to {} ({} elements)",
                    self.shape,
                    self.numel(),
                    shape,
                    shape.numel()
                ),
            ));
        }
        Ok(Tensor {
            shape: shape.clone(),
            data: self.data.clone(),
        })
    }

    /// Applies `f` to every element (spread over the GEMM threads when long, see
    /// [`crate::kernels::par_map`]).
    #[inline]
    pub fn map(&self, f: impl Fn(S) -> S + Sync) -> Self {
        // One element (scalar code): the same `f` on it, without a buffer or a loop.
        if let Some(v) = self.the_one() {
            return Tensor::one_element(self.shape.clone(), f(v));
        }
        let src = self.data();
        Tensor::from_writer(self.shape.clone(), |dst| {
            crate::kernels::par_map::map_into(src, dst, f)
        })
    }

    /// Applies `f` to corresponding elements of two same-shaped tensors.
    pub fn zip_map(
        &self,
        other: &Self,
        op: &'static str,
        f: impl Fn(S, S) -> S + Sync,
    ) -> Result<Self> {
        if self.shape != other.shape {
            return Err(Error::ShapeMismatch {
                op,
                expected: Box::new(self.shape.clone()),
                found: Box::new(other.shape.clone()),
            });
        }
        if let (Some(a), Some(b)) = (self.the_one(), other.the_one()) {
            return Ok(Tensor::one_element(self.shape.clone(), f(a, b)));
        }
        let (a, b) = (self.data(), other.data());
        Ok(Tensor::from_writer(self.shape.clone(), |dst| {
            crate::kernels::par_map::zip_map_into(a, b, dst, f)
        }))
    }

    /// True when every element is exactly zero (+0 or -0).
    pub fn is_all_zero(&self) -> bool {
        self.data().iter().all(|&v| v == S::ZERO)
    }

    /// Index and value of the first element that is NaN or infinite.
    pub fn first_non_finite(&self) -> Option<(usize, S)> {
        self.data()
            .iter()
            .enumerate()
            .find(|(_, v)| !v.is_finite())
            .map(|(i, &v)| (i, v))
    }

    /// True when the two tensors share one buffer (no copy was made). A one-element tensor holds
    /// its element itself, so it shares with no other.
    pub fn shares_buffer_with(&self, other: &Self) -> bool {
        match (&self.data, &other.data) {
            (Buffer::Shared { elems: Some(a), .. }, Buffer::Shared { elems: Some(b), .. }) => {
                AlignedBuf::ptr_eq(a, b)
            }
            _ => false,
        }
    }

    /// Bytes of element storage.
    pub fn nbytes(&self) -> usize {
        self.numel() * std::mem::size_of::<S>()
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for Tensor<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const SHOWN: usize = 16;
        write!(f, "Tensor<{}>{}(", std::any::type_name::<S>(), self.shape)?;
        for (i, v) in self.data.elems().iter().take(SHOWN).enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{v:?}")?;
        }
        if self.data.elems().len() > SHOWN {
            write!(f, ", ... {} more", self.data.elems().len() - SHOWN)?;
        }
        write!(f, ")")
    }
}
