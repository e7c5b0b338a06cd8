//! Graph files (`tapegrad-graph/1`): the shipped examples give hand-derived gradients under every
//! sweep and dtype, through the library and the `tapegrad grad` binary; files round-trip (load,
//! save, load gives the same graph and the same text); every kind of malformed file is an error
//! naming the node, never a panic; and `grad` agrees with finite differences on random graphs.

#[path = "../crates/core/tests/support/graph_programs.rs"]
mod graph_support;

use graph_support::{generic_program, random_like, random_program};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::process::Command;
use tapegrad_cli::grad::grad_json;
use tapegrad_core::graph::{GraphFile, Sweep};
use tapegrad_core::ops::OpKind;
use tapegrad_core::{DType, Tensor};

const EXAMPLES: &[&str] = &["mlp_layer", "dag_fanout", "softmax_cross_entropy"];

fn example_path(name: &str) -> String {
    format!("{}/examples/graphs/{name}.json", env!("CARGO_MANIFEST_DIR"))
}

fn example(name: &str) -> GraphFile {
    GraphFile::parse(&std::fs::read_to_string(example_path(name)).unwrap()).unwrap()
}

/// Every `"data": [...]` array of a `grad` output, in order (output first, then each gradient),
/// parsed with the standard library's correctly rounded parser.
fn data_arrays(text: &str) -> Vec<Vec<f64>> {
    text.split("\"data\": [")
        .skip(1)
        .map(|rest| {
            let body = &rest[..rest.find(']').unwrap()];
            body.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| s.trim_matches('"').parse::<f64>().unwrap())
                .collect()
        })
        .collect()
}

fn assert_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-12 * (1.0 + w.abs()),
            "{what}: {got:?} vs {want:?}"
        );
    }
}

/// Hand-derived output and gradients of each example, in input order.
fn hand_values(name: &str) -> (Vec<f64>, Vec<Vec<f64>>) {
    match name {
        // h = x w^T + b = [[-1.4, 1.8], [7.1, -2.2]]; a = relu(h); loss = mean((a - t)^2).
        "mlp_layer" => (
            vec![(0.8f64.powi(2) + 6.1f64.powi(2)) / 4.0],
            vec![vec![0.0, -3.05, 9.15, 0.4, 0.8, 0.0], vec![3.05, 0.4]],
        ),
        // d = (x y + sin x) x, seed s: dx = s ((y + cos x) x + x y + sin x), dy = s x^2.
        "dag_fanout" => {
            let (x, y, s) = ([0.5, -1.25, 2.0], [3.0, 0.5, -2.0], [1.0, 2.0, -1.0]);
            let d = (0..3)
                .map(|i| (x[i] * y[i] + f64::sin(x[i])) * x[i])
                .collect();
            let dx = (0..3)
                .map(|i| s[i] * ((y[i] + x[i].cos()) * x[i] + x[i] * y[i] + x[i].sin()))
                .collect();
            let dy = (0..3).map(|i| s[i] * x[i] * x[i]).collect();
            (d, vec![dx, dy])
        }
        // loss = mean_n -log softmax(2 z_n)[t_n]; d/dz = 2 (softmax(2 z) - onehot(t)) / 2.
        "softmax_cross_entropy" => {
            let z = [[1.0, 2.0, 0.5], [-1.0, 0.0, 3.0]];
            let t = [2, 0];
            let (mut loss, mut grad) = (0.0, vec![]);
            for n in 0..2 {
                let e: Vec<f64> = z[n].iter().map(|v: &f64| (2.0 * v).exp()).collect();
                let total: f64 = e.iter().sum();
                loss += -(e[t[n]] / total).ln() / 2.0;
                for (c, ec) in e.iter().enumerate() {
                    let onehot = if c == t[n] { 1.0 } else { 0.0 };
                    grad.push(2.0 * (ec / total - onehot) / 2.0);
                }
            }
            (vec![loss], vec![grad])
        }
        other => panic!("no hand values for {other}"),
    }
}

#[test]
fn examples_give_hand_derived_gradients_under_every_sweep() {
    for name in EXAMPLES {
        let file = example(name);
        let (want_out, want_grads) = hand_values(name);
        let x = file.inputs::<f64>().unwrap();
        let seed = file.seed::<f64>().unwrap();
        let mut results = Vec::new();
        for sweep in Sweep::ALL {
            let r = file.graph.gradients(&x, file.output, &seed, sweep).unwrap();
            assert_close(r.output.data(), &want_out, name);
            assert_eq!(r.grads.len(), want_grads.len(), "{name}");
            for ((_, g), want) in r.grads.iter().zip(&want_grads) {
                assert_close(g.data(), want, &format!("{name} {}", sweep.name()));
            }
            results.push(r);
        }
        assert_eq!(results[0], results[1], "{name}: executed vs reference");
        assert_eq!(results[1], results[2], "{name}: reference vs saved");
    }
}

#[test]
fn the_grad_binary_prints_the_same_exact_numbers_for_every_sweep() {
    let bin = env!("CARGO_BIN_EXE_tapegrad");
    for name in EXAMPLES {
        let file = example(name);
        let path = example_path(name);
        for dtype in ["f64", "f32"] {
            let mut texts = Vec::new();
            for sweep in ["executed", "reference", "saved"] {
                let out = Command::new(bin)
                    .args(["grad", &path, "--sweep", sweep, "--dtype", dtype])
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                texts.push(String::from_utf8(out.stdout).unwrap());
            }
            assert_eq!(texts[0], texts[1], "{name} {dtype}");
            assert_eq!(texts[1], texts[2], "{name} {dtype}");
            let text = &texts[0];
            let printed = data_arrays(text);
            let names: Vec<&str> = file
                .graph
                .inputs()
                .iter()
                .filter(|i| i.requires_grad)
                .map(|i| i.name.as_str())
                .collect();
            for n in &names {
                assert!(text.contains(&format!("\"{n}\": {{\"shape\"")), "{text}");
            }
            // The printed numbers read back to the very bits the library computed.
            if dtype == "f64" {
                let x = file.inputs::<f64>().unwrap();
                let r = file
                    .graph
                    .gradients(&x, file.output, &file.seed().unwrap(), Sweep::Saved)
                    .unwrap();
                let want: Vec<&[f64]> = std::iter::once(r.output.data())
                    .chain(r.grads.iter().map(|(_, g)| g.data()))
                    .collect();
                for (p, w) in printed.iter().zip(want) {
                    let pb: Vec<u64> = p.iter().map(|v| v.to_bits()).collect();
                    let wb: Vec<u64> = w.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(pb, wb, "{name}");
                }
            } else {
                let x = file.inputs::<f32>().unwrap();
                let r = file
                    .graph
                    .gradients(&x, file.output, &file.seed().unwrap(), Sweep::Saved)
                    .unwrap();
                let want: Vec<&[f32]> = std::iter::once(r.output.data())
                    .chain(r.grads.iter().map(|(_, g)| g.data()))
                    .collect();
                for (p, w) in printed.iter().zip(want) {
                    let pb: Vec<u32> = p.iter().map(|&v| (v as f32).to_bits()).collect();
                    let wb: Vec<u32> = w.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(pb, wb, "{name}");
                }
            }
        }
    }
}

#[test]
fn the_graph_binary_prints_text_and_dot() {
    let bin = env!("CARGO_BIN_EXE_tapegrad");
    let path = example_path("mlp_layer");
    let text = Command::new(bin).args(["graph", &path]).output().unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("h = linear(x, w, b) : [2, 2]"), "{text}");
    assert!(
        text.contains("loss = mse_loss(a, target; reduction=\"mean\") : []   <- output"),
        "{text}"
    );
    assert!(text.contains("input w : [2, 3] (requires grad)"), "{text}");
    let dot = Command::new(bin)
        .args(["graph", &path, "--dot"])
        .output()
        .unwrap();
    let dot = String::from_utf8(dot.stdout).unwrap();
    assert!(dot.starts_with("digraph"), "{dot}");
    assert!(
        dot.contains("s4 -> s5;") && dot.contains("s1 -> s4 [label=\"1\"];"),
        "{dot}"
    );
    assert!(dot.contains("peripheries=2"), "{dot}");
}

fn file_of(seed: u64) -> GraphFile {
    file_from(random_program(seed, 1 + (seed % 10) as usize), seed)
}

fn file_from(p: tapegrad_core::laws::Program, seed: u64) -> GraphFile {
    let graph = p.to_graph().unwrap();
    let output = graph.last_slot().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let seed_data = rng.random_bool(0.5).then(|| {
        random_like::<f64>(&mut rng, graph.shape(output).unwrap())
            .data()
            .to_vec()
    });
    GraphFile {
        dtype: if seed % 2 == 0 {
            DType::F64
        } else {
            DType::F32
        },
        data: p.inputs.iter().map(|t| t.data().to_vec()).collect(),
        graph,
        output,
        seed: seed_data,
    }
}

#[test]
fn files_round_trip_for_the_examples_and_random_graphs_of_every_op() {
    let mut files: Vec<GraphFile> = EXAMPLES.iter().map(|n| example(n)).collect();
    files.extend((0..300).map(file_of));
    for file in files {
        let text = file.to_json().unwrap();
        let again = GraphFile::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(again, file, "{text}");
        let bits =
            |f: &GraphFile| -> Vec<u64> { f.data.iter().flatten().map(|v| v.to_bits()).collect() };
        assert_eq!(bits(&again), bits(&file));
        assert_eq!(again.to_json().unwrap(), text);
    }
}

/// A valid file with one place to break: `{X}` marks where each case substitutes its text.
fn variant(inputs: &str, nodes: &str, tail: &str) -> String {
    format!(r#"{{"format": "tapegrad-graph/1", "inputs": [{inputs}], "nodes": [{nodes}]{tail}}}"#)
}

const X: &str =
    r#"{"name": "x", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6], "requires_grad": true}"#;
const W: &str = r#"{"name": "w", "shape": [3, 2], "data": [1, 0, 0, 1, 1, 1]}"#;

#[test]
fn malformed_files_are_errors_that_name_the_node() {
    let y = r#"{"name": "y", "op": "matmul", "args": ["x", "w"]}"#;
    let xw = format!("{X}, {W}");
    let cases: Vec<(&str, String, &str, &str)> = vec![
        (
            "unknown op",
            variant(
                &xw,
                r#"{"name": "y", "op": "matmull", "args": ["x", "w"]}"#,
                "",
            ),
            "'y'",
            "unknown op 'matmull'",
        ),
        (
            "unknown attribute",
            variant(
                &xw,
                &format!(
                    r#"{y}, {{"name": "l", "op": "sum", "args": ["y"], "attrs": {{"dim": 0}}}}"#
                ),
                "",
            ),
            "'l'",
            "unknown attribute 'dim'",
        ),
        (
            "attribute on an op without any",
            variant(
                &xw,
                r#"{"name": "r", "op": "relu", "args": ["x"], "attrs": {"inplace": true}}"#,
                "",
            ),
            "'r'",
            "unknown attribute 'inplace'",
        ),
        (
            "wrong attribute type",
            variant(
                &xw,
                &format!(
                    r#"{y}, {{"name": "l", "op": "sum", "args": ["y"], "attrs": {{"keepdim": 1}}}}"#
                ),
                "",
            ),
            "'l'",
            "'keepdim' must be true or false",
        ),
        (
            "fractional axis",
            variant(
                &xw,
                r#"{"name": "s", "op": "softmax", "args": ["x"], "attrs": {"axis": 1.5}}"#,
                "",
            ),
            "'s'",
            "'axis' must be an integer, found 1.5",
        ),
        (
            "missing attribute",
            variant(&xw, r#"{"name": "s", "op": "softmax", "args": ["x"]}"#, ""),
            "'s'",
            "'axis' is required",
        ),
        (
            "bad choice",
            variant(
                &xw,
                r#"{"name": "g", "op": "gelu", "args": ["x"], "attrs": {"approximate": "erf"}}"#,
                "",
            ),
            "'g'",
            "one of \"none\", \"tanh\"",
        ),
        (
            "negative class label",
            variant(
                &xw,
                r#"{"name": "c", "op": "cross_entropy", "args": ["x"], "attrs": {"targets": [0, -1]}}"#,
                "",
            ),
            "'c'",
            // Labels are signed (PyTorch's -100 padding with ignore_index -100); this one is not
            // the ignored label.
            "class label -1 is negative",
        ),
        (
            "class label out of range",
            variant(
                &xw,
                r#"{"name": "c", "op": "cross_entropy", "args": ["x"], "attrs": {"targets": [0, 7]}}"#,
                "",
            ),
            "'c'",
            "7",
        ),
        (
            "wrong data length",
            variant(
                r#"{"name": "x", "shape": [2, 3], "data": [1, 2, 3, 4, 5]}"#,
                "",
                "",
            ),
            "'x'",
            "data has 5 elements but shape [2, 3] needs 6",
        ),
        (
            "data that is not numbers",
            variant(r#"{"name": "x", "shape": [2], "data": [1, "two"]}"#, "", ""),
            "'x'",
            "data must hold numbers",
        ),
        (
            "fractional dimension",
            variant(r#"{"name": "x", "shape": [2.5], "data": [1, 2]}"#, "", ""),
            "'x'",
            "non-negative integer, found 2.5",
        ),
        (
            "duplicate inputs",
            variant(&format!("{X}, {X}"), "", ""),
            "'x'",
            "used twice",
        ),
        (
            "node named like an input",
            variant(&xw, r#"{"name": "w", "op": "neg", "args": ["x"]}"#, ""),
            "'w'",
            "used twice",
        ),
        (
            "duplicate nodes",
            variant(&xw, &format!("{y}, {y}"), ""),
            "'y'",
            "used twice",
        ),
        (
            "forward reference",
            variant(
                &xw,
                &format!(r#"{{"name": "z", "op": "neg", "args": ["y"]}}, {y}"#),
                "",
            ),
            "'z'",
            "defined later",
        ),
        (
            "self reference",
            variant(&xw, r#"{"name": "z", "op": "neg", "args": ["z"]}"#, ""),
            "'z'",
            "itself",
        ),
        (
            "missing argument",
            variant(
                &xw,
                r#"{"name": "z", "op": "add", "args": ["x", "nope"]}"#,
                "",
            ),
            "'z'",
            "'nope' is not an input or an earlier node",
        ),
        (
            "argument that is not a name",
            variant(&xw, r#"{"name": "z", "op": "neg", "args": [0]}"#, ""),
            "'z'",
            "must be the name",
        ),
        (
            "wrong arity",
            variant(&xw, r#"{"name": "z", "op": "add", "args": ["x"]}"#, ""),
            "'z'",
            "expected 2 arguments, found 1",
        ),
        (
            "shapes that do not fit",
            variant(
                &xw,
                r#"{"name": "z", "op": "matmul", "args": ["x", "x"]}"#,
                "",
            ),
            "'z'",
            "[2, 3]",
        ),
        (
            "unknown node field",
            variant(
                &xw,
                r#"{"name": "z", "op": "neg", "args": ["x"], "kwargs": {}}"#,
                "",
            ),
            "'z'",
            "unknown field 'kwargs'",
        ),
        (
            "unknown input field",
            variant(
                r#"{"name": "x", "shape": [1], "data": [1], "grad": true}"#,
                "",
                "",
            ),
            "'x'",
            "unknown field 'grad'",
        ),
        (
            "requires_grad not a boolean",
            variant(
                r#"{"name": "x", "shape": [1], "data": [1], "requires_grad": "yes"}"#,
                "",
                "",
            ),
            "'x'",
            "'requires_grad' must be true or false",
        ),
        (
            "op missing",
            variant(&xw, r#"{"name": "z", "args": ["x"]}"#, ""),
            "'z'",
            "'op' is missing",
        ),
        (
            "seed of the wrong shape",
            variant(
                &xw,
                y,
                r#", "output": "y", "seed": {"shape": [2], "data": [1, 1]}"#,
            ),
            "'y'",
            "the seed has shape [2], but the output has shape [2, 2]",
        ),
        (
            "seed data of the wrong length",
            variant(
                &xw,
                y,
                r#", "output": "y", "seed": {"shape": [2, 2], "data": [1, 1]}"#,
            ),
            "'y'",
            "data has 2 elements",
        ),
        (
            "mask of the wrong length",
            variant(
                &xw,
                r#"{"name": "z", "op": "where", "args": ["x", "x"], "attrs": {"condition": {"shape": [3], "data": [true]}}}"#,
                "",
            ),
            "'z'",
            "condition",
        ),
    ];
    for (what, text, node, message) in &cases {
        let err = match GraphFile::parse(text) {
            Ok(_) => panic!("{what}: parsed without error:\n{text}"),
            Err(e) => e.to_string(),
        };
        assert!(err.starts_with(&format!("node {node}")), "{what}: {err}");
        assert!(err.contains(message), "{what}: {err}");
    }
}

#[test]
fn malformed_files_without_a_node_to_blame_say_what_is_wrong() {
    let xw = format!("{X}, {W}");
    let cases = [
        ("{", "not valid JSON"),
        ("[]", "must be a JSON object"),
        (
            r#"{"format": "tapegrad-graph/2", "inputs": [], "nodes": []}"#,
            "unsupported format 'tapegrad-graph/2'",
        ),
        (
            &variant(&xw, "", r#", "dtype": "f16""#) as &str,
            "'dtype' must be \"f32\" or \"f64\"",
        ),
        (
            &variant(&xw, "", r#", "output": "nope""#),
            "'output' names 'nope'",
        ),
        (
            &variant(&xw, "", r#", "extra": 1"#),
            "unknown field 'extra'",
        ),
        (
            &variant(r#"{"shape": [1], "data": [1]}"#, "", ""),
            "'name' is missing",
        ),
        (
            r#"{"format": "tapegrad-graph/1", "inputs": [], "nodes": []}"#,
            "no inputs and no nodes",
        ),
    ];
    for (text, message) in cases {
        let err = GraphFile::parse(text).unwrap_err().to_string();
        assert!(err.contains(message), "{text}: {err}");
    }
}

/// Random byte edits of valid files never panic; whatever parses also writes and re-parses.
#[test]
fn mutated_files_never_panic() {
    let texts: Vec<String> = EXAMPLES
        .iter()
        .map(|n| std::fs::read_to_string(example_path(n)).unwrap())
        .collect();
    let alphabet = b"{}[],:\"-.0123456789eE xyzaflnt";
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for _ in 0..3000 {
        let mut bytes = texts[rng.random_range(0..texts.len())].clone().into_bytes();
        for _ in 0..rng.random_range(1..4) {
            let i = rng.random_range(0..bytes.len());
            match rng.random_range(0..3) {
                0 => {
                    bytes.remove(i);
                }
                1 => bytes[i] = alphabet[rng.random_range(0..alphabet.len())],
                _ => bytes.insert(i, alphabet[rng.random_range(0..alphabet.len())]),
            }
        }
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(file) = GraphFile::parse(&text) {
            let written = file.to_json().unwrap();
            assert_eq!(GraphFile::parse(&written).unwrap(), file);
        }
    }
}

/// `grad` (file written, read back, gradients printed) against central differences of the graph's
/// own evaluation, an implementation that shares no VJP with any sweep.
#[test]
fn grad_agrees_with_finite_differences_on_random_graphs() {
    let h = 1e-6;
    for case in 0..120 {
        // Generic points only: finite differences are exact to their truncation error there.
        let mut file = file_from(generic_program(case, 1 + (case % 10) as usize), case);
        file.dtype = DType::F64;
        let file = GraphFile::parse(&file.to_json().unwrap()).unwrap();
        let g = &file.graph;
        let x = file.inputs::<f64>().unwrap();
        let seed = file.seed::<f64>().unwrap();
        let objective = |xs: &[Tensor<f64>]| -> f64 {
            let v = &g.eval(xs).unwrap()[file.output];
            v.data().iter().zip(seed.data()).map(|(a, b)| a * b).sum()
        };
        let scale: f64 = {
            let v = &g.eval(&x).unwrap()[file.output];
            v.data()
                .iter()
                .zip(seed.data())
                .map(|(a, b)| (a * b).abs())
                .sum()
        };
        for sweep in Sweep::ALL {
            let printed = data_arrays(&grad_json::<f64>(&file, sweep).unwrap());
            let mut grads = printed[1..].iter();
            for (i, input) in g.inputs().iter().enumerate() {
                if !input.requires_grad {
                    continue;
                }
                let grad = grads.next().unwrap();
                assert_eq!(grad.len(), x[i].numel());
                for (j, &got) in grad.iter().enumerate() {
                    let mut plus = x.to_vec();
                    plus[i].data_mut()[j] += h;
                    let mut minus = x.to_vec();
                    minus[i].data_mut()[j] -= h;
                    let fd = (objective(&plus) - objective(&minus)) / (2.0 * h);
                    let tol = 1e-6 + 1e-5 * fd.abs() + 1e-9 * scale;
                    assert!(
                        (got - fd).abs() <= tol,
                        "case {case} {}: input {i} element {j}: grad {got} vs fd {fd}\n{g}",
                        sweep.name(),
                    );
                }
            }
        }
    }
}

/// The executed sweep stores a -0 contribution where the reference adds it onto zero (+0); the
/// printed gradients are the same for all three sweeps, with a zero printed as 0.
#[test]
fn every_sweep_prints_a_zero_gradient_the_same_way() {
    let text = r#"{"format": "tapegrad-graph/1",
      "inputs": [{"name": "x", "shape": [2], "data": [1, 2], "requires_grad": true}],
      "nodes": [{"name": "y", "op": "scale", "args": ["x"], "attrs": {"factor": -1}}],
      "seed": {"shape": [2], "data": [0, 1]}}"#;
    let file = GraphFile::parse(text).unwrap();
    let printed: Vec<String> = Sweep::ALL
        .iter()
        .map(|&s| grad_json::<f64>(&file, s).unwrap())
        .collect();
    assert_eq!(printed[0], printed[1]);
    assert_eq!(printed[1], printed[2]);
    assert!(
        printed[0].contains("\"grads\": {\"x\": {\"shape\": [2], \"data\": [0, -1]}}"),
        "{}",
        printed[0]
    );
}

/// Every nn op in one file with non-default attributes: it round-trips, and where every argument
/// is differentiable all three sweeps agree with each other and with finite differences.
#[test]
fn nn_ops_round_trip_and_differentiate() {
    let text = r#"{"format": "tapegrad-graph/1",
 "inputs": [
  {"name": "img", "shape": [1, 2, 5, 5], "data": [0.1, -0.4, 0.3, 0.8, -0.2, 0.5, 0.9, -0.7, 0.2, 0.6, -0.3, 0.4, 0.7, -0.9, 0.15, 0.25, -0.35, 0.45, -0.55, 0.65, 0.75, -0.85, 0.95, -0.05, 0.12, 0.22, -0.32, 0.42, -0.52, 0.62, -0.72, 0.82, -0.92, 0.11, 0.21, -0.31, 0.41, -0.51, 0.61, -0.71, 0.81, -0.91, 0.13, 0.23, -0.33, 0.43, -0.53, 0.63, -0.73, 0.83], "requires_grad": true},
  {"name": "k", "shape": [3, 2, 2, 2], "data": [0.2, -0.1, 0.05, 0.3, -0.25, 0.15, 0.1, -0.05, 0.12, 0.07, -0.2, 0.1, 0.3, -0.15, 0.05, 0.2, -0.1, 0.25, 0.15, -0.3, 0.2, 0.1, -0.05, 0.08], "requires_grad": true},
  {"name": "kb", "shape": [3], "data": [0.01, -0.02, 0.03], "requires_grad": true},
  {"name": "seq", "shape": [2, 3, 4], "data": [0.3, -0.2, 0.5, 0.1, -0.4, 0.6, 0.2, -0.1, 0.7, -0.3, 0.4, 0.05, -0.6, 0.25, 0.35, -0.45, 0.55, -0.15, 0.45, 0.65, -0.25, 0.15, -0.35, 0.75], "requires_grad": true},
  {"name": "emb", "shape": [5, 4], "data": [0.1, 0.2, 0.3, 0.4, -0.1, -0.2, -0.3, -0.4, 0.5, -0.5, 0.6, -0.6, 0.7, 0.8, -0.7, -0.8, 0.9, -0.9, 0.05, -0.05], "requires_grad": true},
  {"name": "sig", "shape": [1, 2, 6], "data": [0.3, -0.1, 0.4, -0.2, 0.5, 0.15, -0.3, 0.2, -0.4, 0.1, 0.25, -0.35], "requires_grad": true},
  {"name": "k1", "shape": [2, 1, 3], "data": [0.5, -0.25, 0.125, -0.5, 0.75, 0.3], "requires_grad": true},
  {"name": "qkv", "shape": [1, 3, 6], "data": [0.4, -0.3, 0.2, 0.6, -0.5, 0.1, -0.2, 0.7, 0.35, -0.45, 0.15, 0.55, 0.25, -0.65, -0.1, 0.3, 0.5, -0.35], "requires_grad": true}],
 "nodes": [
  {"name": "c", "op": "conv2d", "args": ["img", "k", "kb"], "attrs": {"stride": [1, 2], "padding": 1, "dilation": [1, 1], "groups": 1}},
  {"name": "mp", "op": "max_pool2d", "args": ["c"], "attrs": {"kernel_size": 2, "stride": [1, 1], "ceil_mode": false}},
  {"name": "ap", "op": "avg_pool2d", "args": ["c"], "attrs": {"kernel_size": [2, 2], "padding": 1, "count_include_pad": false}},
  {"name": "aap", "op": "adaptive_avg_pool2d", "args": ["c"], "attrs": {"output_size": [2, 1]}},
  {"name": "gn", "op": "group_norm", "args": ["c"], "attrs": {"num_groups": 3, "eps": 0.001}},
  {"name": "bn", "op": "batch_norm", "args": ["c"], "attrs": {"training": true, "momentum": 0.2}},
  {"name": "ln", "op": "layer_norm", "args": ["seq"], "attrs": {"normalized_shape": [4]}},
  {"name": "att", "op": "scaled_dot_product_attention", "args": ["ln", "seq", "seq"], "attrs": {"is_causal": true, "scale": 0.5}},
  {"name": "e", "op": "embedding", "args": ["emb"], "attrs": {"indices": {"shape": [2, 3], "data": [0, 4, 2, 2, 1, 3]}}},
  {"name": "is", "op": "index_select", "args": ["emb"], "attrs": {"dim": 0, "index": [4, 0, 4]}},
  {"name": "ga", "op": "gather", "args": ["emb"], "attrs": {"dim": 1, "index": {"shape": [2, 2], "data": [3, 0, 1, 1]}}},
  {"name": "sa", "op": "scatter_add", "args": ["emb", "is"], "attrs": {"dim": 0, "index": {"shape": [3, 4], "data": [1, 2, 3, 4, 0, 0, 0, 0, 4, 3, 2, 1]}}},
  {"name": "se", "op": "select", "args": ["att"], "attrs": {"dim": -1, "index": 2}},
  {"name": "dr", "op": "dropout", "args": ["e"], "attrs": {"p": 0.25, "seed": 18446744073709551615}},
  {"name": "c1", "op": "conv1d", "args": ["sig", "k1"], "attrs": {"stride": 2, "padding": 1, "groups": 2}},
  {"name": "qa", "op": "qkv_attention", "args": ["qkv"], "attrs": {"heads": 2, "is_causal": true, "scale": 0.7}},
  {"name": "s1", "op": "sum", "args": ["mp"]},
  {"name": "s2", "op": "sum", "args": ["ap"]},
  {"name": "s3", "op": "sum", "args": ["aap"]},
  {"name": "g3", "op": "mul", "args": ["gn", "bn"]},
  {"name": "s4", "op": "sum", "args": ["g3"]},
  {"name": "s5", "op": "sum", "args": ["se"]},
  {"name": "dr2", "op": "mul", "args": ["dr", "dr"]},
  {"name": "s6", "op": "sum", "args": ["dr2"]},
  {"name": "s7", "op": "sum", "args": ["ga"]},
  {"name": "sa2", "op": "mul", "args": ["sa", "sa"]},
  {"name": "s8", "op": "sum", "args": ["sa2"]},
  {"name": "c12", "op": "mul", "args": ["c1", "c1"]},
  {"name": "s9", "op": "sum", "args": ["c12"]},
  {"name": "t1", "op": "add", "args": ["s1", "s2"]},
  {"name": "t2", "op": "add", "args": ["t1", "s3"]},
  {"name": "t3", "op": "add", "args": ["t2", "s4"]},
  {"name": "t4", "op": "add", "args": ["t3", "s5"]},
  {"name": "t5", "op": "add", "args": ["t4", "s6"]},
  {"name": "t6", "op": "add", "args": ["t5", "s7"]},
  {"name": "t7", "op": "add", "args": ["t6", "s8"]},
  {"name": "qa2", "op": "mul", "args": ["qa", "qa"]},
  {"name": "s10", "op": "sum", "args": ["qa2"]},
  {"name": "t8", "op": "add", "args": ["t7", "s9"]},
  {"name": "loss", "op": "add", "args": ["t8", "s10"]}]}"#;
    let file = GraphFile::parse(text).unwrap_or_else(|e| panic!("{e}"));
    let written = file.to_json().unwrap();
    let again = GraphFile::parse(&written).unwrap();
    assert_eq!(again, file, "{written}");
    assert_eq!(again.to_json().unwrap(), written);
    let names: std::collections::BTreeSet<&str> =
        file.graph.nodes().iter().map(|n| n.op.name()).collect();
    let nn_ops = OpKind::ALL.iter().filter(|k| matches!(k, OpKind::Nn(_)));
    for op in nn_ops.map(|k| k.label()) {
        assert!(names.contains(op), "{op} is missing from the test file");
    }

    let x = file.inputs::<f64>().unwrap();
    let seed = file.seed::<f64>().unwrap();
    let results: Vec<_> = Sweep::ALL
        .iter()
        .map(|&s| file.graph.gradients(&x, file.output, &seed, s).unwrap())
        .collect();
    assert_eq!(results[0], results[1]);
    assert_eq!(results[1], results[2]);
    let h = 1e-6;
    let objective = |xs: &[Tensor<f64>]| file.graph.eval(xs).unwrap()[file.output].data()[0];
    for (i, (_, grad)) in results[0].grads.iter().enumerate() {
        for (j, &got) in grad.data().iter().enumerate() {
            let mut plus = x.to_vec();
            plus[i].data_mut()[j] += h;
            let mut minus = x.to_vec();
            minus[i].data_mut()[j] -= h;
            let fd = (objective(&plus) - objective(&minus)) / (2.0 * h);
            assert!(
                (got - fd).abs() <= 1e-6 + 1e-5 * fd.abs(),
                "input {i} element {j}: grad {got} vs fd {fd}"
            );
        }
    }
}
