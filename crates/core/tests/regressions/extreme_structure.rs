//! The calls tests/extreme_structure.rs found failing, each as found: zero-size tensors whose
//! other dims are huge, and result shapes too large to exist.

use tapegrad_core::ops::linalg::{Linear, Matmul};
use tapegrad_core::ops::nn::{
    BatchNorm, Embedding, GroupNorm, IndexSelect, IndexTensor, LayerNorm,
    ScaledDotProductAttention, Select,
};
use tapegrad_core::ops::reduce::{LogSoftmax, Softmax};
use tapegrad_core::ops::structure::{Concat, Slice};
use tapegrad_core::ops::{LinalgOp, ReduceOp, Saved, StructureOp};
use tapegrad_core::{Op, Shape, Tensor};

/// Forward, VJP (all arguments) and JVP of `op` on zeros of these shapes, or the first error.
fn run_zeros(op: &Op, shapes: &[&[usize]]) -> tapegrad_core::Result<()> {
    let inputs: Vec<Tensor<f64>> = shapes
        .iter()
        .map(|d| Tensor::zeros(&Shape::new(d).unwrap()))
        .collect();
    let refs: Vec<&Tensor<f64>> = inputs.iter().collect();
    let out = op.forward(&refs)?;
    let cot = Tensor::zeros(out.value.shape());
    let saved = Saved::keep(op.saves(), &refs, &out, vec![true; refs.len()]);
    let grads = op.vjp(&saved.context(), &cot)?;
    for (g, x) in grads.iter().zip(&inputs) {
        assert_eq!(g.as_ref().unwrap().shape(), x.shape(), "{op}");
    }
    let jvp = op.jvp(&refs, &out, &refs)?;
    assert_eq!(jvp.shape(), out.value.shape(), "{op}");
    Ok(())
}

/// The error of a call whose result shape does not exist (its non-zero dims multiply past
/// isize::MAX / 16) named `Shape::new`, not the op.
#[test]
fn a_result_shape_too_large_to_exist_is_an_error_naming_the_op() {
    let index = IndexTensor::vector(vec![0; 4]);
    let op: Op = IndexSelect { dim: 0, index }.into();
    let err = run_zeros(&op, &[&[2, 0, 1 << 57]]).unwrap_err();
    assert!(err.to_string().contains("index_select"), "{err}");

    let indices = IndexTensor::new(&[1 << 40, 0], vec![]).unwrap();
    let op: Op = Embedding::new(indices).into();
    let err = run_zeros(&op, &[&[3, 1 << 20]]).unwrap_err();
    assert!(err.to_string().contains("embedding"), "{err}");

    let op = Op::Linalg(LinalgOp::Linear(Linear { bias: false }));
    let err = run_zeros(&op, &[&[1 << 58, 0, 1], &[3, 1]]).unwrap_err();
    assert!(err.to_string().contains("linear"), "{err}");
}

/// softmax and log_softmax on a zero-size tensor whose other dims are huge: the VJP and JVP
/// sized their row sums by the dims off the axis (3 * 2^40 sums: an allocation abort), where
/// there is nothing to compute.
#[test]
fn softmax_of_a_zero_size_tensor_with_huge_dims_allocates_nothing() {
    for axis in [-1, 0, 1] {
        for op in [
            ReduceOp::Softmax(Softmax { axis }),
            ReduceOp::LogSoftmax(LogSoftmax { axis }),
        ] {
            run_zeros(&Op::Reduce(op), &[&[3, 1 << 40, 0]]).unwrap();
        }
    }
}

/// concat of zero-size pieces along an axis before a zero: the kernel walked all 2^33 (empty)
/// outer blocks, a hang rather than a copy.
#[test]
fn concat_of_zero_size_pieces_with_huge_leading_dims_is_immediate() {
    let op = Op::Structure(StructureOp::Concat(Concat { axis: 1 }));
    let piece: &[usize] = &[1 << 33, 2, 0];
    run_zeros(&op, &[piece, piece, piece]).unwrap();
}

/// slice's VJP on a zero-size input: the scatter walked 2^40 (empty) outer blocks.
#[test]
fn slice_gradient_of_a_zero_size_input_with_huge_leading_dims_is_immediate() {
    let op = Op::Structure(StructureOp::Slice(Slice {
        axis: 1,
        start: 0,
        end: 3,
        step: 1,
    }));
    run_zeros(&op, &[&[1 << 40, 3, 0]]).unwrap();
}

/// index_select and select on a zero-size input whose leading dims are huge: take_along and
/// put_along walked 2^40 (empty) outer blocks per index.
#[test]
fn index_select_and_select_of_a_zero_size_input_with_huge_leading_dims_are_immediate() {
    let x: &[usize] = &[1 << 40, 3, 0];
    let index = IndexTensor::vector(vec![0, 2]);
    run_zeros(&IndexSelect { dim: 1, index }.into(), &[x]).unwrap();
    run_zeros(&Select { dim: 1, index: -1 }.into(), &[x]).unwrap();
}

/// matmul's VJP with an empty output and a broadcast batch: the products were sized by the
/// broadcast batch ([1, 3, 1] @ [2^40, 1, 0]: a [2^40, 3, 1] product, an allocation abort)
/// before being summed back to zeros.
#[test]
fn matmul_gradient_of_an_empty_product_over_a_huge_batch_is_zeros() {
    let op = Op::Linalg(LinalgOp::Matmul(Matmul));
    run_zeros(&op, &[&[1, 3, 1], &[1 << 40, 1, 0]]).unwrap();
    run_zeros(&op, &[&[1 << 40, 0, 1], &[1, 1, 3]]).unwrap();
}

/// scaled_dot_product_attention with empty feature dims beside huge lengths: the scores
/// ([1, 2^40, 2^40]) do not exist, and the error named `Shape::new`.
#[test]
fn attention_scores_too_large_to_exist_are_an_error_naming_the_op() {
    let op: Op = ScaledDotProductAttention::default().into();
    let qkv: &[usize] = &[1, 1 << 40, 0];
    let err = run_zeros(&op, &[qkv, qkv, qkv]).unwrap_err();
    assert!(
        err.to_string().contains("scaled_dot_product_attention"),
        "{err}"
    );
}

/// The norms' statistics and channel sums are sized by the shape, not the data: layer_norm on
/// [2^40, 0], group_norm on [2^33, 3, 0] and batch_norm on [0, 2^40] asked for terabytes (an
/// allocation abort). Now an error naming the op; an ordinary empty input still computes.
#[test]
fn norms_of_empty_inputs_with_huge_extents_are_errors_naming_the_op() {
    let layer: Op = LayerNorm {
        normalized_shape: vec![0],
        eps: 1e-5,
        weight: false,
        bias: false,
    }
    .into();
    let group: Op = GroupNorm {
        num_groups: 3,
        eps: 1e-5,
        weight: false,
        bias: false,
    }
    .into();
    let batch: Op = BatchNorm {
        training: true,
        momentum: 0.1,
        eps: 1e-5,
        weight: false,
        bias: false,
    }
    .into();
    for (op, shape) in [
        (&layer, &[1usize << 40, 0][..]),
        (&group, &[1 << 33, 3, 0]),
        (&batch, &[0, 1 << 40]),
    ] {
        let x = Tensor::<f64>::zeros(&Shape::new(shape).unwrap());
        let err = op.forward(&[&x]).unwrap_err().to_string();
        assert!(err.contains(op.name()) && err.contains("allocate"), "{err}");
    }
    run_zeros(&layer, &[&[4, 0]]).unwrap();
    run_zeros(&batch, &[&[0, 3, 2]]).unwrap();
}
