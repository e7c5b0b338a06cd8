//! `AlignedBuf<S>`: a tensor's shared element storage, one allocation holding a reference count
//! and the elements, which start on a [`BUFFER_ALIGN`]-byte boundary (a cache line), so vector
//! loads that walk a buffer from its start never straddle two lines. It is `Arc<[S]>` with that
//! alignment (an `Arc` puts its elements 16 bytes into an allocation aligned to 8 or 16 only).

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::marker::PhantomData;
use std::mem::{align_of, size_of};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicUsize, Ordering};

/// The alignment in bytes of every tensor buffer's first element.
pub const BUFFER_ALIGN: usize = 64;

/// Bytes before the first element: the count, padded to a whole line so the elements start on
/// the next one (and a write to the count never shares a line with the elements).
const HEADER: usize = BUFFER_ALIGN;

/// A reference-counted buffer of `Copy` elements whose first element is `BUFFER_ALIGN`-aligned.
/// Cloning shares it; [`AlignedBuf::get_mut`] gives the elements only to a sole holder. There are
/// no weak references, so a count of one means unshared.
pub(crate) struct AlignedBuf<S> {
    /// The first element, `HEADER` bytes past the start of the allocation, where the count is.
    elems: NonNull<S>,
    len: usize,
    /// Owns `S` values, for the auto traits and drop check (as `Arc<[S]>` does).
    _owns: PhantomData<S>,
}

// SAFETY: as for `Arc<[S]>`: the count is atomic, and holders on several threads only ever read
// the elements together (`get_mut` hands them out only to a sole holder), so sending or sharing
// a handle is sound when `S` may be sent and shared.
unsafe impl<S: Send + Sync> Send for AlignedBuf<S> {}
// SAFETY: as for `Send` above.
unsafe impl<S: Send + Sync> Sync for AlignedBuf<S> {}

impl<S: Copy> AlignedBuf<S> {
    /// Compile-time check that the elements fit the layout: `HEADER` is a multiple of their
    /// alignment, so the first one is aligned for `S` as well as to `BUFFER_ALIGN`.
    const ELEMS_ALIGNED: () = assert!(align_of::<S>() <= HEADER && HEADER % align_of::<S>() == 0);

    /// `len` copies of `v` in a fresh allocation.
    pub(crate) fn filled(len: usize, v: S) -> Self {
        let buf = Self::allocate(len);
        // SAFETY: `allocate` made room for `len` elements at `elems`, aligned for `S`, and no
        // one else can see them yet; `write` stores each without reading the uninitialised slot.
        unsafe {
            for i in 0..len {
                buf.elems.as_ptr().add(i).write(v);
            }
        }
        buf
    }

    /// A copy of `src` in a fresh allocation.
    pub(crate) fn copied(src: &[S]) -> Self {
        let buf = Self::allocate(src.len());
        // SAFETY: `allocate` made room for `src.len()` elements at `elems`, aligned for `S`, in an
        // allocation of its own, so the ranges do not overlap; every element is written.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), buf.elems.as_ptr(), src.len()) };
        buf
    }

    /// An allocation with a count of one and room for `len` elements, which are uninitialised:
    /// the constructors above write every one before handing the buffer out.
    fn allocate(len: usize) -> Self {
        let () = Self::ELEMS_ALIGNED;
        let layout = layout::<S>(len)
            .unwrap_or_else(|| panic!("tensor buffer of {len} elements: capacity overflow"));
        // SAFETY: the layout's size is at least `HEADER`, so not zero.
        let start = unsafe { alloc(layout) };
        let Some(start) = NonNull::new(start) else {
            handle_alloc_error(layout)
        };
        // SAFETY: the allocation starts `BUFFER_ALIGN`-aligned (so aligned for the count) and is
        // at least `HEADER` bytes long, room for the count and then the elements' offset.
        unsafe {
            start.cast::<AtomicUsize>().write(AtomicUsize::new(1));
            AlignedBuf {
                elems: start.add(HEADER).cast::<S>(),
                len,
                _owns: PhantomData,
            }
        }
    }
}

/// The layout of a buffer of `len` elements of `S`; `None` when it would not fit the address
/// space.
fn layout<S>(len: usize) -> Option<Layout> {
    let size = len.checked_mul(size_of::<S>())?.checked_add(HEADER)?;
    Layout::from_size_align(size, BUFFER_ALIGN).ok()
}

impl<S> AlignedBuf<S> {
    /// The count of holders, at the start of the allocation.
    #[inline(always)]
    fn count(&self) -> &AtomicUsize {
        // SAFETY: `allocate` wrote the count `HEADER` bytes before `elems`, at the allocation's
        // aligned start, and this handle keeps the allocation alive.
        unsafe {
            self.elems
                .cast::<u8>()
                .sub(HEADER)
                .cast::<AtomicUsize>()
                .as_ref()
        }
    }

    /// The number of elements.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The elements' bytes (what the pool counts a buffer as).
    #[inline(always)]
    pub(crate) fn nbytes(&self) -> usize {
        self.len * size_of::<S>()
    }

    /// The elements.
    #[inline(always)]
    pub(crate) fn as_slice(&self) -> &[S] {
        // SAFETY: `elems` points to `len` elements, aligned and initialised by the constructor,
        // kept alive by this handle; `get_mut` hands them out mutably only to a sole holder, and
        // only while that holder is borrowed mutably, so nothing writes them during this borrow.
        unsafe { std::slice::from_raw_parts(self.elems.as_ptr(), self.len) }
    }

    /// True when this handle is the buffer's only holder. The load is `Acquire`, pairing with
    /// the `Release` of other holders' drops: their reads happen before the sole holder writes.
    #[inline(always)]
    pub(crate) fn is_unique(&self) -> bool {
        self.count().load(Ordering::Acquire) == 1
    }

    /// The elements for writing, when this handle is the only holder.
    #[inline(always)]
    pub(crate) fn get_mut(&mut self) -> Option<&mut [S]> {
        if !self.is_unique() {
            return None;
        }
        // SAFETY: as in `as_slice`; and this handle is the only one, borrowed mutably, and no
        // new handle can be made from it (a clone needs it) while the slice lives.
        Some(unsafe { std::slice::from_raw_parts_mut(self.elems.as_ptr(), self.len) })
    }

    /// True when both handles hold the same buffer.
    #[inline]
    pub(crate) fn ptr_eq(a: &Self, b: &Self) -> bool {
        a.elems == b.elems
    }
}

impl<S> Clone for AlignedBuf<S> {
    /// Another holder of the same buffer.
    #[inline]
    fn clone(&self) -> Self {
        // `Relaxed`, as `Arc::clone`: a holder already exists, so nothing is published. A count
        // past `isize::MAX` means leaked handles (each takes memory, so it cannot be reached
        // honestly): abort as `Arc` does, before the count could wrap to a use after free.
        if self.count().fetch_add(1, Ordering::Relaxed) > isize::MAX as usize {
            std::process::abort();
        }
        AlignedBuf {
            elems: self.elems,
            len: self.len,
            _owns: PhantomData,
        }
    }
}

impl<S> Drop for AlignedBuf<S> {
    /// Frees the allocation when this is the last holder (the elements are `Copy`: buffers are
    /// only made for `S: Copy`, so there is nothing to drop in them).
    #[inline]
    fn drop(&mut self) {
        // `Release`, so this holder's reads of the elements happen before the last holder frees
        // or rewrites them; that one's `Acquire` fence (or `is_unique` load) pairs with it.
        if self.count().fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        fence(Ordering::Acquire);
        // The layout was valid when the buffer was allocated with this length.
        if let Some(layout) = layout::<S>(self.len) {
            // SAFETY: the allocation starts `HEADER` bytes before `elems`, was made by `alloc`
            // with this layout, and this was its last holder.
            unsafe { dealloc(self.elems.cast::<u8>().sub(HEADER).as_ptr(), layout) };
        }
    }
}
