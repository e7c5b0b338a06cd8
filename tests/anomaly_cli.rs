//! `--detect-anomaly` through the binary: a training run that blows up stops at the first non-finite
//! value naming its node (eager and compiled backends); `grad` on graph files with the masked-branch
//! trap names the op, node, shapes, element, value and remedy; without the flag, and on healthy
//! runs with it, the output is what it was.

mod cli_support;

use cli_support::{fails, ok, tempdir};

fn assert_has(text: &str, parts: &[&str]) {
    for p in parts {
        assert!(text.contains(p), "missing {p:?} in:\n{text}");
    }
}

/// SGD at learning rate 1e30 on Auto MPG: step 1 is finite, its update sends the weights to about
/// 1e29, and step 2's second linear layer overflows (inf - inf = NaN).
const BLOW_UP: [&str; 9] = [
    "train",
    "mlp",
    "--optimizer",
    "sgd",
    "--lr",
    "1e30",
    "--steps",
    "20",
    "--quiet",
];

#[test]
fn a_diverging_run_stops_at_the_first_non_finite_value_naming_the_node() {
    let dir = tempdir("anomaly-train");
    // Without the flag: the run stops later, at the loss, with no node named (as before).
    let plain = fails(&BLOW_UP, &dir);
    assert_has(&plain, &["the loss became NaN at step 2"]);
    assert!(!plain.contains("anomaly"), "{plain}");

    let mut args = BLOW_UP.to_vec();
    args.push("--detect-anomaly");
    let eager = fails(&args, &dir);
    assert_has(
        &eager,
        &[
            "step 2: anomaly in forward: node 7 (linear)",
            "[32, 32] from node 6 (relu)",
            "[1, 32] from node 2 '2.weight' (leaf)",
            "[1] from node 3 '2.bias' (leaf)",
            "produced NaN at element 0 of its output (shape [32, 1])",
            "all its inputs are finite, so this op made it",
            "try a smaller learning rate (--lr)",
        ],
    );
    assert!(!eager.contains("the loss became"), "{eager}");

    // The compiled backend sees the NaN in the step's outputs and replays the step eagerly: the
    // same node, by the law that the saved graph and the tape compute the same bits.
    args.extend(["--backend", "compiled"]);
    let compiled = fails(&args, &dir);
    assert_has(
        &compiled,
        &[
            "step 2: anomaly in forward: node 7 (linear)",
            "[1, 32] from node 2 '2.weight' (leaf)",
            "produced NaN at element 0 of its output (shape [32, 1])",
            "the compiled backend's step made NaN at element 0 of the outputs",
            "replaying it on an eager tape found the node",
        ],
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// The flag changes no bits, for the preset's Adam and for plain SGD (which steps with the first
/// layer's weight gradient in factored form, checked by multiplying it out).
#[test]
fn a_healthy_run_is_the_same_with_and_without_the_flag() {
    let dir = tempdir("anomaly-healthy");
    let optimizers: [&[&str]; 2] = [
        &[],
        &["--optimizer", "sgd", "--momentum", "0", "--lr", "0.05"],
    ];
    for backend in ["eager", "compiled"] {
        for optimizer in optimizers {
            let run = |file: &str, flag: bool| {
                let mut args = vec![
                    "train",
                    "mlp",
                    "--steps",
                    "12",
                    "--dropout",
                    "0.2",
                    "--seed",
                    "3",
                    "--quiet",
                    "--backend",
                    backend,
                    "--save",
                    file,
                ];
                args.extend_from_slice(optimizer);
                if flag {
                    args.push("--detect-anomaly");
                }
                ok(&args, &dir);
                std::fs::read(dir.join(file)).unwrap()
            };
            let plain = run("plain.st", false);
            let checked = run("checked.st", true);
            assert!(
                plain == checked,
                "{backend} {optimizer:?}: checkpoints differ"
            );
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// `where(x > 0, sqrt(x), 0)` at x = [0, 4]: the forward pass is finite, but the zero cotangent
/// that `where` sends to sqrt at x = 0 meets sqrt's infinite derivative there: 0 * inf = NaN.
const MASKED_SQRT: &str = r#"{"format": "tapegrad-graph/1", "dtype": "f64",
 "inputs": [{"name": "x", "shape": [2], "data": [0, 4], "requires_grad": true},
            {"name": "zero", "shape": [2], "data": [0, 0]}],
 "nodes":  [{"name": "root", "op": "sqrt", "args": ["x"]},
            {"name": "masked", "op": "where", "args": ["root", "zero"],
             "attrs": {"condition": {"shape": [2], "data": [false, true]}}},
            {"name": "l", "op": "sum", "args": ["masked"]}],
 "output": "l"}"#;

/// `where(x > 0, log(x), 0)` at x = [2, 0, 1]: log(0) = -inf is made in forward and masked out.
const MASKED_LOG: &str = r#"{"format": "tapegrad-graph/1", "dtype": "f64",
 "inputs": [{"name": "x", "shape": [3], "data": [2, 0, 1], "requires_grad": true},
            {"name": "zero", "shape": [3], "data": [0, 0, 0]}],
 "nodes":  [{"name": "logx", "op": "log", "args": ["x"]},
            {"name": "masked", "op": "where", "args": ["logx", "zero"],
             "attrs": {"condition": {"shape": [3], "data": [true, false, true]}}},
            {"name": "l", "op": "sum", "args": ["masked"]}],
 "output": "l"}"#;

/// sqrt at 0 with a non-zero cotangent: an infinite gradient, but no masked branch.
const BARE_SQRT: &str = r#"{"format": "tapegrad-graph/1",
 "inputs": [{"name": "x", "shape": [2, 2], "data": [1, 4, 9, 0], "requires_grad": true}],
 "nodes":  [{"name": "root", "op": "sqrt", "args": ["x"]},
            {"name": "l", "op": "sum", "args": ["root"]}]}"#;

#[test]
fn grad_reports_the_masked_sqrt_trap_in_backward() {
    let dir = tempdir("anomaly-sqrt");
    std::fs::write(dir.join("g.json"), MASKED_SQRT).unwrap();
    // Without the flag: the NaN gradient is printed, as before.
    let plain = ok(&["grad", "g.json"], &dir);
    assert_eq!(
        plain.trim(),
        r#"{"output": {"shape": [], "data": [2]}, "grads": {"x": {"shape": [2], "data": ["nan", 0.25]}}}"#
    );
    for dtype in ["f64", "f32"] {
        let e = fails(
            &["grad", "g.json", "--detect-anomaly", "--dtype", dtype],
            &dir,
        );
        assert_has(
            &e,
            &[
                "anomaly in backward: node 2 'root' (sqrt)",
                "with inputs of shapes [2] from node 0 'x' (leaf)",
                "sent NaN at element 0 to its parent node 0 'x' (leaf)",
                "a zero cotangent met an infinite or NaN local derivative",
                "masked-branch trap",
                "mask the input of the unsafe branch, not only its output, e.g. sqrt(where(x > 0, x, 1))",
            ],
        );
    }
    // The remedy applied: sqrt(where(x > 0, x, 1)) masked again has a clean gradient.
    let fixed = MASKED_SQRT.replace(
        r#"{"name": "root", "op": "sqrt", "args": ["x"]},"#,
        r#"{"name": "safe", "op": "where", "args": ["x", "one"],
             "attrs": {"condition": {"shape": [2], "data": [false, true]}}},
            {"name": "root", "op": "sqrt", "args": ["safe"]},"#,
    );
    let fixed = fixed.replace(
        r#"{"name": "zero", "shape": [2], "data": [0, 0]}"#,
        r#"{"name": "zero", "shape": [2], "data": [0, 0]},
            {"name": "one", "shape": [2], "data": [1, 1]}"#,
    );
    std::fs::write(dir.join("fixed.json"), fixed).unwrap();
    let out = ok(&["grad", "fixed.json", "--detect-anomaly"], &dir);
    assert_eq!(
        out.trim(),
        r#"{"output": {"shape": [], "data": [2]}, "grads": {"x": {"shape": [2], "data": [0, 0.25]}}}"#
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn grad_reports_log_behind_a_mask_in_forward() {
    let dir = tempdir("anomaly-log");
    std::fs::write(dir.join("g.json"), MASKED_LOG).unwrap();
    let plain = ok(&["grad", "g.json"], &dir);
    assert_eq!(
        plain.trim(),
        r#"{"output": {"shape": [], "data": [0.6931471805599453]}, "grads": {"x": {"shape": [3], "data": [0.5, "nan", 1]}}}"#
    );
    let e = fails(&["grad", "g.json", "--detect-anomaly"], &dir);
    assert_has(
        &e,
        &[
            "node 'logx' (log): anomaly in forward: node 2 (log)",
            "with inputs of shapes [3] from node 0 'x' (leaf)",
            "produced -inf at element 1 of its output (shape [3])",
            "all its inputs are finite, so this op made it",
            "mask the op's input instead, e.g. log(where(x > 0, x, 1))",
        ],
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn grad_reports_an_infinite_derivative_that_is_not_the_trap() {
    let dir = tempdir("anomaly-bare");
    std::fs::write(dir.join("g.json"), BARE_SQRT).unwrap();
    let e = fails(&["grad", "g.json", "--detect-anomaly"], &dir);
    assert_has(
        &e,
        &[
            "anomaly in backward: node 1 'root' (sqrt)",
            "[2, 2] from node 0 'x' (leaf)",
            "sent inf at element 3 to its parent node 0 'x' (leaf)",
        ],
    );
    assert!(!e.contains("masked-branch"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn grad_on_a_healthy_file_prints_the_same_with_the_flag() {
    let dir = tempdir("anomaly-clean");
    let file = r#"{"format": "tapegrad-graph/1", "dtype": "f64",
 "inputs": [{"name": "x", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6], "requires_grad": true},
            {"name": "w", "shape": [3, 2], "data": [1, 0, 0.5, 1, 1, 1], "requires_grad": true}],
 "nodes":  [{"name": "y", "op": "matmul", "args": ["x", "w"]},
            {"name": "t", "op": "tanh", "args": ["y"]},
            {"name": "l", "op": "sum", "args": ["t"], "attrs": {"axes": [0, 1], "keepdim": false}}],
 "output": "t", "seed": {"shape": [2, 2], "data": [1, -2, 0, 3]}}"#;
    std::fs::write(dir.join("g.json"), file).unwrap();
    for dtype in ["f64", "f32"] {
        let plain = ok(&["grad", "g.json", "--dtype", dtype], &dir);
        let checked = ok(
            &["grad", "g.json", "--dtype", dtype, "--detect-anomaly"],
            &dir,
        );
        assert_eq!(plain, checked, "{dtype}");
        assert!(
            plain.contains("\"x\"") && plain.contains("\"w\""),
            "{plain}"
        );
    }
    let e = fails(
        &["grad", "g.json", "--detect-anomaly", "--sweep", "reference"],
        &dir,
    );
    assert_has(&e, &["--detect-anomaly watches the executed sweep"]);
    std::fs::remove_dir_all(dir).unwrap();
}
