//! Character-level text for language models: the vocabulary (the sorted distinct characters of
//! the text), the text as ids, the last 10% of it held out for validation, training windows of
//! `context + 1` characters drawn from a seeded stream per step (so resuming needs only the step),
//! and fixed validation windows spread evenly over the held-out part.

use super::{embedded, Batch, BatchTargets};
use crate::error::{NnError, NnResult};
use crate::rng::window_rng;
use rand::Rng;
use serde::{Deserialize, Serialize};
use tapegrad_tensor::{Scalar, Tensor};

/// Where the text comes from (stored in checkpoints).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TextSource {
    /// The embedded Shakespeare plays (`data/shakespeare.txt.gz`).
    Shakespeare,
    /// A UTF-8 text file.
    File { path: String },
}

impl TextSource {
    /// The text, read and checked to be UTF-8 (an error says at which byte it is not).
    pub fn load(&self) -> NnResult<String> {
        match self {
            TextSource::Shakespeare => {
                embedded::gunzip("shakespeare.txt.gz", embedded::SHAKESPEARE_TXT_GZ)
            }
            TextSource::File { path } => {
                let bytes = std::fs::read(path).map_err(|e| NnError::io(path, e))?;
                String::from_utf8(bytes).map_err(|e| {
                    let at = e.utf8_error().valid_up_to();
                    NnError::data(
                        path.clone(),
                        format!(
                            "not UTF-8 text: the bytes at offset {at} are not a UTF-8 character"
                        ),
                    )
                })
            }
        }
    }

    /// A short description for headers.
    pub fn describe(&self) -> String {
        match self {
            TextSource::Shakespeare => "shakespeare (embedded, 7 plays)".into(),
            TextSource::File { path } => path.clone(),
        }
    }

    fn name(&self) -> String {
        match self {
            TextSource::Shakespeare => "shakespeare.txt.gz".into(),
            TextSource::File { path } => path.clone(),
        }
    }
}

/// A text split into training and validation ids over its character vocabulary.
#[derive(Debug, Clone, PartialEq)]
pub struct TextData {
    pub name: String,
    /// The sorted distinct characters; a character's id is its index here.
    pub vocab: Vec<char>,
    pub train: Vec<u32>,
    pub val: Vec<u32>,
}

impl TextData {
    /// Loads `source` and splits it for windows of `context + 1` characters.
    pub fn load(source: &TextSource, context: usize) -> NnResult<Self> {
        let text = source.load()?;
        Self::from_text(&source.name(), &text, context)
    }

    /// `text` with its own vocabulary, the last 10% of its characters held out. Errors name
    /// `name` and the problem: empty, or a part shorter than a window.
    pub fn from_text(name: &str, text: &str, context: usize) -> NnResult<Self> {
        let mut vocab: Vec<char> = text.chars().collect();
        vocab.sort_unstable();
        vocab.dedup();
        Self::with_vocab(name, text, vocab, context)
    }

    /// `text` over a given vocabulary (a checkpoint's): every character must be in it.
    pub fn with_vocab(name: &str, text: &str, vocab: Vec<char>, context: usize) -> NnResult<Self> {
        let err = |m: String| NnError::data(name, m);
        if text.is_empty() {
            return Err(err("the text is empty".into()));
        }
        if vocab.len() > u32::MAX as usize {
            return Err(err(format!(
                "{} distinct characters is too many",
                vocab.len()
            )));
        }
        let window = context
            .checked_add(1)
            .ok_or_else(|| err("context too large".into()))?;
        let ids = encode(&vocab, text).map_err(|(pos, c)| {
            err(format!(
                "character {c:?} at position {pos} is not in the vocabulary of {} characters",
                vocab.len()
            ))
        })?;
        let n = ids.len();
        let n_val = n / 10;
        let n_train = n - n_val;
        if n_train < window {
            return Err(err(format!(
                "the text has {n} characters; its training part ({n_train}, 90%) is shorter than a window of context + 1 = {window}"
            )));
        }
        if n_val < window {
            return Err(err(format!(
                "the text has {n} characters; its validation part ({n_val}, the last 10%) is shorter than a window of context + 1 = {window}: give a longer text or a shorter --context"
            )));
        }
        let val = ids[n_train..].to_vec();
        let mut train = ids;
        train.truncate(n_train);
        Ok(TextData {
            name: name.to_string(),
            vocab,
            train,
            val,
        })
    }

    /// The ids of `text`, or the first character (and its position) outside the vocabulary.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, (usize, char)> {
        encode(&self.vocab, text)
    }

    /// The text of `ids` (ids outside the vocabulary are skipped).
    pub fn decode(&self, ids: &[u32]) -> String {
        decode(&self.vocab, ids)
    }

    /// The training batch of step `step`: `batch` windows of `context + 1` characters at starts
    /// drawn uniformly from the step's stream; inputs `[batch, context]`, targets the next
    /// characters, batch-major.
    pub fn train_batch<S: Scalar>(
        &self,
        seed: u64,
        step: u64,
        batch: usize,
        context: usize,
    ) -> NnResult<Batch<S>> {
        let mut rng = window_rng(seed, step);
        let last = self.train.len() - (context + 1);
        let starts: Vec<usize> = (0..batch).map(|_| rng.random_range(0..=last)).collect();
        windows(&self.train, &starts, context)
    }

    /// The validation batches: `count` windows (fewer if the part is short) at evenly spaced
    /// starts over the held-out part, in batches of at most `batch`. The same every time.
    pub fn val_batches<S: Scalar>(
        &self,
        count: usize,
        batch: usize,
        context: usize,
    ) -> NnResult<Vec<Batch<S>>> {
        let last = self.val.len() - (context + 1);
        let count = count.clamp(1, last + 1);
        let starts: Vec<usize> = (0..count)
            .map(|i| {
                if count == 1 {
                    0
                } else {
                    i * last / (count - 1)
                }
            })
            .collect();
        starts
            .chunks(batch.max(1))
            .map(|c| windows(&self.val, c, context))
            .collect()
    }
}

/// The ids of `text` over `vocab`, or the first character outside it with its position.
pub fn encode(vocab: &[char], text: &str) -> Result<Vec<u32>, (usize, char)> {
    text.chars()
        .enumerate()
        .map(|(i, c)| {
            vocab
                .binary_search(&c)
                .map(|k| k as u32)
                .map_err(|_| (i, c))
        })
        .collect()
}

/// The text of `ids` over `vocab` (ids outside it are skipped).
pub fn decode(vocab: &[char], ids: &[u32]) -> String {
    ids.iter().filter_map(|&i| vocab.get(i as usize)).collect()
}

/// Inputs `[n, context]` and next-character targets for windows at `starts`.
fn windows<S: Scalar>(ids: &[u32], starts: &[usize], context: usize) -> NnResult<Batch<S>> {
    let mut x = Vec::with_capacity(starts.len() * context);
    let mut y = Vec::with_capacity(starts.len() * context);
    for &s in starts {
        x.extend(
            ids[s..s + context]
                .iter()
                .map(|&i| S::from_f64(f64::from(i))),
        );
        y.extend(ids[s + 1..s + context + 1].iter().map(|&i| i as usize));
    }
    Ok(Batch {
        x: Tensor::new(&[starts.len(), context], x)?,
        y: BatchTargets::Classes(y),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabulary_is_sorted_distinct_and_the_split_keeps_the_last_tenth() {
        let text = "abcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcz";
        let d = TextData::from_text("t", text, 3).unwrap();
        assert_eq!(d.vocab, vec!['a', 'b', 'c', 'z']);
        assert_eq!(d.train.len() + d.val.len(), text.chars().count());
        assert_eq!(*d.val.last().unwrap(), 3);
        assert_eq!(d.decode(&d.train[..4]), "abca");
        let b: Batch<f64> = d.train_batch(7, 3, 4, 3).unwrap();
        assert_eq!(b.x.dims(), &[4, 3]);
        let again: Batch<f64> = d.train_batch(7, 3, 4, 3).unwrap();
        assert_eq!(b, again);
        // Each target is the character after its input, in the text.
        if let BatchTargets::Classes(y) = &b.y {
            for (row, ys) in y.chunks(3).enumerate() {
                let xs = &b.x.data()[row * 3..row * 3 + 3];
                assert_eq!(xs[1] as usize, ys[0]);
                assert_eq!(xs[2] as usize, ys[1]);
            }
        }
    }

    #[test]
    fn short_or_empty_text_is_an_error_naming_the_part() {
        let e = TextData::from_text("f.txt", "", 4).unwrap_err().to_string();
        assert!(e.contains("f.txt") && e.contains("empty"), "{e}");
        let e = TextData::from_text("f.txt", "abc", 4)
            .unwrap_err()
            .to_string();
        assert!(e.contains("training part"), "{e}");
        let e = TextData::from_text("f.txt", &"ab".repeat(20), 4)
            .unwrap_err()
            .to_string();
        assert!(e.contains("validation part (4, the last 10%)"), "{e}");
    }
}
