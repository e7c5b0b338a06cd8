//! Shared helpers for the tensor property tests: naive row-major index arithmetic, deterministic
//! fills (small integers, so sums are exact, or arbitrary floats), the NumPy broadcast rule written
//! out by hand, and proptest strategies for shapes of rank 0..5 with zero-size dimensions.
#![allow(dead_code)]

use proptest::prelude::*;
use tapegrad_tensor::{Scalar, Tensor};

/// `cases` proptest cases natively; under Miri, which interprets every instruction (about a
/// thousand times slower), 4 cases and no failure-persistence file (Miri isolates the file system).
pub fn config(cases: u32) -> ProptestConfig {
    if cfg!(miri) {
        ProptestConfig {
            cases: 4,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    } else {
        ProptestConfig::with_cases(cases)
    }
}

/// Element count of `dims` (1 for a scalar).
pub fn numel(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// Row-major linear position of `idx` in `dims`.
pub fn ravel(idx: &[usize], dims: &[usize]) -> usize {
    assert_eq!(idx.len(), dims.len());
    idx.iter().zip(dims).fold(0, |acc, (&i, &d)| {
        assert!(i < d, "index {idx:?} outside {dims:?}");
        acc * d + i
    })
}

/// Every multi-index of `dims` in row-major order (one empty index for a scalar, none when empty).
pub fn indices(dims: &[usize]) -> Vec<Vec<usize>> {
    let mut all = vec![Vec::new()];
    for &d in dims {
        all = all
            .into_iter()
            .flat_map(|prefix| {
                (0..d).map(move |i| {
                    let mut v = prefix.clone();
                    v.push(i);
                    v
                })
            })
            .collect();
    }
    all
}

/// SplitMix64: a tiny deterministic generator, so each proptest case reproduces from its seed.
pub struct Mix(pub u64);

impl Mix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * unit
    }
}

/// `n` integers in -5..=5: products and sums of a few of them are exact in f32 and f64.
pub fn small_ints(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = Mix(seed);
    (0..n).map(|_| (rng.next_u64() % 11) as f64 - 5.0).collect()
}

/// `n` arbitrary floats in [-scale, scale).
pub fn floats(n: usize, seed: u64, scale: f64) -> Vec<f64> {
    let mut rng = Mix(seed);
    (0..n).map(|_| rng.uniform(-scale, scale)).collect()
}

/// A tensor of shape `dims` from f64 values rounded to `S`.
pub fn tensor<S: Scalar>(dims: &[usize], values: &[f64]) -> Tensor<S> {
    Tensor::from_f64(dims, values).expect("test tensor")
}

/// The NumPy broadcast rule, written independently: right-align, pad with ones, and in each
/// position the dims must be equal or one of them 1 (which then takes the other, even 0).
pub fn numpy_broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let pad = |s: &[usize]| {
        let mut v = vec![1; rank - s.len()];
        v.extend_from_slice(s);
        v
    };
    pad(a)
        .into_iter()
        .zip(pad(b))
        .map(|(x, y)| match (x, y) {
            _ if x == y => Some(x),
            (1, _) => Some(y),
            (_, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// The index into an operand of shape `src` that the output index `out_idx` reads under
/// broadcasting (leading output axes dropped, size-1 axes pinned at 0).
pub fn broadcast_source_index(out_idx: &[usize], src: &[usize]) -> Vec<usize> {
    let offset = out_idx.len() - src.len();
    src.iter()
        .enumerate()
        .map(|(i, &d)| if d == 1 { 0 } else { out_idx[offset + i] })
        .collect()
}

/// Dims of rank `0..=max_rank`, each in `0..=max_dim`.
pub fn dims(max_rank: usize, max_dim: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0..=max_dim, 0..=max_rank)
}

/// Dims of rank `0..=max_rank`, each in `1..=max_dim` (no empty tensors).
pub fn nonempty_dims(max_rank: usize, max_dim: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1..=max_dim, 0..=max_rank)
}

/// A shape that broadcasts to `out`: itself, a scalar, a trailing suffix of it, or a random mix of
/// dropped leading axes and axes replaced by 1, so that every `binary_map` path gets exercised.
pub fn broadcastable_to(out: Vec<usize>) -> impl Strategy<Value = Vec<usize>> {
    let rank = out.len();
    let suffix = out.clone();
    let mixed = out.clone();
    prop_oneof![
        Just(out.clone()),
        Just(Vec::new()),
        Just(vec![1; rank]),
        (0..=rank).prop_map(move |drop| suffix[drop..].to_vec()),
        (0..=rank, prop::collection::vec(any::<bool>(), rank)).prop_map(move |(drop, ones)| {
            mixed
                .iter()
                .zip(&ones)
                .skip(drop)
                .map(|(&d, &one)| if one { 1 } else { d })
                .collect()
        }),
    ]
}

/// A sorted subset of `0..rank`, as a mask turned into axes.
pub fn axes_subset(rank: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(any::<bool>(), rank)
        .prop_map(|mask| (0..mask.len()).filter(|&i| mask[i]).collect())
}

/// Bitwise equality of two float slices (NaN equal to NaN of the same bits, -0 distinct from +0).
pub fn same_bits<S: Scalar>(a: &[S], b: &[S]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
}
