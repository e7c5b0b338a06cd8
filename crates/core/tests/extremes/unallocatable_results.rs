//! Results whose shapes exist but that no machine can hold (a broadcast, an outer product, the
//! scores of a long attention, an embedding of a huge table row), asked for through the session:
//! each is an error naming the op and the shape, not an allocation abort, in f32 and f64, and
//! the session stays usable after it.

use tapegrad_core::ops::nn::{IndexTensor, ScaledDotProductAttention};
use tapegrad_core::ops::Mask;
use tapegrad_core::{Scalar, Session, Tensor, Var};

/// 2^20: a [N, N] result is 2^40 elements, 4 or 8 TiB.
const N: usize = 1 << 20;

fn ones<S: Scalar>(s: &mut Session<S>, dims: &[usize]) -> Var {
    let n = dims.iter().product();
    s.input(Tensor::new(dims, vec![S::from_f64(1.0); n]).unwrap())
}

/// Runs `call` on a fresh session and checks its error names `op` and the huge shape; then the
/// same session still computes a small product.
fn refused<S: Scalar>(op: &str, call: impl Fn(&mut Session<S>) -> tapegrad_core::Result<Var>) {
    let mut s = Session::<S>::new();
    let err = call(&mut s).map(|_| ()).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("{op}: cannot allocate a tensor of shape ["))
            && err.contains(&N.to_string()),
        "{op}: {err}"
    );
    let (a, b) = (ones(&mut s, &[2, 3]), ones(&mut s, &[3, 2]));
    let y = s.matmul(a, b).unwrap();
    assert_eq!(s.value(y).unwrap().data(), &[S::from_f64(3.0); 4][..]);
}

fn every_op_refuses<S: Scalar>() {
    refused::<S>("add", |s| {
        let (a, b) = (ones(s, &[N, 1]), ones(s, &[1, N]));
        s.add(a, b)
    });
    refused::<S>("mul", |s| {
        let (a, b) = (ones(s, &[N, 1, 1]), ones(s, &[1, N, 1]));
        s.mul(a, b)
    });
    refused::<S>("broadcast_to", |s| {
        let x = ones(s, &[1]);
        s.broadcast_to(x, &[N, N])
    });
    refused::<S>("matmul", |s| {
        let (a, b) = (ones(s, &[N, 1]), ones(s, &[1, N]));
        s.matmul(a, b)
    });
    refused::<S>("where", |s| {
        let (a, b) = (ones(s, &[N, 1]), ones(s, &[1, N]));
        s.where_(Mask::new(&[1], vec![true]).unwrap(), a, b)
    });
    refused::<S>("embedding", |s| {
        let table = ones(s, &[1, N]);
        s.embedding(IndexTensor::new(&[N], vec![0; N]).unwrap(), table)
    });
    refused::<S>("scaled_dot_product_attention", |s| {
        let (q, k, v) = (ones(s, &[N, 1]), ones(s, &[N, 1]), ones(s, &[N, 1]));
        let options = ScaledDotProductAttention {
            is_causal: false,
            scale: None,
            attn_mask: None,
            float_mask: false,
            dropout_p: 0.0,
            seed: 0,
        };
        s.scaled_dot_product_attention(q, k, v, options)
    });
}

#[test]
fn results_no_machine_can_hold_are_errors_in_f32() {
    every_op_refuses::<f32>();
}

#[test]
fn results_no_machine_can_hold_are_errors_in_f64() {
    every_op_refuses::<f64>();
}
