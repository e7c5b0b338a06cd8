//! The naive reference of the extreme-argument tests: an op at given arguments is a sum of terms,
//! each a product of one or two argument elements over a divisor, and its forward, VJP and JVP
//! all follow from that list; plus the small-integer values and comparisons both tests use, and
//! the check both run on a call their terms define.

#![allow(dead_code)]

use crate::op_support::no_panic_and_named;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tapegrad_core::ops::{Forward, Saved};
use tapegrad_core::{Op, Scalar, Tensor};

#[derive(Debug, Clone, Copy)]
pub struct Term {
    pub out: usize,
    /// (argument, flat index) of each factor.
    pub factors: [(usize, usize); 2],
    /// How many of `factors` are used (1 or 2).
    pub arity: usize,
    pub div: f64,
}

/// `args[arg][idx] / div`, added to output `out`.
pub fn one(out: usize, arg: usize, idx: usize, div: f64) -> Term {
    Term {
        out,
        factors: [(arg, idx), (0, 0)],
        arity: 1,
        div,
    }
}

/// `args[a] * args[b]`, added to output `out`.
pub fn two(out: usize, a: (usize, usize), b: (usize, usize)) -> Term {
    Term {
        out,
        factors: [a, b],
        arity: 2,
        div: 1.0,
    }
}

pub fn apply_terms(terms: &[Term], args: &[Vec<f64>], out_len: usize) -> Vec<f64> {
    let mut out = vec![0.0; out_len];
    for t in terms {
        let mut v = args[t.factors[0].0][t.factors[0].1];
        if t.arity == 2 {
            v *= args[t.factors[1].0][t.factors[1].1];
        }
        out[t.out] += v / t.div;
    }
    out
}

/// Calls `f(term, factor, partial)` for each factor of each term, with the term's partial
/// derivative in that factor: the other factor over the divisor (or one over it).
fn for_each_partial(
    terms: &[Term],
    args: &[Vec<f64>],
    mut f: impl FnMut(&Term, (usize, usize), f64),
) {
    for t in terms {
        for k in 0..t.arity {
            let other = if t.arity == 2 {
                let (oa, oi) = t.factors[1 - k];
                args[oa][oi]
            } else {
                1.0
            };
            f(t, t.factors[k], other / t.div);
        }
    }
}

pub fn vjp_terms(terms: &[Term], args: &[Vec<f64>], cot: &[f64]) -> Vec<Vec<f64>> {
    let mut grads: Vec<Vec<f64>> = args.iter().map(|a| vec![0.0; a.len()]).collect();
    for_each_partial(terms, args, |t, (arg, idx), partial| {
        grads[arg][idx] += cot[t.out] * partial;
    });
    grads
}

pub fn jvp_terms(
    terms: &[Term],
    args: &[Vec<f64>],
    tangents: &[Vec<f64>],
    out_len: usize,
) -> Vec<f64> {
    let mut out = vec![0.0; out_len];
    for_each_partial(terms, args, |t, (arg, idx), partial| {
        out[t.out] += tangents[arg][idx] * partial;
    });
    out
}

/// Small integers, so that sums of products are exact in f32 and f64.
pub fn ints(rng: &mut ChaCha8Rng, n: usize) -> Vec<f64> {
    (0..n).map(|_| rng.random_range(-3..=3) as f64).collect()
}

pub fn tensor<S: Scalar>(dims: &[usize], v: &[f64]) -> Tensor<S> {
    Tensor::new(dims, v.iter().map(|&x| S::from_f64(x)).collect()).unwrap()
}

pub fn values<S: Scalar>(t: &Tensor<S>) -> Vec<f64> {
    t.data().iter().map(|v| v.to_f64()).collect()
}

/// `got` equals `want` exactly (`exact`), or to 1e-9 (f64) / 1e-5 (f32) of the magnitude; a NaN
/// wanted (a mean over nothing) must be NaN.
pub fn close(got: &[f64], want: &[f64], exact: bool, eps: f64) -> bool {
    got.len() == want.len()
        && got.iter().zip(want).all(|(&g, &w)| {
            if w.is_nan() {
                g.is_nan()
            } else if exact {
                g == w
            } else {
                (g - w).abs() <= eps * (1.0 + w.abs())
            }
        })
}

/// `(sum of a_i b_i, sum of |a_i b_i|)`: a dot product and the scale of its rounding error.
pub fn dot(a: &[f64], b: &[f64]) -> (f64, f64) {
    a.iter()
        .zip(b)
        .fold((0.0, 0.0), |(s, m), (x, y)| (s + x * y, m + (x * y).abs()))
}

/// One call that succeeded, with the definition's terms and forward values, for
/// [`check_against_terms`].
pub struct Call<'a, S: Scalar> {
    pub op: &'a Op,
    pub shapes: &'a [Vec<usize>],
    pub inputs: &'a [&'a Tensor<S>],
    pub args: &'a [Vec<f64>],
    pub forward: &'a Forward<S>,
    /// The forward values the definition gives (the terms', or NaN for a mean over nothing).
    pub want: &'a [f64],
    pub out_dims: &'a [usize],
    pub terms: &'a [Term],
    /// Whether the values are exact on small integers (no division).
    pub exact: bool,
    pub eps: f64,
}

/// The call's forward against `want`, its VJP and JVP against the terms' partial derivatives
/// on random small-integer cotangents and tangents, and the adjoint identity
/// `<jvp(t), ct> = <t, vjp(ct)>` between them. The JVP of a mean over nothing is 0 here (one of
/// the documented differences from PyTorch).
pub fn check_against_terms<S: Scalar>(call: &Call<'_, S>, rng: &mut ChaCha8Rng) {
    let Call {
        op,
        shapes,
        inputs,
        args,
        forward,
        want,
        out_dims,
        terms,
        exact,
        eps,
    } = *call;
    let got = values(&forward.value);
    assert!(
        close(&got, want, exact, eps),
        "{op} on {shapes:?}: forward {got:?}, definition {want:?}"
    );
    let out_len: usize = out_dims.iter().product();
    let cot_v = ints(rng, out_len);
    let cot: Tensor<S> = tensor(out_dims, &cot_v);
    let saved = Saved::keep(op.saves(), inputs, forward, vec![true; inputs.len()]);
    let grads =
        no_panic_and_named(op, "vjp", || op.vjp(&saved.context(), &cot)).unwrap_or_else(|| {
            let err = op.vjp(&saved.context(), &cot).err().unwrap();
            panic!("{op}: vjp failed on {shapes:?}: {err}")
        });
    let want_grads = vjp_terms(terms, args, &cot_v);
    assert_eq!(grads.len(), args.len(), "{op}");
    let tan_v: Vec<Vec<f64>> = args.iter().map(|a| ints(rng, a.len())).collect();
    let tangents: Vec<Tensor<S>> = shapes
        .iter()
        .zip(&tan_v)
        .map(|(d, v)| tensor(d, v))
        .collect();
    let trefs: Vec<&Tensor<S>> = tangents.iter().collect();
    let jvp =
        no_panic_and_named(op, "jvp", || op.jvp(inputs, forward, &trefs)).unwrap_or_else(|| {
            let err = op.jvp(inputs, forward, &trefs).err().unwrap();
            panic!("{op}: jvp failed on {shapes:?}: {err}")
        });
    assert_eq!(jvp.dims(), out_dims, "{op}: jvp shape");
    let jvp_v = values(&jvp);
    let want_jvp = jvp_terms(terms, args, &tan_v, out_len);
    assert!(
        close(&jvp_v, &want_jvp, exact, eps),
        "{op} on {shapes:?}: jvp {jvp_v:?}, definition {want_jvp:?}"
    );

    let (mut lhs, mut scale) = dot(&jvp_v, &cot_v);
    let mut rhs = 0.0;
    for (i, (g, want)) in grads.iter().zip(&want_grads).enumerate() {
        let g = g
            .as_ref()
            .unwrap_or_else(|| panic!("{op}: no gradient for argument {i}"));
        assert_eq!(g.dims(), &shapes[i][..], "{op}: gradient {i} shape");
        let gv = values(g);
        assert!(
            close(&gv, want, exact, eps),
            "{op} on {shapes:?}: gradient {i} {gv:?}, definition {want:?}"
        );
        let (v, m) = dot(&gv, &tan_v[i]);
        rhs += v;
        scale += m;
    }
    if exact {
        assert_eq!(lhs, rhs, "{op}: <jvp, ct> != <t, vjp>");
    } else {
        lhs -= rhs;
        assert!(
            lhs.abs() <= eps * (1.0 + scale),
            "{op}: <jvp, ct> - <t, vjp> = {lhs}"
        );
    }
}
