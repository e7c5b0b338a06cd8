//! The pool's capacity bounds the small size classes too: with recycling off nothing is held,
//! and a small buffer that would pass the capacity is freed instead of kept. (A file of its own:
//! the capacity is process-wide, so it must not change under other tests.)

use tapegrad_tensor::{pool, Shape, Tensor};

#[test]
fn small_buffers_respect_the_capacity() {
    // Two elements: a one-element tensor holds its element itself and never reaches the pool.
    let two = Shape::new([2]).unwrap();
    pool::clear::<f32>();
    pool::set_capacity(0);
    drop(Tensor::<f32>::full(&two, 1.0));
    let off = pool::stats::<f32>();
    assert_eq!(off.small_returned, 0);
    assert_eq!(off.held_bytes, 0);

    // Room for exactly two two-element buffers (element bytes plus the two `Arc` counts).
    let each = 2 * std::mem::size_of::<f32>() + 2 * std::mem::size_of::<usize>();
    pool::set_capacity(2 * each);
    let ts: Vec<_> = (0..3)
        .map(|i| Tensor::<f32>::full(&two, i as f32))
        .collect();
    drop(ts);
    let held = pool::stats::<f32>();
    assert_eq!(held.small_returned, 2);
    assert_eq!(held.held_bytes, 2 * each);

    // A large buffer that needs the room evicts the small ones first.
    let big = Tensor::<f32>::full(&Shape::new([256]).unwrap(), 0.5);
    pool::set_capacity(1024);
    drop(big);
    let after = pool::stats::<f32>();
    assert_eq!(after.returned, 1);
    assert_eq!(after.held_bytes, 1024);
    assert_eq!(after.evicted, 2);
    pool::set_capacity(pool::DEFAULT_CAPACITY);
}
