//! scaled_dot_product_attention with leading (batch, head) dimensions that broadcast, as
//! PyTorch's math kernel broadcasts them: multi-query attention (key and value `[B, 1, S, E]`
//! under a query `[B, H, L, E]`), fewer leading axes, a broadcast query or value. Each is checked
//! against the same call on arguments expanded to full size (values, and gradients summed back
//! over the broadcast axes), and by the per-op laws; shapes that do not broadcast are errors.

use crate::ops_nn_support::{fwd, laws, rng, uniform, vjp_with_needs};
use tapegrad_core::ops::nn::ScaledDotProductAttention;
use tapegrad_core::ops::Mask;
use tapegrad_core::{Op, Shape, Tensor};
use tapegrad_tensor::kernels::{broadcast_to, sum_to};

fn sdpa(is_causal: bool, attn_mask: Option<Mask>, float_mask: bool, dropout_p: f64) -> Op {
    ScaledDotProductAttention {
        is_causal,
        attn_mask,
        float_mask,
        dropout_p,
        seed: 7,
        ..Default::default()
    }
    .into()
}

fn shape(d: &[usize]) -> Shape {
    Shape::new(d).unwrap()
}

/// `[lead..., rows, cols]` with the leading dims of `lead`.
fn with_lead(lead: &[usize], rows: usize, cols: usize) -> Shape {
    let mut d = lead.to_vec();
    d.extend([rows, cols]);
    shape(&d)
}

/// The call on broadcast arguments equals the call on the arguments expanded to the output's
/// leading dimensions, and each gradient is the expanded call's summed back to its argument.
fn matches_expanded(op: &Op, q: &Tensor<f64>, k: &Tensor<f64>, v: &Tensor<f64>, lead: &[usize]) {
    let (l, e) = (q.dims()[q.rank() - 2], q.dims()[q.rank() - 1]);
    let (s, ev) = (k.dims()[k.rank() - 2], v.dims()[v.rank() - 1]);
    let big = [
        broadcast_to(q, &with_lead(lead, l, e)).unwrap(),
        broadcast_to(k, &with_lead(lead, s, e)).unwrap(),
        broadcast_to(v, &with_lead(lead, s, ev)).unwrap(),
    ];
    let y = fwd(op, &[q, k, v]);
    let want = fwd(op, &[&big[0], &big[1], &big[2]]);
    assert_eq!(y.shape(), want.shape(), "{op}");
    for (a, b) in y.data().iter().zip(want.data()) {
        assert!(
            (a - b).abs() <= 1e-12 * b.abs().max(1.0),
            "{op}: {y:?} vs {want:?}"
        );
    }
    let mut r = rng(5);
    let seed = uniform(&mut r, y.dims(), -1.0, 1.0);
    let got = vjp_with_needs(op, &[q, k, v], &seed, vec![true; 3]);
    let full = vjp_with_needs(op, &[&big[0], &big[1], &big[2]], &seed, vec![true; 3]);
    for (i, (g, f)) in got.iter().zip(&full).enumerate() {
        let g = g.as_ref().unwrap();
        let f = sum_to(f.as_ref().unwrap(), [q, k, v][i].shape()).unwrap();
        assert_eq!(g.shape(), f.shape(), "{op}: gradient {i}");
        for (a, b) in g.data().iter().zip(f.data()) {
            assert!(
                (a - b).abs() <= 1e-12 * b.abs().max(1.0),
                "{op}: gradient {i}: {g:?} vs {f:?}"
            );
        }
    }
}

/// The leading dimensions of a query, key and value, and of the output they give.
type Form = (
    &'static [usize],
    &'static [usize],
    &'static [usize],
    &'static [usize],
);

#[test]
fn broadcast_leading_dimensions_equal_the_expanded_call() {
    let mut r = rng(41);
    // (query lead, key lead, value lead, output lead)
    let forms: [Form; 7] = [
        (&[2, 3], &[2, 1], &[2, 1], &[2, 3]), // multi-query attention
        (&[2, 3], &[], &[], &[2, 3]),         // one key/value for every batch and head
        (&[2, 3], &[3], &[3], &[2, 3]),       // fewer leading axes
        (&[1, 3], &[2, 3], &[2, 3], &[2, 3]), // the query broadcast
        (&[], &[2], &[2], &[2]),              // a 2-D query
        (&[2, 3], &[2, 3], &[2, 1], &[2, 3]), // only the value broadcast
        (&[3], &[3], &[2, 3], &[2, 3]),       // the value's own batch
    ];
    for (ql, kl, vl, out) in forms {
        let (l, s, e, ev) = (3, 4, 2, 3);
        let q = uniform(&mut r, with_lead(ql, l, e).dims(), -2.0, 2.0);
        let k = uniform(&mut r, with_lead(kl, s, e).dims(), -2.0, 2.0);
        let v = uniform(&mut r, with_lead(vl, s, ev).dims(), -2.0, 2.0);
        let bool_mask = Mask::new(&[l, s], (0..l * s).map(|i| i % 3 != 1).collect()).unwrap();
        for op in [
            sdpa(false, None, false, 0.0),
            sdpa(true, None, false, 0.0),
            sdpa(false, Some(bool_mask), false, 0.0),
        ] {
            let y = fwd(&op, &[&q, &k, &v]);
            assert_eq!(
                y.shape(),
                &with_lead(out, l, ev),
                "{op} {ql:?} {kl:?} {vl:?}"
            );
            matches_expanded(&op, &q, &k, &v, out);
            laws(&op, &[q.clone(), k.clone(), v.clone()], &mut r);
        }
    }
}

#[test]
fn multi_query_attention_with_a_float_mask_and_dropout_obeys_the_laws() {
    let mut r = rng(43);
    let q = uniform(&mut r, &[2, 3, 4, 2], -2.0, 2.0);
    let k = uniform(&mut r, &[2, 1, 5, 2], -2.0, 2.0);
    let v = uniform(&mut r, &[2, 1, 5, 3], -2.0, 2.0);
    // A float mask over (heads, L, S): broadcast into the scores [2, 3, 4, 5].
    let m = uniform(&mut r, &[3, 4, 5], -1.0, 1.0);
    let op = sdpa(false, None, true, 0.0);
    assert_eq!(fwd(&op, &[&q, &k, &v, &m]).dims(), &[2, 3, 4, 3]);
    laws(&op, &[q.clone(), k.clone(), v.clone(), m], &mut r);
    let dropped = sdpa(false, None, false, 0.3);
    laws(&dropped, &[q, k, v], &mut r);
}

#[test]
fn leading_dimensions_that_do_not_broadcast_are_errors_naming_the_shapes() {
    let op = sdpa(false, None, false, 0.0);
    for (q, k, v) in [
        // Fewer heads in the key without enable_gqa: PyTorch rejects it too.
        (
            shape(&[2, 4, 3, 2]),
            shape(&[2, 2, 5, 2]),
            shape(&[2, 2, 5, 3]),
        ),
        (shape(&[2, 3, 2]), shape(&[3, 5, 2]), shape(&[3, 5, 3])),
        // Key and value that broadcast with the query but not with each other's batch.
        (shape(&[1, 3, 2]), shape(&[2, 5, 2]), shape(&[3, 5, 3])),
    ] {
        let err = op.output_shape(&[&q, &k, &v]).unwrap_err().to_string();
        for word in [
            "scaled_dot_product_attention",
            &q.to_string(),
            &k.to_string(),
        ] {
            assert!(err.contains(word), "'{err}' does not say '{word}'");
        }
    }
    // A mask must broadcast into the scores, not enlarge them (PyTorch adds it in place).
    let m = Mask::new(&[2, 3, 5], vec![true; 30]).unwrap();
    let err = sdpa(false, Some(m), false, 0.0)
        .output_shape(&[&shape(&[1, 3, 2]), &shape(&[1, 5, 2]), &shape(&[2, 5, 3])])
        .unwrap_err()
        .to_string();
    assert!(err.contains("attn_mask"), "{err}");
}

#[test]
fn f32_multi_query_attention_matches_f64() {
    let mut r = rng(47);
    let q = uniform(&mut r, &[2, 4, 3, 8], -1.0, 1.0);
    let k = uniform(&mut r, &[2, 1, 6, 8], -1.0, 1.0);
    let v = uniform(&mut r, &[2, 1, 6, 4], -1.0, 1.0);
    let op = sdpa(true, None, false, 0.0);
    let y64 = fwd(&op, &[&q, &k, &v]);
    let f32s = |t: &Tensor<f64>| t.cast::<f32>();
    let y32 = op
        .forward(&[&f32s(&q), &f32s(&k), &f32s(&v)])
        .unwrap()
        .value;
    for (a, b) in y32.data().iter().zip(y64.data()) {
        assert!((f64::from(*a) - b).abs() < 1e-5, "{a} vs {b}");
    }
}
