//! Recycled tensor buffers: a bounded, per-thread pool of unshared buffers, one per scalar type,
//! keyed by exact length. A tensor buffer returns here when its last holder drops it, and kernels
//! take their outputs from here, so a training step whose shapes repeat allocates nothing.
//!
//! Buffers of at least [`MIN_POOLED_BYTES`] are kept by exact length with least-recently-used
//! eviction; smaller ones go to size classes indexed by length (a vector index, cheaper than
//! malloc and free for the few-element tensors of small code; a one-element tensor holds its
//! element itself and never comes here). Each thread holds at most
//! [`capacity`] bytes per scalar type. Reused buffers keep the values of the tensor that dropped
//! them: constructors either overwrite every element or say so.

use crate::buffer::AlignedBuf;
use crate::{DType, Scalar};
use std::any::Any;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::LocalKey;

/// Buffers of at least this many bytes are pooled by exact length, with LRU eviction; smaller
/// (non-empty) ones go to the small size classes, counted apart in [`PoolStats`].
pub const MIN_POOLED_BYTES: usize = 1024;

/// What a small buffer is charged against [`capacity`] besides its elements, so that many tiny
/// buffers cannot hide behind their element bytes (two words; the buffer's header, a count padded
/// to a cache line, is larger).
const SMALL_OVERHEAD: usize = 2 * std::mem::size_of::<usize>();

/// The default [`capacity`]: room for a few steps' worth of activations and gradients of a
/// mid-sized model, small next to the models that would need more.
pub const DEFAULT_CAPACITY: usize = 256 << 20;

static CAPACITY: AtomicUsize = AtomicUsize::new(DEFAULT_CAPACITY);

/// Sets the most bytes each thread keeps per scalar type (0 turns recycling off; buffers
/// already held are freed as the threads next return one).
pub fn set_capacity(bytes: usize) {
    CAPACITY.store(bytes, Ordering::Relaxed);
}

/// The most bytes each thread keeps per scalar type.
#[inline]
pub fn capacity() -> usize {
    CAPACITY.load(Ordering::Relaxed)
}

/// Counters of this thread's pool for one scalar type, since the thread started or the last
/// [`clear`]. `reused`, `allocated` and `returned` count buffers of at least
/// [`MIN_POOLED_BYTES`]; the `small_` counters count the small size classes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Buffers handed out again.
    pub reused: u64,
    /// Pooled-size requests that found no buffer of their length (and allocated one).
    pub allocated: u64,
    /// Buffers taken back from dropped tensors.
    pub returned: u64,
    /// Buffers (small ones included) freed to keep the pool under its capacity.
    pub evicted: u64,
    /// Small buffers handed out again.
    pub small_reused: u64,
    /// Small buffers taken back from dropped tensors.
    pub small_returned: u64,
    /// Bytes held now (small buffers with their per-buffer charge).
    pub held_bytes: usize,
}

/// This thread's counters for `S`.
pub fn stats<S: Scalar>() -> PoolStats {
    with_pool::<S, _>(|p| PoolStats {
        held_bytes: p.held,
        ..p.stats
    })
    .unwrap_or_default()
}

/// Frees every buffer this thread holds for `S` and resets its counters.
pub fn clear<S: Scalar>() {
    with_pool::<S, _>(|p| {
        p.buckets.clear();
        p.small.clear();
        p.held = 0;
        p.stats = PoolStats::default();
    });
}

/// Whether a buffer of `len` elements of `S` is pooled by exact length (else, when not empty, it
/// belongs to a small size class).
#[inline]
pub(crate) fn is_pooled<S>(len: usize) -> bool {
    len.saturating_mul(std::mem::size_of::<S>()) >= MIN_POOLED_BYTES
}

/// An unshared buffer of exactly `len` elements holding a dropped tensor's values, if the pool
/// has one (the caller overwrites it).
#[inline]
pub(crate) fn take<S: Scalar>(len: usize) -> Option<AlignedBuf<S>> {
    if len == 0 {
        return None;
    }
    with_pool::<S, _>(|p| p.take(len)).flatten()
}

/// Takes `buf` into the pool when it is the last holder of a non-empty buffer; otherwise (or
/// when the pool declines it) drops it, which frees it or lowers its count as usual.
#[inline]
pub(crate) fn give_back<S: Scalar>(buf: AlignedBuf<S>) {
    // A tensor buffer has no weak references, so a count of one means this is the last holder.
    if buf.len() == 0 || !buf.is_unique() {
        return;
    }
    // A pool that cannot be reached (thread teardown, in use further up) drops the buffer here.
    let mut slot = Some(buf);
    with_pool::<S, _>(|p| {
        if let Some(buf) = slot.take() {
            p.put(buf)
        }
    });
}

struct Bucket<S> {
    len: usize,
    bufs: Vec<AlignedBuf<S>>,
    last_use: u64,
}

struct Pool<S> {
    /// Exact lengths of at least `MIN_POOLED_BYTES`.
    buckets: Vec<Bucket<S>>,
    /// Small buffers, `small[len - 1]` holding those of `len` elements.
    small: Vec<Vec<AlignedBuf<S>>>,
    held: usize,
    clock: u64,
    stats: PoolStats,
}

impl<S: Scalar> Pool<S> {
    const fn new() -> Self {
        Pool {
            buckets: Vec::new(),
            small: Vec::new(),
            held: 0,
            clock: 0,
            stats: PoolStats {
                reused: 0,
                allocated: 0,
                returned: 0,
                evicted: 0,
                small_reused: 0,
                small_returned: 0,
                held_bytes: 0,
            },
        }
    }

    #[inline]
    fn take(&mut self, len: usize) -> Option<AlignedBuf<S>> {
        if !is_pooled::<S>(len) {
            let buf = self.small.get_mut(len - 1)?.pop()?;
            self.held -= small_charge::<S>(len);
            self.stats.small_reused += 1;
            return Some(buf);
        }
        self.clock += 1;
        let found = self
            .buckets
            .iter_mut()
            .find(|b| b.len == len)
            .and_then(|b| {
                b.last_use = self.clock;
                b.bufs.pop()
            });
        match &found {
            Some(buf) => {
                self.held -= buf.nbytes();
                self.stats.reused += 1;
            }
            None => self.stats.allocated += 1,
        }
        found
    }

    #[inline]
    fn put(&mut self, buf: AlignedBuf<S>) {
        let len = buf.len();
        let cap = capacity();
        if !is_pooled::<S>(len) {
            // Small buffers never evict anything: past the capacity they are freed as usual
            // (and a large one returned past the capacity evicts them first).
            let charge = small_charge::<S>(len);
            if self.held + charge > cap {
                return;
            }
            if self.small.len() < len {
                self.small.resize_with(len, Vec::new);
            }
            self.small[len - 1].push(buf);
            self.held += charge;
            self.stats.small_returned += 1;
            return;
        }
        let bytes = buf.nbytes();
        if bytes > cap {
            return;
        }
        self.clock += 1;
        match self.buckets.iter_mut().find(|b| b.len == len) {
            Some(b) => {
                b.last_use = self.clock;
                b.bufs.push(buf);
            }
            None => self.buckets.push(Bucket {
                len,
                bufs: vec![buf],
                last_use: self.clock,
            }),
        }
        self.held += bytes;
        self.stats.returned += 1;
        while self.held > cap {
            self.evict_one();
        }
    }

    /// Frees a small buffer if any is held (they are the cheapest to make again), else one of
    /// the least recently used length (the one just returned is the most recent, so it goes
    /// last).
    fn evict_one(&mut self) {
        if self.evict_small() {
            return;
        }
        let Some(i) = (0..self.buckets.len()).min_by_key(|&i| self.buckets[i].last_use) else {
            self.held = 0;
            return;
        };
        if let Some(buf) = self.buckets[i].bufs.pop() {
            self.held -= buf.nbytes();
            self.stats.evicted += 1;
        }
        if self.buckets[i].bufs.is_empty() {
            self.buckets.swap_remove(i);
        }
    }
}

impl<S> Pool<S> {
    /// Frees one small buffer of the longest length held; false when none is held.
    fn evict_small(&mut self) -> bool {
        while let Some(class) = self.small.last_mut() {
            if let Some(buf) = class.pop() {
                self.held -= small_charge::<S>(buf.len());
                self.stats.evicted += 1;
                return true;
            }
            self.small.pop();
        }
        false
    }
}

/// What a small buffer of `len` elements counts against the capacity.
fn small_charge<S>(len: usize) -> usize {
    len * std::mem::size_of::<S>() + SMALL_OVERHEAD
}

thread_local! {
    // One cell per scalar type: a use of one never finds the other borrowed, and the access is a
    // single thread-local lookup.
    static F32: RefCell<Pool<f32>> = const { RefCell::new(Pool::new()) };
    static F64: RefCell<Pool<f64>> = const { RefCell::new(Pool::new()) };
}

/// Runs `f` on this thread's pool for `S`; `None` while the thread is being torn down, when the
/// pool is already in use further up the stack, or for a scalar type without a pool.
#[inline]
fn with_pool<S: Scalar, R>(f: impl FnOnce(&mut Pool<S>) -> R) -> Option<R> {
    match S::DTYPE {
        DType::F32 => run(&F32, f),
        DType::F64 => run(&F64, f),
    }
}

/// `f` on the pool behind `key` when it is the pool for `S` (always, as `with_pool` picks it).
#[inline]
fn run<T: 'static, S: 'static, R>(
    key: &'static LocalKey<RefCell<Pool<T>>>,
    f: impl FnOnce(&mut Pool<S>) -> R,
) -> Option<R> {
    key.try_with(|cell| {
        let mut pool = cell.try_borrow_mut().ok()?;
        let pool: &mut dyn Any = &mut *pool;
        pool.downcast_mut::<Pool<S>>().map(f)
    })
    .ok()
    .flatten()
}
