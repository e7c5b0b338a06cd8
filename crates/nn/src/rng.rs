//! The seeded random streams of a run. Each purpose (initialisation, the train/validation split,
//! the shuffle of epoch `e`, the dropout masks of step `t`) gets its own ChaCha8 stream derived
//! from the run's seed, so resuming at a step needs only the step and epoch numbers, never a
//! generator's internal position.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

const INIT: u64 = 0x696e_6974;
const SPLIT: u64 = 0x7370_6c69;
const SHUFFLE: u64 = 0x7368_7566;
const DROPOUT: u64 = 0x6472_6f70;
const WINDOWS: u64 = 0x7769_6e64;
const DROPOUT_MICRO: u64 = 0x6d69_6372;

fn stream(seed: u64, purpose: u64, index: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ purpose.rotate_left(32));
    rng.set_stream(index);
    rng
}

/// The stream parameter initialisers draw from.
pub fn init_rng(seed: u64) -> ChaCha8Rng {
    stream(seed, INIT, 0)
}

/// The stream that shuffles rows before the train/validation split.
pub fn split_rng(seed: u64) -> ChaCha8Rng {
    stream(seed, SPLIT, 0)
}

/// The stream that orders the training rows in epoch `epoch`.
pub fn shuffle_rng(seed: u64, epoch: u64) -> ChaCha8Rng {
    stream(seed, SHUFFLE, epoch)
}

/// The stream dropout masks of optimizer step `step` are drawn from.
pub fn dropout_rng(seed: u64, step: u64) -> ChaCha8Rng {
    stream(seed, DROPOUT, step)
}

/// The stream a language model's training windows of optimizer step `step` are drawn from.
pub fn window_rng(seed: u64, step: u64) -> ChaCha8Rng {
    stream(seed, WINDOWS, step)
}

/// The stream dropout masks of micro-batch `micro` of optimizer step `step` are drawn from, when
/// a step is cut into micro-batches (gradient accumulation, data-parallel ranks).
pub fn dropout_micro_rng(seed: u64, step: u64, micro: u64) -> ChaCha8Rng {
    stream(
        seed ^ micro.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        DROPOUT_MICRO,
        step,
    )
}
