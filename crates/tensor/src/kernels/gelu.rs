//! The exact (erf) GELU, `x * Phi(x)`, and its derivative `Phi(x) + x * phi(x)` over slices. f32
//! evaluates Phi in f64 with W. J. Cody's rational approximations (netlib specfun `ANORM`) and an
//! inline `exp`, branch-free so the loops vectorise; f64 keeps libm's `erfc`, correct to its ulp.

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

/// `x * Phi(x)` of one element, rounded from f64 (the bits of [`gelu_erf`]).
#[inline(always)]
pub fn gelu_erf_value<S: Scalar>(x: S) -> S {
    gelu_erf_value_and_slope(x).0
}

/// `Phi(x) + x * phi(x)` of one element, rounded from f64 (the factor [`gelu_erf_backward`]
/// multiplies by).
#[inline(always)]
pub fn gelu_erf_slope<S: Scalar>(x: S) -> S {
    gelu_erf_value_and_slope(x).1
}

/// The value and the slope of one element from one evaluation of Phi and phi (inlined, so a
/// caller that takes one of them computes only that one). Where the density underflows to 0 the
/// slope's second term is 0 (not `inf * 0` for an infinite x), so it tends to its limits 0 and 1.
#[inline(always)]
fn gelu_erf_value_and_slope<S: Scalar>(x: S) -> (S, S) {
    let x = x.to_f64();
    let (cdf, pdf) = normal_cdf_density::<S>(x);
    let slope = if pdf == 0.0 { cdf } else { cdf + x * pdf };
    (S::from_f64(x * cdf), S::from_f64(slope))
}

/// (Phi(x), phi(x)) in f64, as accurate as `S` needs: to a few f64 ulps (Cody's approximation,
/// whose rounding to f32 is the correctly rounded f32 but for rare near-ties) for f32, libm's
/// `erfc` for f64.
#[inline(always)]
fn normal_cdf_density<S: Scalar>(x: f64) -> (f64, f64) {
    match S::DTYPE {
        DType::F32 => cody_cdf_density(x),
        DType::F64 => {
            // erfc, not (1 + erf) / 2, which cancels for negative x.
            let cdf = 0.5 * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2);
            (cdf, (-0.5 * x * x).exp() * INV_SQRT_2PI)
        }
    }
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

/// Cody's `ANORM` coefficients for 0.66291 < |x| <= sqrt(32) (netlib specfun; W. J. Cody,
/// "Rational Chebyshev approximations for the error function", Math. Comp. 23, 1969), where
/// Phi(-|x|) = exp(-x^2 / 2) C(|x|) / D(|x|) to about 18 digits. The same fraction stays within
/// 5e-12 of exp(x^2 / 2) Phi(-|x|) below 0.66291 and within 2e-10 up to |x| = 12.5 (3e-10 at 14,
/// 6e-10 at 15; checked against libm below): far inside an f32's half ulp, 3e-8, wherever
/// x Phi(x) is an f32 above its subnormals. So one fraction serves every f32, with one division
/// and no branch. The digits are Cody's as published (they parse to the same f64s).
#[allow(clippy::excessive_precision)]
const C: [f64; 9] = [
    0.39894151208813466764,
    8.8831497943883759412,
    93.506656132177855979,
    597.27027639480026226,
    2494.5375852903726711,
    6848.1904505362823326,
    11602.651437647350124,
    9842.7148383839780218,
    1.0765576773720192317e-8,
];
#[allow(clippy::excessive_precision)]
const D: [f64; 8] = [
    22.266688044328115691,
    235.38790178262499861,
    1519.377599407554805,
    6485.558298266760755,
    18615.571640885098091,
    34900.952721145977266,
    38912.003286093271411,
    19685.429676859990727,
];

/// Where the fraction is evaluated at most: past it Phi(-|x|) is below 1e-300, so the value
/// only has to stay finite (C / D at infinity would be NaN).
const FRACTION_END: f64 = 40.0;

/// (Phi(x), phi(x)) for an f32 `x` held in f64: Phi(-|x|) = exp(-x^2 / 2) C(|x|) / D(|x|) and
/// Phi(|x|) = 1 minus that (at least 1/2, so no cancellation). One `exp`, which the density
/// shares, whose argument is exact (x^2 of an f32 has 48 bits); the polynomials run on
/// `mul_add`, one rounding each on every CPU. NaN gives NaN; Phi(-inf) = 0, Phi(inf) = 1,
/// phi(+-inf) = 0.
#[inline(always)]
fn cody_cdf_density(x: f64) -> (f64, f64) {
    let y = x.abs();
    let y = if y < FRACTION_END { y } else { FRACTION_END };
    // Cody's nested form ((C8 y + C0) y + C1) y ... and (y + D0) y + D1 ..., by Horner.
    let mut num = C[8];
    let mut den = 1.0f64;
    for i in 0..7 {
        num = num.mul_add(y, C[i]);
        den = den.mul_add(y, D[i]);
    }
    let num = num.mul_add(y, C[7]);
    let den = den.mul_add(y, D[7]);
    let e = exp_nonpositive(-0.5 * (x * x));
    let lower_tail = e * (num / den);
    let cdf = if x > 0.0 {
        1.0 - lower_tail
    } else {
        lower_tail
    };
    (cdf, e * INV_SQRT_2PI)
}

/// 1.5 * 2^52: adding it rounds an f64 of magnitude below 2^51 to an integer, held in the low bits.
const SHIFTER: f64 = 6_755_399_441_055_744.0;
/// ln 2 split so that `n * LN2_HI` is exact for |n| < 2^20 (fdlibm's constants, as published).
#[allow(clippy::excessive_precision)]
const LN2_HI: f64 = 6.931_471_803_691_238_164_90e-1;
#[allow(clippy::excessive_precision)]
const LN2_LO: f64 = 1.908_214_929_270_587_700_02e-10;

/// exp(a) for a <= 0 (or NaN), to a few ulps, without a call: a = n ln 2 + r with |r| <= ln 2 / 2,
/// exp(r) by its Taylor polynomial of degree 10 (truncation below 3e-13 relative), times 2^n
/// built in the exponent bits. Below -708 (where the result is near f64's smallest normal) it
/// gives 0: Phi is then far below f32's smallest subnormal.
#[inline(always)]
fn exp_nonpositive(a: f64) -> f64 {
    let clamped = if a < -708.0 { -708.0 } else { a };
    let t = clamped * std::f64::consts::LOG2_E + SHIFTER;
    let n = t - SHIFTER;
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, clamped));
    // 1/k! for k = 10 down to 0, by Horner.
    const INV_FACTORIAL: [f64; 11] = [
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ];
    let mut p = INV_FACTORIAL[0];
    for &c in &INV_FACTORIAL[1..] {
        p = p.mul_add(r, c);
    }
    // n is in [-1021, 0], so n + 1023 is a normal exponent field.
    let n_bits = t.to_bits().wrapping_sub(SHIFTER.to_bits());
    let scale = f64::from_bits(n_bits.wrapping_add(1023) << 52);
    if a < -708.0 {
        0.0
    } else {
        p * scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Phi by libm's erfc, the reference (correct to about an f64 ulp).
    fn phi(x: f64) -> f64 {
        0.5 * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
    }

    /// Arguments over every interval and its ends, the tails and the specials.
    fn arguments() -> Vec<f64> {
        let mut xs: Vec<f64> = (-40_000..=40_000).map(|i| f64::from(i) * 1e-3).collect();
        let spread = (0..1200).map(|i| 1e-3 * 1.01f64.powi(i));
        xs.extend(spread.flat_map(|x| [x, -x]));
        for edge in [0.66291, 5.656854248, 12.5, 14.6, 37.5, 38.0, FRACTION_END] {
            let bits = (edge as f32).to_bits();
            for b in bits - 3..=bits + 3 {
                let e = f64::from(f32::from_bits(b));
                xs.extend([e, -e]);
            }
        }
        xs.extend([0.0, -0.0, 1e-30, -1e-30, 1e-45, -1e-45]);
        xs
    }

    /// The bounds the coefficients' documentation states: relative errors of 5e-12 for |x| below
    /// 0.66291, 1e-12 on Cody's interval, 2e-10 to 12.5, 1e-9 to 15; beyond, only a value that
    /// rounds to 0 in f32 (below 1e-50).
    #[test]
    fn cody_cdf_is_within_its_stated_bounds_of_libm_erfc() {
        for x in arguments() {
            let x = f64::from(x as f32);
            let (cdf, pdf) = cody_cdf_density(x);
            let want = phi(x);
            let y = x.abs();
            let bound = match y {
                y if y <= 0.66291 => 5e-12,
                y if y <= 5.656854248 => 1e-12,
                y if y <= 12.5 => 2e-10,
                y if y <= 15.0 => 1e-9,
                _ => 1.0,
            };
            let err = (cdf - want).abs() / want;
            assert!(
                err <= bound || (cdf - want).abs() < 1e-50,
                "Phi({x}) = {cdf:e}, libm {want:e}, rel {err:e}"
            );
            let want = (-0.5 * x * x).exp() * INV_SQRT_2PI;
            let err = (pdf - want).abs() / want.max(1e-290);
            assert!(
                err <= 1e-12,
                "phi({x}) = {pdf:e}, libm {want:e}, rel {err:e}"
            );
        }
    }

    #[test]
    fn exp_matches_std_on_its_range() {
        let mut a = 0.0f64;
        while a > -720.0 {
            let want = a.exp();
            let got = exp_nonpositive(a);
            let err = (got - want).abs() / want.max(f64::MIN_POSITIVE);
            assert!(
                if a < -708.0 { got == 0.0 } else { err <= 5e-13 },
                "exp({a}) = {got:e}, std {want:e}"
            );
            a -= 0.001_37;
        }
        assert_eq!(exp_nonpositive(f64::NEG_INFINITY), 0.0);
        assert!(exp_nonpositive(f64::NAN).is_nan());
        assert_eq!(exp_nonpositive(0.0), 1.0);
    }

    /// The f32 slices give x Phi(x) and Phi + x phi rounded from the libm values: the same f32
    /// bits but for near-ties, which must then be one ulp apart at most.
    #[test]
    fn f32_kernels_round_the_libm_values() {
        let xs: Vec<f32> = arguments().iter().map(|&x| x as f32).collect();
        let mut out = vec![0.0f32; xs.len()];
        gelu_erf(&xs, &mut out);
        let ones = vec![1.0f32; xs.len()];
        let mut slope = vec![0.0f32; xs.len()];
        gelu_erf_backward(&ones, &xs, &mut slope);
        let mut differ = 0;
        for ((&x, &o), &s) in xs.iter().zip(&out).zip(&slope) {
            let xd = f64::from(x);
            let pdf = (-0.5 * xd * xd).exp() * INV_SQRT_2PI;
            let want_value = (xd * phi(xd)) as f32;
            let want_slope = (if pdf == 0.0 {
                phi(xd)
            } else {
                phi(xd) + xd * pdf
            }) as f32;
            for (got, want) in [(o, want_value), (s, want_slope)] {
                // The slope's zero below x = -37.6 may take either sign (libm's density is
                // subnormal there, ours 0).
                if got == want {
                    continue;
                }
                let ulps = (i64::from(got.to_bits() as i32) - i64::from(want.to_bits() as i32))
                    .unsigned_abs();
                assert!(ulps <= 1, "gelu at {x}: {got:e} against {want:e}");
                differ += usize::from(ulps != 0);
            }
        }
        assert!(differ * 10_000 < xs.len(), "{differ} near-ties");
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
