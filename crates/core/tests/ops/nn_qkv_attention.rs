//! qkv_attention: the same bits as the composition it replaces (split into heads,
//! scaled_dot_product_attention, merge), forward and gradient, on f32 and f64, for causal, plain,
//! scaled and dropout variants, on the GPT preset's shape and small odd ones; its laws; its
//! shape errors.

use crate::ops_nn_support::{laws, rng, uniform};
use rand::Rng;
use tapegrad_core::ops::nn::{QkvAttention, ScaledDotProductAttention};
use tapegrad_core::{Scalar, Session, Shape, Tensor};

/// `qkv_attention`'s definition, op by op: the path a GPT layer took before the fused op.
fn composed<S: Scalar>(
    s: &mut Session<S>,
    qkv: tapegrad_core::Var,
    op: &QkvAttention,
) -> tapegrad_core::Var {
    let dims = s.value(qkv).unwrap().dims().to_vec();
    let r = dims.len();
    let (t, e) = (dims[r - 2] as isize, (dims[r - 1] / 3) as isize);
    let h = op.heads as isize;
    let lead: Vec<isize> = dims[..r - 2].iter().map(|&d| d as isize).collect();
    let mut five = lead.clone();
    five.extend([t, 3, h, e / h]);
    let x = s.reshape(qkv, &five).unwrap();
    // [..., T, 3, H, D] -> [3, ..., H, T, D]
    let n = lead.len();
    let mut order = vec![n + 1];
    order.extend(0..n);
    order.extend([n + 2, n, n + 3]);
    let order: Vec<isize> = order.into_iter().map(|a| a as isize).collect();
    let x = s.permute(x, &order).unwrap();
    let q = s.select(x, 0, 0).unwrap();
    let k = s.select(x, 0, 1).unwrap();
    let v = s.select(x, 0, 2).unwrap();
    let y = s
        .scaled_dot_product_attention(
            q,
            k,
            v,
            ScaledDotProductAttention {
                is_causal: op.is_causal,
                scale: op.scale,
                dropout_p: op.dropout_p,
                seed: op.seed,
                ..Default::default()
            },
        )
        .unwrap();
    let y = s.transpose(y, n as isize, n as isize + 1).unwrap();
    let mut out = lead;
    out.extend([t, e]);
    s.reshape(y, &out).unwrap()
}

/// Forward value and the gradient of `qkv` under `seed`, fused and composed.
fn both<S: Scalar>(
    qkv: &Tensor<S>,
    seed: &Tensor<S>,
    op: &QkvAttention,
) -> [(Tensor<S>, Tensor<S>); 2] {
    let run = |fused: bool| {
        let mut s = Session::<S>::new();
        let x = s.parameter("qkv", qkv.clone()).unwrap();
        let y = if fused {
            s.qkv_attention(x, op.clone()).unwrap()
        } else {
            composed(&mut s, x, op)
        };
        let value = s.value(y).unwrap().clone();
        let g = s.backward_with(y, seed).unwrap();
        (value, g.get("qkv").unwrap().clone())
    };
    [run(true), run(false)]
}

/// Equal bit for bit, except that a zero may differ in sign (the composition adds the heads'
/// zero-filled gradients, which turns -0 into +0).
fn same<S: Scalar>(a: &Tensor<S>, b: &Tensor<S>) -> bool {
    a.dims() == b.dims()
        && a.data().iter().zip(b.data()).all(|(x, y)| {
            let (x, y) = (x.to_f64(), y.to_f64());
            x.to_bits() == y.to_bits() || (x == 0.0 && y == 0.0)
        })
}

fn random_tensor<S: Scalar>(r: &mut impl Rng, dims: &[usize]) -> Tensor<S> {
    let n: usize = dims.iter().product();
    let data = (0..n)
        .map(|_| S::from_f64(r.random_range(-2.0..2.0)))
        .collect();
    Tensor::new(dims, data).unwrap()
}

fn check_equal_to_composition<S: Scalar>(seed: u64) {
    let mut r = rng(seed);
    // (leading dims, T, heads, head width): the GPT preset's shape, then small odd ones.
    let cases: [(&[usize], usize, usize, usize); 7] = [
        (&[4], 64, 4, 32),
        (&[2], 5, 2, 3),
        (&[], 7, 3, 2),
        (&[2, 3], 4, 1, 5),
        (&[1], 1, 2, 1),
        (&[3], 17, 2, 16),
        (&[2], 33, 1, 8),
    ];
    for (lead, t, heads, d) in cases {
        let mut dims = lead.to_vec();
        dims.extend([t, 3 * heads * d]);
        let mut out = lead.to_vec();
        out.extend([t, heads * d]);
        for variant in 0..4 {
            let op = QkvAttention {
                heads,
                is_causal: variant != 1,
                scale: (variant == 2).then_some(0.5),
                dropout_p: if variant == 3 { 0.3 } else { 0.0 },
                seed: if variant == 3 { r.random() } else { 0 },
            };
            let qkv = random_tensor::<S>(&mut r, &dims);
            let cot = random_tensor::<S>(&mut r, &out);
            let [(y, g), (y0, g0)] = both(&qkv, &cot, &op);
            assert!(same(&y, &y0), "{op} forward on {dims:?}");
            assert!(same(&g, &g0), "{op} gradient on {dims:?}");
        }
    }
}

#[test]
fn qkv_attention_has_the_bits_of_its_composition_f32() {
    check_equal_to_composition::<f32>(1);
}

#[test]
fn qkv_attention_has_the_bits_of_its_composition_f64() {
    check_equal_to_composition::<f64>(2);
}

#[test]
fn qkv_attention_laws_hold() {
    let mut r = rng(3);
    for (dims, heads, is_causal, dropout_p) in [
        (&[2, 3, 12][..], 2, true, 0.0),
        (&[4, 6][..], 1, false, 0.0),
        (&[1, 2, 5, 9][..], 3, true, 0.4),
    ] {
        let op = QkvAttention {
            heads,
            is_causal,
            dropout_p,
            seed: 9,
            ..Default::default()
        }
        .into();
        laws(&op, &[uniform(&mut r, dims, -2.0, 2.0)], &mut r);
    }
}

/// An error that names the op and says `why`.
fn rejects(op: &tapegrad_core::Op, x: &Tensor<f64>, why: &str) {
    match op.forward(&[x]) {
        Ok(_) => panic!("{op} on {:?} should fail: {why}", x.dims()),
        Err(err) => {
            let text = err.to_string();
            assert!(
                text.contains("qkv_attention") && text.contains(why),
                "{text}"
            );
        }
    }
}

#[test]
fn qkv_attention_rejects_bad_shapes_and_heads() {
    let x = Tensor::<f64>::zeros(&Shape::new(vec![2, 4, 12]).unwrap());
    let op = |heads| -> tapegrad_core::Op {
        QkvAttention {
            heads,
            ..Default::default()
        }
        .into()
    };
    rejects(&op(0), &x, "heads must be at least 1");
    rejects(&op(3), &x, "not 3 x heads (3) x a head width");
    let flat = Tensor::<f64>::zeros(&Shape::new(vec![12]).unwrap());
    rejects(&op(1), &flat, "rank 2 or more");
    let bad_p = QkvAttention {
        heads: 2,
        dropout_p: 1.5,
        ..Default::default()
    };
    rejects(&bad_p.into(), &x, "dropout_p");
}
