//! scaled_dot_product_attention's PyTorch options: `dropout_p` with an explicit seed and a float
//! `attn_mask` (a differentiable fourth argument). Values against hand-computed softmaxes, laws 5
//! and 6 through `check_op`, fully masked rows (boolean or -inf) with output 0 and gradient 0,
//! errors naming the op and the value, the session method and the graph-file form.

use crate::ops_nn_support::{fwd, laws, random, rng, t, uniform};
use tapegrad_core::graph::GraphFile;
use tapegrad_core::laws::op_vjp;
use tapegrad_core::ops::nn::{dropout_mask, ScaledDotProductAttention};
use tapegrad_core::ops::Mask;
use tapegrad_core::{Op, Session, Shape, Tensor};

type Sdpa = ScaledDotProductAttention;

fn with_float_mask() -> Sdpa {
    Sdpa {
        float_mask: true,
        ..Sdpa::default()
    }
}

fn with_dropout(p: f64, seed: u64) -> Sdpa {
    Sdpa {
        dropout_p: p,
        seed,
        ..Sdpa::default()
    }
}

fn all_finite(t: &Tensor<f64>) -> bool {
    t.first_non_finite().is_none()
}

/// One query q = [1, 0, 1, 0] against keys [1, 1, 1, 1] and [0, 2, 0, 2] (E = 4, scale 1/2):
/// the scores are 1 and 0.
fn one_query() -> [Tensor<f64>; 3] {
    [
        t(&[1, 1, 1, 4], &[1., 0., 1., 0.]),
        t(&[1, 1, 2, 4], &[1., 1., 1., 1., 0., 2., 0., 2.]),
        t(&[1, 1, 2, 2], &[1., 10., 3., 30.]),
    ]
}

/// A float mask [0, 1] makes both scores 1, so the weights are 1/2 each and the output is the
/// mean of the values, [2, 20]. For the seed [1, 0]: dP = [1, 3], P.dP = 2, so the score (and
/// mask) gradient is P * (dP - 2) = [-1/2, 1/2], and dq = scale * (dz k) = [-1/4, 1/4, -1/4, 1/4].
#[test]
fn a_float_mask_is_added_to_the_scores_and_gets_their_gradient() {
    let [q, k, v] = one_query();
    let mask = t(&[2], &[0., 1.]);
    let op: Op = with_float_mask().into();
    let inputs = [&q, &k, &v, &mask];
    assert_eq!(fwd(&op, &inputs).data(), &[2., 20.]);
    let g = op_vjp(&op, &inputs, &t(&[1, 1, 1, 2], &[1., 0.])).unwrap();
    assert_eq!(g[3].data(), &[-0.5, 0.5]);
    assert_eq!(g[0].data(), &[-0.25, 0.25, -0.25, 0.25]);
    // dv = P^T seed: each value row gets half of the seed.
    assert_eq!(g[2].data(), &[0.5, 0., 0.5, 0.]);
}

/// A -inf entry masks its key exactly as `false` in a boolean mask: same output and gradients.
#[test]
fn minus_infinity_masks_like_false() {
    let mut r = rng(201);
    let (q, k, v) = (
        random(&mut r, &[2, 3, 3]),
        random(&mut r, &[2, 4, 3]),
        random(&mut r, &[2, 4, 2]),
    );
    let keep = [
        true, false, true, true, false, true, true, false, true, true, true, true,
    ];
    let bool_op: Op = Sdpa {
        attn_mask: Some(Mask::new(&[3, 4], keep.to_vec()).unwrap()),
        ..Sdpa::default()
    }
    .into();
    let float = t(
        &[3, 4],
        &keep.map(|b| if b { 0.0 } else { f64::NEG_INFINITY }),
    );
    let float_op: Op = with_float_mask().into();
    let seed = random(&mut r, &[2, 3, 2]);
    assert_eq!(
        fwd(&float_op, &[&q, &k, &v, &float]),
        fwd(&bool_op, &[&q, &k, &v])
    );
    let gf = op_vjp(&float_op, &[&q, &k, &v, &float], &seed).unwrap();
    let gb = op_vjp(&bool_op, &[&q, &k, &v], &seed).unwrap();
    assert_eq!(&gf[..3], &gb[..]);
    // The mask's gradient is 0 at the masked positions.
    for (i, &b) in keep.iter().enumerate() {
        if !b {
            assert_eq!(gf[3].data()[i], 0.0);
        }
    }
}

/// Fully masked rows (every key -inf, or false, even with dropout): output 0, gradient 0 to
/// every argument, no NaN in forward, VJP or JVP.
#[test]
fn fully_masked_rows_give_zero_output_and_zero_gradient() {
    let mut r = rng(202);
    let (q, k, v) = (
        random(&mut r, &[1, 2, 3, 2]),
        random(&mut r, &[1, 2, 4, 2]),
        random(&mut r, &[1, 2, 4, 3]),
    );
    let ninf = f64::NEG_INFINITY;
    // Row 1 is fully masked; rows 0 and 2 are not.
    let float = t(
        &[3, 4],
        &[
            0.5, ninf, -1., ninf, ninf, ninf, ninf, ninf, 0., 0.25, ninf, 2.,
        ],
    );
    let bool_mask = Mask::new(
        &[3, 4],
        (0..12)
            .map(|i| !(4..8).contains(&i) && i % 3 != 1)
            .collect(),
    )
    .unwrap();
    let cases: Vec<(Op, Vec<Tensor<f64>>)> = vec![
        (
            with_float_mask().into(),
            vec![q.clone(), k.clone(), v.clone(), float.clone()],
        ),
        (
            Sdpa {
                float_mask: true,
                ..with_dropout(0.3, 9)
            }
            .into(),
            vec![q.clone(), k.clone(), v.clone(), float],
        ),
        (
            Sdpa {
                attn_mask: Some(bool_mask),
                ..with_dropout(0.3, 9)
            }
            .into(),
            vec![q, k, v],
        ),
    ];
    for (op, inputs) in cases {
        let refs: Vec<&Tensor<f64>> = inputs.iter().collect();
        let out = op.forward(&refs).unwrap();
        assert!(all_finite(&out.value), "{op}");
        for head in 0..2 {
            assert_eq!(
                &out.value.data()[head * 9 + 3..head * 9 + 6],
                &[0.; 3],
                "{op}"
            );
        }
        let seed = random(&mut r, out.value.dims());
        let g = op_vjp(&op, &refs, &seed).unwrap();
        assert!(g.iter().all(all_finite), "{op}");
        for head in 0..2 {
            assert_eq!(&g[0].data()[head * 6 + 2..head * 6 + 4], &[0., 0.], "{op}");
        }
        if g.len() == 4 {
            assert_eq!(&g[3].data()[4..8], &[0.; 4], "{op}");
        }
        let tangents: Vec<Tensor<f64>> = inputs.iter().map(|x| random(&mut r, x.dims())).collect();
        let tr: Vec<&Tensor<f64>> = tangents.iter().collect();
        assert!(all_finite(&op.jvp(&refs, &out, &tr).unwrap()), "{op}");
        laws(&op, &inputs, &mut r);
    }
}

/// Dropout on the weights: P = softmax([1, 0]) = [e / (e + 1), 1 / (e + 1)] for the one-query
/// example. With p = 1/2 a kept weight is doubled, so for a seed whose mask over the two weights
/// is [keep, drop] the output is 2 P0 v0, and for [drop, drop] it is 0.
#[test]
fn dropout_uses_the_seeded_mask_on_the_weights() {
    let [q, k, v] = one_query();
    let e = 1f64.exp();
    let p0 = e / (e + 1.);
    let seed_with = |want: [bool; 2]| {
        (0u64..1000)
            .find(|&s| dropout_mask(s, 2, 0.5) == want)
            .expect("some seed draws this mask")
    };
    let op: Op = with_dropout(0.5, seed_with([true, false])).into();
    let y = fwd(&op, &[&q, &k, &v]);
    let want = [2. * p0 * 1., 2. * p0 * 10.];
    for (a, b) in y.data().iter().zip(want) {
        assert!((a - b).abs() < 1e-12, "{y:?} vs {want:?}");
    }
    // The VJP uses the same mask: value row 1 was dropped, so it gets no gradient.
    let g = op_vjp(&op, &[&q, &k, &v], &t(&[1, 1, 1, 2], &[1., 1.])).unwrap();
    assert_eq!(&g[2].data()[2..], &[0., 0.]);
    assert!((g[2].data()[0] - 2. * p0).abs() < 1e-12);
    let none: Op = with_dropout(0.5, seed_with([false, false])).into();
    assert_eq!(fwd(&none, &[&q, &k, &v]).data(), &[0., 0.]);
}

#[test]
fn dropout_same_seed_same_mask_and_p_zero_is_the_identity() {
    let mut r = rng(203);
    let (q, k, v) = (
        random(&mut r, &[2, 2, 5, 3]),
        random(&mut r, &[2, 2, 6, 3]),
        random(&mut r, &[2, 2, 6, 4]),
    );
    let x = [&q, &k, &v];
    let a = fwd(&with_dropout(0.4, 7).into(), &x);
    assert_eq!(a, fwd(&with_dropout(0.4, 7).into(), &x));
    assert_ne!(a, fwd(&with_dropout(0.4, 8).into(), &x));
    // p = 0 is exactly the op without dropout, whatever the seed.
    assert_eq!(
        fwd(&with_dropout(0.0, 123).into(), &x),
        fwd(&Sdpa::default().into(), &x)
    );
    // p = 1 drops everything: output and gradients 0.
    let all: Op = with_dropout(1.0, 3).into();
    assert!(fwd(&all, &x).is_all_zero());
    let g = op_vjp(&all, &x, &random(&mut r, &[2, 2, 5, 4])).unwrap();
    assert!(g.iter().all(|g| g.is_all_zero()));
}

#[test]
fn dropout_and_float_mask_laws() {
    let mut r = rng(204);
    // (op, query/key/value dims, float mask dims)
    type Case = (Sdpa, [Vec<usize>; 3], Option<Vec<usize>>);
    let cases: Vec<Case> = vec![
        (
            with_dropout(0.3, 11),
            [vec![2, 2, 3, 4], vec![2, 2, 5, 4], vec![2, 2, 5, 3]],
            None,
        ),
        (
            Sdpa {
                is_causal: true,
                ..with_dropout(0.5, 12)
            },
            [vec![1, 2, 4, 3], vec![1, 2, 4, 3], vec![1, 2, 4, 2]],
            None,
        ),
        (
            Sdpa {
                attn_mask: Some(Mask::from_tensor(&uniform(&mut r, &[3, 4], 0., 1.), |v| {
                    v > 0.3
                })),
                scale: Some(0.8),
                ..with_dropout(0.25, 13)
            },
            [vec![2, 3, 2], vec![2, 4, 2], vec![2, 4, 3]],
            None,
        ),
        // Float masks of every broadcast form: (L, S), (B, 1, L, S), (S), (1, 1, 1, S), full.
        (
            with_float_mask(),
            [vec![2, 2, 3, 4], vec![2, 2, 5, 4], vec![2, 2, 5, 3]],
            Some(vec![3, 5]),
        ),
        (
            with_float_mask(),
            [vec![2, 3, 3, 2], vec![2, 3, 4, 2], vec![2, 3, 4, 1]],
            Some(vec![2, 1, 3, 4]),
        ),
        (
            Sdpa {
                scale: Some(2.0),
                ..with_float_mask()
            },
            [vec![3, 2], vec![4, 2], vec![4, 3]],
            Some(vec![4]),
        ),
        (
            Sdpa {
                float_mask: true,
                ..with_dropout(0.4, 14)
            },
            [vec![1, 2, 3, 2], vec![1, 2, 4, 2], vec![1, 2, 4, 2]],
            Some(vec![1, 1, 1, 4]),
        ),
        (
            with_float_mask(),
            [vec![2, 3, 2], vec![2, 5, 2], vec![2, 5, 2]],
            Some(vec![2, 3, 5]),
        ),
    ];
    for (op, [qd, kd, vd], mask) in cases {
        let mut inputs = vec![
            random(&mut r, &qd),
            random(&mut r, &kd),
            random(&mut r, &vd),
        ];
        if let Some(md) = mask {
            inputs.push(random(&mut r, &md));
        }
        laws(&op.into(), &inputs, &mut r);
    }
}

#[test]
fn bad_attention_options_are_errors_naming_the_value() {
    let s = |d: &[usize]| Shape::new(d).unwrap();
    let (q, k, v) = (s(&[2, 3, 4]), s(&[2, 5, 4]), s(&[2, 5, 6]));
    let err = |op: Sdpa, shapes: &[&Shape]| {
        Op::from(op)
            .output_shape(shapes)
            .expect_err("expected an error")
            .to_string()
    };
    for p in [-0.1, 1.5, f64::NAN] {
        let e = err(with_dropout(p, 0), &[&q, &k, &v]);
        assert!(
            e.contains("scaled_dot_product_attention")
                && e.contains("dropout_p")
                && e.contains(&p.to_string()),
            "{e}"
        );
    }
    let m = s(&[3, 5]);
    let e = err(
        Sdpa {
            is_causal: true,
            ..with_float_mask()
        },
        &[&q, &k, &v, &m],
    );
    assert!(e.contains("is_causal"), "{e}");
    let e = err(
        Sdpa {
            attn_mask: Some(Mask::new(&[3, 5], vec![true; 15]).unwrap()),
            ..with_float_mask()
        },
        &[&q, &k, &v, &m],
    );
    assert!(e.contains("attn_mask") && e.contains("twice"), "{e}");
    let e = err(with_float_mask(), &[&q, &k, &v, &s(&[5, 3])]);
    assert!(
        e.contains("scaled_dot_product_attention")
            && e.contains("[5, 3]")
            && e.contains("[2, 3, 5]"),
        "{e}"
    );
    // The float mask is an argument: three arguments are an arity error.
    let e = err(with_float_mask(), &[&q, &k, &v]);
    assert!(
        e.contains("scaled_dot_product_attention") && e.contains('4'),
        "{e}"
    );
}

/// Through the session: the mask is a variable with a gradient. Adding a constant to a whole row
/// of scores leaves the softmax unchanged, so each row of the mask's gradient sums to 0.
#[test]
fn session_float_mask_gets_a_gradient_whose_rows_sum_to_zero() {
    let mut r = rng(205);
    let mut s = Session::<f64>::new();
    let q = s.parameter("q", random(&mut r, &[2, 2, 3, 4])).unwrap();
    let k = s.parameter("k", random(&mut r, &[2, 2, 5, 4])).unwrap();
    let v = s.parameter("v", random(&mut r, &[2, 2, 5, 3])).unwrap();
    let m = s.parameter("mask", random(&mut r, &[3, 5])).unwrap();
    let y = s
        .scaled_dot_product_attention_with_mask(q, k, v, m, with_dropout(0.2, 4))
        .unwrap();
    let y2 = s.mul(y, y).unwrap();
    let l = s.sum(y2).unwrap();
    let g = s.backward(l).unwrap();
    let gm = g.get("mask").unwrap();
    assert!(gm.data().iter().any(|&x| x.abs() > 1e-6));
    for row in gm.data().chunks(5) {
        let total: f64 = row.iter().sum();
        assert!(total.abs() < 1e-12, "{row:?}");
    }
    // The plain method ignores a stray float_mask flag (it has no mask argument).
    let y = s
        .scaled_dot_product_attention(q, k, v, with_float_mask())
        .unwrap();
    assert_eq!(s.value(y).unwrap().dims(), &[2, 2, 3, 3]);
}

#[test]
fn graph_files_carry_dropout_and_the_float_mask() {
    let text = r#"{"format": "tapegrad-graph/1",
 "inputs": [
  {"name": "q", "shape": [1, 1, 4], "data": [1, 0, 1, 0], "requires_grad": true},
  {"name": "k", "shape": [1, 2, 4], "data": [1, 1, 1, 1, 0, 2, 0, 2], "requires_grad": true},
  {"name": "v", "shape": [1, 2, 2], "data": [1, 10, 3, 30], "requires_grad": true},
  {"name": "m", "shape": [2], "data": [0, 1], "requires_grad": true},
  {"name": "hide", "shape": [2], "data": ["-inf", 0]}],
 "nodes": [
  {"name": "a", "op": "scaled_dot_product_attention", "args": ["q", "k", "v", "m"]},
  {"name": "b", "op": "scaled_dot_product_attention", "args": ["q", "k", "v", "hide"], "attrs": {"dropout_p": 0.5, "seed": 42}},
  {"name": "c", "op": "scaled_dot_product_attention", "args": ["q", "k", "v"], "attrs": {"dropout_p": 0.25, "seed": 18446744073709551615, "scale": 0.5}},
  {"name": "s", "op": "add", "args": ["a", "b"]}]}"#;
    let file = GraphFile::parse(text).unwrap_or_else(|e| panic!("{e}"));
    let written = file.to_json().unwrap();
    let again = GraphFile::parse(&written).unwrap_or_else(|e| panic!("{e}\n{written}"));
    assert_eq!(again, file, "{written}");
    let want: [Op; 3] = [
        with_float_mask().into(),
        Sdpa {
            float_mask: true,
            ..with_dropout(0.5, 42)
        }
        .into(),
        Sdpa {
            scale: Some(0.5),
            ..with_dropout(0.25, u64::MAX)
        }
        .into(),
    ];
    let values = file.graph.eval(&file.inputs::<f64>().unwrap()).unwrap();
    // Node a is the hand-computed example above.
    assert_eq!(values[5].data(), &[2., 20.]);
    for (i, op) in want.iter().enumerate() {
        assert_eq!(&file.graph.nodes()[i].op, op);
        let args: Vec<&Tensor<f64>> = file.graph.nodes()[i]
            .args
            .iter()
            .map(|&a| &values[a])
            .collect();
        assert_eq!(values[5 + i], fwd(op, &args), "{op}");
    }
}
