//! The buffer pool's small size classes: a one- or few-element buffer dropped by its last holder
//! is handed to the next tensor of its length, shared buffers stay shared until written
//! (copy-on-write), and every constructor overwrites a recycled buffer's stale values.

use tapegrad_tensor::{pool, Shape, Tensor};

fn shape(dims: &[usize]) -> Shape {
    Shape::new(dims).unwrap()
}

#[test]
fn a_dropped_small_buffer_is_reused_by_the_next_tensor_of_its_length() {
    let a = Tensor::<f32>::full(&shape(&[3]), 2.5);
    let addr = a.data().as_ptr();
    let before = pool::stats::<f32>();
    drop(a);
    let after_drop = pool::stats::<f32>();
    assert_eq!(after_drop.small_returned, before.small_returned + 1);
    // The large-buffer counters do not move for small buffers.
    assert_eq!(after_drop.returned, before.returned);
    // Another length does not take it.
    let other = Tensor::<f32>::full(&shape(&[2]), 1.0);
    assert_ne!(other.data().as_ptr(), addr);
    let b = Tensor::<f32>::full(&shape(&[3]), -1.0);
    assert_eq!(b.data().as_ptr(), addr, "the small buffer was not reused");
    assert_eq!(b.data(), &[-1.0, -1.0, -1.0]);
    assert_eq!(
        pool::stats::<f32>().small_reused,
        after_drop.small_reused + 1
    );
}

#[test]
fn a_shared_small_buffer_is_not_recycled_until_its_last_holder_drops_it() {
    let a = Tensor::<f64>::full(&shape(&[2]), 4.0);
    let b = a.clone();
    assert!(a.shares_buffer_with(&b));
    let before = pool::stats::<f64>();
    drop(a);
    assert_eq!(pool::stats::<f64>().small_returned, before.small_returned);
    // The surviving holder still reads its values, and a new tensor does not take the buffer.
    let c = Tensor::<f64>::full(&shape(&[2]), 7.0);
    assert!(!c.shares_buffer_with(&b));
    assert_eq!(b.data(), &[4.0, 4.0]);
    assert_eq!(c.data(), &[7.0, 7.0]);
    drop(b);
    assert_eq!(
        pool::stats::<f64>().small_returned,
        before.small_returned + 1
    );
}

#[test]
fn one_element_tensors_hold_their_element_and_never_touch_the_pool() {
    let before = pool::stats::<f32>();
    let a = Tensor::<f32>::scalar(4.0);
    let mut b = a.clone();
    let r = a.reshape(&[1, 1]).unwrap();
    // A clone or a reshape is a copy of the element, so writing one leaves the others as they were.
    assert!(!a.shares_buffer_with(&b) && !a.shares_buffer_with(&r));
    b.data_mut()[0] = -1.5;
    assert_eq!(
        (a.item().unwrap(), b.item().unwrap(), r.item().unwrap()),
        (4.0, -1.5, 4.0)
    );
    let made = [
        Tensor::<f32>::full(&shape(&[1]), 2.0),
        Tensor::<f32>::new(&[1, 1, 1], vec![3.0]).unwrap(),
        Tensor::<f32>::from_iter_exact(shape(&[1]), [5.0]).unwrap(),
        a.map(|v| v + 1.0),
        a.zip_map(&b, "add", |x, y| x + y).unwrap(),
    ];
    let values: Vec<f32> = made.iter().map(|t| t.item().unwrap()).collect();
    assert_eq!(values, [2.0, 3.0, 5.0, 5.0, 2.5]);
    assert_eq!(made[1].dims(), &[1, 1, 1]);
    drop((a, b, r, made));
    // The inline element costs no room: a tensor is its shape and a shared buffer's handle.
    assert_eq!(std::mem::size_of::<Tensor<f64>>(), 72);
    let after = pool::stats::<f32>();
    assert_eq!(
        (after.small_reused, after.small_returned),
        (before.small_reused, before.small_returned)
    );
}

#[test]
fn writing_a_shared_small_tensor_copies_it_first() {
    let a = Tensor::<f32>::new(&[2], vec![1.0, 2.0]).unwrap();
    let mut b = a.clone();
    b.data_mut()[0] = 10.0;
    assert!(!a.shares_buffer_with(&b));
    assert_eq!(a.data(), &[1.0, 2.0]);
    assert_eq!(b.data(), &[10.0, 2.0]);
    // An unshared tensor is written in place.
    let addr = b.data().as_ptr();
    b.data_mut()[1] = 20.0;
    assert_eq!(b.data().as_ptr(), addr);
    assert_eq!(b.data(), &[10.0, 20.0]);
}

#[test]
fn recycled_small_buffers_never_leak_stale_values() {
    let len = 5;
    for round in 0..3 {
        let stale = Tensor::<f32>::full(&shape(&[len]), f32::NAN);
        drop(stale);
        let x = Tensor::<f32>::new(&[len], (0..len).map(|i| i as f32).collect()).unwrap();
        let doubled = x.map(|v| 2.0 * v);
        drop(Tensor::<f32>::full(&shape(&[len]), f32::INFINITY));
        let sum = doubled.zip_map(&x, "add", |a, b| a + b).unwrap();
        drop(Tensor::<f32>::full(&shape(&[len]), f32::NAN));
        let zeros = Tensor::<f32>::zeros(&shape(&[len]));
        let expected: Vec<f32> = (0..len).map(|i| 3.0 * i as f32).collect();
        assert_eq!(sum.data(), &expected[..], "round {round}");
        assert!(zeros.is_all_zero(), "round {round}");
    }
}

#[test]
fn clear_frees_small_buffers_too() {
    drop(Tensor::<f64>::full(&shape(&[6]), 1.0));
    assert!(pool::stats::<f64>().held_bytes > 0);
    pool::clear::<f64>();
    let stats = pool::stats::<f64>();
    assert_eq!(stats.held_bytes, 0);
    let addr_before = {
        let t = Tensor::<f64>::full(&shape(&[6]), 2.0);
        assert_eq!(pool::stats::<f64>().small_reused, 0);
        t.data().as_ptr()
    };
    // The buffer just dropped is the one the next tensor of its length gets.
    let t = Tensor::<f64>::full(&shape(&[6]), 3.0);
    assert_eq!(t.data().as_ptr(), addr_before);
}

/// Yields `yields` values (1.0, 2.0, ...) while its `len()` claims `claims`.
struct LyingLen {
    yields: usize,
    claims: usize,
    next: usize,
}

impl Iterator for LyingLen {
    type Item = f32;
    fn next(&mut self) -> Option<f32> {
        (self.next < self.yields).then(|| {
            self.next += 1;
            self.next as f32
        })
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.claims.saturating_sub(self.next);
        (left, Some(left))
    }
}

impl ExactSizeIterator for LyingLen {}

#[test]
fn from_iter_exact_counts_what_the_iterator_yields_not_what_len_claims() {
    let liar = |yields, claims| LyingLen {
        yields,
        claims,
        next: 0,
    };
    for len in [1, 3, 5, 4096] {
        let s = shape(&[len]);
        for (yields, claims) in [(len - 1, len), (len + 2, len), (0, len), (len + 1, len + 1)] {
            // A recycled buffer of this length full of stale NaNs, for the short iterator to
            // leave behind if it were trusted.
            drop(Tensor::<f32>::full(&s, f32::NAN));
            match Tensor::<f32>::from_iter_exact(s.clone(), liar(yields, claims)) {
                Err(tapegrad_tensor::Error::DataLength {
                    len: got, numel, ..
                }) => {
                    assert_eq!((got, numel), (yields, len), "len {len} claims {claims}")
                }
                other => panic!("len {len}, yields {yields}, claims {claims}: {other:?}"),
            }
        }
        // An iterator that yields the right count is taken whatever its `len()` said.
        drop(Tensor::<f32>::full(&s, f32::NAN));
        let t = Tensor::<f32>::from_iter_exact(s.clone(), liar(len, len + 7)).unwrap();
        let expected: Vec<f32> = (1..=len).map(|i| i as f32).collect();
        assert_eq!(t.data(), &expected[..]);
    }
}
