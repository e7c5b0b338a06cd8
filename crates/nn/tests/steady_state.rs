//! The steady state of a training step allocates no large buffers: after a warm-up, every
//! activation, gradient and cotangent buffer of an MLP step (eager and compiled backends, SGD,
//! f32 and f64) comes from the tensor buffer pool. A counting global allocator watches the
//! test's own thread. The GEMM library packs its operands into scratch it allocates per call,
//! 128-byte aligned, next to a `Vec<bool>` of flags; tapegrad never asks for more than 64-byte
//! alignment (its tensor buffers), nor for large byte vectors in a step, so allocations aligned
//! beyond that and large byte-aligned ones are counted apart as the library's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use tapegrad_nn::data::{Batch, BatchTargets};
use tapegrad_nn::layers::Activation;
use tapegrad_nn::rng::dropout_rng;
use tapegrad_nn::{make_backend, BackendKind, Model, ModelSpec, Optimizer, OptimizerConfig};
use tapegrad_tensor::{pool, Scalar, Shape, Tensor};

/// Allocations of at least this many bytes count as large (the pool's own threshold).
const LARGE: usize = pool::MIN_POOLED_BYTES;
/// Allocations at least this aligned (and large byte-aligned ones) are the GEMM library's scratch
/// (its cache-line alignment on x86-64 and aarch64; tensor buffers are 64-byte aligned, and count
/// as tapegrad's own).
const GEMM_SCRATCH_ALIGN: usize = 128;

thread_local! {
    static WATCHING: Cell<bool> = const { Cell::new(false) };
    static LARGE_ALLOCS: Cell<usize> = const { Cell::new(0) };
    static ALL_ALLOCS: Cell<usize> = const { Cell::new(0) };
    static SCRATCH_ALLOCS: Cell<usize> = const { Cell::new(0) };
}

/// The system allocator, counting the allocations of threads that asked to be watched.
struct Counting;

fn count(layout: Layout) {
    // `try_with`: the allocator also runs while thread-locals are torn down.
    let _ = WATCHING.try_with(|w| {
        if w.get() {
            let gemm_flags = layout.align() == 1 && layout.size() >= LARGE;
            let counter = if layout.align() >= GEMM_SCRATCH_ALIGN || gemm_flags {
                &SCRATCH_ALLOCS
            } else if layout.size() >= LARGE {
                &LARGE_ALLOCS
            } else {
                &ALL_ALLOCS
            };
            counter.with(|c| c.set(c.get() + 1));
        }
    });
}

// SAFETY: every method forwards its arguments unchanged to `System`, which upholds the
// `GlobalAlloc` contract; the counting touches only const-initialised thread-local cells, which
// never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout);
        // SAFETY: forwarded as received (the caller upholds `alloc`'s contract).
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // A layout's size and alignment are valid together, so this one is too.
        count(Layout::from_size_align(new_size, layout.align()).unwrap_or(layout));
        // SAFETY: `ptr` and `layout` come from this allocator, which is `System`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `realloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations made by `f` on this thread.
#[derive(Debug)]
struct Allocations {
    /// Our own of at least `LARGE` bytes.
    large: usize,
    /// Our own below `LARGE` bytes.
    small: usize,
    /// The GEMM library's packing scratch.
    gemm_scratch: usize,
}

fn allocations(f: impl FnOnce()) -> Allocations {
    for c in [&LARGE_ALLOCS, &ALL_ALLOCS, &SCRATCH_ALLOCS] {
        c.with(|c| c.set(0));
    }
    WATCHING.with(|w| w.set(true));
    f();
    WATCHING.with(|w| w.set(false));
    Allocations {
        large: LARGE_ALLOCS.with(Cell::get),
        small: ALL_ALLOCS.with(Cell::get),
        gemm_scratch: SCRATCH_ALLOCS.with(Cell::get),
    }
}

struct Run<S: Scalar> {
    model: Model<S>,
    batch: Batch<S>,
    backend: Box<dyn tapegrad_nn::Backend<S>>,
    optimizer: Optimizer<S>,
}

impl<S: Scalar> Run<S> {
    fn new(kind: BackendKind, rows: usize, momentum: bool) -> Run<S> {
        let mut config = OptimizerConfig::by_name("sgd", 0.01).unwrap();
        if let OptimizerConfig::Sgd { momentum: m, .. } = &mut config {
            *m = if momentum { 0.9 } else { 0.0 };
        }
        Run::with_optimizer(kind, rows, config)
    }

    fn with_optimizer(kind: BackendKind, rows: usize, config: OptimizerConfig) -> Run<S> {
        let spec = ModelSpec::Mlp {
            inputs: 100,
            hidden: vec![64, 32],
            outputs: 10,
            activation: Activation::Relu,
            dropout: 0.0,
        };
        let model = Model::new(&spec, 3).unwrap();
        let x: Vec<f64> = (0..rows * 100)
            .map(|i| ((i * 37) % 23) as f64 / 11.0 - 1.0)
            .collect();
        let x = Tensor::from_f64(&[rows, 100], &x).unwrap();
        let labels = (0..rows).map(|i| (i * 7) % 10).collect();
        let optimizer = Optimizer::new(config, &model.params).unwrap();
        Run {
            model,
            batch: Batch {
                x,
                y: BatchTargets::Classes(labels),
            },
            backend: make_backend(kind).unwrap(),
            optimizer,
        }
    }

    fn step(&mut self) -> f64 {
        let out = self
            .backend
            .train_step(&self.model, &self.batch, dropout_rng(0, 0))
            .unwrap();
        self.optimizer
            .step_grads(&mut self.model.params, out.grads, 0.01)
            .unwrap();
        out.loss
    }
}

/// After two warm-up steps, four more steps make no large allocation, and the pool served them.
fn assert_steady<S: Scalar>(kind: BackendKind, rows: usize, momentum: bool) {
    assert_steady_run(Run::<S>::new(kind, rows, momentum), kind, rows, 3);
}

/// `weight_grads`: the large gradient buffers a step must have taken from the pool.
fn assert_steady_run<S: Scalar>(
    mut run: Run<S>,
    kind: BackendKind,
    rows: usize,
    weight_grads: u64,
) {
    let first = run.step();
    run.step();
    let before = pool::stats::<S>();
    let mut last = first;
    let counted = allocations(|| {
        for _ in 0..4 {
            last = run.step();
        }
    });
    let after = pool::stats::<S>();
    let what = format!(
        "{} backend, {} rows, {}, {:?}",
        kind.name(),
        rows,
        S::DTYPE,
        run.optimizer.config()
    );
    assert_eq!(counted.large, 0, "{what}: in 4 steady steps {counted:?}");
    // The step's own bookkeeping (shapes beyond rank 4, tape and context lists) stays small;
    // the GEMM library packs its operands once per product at most (9 products a step), with
    // one flag vector beside each packing buffer.
    assert!(counted.small <= 4 * 64, "{what}: {counted:?}");
    assert!(counted.gemm_scratch <= 4 * 9 * 2, "{what}: {counted:?}");
    assert_eq!(after.allocated, before.allocated, "{what}: pool misses");
    // At least the weight gradients of each step.
    assert!(
        after.reused >= before.reused + 4 * weight_grads,
        "{what}: {after:?}"
    );
    // The steps really trained (the same batch, so the loss falls).
    assert!(last < first, "{what}: loss {first} -> {last}");
}

#[test]
fn eager_steps_reuse_every_large_buffer() {
    assert_steady::<f32>(BackendKind::Eager, 16, false);
    assert_steady::<f64>(BackendKind::Eager, 16, true);
    assert_steady::<f32>(BackendKind::Eager, 1, false);
}

#[test]
fn compiled_steps_reuse_every_large_buffer() {
    assert_steady::<f32>(BackendKind::Compiled, 16, false);
    assert_steady::<f64>(BackendKind::Compiled, 16, true);
    assert_steady::<f32>(BackendKind::Compiled, 1, false);
}

/// Every optimizer updates its parameters and state in place: with its state created in the
/// warm-up, a step of any of them allocates nothing large either (RMSProp once made three
/// parameter-sized vectors a tensor per step).
#[test]
fn every_optimizer_steps_in_place() {
    let configs = [
        OptimizerConfig::Sgd {
            lr: 0.01,
            momentum: 0.9,
            dampening: 0.1,
            nesterov: false,
            weight_decay: 1e-3,
        },
        OptimizerConfig::by_name("adam", 0.01).unwrap(),
        OptimizerConfig::by_name("adamw", 0.01).unwrap(),
        OptimizerConfig::RmsProp {
            lr: 0.01,
            alpha: 0.9,
            eps: 1e-8,
            weight_decay: 1e-3,
            momentum: 0.5,
            centered: true,
        },
        OptimizerConfig::by_name("rmsprop", 0.01).unwrap(),
        OptimizerConfig::by_name("adagrad", 0.01).unwrap(),
    ];
    for config in configs {
        let run = Run::<f32>::with_optimizer(BackendKind::Eager, 16, config);
        assert_steady_run(run, BackendKind::Eager, 16, 3);
    }
}

/// Plain SGD with factored gradients (as the trainer and the bench run it) steps in place at any
/// batch size. The one-row outer-product update reads the batch row in place, which is the start
/// of a tensor buffer and so 64-byte aligned (it once read a copy of a misaligned row, which had
/// to come from the pool).
#[test]
fn factored_plain_sgd_steps_in_place_at_any_batch_size() {
    const INPUTS: usize = 300; // a row of 1,200 bytes: above the pool's large threshold
    let batch = |rows: usize| {
        let x: Vec<f32> = (0..rows * INPUTS)
            .map(|i| ((i * 37) % 23) as f32 / 11.0 - 1.0)
            .collect();
        let x = Tensor::new(&[rows, INPUTS], x).unwrap();
        assert_eq!(
            x.data().as_ptr() as usize % tapegrad_tensor::BUFFER_ALIGN,
            0
        );
        x
    };
    for kind in [BackendKind::Eager, BackendKind::Compiled] {
        for rows in [1, 5] {
            let spec = ModelSpec::Mlp {
                inputs: INPUTS,
                hidden: vec![64, 32],
                outputs: 10,
                activation: Activation::Relu,
                dropout: 0.0,
            };
            let model = Model::new(&spec, 3).unwrap();
            let config = OptimizerConfig::by_name("sgd", 0.01).unwrap();
            let config = match config {
                OptimizerConfig::Sgd { lr, .. } => OptimizerConfig::Sgd {
                    lr,
                    momentum: 0.0,
                    dampening: 0.0,
                    nesterov: false,
                    weight_decay: 0.0,
                },
                other => panic!("sgd is {other:?}"),
            };
            let optimizer = Optimizer::new(config, &model.params).unwrap();
            let mut backend = make_backend(kind).unwrap();
            backend.set_factored_grads(true);
            let run = Run {
                model,
                batch: Batch {
                    x: batch(rows),
                    y: BatchTargets::Classes((0..rows).map(|i| (i * 7) % 10).collect()),
                },
                backend,
                optimizer,
            };
            // The first layer's weight gradient is handed over as its two factors.
            assert_steady_run(run, kind, rows, 2);
        }
    }
}

#[test]
fn a_dropped_buffer_is_reused_by_the_next_tensor_of_its_length() {
    let shape = Shape::new([32, 64]).unwrap();
    let a = Tensor::<f32>::full(&shape, 2.5);
    let addr = a.data().as_ptr();
    // A clone shares the buffer, so dropping one holder returns nothing.
    let b = a.clone();
    drop(a);
    let c = b.map(|v| v * 2.0);
    assert_ne!(c.data().as_ptr(), addr);
    drop(b);
    let d = c.map(|v| v + 1.0);
    assert_eq!(d.data().as_ptr(), addr, "the freed buffer was not reused");
    assert!(d.data().iter().all(|&v| v == 6.0));
    // Below the threshold nothing is pooled.
    let small = Tensor::<f32>::full(&Shape::new([4]).unwrap(), 1.0);
    let before = pool::stats::<f32>();
    drop(small);
    assert_eq!(pool::stats::<f32>().returned, before.returned);
}

/// The GPT's step (windows drawn, forward, backward, clipping, AdamW) at a small configuration
/// of the preset's model: after two warm-up steps, every tensor buffer of four more steps comes
/// from the pool. Unlike the MLP's step, the GPT's still allocates scratch outside the pool
/// (layer norm's running sums, attention's per-row copies, index lists, the tape's slot lists):
/// about fifty vectors a step, 1 to 23 KB each at this size, against 130-odd pooled buffers.
fn assert_gpt_steady<S: Scalar>(kind: BackendKind) {
    use tapegrad_nn::data::text::{TextData, TextSource};
    use tapegrad_nn::gpt::{GptConfig, GptPreset, GptRun};
    let context = 16;
    let data = TextData::load(&TextSource::Shakespeare, context).unwrap();
    let spec = ModelSpec::Gpt {
        vocab: data.vocab.len(),
        context,
        layers: 2,
        heads: 2,
        embd: 32,
        mlp_ratio: GptPreset::SHAKESPEARE.mlp_ratio,
        dropout: 0.0,
        tie_weights: false,
    };
    let config = GptConfig::preset(TextSource::Shakespeare, spec, 8, 100);
    let mut run = GptRun::<S>::new(config, data, make_backend(kind).unwrap()).unwrap();
    let first = run.train_step().unwrap().loss;
    run.train_step().unwrap();
    let before = pool::stats::<S>();
    let mut last = first;
    for _ in 0..4 {
        last = run.train_step().unwrap().loss;
    }
    let after = pool::stats::<S>();
    let what = format!("gpt, {} backend, {}", kind.name(), S::DTYPE);
    assert_eq!(after.allocated, before.allocated, "{what}: pool misses");
    // Every parameter's gradient at least (2 layers of 12 tensors, the two embeddings, the
    // final norm's two and the head), each step.
    assert!(after.reused >= before.reused + 4 * 29, "{what}: {after:?}");
    assert!(
        last.is_finite() && last < first,
        "{what}: loss {first} -> {last}"
    );
}

#[test]
fn gpt_steps_take_every_tensor_buffer_from_the_pool() {
    assert_gpt_steady::<f32>(BackendKind::Eager);
    assert_gpt_steady::<f32>(BackendKind::Compiled);
    assert_gpt_steady::<f64>(BackendKind::Eager);
}
