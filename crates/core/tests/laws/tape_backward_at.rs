//! `Tape::backward_at` (what `Session::backward` runs) equals picking its ids out of
//! `backward_all`, bit for bit and error for error, on random recorded programs over every op:
//! freeing op nodes' cotangents early must not change any slot that is read.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tapegrad_core::laws::{random_program, ProgramConfig};
use tapegrad_core::{Scalar, Shape, Tape, Tensor};

fn random_like<S: Scalar>(rng: &mut ChaCha8Rng, shape: &Shape) -> Tensor<S> {
    let data = (0..shape.numel())
        .map(|_| S::from_f64(rng.random_range(-1.0..1.0)))
        .collect();
    Tensor::from_shape(shape.clone(), data).unwrap()
}

fn same_bits<S: Scalar>(a: &Tensor<S>, b: &Tensor<S>) -> bool {
    a.shape() == b.shape()
        && a.data()
            .iter()
            .zip(b.data())
            .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
}

fn check<S: Scalar>(case: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(case);
    let config = ProgramConfig {
        max_nodes: 12,
        ..ProgramConfig::default()
    };
    let p = random_program(&mut rng, &config);
    let inputs: Vec<Tensor<S>> = p.inputs.iter().map(|t| t.cast()).collect();
    let tape: Tape<S> = p.record(&inputs).unwrap();
    let n = tape.len();
    for out in 0..n {
        let seed = random_like::<S>(&mut rng, tape.value(out).unwrap().shape());
        // Leaves, op nodes, repeats and ids above `out`, in random order.
        let ids: Vec<usize> = (0..rng.random_range(1..=n + 2))
            .map(|_| rng.random_range(0..n))
            .collect();
        let all = tape.backward_all(out, &seed).unwrap();
        let picked = tape.backward_at(out, &seed, &ids).unwrap();
        assert_eq!(picked.len(), ids.len());
        for (&id, g) in ids.iter().zip(&picked) {
            assert!(
                same_bits(g, &all[id]),
                "case {case}, out {out}, id {id}: {g:?} vs {:?}\n{tape}",
                all[id]
            );
        }
    }
    // Errors: the seed's shape, the output id, and a bad id among those asked for.
    let last = n - 1;
    let wrong = Tensor::<S>::zeros(&Shape::new([7, 5]).unwrap());
    assert_eq!(
        tape.backward_at(last, &wrong, &[0]).unwrap_err(),
        tape.backward_all(last, &wrong).unwrap_err(),
        "case {case}"
    );
    let seed = Tensor::<S>::ones(tape.value(last).unwrap().shape());
    assert!(tape.backward_at(n, &seed, &[0]).is_err(), "case {case}");
    assert!(
        tape.backward_at(last, &seed, &[0, n]).is_err(),
        "case {case}"
    );
}

#[test]
fn backward_at_equals_picking_from_backward_all_f64() {
    for case in 0..96 {
        check::<f64>(case);
    }
}

#[test]
fn backward_at_equals_picking_from_backward_all_f32() {
    for case in 500..596 {
        check::<f32>(case);
    }
}
