//! `exp` over slices for the attention softmax. f32 is evaluated in f64 arithmetic, branch-free
//! so the loop runs 8 or 16 lanes wide, and rounded once: the correctly rounded value except
//! within 1e-6 ulp of a tie (as libm's `expf`); f64 goes through libm element by element.

use crate::{DType, Scalar};

/// `x[i] = exp(x[i])` in place, each element with the bits of [`exp_value`].
pub fn exp_in_place<S: Scalar>(x: &mut [S]) {
    pulp::Arch::new().dispatch(InPlace { x })
}

/// `exp(x)` of one element: the bits [`exp_in_place`] gives it. For f32 it takes a dozen fused
/// multiply-adds, which code not compiled for FMA calls out for one by one: loops belong in
/// [`exp_in_place`] or in a caller running under pulp's dispatch.
#[inline(always)]
pub fn exp_value<S: Scalar>(x: S) -> S {
    match S::DTYPE {
        // Exact conversions both ways for an f32, which the compiler removes.
        DType::F32 => S::from_f64(exp_f32(x.to_f64() as f32).into()),
        DType::F64 => x.exp(),
    }
}

struct InPlace<'a, S> {
    x: &'a mut [S],
}

impl<S: Scalar> pulp::WithSimd for InPlace<'_, S> {
    type Output = ();
    // Inlined into pulp's `#[target_feature]` function, which is what lets the loop use it.
    #[inline(always)]
    fn with_simd<V: pulp::Simd>(self, _simd: V) {
        for v in self.x.iter_mut() {
            *v = exp_value(*v);
        }
    }
}

/// Arguments are clamped to this range first: below it every f32 result is 0, above it
/// infinite, and inside it `2^n` stays a normal f64.
const LOWEST: f64 = -110.0;
const HIGHEST: f64 = 90.0;

/// 1.5 * 2^52: adding it to a value below 2^51 in magnitude rounds that value to an integer,
/// held in the low bits of the sum's encoding.
const ROUNDING_SHIFT: f64 = 6_755_399_441_055_744.0;

/// ln 2 in two parts (fdlibm's, 0.693147180369 and 1.9082e-10): the first has its last 21
/// bits zero, so `n * LN2_HI` is exact for every `n` the clamp allows.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);

/// 1/k! for k = 0..=11: the Taylor polynomial of exp, whose remainder on |r| <= ln2/2 is below
/// 6.5e-15 of the value.
const TAYLOR: [f64; 12] = [
    1.0,
    1.0,
    0.5,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5040.0,
    1.0 / 40320.0,
    1.0 / 362_880.0,
    1.0 / 3_628_800.0,
    1.0 / 39_916_800.0,
];

/// exp of an f32, computed in f64 and rounded once. `x = n ln2 + r` with `n` the nearest
/// integer to `x / ln2` (so |r| <= ln2/2), `exp(r)` by its Taylor polynomial and `2^n` built
/// in the exponent field. The f64 value is within 7e-15 of exp(x) relative, so the f32 is
/// the correctly rounded one unless exp(x) lies within 1e-6 ulp of a tie. Subnormal results
/// are rounded once too. NaN gives NaN, -inf 0 and inf inf.
#[inline(always)]
fn exp_f32(x: f32) -> f32 {
    // `clamp` keeps NaN.
    let x = f64::from(x).clamp(LOWEST, HIGHEST);
    let shifted = x.mul_add(std::f64::consts::LOG2_E, ROUNDING_SHIFT);
    let n = shifted - ROUNDING_SHIFT;
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = TAYLOR[11];
    for &c in TAYLOR[..11].iter().rev() {
        p = p.mul_add(r, c);
    }
    // The low 12 bits of the shifted sum are those of n; n + 1023 lies in 1..2047.
    let two_to_n = f64::from_bits(shifted.to_bits().wrapping_add(1023) << 52);
    (p * two_to_n) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixed stream of 64-bit words (splitmix64), enough for test arguments.
    struct Words(u64);

    impl Words {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        /// Uniform in [lo, hi).
        fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
            let unit = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
            lo + (hi - lo) * unit
        }
    }

    /// The next f32 above (`up`) or below a finite `x` (`f32::next_up` and `next_down` are
    /// newer than the workspace's `rust-version`).
    fn step(x: f32, up: bool) -> f32 {
        if x == 0.0 {
            let tiny = f32::from_bits(1);
            return if up { tiny } else { -tiny };
        }
        let bits = x.to_bits();
        f32::from_bits(if (x > 0.0) == up { bits + 1 } else { bits - 1 })
    }

    /// Whether `got` is exp(x) correctly rounded, allowing either neighbour of a tie: the
    /// reference is libm's f64 `exp`, within an f64 ulp, so only a value within 1e-6 f32 ulp
    /// of a tie could be rounded either way.
    fn correctly_rounded(x: f32, got: f32) -> bool {
        let want = f64::from(x).exp();
        let nearest = want as f32;
        if got.to_bits() == nearest.to_bits() {
            return true;
        }
        if !(got.is_finite() && nearest.is_finite()) {
            return false;
        }
        let other = if f64::from(nearest) < want {
            step(nearest, true)
        } else {
            step(nearest, false)
        };
        let gap = (f64::from(other) - f64::from(nearest)).abs();
        let mid = (f64::from(other) + f64::from(nearest)) / 2.0;
        got == other && (want - mid).abs() <= 1e-6 * gap
    }

    fn check(xs: impl Iterator<Item = f32>) -> usize {
        let mut checked = 0;
        for x in xs {
            let got = exp_value(x);
            assert!(
                correctly_rounded(x, got),
                "exp({x:e}) = {got:e}, libm {:e}",
                f64::from(x).exp()
            );
            checked += 1;
        }
        checked
    }

    #[test]
    fn f32_is_correctly_rounded_on_random_and_edge_arguments() {
        let mut rng = Words(7);
        // Uniform over the range where the result is neither 0 nor infinite, and over the
        // softmax's usual arguments, plus random bit patterns over the whole range.
        let uniform = (0..400_000).map(|_| rng.uniform(-104.0, 89.0));
        assert_eq!(check(uniform), 400_000);
        let small = (0..200_000).map(|_| rng.uniform(-20.0, 0.0));
        assert_eq!(check(small), 200_000);
        let patterns = (0..400_000)
            .map(|_| f32::from_bits(rng.next() as u32))
            .filter(|x| x.abs() <= 104.0);
        assert!(check(patterns) > 100_000);
        // Around 0, the subnormal results, the last finite result and the first infinite one.
        let edges = [
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            1e-30,
            -1e-30,
            f32::EPSILON,
            -87.33655,
            -87.336_56,
            -103.27893,
            -103.972_08,
            -103.972_09,
            -104.0,
            88.72283,
            88.722_84,
        ];
        let near = edges.iter().flat_map(|&x: &f32| {
            [
                step(step(x, false), false),
                step(x, false),
                x,
                step(x, true),
            ]
        });
        check(near);
    }

    #[test]
    fn f32_specials_give_their_limits() {
        assert!(exp_value(f32::NAN).is_nan());
        assert_eq!(exp_value(f32::NEG_INFINITY).to_bits(), 0);
        assert_eq!(exp_value(-105.0f32).to_bits(), 0);
        assert_eq!(exp_value(-1000.0f32).to_bits(), 0);
        assert_eq!(exp_value(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_value(89.0f32), f32::INFINITY);
        assert_eq!(exp_value(0.0f32), 1.0);
        assert_eq!(exp_value(-0.0f32), 1.0);
        // A subnormal result, rounded once from the f64 value.
        let tiny = exp_value(-100.0f32);
        assert!(tiny > 0.0 && !tiny.is_normal());
        assert_eq!(tiny, (-100.0f64).exp() as f32);
    }

    #[test]
    fn slices_have_the_bits_of_one_element_and_f64_is_libm() {
        let mut rng = Words(8);
        // Lengths around the vector widths, so that both the lanes and the tail are used.
        for len in [0, 1, 7, 8, 9, 15, 16, 17, 33, 1000] {
            let xs: Vec<f32> = (0..len).map(|_| rng.uniform(-110.0, 95.0)).collect();
            let mut got = xs.clone();
            exp_in_place(&mut got);
            for (x, g) in xs.iter().zip(&got) {
                assert_eq!(g.to_bits(), exp_value(*x).to_bits(), "exp({x})");
            }
            let xs: Vec<f64> = xs.iter().map(|&x| f64::from(x) * 1.37).collect();
            let mut got = xs.clone();
            exp_in_place(&mut got);
            for (x, g) in xs.iter().zip(&got) {
                assert_eq!(g.to_bits(), x.exp().to_bits(), "exp({x})");
            }
        }
    }

    #[test]
    #[ignore = "about two minutes in release: every f32 whose exp is neither 0 nor infinite"]
    fn f32_is_correctly_rounded_on_every_f32() {
        // Both signs up to 104 in magnitude (positive ones past 88.73 give infinity, checked
        // as such): about 2.2 billion arguments.
        let top = 104.0f32.to_bits();
        let mut checked = 0usize;
        for bits in 0..=top {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                let got = exp_value(x);
                assert!(correctly_rounded(x, got), "exp({x:e}) = {got:e}");
                checked += 1;
            }
        }
        println!("{checked} arguments, each correctly rounded");
    }
}
