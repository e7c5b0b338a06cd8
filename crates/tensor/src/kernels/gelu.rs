//! The exact (erf) GELU, `x * Phi(x)`, and its derivative `Phi(x) + x * phi(x)` over slices. f32
//! evaluates them in f32 (an exponential times a fitted rational, within 7 ulps, branch-free so
//! the loops vectorise 8 or 16 wide); f64 keeps libm's `erfc`, correct to about its ulp.

use super::workers::{for_each_chunk_mut, for_each_part};
use crate::{DType, Scalar};

/// Elements per thread below which a slice stays on the calling thread (as `par_map`'s maps).
const MIN_PER_THREAD: usize = super::par_map::MIN_MAP_PER_THREAD;

/// 1/sqrt(2*pi), the standard normal density at 0.
const INV_SQRT_2PI: f64 = std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2 * 0.5;

/// `out[i] = x[i] * Phi(x[i])`.
pub fn gelu_erf<S: Scalar>(x: &[S], out: &mut [S]) {
    let len = x.len().min(out.len());
    let (x, out) = (&x[..len], &mut out[..len]);
    for_each_chunk_mut(out, MIN_PER_THREAD, |start, out| {
        let x = &x[start..start + out.len()];
        pulp::Arch::new().dispatch(Forward { x, out })
    });
}

/// `out[i] = g[i] * (Phi(x[i]) + x[i] * phi(x[i]))`: the cotangent (or tangent) `g` times the
/// derivative at `x`.
pub fn gelu_erf_backward<S: Scalar>(g: &[S], x: &[S], out: &mut [S]) {
    let len = g.len().min(x.len()).min(out.len());
    let (g, x, out) = (&g[..len], &x[..len], &mut out[..len]);
    for_each_chunk_mut(out, MIN_PER_THREAD, |start, out| {
        let end = start + out.len();
        let (g, x) = (&g[start..end], &x[start..end]);
        pulp::Arch::new().dispatch(Backward { g, x, out })
    });
}

/// `value[i] = x[i] * Phi(x[i])` and `slope[i] = Phi(x[i]) + x[i] * phi(x[i])` in one pass (Phi
/// and phi evaluated once): the bits of [`gelu_erf`] and of the factor [`gelu_erf_backward`]
/// multiplies by, for a backward that recomputes the value and needs the slope next.
pub fn gelu_erf_with_slope<S: Scalar>(x: &[S], value: &mut [S], slope: &mut [S]) {
    let len = x.len().min(value.len()).min(slope.len());
    let threads = super::num_threads().min(len / MIN_PER_THREAD).max(1);
    // Elementwise, so the bits do not depend on the split.
    let per_part = len.div_ceil(threads).next_multiple_of(16).max(1);
    let parts: Vec<_> = x[..len]
        .chunks(per_part)
        .zip(value[..len].chunks_mut(per_part))
        .zip(slope[..len].chunks_mut(per_part))
        .collect();
    for_each_part(parts, |((x, value), slope)| {
        pulp::Arch::new().dispatch(Both { x, value, slope })
    });
}

/// `x * Phi(x)` of one element (the bits of [`gelu_erf`]).
#[inline(always)]
pub fn gelu_erf_value<S: Scalar>(x: S) -> S {
    gelu_erf_value_and_slope(x).0
}

/// `Phi(x) + x * phi(x)` of one element (the factor [`gelu_erf_backward`] multiplies by).
#[inline(always)]
pub fn gelu_erf_slope<S: Scalar>(x: S) -> S {
    gelu_erf_value_and_slope(x).1
}

/// The value and the slope of one element from one evaluation of Phi and phi (inlined, so a
/// caller that takes one of them computes only that one): f32 in f32 arithmetic
/// ([`gelu_f32`]), f64 from libm's `erfc`.
#[inline(always)]
fn gelu_erf_value_and_slope<S: Scalar>(x: S) -> (S, S) {
    match S::DTYPE {
        // Exact conversions both ways for an f32, which the compiler removes.
        DType::F32 => {
            let (value, slope) = gelu_f32(x.to_f64() as f32);
            (S::from_f64(value.into()), S::from_f64(slope.into()))
        }
        DType::F64 => {
            let (value, slope) = gelu_f64(x.to_f64());
            (S::from_f64(value), S::from_f64(slope))
        }
    }
}

/// (x Phi(x), Phi(x) + x phi(x)) in f64 through libm's `erfc` (not (1 + erf) / 2, which cancels
/// for negative x), correct to about an ulp. Where the density underflows to 0 the slope's
/// second term is 0 (not `inf * 0` for an infinite x), so it tends to its limits 0 and 1.
#[inline(always)]
fn gelu_f64(x: f64) -> (f64, f64) {
    let cdf = 0.5 * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2);
    let pdf = (-0.5 * x * x).exp() * INV_SQRT_2PI;
    let slope = if pdf == 0.0 { cdf } else { cdf + x * pdf };
    (x * cdf, slope)
}

struct Forward<'a, S> {
    x: &'a [S],
    out: &'a mut [S],
}

impl<S: Scalar> pulp::WithSimd for Forward<'_, S> {
    type Output = ();
    // Inlined into pulp's `#[target_feature]` function, which is what lets the loop use it.
    #[inline(always)]
    fn with_simd<V: pulp::Simd>(self, _simd: V) {
        for (o, &x) in self.out.iter_mut().zip(self.x) {
            *o = gelu_erf_value(x);
        }
    }
}

struct Backward<'a, S> {
    g: &'a [S],
    x: &'a [S],
    out: &'a mut [S],
}

impl<S: Scalar> pulp::WithSimd for Backward<'_, S> {
    type Output = ();
    #[inline(always)]
    fn with_simd<V: pulp::Simd>(self, _simd: V) {
        for ((o, &g), &x) in self.out.iter_mut().zip(self.g).zip(self.x) {
            *o = g * gelu_erf_slope(x);
        }
    }
}

struct Both<'a, S> {
    x: &'a [S],
    value: &'a mut [S],
    slope: &'a mut [S],
}

impl<S: Scalar> pulp::WithSimd for Both<'_, S> {
    type Output = ();
    #[inline(always)]
    fn with_simd<V: pulp::Simd>(self, _simd: V) {
        let outs = self.value.iter_mut().zip(self.slope.iter_mut());
        for ((v, s), &x) in outs.zip(self.x) {
            (*v, *s) = gelu_erf_value_and_slope(x);
        }
    }
}

/// Where the f32 formula stops: at |x| >= 15 Phi(-|x|) < 4e-51, so x Phi(x) rounds to -0 or to
/// x and the slope to 0 or 1 in f32, which the formula then returns exactly.
const F32_END: f32 = 15.0;

/// A rational N(a) / D(a), fitted to exp(a^2 / 2) Phi(-a) on 0 <= a <= 15 to a relative 9.7e-9
/// (weighted least squares iterated towards minimax, in 40-digit arithmetic), 2.6e-8 with its
/// coefficients rounded to these f32s: under half an f32 ulp. Every coefficient is positive, so
/// Horner's rule never cancels.
const TAIL_NUM: [f32; 5] = [0.5, 0.44179332, 0.18587555, 0.041537393, 0.0042545237];
const TAIL_DEN: [f32; 6] = [
    1.0,
    1.6814718,
    1.2133651,
    0.47645316,
    0.10412426,
    0.010664413,
];

/// 2^64 and 2^-64: the scaled exponential stays a normal f32 down to exp(-112.5), so a tail
/// below f32's smallest normal is rounded once, at the end.
const SCALE_UP_EXPONENT: i32 = 64;
const SCALE_DOWN: f32 = 1.0 / 18_446_744_073_709_551_616.0;

/// 1/sqrt(2*pi) in f32.
const INV_SQRT_2PI_F32: f32 = INV_SQRT_2PI as f32;

/// (x Phi(x), Phi(x) + x phi(x)) of an f32 in f32 arithmetic, branch-free so that slices run
/// 8 or 16 lanes wide. Phi(-|x|) = exp(-x^2 / 2) N(|x|) / D(|x|), with x^2 split into an f32
/// and its exact remainder (so the exponential's argument carries no rounding) and Phi(|x|) = 1
/// minus that (at least 1/2, no cancellation). Over every f32 (the ignored exhaustive test
/// below) the value is within 6.5 ulps of the exact value and the slope within 4.7 ulps of its
/// larger term (it is 0 at x = -0.7518, where its two terms cancel); the fraction's Horner
/// steps and division make about half of that, the exponential most of the rest. NaN gives
/// NaN; gelu(-inf) = -inf * 0 = NaN as the formula says, gelu(inf) = inf; the slope tends to
/// its limits 0 and 1.
#[inline(always)]
fn gelu_f32(x: f32) -> (f32, f32) {
    let a = x.abs();
    let square = x * x;
    let square_rest = x.mul_add(x, -square);
    let e = exp_scaled(-0.5 * square, -0.5 * square_rest);
    // Past F32_END (or for an infinite x) the tail and density are 0; NaN passes through.
    let (e, a, x_finite) = if a >= F32_END {
        (0.0, F32_END, 0.0)
    } else {
        (e, a, x)
    };
    let mut num = TAIL_NUM[4];
    for &c in TAIL_NUM[..4].iter().rev() {
        num = num.mul_add(a, c);
    }
    let mut den = TAIL_DEN[5];
    for &c in TAIL_DEN[..5].iter().rev() {
        den = den.mul_add(a, c);
    }
    // Phi(-|x|) and phi(x), both times 2^64.
    let tail = e * (num / den);
    let density = e * INV_SQRT_2PI_F32;
    if x > 0.0 {
        let value = x * (-tail).mul_add(SCALE_DOWN, 1.0);
        let slope = x_finite.mul_add(density, -tail).mul_add(SCALE_DOWN, 1.0);
        (value, slope)
    } else {
        let value = (x * tail) * SCALE_DOWN;
        let slope = x_finite.mul_add(density, tail) * SCALE_DOWN;
        (value, slope)
    }
}

/// 1.5 * 2^23: adding it rounds an f32 of magnitude below 2^22 to an integer, held in the low
/// bits.
const SHIFTER: f32 = 12_582_912.0;
/// ln 2 rounded to f32, and the rest. `n * LN2_HI` is a multiple of 2^-24, so the first step of
/// the reduction below is exact.
const LN2_HI: f32 = std::f32::consts::LN_2;
const LN2_LO: f32 = (std::f64::consts::LN_2 - std::f32::consts::LN_2 as f64) as f32;

/// exp(a + rest) * 2^64 for -113 <= a <= 0 and |rest| <= ulp(a), to about an ulp: a = n ln 2 +
/// r with |r| <= ln 2 / 2, `rest` added to r (one rounding of an r-sized value), exp(r) by a
/// degree-6 polynomial (fitted like the tail's fraction: relative 1.9e-9, 1.7e-8 with f32
/// coefficients), times 2^(n + 64) built in the exponent bits. Outside that range the result is
/// meaningless and the caller discards it.
#[inline(always)]
fn exp_scaled(a: f32, rest: f32) -> f32 {
    const EXP_POLY: [f32; 7] = [
        1.0,
        1.0,
        0.4999999,
        0.1666642,
        0.04166816,
        0.008374847,
        0.001384055,
    ];
    let t = a.mul_add(std::f32::consts::LOG2_E, SHIFTER);
    let n = t - SHIFTER;
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, a)) + rest;
    let mut p = EXP_POLY[6];
    for &c in EXP_POLY[..6].iter().rev() {
        p = p.mul_add(r, c);
    }
    // n lies in [-163, 0] on the range, so n + 64 + 127 in [28, 191]: a normal exponent field.
    let n_bits = t.to_bits().wrapping_sub(SHIFTER.to_bits()) as i32;
    let exponent = n_bits.wrapping_add(SCALE_UP_EXPONENT + 127) as u32;
    p * f32::from_bits(exponent.wrapping_shl(23))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Phi by libm's erfc, the reference (correct to about an f64 ulp).
    fn phi(x: f64) -> f64 {
        0.5 * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
    }

    /// Arguments over the fitted range and past it, the slope's zero, the edges, the tails and
    /// the specials.
    fn arguments() -> Vec<f64> {
        let mut xs: Vec<f64> = (-40_000..=40_000).map(|i| f64::from(i) * 1e-3).collect();
        let spread = (0..1200).map(|i| 1e-3 * 1.01f64.powi(i));
        xs.extend(spread.flat_map(|x| [x, -x]));
        for edge in [0.7518, 13.2, 14.2, 14.6, f64::from(F32_END), 37.5, 38.0] {
            let bits = (edge as f32).to_bits();
            for b in bits - 3..=bits + 3 {
                let e = f64::from(f32::from_bits(b));
                xs.extend([e, -e]);
            }
        }
        xs.extend([0.0, -0.0, 1e-30, -1e-30, 1e-45, -1e-45]);
        xs
    }

    /// The exact value and slope (from libm's f64 `erfc`, far more accurate than an f32) and the
    /// size of the slope's larger term, the scale its error is measured on.
    fn exact(x: f64) -> (f64, f64, f64) {
        let (value, slope) = gelu_f64(x);
        let density_term = x * (-0.5 * x * x).exp() * INV_SQRT_2PI;
        (value, slope, phi(x).max(density_term.abs()))
    }

    /// The distance of `got` from `want` in f32 ulps of `scale` (the subnormal ulp at the bottom).
    fn ulps(got: f32, want: f64, scale: f64) -> f64 {
        let scale = (scale.abs() as f32).max(f32::MIN_POSITIVE);
        let ulp =
            f64::from(f32::from_bits(scale.to_bits() & 0x7f80_0000)) * f64::from(f32::EPSILON);
        (f64::from(got) - want).abs() / ulp
    }

    /// The f32 slice kernels' values and slopes on the given arguments: the largest errors in
    /// ulps (of the value, and of the slope's larger term).
    fn worst_errors(xs: &[f32]) -> (f64, f64) {
        let mut value = vec![0.0f32; xs.len()];
        gelu_erf(xs, &mut value);
        let mut slope = vec![0.0f32; xs.len()];
        gelu_erf_backward(&vec![1.0f32; xs.len()], xs, &mut slope);
        let (mut worst_value, mut worst_slope) = (0.0f64, 0.0f64);
        for ((&x, &v), &s) in xs.iter().zip(&value).zip(&slope) {
            let (want_value, want_slope, terms) = exact(f64::from(x));
            worst_value = worst_value.max(ulps(v, want_value, want_value));
            worst_slope = worst_slope.max(ulps(s, want_slope, terms));
        }
        (worst_value, worst_slope)
    }

    /// The bounds the f32 kernel states: the value within 7 ulps of the exact value, the slope
    /// within 5 ulps of its larger term. The one-element rule (scalars, and tensors the slice
    /// kernels do not take) gives the slice kernels' bits.
    #[test]
    fn f32_kernels_are_within_their_ulp_bounds() {
        let xs: Vec<f32> = arguments().iter().map(|&x| x as f32).collect();
        let (value, slope) = worst_errors(&xs);
        assert!(value <= 7.0, "value off by {value} ulps");
        assert!(slope <= 5.0, "slope off by {slope} ulps");
        let mut value = vec![0.0f32; xs.len()];
        gelu_erf(&xs, &mut value);
        let mut slope = vec![0.0f32; xs.len()];
        gelu_erf_backward(&vec![1.0f32; xs.len()], &xs, &mut slope);
        for ((&x, v), s) in xs.iter().zip(value).zip(slope) {
            assert_eq!(gelu_erf_value(x).to_bits(), v.to_bits(), "gelu({x})");
            assert_eq!(gelu_erf_slope(x).to_bits(), s.to_bits(), "gelu'({x})");
        }
    }

    /// The same bounds on every f32 below `F32_END` in magnitude (about 2.2e9 of them, a minute
    /// or two on two cores): `cargo test --release -p tapegrad-tensor every_f32 -- --ignored
    /// --nocapture`.
    #[test]
    #[ignore = "exhaustive: run in release"]
    fn f32_kernels_are_within_their_ulp_bounds_on_every_f32() {
        let end = F32_END.to_bits();
        let ranges: Vec<(u32, u32)> = (0..64u32)
            .map(|k| (end / 64 * k, if k == 63 { end } else { end / 64 * (k + 1) }))
            .collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let worst = std::sync::Mutex::new((0.0f64, 0.0f64));
        std::thread::scope(|scope| {
            for _ in 0..std::thread::available_parallelism().map_or(2, |n| n.get()) {
                scope.spawn(|| loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&(lo, hi)) = ranges.get(k) else {
                        break;
                    };
                    let mut block = Vec::with_capacity(1 << 16);
                    let mut local = (0.0f64, 0.0f64);
                    for bits in lo..hi {
                        let x = f32::from_bits(bits);
                        block.extend([x, -x]);
                        if block.len() == 1 << 16 || bits + 1 == hi {
                            let (v, s) = worst_errors(&block);
                            local = (local.0.max(v), local.1.max(s));
                            block.clear();
                        }
                    }
                    let mut w = worst.lock().unwrap();
                    *w = (w.0.max(local.0), w.1.max(local.1));
                });
            }
        });
        let (value, slope) = *worst.lock().unwrap();
        println!("every f32 below {F32_END}: value {value:.3} ulps, slope {slope:.3} ulps");
        assert!(value <= 7.0 && slope <= 5.0);
    }

    #[test]
    fn f32_specials_keep_their_limits() {
        let xs = [
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            -0.0,
            0.0,
            -40.0,
            40.0,
        ];
        let mut out = [0.0f32; 7];
        gelu_erf(&xs, &mut out);
        let mut slope = [0.0f32; 7];
        gelu_erf_backward(&[1.0; 7], &xs, &mut slope);
        // -inf * Phi(-inf) = -inf * 0 is NaN, as the f64 formula gives.
        assert!(out[0].is_nan());
        assert_eq!(out[1], f32::INFINITY);
        assert!(out[2].is_nan() && slope[2].is_nan());
        assert_eq!((out[3].to_bits(), out[4].to_bits()), (0x8000_0000, 0));
        assert_eq!((out[5].to_bits(), out[6]), (0x8000_0000, 40.0));
        assert_eq!(
            [slope[0], slope[1], slope[3], slope[5], slope[6]],
            [0.0, 1.0, 0.5, 0.0, 1.0]
        );
    }

    #[test]
    fn f64_kernels_keep_the_libm_bits() {
        let xs: Vec<f64> = arguments();
        let mut out = vec![0.0f64; xs.len()];
        gelu_erf(&xs, &mut out);
        for (&x, &o) in xs.iter().zip(&out) {
            assert_eq!(o.to_bits(), (x * phi(x)).to_bits(), "gelu({x})");
        }
    }

    /// The fused pass gives the bits of the value kernel and of the slope the backward kernel
    /// multiplies by (a cotangent of ones), specials included, in f32 and f64.
    fn check_fused<S: Scalar>(xs: &[S]) {
        let n = xs.len();
        let (mut value, mut slope) = (vec![S::ZERO; n], vec![S::ZERO; n]);
        gelu_erf_with_slope(xs, &mut value, &mut slope);
        let (mut want_value, mut want_slope) = (vec![S::ZERO; n], vec![S::ZERO; n]);
        gelu_erf(xs, &mut want_value);
        gelu_erf_backward(&vec![S::ONE; n], xs, &mut want_slope);
        for i in 0..n {
            let bits = |v: S| v.to_f64().to_bits();
            assert_eq!(bits(value[i]), bits(want_value[i]), "gelu({:?})", xs[i]);
            assert_eq!(bits(slope[i]), bits(want_slope[i]), "gelu'({:?})", xs[i]);
        }
    }

    #[test]
    fn value_and_slope_in_one_pass_have_the_bits_of_the_two_kernels() {
        let mut xs = arguments();
        xs.extend([f64::NEG_INFINITY, f64::INFINITY, f64::NAN, 40.0, -40.0]);
        check_fused::<f64>(&xs);
        check_fused::<f32>(&xs.iter().map(|&x| x as f32).collect::<Vec<_>>());
    }
}
