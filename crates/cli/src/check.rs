//! `tapegrad check`: runs the per-op laws on every registered op case at random generic points
//! (the VJP against f64 central differences, the JVP against the VJP, the zero-preserving audit of
//! the recorded case) and prints one row per case and a summary; exits 1 when any case fails.
//! Every op is listed, the nn family included (one row per registered attribute variant).

use crate::error::{CliError, CliResult};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::process::ExitCode;
use tapegrad_core::laws::{check_op, op_cases, OpCase, Tolerance};
use tapegrad_core::{audit, Tape, Tensor};

/// Step of the central differences: the truncation error (h²) and the rounding error (ε/h) of
/// the difference quotient are then both far below the tolerance.
const STEP: f64 = 1e-6;

/// Arguments of `tapegrad check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Seed of the random points (identical seeds give identical tables).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Random points per case.
    #[arg(long, default_value_t = 3)]
    pub points: usize,
    /// Only the cases whose label contains this text (e.g. `softmax`).
    #[arg(long)]
    pub op: Option<String>,
    /// Print one JSON object per case, then a summary object, instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The worst outcome of one case over all points.
#[derive(Debug, Clone, Serialize)]
struct Row {
    case: String,
    op: String,
    max_abs_err: f64,
    max_rel_err: f64,
    adjoint_rel_err: f64,
    audit_findings: usize,
    /// The first error an op returned, if any (a failure).
    error: Option<String>,
    passed: bool,
}

impl Row {
    fn new(case: &OpCase) -> Row {
        Row {
            case: case.label.clone(),
            op: case.op.name().to_string(),
            max_abs_err: 0.0,
            max_rel_err: 0.0,
            adjoint_rel_err: 0.0,
            audit_findings: 0,
            error: None,
            passed: true,
        }
    }

    fn fail(&mut self, message: String) {
        self.passed = false;
        self.error.get_or_insert(message);
    }

    /// Checks one point of the case and folds its outcome into the row.
    fn check(&mut self, case: &OpCase, rng: &mut ChaCha8Rng) {
        let refs: Vec<&Tensor<f64>> = case.inputs.iter().collect();
        let out = match case.op.forward(&refs) {
            Ok(out) => out.value,
            Err(e) => return self.fail(e.to_string()),
        };
        let cot = uniform_like(&out, rng);
        let tangents: Vec<Tensor<f64>> = case.inputs.iter().map(|x| uniform_like(x, rng)).collect();
        match check_op(
            &case.op,
            &case.inputs,
            &cot,
            &tangents,
            STEP,
            Tolerance::default(),
        ) {
            Ok(report) => {
                self.max_abs_err = self.max_abs_err.max(report.max_abs_err);
                self.max_rel_err = self.max_rel_err.max(report.max_rel_err);
                self.adjoint_rel_err = self.adjoint_rel_err.max(report.adjoint_rel_err);
                if !report.passed {
                    self.passed = false;
                }
            }
            Err(e) => return self.fail(e.to_string()),
        }
        let mut tape = Tape::new();
        let ids: Vec<usize> = case
            .inputs
            .iter()
            .map(|x| tape.leaf(x.clone(), true))
            .collect();
        match tape.apply(case.op.clone(), &ids) {
            Ok(_) => {
                let findings = audit(&tape).findings.len();
                self.audit_findings = self.audit_findings.max(findings);
                if findings > 0 {
                    self.passed = false;
                }
            }
            Err(e) => self.fail(e.to_string()),
        }
    }
}

fn uniform_like(t: &Tensor<f64>, rng: &mut ChaCha8Rng) -> Tensor<f64> {
    let data = (0..t.numel())
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    Tensor::from_shape(t.shape().clone(), data).expect("data has the shape's length")
}

/// Runs every selected case at `points` random points; rows keep the registry's order.
fn run_checks(args: &CheckArgs) -> Vec<Row> {
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let mut rows: Vec<Row> = Vec::new();
    for _ in 0..args.points {
        for case in op_cases(&mut rng) {
            if let Some(filter) = &args.op {
                if !case.label.contains(filter.as_str()) {
                    continue;
                }
            }
            let i = match rows.iter().position(|r| r.case == case.label) {
                Some(i) => i,
                None => {
                    rows.push(Row::new(&case));
                    rows.len() - 1
                }
            };
            rows[i].check(&case, &mut rng);
        }
    }
    rows
}

fn print_table(rows: &[Row]) {
    let width = rows.iter().map(|r| r.case.len()).max().unwrap_or(4).max(4);
    println!(
        "{:<width$}  {:>11}  {:>11}  {:>11}  {:>8}  result",
        "case", "max abs err", "max rel err", "adjoint err", "audit"
    );
    for r in rows {
        let audit = if r.audit_findings == 0 {
            "ok".to_string()
        } else {
            format!("{} bad", r.audit_findings)
        };
        let result = match (&r.error, r.passed) {
            (Some(e), _) => format!("FAIL: {e}"),
            (None, true) => "pass".to_string(),
            (None, false) => "FAIL".to_string(),
        };
        println!(
            "{:<width$}  {:>11.2e}  {:>11.2e}  {:>11.2e}  {:>8}  {result}",
            r.case, r.max_abs_err, r.max_rel_err, r.adjoint_rel_err, audit
        );
    }
}

/// Summary object of `--json` output.
#[derive(Serialize)]
struct Summary {
    cases: usize,
    points: usize,
    passed: usize,
    failed: usize,
    seed: u64,
}

/// Runs `tapegrad check`.
pub fn run(args: CheckArgs) -> CliResult {
    if args.points == 0 {
        return Err(CliError::Usage(
            "--points must be at least 1 (the number of random points per case)".into(),
        ));
    }
    let rows = run_checks(&args);
    if rows.is_empty() {
        return Err(CliError::Usage(format!(
            "no registered case matches --op {:?}",
            args.op.as_deref().unwrap_or("")
        )));
    }
    let failed = rows.iter().filter(|r| !r.passed).count();
    let summary = Summary {
        cases: rows.len(),
        points: args.points,
        passed: rows.len() - failed,
        failed,
        seed: args.seed,
    };
    if args.json {
        for r in &rows {
            println!("{}", to_json(r)?);
        }
        println!("{}", to_json(&summary)?);
    } else {
        print_table(&rows);
        println!(
            "{} cases at {} points each (seed {}): {} passed, {} failed",
            summary.cases, summary.points, summary.seed, summary.passed, summary.failed
        );
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn to_json<T: Serialize>(value: &T) -> Result<String, CliError> {
    serde_json::to_string(value).map_err(|e| CliError::Other(format!("json output: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tapegrad_core::ops::elementwise::Add;
    use tapegrad_core::ops::{ElementwiseOp, OpKind};
    use tapegrad_core::Op;

    fn args(op: Option<&str>) -> CheckArgs {
        CheckArgs {
            seed: 5,
            points: 2,
            op: op.map(str::to_string),
            json: false,
        }
    }

    #[test]
    fn a_case_whose_op_errors_fails_and_keeps_the_message() {
        let case = OpCase {
            label: "add (one argument)".into(),
            op: Op::Elementwise(ElementwiseOp::Add(Add)),
            inputs: vec![Tensor::from_f64(&[2], &[1.0, 2.0]).unwrap()],
        };
        let mut row = Row::new(&case);
        row.check(&case, &mut ChaCha8Rng::seed_from_u64(0));
        assert!(!row.passed);
        let error = row.error.unwrap();
        assert!(
            error.contains("add") && error.contains("expected 2"),
            "{error}"
        );
    }

    #[test]
    fn the_filter_keeps_only_matching_cases_each_checked_once_per_label() {
        let rows = run_checks(&args(Some("log_softmax")));
        let labels: Vec<&str> = rows.iter().map(|r| r.case.as_str()).collect();
        assert_eq!(labels, ["log_softmax (last axis)", "log_softmax (axis 0)"]);
        assert!(
            rows.iter().all(|r| r.passed && r.max_abs_err < 1e-6),
            "{rows:?}"
        );
    }

    #[test]
    fn every_nn_op_is_listed_and_passes() {
        let rows = run_checks(&args(None));
        let nn_ops = OpKind::ALL.iter().filter(|k| matches!(k, OpKind::Nn(_)));
        for op in nn_ops.map(|k| k.label()) {
            let of_op: Vec<&Row> = rows.iter().filter(|r| r.op == op).collect();
            assert!(!of_op.is_empty(), "{op} is not listed");
            assert!(of_op.iter().all(|r| r.passed), "{of_op:?}");
        }
    }

    #[test]
    fn zero_points_is_a_usage_error() {
        let mut a = args(None);
        a.points = 0;
        assert!(matches!(run(a), Err(CliError::Usage(_))));
    }
}
