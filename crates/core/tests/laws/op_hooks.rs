//! The op contract's optional hooks (`linear_vjp`, `forward_in_place`, `vjp_in_place`) give the
//! bits of the rules they replace, for every registered op case that has one: at random generic
//! points and on the special values (zeros of both signs, infinities, NaN) that generic points
//! avoid. The executors take the hooks without naming an op, so this is what holds them to it.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tapegrad_core::laws::op_cases;
use tapegrad_core::ops::{LinearPart, LinearVjp, Saved};
use tapegrad_core::{Op, Tensor};

fn bits(t: &Tensor<f64>) -> (Vec<usize>, Vec<u64>) {
    let dims = t.shape().dims().to_vec();
    (dims, t.data().iter().map(|v| v.to_bits()).collect())
}

/// Zeros of both signs, infinities, NaN and ordinary values, cycled to fill `like`'s shape.
fn special_like(like: &Tensor<f64>) -> Tensor<f64> {
    let special = [
        0.0,
        -0.0,
        f64::NAN,
        -f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1.5,
        -2.0,
    ];
    let data: Vec<f64> = (0..like.numel())
        .map(|i| special[i % special.len()])
        .collect();
    Tensor::from_f64(like.shape().dims(), &data).unwrap()
}

fn random_like(like: &Tensor<f64>, rng: &mut ChaCha8Rng) -> Tensor<f64> {
    let data: Vec<f64> = (0..like.numel())
        .map(|_| rng.random_range(-2.0..2.0))
        .collect();
    Tensor::from_f64(like.shape().dims(), &data).unwrap()
}

/// Which hooks one case exercised: (linear VJP, forward in place, VJP in place).
type Used = (bool, bool, bool);

/// Checks every hook `op` has against its rules on arguments `args` and cotangent `cot`.
fn check_hooks(
    label: &str,
    op: &Op,
    args: &[Tensor<f64>],
    cot_of: impl Fn(&Tensor<f64>) -> Tensor<f64>,
) -> Used {
    let refs: Vec<&Tensor<f64>> = args.iter().collect();
    let forward = op.forward(&refs).unwrap();
    let cot = cot_of(&forward.value);
    let saved = Saved::keep(op.saves(), &refs, &forward, vec![true; args.len()]);
    let grads = op.vjp(&saved.context(), &cot).unwrap();
    let mut used = (false, false, false);
    if let Some(linear) = op.linear_vjp() {
        used.0 = true;
        let parts: Vec<LinearPart> = match linear {
            LinearVjp::Unary(p) => vec![p],
            LinearVjp::Binary(a, b) => vec![a, b],
        };
        assert_eq!(
            parts.len(),
            args.len(),
            "{label}: one linear part per argument"
        );
        for (i, part) in parts.into_iter().enumerate() {
            let g = part.apply(cot.clone(), args[i].shape()).unwrap();
            let want = grads[i].as_ref().unwrap();
            assert_eq!(
                bits(&g),
                bits(want),
                "{label}: linear part {i} differs from the vjp"
            );
        }
    }
    if let [x] = args {
        // `value` shares `x`'s buffer, so writing it in place must copy first.
        let (before, mut value) = (bits(x), x.clone());
        if op.forward_in_place(&mut value) {
            used.1 = true;
            assert_eq!(
                bits(&value),
                bits(&forward.value),
                "{label}: forward in place"
            );
            assert_eq!(bits(x), before, "{label}: a shared argument was written");
        }
        let mut c = cot.clone();
        if op.vjp_in_place(&forward.value, &mut c) {
            used.2 = true;
            let want = grads[0].as_ref().unwrap();
            assert_eq!(bits(&c), bits(want), "{label}: vjp in place");
        }
    }
    used
}

#[test]
fn every_hook_gives_the_bits_of_the_rule_it_replaces() {
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    let mut seen = (0, 0, 0);
    for _ in 0..4 {
        for case in op_cases(&mut rng) {
            let draws = ChaCha8Rng::seed_from_u64(rng.random());
            let used = check_hooks(&case.label, &case.op, &case.inputs, |y| {
                random_like(y, &mut draws.clone())
            });
            if used == (false, false, false) {
                continue;
            }
            // Special cotangents, then special arguments, for the ops that have a hook.
            check_hooks(&case.label, &case.op, &case.inputs, special_like);
            let special: Vec<Tensor<f64>> = case.inputs.iter().map(special_like).collect();
            check_hooks(&case.label, &case.op, &special, special_like);
            seen.0 += usize::from(used.0);
            seen.1 += usize::from(used.1);
            seen.2 += usize::from(used.2);
        }
    }
    // add, sub, neg and scale have a linear VJP; relu computes in place.
    assert!(seen.0 >= 4 * 4 && seen.1 >= 4 && seen.2 >= 4, "{seen:?}");
}
