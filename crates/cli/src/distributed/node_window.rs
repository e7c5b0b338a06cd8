//! The gradient exchange for ranks on one host: every rank writes its buckets into an MPI-3
//! shared-memory window and, after one barrier, reads the others' straight from it, instead of an
//! all-gather that copies each bucket through MPI's own buffers with a handshake per bucket.

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives};
use std::marker::PhantomData;
use std::os::raw::{c_int, c_void};
use tapegrad_nn::exchange::Received;

/// Each rank's segment of the window holds two halves of one step's buckets: a step writes one
/// half while a rank that is behind may still read the other, the previous step's. A rank writes a
/// half again only two steps later, after the next step's barrier, which every rank reaches only
/// once it has read that half: one barrier per step is enough.
pub(super) struct NodeWindow {
    win: ffi::MPI_Win,
    /// Every rank's segment, in rank order.
    segments: Vec<*mut u8>,
    /// The buckets' lengths and element size the window was made for, and where each bucket
    /// starts in a half, in bytes.
    lens: Vec<usize>,
    offsets: Vec<usize>,
    elem: usize,
    /// Bytes per half (the buckets, each aligned to 64 bytes).
    half: usize,
    /// Which half this step writes.
    parity: usize,
}

/// The most shared memory a window takes, over all ranks: a container's `/dev/shm` may be as small
/// as 64 MiB (Docker's default), and a full one would fail a step, not the window's creation.
/// The window saves a collective's latency, which matters for small buckets; above this the
/// all-gather's bandwidth dominates either way.
const MAX_WINDOW_BYTES: usize = 32 << 20;

impl NodeWindow {
    /// The communicator of the ranks on this host, when every rank of `world` is on it (the
    /// window's memory is only shared on one host); `None` on several hosts. Collective.
    pub(super) fn node_of(world: &SimpleCommunicator) -> Option<SimpleCommunicator> {
        let node = world.split_shared(world.rank());
        (node.size() == world.size()).then_some(node)
    }

    /// A window for buckets of `lens` elements of `elem` bytes on the ranks of `node`.
    /// Collective; `None` (the same on every rank) when it would take more than
    /// `MAX_WINDOW_BYTES` or MPI cannot make one with every segment aligned to 64 bytes: the
    /// caller then keeps the all-gather.
    pub(super) fn open(node: &SimpleCommunicator, lens: &[usize], elem: usize) -> Option<Self> {
        // Each bucket starts 64-byte aligned; a half is every bucket one after the other.
        let mut offsets = Vec::with_capacity(lens.len());
        let mut half = 0;
        for &l in lens {
            offsets.push(half);
            half += (l * elem).next_multiple_of(64);
        }
        let per_rank = 2 * half.max(64);
        if per_rank.saturating_mul(node.size() as usize) > MAX_WINDOW_BYTES {
            return None;
        }
        let bytes = ffi::MPI_Aint::try_from(per_rank).ok()?;
        let mut base: *mut u8 = std::ptr::null_mut();
        // SAFETY: `MPI_Win` is a C handle (an integer or a pointer), valid when zeroed; MPI
        // overwrites it below.
        let mut win = unsafe { std::mem::zeroed::<ffi::MPI_Win>() };
        // SAFETY: MPI writes the window's handle and this rank's base address; the size and the
        // displacement unit are valid, and every rank of `node` makes the same call.
        let made = unsafe {
            ffi::MPI_Win_allocate_shared(
                bytes,
                1,
                ffi::RSMPI_INFO_NULL,
                node.as_raw(),
                (&mut base as *mut *mut u8).cast::<c_void>(),
                &mut win,
            )
        };
        if made != ffi::MPI_SUCCESS as c_int {
            return None;
        }
        // SAFETY: the window is valid; a passive-target epoch on every rank for its lifetime
        // is what makes `MPI_Win_sync` order this rank's stores and loads.
        unsafe { ffi::MPI_Win_lock_all(ffi::MPI_MODE_NOCHECK as c_int, win) };
        let mut window = NodeWindow {
            win,
            segments: Vec::with_capacity(node.size() as usize),
            lens: lens.to_vec(),
            offsets,
            elem,
            half,
            parity: 0,
        };
        for r in 0..node.size() {
            let (mut size, mut unit, mut at) = (0, 0, std::ptr::null_mut::<u8>());
            // SAFETY: `r` is a rank of the window's group; MPI writes the three outputs.
            let found = unsafe {
                ffi::MPI_Win_shared_query(
                    win,
                    r,
                    &mut size,
                    &mut unit,
                    (&mut at as *mut *mut u8).cast::<c_void>(),
                )
            };
            window.segments.push(at);
            // The same on every rank: the segments lie at the same offsets of one mapping.
            if found != ffi::MPI_SUCCESS as c_int || size < bytes || at.align_offset(64) != 0 {
                window.free();
                return None;
            }
        }
        Some(window)
    }

    /// Whether this window was made for buckets of `lens` elements of `elem` bytes.
    pub(super) fn fits(&self, lens: &[usize], elem: usize) -> bool {
        self.lens == lens && self.elem == elem
    }

    /// Writes rank `rank`'s bucket `b` into this step's half; false, writing nothing, unless
    /// `values` are the bucket's `lens[b]` elements of `elem` bytes.
    pub(super) fn put<T: Copy>(&mut self, rank: usize, b: usize, values: &[T]) -> bool {
        let fits = std::mem::size_of::<T>() == self.elem
            && self.lens.get(b) == Some(&values.len())
            && rank < self.segments.len();
        if !fits {
            return false;
        }
        let at = self.parity * self.half + self.offsets[b];
        // SAFETY: the bucket's bytes lie inside this rank's segment (`half` counts every bucket
        // at its 64-byte aligned offset, the segment holds two halves, and `values` has the
        // bucket's length and element size); the segment is 64-byte aligned, and no other
        // rank writes it.
        unsafe {
            let dst = self.segments[rank].add(at).cast::<T>();
            std::ptr::copy_nonoverlapping(values.as_ptr(), dst, values.len());
        }
        true
    }

    /// Waits until every rank has put this step's buckets and returns the half that holds them,
    /// to read with `parts` until the next step. Collective.
    pub(super) fn arrive(&mut self, node: &SimpleCommunicator) -> usize {
        // SAFETY: the window is valid and locked; sync, barrier, sync is MPI's pattern for
        // making one rank's stores to shared memory visible to another's loads.
        unsafe { ffi::MPI_Win_sync(self.win) };
        node.barrier();
        unsafe { ffi::MPI_Win_sync(self.win) };
        let half = self.parity;
        self.parity ^= 1;
        half
    }

    /// Every rank's buckets of `half` (from `arrive`), read in place; `None` unless the window
    /// was made for elements of `T`'s size.
    pub(super) fn parts<T: Copy>(&self, half: usize) -> Option<WindowParts<'_, T>> {
        (std::mem::size_of::<T>() == self.elem).then_some(WindowParts {
            window: self,
            half: half & 1,
            element: PhantomData,
        })
    }

    /// Frees the window. Collective: only at the end of a run that every rank reaches.
    pub(super) fn free(mut self) {
        // SAFETY: the window is valid and locked by `open`; every rank frees it together.
        unsafe {
            ffi::MPI_Win_unlock_all(self.win);
            ffi::MPI_Win_free(&mut self.win);
        }
    }
}

/// One step's buckets of every rank, read from the window without copying them out.
pub(super) struct WindowParts<'a, T> {
    window: &'a NodeWindow,
    half: usize,
    element: PhantomData<T>,
}

impl<T: Copy> Received<T> for WindowParts<'_, T> {
    fn part(&self, bucket: usize, rank: usize) -> &[T] {
        let w = self.window;
        let at = self.half * w.half + w.offsets[bucket];
        // SAFETY: the bucket lies inside the rank's segment as in `put`, aligned for `T` (the
        // window was made for `T`'s size and the segments are 64-byte aligned), and its writer
        // finished it before `arrive`'s barrier. No rank writes this half again before the next
        // step's barrier, which this rank reaches only after the borrow of the exchange that
        // this view holds has ended.
        unsafe { std::slice::from_raw_parts(w.segments[rank].add(at).cast::<T>(), w.lens[bucket]) }
    }
}
