//! Law 8 (skipping avoids NaN): when a node the output does not depend on would turn its zero
//! cotangent into NaN (`0 * inf`, `0 / 0`), the executed `backward_all` never calls its VJP and is
//! NaN-free, while the reference `backward_from(one_hot(..))` calls it and is not.

use proptest::prelude::*;
use proptest::test_runner::Config;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tapegrad_core::laws::{random_program, ProgramConfig};
use tapegrad_core::ops::elementwise::{Div, Log, Mul, Sin, Sqrt, Where};
use tapegrad_core::ops::{ElementwiseOp, Mask};
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

fn has_nan(grads: &[Tensor<f64>]) -> bool {
    grads.iter().any(|g| g.data().iter().any(|v| v.is_nan()))
}

fn uniform_like(t: &Tensor<f64>, rng: &mut ChaCha8Rng) -> Tensor<f64> {
    let data = (0..t.numel())
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    Tensor::new(t.dims(), data).unwrap()
}

/// Appends a node that reads `parent` and maps a zero cotangent to NaN at element `index`:
/// `mul` by a constant holding +inf, `div` by a constant holding 0, or `log` / `sqrt` of a value
/// holding 0 (fed through `where(true, c, parent)` so it still depends on `parent`).
fn plant(tape: &mut Tape<f64>, which: usize, parent: usize, index: usize) -> usize {
    let value = tape.value(parent).unwrap().clone();
    let poisoned = |tape: &mut Tape<f64>, at: f64| {
        let mut c = value.map(|v| v.abs() + 0.5);
        c.data_mut()[index] = at;
        tape.leaf(c, false)
    };
    match which {
        0 | 1 => {
            let c = poisoned(tape, if which == 0 { f64::INFINITY } else { 0.0 });
            let op = if which == 0 {
                ElementwiseOp::Mul(Mul)
            } else {
                ElementwiseOp::Div(Div)
            };
            tape.apply(ew(op), &[parent, c]).unwrap()
        }
        _ => {
            let c = poisoned(tape, 0.0);
            let mask = Mask::new(value.dims(), vec![true; value.numel()]).unwrap();
            let w = tape
                .apply(ew(ElementwiseOp::Where(Where { mask })), &[c, parent])
                .unwrap();
            let op = if which == 2 {
                ElementwiseOp::Log(Log)
            } else {
                ElementwiseOp::Sqrt(Sqrt)
            };
            tape.apply(ew(op), &[w]).unwrap()
        }
    }
}

proptest! {
    #![proptest_config(config(128))]

    /// A random program, then a poisoned node on one of its grad-requiring slots, appended after
    /// the program's output so that the output does not depend on it.
    #[test]
    fn executed_sweep_skips_the_unreached_poisoned_node(seed in any::<u64>()) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let program = random_program(&mut rng, &ProgramConfig::default());
        let mut tape = program.record_f64().unwrap();
        let out = tape.len() - 1;
        let candidates: Vec<usize> = (0..tape.len())
            .filter(|&id| tape.nodes()[id].requires_grad && tape.value(id).unwrap().numel() > 0)
            .collect();
        prop_assume!(!candidates.is_empty());
        let parent = candidates[rng.random_range(0..candidates.len())];
        let index = rng.random_range(0..tape.value(parent).unwrap().numel());
        let poisoned = plant(&mut tape, rng.random_range(0..4), parent, index);
        prop_assert!(!audit(&tape).is_zero_preserving());

        let seed = uniform_like(tape.value(out).unwrap(), &mut rng);
        let executed = tape.backward_all(out, &seed).unwrap();
        let reference = tape.backward_from(tape.one_hot(out, &seed).unwrap()).unwrap();
        prop_assert!(!has_nan(&executed), "backward_all has NaN:\n{}", tape);
        prop_assert!(has_nan(&reference), "backward_from has no NaN:\n{}", tape);
        // The reference puts the NaN exactly where the poisoned node sends it.
        prop_assert!(reference[tape.nodes()[poisoned].parents[0]].data()[index].is_nan());
        // The output slot receives nothing from later nodes unless it is the poisoned parent.
        if parent != out {
            prop_assert_eq!(executed[out].clone(), reference[out].clone());
        }
    }
}

#[test]
fn masked_multiplication_by_inf_is_nan_only_in_the_reference_sweep() {
    let mut tape = Tape::<f64>::new();
    let x = tape.leaf(Tensor::from_f64(&[2], &[1.0, 2.0]).unwrap(), true);
    let c = tape.leaf(
        Tensor::from_f64(&[2], &[f64::INFINITY, 1.0]).unwrap(),
        false,
    );
    let _unreached = tape.apply(ew(ElementwiseOp::Mul(Mul)), &[x, c]).unwrap();
    let y = tape.apply(ew(ElementwiseOp::Sin(Sin)), &[x]).unwrap();
    let seed = Tensor::from_f64(&[2], &[1.0, 1.0]).unwrap();
    let executed = tape.backward_all(y, &seed).unwrap();
    assert_eq!(executed[x].data(), &[1.0f64.cos(), 2.0f64.cos()]);
    let reference = tape.backward_from(tape.one_hot(y, &seed).unwrap()).unwrap();
    assert!(reference[x].data()[0].is_nan());
    assert_eq!(reference[x].data()[1], 2.0f64.cos());
}
