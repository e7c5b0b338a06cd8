//! Convolution and pooling: forward values against hand-computed results, laws 5 and 6 for every
//! attribute variant at random points, PyTorch's pooling tie rule, stride/padding combinations that
//! do not divide evenly, and hostile arguments that must be errors rather than panics.

use crate::ops_nn_support::{fwd, laws, random, rng, t};
use rand_chacha::ChaCha8Rng;
use tapegrad_core::laws::op_vjp;
use tapegrad_core::ops::nn::{AdaptiveAvgPool2d, AvgPool2d, Conv1d, Conv2d, MaxPool2d};
use tapegrad_core::{Op, OpError, Session, Shape, Tensor};

fn conv2d(
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
    bias: bool,
) -> Op {
    Conv2d {
        stride,
        padding,
        dilation,
        groups,
        bias,
        ..Default::default()
    }
    .into()
}

fn conv1d(stride: usize, padding: usize, dilation: usize, groups: usize, bias: bool) -> Op {
    Conv1d {
        stride,
        padding,
        dilation,
        groups,
        bias,
        ..Default::default()
    }
    .into()
}

fn shape(dims: &[usize]) -> Shape {
    Shape::new(dims).unwrap()
}

fn invalid_message(r: Result<Shape, OpError>) -> String {
    match r {
        Err(e @ OpError::Invalid { .. }) => e.to_string(),
        other => panic!("expected an invalid-argument error, got {other:?}"),
    }
}

#[test]
fn conv2d_forward_matches_hand_computation() {
    // 3x3 input 1..9, 2x2 kernel of ones: each output is the sum of a 2x2 block.
    let x = t(&[1, 1, 3, 3], &[1., 2., 3., 4., 5., 6., 7., 8., 9.]);
    let w = t(&[1, 1, 2, 2], &[1., 1., 1., 1.]);
    let y = fwd(&conv2d([1, 1], [0, 0], [1, 1], 1, false), &[&x, &w]);
    assert_eq!(y.dims(), &[1, 1, 2, 2]);
    assert_eq!(y.data(), &[12., 16., 24., 28.]);
    // Padding 1, stride 2, bias 10: windows at (-1,-1), (-1,1), (1,-1), (1,1).
    let b = t(&[1], &[10.]);
    let y = fwd(&conv2d([2, 2], [1, 1], [1, 1], 1, true), &[&x, &w, &b]);
    assert_eq!(y.data(), &[11., 15., 21., 38.]);
    // Dilation 2 on a 3x3 input with a 2x2 kernel reads the four corners.
    let y = fwd(&conv2d([1, 1], [0, 0], [2, 2], 1, false), &[&x, &w]);
    assert_eq!(y.data(), &[20.]);
}

#[test]
fn conv2d_groups_keep_channels_apart() {
    // Two groups of one channel each: output 0 sees only channel 0, output 1 only channel 1.
    let x = t(&[1, 2, 1, 2], &[1., 2., 30., 40.]);
    let w = t(&[2, 1, 1, 1], &[2., 3.]);
    let y = fwd(&conv2d([1, 1], [0, 0], [1, 1], 2, false), &[&x, &w]);
    assert_eq!(y.data(), &[2., 4., 90., 120.]);
}

#[test]
fn conv1d_forward_matches_hand_computation() {
    let x = t(&[1, 1, 5], &[1., 2., 3., 4., 5.]);
    let w = t(&[1, 1, 2], &[1., -1.]);
    let y = fwd(&conv1d(2, 1, 1, 1, false), &[&x, &w]);
    // Padded input 0 1 2 3 4 5 0, windows at 0, 2, 4: (0-1), (2-3), (4-5).
    assert_eq!(y.dims(), &[1, 1, 3]);
    assert_eq!(y.data(), &[-1., -1., -1.]);
}

/// Checks the laws for a convolution `op` on random inputs of these shapes (bias when `bias`).
fn conv_laws(r: &mut ChaCha8Rng, op: Op, x: &[usize], w: &[usize], bias: bool) {
    let mut inputs = vec![random(r, x), random(r, w)];
    if bias {
        inputs.push(random(r, &[w[0]]));
    }
    laws(&op, &inputs, r);
}

#[test]
fn conv2d_laws_for_every_variant() {
    let mut r = rng(1);
    let c = conv2d;
    conv_laws(
        &mut r,
        c([1, 1], [0, 0], [1, 1], 1, false),
        &[2, 3, 5, 4],
        &[4, 3, 3, 3],
        false,
    );
    conv_laws(
        &mut r,
        c([1, 1], [1, 1], [1, 1], 1, true),
        &[2, 3, 5, 4],
        &[4, 3, 3, 3],
        true,
    );
    // Stride 2 with padding 1 on 7x6: (7+2-3)/2 and (6+2-3)/2 do not divide evenly.
    conv_laws(
        &mut r,
        c([2, 2], [1, 1], [1, 1], 1, true),
        &[1, 2, 7, 6],
        &[3, 2, 3, 3],
        true,
    );
    conv_laws(
        &mut r,
        c([3, 2], [0, 2], [1, 1], 1, false),
        &[1, 2, 6, 7],
        &[2, 2, 2, 3],
        false,
    );
    conv_laws(
        &mut r,
        c([1, 2], [2, 1], [2, 3], 1, true),
        &[1, 2, 7, 7],
        &[2, 2, 3, 2],
        true,
    );
    conv_laws(
        &mut r,
        c([1, 1], [1, 1], [1, 1], 2, true),
        &[2, 4, 4, 5],
        &[6, 2, 3, 3],
        true,
    );
    // Depthwise.
    conv_laws(
        &mut r,
        c([2, 1], [1, 1], [1, 1], 3, false),
        &[1, 3, 5, 5],
        &[3, 1, 3, 3],
        false,
    );
    // Pointwise (the GEMM reads the input directly).
    conv_laws(
        &mut r,
        c([1, 1], [0, 0], [1, 1], 1, true),
        &[2, 3, 3, 4],
        &[5, 3, 1, 1],
        true,
    );
    // Unbatched input.
    conv_laws(
        &mut r,
        c([1, 2], [1, 0], [1, 1], 1, true),
        &[2, 4, 5],
        &[3, 2, 2, 2],
        true,
    );
}

#[test]
fn conv1d_laws_for_every_variant() {
    let mut r = rng(2);
    let c = conv1d;
    conv_laws(&mut r, c(1, 0, 1, 1, false), &[2, 3, 8], &[4, 3, 3], false);
    conv_laws(&mut r, c(2, 1, 1, 1, true), &[2, 3, 8], &[4, 3, 3], true);
    conv_laws(&mut r, c(3, 2, 2, 2, true), &[1, 4, 9], &[2, 2, 2], true);
    conv_laws(&mut r, c(1, 0, 1, 2, false), &[1, 2, 6], &[2, 1, 1], false);
    conv_laws(&mut r, c(2, 1, 1, 1, true), &[3, 7], &[2, 3, 3], true);
}

#[test]
fn conv1d_equals_conv2d_on_a_height_one_image() {
    let mut r = rng(3);
    let x = random(&mut r, &[2, 4, 9]);
    let w = random(&mut r, &[6, 2, 3]);
    let y1 = fwd(&conv1d(2, 1, 2, 2, false), &[&x, &w]);
    let y2 = fwd(
        &conv2d([1, 2], [0, 1], [1, 2], 2, false),
        &[
            &x.reshape(&[2, 4, 1, 9]).unwrap(),
            &w.reshape(&[6, 2, 1, 3]).unwrap(),
        ],
    );
    assert_eq!(y1.data(), y2.data());
}

#[test]
fn conv2d_rejects_hostile_arguments() {
    let op =
        |stride, padding, dilation, groups, bias| conv2d(stride, padding, dilation, groups, bias);
    let x = shape(&[1, 4, 5, 5]);
    let w = shape(&[2, 2, 3, 3]);
    let s = |o: Op, shapes: &[&Shape]| o.output_shape(shapes);
    let msg = invalid_message(s(op([1, 1], [0, 0], [1, 1], 0, false), &[&x, &w]));
    assert!(msg.contains("conv2d") && msg.contains("groups 0"), "{msg}");
    let msg = invalid_message(s(op([1, 1], [0, 0], [1, 1], 3, false), &[&x, &w]));
    assert!(
        msg.contains("groups 3") && msg.contains("[1, 4, 5, 5]"),
        "{msg}"
    );
    // Weight expects 2 channels per group, the input has 4 in 1 group.
    let msg = invalid_message(s(op([1, 1], [0, 0], [1, 1], 1, false), &[&x, &w]));
    assert!(
        msg.contains("[2, 2, 3, 3]") && msg.contains("[1, 4, 5, 5]"),
        "{msg}"
    );
    // Kernel larger than the padded input.
    let big = shape(&[2, 2, 9, 9]);
    let msg = invalid_message(s(op([1, 1], [1, 1], [1, 1], 2, false), &[&x, &big]));
    assert!(msg.contains("larger than the padded input"), "{msg}");
    let msg = invalid_message(s(op([1, 1], [0, 0], [3, 3], 2, false), &[&x, &w]));
    assert!(msg.contains("larger than the padded input"), "{msg}");
    // Zero stride, zero dilation, zero kernel.
    for (stride, dilation, ws) in [([0, 1], [1, 1], &w), ([1, 1], [1, 0], &w)] {
        invalid_message(s(op(stride, [0, 0], dilation, 2, false), &[&x, ws]));
    }
    let w0 = shape(&[2, 2, 0, 3]);
    invalid_message(s(op([1, 1], [0, 0], [1, 1], 2, false), &[&x, &w0]));
    // Huge padding, dilation and sizes overflow nothing.
    for (padding, dilation) in [([usize::MAX, 0], [1, 1]), ([0, 0], [usize::MAX, 1])] {
        assert!(s(op([1, 1], padding, dilation, 2, false), &[&x, &w]).is_err());
    }
    // A valid input whose column matrix (256 x ~2^58 elements) does not fit in a usize.
    let huge = shape(&[1, 1, 1 << 29, 1 << 29]);
    let w16 = shape(&[1, 1, 16, 16]);
    let msg = invalid_message(s(op([1, 1], [0, 0], [1, 1], 1, false), &[&huge, &w16]));
    assert!(msg.contains("too many elements"), "{msg}");
    let w1 = shape(&[1, 1, 3, 3]);
    // Wrong ranks and a wrong bias.
    invalid_message(s(
        op([1, 1], [0, 0], [1, 1], 1, false),
        &[&shape(&[4, 5]), &w1],
    ));
    invalid_message(s(
        op([1, 1], [0, 0], [1, 1], 1, false),
        &[&x, &shape(&[2, 4, 3])],
    ));
    let msg = invalid_message(s(
        op([1, 1], [0, 0], [1, 1], 2, true),
        &[&x, &w, &shape(&[3])],
    ));
    assert!(msg.contains("bias"), "{msg}");
    // Wrong arity is an arity error.
    assert!(matches!(
        s(op([1, 1], [0, 0], [1, 1], 2, true), &[&x, &w]),
        Err(OpError::Arity { .. })
    ));
}

#[test]
fn conv2d_accepts_empty_batches_and_channels() {
    let mut r = rng(4);
    let op = conv2d([1, 1], [1, 1], [1, 1], 1, true);
    let x = random(&mut r, &[0, 2, 4, 4]);
    let w = random(&mut r, &[3, 2, 3, 3]);
    let b = random(&mut r, &[3]);
    let y = fwd(&op, &[&x, &w, &b]);
    assert_eq!(y.dims(), &[0, 3, 4, 4]);
    let g = op_vjp(&op, &[&x, &w, &b], &y).unwrap();
    assert!(g[1].is_all_zero() && g[2].is_all_zero() && g[0].numel() == 0);
    // No input channels: the output is the bias.
    let x = random(&mut r, &[1, 0, 4, 4]);
    let w = random(&mut r, &[3, 0, 3, 3]);
    let y = fwd(&op, &[&x, &w, &b]);
    assert_eq!(&y.data()[..16], &[b.data()[0]; 16]);
}

#[test]
fn session_conv2d_trains_weight_and_bias() {
    let mut s = Session::<f64>::new();
    let x = s.input(t(&[1, 1, 3, 3], &[1., 2., 3., 4., 5., 6., 7., 8., 9.]));
    let w = s
        .parameter("w", t(&[1, 1, 2, 2], &[0., 0., 0., 0.]))
        .unwrap();
    let b = s.parameter("b", t(&[1], &[0.])).unwrap();
    let y = s.conv2d(x, w, Some(b), Conv2d::default()).unwrap();
    let l = s.sum(y).unwrap();
    let g = s.backward(l).unwrap();
    // d sum / d w[i, j] = sum of the input block each kernel tap sees.
    assert_eq!(g.get("w").unwrap().data(), &[12., 16., 24., 28.]);
    assert_eq!(g.get("b").unwrap().data(), &[4.]);
}

#[test]
fn max_pool2d_ties_go_to_the_first_maximum_in_row_major_order() {
    // Window 1 is all equal; window 2 has its maximum at (0, 1) and (1, 0).
    let x = t(&[1, 1, 2, 4], &[1., 1., 0., 5., 1., 1., 5., 2.]);
    let op: Op = MaxPool2d::new([2, 2]).into();
    let y = fwd(&op, &[&x]);
    assert_eq!(y.data(), &[1., 5.]);
    let g = op_vjp(&op, &[&x], &t(&[1, 1, 1, 2], &[10., 20.])).unwrap();
    assert_eq!(g[0].data(), &[10., 0., 0., 20., 0., 0., 0., 0.]);
    // Overlapping windows (stride 1) that share the same first maximum accumulate on it.
    let x = t(&[1, 1, 2, 3], &[3., 3., 3., 3., 3., 3.]);
    let op: Op = MaxPool2d {
        stride: [1, 1],
        ..MaxPool2d::new([2, 2])
    }
    .into();
    let g = op_vjp(&op, &[&x], &t(&[1, 1, 1, 2], &[1., 2.])).unwrap();
    assert_eq!(g[0].data(), &[1., 2., 0., 0., 0., 0.]);
    // -inf everywhere: the first position still takes the gradient; NaN wins and propagates.
    let x = t(&[1, 1, 1, 2], &[f64::NEG_INFINITY, f64::NEG_INFINITY]);
    let op: Op = MaxPool2d::new([1, 2]).into();
    let g = op_vjp(&op, &[&x], &t(&[1, 1, 1, 1], &[1.])).unwrap();
    assert_eq!(g[0].data(), &[1., 0.]);
    let x = t(&[1, 1, 1, 2], &[1., f64::NAN]);
    assert!(fwd(&op, &[&x]).data()[0].is_nan());
}

#[test]
fn max_pool2d_laws_for_every_variant() {
    let mut r = rng(5);
    let variants = [
        (MaxPool2d::new([2, 2]), vec![2, 3, 4, 6]),
        // 3x3 windows, stride 2, padding 1 on 5x7: uneven on both axes.
        (
            MaxPool2d {
                stride: [2, 2],
                padding: [1, 1],
                ..MaxPool2d::new([3, 3])
            },
            vec![1, 2, 5, 7],
        ),
        (
            MaxPool2d {
                stride: [1, 2],
                dilation: [2, 1],
                ..MaxPool2d::new([2, 3])
            },
            vec![1, 2, 6, 7],
        ),
        (
            MaxPool2d {
                ceil_mode: true,
                padding: [1, 0],
                ..MaxPool2d::new([2, 2])
            },
            vec![1, 1, 5, 5],
        ),
        (MaxPool2d::new([2, 1]), vec![3, 4, 3]),
    ];
    for (pool, dims) in variants {
        // Distinct values keep the check away from ties, where max is not differentiable.
        laws(&pool.into(), &[random(&mut r, &dims)], &mut r);
    }
}

#[test]
fn max_pool2d_ceil_mode_keeps_the_partial_window() {
    let x = t(&[1, 1, 1, 5], &[1., 2., 3., 4., 9.]);
    let floor: Op = MaxPool2d::new([1, 2]).into();
    let ceil: Op = MaxPool2d {
        ceil_mode: true,
        ..MaxPool2d::new([1, 2])
    }
    .into();
    assert_eq!(fwd(&floor, &[&x]).data(), &[2., 4.]);
    assert_eq!(fwd(&ceil, &[&x]).data(), &[2., 4., 9.]);
}

#[test]
fn avg_pool2d_count_include_pad_both_ways() {
    let x = Tensor::ones(&shape(&[1, 1, 3, 3]));
    let with_pad = AvgPool2d {
        stride: [1, 1],
        padding: [1, 1],
        ..AvgPool2d::new([3, 3])
    };
    let without = AvgPool2d {
        count_include_pad: false,
        ..with_pad.clone()
    };
    let y = fwd(&with_pad.into(), &[&x]);
    assert_eq!(
        y.data(),
        &[
            4. / 9.,
            6. / 9.,
            4. / 9.,
            6. / 9.,
            1.,
            6. / 9.,
            4. / 9.,
            6. / 9.,
            4. / 9.
        ]
    );
    let y = fwd(&without.into(), &[&x]);
    assert_eq!(y.data(), &[1.; 9]);
    // Ceil mode: the last window covers one real column; PyTorch divides by 1 (not by 2) because
    // the window is clipped at the end of the (zero) padding.
    let x = t(&[1, 1, 1, 5], &[1., 2., 3., 4., 9.]);
    let ceil: Op = AvgPool2d {
        ceil_mode: true,
        ..AvgPool2d::new([1, 2])
    }
    .into();
    assert_eq!(fwd(&ceil, &[&x]).data(), &[1.5, 3.5, 9.]);
}

#[test]
fn avg_pool2d_laws_for_every_variant() {
    let mut r = rng(6);
    for include in [true, false] {
        for ceil_mode in [false, true] {
            for (pool, dims) in [
                (AvgPool2d::new([2, 2]), vec![2, 2, 5, 4]),
                (
                    AvgPool2d {
                        stride: [2, 1],
                        padding: [1, 1],
                        ..AvgPool2d::new([3, 2])
                    },
                    vec![1, 2, 6, 5],
                ),
                (AvgPool2d::new([2, 3]), vec![3, 5, 7]),
            ] {
                let op: Op = AvgPool2d {
                    count_include_pad: include,
                    ceil_mode,
                    ..pool
                }
                .into();
                laws(&op, &[random(&mut r, &dims)], &mut r);
            }
        }
    }
}

#[test]
fn adaptive_avg_pool2d_values_and_laws() {
    let x = t(&[1, 1, 2, 2], &[1., 2., 3., 6.]);
    let op: Op = AdaptiveAvgPool2d {
        output_size: [1, 1],
    }
    .into();
    assert_eq!(fwd(&op, &[&x]).data(), &[3.]);
    // 3 -> 2: windows [0, 2) and [1, 3) overlap on the middle element.
    let x = t(&[1, 1, 1, 3], &[1., 2., 4.]);
    let op: Op = AdaptiveAvgPool2d {
        output_size: [1, 2],
    }
    .into();
    assert_eq!(fwd(&op, &[&x]).data(), &[1.5, 3.]);
    let mut r = rng(7);
    for (out, dims) in [
        ([3, 2], vec![2, 3, 5, 7]),
        ([2, 2], vec![1, 2, 4, 4]),
        ([5, 4], vec![2, 3, 3]),
        ([0, 2], vec![1, 2, 3]),
    ] {
        laws(
            &AdaptiveAvgPool2d { output_size: out }.into(),
            &[random(&mut r, &dims)],
            &mut r,
        );
    }
}

#[test]
fn pooling_rejects_hostile_arguments() {
    let x = shape(&[1, 1, 4, 4]);
    let out = |op: Op, x: &Shape| op.output_shape(&[x]);
    // Padding beyond half the kernel, kernel beyond the padded input, zero stride, bad ranks.
    let msg = invalid_message(out(
        MaxPool2d {
            padding: [2, 0],
            ..MaxPool2d::new([3, 3])
        }
        .into(),
        &x,
    ));
    assert!(msg.contains("half of kernel_size"), "{msg}");
    let msg = invalid_message(out(MaxPool2d::new([5, 2]).into(), &x));
    assert!(
        msg.contains("larger than the padded input") && msg.contains("[1, 1, 4, 4]"),
        "{msg}"
    );
    invalid_message(out(AvgPool2d::new([5, 2]).into(), &x));
    invalid_message(out(
        AvgPool2d {
            stride: [0, 1],
            ..AvgPool2d::new([2, 2])
        }
        .into(),
        &x,
    ));
    invalid_message(out(MaxPool2d::new([0, 2]).into(), &x));
    invalid_message(out(MaxPool2d::new([2, 2]).into(), &shape(&[4, 4])));
    invalid_message(out(AvgPool2d::new([1, 1]).into(), &shape(&[1, 1, 0, 4])));
    invalid_message(out(
        AdaptiveAvgPool2d {
            output_size: [1, 1],
        }
        .into(),
        &shape(&[1, 0, 4]),
    ));
    // A dilated window that skips over the whole (small) input sees only padding.
    let msg = invalid_message(out(
        MaxPool2d {
            stride: [1, 1],
            padding: [1, 0],
            dilation: [3, 1],
            ..MaxPool2d::new([2, 1])
        }
        .into(),
        &shape(&[1, 1, 2, 2]),
    ));
    assert!(msg.contains("covers only padding"), "{msg}");
    // Huge attributes overflow nothing.
    assert!(out(
        MaxPool2d {
            dilation: [usize::MAX, 1],
            ..MaxPool2d::new([2, 2])
        }
        .into(),
        &x
    )
    .is_err());
    assert!(out(
        AdaptiveAvgPool2d {
            output_size: [usize::MAX, usize::MAX]
        }
        .into(),
        &x
    )
    .is_err());
}

#[test]
fn attribute_sized_outputs_that_cannot_be_allocated_are_errors() {
    // Padding alone asks for a 2^28 x 2^28 output from a one-element input.
    let x = t(&[1, 1, 1, 1], &[1.]);
    let op = conv2d([1, 1], [1 << 27, 1 << 27], [1, 1], 1, false);
    let e = op.forward(&[&x, &x]).unwrap_err();
    assert!(e.to_string().contains("cannot allocate"), "{e}");
    let op: Op = AdaptiveAvgPool2d {
        output_size: [1 << 28, 1 << 28],
    }
    .into();
    assert!(op.forward(&[&x]).is_err());
    // An empty batch makes the same request empty, and it costs nothing.
    let empty = Tensor::<f64>::zeros(&shape(&[0, 1, 2, 2]));
    let op: Op = AdaptiveAvgPool2d {
        output_size: [1 << 28, 1 << 28],
    }
    .into();
    assert_eq!(fwd(&op, &[&empty]).dims(), &[0, 1, 1 << 28, 1 << 28]);
    // A huge pooling window over a tiny input is cheap: its valid positions are computed, not searched.
    let op: Op = MaxPool2d {
        stride: [1, 1],
        padding: [0, 1 << 39],
        ..MaxPool2d::new([1, 1 << 40])
    }
    .into();
    let y = fwd(&op, &[&t(&[1, 1, 1, 1], &[4.])]);
    assert_eq!(y.data(), &[4., 4.]);
}

#[test]
fn empty_tensors_with_huge_extents_never_overflow() {
    use tapegrad_core::ops::nn::{
        BatchNorm, Dropout, Embedding, Gather, GroupNorm, IndexSelect, IndexTensor, LayerNorm,
        ScaledDotProductAttention, ScatterAdd, Select,
    };
    // Shapes bound the product of their non-zero dims by 2^59.
    let big = 1usize << 28;
    let z = |dims: &[usize]| Tensor::<f64>::zeros(&shape(dims));
    let ix = |dims: &[usize]| IndexTensor::new(dims, vec![]).unwrap();
    let cases: Vec<(Op, Vec<Tensor<f64>>)> = vec![
        (
            conv2d([1, 1], [1, 1], [1, 1], 1, false),
            vec![z(&[0, 2, big, big]), z(&[1, 2, 3, 3])],
        ),
        (
            conv2d([1, 1], [0, 0], [1, 1], 1, false),
            vec![z(&[1, 0, 4, 4]), z(&[0, 0, big, big])],
        ),
        (
            conv1d(1, 0, 1, 1, false),
            vec![z(&[0, big, big]), z(&[0, big, 1])],
        ),
        (MaxPool2d::new([2, 2]).into(), vec![z(&[0, 4, big, big])]),
        (AvgPool2d::new([2, 2]).into(), vec![z(&[big, 0, big, 4])]),
        (
            AdaptiveAvgPool2d {
                output_size: [big, big],
            }
            .into(),
            vec![z(&[0, big, 2, 2])],
        ),
        (
            LayerNorm {
                normalized_shape: vec![big, big],
                eps: 1e-5,
                weight: false,
                bias: false,
            }
            .into(),
            vec![z(&[0, big, big])],
        ),
        (
            BatchNorm::new(true).into(),
            vec![z(&[0, 0, big, big]), z(&[0]), z(&[0])],
        ),
        (
            GroupNorm {
                num_groups: 1,
                eps: 1e-5,
                weight: false,
                bias: false,
            }
            .into(),
            vec![z(&[0, 1, big, big])],
        ),
        (Embedding::new(ix(&[big, 0])).into(), vec![z(&[0, big])]),
        (Embedding::new(ix(&[0])).into(), vec![z(&[0, big])]),
        (
            IndexSelect {
                dim: 0,
                index: ix(&[0]),
            }
            .into(),
            vec![z(&[0, big, big])],
        ),
        (
            Gather {
                dim: 1,
                index: ix(&[0, 1, 1]),
            }
            .into(),
            vec![z(&[0, big, big])],
        ),
        (
            ScatterAdd {
                dim: 0,
                index: ix(&[0, 1]),
            }
            .into(),
            vec![z(&[0, big]), z(&[big, 0])],
        ),
        (Select { dim: 0, index: 1 }.into(), vec![z(&[big, 0, big])]),
        (
            Dropout {
                p: 0.5,
                training: true,
                seed: 1,
            }
            .into(),
            vec![z(&[0, big, big])],
        ),
        (
            ScaledDotProductAttention::default().into(),
            vec![z(&[0, big, big]), z(&[0, big, big]), z(&[0, big, big])],
        ),
    ];
    for (op, inputs) in cases {
        let refs: Vec<&Tensor<f64>> = inputs.iter().collect();
        // Either answer is fine; reaching it without a panic is the point.
        if let Ok(out) = op.forward(&refs) {
            assert_eq!(out.value.numel(), 0, "{op}");
            let _ = op_vjp(&op, &refs, &out.value);
        }
    }
}
