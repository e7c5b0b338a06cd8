//! The seeded order of the data: a Fisher-Yates split into train and validation rows, and
//! `BatchOrder`, which walks the training rows in a freshly shuffled order each epoch. Its whole
//! position is `(epoch, cursor)`: the permutation of an epoch is recomputed from the seed.

use crate::rng::{shuffle_rng, split_rng};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tapegrad_core::{Error, Result};

fn shuffle(items: &mut [usize], rng: &mut ChaCha8Rng) {
    for i in (1..items.len()).rev() {
        let j = rng.random_range(0..=i);
        items.swap(i, j);
    }
}

/// Shuffles `0..n` with the run's seed and returns `(train, validation)` row indices, the
/// validation part holding `round(n * val_fraction)` rows (at least one, when `n >= 2`).
pub fn split_indices(n: usize, val_fraction: f64, seed: u64) -> Result<(Vec<usize>, Vec<usize>)> {
    if !(0.0..1.0).contains(&val_fraction) {
        return Err(Error::invalid(
            "split",
            format!("the validation fraction must lie in [0, 1), found {val_fraction}"),
        ));
    }
    let mut idx: Vec<usize> = (0..n).collect();
    shuffle(&mut idx, &mut split_rng(seed));
    let mut n_val = (n as f64 * val_fraction).round() as usize;
    if val_fraction > 0.0 && n >= 2 {
        n_val = n_val.clamp(1, n - 1);
    }
    let val = idx.split_off(n - n_val);
    Ok((idx, val))
}

/// Where the trainer is in the stream of mini-batches.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchOrder {
    rows: usize,
    batch_size: usize,
    seed: u64,
    epoch: u64,
    cursor: usize,
    perm: Vec<usize>,
}

impl BatchOrder {
    /// The order at the start of epoch 0.
    pub fn new(rows: usize, batch_size: usize, seed: u64) -> Result<Self> {
        Self::at(rows, batch_size, seed, 0, 0)
    }

    /// The order at `(epoch, cursor)` (as saved in a checkpoint).
    pub fn at(
        rows: usize,
        batch_size: usize,
        seed: u64,
        epoch: u64,
        cursor: usize,
    ) -> Result<Self> {
        if rows == 0 {
            return Err(Error::invalid("batches", "the training split has no rows"));
        }
        if batch_size == 0 {
            return Err(Error::invalid(
                "batches",
                "the batch size must be at least 1",
            ));
        }
        if cursor >= rows {
            return Err(Error::invalid(
                "batches",
                format!("cursor {cursor} is past the {rows} training rows"),
            ));
        }
        let mut order = BatchOrder {
            rows,
            batch_size,
            seed,
            epoch,
            cursor,
            perm: Vec::new(),
        };
        order.reshuffle();
        Ok(order)
    }

    fn reshuffle(&mut self) {
        self.perm = (0..self.rows).collect();
        shuffle(&mut self.perm, &mut shuffle_rng(self.seed, self.epoch));
    }

    /// The rows of the next mini-batch (the last batch of an epoch may be smaller, as PyTorch's
    /// `DataLoader` with `drop_last=False`).
    pub fn next_batch(&mut self) -> Vec<usize> {
        // Both come from user input (a flag, a checkpoint's config and metadata): saturate.
        let end = self.cursor.saturating_add(self.batch_size).min(self.rows);
        let batch = self.perm[self.cursor..end].to_vec();
        self.cursor = end;
        if self.cursor == self.rows {
            self.epoch = self.epoch.saturating_add(1);
            self.cursor = 0;
            self.reshuffle();
        }
        batch
    }

    /// Completed epochs.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Position within the current epoch's permutation.
    pub fn cursor(&self) -> usize {
        self.cursor
    }

    /// The batch size.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Mini-batches per epoch.
    pub fn batches_per_epoch(&self) -> usize {
        self.rows.div_ceil(self.batch_size)
    }
}
