//! How a rank's flat buffer travels: cut into buckets of whole gradients in the backward's order,
//! the last bucket also carrying the buffers' values and the step's summary, so that a step whose
//! gradients fit one bucket synchronises once; and what came back, checked and decoded.

use super::Layout;
use crate::error::{NnError, NnResult};
use crate::exchange::{Exchange, Gathered, Work};
use tapegrad_tensor::Scalar;

/// A step's summary (`Micro::meta`: rows, mean loss, correct count) in wire values: each f64's
/// bits as four 16-bit integers, which every wire type holds exactly.
const SUMMARY_WORDS: usize = 12;

/// How a flat buffer is cut into the buckets of an overlapped exchange: the gradients in the
/// backward's order (the last tensor first, as PyTorch's DDP), whole tensors per bucket. The last
/// bucket holds the gradients that become final last (the first tensors'), so the backward is
/// over when it could start; it waits for the step's end and carries the buffers' values and the
/// summary too, which exist only then.
pub(super) struct Buckets {
    /// Per bucket: its `(offset in the flat buffer, length)` pieces, in bucket order.
    pub(super) pieces: Vec<Vec<(usize, usize)>>,
    /// Per trainable tensor: its bucket, its offset there and its length.
    pub(super) place: Vec<(usize, usize, usize)>,
    pub(super) lens: Vec<usize>,
    /// Where the buffers' values start in the last bucket (the summary follows them).
    buffers_at: usize,
}

impl Buckets {
    /// Buckets of at least `cap` gradient values (the last one may hold fewer).
    pub(super) fn of(layout: &Layout, cap: usize) -> Buckets {
        let mut b = Buckets {
            pieces: Vec::new(),
            place: vec![(0, 0, 0); layout.trainable.len()],
            lens: Vec::new(),
            buffers_at: 0,
        };
        let mut open = false;
        for (j, (dims, off)) in layout.trainable.iter().enumerate().rev() {
            let len: usize = dims.iter().product();
            if !open {
                b.pieces.push(Vec::new());
                b.lens.push(0);
            }
            let last = b.lens.len() - 1;
            b.place[j] = (last, b.lens[last], len);
            b.pieces[last].push((*off, len));
            b.lens[last] += len;
            open = b.lens[last] < cap;
        }
        if b.lens.is_empty() {
            b.pieces.push(Vec::new());
            b.lens.push(0);
        }
        let last = b.lens.len() - 1;
        b.buffers_at = b.lens[last];
        let grad_len = layout.grad_len();
        if layout.len > grad_len {
            b.pieces[last].push((grad_len, layout.len - grad_len));
        }
        b.lens[last] += layout.len - grad_len + SUMMARY_WORDS;
        b
    }

    /// The buckets handed over during the backward, as soon as their gradients are final: all
    /// but the last.
    pub(super) fn early(&self) -> usize {
        self.lens.len() - 1
    }

    /// Where the flat buffer's values lie in the buckets, in the flat buffer's order: `(bucket,
    /// offset there, length)` per trainable tensor, then the buffers' values.
    pub(super) fn in_flat_order(
        &self,
        layout: &Layout,
    ) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let buffers = layout.len - layout.grad_len();
        let buffers = (buffers > 0).then_some((self.early(), self.buffers_at, buffers));
        self.place.iter().copied().chain(buffers)
    }

    /// Bucket `b`'s values, cut from flat buffer `flat` and converted to the wire type; the last
    /// bucket ends with the step's summary `meta`.
    pub(super) fn cut<S: Scalar, W: Wire>(&self, b: usize, flat: &[S], meta: &[f64; 3]) -> Vec<W> {
        let mut out = Vec::with_capacity(self.lens[b]);
        for &(off, len) in &self.pieces[b] {
            out.extend(flat[off..off + len].iter().map(|&v| W::from_scalar(v)));
        }
        if b == self.early() {
            out.extend(meta.iter().flat_map(|v| {
                let bits = v.to_bits();
                (0..4).map(move |i| W::from_scalar(((bits >> (16 * i)) & 0xffff) as f64))
            }));
        }
        out
    }
}

/// The element type a flat buffer travels in: the run's own (f32 values pass through f64 and
/// back exactly, so the conversions are only copies).
pub(super) trait Wire: Copy + Default + 'static {
    fn from_scalar<S: Scalar>(v: S) -> Self;
    fn to_scalar<S: Scalar>(self) -> S;
    fn overlap<'a>(
        ex: &'a mut dyn Exchange,
        lens: &[usize],
        work: Work<'_, Self>,
    ) -> NnResult<Gathered<'a, Self>>;
}

impl Wire for f32 {
    fn from_scalar<S: Scalar>(v: S) -> Self {
        v.to_f64() as f32
    }
    fn to_scalar<S: Scalar>(self) -> S {
        S::from_f64(f64::from(self))
    }
    fn overlap<'a>(
        ex: &'a mut dyn Exchange,
        lens: &[usize],
        work: Work<'_, f32>,
    ) -> NnResult<Gathered<'a, f32>> {
        ex.overlap_f32(lens, work)
    }
}

impl Wire for f64 {
    fn from_scalar<S: Scalar>(v: S) -> Self {
        v.to_f64()
    }
    fn to_scalar<S: Scalar>(self) -> S {
        S::from_f64(self)
    }
    fn overlap<'a>(
        ex: &'a mut dyn Exchange,
        lens: &[usize],
        work: Work<'_, f64>,
    ) -> NnResult<Gathered<'a, f64>> {
        ex.overlap_f64(lens, work)
    }
}

/// What an exchange brought back: every rank's `Micro::meta` (three values each) and every
/// rank's values of each bucket.
pub(super) struct Summarised<'a, W> {
    pub(super) metas: Vec<f64>,
    pub(super) buckets: Buckets,
    pub(super) parts: Gathered<'a, W>,
}

impl<'a, W: Wire> Summarised<'a, W> {
    /// Checks that `parts` holds each of `size` ranks' buckets at their lengths and reads their
    /// summaries.
    pub(super) fn of(buckets: Buckets, parts: Gathered<'a, W>, size: usize) -> NnResult<Self> {
        for (b, &len) in buckets.lens.iter().enumerate() {
            for r in 0..size {
                let got = parts.part(b, r).len();
                if got != len {
                    return Err(NnError::Config(format!(
                        "exchange: rank {r}'s bucket {b} came back with {got} values of {len}"
                    )));
                }
            }
        }
        let last = buckets.early();
        let len = buckets.lens[last];
        let mut metas = Vec::with_capacity(3 * size);
        for r in 0..size {
            let words = &parts.part(last, r)[len - SUMMARY_WORDS..];
            for value in words.chunks_exact(4) {
                let mut bits = 0u64;
                for (i, w) in value.iter().enumerate() {
                    let x = w.to_scalar::<f64>();
                    if !(0.0..65536.0).contains(&x) || x.fract() != 0.0 {
                        return Err(NnError::Config(format!(
                            "exchange: rank {r}'s step summary came back garbled ({x})"
                        )));
                    }
                    bits |= (x as u64) << (16 * i);
                }
                metas.push(f64::from_bits(bits));
            }
        }
        Ok(Summarised {
            metas,
            buckets,
            parts,
        })
    }
}

/// Lets the tests hand `Summarised::of` a `Received` they built.
#[cfg(test)]
pub(super) fn boxed<'a, W: 'a>(r: impl crate::exchange::Received<W> + 'a) -> Gathered<'a, W> {
    Box::new(r)
}
