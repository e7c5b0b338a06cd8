//! Law 4 with recomputation: a pass for input gradients leaves a cheap op's value (layer norm,
//! GELU) out of the record of the one node that reads it and recomputes it in the backward, and
//! attention recomputes its weights; the gradients keep their bits, and the pass keeps exactly
//! the tensors named here.

use crate::graph_support::{random_like, same_bits};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tapegrad_core::graph::{CompiledGraph, Graph};
use tapegrad_core::ops::activation::Gelu;
use tapegrad_core::ops::linalg::Linear;
use tapegrad_core::ops::nn::{LayerNorm, NnOp, ScaledDotProductAttention};
use tapegrad_core::ops::{ActivationOp, GeluApproximate, LinalgOp, Op};
use tapegrad_core::{Scalar, Shape, Tensor};

fn layer_norm(width: usize) -> Op {
    Op::Nn(Box::new(NnOp::LayerNorm(LayerNorm {
        normalized_shape: vec![width],
        eps: 1e-5,
        weight: true,
        bias: true,
    })))
}

fn gelu(approximate: GeluApproximate) -> Op {
    Op::Activation(ActivationOp::Gelu(Gelu { approximate }))
}

fn linear() -> Op {
    Op::Linalg(LinalgOp::Linear(Linear { bias: false }))
}

/// Random values for `g`'s inputs, and a seed for its output.
fn values<S: Scalar>(g: &Graph, seed: u64) -> (Vec<Tensor<S>>, Tensor<S>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let xs = g
        .inputs()
        .iter()
        .map(|x| random_like(&mut rng, &x.shape))
        .collect();
    let out = g.shape(g.last_slot().unwrap()).unwrap();
    (xs, random_like(&mut rng, out))
}

/// A normalised input `x` of `rows x width` with the layer norm's weight and bias, as inputs
/// that require grad.
fn norm_inputs(g: &mut Graph, rows: usize, width: usize) -> [usize; 3] {
    let shape = |d: &[usize]| Shape::new(d).unwrap();
    [
        g.input("x", shape(&[rows, width]), true).unwrap(),
        g.input("ln.weight", shape(&[width]), true).unwrap(),
        g.input("ln.bias", shape(&[width]), true).unwrap(),
    ]
}

/// `g` compiled, random inputs and output seed from `seed`, and what each node of a pass for
/// input gradients keeps, in f64.
fn lean_pass(g: &Graph, seed: u64) -> (CompiledGraph, Vec<Tensor<f64>>, Tensor<f64>, Vec<usize>) {
    let compiled = CompiledGraph::new(g.clone());
    let (xs, out_seed) = values::<f64>(g, seed);
    let by_node = compiled
        .forward_for_input_grads(&xs)
        .unwrap()
        .kept_bytes_by_node();
    (compiled, xs, out_seed, by_node)
}

/// The lean pass's gradients have the bits of the dense pass's (which recomputes nothing).
fn assert_same_gradients<S: Scalar>(compiled: &CompiledGraph, xs: &[Tensor<S>], seed: &Tensor<S>) {
    let dense = compiled.forward(xs).unwrap().backward(seed).unwrap();
    let lean = compiled
        .forward_for_input_grads(xs)
        .unwrap()
        .backward(seed)
        .unwrap();
    for (i, (a, b)) in dense.iter().zip(&lean).enumerate() {
        match (a, b) {
            (Some(a), Some(b)) => assert!(same_bits(a, b), "input {i}: {a:?} vs {b:?}"),
            (None, None) => {}
            _ => panic!("input {i}: {a:?} vs {b:?}"),
        }
    }
}

/// `linear(gelu(linear(layer_norm(x), w1)), w2)`: the two linears keep only their weights; layer
/// norm keeps its input, weight and bias (for the recomputation) and its statistics; GELU keeps
/// its input.
fn check_block<S: Scalar>(approximate: GeluApproximate) {
    let (rows, width, hidden, out) = (6, 16, 32, 8);
    let mut g = Graph::new();
    let shape = |d: &[usize]| Shape::new(d).unwrap();
    let [x, lw, lb] = norm_inputs(&mut g, rows, width);
    let w1 = g.input("fc.weight", shape(&[hidden, width]), true).unwrap();
    let w2 = g.input("proj.weight", shape(&[out, hidden]), true).unwrap();
    let n = g.node("ln", layer_norm(width), &[x, lw, lb]).unwrap();
    let h = g.node("fc", linear(), &[n, w1]).unwrap();
    let a = g.node("gelu", gelu(approximate), &[h]).unwrap();
    g.node("proj", linear(), &[a, w2]).unwrap();
    let compiled = CompiledGraph::new(g.clone());
    let (xs, seed) = values::<S>(&g, 3);
    let lean = compiled.forward_for_input_grads(&xs).unwrap();
    let by_node = lean.kept_bytes_by_node();
    let bytes = |n: usize| n * std::mem::size_of::<S>();
    // Layer norm: x, weight, bias and a mean and reciprocal deviation per row.
    assert_eq!(
        by_node[0],
        bytes(rows * width + 2 * width + 2 * rows),
        "{g}"
    );
    assert_eq!(
        by_node[1],
        bytes(hidden * width),
        "fc keeps its weight only"
    );
    assert_eq!(by_node[2], bytes(rows * hidden), "gelu keeps its input");
    assert_eq!(
        by_node[3],
        bytes(out * hidden),
        "proj keeps its weight only"
    );
    let dense = compiled.forward(&xs).unwrap();
    assert!(lean.kept_bytes() < dense.kept_bytes());
    assert_same_gradients(&compiled, &xs, &seed);
}

#[test]
fn a_training_pass_recomputes_layer_norm_and_gelu_for_the_linear_that_reads_them() {
    for approximate in [GeluApproximate::None, GeluApproximate::Tanh] {
        check_block::<f32>(approximate);
        check_block::<f64>(approximate);
    }
}

/// A value two nodes keep is kept (recomputing it for each would cost twice), and so is the
/// input of a recomputed node (its record holds it anyway): `gelu(layer_norm(x))` recomputes
/// GELU only, and a layer norm read by two linears is kept.
#[test]
fn a_value_read_by_a_recomputed_node_or_kept_by_two_nodes_stays_kept() {
    let (rows, width) = (5, 12);
    let shape = |d: &[usize]| Shape::new(d).unwrap();
    let mut g = Graph::new();
    let [x, lw, lb] = norm_inputs(&mut g, rows, width);
    let w = g.input("w", shape(&[7, width]), true).unwrap();
    let n = g.node("ln", layer_norm(width), &[x, lw, lb]).unwrap();
    let a = g.node("gelu", gelu(GeluApproximate::None), &[n]).unwrap();
    g.node("proj", linear(), &[a, w]).unwrap();
    let (compiled, xs, seed, by_node) = lean_pass(&g, 5);
    assert_eq!(
        by_node[1],
        8 * rows * width,
        "gelu keeps the layer norm's value"
    );
    assert_eq!(by_node[2], 8 * 7 * width, "proj keeps its weight only");
    assert_same_gradients(&compiled, &xs, &seed);

    let mut g = Graph::new();
    let [x, lw, lb] = norm_inputs(&mut g, rows, width);
    let w1 = g.input("w1", shape(&[7, width]), true).unwrap();
    let w2 = g.input("w2", shape(&[7, width]), true).unwrap();
    let n = g.node("ln", layer_norm(width), &[x, lw, lb]).unwrap();
    let p = g.node("p", linear(), &[n, w1]).unwrap();
    let q = g.node("q", linear(), &[n, w2]).unwrap();
    g.node(
        "sum",
        Op::Elementwise(tapegrad_core::ops::ElementwiseOp::Add(
            tapegrad_core::ops::elementwise::Add,
        )),
        &[p, q],
    )
    .unwrap();
    let (compiled, xs, seed, by_node) = lean_pass(&g, 6);
    assert_eq!(
        by_node[1],
        8 * (rows * width + 7 * width),
        "the first reader keeps the value and its weight"
    );
    assert_same_gradients(&compiled, &xs, &seed);
}

/// Causal attention keeps its query, key and value, not the (batch, heads, L, S) weights: its
/// VJP recomputes them, with the bits the forward had.
#[test]
fn attention_keeps_query_key_and_value_only() {
    let (b, h, t, d) = (2, 3, 7, 4);
    let shape = Shape::new([b, h, t, d]).unwrap();
    let mut g = Graph::new();
    let q = g.input("q", shape.clone(), true).unwrap();
    let k = g.input("k", shape.clone(), true).unwrap();
    let v = g.input("v", shape.clone(), true).unwrap();
    let attention = ScaledDotProductAttention {
        is_causal: true,
        ..ScaledDotProductAttention::default()
    };
    g.node(
        "attn",
        Op::Nn(Box::new(NnOp::ScaledDotProductAttention(attention))),
        &[q, k, v],
    )
    .unwrap();
    let compiled = CompiledGraph::new(g.clone());
    let (xs, seed) = values::<f32>(&g, 9);
    for pass in [
        compiled.forward(&xs).unwrap(),
        compiled.forward_for_input_grads(&xs).unwrap(),
    ] {
        assert_eq!(pass.kept_bytes_by_node()[0], 3 * 4 * shape.numel());
    }
    assert_same_gradients(&compiled, &xs, &seed);
}
