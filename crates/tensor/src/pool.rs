//! Recycled tensor buffers: a bounded, per-thread pool of unshared buffers, one per scalar type,
//! keyed by exact length. A tensor buffer returns here when its last holder drops it, and kernels
//! take their outputs from here, so a training step whose shapes repeat allocates nothing.
//!
//! Only buffers of at least [`MIN_POOLED_BYTES`] take part (a tiny tensor's malloc is cheaper
//! than the pool's bookkeeping). Each thread holds at most [`capacity`] bytes per scalar type;
//! past that the least recently used lengths are freed first. Reused buffers keep the values
//! of the tensor that dropped them: constructors either overwrite every element or say so.

use crate::{DType, Scalar};
use std::any::Any;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Buffers smaller than this are allocated and freed as usual.
pub const MIN_POOLED_BYTES: usize = 1024;

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
pub fn capacity() -> usize {
    CAPACITY.load(Ordering::Relaxed)
}

/// Counters of this thread's pool for one scalar type, since the thread started or the last
/// [`clear`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Buffers handed out again.
    pub reused: u64,
    /// Pooled-size requests that found no buffer of their length (and allocated one).
    pub allocated: u64,
    /// Buffers taken back from dropped tensors.
    pub returned: u64,
    /// Buffers freed to keep the pool under its capacity.
    pub evicted: u64,
    /// Bytes held now.
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
        p.held = 0;
        p.stats = PoolStats::default();
    });
}

/// Whether a buffer of `len` elements of `S` takes part.
#[inline]
pub(crate) fn is_pooled<S>(len: usize) -> bool {
    len.saturating_mul(std::mem::size_of::<S>()) >= MIN_POOLED_BYTES
}

/// An unshared buffer of exactly `len` elements holding a dropped tensor's values, if the pool
/// has one (the caller overwrites it).
pub(crate) fn take<S: Scalar>(len: usize) -> Option<Arc<[S]>> {
    if !is_pooled::<S>(len) {
        return None;
    }
    with_pool::<S, _>(|p| p.take(len)).flatten()
}

/// Takes `buf` into the pool when it is the last holder of a pooled-size buffer, leaving an
/// empty buffer in its place; otherwise leaves it alone (dropping it then frees it or lowers
/// its count as usual).
pub(crate) fn give_back<S: Scalar>(buf: &mut Arc<[S]>) {
    if !is_pooled::<S>(buf.len()) || Arc::get_mut(buf).is_none() {
        return;
    }
    with_pool::<S, _>(|p| p.put(buf));
}

struct Bucket<S> {
    len: usize,
    bufs: Vec<Arc<[S]>>,
    last_use: u64,
}

struct Pool<S> {
    buckets: Vec<Bucket<S>>,
    held: usize,
    clock: u64,
    stats: PoolStats,
    /// Put in place of a buffer taken into the pool (an empty `Arc<[S]>` is itself allocated).
    empty: Option<Arc<[S]>>,
}

impl<S: Scalar> Pool<S> {
    const fn new() -> Self {
        Pool {
            buckets: Vec::new(),
            held: 0,
            clock: 0,
            stats: PoolStats {
                reused: 0,
                allocated: 0,
                returned: 0,
                evicted: 0,
                held_bytes: 0,
            },
            empty: None,
        }
    }

    fn take(&mut self, len: usize) -> Option<Arc<[S]>> {
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
                self.held -= std::mem::size_of_val::<[S]>(buf);
                self.stats.reused += 1;
            }
            None => self.stats.allocated += 1,
        }
        found
    }

    fn put(&mut self, slot: &mut Arc<[S]>) {
        let bytes = std::mem::size_of_val::<[S]>(slot);
        let cap = capacity();
        if bytes > cap {
            return;
        }
        let empty = self
            .empty
            .get_or_insert_with(|| Arc::from(Vec::new()))
            .clone();
        let buf = std::mem::replace(slot, empty);
        self.clock += 1;
        let len = buf.len();
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

    /// Frees one buffer of the least recently used length (the one just returned is the most
    /// recent, so it goes last).
    fn evict_one(&mut self) {
        let Some(i) = (0..self.buckets.len()).min_by_key(|&i| self.buckets[i].last_use) else {
            self.held = 0;
            return;
        };
        if let Some(buf) = self.buckets[i].bufs.pop() {
            self.held -= std::mem::size_of_val::<[S]>(&buf);
            self.stats.evicted += 1;
        }
        if self.buckets[i].bufs.is_empty() {
            self.buckets.swap_remove(i);
        }
    }
}

struct Pools {
    f32: Pool<f32>,
    f64: Pool<f64>,
}

thread_local! {
    static POOLS: RefCell<Pools> = const {
        RefCell::new(Pools {
            f32: Pool::new(),
            f64: Pool::new(),
        })
    };
}

/// Runs `f` on this thread's pool for `S`; `None` while the thread is being torn down, when the
/// pool is already in use further up the stack, or for a scalar type without a pool.
fn with_pool<S: Scalar, R>(f: impl FnOnce(&mut Pool<S>) -> R) -> Option<R> {
    POOLS
        .try_with(|cell| {
            let mut pools = cell.try_borrow_mut().ok()?;
            let pool: &mut dyn Any = match S::DTYPE {
                DType::F32 => &mut pools.f32,
                DType::F64 => &mut pools.f64,
            };
            pool.downcast_mut::<Pool<S>>().map(f)
        })
        .ok()
        .flatten()
}
