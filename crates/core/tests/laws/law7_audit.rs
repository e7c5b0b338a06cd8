//! Law 7: tapes recorded from random programs at finite generic points, and every registered op
//! case recorded alone, are zero-preserving (the audit finds nothing); planted `0 * inf` and
//! `0 / 0` nodes are found and named with their node id, op, parent and offending element.

use proptest::prelude::*;
use proptest::test_runner::Config;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tapegrad_core::laws::{op_cases, random_program, ProgramConfig};
use tapegrad_core::ops::elementwise::{Div, Exp, Log, Mul, Pow, Sqrt, Where};
use tapegrad_core::ops::ElementwiseOp;
use tapegrad_core::tape::FindingKind;
use tapegrad_core::{audit, Op, Tape, Tensor};

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

fn ew(e: ElementwiseOp) -> Op {
    Op::Elementwise(e)
}

/// A planted node: the op, the value its argument takes at the poisoned element, and whether the
/// poison sits in a constant second argument (`Some(poison)`) or in the differentiated argument.
struct Plant {
    op: Op,
    constant: Option<f64>,
    at: f64,
    /// Whether the node saves a non-finite value (`0 * inf`), as opposed to `0 / 0` on finite ones.
    saves_non_finite: bool,
}

fn plants() -> Vec<Plant> {
    vec![
        // mul(x, c) with c = +inf: the contribution to x is 0 * inf.
        Plant {
            op: ew(ElementwiseOp::Mul(Mul)),
            constant: Some(f64::INFINITY),
            at: 1.5,
            saves_non_finite: true,
        },
        // div(x, c) with c = 0: the contribution to x is 0 / 0.
        Plant {
            op: ew(ElementwiseOp::Div(Div)),
            constant: Some(0.0),
            at: 1.5,
            saves_non_finite: false,
        },
        // log(x) at 0 (value -inf): the contribution is 0 / 0.
        Plant {
            op: ew(ElementwiseOp::Log(Log)),
            constant: None,
            at: 0.0,
            saves_non_finite: false,
        },
        // sqrt(x) at 0: the contribution is 0 / (2 sqrt 0) = 0 / 0.
        Plant {
            op: ew(ElementwiseOp::Sqrt(Sqrt)),
            constant: None,
            at: 0.0,
            saves_non_finite: false,
        },
        // exp(x) overflowing to +inf: the contribution is 0 * inf.
        Plant {
            op: ew(ElementwiseOp::Exp(Exp)),
            constant: None,
            at: 1000.0,
            saves_non_finite: true,
        },
        // x^-1 at 0: the contribution is 0 * (-1) * 0^-2 = 0 * inf.
        Plant {
            op: ew(ElementwiseOp::Pow(Pow { exponent: -1.0 })),
            constant: None,
            at: 0.0,
            saves_non_finite: false,
        },
    ]
}

/// Appends `plant` on slot `parent` (which must require grad) with the poison at element `index`;
/// returns the planted node's id.
fn plant_on(tape: &mut Tape<f64>, plant: &Plant, parent: usize, index: usize) -> usize {
    let value = tape.value(parent).unwrap().clone();
    let arg = match plant.constant {
        Some(poison) => {
            let mut c = Tensor::ones(value.shape());
            c.data_mut()[index] = poison;
            let c = tape.leaf(c, false);
            vec![parent, c]
        }
        None => {
            // The poisoned value enters through `where(true, c, parent)`: it takes c's values
            // (positive, but the poison at `index`) and still requires grad through `parent`.
            let mut poisoned = value.map(|v| v.abs() + 0.5);
            poisoned.data_mut()[index] = plant.at;
            let c = tape.leaf(poisoned, false);
            let bits = vec![true; value.numel()];
            let mask = tapegrad_core::ops::Mask::new(value.dims(), bits).unwrap();
            let w = tape
                .apply(ew(ElementwiseOp::Where(Where { mask })), &[c, parent])
                .unwrap();
            vec![w]
        }
    };
    tape.apply(plant.op.clone(), &arg).unwrap()
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn tapes_of_random_programs_are_zero_preserving(seed in any::<u64>()) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let program = random_program(&mut rng, &ProgramConfig::default());
        let tape = program.record_f64().unwrap();
        let report = audit(&tape);
        prop_assert!(report.is_zero_preserving(), "{report}\ntape:\n{tape}");
    }

    #[test]
    fn every_op_case_recorded_alone_is_zero_preserving(seed in any::<u64>()) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for case in op_cases(&mut rng) {
            let mut tape = Tape::new();
            let ids: Vec<usize> = case.inputs.iter().map(|x| tape.leaf(x.clone(), true)).collect();
            tape.apply(case.op.clone(), &ids).unwrap();
            let report = audit(&tape);
            prop_assert!(report.is_zero_preserving(), "{}: {report}", case.label);
        }
    }

    #[test]
    fn planted_non_finite_nodes_are_found_and_named(seed in any::<u64>()) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let program = random_program(&mut rng, &ProgramConfig::default());
        let mut tape = program.record_f64().unwrap();
        let candidates: Vec<usize> = (0..tape.len())
            .filter(|&id| tape.nodes()[id].requires_grad && tape.value(id).unwrap().numel() > 0)
            .collect();
        prop_assume!(!candidates.is_empty());
        let all = plants();
        let plant = &all[rng.random_range(0..all.len())];
        let parent = candidates[rng.random_range(0..candidates.len())];
        let index = rng.random_range(0..tape.value(parent).unwrap().numel());
        let planted = plant_on(&mut tape, plant, parent, index);
        // The argument of the planted node: the parent itself, or the `where` node in front of it.
        let arg = tape.nodes()[planted].parents[0];

        let report = audit(&tape);
        prop_assert_eq!(report.findings.len(), 1, "{}", report);
        let finding = &report.findings[0];
        prop_assert_eq!(finding.node, planted);
        prop_assert_eq!(&finding.op, plant.op.name());
        match &finding.kind {
            FindingKind::NonZero { parent: p, index: i, value } => {
                prop_assert_eq!(*p, arg);
                prop_assert_eq!(*i, index);
                prop_assert!(value.is_nan(), "{}", value);
            }
            other => prop_assert!(false, "unexpected finding {:?}", other),
        }
        prop_assert_eq!(finding.non_finite_saved.is_some(), plant.saves_non_finite, "{}", finding);
        let text = finding.to_string();
        prop_assert!(text.contains(&format!("node {planted}")), "{}", text);
        prop_assert!(text.contains(plant.op.name()), "{}", text);
        prop_assert!(text.contains(&format!("parent {arg}")), "{}", text);
    }
}

#[test]
fn mul_by_inf_is_reported_with_the_saved_infinity() {
    let mut tape = Tape::<f64>::new();
    let x = tape.leaf(Tensor::from_f64(&[3], &[1.0, 2.0, 3.0]).unwrap(), true);
    let c = tape.leaf(
        Tensor::from_f64(&[3], &[1.0, f64::INFINITY, 1.0]).unwrap(),
        false,
    );
    let y = tape.apply(ew(ElementwiseOp::Mul(Mul)), &[x, c]).unwrap();
    tape.set_name(y, "masked").unwrap();
    let report = audit(&tape);
    assert_eq!(report.findings.len(), 1);
    let f = &report.findings[0];
    assert_eq!(
        (f.node, f.op.as_str(), f.name.as_deref()),
        (y, "mul", Some("masked"))
    );
    assert!(
        matches!(f.kind, FindingKind::NonZero { parent: 0, index: 1, value } if value.is_nan())
    );
    assert_eq!(f.non_finite_saved, Some((1, f64::INFINITY)));
    assert_eq!(
        f.to_string(),
        "node 2 'masked' (mul): a zero cotangent gives NaN at element 1 of the contribution to \
         parent 0; a saved value is inf (element 1), so 0 * inf is not 0"
    );
}
