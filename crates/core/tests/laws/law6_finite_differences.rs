//! Law 6 (derivative) and law 5 at the op level (adjointness): every registered op case's VJP
//! against f64 central differences and its JVP against its VJP, at random generic points; and the
//! gradient of `<seed, output>` of whole random programs against central differences.
//!
//! Tolerances. With step h = 1e-6, the truncation error of a central difference is h²/6·|f'''|
//! (about 1e-13 here) and its rounding error about ε·F/h, where F = Σ|seed·value| bounds the
//! magnitude of the terms of `<seed, output>`; for op cases F is a few tens, so rounding stays
//! near 1e-8, well inside `abs 1e-6 + rel 1e-5·|fd|`. For programs the rounding term is kept
//! explicitly (with a factor for the roundings along the program), since values may reach 100.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tapegrad_core::laws::{check_op, op_cases, random_program, ProgramConfig, Tolerance};
use tapegrad_core::Tensor;

const H: f64 = 1e-6;

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}
const TOL: Tolerance = Tolerance {
    abs: 1e-6,
    rel: 1e-5,
};
/// The adjoint identity holds to rounding: both sides are sums of the same products.
const ADJOINT_TOL: f64 = 1e-9;

fn uniform_like(t: &Tensor<f64>, rng: &mut ChaCha8Rng) -> Tensor<f64> {
    let data = (0..t.numel())
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    Tensor::new(t.dims(), data).unwrap()
}

/// Runs `check_op` on every registered case at the point drawn from `seed`; returns one line per
/// failing case (the op may be wrong, or not implemented yet).
fn op_level_failures(seed: u64, adjoint_only: bool) -> Vec<String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut failures = Vec::new();
    for case in op_cases(&mut rng) {
        let refs: Vec<&Tensor<f64>> = case.inputs.iter().collect();
        let out = match case.op.forward(&refs) {
            Ok(out) => out.value,
            Err(e) => {
                failures.push(format!("{}: forward failed: {e}", case.label));
                continue;
            }
        };
        let cot = uniform_like(&out, &mut rng);
        let tangents: Vec<Tensor<f64>> = case
            .inputs
            .iter()
            .map(|x| uniform_like(x, &mut rng))
            .collect();
        let shapes: Vec<String> = case.inputs.iter().map(|x| x.shape().to_string()).collect();
        match check_op(&case.op, &case.inputs, &cot, &tangents, H, TOL) {
            Err(e) => failures.push(format!("{} {shapes:?}: {e}", case.label)),
            Ok(r) if adjoint_only && r.adjoint_rel_err > ADJOINT_TOL => failures.push(format!(
                "{} {shapes:?}: adjoint rel err {:e}",
                case.label, r.adjoint_rel_err
            )),
            Ok(r) if !adjoint_only && !r.passed => failures.push(format!(
                "{} {shapes:?}: max abs err {:e}, max rel err {:e}, adjoint rel err {:e}",
                case.label, r.max_abs_err, r.max_rel_err, r.adjoint_rel_err
            )),
            Ok(_) => {}
        }
    }
    failures
}

proptest! {
    #![proptest_config(config(32))]

    #[test]
    fn every_op_vjp_matches_central_differences(seed in any::<u64>()) {
        let failures = op_level_failures(seed, false);
        prop_assert!(failures.is_empty(), "{} failing cases:\n{}", failures.len(), failures.join("\n"));
    }

    #[test]
    fn every_op_jvp_is_adjoint_to_its_vjp(seed in any::<u64>()) {
        let failures = op_level_failures(seed, true);
        prop_assert!(failures.is_empty(), "{} failing cases:\n{}", failures.len(), failures.join("\n"));
    }
}

/// Checks `backward_all` of a random program against central differences of `<seed, out>` with
/// respect to every input element that requires grad.
fn check_program(seed: u64) -> Result<(), String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let program = random_program(&mut rng, &ProgramConfig::default());
    let tape = program.record_f64().map_err(|e| e.to_string())?;
    let out = if program.nodes.is_empty() || rng.random_bool(0.3) {
        rng.random_range(0..program.slots())
    } else {
        program.slots() - 1
    };
    let value = tape.value(out).map_err(|e| e.to_string())?.clone();
    let cot = uniform_like(&value, &mut rng);
    let grads = tape.backward_all(out, &cot).map_err(|e| e.to_string())?;
    let magnitude: f64 = value
        .data()
        .iter()
        .zip(cot.data())
        .map(|(v, s)| (v * s).abs())
        .sum();
    // Rounding of the objective: a few ulps of F per program step, amplified by 1/h.
    let rounding = 4.0 * (program.nodes.len() + 1) as f64 * f64::EPSILON * magnitude / H;
    for (i, x) in program.inputs.iter().enumerate() {
        if !program.requires_grad[i] {
            continue;
        }
        for j in 0..x.numel() {
            let mut shifted = program.inputs.clone();
            shifted[i].data_mut()[j] = x.data()[j] + H;
            let fp = program
                .objective(&shifted, out, &cot)
                .map_err(|e| e.to_string())?;
            shifted[i].data_mut()[j] = x.data()[j] - H;
            let fm = program
                .objective(&shifted, out, &cot)
                .map_err(|e| e.to_string())?;
            let fd = (fp - fm) / (2.0 * H);
            let got = grads[i].data()[j];
            let allowed = TOL.abs + TOL.rel * fd.abs() + rounding;
            let err = (got - fd).abs();
            if err.is_nan() || err > allowed {
                return Err(format!(
                    "input {i} element {j}: backward_all gives {got}, central difference {fd} \
                     (allowed error {allowed:e}); output slot {out}; program:\n{}",
                    describe(&program)
                ));
            }
        }
    }
    Ok(())
}

fn describe(p: &tapegrad_core::laws::Program) -> String {
    let mut s = String::new();
    for (i, x) in p.inputs.iter().enumerate() {
        s += &format!("%{i} = input {} grad={}\n", x.shape(), p.requires_grad[i]);
    }
    for (k, n) in p.nodes.iter().enumerate() {
        s += &format!("%{} = {}{:?}\n", p.inputs.len() + k, n.op, n.args);
    }
    s
}

#[test]
fn random_programs_backward_matches_central_differences() {
    let mut runner = TestRunner::new(config(128));
    runner
        .run(&any::<u64>(), |seed| {
            check_program(seed).map_err(TestCaseError::fail)?;
            Ok(())
        })
        .unwrap();
}
