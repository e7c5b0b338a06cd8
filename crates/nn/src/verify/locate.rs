//! Names the node behind a failed directional check: each node's own adjoint identity
//! `<jvp(dx), s> = <dx, vjp(s)>`, in f64 at the node's recorded arguments with seeded random
//! `dx` and `s` (the per-op law 5 of `tapegrad_core::laws`). Run only when a check failed.

use super::{Recorded, TapeGraph};
use crate::error::NnResult;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tapegrad_core::laws::op_vjp;
use tapegrad_tensor::{Scalar, Tensor};

/// Relative tolerance of one op's adjoint identity in f64.
const NODE_TOL: f64 = 1e-9;

/// The first node (in tape order) whose JVP and VJP disagree, described, with how many more do;
/// `None` when every node passes its own check.
pub fn locate_adjoint<S: Scalar>(rec: &Recorded<S>, tg: &TapeGraph<S>) -> NnResult<Option<String>> {
    let x64: Vec<Tensor<f64>> = tg.inputs.iter().map(|x| x.cast()).collect();
    let context = tg.graph.eval(&x64)?;
    let mut rng = ChaCha8Rng::seed_from_u64(0x6c6f_6361_7465);
    let mut random = |t: &Tensor<f64>| -> NnResult<Tensor<f64>> {
        let data = (0..t.numel())
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        Ok(Tensor::from_shape(t.shape().clone(), data)?)
    };
    let n_in = tg.inputs.len();
    let mut failing = Vec::new();
    for (k, node) in tg.graph.nodes().iter().enumerate() {
        let args: Vec<&Tensor<f64>> = node.args.iter().map(|&a| &context[a]).collect();
        let dx: Vec<Tensor<f64>> = args.iter().map(|a| random(a)).collect::<NnResult<_>>()?;
        let s = random(&context[n_in + k])?;
        let forward = node.op.forward(&args)?;
        let dx_refs: Vec<&Tensor<f64>> = dx.iter().collect();
        let jvp = node.op.jvp(&args, &forward, &dx_refs)?;
        let vjp = op_vjp(&node.op, &args, &s)?;
        let (lhs, lhs_abs) = dot(&jvp, &s);
        let (mut rhs, mut rhs_abs) = (0.0, 0.0);
        for (g, d) in vjp.iter().zip(&dx) {
            let (v, a) = dot(g, d);
            rhs += v;
            rhs_abs += a;
        }
        let scale = lhs_abs.max(rhs_abs).max(f64::MIN_POSITIVE);
        let err = (lhs - rhs).abs() / scale;
        if err.is_nan() || err > NODE_TOL {
            failing.push((k, err, lhs, rhs));
        }
    }
    Ok(failing.first().map(|&(k, err, lhs, rhs)| {
        let more = match failing.len() - 1 {
            0 => String::new(),
            n => format!("; {n} more nodes fail it"),
        };
        format!(
            "{} (its own adjoint check fails: <jvp(dx), s> = {lhs:e}, <dx, vjp(s)> = {rhs:e}, relative error {err:.2e}{more})",
            rec.describe(tg.tape_ids[n_in + k])
        )
    }))
}

/// `(sum a_i b_i, sum |a_i b_i|)`.
fn dot(a: &Tensor<f64>, b: &Tensor<f64>) -> (f64, f64) {
    a.data()
        .iter()
        .zip(b.data())
        .fold((0.0, 0.0), |(s, m), (x, y)| (s + x * y, m + (x * y).abs()))
}
