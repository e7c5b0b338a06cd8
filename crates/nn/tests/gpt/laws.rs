//! The laws on the GPT as `nn` builds it (f64, 2 layers, width 8, 2 heads, context 5): law 1
//! (executed = reference sweep, bit for bit, on the model's tape), law 4 (saved graph = graph
//! backprop, bit for bit), law 5 (adjoint) and law 6 (finite differences in random directions over
//! every parameter); the key/value-cache generation gives the full forward's logits; eager and
//! compiled steps give the same bits; the names and layouts are nanoGPT's.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tapegrad_core::graph::{CompiledGraph, Graph};
use tapegrad_core::tape::Rule;
use tapegrad_core::{audit, Session, Tensor};
use tapegrad_nn::backend::{make_backend, record_loss, BackendKind};
use tapegrad_nn::data::{Batch, BatchTargets};
use tapegrad_nn::gpt::generate::Generator;
use tapegrad_nn::layers::{Ctx, Mode};
use tapegrad_nn::rng::dropout_rng;
use tapegrad_nn::{Model, ModelSpec};

const VOCAB: usize = 7;

fn tiny(dropout: f64) -> ModelSpec {
    ModelSpec::Gpt {
        vocab: VOCAB,
        context: 5,
        layers: 2,
        heads: 2,
        embd: 8,
        mlp_ratio: 4,
        dropout,
        tie_weights: false,
    }
}

/// A model whose layer norms and biases are not at their initial 1 and 0, so every parameter's
/// gradient takes part.
fn model(seed: u64) -> Model<f64> {
    let mut m = Model::<f64>::new(&tiny(0.0), seed).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x55);
    for p in m.params.iter_mut() {
        let v: Vec<f64> = p
            .value
            .data()
            .iter()
            .map(|&x| x + rng.random_range(-0.3..0.3))
            .collect();
        p.value = Tensor::new(p.value.dims(), v).unwrap();
    }
    m
}

fn batch(seed: u64, rows: usize, t: usize) -> Batch<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let ids: Vec<usize> = (0..rows * (t + 1))
        .map(|_| rng.random_range(0..VOCAB))
        .collect();
    let mut x = Vec::new();
    let mut y = Vec::new();
    for r in 0..rows {
        let w = &ids[r * (t + 1)..(r + 1) * (t + 1)];
        x.extend(w[..t].iter().map(|&i| i as f64));
        y.extend_from_slice(&w[1..]);
    }
    Batch {
        x: Tensor::new(&[rows, t], x).unwrap(),
        y: BatchTargets::Classes(y),
    }
}

/// The model's forward and loss recorded on a session tape.
fn record(m: &Model<f64>, b: &Batch<f64>) -> (Session<f64>, usize) {
    let mut s = Session::new();
    let mut ctx = Ctx::new(&mut s, &m.params, Mode::Train, dropout_rng(0, 0)).unwrap();
    let x = ctx.session().input(b.x.clone());
    let out = m.forward(&mut ctx, x).unwrap();
    let loss = record_loss(ctx.session(), out, &b.y, 0.0).unwrap();
    (s, loss.id())
}

/// The tape as a graph: a leaf per input (requiring grad as on the tape), a node per op.
fn graph_of(s: &Session<f64>) -> (Graph, Vec<Tensor<f64>>) {
    let mut g = Graph::new();
    let mut inputs = Vec::new();
    let mut slot = Vec::new();
    for (id, n) in s.tape().nodes().iter().enumerate() {
        if matches!(n.rule, Rule::Leaf) {
            slot.push(
                g.input(format!("in{id}"), n.value.shape().clone(), n.requires_grad)
                    .unwrap(),
            );
            inputs.push(n.value.clone());
        } else {
            slot.push(usize::MAX);
        }
    }
    for (id, n) in s.tape().nodes().iter().enumerate() {
        if let Rule::Op { op, .. } = &n.rule {
            let args: Vec<usize> = n.parents.iter().map(|&p| slot[p]).collect();
            slot[id] = g.node(format!("n{id}"), op.clone(), &args).unwrap();
        }
    }
    (g, inputs)
}

fn bits(t: &Tensor<f64>) -> Vec<u64> {
    t.data().iter().map(|v| v.to_bits()).collect()
}

#[test]
fn names_and_layouts_are_nanogpts() {
    let m = Model::<f64>::new(&tiny(0.0), 0).unwrap();
    let names: Vec<(String, Vec<usize>)> = m
        .params
        .iter()
        .map(|p| (p.name.clone(), p.value.dims().to_vec()))
        .collect();
    let at = |n: &str| names.iter().find(|(k, _)| k == n).unwrap().1.clone();
    assert_eq!(names[0].0, "transformer.wte.weight");
    assert_eq!(at("transformer.wte.weight"), vec![VOCAB, 8]);
    assert_eq!(at("transformer.wpe.weight"), vec![5, 8]);
    assert_eq!(at("transformer.h.1.attn.c_attn.weight"), vec![24, 8]);
    assert_eq!(at("transformer.h.1.attn.c_attn.bias"), vec![24]);
    assert_eq!(at("transformer.h.0.mlp.c_fc.weight"), vec![32, 8]);
    assert_eq!(at("transformer.h.0.mlp.c_proj.weight"), vec![8, 32]);
    assert_eq!(at("transformer.ln_f.bias"), vec![8]);
    assert_eq!(names.last().unwrap().0, "lm_head.weight");
    assert_eq!(names.len(), 2 + 2 * 12 + 2 + 1);
    assert_eq!(m.params.trainable_count(), tiny(0.0).min_params().unwrap());
    // GPT-2's init: biases zero, layer norms one, residual projections scaled down.
    let get = |n: &str| &m.params.get(m.params.find(n).unwrap()).value;
    assert!(get("transformer.h.0.attn.c_attn.bias").is_all_zero());
    assert!(get("transformer.h.0.ln_1.weight")
        .data()
        .iter()
        .all(|&v| v == 1.0));
    let std =
        |t: &Tensor<f64>| (t.data().iter().map(|v| v * v).sum::<f64>() / t.numel() as f64).sqrt();
    let fc = std(get("transformer.h.0.mlp.c_fc.weight"));
    let proj = std(get("transformer.h.0.mlp.c_proj.weight"));
    assert!((0.014..0.026).contains(&fc), "{fc}");
    assert!((0.007..0.013).contains(&proj), "{proj}");
    // Tying shares the embedding's table: no lm_head tensor.
    let tied = ModelSpec::Gpt {
        vocab: VOCAB,
        context: 5,
        layers: 2,
        heads: 2,
        embd: 8,
        mlp_ratio: 4,
        dropout: 0.0,
        tie_weights: true,
    };
    let t = Model::<f64>::new(&tied, 0).unwrap();
    assert!(t.params.find("lm_head.weight").is_none());
    assert_eq!(t.params.trainable_count(), tied.min_params().unwrap());
}

#[test]
fn law1_executed_equals_reference_on_the_models_tape() {
    for seed in 0..3 {
        let m = model(seed);
        let (s, loss) = record(&m, &batch(seed, 2, 5));
        let tape = s.tape();
        let report = audit(tape);
        assert!(report.is_zero_preserving(), "{:?}", report.findings);
        let one = Tensor::scalar(1.0);
        let executed = tape.backward_all(loss, &one).unwrap();
        let reference = tape
            .backward_from(tape.one_hot(loss, &one).unwrap())
            .unwrap();
        assert_eq!(executed.len(), reference.len());
        for (id, (a, b)) in executed.iter().zip(&reference).enumerate() {
            assert_eq!(a, b, "seed {seed}, node {id}");
        }
    }
}

#[test]
fn law4_saved_graph_equals_graph_backprop_bit_for_bit() {
    for seed in 0..3 {
        let m = model(seed);
        let (s, _) = record(&m, &batch(seed + 10, 2, 5));
        let (g, x) = graph_of(&s);
        let compiled = CompiledGraph::new(g.clone());
        let (saved, context) = compiled.forward_with_context(&x).unwrap();
        let eval = g.eval(&x).unwrap();
        for (a, b) in context.iter().zip(&eval) {
            assert_eq!(bits(a), bits(b));
        }
        let last = g.slots() - 1;
        let seed_all = g.single(last, &Tensor::scalar(1.0)).unwrap();
        let reference = g.backprop_all(&x, seed_all.clone()).unwrap();
        let got = saved.backward_all(seed_all).unwrap();
        for (slot, (a, b)) in got.iter().zip(&reference).enumerate() {
            assert_eq!(bits(a), bits(b), "seed {seed}, slot {slot}");
        }
    }
}

fn random_like(t: &Tensor<f64>, rng: &mut ChaCha8Rng) -> Tensor<f64> {
    let v = (0..t.numel())
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    Tensor::new(t.dims(), v).unwrap()
}

fn dot(a: &Tensor<f64>, b: &Tensor<f64>) -> f64 {
    a.data().iter().zip(b.data()).map(|(x, y)| x * y).sum()
}

#[test]
fn law5_adjoint_and_law6_finite_differences_over_all_parameters() {
    let m = model(4);
    let (s, _) = record(&m, &batch(4, 2, 5));
    let (g, x) = graph_of(&s);
    let last = g.slots() - 1;
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let trainable: Vec<bool> = g.inputs().iter().map(|i| i.requires_grad).collect();
    assert_eq!(
        trainable.iter().filter(|&&t| t).count(),
        m.params.len(),
        "every parameter is a graph input requiring grad"
    );
    for _ in 0..4 {
        // Law 5: <jvp(x, dx), s> = <dx, backprop(x, s)>.
        let dx: Vec<Tensor<f64>> = x
            .iter()
            .zip(&trainable)
            .map(|(t, &on)| match on {
                true => random_like(t, &mut rng),
                false => Tensor::zeros(t.shape()),
            })
            .collect();
        let s_out: f64 = rng.random_range(-1.0..1.0);
        let tangents = g.jvp(&x, &dx).unwrap();
        let lhs = tangents[last].item().unwrap() * s_out;
        let grads = g
            .backprop(&x, g.single(last, &Tensor::scalar(s_out)).unwrap())
            .unwrap();
        let rhs: f64 = dx.iter().zip(&grads).map(|(a, b)| dot(a, b)).sum();
        assert!(
            (lhs - rhs).abs() <= 1e-12 * (1.0 + lhs.abs()),
            "adjoint: {lhs} vs {rhs}"
        );
        // Law 6: central differences along dx match <grad, dx> for s = 1.
        let f = |h: f64| -> f64 {
            let xs: Vec<Tensor<f64>> = x
                .iter()
                .zip(&dx)
                .map(|(a, d)| {
                    let v = a
                        .data()
                        .iter()
                        .zip(d.data())
                        .map(|(p, q)| p + h * q)
                        .collect();
                    Tensor::new(a.dims(), v).unwrap()
                })
                .collect();
            g.eval(&xs).unwrap()[last].item().unwrap()
        };
        let h = 1e-5;
        let fd = (f(h) - f(-h)) / (2.0 * h);
        let analytic = rhs / s_out;
        assert!(
            (fd - analytic).abs() <= 1e-6 * (1.0 + analytic.abs()),
            "finite differences {fd} vs gradient {analytic}"
        );
    }
}

#[test]
fn kv_cache_generation_gives_the_full_forwards_logits() {
    let m = model(7);
    let ids = [3u32, 1, 4, 1, 5, 2, 6, 0];
    let full = |window: &[u32]| -> Tensor<f64> {
        let mut s = Session::new();
        let mut ctx = Ctx::new(&mut s, &m.params, Mode::Eval, dropout_rng(0, 0)).unwrap();
        let xs: Vec<f64> = window.iter().map(|&i| f64::from(i)).collect();
        let x = ctx
            .session()
            .input(Tensor::new(&[1, window.len()], xs).unwrap());
        let out = m.forward(&mut ctx, x).unwrap();
        s.value(out).unwrap().clone()
    };
    let close = |a: &[f64], b: &[f64]| {
        a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-12 * (1.0 + y.abs()))
    };
    let mut gen = Generator::new(&m).unwrap();
    // Inside the context: each position's logits are the full forward's row.
    let reference = full(&ids[..5]);
    for (t, &id) in ids[..5].iter().enumerate() {
        let logits = gen.push(id).unwrap();
        let row = &reference.data()[t * VOCAB..(t + 1) * VOCAB];
        assert!(close(logits.data(), row), "position {t}");
    }
    // Past it: the window restarts from the last half of the context (2 of 5) and slides on.
    let logits = gen.push(ids[5]).unwrap();
    let reference = full(&ids[3..6]);
    assert!(close(logits.data(), &reference.data()[2 * VOCAB..]));
    let logits = gen.push(ids[6]).unwrap();
    let reference = full(&ids[3..7]);
    assert!(close(logits.data(), &reference.data()[3 * VOCAB..]));
}

#[test]
fn eager_and_compiled_steps_give_the_same_bits_with_dropout() {
    let spec = tiny(0.1);
    let m = Model::<f64>::new(&spec, 3).unwrap();
    let mut eager = make_backend::<f64>(BackendKind::Eager).unwrap();
    let mut compiled = make_backend::<f64>(BackendKind::Compiled).unwrap();
    // Several batches through one compiled plan: the lookups take each batch's indices and
    // the attention seeds are redrawn per step.
    for step in 0..3 {
        let b = batch(step, 3, 5);
        let a = eager.train_step(&m, &b, dropout_rng(1, step)).unwrap();
        let c = compiled.train_step(&m, &b, dropout_rng(1, step)).unwrap();
        assert_eq!(a.loss.to_bits(), c.loss.to_bits(), "step {step}");
        assert_eq!(bits(&a.outputs), bits(&c.outputs));
        for (ga, gc) in a.grads.into_iter().zip(c.grads) {
            assert_eq!(
                bits(&ga.into_dense().unwrap()),
                bits(&gc.into_dense().unwrap())
            );
        }
        let ia = eager.infer(&m, &b.x).unwrap();
        let ic = compiled.infer(&m, &b.x).unwrap();
        assert_eq!(bits(&ia), bits(&ic));
    }
}
