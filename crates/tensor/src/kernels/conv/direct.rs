//! Convolution without a column matrix: on a zero-padded copy of the input, split into stride
//! phases and flattened row by row (`super::phases`), every kernel tap of a run of output positions
//! reads a contiguous run of the copy, so the forward pass and the weight gradient are
//! register-tiled loops of fused multiply-adds.

use crate::kernels::lanes::{cast, cast_mut, load, Lanes};
use crate::{Error, Result, Scalar};
use pulp::bytemuck::{self, Pod};
use pulp::Simd;

/// Output channels and vectors of positions one forward tile computes at once: 12 accumulators,
/// each tap's 2 input vectors and a broadcast weight fill the 16 vector registers of AVX2 (3
/// vectors of 4 channels would spill an accumulator).
const FWD_ROWS: usize = 6;
const FWD_VECTORS: usize = 2;
/// Kernel taps one weight-gradient tile computes at once (and output channels: 12 accumulators).
const WGRAD_TAPS: usize = 3;
/// The weight gradient's partial sums per (channel, tap): on every CPU, whatever its vector
/// width, since the order of the additions must not depend on it.
const WGRAD_LANES_F32: usize = 16;
const WGRAD_LANES_F64: usize = 8;
/// A multiple of every tile's width in positions (2 vectors of up to 16 f32, or 16 partial sums).
const MAX_TILE: usize = 64;

/// The runs of flat positions the kernels read: output position `(oy, ox)` is flat position
/// `p = oy * pitch + ox`, and kernel tap `t` of every position reads element `offsets[t] + p` of
/// the buffer (built by [`super::phases`]). The positions with `ox >= out_w` (the `pitch - out_w`
/// at the end of each row) read real elements too; their results are never stored, and the weight
/// gradient gives them a zero output gradient.
pub(super) struct Flat {
    pitch: usize,
    out_w: usize,
    out_len: usize,
    /// `(out_h - 1) * pitch + out_w`: the flat positions from the first output to the last.
    positions: usize,
    /// `positions` rounded up to whole tiles (of the forward tile and the gradient's lanes).
    span: usize,
    offsets: Vec<usize>,
    /// `max(offsets) + span`: the elements a buffer needs for every tap's run (zero slack past
    /// the data for the last tile's overrun).
    reach: usize,
}

impl Flat {
    /// The runs of `out_h x out_w` outputs at row pitch `pitch` (at least `out_w`; both sizes at
    /// least 1) whose taps start at `offsets`.
    pub(super) fn new(
        pitch: usize,
        [out_h, out_w]: [usize; 2],
        offsets: Vec<usize>,
    ) -> Result<Flat> {
        assert!(
            out_h > 0 && out_w > 0 && out_w <= pitch,
            "conv: empty or overlapping rows"
        );
        let too_big = || {
            Error::invalid(
                "conv2d",
                format!("{out_h} x {out_w} outputs at row pitch {pitch} are too many"),
            )
        };
        let positions = (out_h - 1)
            .checked_mul(pitch)
            .and_then(|p| p.checked_add(out_w))
            .ok_or_else(too_big)?;
        let span = positions
            .checked_next_multiple_of(MAX_TILE)
            .ok_or_else(too_big)?;
        let reach = offsets
            .iter()
            .max()
            .map_or(Some(span), |m| m.checked_add(span))
            .ok_or_else(too_big)?;
        Ok(Flat {
            pitch,
            out_w,
            out_len: out_h * out_w,
            positions,
            span,
            offsets,
            reach,
        })
    }

    /// The elements a buffer the taps read must have.
    pub(super) fn reach(&self) -> usize {
        self.reach
    }

    /// The flat output rows of a group's output gradient (`og x out_len`): `og` rows of `span`
    /// elements each, zero outside the output positions, for [`weight_gradient`].
    pub(super) fn flat_rows_len(&self, og: usize) -> Result<usize> {
        og.checked_mul(self.span).ok_or_else(|| {
            Error::invalid(
                "conv2d",
                format!(
                    "{og} output channels of {} positions are too many",
                    self.span
                ),
            )
        })
    }

    /// Copies `dy` (rows of `out_len`) into flat rows of `span` (whose other elements stay zero).
    fn flatten_rows<S: Scalar>(&self, dy: &[S], flat: &mut [S]) {
        for (dst, src) in flat.chunks_mut(self.span).zip(dy.chunks(self.out_len)) {
            for (oy, row) in src.chunks(self.out_w).enumerate() {
                dst[oy * self.pitch..][..row.len()].copy_from_slice(row);
            }
        }
    }

    /// Calls `f(i, q, len)` for each run of output positions in the flat tile starting at `p0`
    /// and `width` wide: tile elements `i..i + len` are outputs `q..q + len`.
    fn stored_runs(&self, p0: usize, width: usize, mut f: impl FnMut(usize, usize, usize)) {
        let end = (p0 + width).min(self.positions);
        let mut p = p0;
        while p < end {
            let (oy, ox) = (p / self.pitch, p % self.pitch);
            if ox < self.out_w {
                let len = (self.out_w - ox).min(end - p);
                f(p - p0, oy * self.out_w + ox, len);
                p += len;
            } else {
                p = (oy + 1) * self.pitch;
            }
        }
    }
}

/// The weight `(og, taps)` of one group (rows of `taps`) transposed to `(taps, og)`, so that a
/// tile's output channels of one tap are adjacent.
pub(super) fn taps_major<S: Scalar>(w: &[S], og: usize, taps: usize) -> Vec<S> {
    let mut out = vec![S::ZERO; og * taps];
    for (o, row) in w.chunks(taps).take(og).enumerate() {
        for (t, &v) in row.iter().enumerate() {
            out[t * og + o] = v;
        }
    }
    out
}

/// The weight gradient's partial sums per (channel, tap) of each element type.
trait WgradLanes: Lanes {
    const WGRAD_LANES: usize;
}

impl WgradLanes for f32 {
    const WGRAD_LANES: usize = WGRAD_LANES_F32;
}

impl WgradLanes for f64 {
    const WGRAD_LANES: usize = WGRAD_LANES_F64;
}

/// Checks what the unchecked loads of the tile loops rely on: every tap's run of `span` flat
/// positions lies inside `xp` (`reach` is the largest offset plus `span`).
fn assert_taps_fit<T>(flat: &Flat, xp: &[T]) {
    assert!(
        flat.span % MAX_TILE == 0 && flat.reach <= xp.len(),
        "conv: padded input buffer too small"
    );
}

/// One group of one image: `out[o, q] = (sum over taps t in order of w[o, t] * x_t[q]) + bias[o]`
/// for the group's `og` output channels, where each sum starts at zero and adds one fused
/// multiply-add per tap (`c`, then `ki`, then `kj`); `+ bias[o]` only with a bias. `xp` is the
/// padded input ([`Flat::pad_into`]), `wt` the weight in [`taps_major`] order. The vector width
/// only decides which outputs are computed together, never an output's additions.
pub(super) fn forward<S: Scalar>(
    flat: &Flat,
    xp: &[S],
    wt: &[S],
    bias: Option<&[S]>,
    out: &mut [S],
) {
    forward_on(flat, xp, wt, bias, out, false);
}

/// [`forward`] on pulp's one-lane path, whatever this CPU has.
#[cfg(test)]
pub(super) fn forward_one_lane<S: Scalar>(
    flat: &Flat,
    xp: &[S],
    wt: &[S],
    bias: Option<&[S]>,
    out: &mut [S],
) {
    forward_on(flat, xp, wt, bias, out, true);
}

fn forward_on<S: Scalar>(
    flat: &Flat,
    xp: &[S],
    wt: &[S],
    bias: Option<&[S]>,
    out: &mut [S],
    one_lane: bool,
) {
    fn run<S: Scalar, T: Lanes>(
        flat: &Flat,
        xp: &[S],
        wt: &[S],
        bias: Option<&[S]>,
        out: &mut [S],
        one_lane: bool,
    ) -> bool {
        let (Some(xp), Some(wt), Some(out)) = (cast::<S, T>(xp), cast::<S, T>(wt), cast_mut(out))
        else {
            return false;
        };
        let bias = bias.map(cast::<S, T>);
        if let Some(None) = bias {
            return false;
        }
        let bias = bias.flatten();
        let tiles = ForwardTiles {
            flat,
            xp,
            wt,
            bias,
            out,
        };
        if one_lane {
            pulp::WithSimd::with_simd(tiles, pulp::Scalar::new());
        } else {
            pulp::Arch::new().dispatch(tiles);
        }
        true
    }
    if !run::<S, f32>(flat, xp, wt, bias, out, one_lane)
        && !run::<S, f64>(flat, xp, wt, bias, out, one_lane)
    {
        unreachable!("Scalar is f32 or f64");
    }
}

struct ForwardTiles<'a, T> {
    flat: &'a Flat,
    xp: &'a [T],
    wt: &'a [T],
    bias: Option<&'a [T]>,
    out: &'a mut [T],
}

impl<T: Lanes> pulp::WithSimd for ForwardTiles<'_, T> {
    type Output = ();
    // Inlined into pulp's `#[target_feature]` function, which is what lets the loops use it.
    #[inline(always)]
    fn with_simd<Sd: Simd>(self, simd: Sd) {
        let ForwardTiles {
            flat,
            xp,
            wt,
            bias,
            out,
        } = self;
        let lanes = std::mem::size_of::<T::V<Sd>>() / std::mem::size_of::<T>();
        let width = FWD_VECTORS * lanes;
        assert_taps_fit(flat, xp);
        assert!(
            MAX_TILE % width == 0 && wt.len() == flat.offsets.len() * (out.len() / flat.out_len)
        );
        let og = out.len() / flat.out_len;
        let mut p0 = 0;
        while p0 < flat.positions {
            let mut o0 = 0;
            // Whole tiles, then the remaining channels in tiles of 4, 2 and 1.
            while o0 < og {
                let tile = FwdTile {
                    flat,
                    xp,
                    wt,
                    og,
                    p0,
                    width,
                    o0,
                };
                o0 += match og - o0 {
                    FWD_ROWS.. => tile.run::<FWD_ROWS>(simd, bias, out),
                    4.. => tile.run::<4>(simd, bias, out),
                    2.. => tile.run::<2>(simd, bias, out),
                    _ => tile.run::<1>(simd, bias, out),
                };
            }
            p0 += width;
        }
    }
}

/// The forward pass of output channels `o0..` at flat positions `p0..p0 + width`.
struct FwdTile<'a, T> {
    flat: &'a Flat,
    xp: &'a [T],
    wt: &'a [T],
    og: usize,
    p0: usize,
    width: usize,
    o0: usize,
}

impl<T: Lanes> FwdTile<'_, T> {
    /// Computes and stores `R` channels; returns `R`.
    #[inline(always)]
    fn run<const R: usize>(self, simd: impl Simd, bias: Option<&[T]>, out: &mut [T]) -> usize {
        let acc = forward_tile::<T, _, R>(
            simd,
            self.xp,
            &self.flat.offsets,
            self.p0,
            self.wt,
            self.og,
            self.o0,
        );
        store::<T, _, R>(self.flat, self.p0, self.width, self.o0, &acc, bias, out);
        R
    }
}

/// Output channels `o0..o0 + R` at the `FWD_VECTORS` vectors of flat positions from `p0`: one
/// sum per element, over the taps in order, each step one fused multiply-add.
#[inline(always)]
fn forward_tile<T: Lanes, Sd: Simd, const R: usize>(
    simd: Sd,
    xp: &[T],
    offsets: &[usize],
    p0: usize,
    wt: &[T],
    og: usize,
    o0: usize,
) -> [[T::V<Sd>; FWD_VECTORS]; R] {
    let zero = T::splat(simd, T::ZERO);
    let mut acc = [[zero; FWD_VECTORS]; R];
    for (&off, ws) in offsets.iter().zip(wt.chunks_exact(og)) {
        // SAFETY: p0 + the tile's width <= span (tiles divide MAX_TILE, which divides span),
        // and every offset + span fits in xp (`assert_taps_fit`).
        let xs = unsafe { load::<T, T::V<Sd>, FWD_VECTORS>(xp, off + p0) };
        let ws = &ws[o0..o0 + R];
        for r in 0..R {
            let w = T::splat(simd, ws[r]);
            for v in 0..FWD_VECTORS {
                acc[r][v] = T::fma(simd, w, xs[v], acc[r][v]);
            }
        }
    }
    acc
}

#[inline(always)]
fn store<T: Lanes, V: Pod, const R: usize>(
    flat: &Flat,
    p0: usize,
    width: usize,
    o0: usize,
    acc: &[[V; FWD_VECTORS]; R],
    bias: Option<&[T]>,
    out: &mut [T],
) {
    let l = flat.out_len;
    flat.stored_runs(p0, width, |i, q, len| {
        for (r, acc) in acc.iter().enumerate() {
            let src: &[T] = bytemuck::cast_slice(acc);
            let dst = &mut out[(o0 + r) * l + q..][..len];
            let src = &src[i..i + len];
            match bias {
                Some(b) => {
                    let b = b[o0 + r];
                    for (d, &s) in dst.iter_mut().zip(src) {
                        *d = s + b;
                    }
                }
                None => dst.copy_from_slice(src),
            }
        }
    });
}

/// Adds one image's contribution to one group's weight gradient rows `dw` (`rows x taps`, the
/// output channels whose gradients are `dy`, `rows x out_len`): `dw[o, t] += s[o, t]` where
/// `s[o, t] = sum over output positions q of dy[o, q] * x_t[q]`, formed as `LANES` partial sums
/// (16 for f32, 8 for f64, on every CPU) over the flat positions, partial sum `l` taking
/// positions `l, l + LANES, ...` in order, each step one fused multiply-add starting from zero,
/// folded in halves (`s[l] + s[l + LANES / 2]`, then a quarter, ...). The flat positions past a
/// row's end have a zero output gradient, so they add exact zeros: only when every input value is
/// finite (`0 * inf` would be NaN), which the caller checks. `dy_flat` is scratch of
/// [`Flat::flat_rows_len`] elements for `rows`, zero outside the output positions.
pub(super) fn weight_gradient<S: Scalar>(
    flat: &Flat,
    xp: &[S],
    dy: &[S],
    dy_flat: &mut [S],
    dw: &mut [S],
) {
    weight_gradient_on(flat, xp, dy, dy_flat, dw, false);
}

/// [`weight_gradient`] on pulp's one-lane path, whatever this CPU has.
#[cfg(test)]
pub(super) fn weight_gradient_one_lane<S: Scalar>(
    flat: &Flat,
    xp: &[S],
    dy: &[S],
    dy_flat: &mut [S],
    dw: &mut [S],
) {
    weight_gradient_on(flat, xp, dy, dy_flat, dw, true);
}

fn weight_gradient_on<S: Scalar>(
    flat: &Flat,
    xp: &[S],
    dy: &[S],
    dy_flat: &mut [S],
    dw: &mut [S],
    one_lane: bool,
) {
    flat.flatten_rows(dy, dy_flat);
    fn run<S: Scalar, T: WgradLanes>(
        flat: &Flat,
        xp: &[S],
        dy_flat: &[S],
        dw: &mut [S],
        one_lane: bool,
    ) -> bool {
        let (Some(xp), Some(dy_flat), Some(dw)) =
            (cast::<S, T>(xp), cast::<S, T>(dy_flat), cast_mut(dw))
        else {
            return false;
        };
        let tiles = WgradTiles {
            flat,
            xp,
            dy_flat,
            dw,
        };
        if one_lane {
            pulp::WithSimd::with_simd(tiles, pulp::Scalar::new());
        } else {
            pulp::Arch::new().dispatch(tiles);
        }
        true
    }
    if !run::<S, f32>(flat, xp, dy_flat, dw, one_lane)
        && !run::<S, f64>(flat, xp, dy_flat, dw, one_lane)
    {
        unreachable!("Scalar is f32 or f64");
    }
}

struct WgradTiles<'a, T> {
    flat: &'a Flat,
    xp: &'a [T],
    dy_flat: &'a [T],
    dw: &'a mut [T],
}

impl<T: WgradLanes> pulp::WithSimd for WgradTiles<'_, T> {
    type Output = ();
    // Inlined into pulp's `#[target_feature]` function, which is what lets the loops use it.
    #[inline(always)]
    fn with_simd<Sd: Simd>(self, simd: Sd) {
        let lanes = std::mem::size_of::<T::V<Sd>>() / std::mem::size_of::<T>();
        // Vectors per partial-sum group, and output channels per tile to fill 12 accumulators.
        match T::WGRAD_LANES / lanes {
            1 => self.tiles::<Sd, 1, 4>(simd),
            2 => self.tiles::<Sd, 2, 2>(simd),
            4 => self.tiles::<Sd, 4, 1>(simd),
            8 => self.tiles::<Sd, 8, 1>(simd),
            _ => self.tiles::<Sd, 16, 1>(simd),
        }
    }
}

impl<T: WgradLanes> WgradTiles<'_, T> {
    /// Tiles of `R` output channels by `WGRAD_TAPS` taps, each partial-sum group `M` vectors.
    #[inline(always)]
    fn tiles<Sd: Simd, const M: usize, const R: usize>(self, simd: Sd) {
        let WgradTiles {
            flat,
            xp,
            dy_flat,
            dw,
        } = self;
        let taps = flat.offsets.len();
        let rows = dw.len() / taps;
        let steps = flat.positions.div_ceil(T::WGRAD_LANES);
        assert_taps_fit(flat, xp);
        assert!(MAX_TILE % T::WGRAD_LANES == 0 && dy_flat.len() >= rows * flat.span);
        let (full_rows, full_taps) = (rows / R * R, taps / WGRAD_TAPS * WGRAD_TAPS);
        let mut o0 = 0;
        while o0 < rows {
            let r = if o0 < full_rows { R } else { 1 };
            let mut t0 = 0;
            while t0 < taps {
                let k = if t0 < full_taps { WGRAD_TAPS } else { 1 };
                let tile = Tile {
                    flat,
                    xp,
                    dy_flat,
                    steps,
                    o0,
                    t0,
                };
                match (r == R, k == WGRAD_TAPS) {
                    (true, true) => tile.run::<T, Sd, M, R, WGRAD_TAPS>(simd, dw),
                    (true, false) => tile.run::<T, Sd, M, R, 1>(simd, dw),
                    (false, true) => tile.run::<T, Sd, M, 1, WGRAD_TAPS>(simd, dw),
                    (false, false) => tile.run::<T, Sd, M, 1, 1>(simd, dw),
                }
                t0 += k;
            }
            o0 += r;
        }
    }
}

struct Tile<'a, T> {
    flat: &'a Flat,
    xp: &'a [T],
    dy_flat: &'a [T],
    steps: usize,
    o0: usize,
    t0: usize,
}

impl<T: WgradLanes> Tile<'_, T> {
    #[inline(always)]
    fn run<U: Lanes, Sd: Simd, const M: usize, const R: usize, const K: usize>(
        self,
        simd: Sd,
        dw: &mut [T],
    ) where
        T: Lanes<V<Sd> = U::V<Sd>>,
    {
        let Tile {
            flat,
            xp,
            dy_flat,
            steps,
            o0,
            t0,
        } = self;
        let taps = flat.offsets.len();
        let offsets = &flat.offsets[t0..t0 + K];
        let zero = T::splat(simd, T::ZERO);
        let mut acc = [[[zero; M]; K]; R];
        for step in 0..steps {
            let base = step * T::WGRAD_LANES;
            // SAFETY: base + WGRAD_LANES <= span (which WGRAD_LANES divides), the rows are
            // below `rows` and every offset + span fits in xp (checked in `tiles`).
            let dys: [[T::V<Sd>; M]; R] =
                std::array::from_fn(|r| unsafe { load(dy_flat, (o0 + r) * flat.span + base) });
            let xs: [[T::V<Sd>; M]; K] =
                std::array::from_fn(|j| unsafe { load(xp, offsets[j] + base) });
            for r in 0..R {
                for j in 0..K {
                    for m in 0..M {
                        acc[r][j][m] = T::fma(simd, dys[r][m], xs[j][m], acc[r][j][m]);
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (j, lanes) in acc.iter().enumerate() {
                let lanes: &[T] = bytemuck::cast_slice(lanes);
                dw[(o0 + r) * taps + t0 + j] += fold_halves(lanes);
            }
        }
    }
}

/// `s[l] += s[l + n / 2]` for the lower half, then the lower quarter, ...: `s[0]` at the end.
#[inline(always)]
fn fold_halves<T: Scalar>(s: &[T]) -> T {
    let mut buf = [T::ZERO; MAX_TILE];
    let n = s.len();
    buf[..n].copy_from_slice(s);
    let mut half = n / 2;
    while half > 0 {
        for l in 0..half {
            buf[l] += buf[l + half];
        }
        half /= 2;
    }
    buf[0]
}

/// Whether every element is finite (no infinity or NaN): `v * 0` is zero exactly then.
pub(super) fn all_finite<S: Scalar>(v: &[S]) -> bool {
    const LANES: usize = 16;
    let mut acc = [S::ZERO; LANES];
    let mut chunks = v.chunks_exact(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            acc[l] += c[l] * S::ZERO;
        }
    }
    acc.iter().all(|a| *a == S::ZERO) && chunks.remainder().iter().all(|a| a.is_finite())
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::phases::InputRuns;
    use super::super::Conv2dGeometry;
    use super::*;

    /// Deterministic values k / 7 - 1.5 for k in 0..23, a different run per `salt`.
    pub(in crate::kernels::conv) fn values<T: Scalar>(n: usize, salt: usize) -> Vec<T> {
        (0..n)
            .map(|i| T::from_f64(((i * 37 + salt * 11) % 23) as f64 / 7.0 - 1.5))
            .collect()
    }

    fn same_bits<T: Scalar>(a: &[T], b: &[T]) -> bool {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
    }

    /// The vector width only decides which outputs a tile computes together: pulp's one-lane
    /// path gives the bits of the path this CPU dispatches to (AVX2 here), forward and weight
    /// gradient. AVX-512's 16 lanes run the same generic code, which this cannot execute here;
    /// a third width that agrees is the check on it that this machine allows.
    fn widths_agree<T: Scalar>(geo: &Conv2dGeometry) {
        let runs = InputRuns::new(geo).unwrap().unwrap();
        let flat = &runs.flat;
        let (og, taps) = (geo.out_channels, geo.col_rows());
        let mut xp = runs.buffer::<T>().unwrap();
        runs.phases
            .copy_into(&values::<T>(geo.input_numel(), 1), &mut xp);
        let wt = taps_major(&values::<T>(og * taps, 2), og, taps);
        let bias = values::<T>(og, 3);

        let mut dispatched = vec![T::ZERO; og * geo.out_len()];
        forward(flat, &xp, &wt, Some(&bias), &mut dispatched);
        let mut one_lane = vec![T::ZERO; og * geo.out_len()];
        forward_one_lane(flat, &xp, &wt, Some(&bias), &mut one_lane);
        assert!(same_bits(&dispatched, &one_lane), "forward, {geo:?}");

        let dy = values::<T>(og * geo.out_len(), 4);
        let mut dy_flat = vec![T::ZERO; flat.flat_rows_len(og).unwrap()];
        let mut dw_dispatched = values::<T>(og * taps, 5);
        let mut dw_one_lane = dw_dispatched.clone();
        weight_gradient(flat, &xp, &dy, &mut dy_flat, &mut dw_dispatched);
        weight_gradient_one_lane(flat, &xp, &dy, &mut dy_flat, &mut dw_one_lane);
        assert!(
            same_bits(&dw_dispatched, &dw_one_lane),
            "weight gradient, {geo:?}"
        );
    }

    #[test]
    fn every_vector_width_gives_the_same_bits() {
        // Dilated, asymmetric kernel and padding, 7 channels (a 6-tile and a 1-tile), 6 taps
        // per channel (two 3-tap tiles), and a row length that leaves a partial last tile; then
        // strides 2 and 3 (split into phases), one of them dilated.
        let cases = [
            ([1, 3, 9, 11], [7, 3, 3, 2], [1, 1], [1, 2], [2, 1]),
            ([1, 3, 13, 11], [7, 3, 3, 3], [2, 2], [1, 1], [1, 1]),
            ([1, 2, 14, 17], [5, 2, 5, 2], [3, 2], [2, 0], [1, 2]),
        ];
        for (xs, ws, stride, padding, dilation) in cases {
            let geo = Conv2dGeometry::new("conv2d", xs, ws, stride, padding, dilation, 1).unwrap();
            widths_agree::<f32>(&geo);
            widths_agree::<f64>(&geo);
        }
    }
}
