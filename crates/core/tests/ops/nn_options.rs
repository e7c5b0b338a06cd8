//! The PyTorch options of the conv, pooling and embedding ops: conv1d/conv2d `padding="same"` /
//! `"valid"` and `padding_mode`, avg_pool2d `divisor_override`, embedding `padding_idx`. Values
//! against numbers worked out by hand from PyTorch's definitions, laws 5 and 6 through
//! `check_op` on random inputs, errors that name the op and the offending value, and the options
//! through the session and a graph file.

use crate::ops_nn_support::{fwd, laws, random, rng, t};
use tapegrad_core::graph::GraphFile;
use tapegrad_core::laws::{check_op, op_vjp, Tolerance};
use tapegrad_core::ops::nn::{
    AvgPool2d, Conv1d, Conv2d, Embedding, IndexTensor, NamedPadding, NnOp, PaddingMode,
};
use tapegrad_core::{Op, OpError, Session, Shape, Tensor};

const SAME: Option<NamedPadding> = Some(NamedPadding::Same);
const VALID: Option<NamedPadding> = Some(NamedPadding::Valid);

fn conv1d_with(named: Option<NamedPadding>, padding: usize, mode: PaddingMode) -> Conv1d {
    Conv1d {
        padding,
        named_padding: named,
        padding_mode: mode,
        ..Conv1d::default()
    }
}

fn shape(d: &[usize]) -> Shape {
    Shape::new(d).unwrap()
}

fn error_of(op: &Op, shapes: &[&Shape]) -> String {
    op.output_shape(shapes)
        .expect_err("expected an error")
        .to_string()
}

fn assert_mentions(message: &str, parts: &[&str]) {
    for p in parts {
        assert!(message.contains(p), "{message:?} does not mention {p:?}");
    }
}

/// F.conv1d(x, w, padding="same") on x = [1, 2, 3, 4, 5]. PyTorch pads `dilation * (k - 1)` in
/// total, `total / 2` on the left and the rest on the right, then cross-correlates:
/// `out[i] = sum_k w[k] * xpad[i + k * dilation]`.
#[test]
fn conv1d_same_pads_the_odd_element_on_the_right() {
    let x = t(&[1, 1, 5], &[1., 2., 3., 4., 5.]);
    let same: Op = conv1d_with(SAME, 0, PaddingMode::Zeros).into();
    // k = 2: total 1 = (0, 1), so out[i] = x[i] + 10 x[i + 1] with x[5] = 0.
    let w = t(&[1, 1, 2], &[1., 10.]);
    assert_eq!(fwd(&same, &[&x, &w]).data(), &[21., 32., 43., 54., 5.]);
    // k = 4: total 3 = (1, 2): out[i] = x[i-1] + 10 x[i] + 100 x[i+1] + 1000 x[i+2].
    let w = t(&[1, 1, 4], &[1., 10., 100., 1000.]);
    assert_eq!(
        fwd(&same, &[&x, &w]).data(),
        &[3210., 4321., 5432., 543., 54.]
    );
    // k = 3, dilation 2: total 4 = (2, 2): out[i] = x[i-2] + 10 x[i] + 100 x[i+2].
    let dilated: Op = Conv1d {
        dilation: 2,
        ..conv1d_with(SAME, 0, PaddingMode::Zeros)
    }
    .into();
    let w = t(&[1, 1, 3], &[1., 10., 100.]);
    assert_eq!(
        fwd(&dilated, &[&x, &w]).data(),
        &[310., 420., 531., 42., 53.]
    );
    // "valid" is no padding: k = 2 gives the 4 full windows.
    let valid: Op = conv1d_with(VALID, 0, PaddingMode::Zeros).into();
    let w = t(&[1, 1, 2], &[1., 10.]);
    assert_eq!(fwd(&valid, &[&x, &w]).data(), &[21., 32., 43., 54.]);
}

/// F.conv2d(x, ones(1, 1, 2, 3), padding="same") on x = [[1, 2, 3], [4, 5, 6]]: height pads
/// (0, 1) (total 1, extra at the bottom), width (1, 1); each output is the sum of its 2x3 window.
#[test]
fn conv2d_same_pads_the_odd_row_at_the_bottom() {
    let x = t(&[1, 1, 2, 3], &[1., 2., 3., 4., 5., 6.]);
    let w = Tensor::ones(&shape(&[1, 1, 2, 3]));
    let op: Op = Conv2d {
        named_padding: SAME,
        ..Conv2d::default()
    }
    .into();
    // Row 0 sees rows 0 and 1; row 1 sees row 1 and the zero row below.
    assert_eq!(fwd(&op, &[&x, &w]).data(), &[12., 21., 16., 9., 15., 11.]);
}

/// `nn.Conv1d(padding=2, padding_mode=...)` with a 1-tap kernel of weight 1 returns the padded
/// input itself, which F.pad defines for [1, 2, 3] padded by (2, 2) as: reflect 3 2 | 1 2 3 | 2 1,
/// replicate 1 1 | 1 2 3 | 3 3, circular 2 3 | 1 2 3 | 1 2, zeros 0 0 | 1 2 3 | 0 0.
#[test]
fn padding_modes_read_the_border_as_f_pad() {
    let x = t(&[1, 1, 3], &[1., 2., 3.]);
    let w = t(&[1, 1, 1], &[1.]);
    for (mode, want) in [
        (PaddingMode::Reflect, [3., 2., 1., 2., 3., 2., 1.]),
        (PaddingMode::Replicate, [1., 1., 1., 2., 3., 3., 3.]),
        (PaddingMode::Circular, [2., 3., 1., 2., 3., 1., 2.]),
        (PaddingMode::Zeros, [0., 0., 1., 2., 3., 0., 0.]),
    ] {
        let op: Op = conv1d_with(None, 2, mode).into();
        assert_eq!(fwd(&op, &[&x, &w]).data(), &want, "{mode:?}");
    }
    // The gradient of sum(out) counts how often each input is read (the adjoint of padding).
    let mut s = Session::<f64>::new();
    let xv = s.parameter("x", x.clone()).unwrap();
    let wv = s.input(w.clone());
    let y = s
        .conv1d(xv, wv, None, conv1d_with(None, 2, PaddingMode::Reflect))
        .unwrap();
    let l = s.sum(y).unwrap();
    let g = s.backward(l).unwrap();
    // Reflect-padded sequence reads x[2], x[1], x[0], x[1], x[2], x[1], x[0].
    assert_eq!(g.get("x").unwrap().data(), &[2., 3., 2.]);
}

#[test]
fn same_valid_and_padding_modes_satisfy_the_laws() {
    let mut r = rng(101);
    let modes = [
        PaddingMode::Zeros,
        PaddingMode::Reflect,
        PaddingMode::Replicate,
        PaddingMode::Circular,
    ];
    // conv2d: (op, input dims, weight dims), with and without bias.
    let mut cases: Vec<(Op, Vec<usize>, Vec<usize>)> = Vec::new();
    for mode in modes {
        // Odd total along height (kernel 2), even along width (kernel 3), dilation 2 on width.
        cases.push((
            Conv2d {
                named_padding: SAME,
                dilation: [1, 2],
                padding_mode: mode,
                ..Conv2d::default()
            }
            .into(),
            vec![2, 2, 4, 5],
            vec![3, 2, 2, 3],
        ));
        // Explicit padding with a mode, strided, grouped, unbatched, with bias.
        cases.push((
            Conv2d {
                padding: [1, 2],
                stride: [2, 1],
                groups: 2,
                padding_mode: mode,
                bias: true,
                ..Conv2d::default()
            }
            .into(),
            vec![2, 4, 3],
            vec![4, 1, 2, 2],
        ));
        // conv1d "same" with an even kernel.
        cases.push((
            Conv1d {
                named_padding: SAME,
                padding_mode: mode,
                bias: true,
                ..Conv1d::default()
            }
            .into(),
            vec![2, 3, 6],
            vec![2, 3, 4],
        ));
    }
    cases.push((
        Conv2d {
            named_padding: VALID,
            stride: [2, 2],
            ..Conv2d::default()
        }
        .into(),
        vec![1, 2, 5, 5],
        vec![2, 2, 3, 3],
    ));
    for (op, xd, wd) in cases {
        let mut inputs = vec![random(&mut r, &xd), random(&mut r, &wd)];
        if op.arity().min() == 3 {
            inputs.push(random(&mut r, &[wd[0]]));
        }
        laws(&op, &inputs, &mut r);
    }
}

/// "same" keeps the spatial size whatever the kernel and dilation; "valid" equals padding 0.
#[test]
fn same_keeps_the_size_and_valid_is_no_padding() {
    for (k, d) in [(1, 1), (2, 1), (3, 2), (4, 3), (5, 1)] {
        let op: Op = Conv2d {
            named_padding: SAME,
            dilation: [d, 1],
            ..Conv2d::default()
        }
        .into();
        let out = op
            .output_shape(&[&shape(&[2, 3, 7, 6]), &shape(&[4, 3, k, k])])
            .unwrap();
        assert_eq!(out, shape(&[2, 4, 7, 6]), "kernel {k}, dilation {d}");
    }
    let mut r = rng(102);
    let (x, w) = (random(&mut r, &[1, 2, 5, 6]), random(&mut r, &[3, 2, 2, 3]));
    let valid: Op = Conv2d {
        named_padding: VALID,
        ..Conv2d::default()
    }
    .into();
    let plain: Op = Conv2d::default().into();
    assert_eq!(fwd(&valid, &[&x, &w]), fwd(&plain, &[&x, &w]));
}

#[test]
fn bad_conv_padding_options_are_errors_naming_the_value() {
    let (x, w) = (shape(&[1, 1, 3, 3]), shape(&[1, 1, 3, 3]));
    let strided: Op = Conv2d {
        named_padding: SAME,
        stride: [2, 1],
        ..Conv2d::default()
    }
    .into();
    assert_mentions(
        &error_of(&strided, &[&x, &w]),
        &["conv2d", "\"same\"", "strided", "[2, 1]"],
    );
    let strided1: Op = Conv1d {
        named_padding: SAME,
        stride: 3,
        ..Conv1d::default()
    }
    .into();
    assert_mentions(
        &error_of(&strided1, &[&shape(&[1, 4]), &shape(&[1, 1, 2])]),
        &["conv1d", "\"same\"", "stride 3"],
    );
    let both: Op = Conv2d {
        named_padding: VALID,
        padding: [1, 0],
        ..Conv2d::default()
    }
    .into();
    assert_mentions(
        &error_of(&both, &[&x, &w]),
        &["conv2d", "\"valid\"", "[1, 0]"],
    );
    // Reflect needs padding below the size, circular at most the size.
    let reflect: Op = Conv2d {
        padding: [3, 0],
        padding_mode: PaddingMode::Reflect,
        ..Conv2d::default()
    }
    .into();
    assert_mentions(
        &error_of(&reflect, &[&x, &w]),
        &["conv2d", "reflect", "padding (3, 3)", "size 3", "height"],
    );
    let circular: Op = conv1d_with(None, 4, PaddingMode::Circular).into();
    assert_mentions(
        &error_of(&circular, &[&shape(&[1, 3]), &shape(&[1, 1, 1])]),
        &["conv1d", "circular", "padding (4, 4)", "size 3", "length"],
    );
    // Exactly the size is fine for circular, one less for reflect.
    let ok: Op = conv1d_with(None, 3, PaddingMode::Circular).into();
    assert!(ok
        .output_shape(&[&shape(&[1, 3]), &shape(&[1, 1, 1])])
        .is_ok());
    let ok: Op = conv1d_with(None, 2, PaddingMode::Reflect).into();
    assert!(ok
        .output_shape(&[&shape(&[1, 3]), &shape(&[1, 1, 1])])
        .is_ok());
    // A huge "same" padding overflows nothing.
    let huge: Op = Conv1d {
        named_padding: SAME,
        dilation: usize::MAX,
        ..Conv1d::default()
    }
    .into();
    assert!(huge
        .output_shape(&[&shape(&[1, 3]), &shape(&[1, 1, 3])])
        .is_err());
}

/// F.avg_pool2d(x, 2, stride=1, divisor_override=d) on x = 1..9 as 3x3: the window sums are
/// 1+2+4+5 = 12, 2+3+5+6 = 16, 4+5+7+8 = 24, 5+6+8+9 = 28, each divided by d.
#[test]
fn avg_pool2d_divisor_override_divides_every_window_by_it() {
    let x = t(&[1, 1, 3, 3], &[1., 2., 3., 4., 5., 6., 7., 8., 9.]);
    for d in [5i64, -2, 1] {
        let op: Op = AvgPool2d {
            stride: [1, 1],
            divisor_override: Some(d),
            ..AvgPool2d::new([2, 2])
        }
        .into();
        let df = d as f64;
        assert_eq!(
            fwd(&op, &[&x]).data(),
            &[12. / df, 16. / df, 24. / df, 28. / df],
            "divisor {d}"
        );
    }
    // With padding 1, kernel 2, stride 2 the corner window holds only x[0, 0] = 1 and three
    // padding zeros: PyTorch divides by the override whether or not padding counts.
    for include in [true, false] {
        let op: Op = AvgPool2d {
            padding: [1, 1],
            count_include_pad: include,
            divisor_override: Some(3),
            ..AvgPool2d::new([2, 2])
        }
        .into();
        // Windows: {1}, {2, 3}, {4, 7}, {5, 6, 8, 9}.
        assert_eq!(
            fwd(&op, &[&x]).data(),
            &[1. / 3., 5. / 3., 11. / 3., 28. / 3.],
            "count_include_pad {include}"
        );
    }
}

#[test]
fn avg_pool2d_divisor_override_satisfies_the_laws() {
    let mut r = rng(103);
    for ceil_mode in [false, true] {
        for (pool, dims) in [
            (AvgPool2d::new([2, 2]), vec![2, 2, 5, 4]),
            (
                AvgPool2d {
                    stride: [2, 1],
                    padding: [1, 1],
                    count_include_pad: false,
                    ..AvgPool2d::new([3, 2])
                },
                vec![1, 2, 6, 5],
            ),
        ] {
            let op: Op = AvgPool2d {
                ceil_mode,
                divisor_override: Some(3),
                ..pool
            }
            .into();
            laws(&op, &[random(&mut r, &dims)], &mut r);
        }
    }
}

#[test]
fn avg_pool2d_divisor_override_zero_is_an_error() {
    let op: Op = AvgPool2d {
        divisor_override: Some(0),
        ..AvgPool2d::new([2, 2])
    }
    .into();
    assert_mentions(
        &error_of(&op, &[&shape(&[1, 4, 4])]),
        &["avg_pool2d", "divisor_override", "got 0"],
    );
}

fn embedding(indices: &[usize], padding_idx: Option<isize>) -> Op {
    Embedding {
        indices: IndexTensor::vector(indices.to_vec()),
        padding_idx,
    }
    .into()
}

/// F.embedding(idx, w, padding_idx=2) with idx = [0, 2, 2, 3]: the forward pass still returns
/// row 2 (PyTorch only zeroes its gradient), and the gradient of `<seed, out>` adds each seed row
/// into its index's row except row 2, which stays 0. `padding_idx = -2` is 4 - 2 = 2.
#[test]
fn embedding_padding_idx_row_gets_no_gradient() {
    let w = t(&[4, 2], &[0., 1., 10., 11., 20., 21., 30., 31.]);
    let seed = t(&[4, 2], &[1., 2., 3., 4., 5., 6., 7., 8.]);
    for p in [2, -2] {
        let op = embedding(&[0, 2, 2, 3], Some(p));
        assert_eq!(
            fwd(&op, &[&w]).data(),
            &[0., 1., 20., 21., 20., 21., 30., 31.]
        );
        let g = op_vjp(&op, &[&w], &seed).unwrap();
        assert_eq!(
            g[0].data(),
            &[1., 2., 0., 0., 0., 0., 7., 8.],
            "padding_idx {p}"
        );
    }
    // Without padding_idx row 2 gets 3 + 5 and 4 + 6.
    let g = op_vjp(&embedding(&[0, 2, 2, 3], None), &[&w], &seed).unwrap();
    assert_eq!(g[0].data(), &[1., 2., 0., 0., 8., 10., 7., 8.]);
}

/// With `padding_idx` the padding row is a constant to the op: the VJP and JVP stay adjoint, the
/// other rows match finite differences, and the padding row's gradient is 0 where finite
/// differences see the forward dependence (PyTorch's documented behaviour, not a bug).
#[test]
fn embedding_padding_idx_laws() {
    let mut r = rng(104);
    let indices = [4, 1, 1, 0, 4, 2];
    let w = random(&mut r, &[5, 3]);
    // A padding_idx that no index uses changes nothing, and every law holds.
    laws(
        &embedding(&indices, Some(3)),
        std::slice::from_ref(&w),
        &mut r,
    );
    laws(
        &embedding(&indices, Some(-2)),
        std::slice::from_ref(&w),
        &mut r,
    );
    for p in [1isize, -1] {
        let op = embedding(&indices, Some(p));
        let row = if p < 0 { 5 - 1 } else { 1 } as usize;
        let seed = random(&mut r, &[6, 3]);
        let tangent = random(&mut r, &[5, 3]);
        let report = check_op(
            &op,
            std::slice::from_ref(&w),
            &seed,
            std::slice::from_ref(&tangent),
            1e-6,
            Tolerance::default(),
        )
        .unwrap();
        assert!(report.adjoint_rel_err < 1e-12, "{report:?}");
        // The full op's gradient (checked against finite differences above) with the padding
        // row cleared is exactly the padded op's gradient.
        let plain = embedding(&indices, None);
        let plain_report = check_op(
            &plain,
            std::slice::from_ref(&w),
            &seed,
            std::slice::from_ref(&tangent),
            1e-6,
            Tolerance::default(),
        )
        .unwrap();
        assert!(plain_report.passed, "{plain_report:?}");
        let mut want = op_vjp(&plain, &[&w], &seed).unwrap()[0].data().to_vec();
        assert!(want[row * 3..row * 3 + 3].iter().any(|&v| v != 0.0));
        want[row * 3..row * 3 + 3].fill(0.0);
        assert_eq!(op_vjp(&op, &[&w], &seed).unwrap()[0].data(), &want[..]);
    }
}

#[test]
fn embedding_padding_idx_out_of_range_is_an_index_error() {
    let w = shape(&[4, 2]);
    for p in [4isize, 7, -5] {
        let e = embedding(&[0], Some(p)).output_shape(&[&w]).unwrap_err();
        assert_eq!(
            e,
            OpError::Index {
                op: "embedding",
                what: "padding_idx",
                index: p as i64,
                bound: 4
            }
        );
        assert_mentions(
            &e.to_string(),
            &["embedding", "padding_idx", &p.to_string(), "4"],
        );
    }
    for p in [3isize, -4] {
        assert!(embedding(&[0], Some(p)).output_shape(&[&w]).is_ok());
    }
}

#[test]
fn session_methods_take_the_options() {
    let mut r = rng(105);
    let mut s = Session::<f64>::new();
    let w = s.parameter("w", random(&mut r, &[3, 2])).unwrap();
    let e = s
        .embedding_with_padding_idx(IndexTensor::vector(vec![0, 2, 1, 2]), w, -1)
        .unwrap();
    let l = s.sum(e).unwrap();
    let g = s.backward(l).unwrap();
    assert_eq!(g.get("w").unwrap().data(), &[1., 1., 1., 1., 0., 0.]);

    let x = s.parameter("x", random(&mut r, &[1, 2, 4, 4])).unwrap();
    let k = s.parameter("k", random(&mut r, &[3, 2, 2, 2])).unwrap();
    let options = Conv2d {
        named_padding: SAME,
        padding_mode: PaddingMode::Replicate,
        ..Conv2d::default()
    };
    let y = s.conv2d(x, k, None, options).unwrap();
    assert_eq!(s.value(y).unwrap().dims(), &[1, 3, 4, 4]);
    let p = s
        .avg_pool2d(
            y,
            AvgPool2d {
                divisor_override: Some(2),
                ..AvgPool2d::new([2, 2])
            },
        )
        .unwrap();
    let l = s.sum(p).unwrap();
    let g = s.backward(l).unwrap();
    assert_eq!(g.get("x").unwrap().dims(), &[1, 2, 4, 4]);
    assert!(g.get("k").unwrap().data().iter().any(|&v| v != 0.0));
}

/// Every new attribute in one graph file: it parses to the intended ops, round-trips to equal
/// text, and evaluates to what the ops give directly.
#[test]
fn graph_files_carry_the_options() {
    let text = r#"{"format": "tapegrad-graph/1",
 "inputs": [
  {"name": "img", "shape": [1, 1, 3, 4], "data": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], "requires_grad": true},
  {"name": "k", "shape": [2, 1, 2, 2], "data": [1, -1, 0.5, 2, 0, 1, 1, 0], "requires_grad": true},
  {"name": "sig", "shape": [1, 5], "data": [1, 2, 3, 4, 5], "requires_grad": true},
  {"name": "k1", "shape": [1, 1, 4], "data": [1, 10, 100, 1000], "requires_grad": true},
  {"name": "emb", "shape": [3, 2], "data": [1, 2, 3, 4, 5, 6], "requires_grad": true}],
 "nodes": [
  {"name": "c", "op": "conv2d", "args": ["img", "k"], "attrs": {"padding": "same", "padding_mode": "reflect"}},
  {"name": "v", "op": "conv2d", "args": ["img", "k"], "attrs": {"padding": "valid"}},
  {"name": "c1", "op": "conv1d", "args": ["sig", "k1"], "attrs": {"padding": "same"}},
  {"name": "c2", "op": "conv1d", "args": ["sig", "k1"], "attrs": {"padding": 2, "padding_mode": "circular"}},
  {"name": "ap", "op": "avg_pool2d", "args": ["c"], "attrs": {"kernel_size": 2, "divisor_override": -3, "ceil_mode": true}},
  {"name": "e", "op": "embedding", "args": ["emb"], "attrs": {"indices": [2, 0, 2], "padding_idx": -1}},
  {"name": "s", "op": "sum", "args": ["e"]}]}"#;
    let file = GraphFile::parse(text).unwrap_or_else(|e| panic!("{e}"));
    let written = file.to_json().unwrap();
    let again = GraphFile::parse(&written).unwrap_or_else(|e| panic!("{e}\n{written}"));
    assert_eq!(again, file, "{written}");
    let ops: Vec<&Op> = file.graph.nodes().iter().map(|n| &n.op).collect();
    let want: Vec<Op> = vec![
        Conv2d {
            named_padding: SAME,
            padding_mode: PaddingMode::Reflect,
            ..Conv2d::default()
        }
        .into(),
        Conv2d {
            named_padding: VALID,
            ..Conv2d::default()
        }
        .into(),
        conv1d_with(SAME, 0, PaddingMode::Zeros).into(),
        conv1d_with(None, 2, PaddingMode::Circular).into(),
        AvgPool2d {
            ceil_mode: true,
            divisor_override: Some(-3),
            ..AvgPool2d::new([2, 2])
        }
        .into(),
        embedding(&[2, 0, 2], Some(-1)),
    ];
    for (got, want) in ops.iter().zip(&want) {
        assert_eq!(*got, want);
    }
    let values = file.graph.eval(&file.inputs::<f64>().unwrap()).unwrap();
    // Slot 5 + 2 is conv1d "same" on 1..5 with the k = 4 kernel of the test above.
    assert_eq!(values[7].data(), &[3210., 4321., 5432., 543., 54.]);
    assert_eq!(values[10].data(), &[5., 6., 1., 2., 5., 6.]);
    assert_eq!(values[11].data(), &[25.]);
    for (slot, op) in want.iter().enumerate().take(4) {
        let args: Vec<&Tensor<f64>> = file.graph.nodes()[slot]
            .args
            .iter()
            .map(|&a| &values[a])
            .collect();
        assert_eq!(values[5 + slot], fwd(op, &args), "{op}");
    }
    assert!(matches!(
        &ops[4],
        Op::Nn(nn) if matches!(**nn, NnOp::AvgPool2d(AvgPool2d {
            divisor_override: Some(-3),
            ..
        }))
    ));
}

#[test]
fn graph_files_reject_bad_option_values() {
    let file = |attrs: &str| {
        format!(
            r#"{{"format": "tapegrad-graph/1",
 "inputs": [{{"name": "x", "shape": [1, 1, 3, 3], "data": [1, 2, 3, 4, 5, 6, 7, 8, 9]}},
            {{"name": "k", "shape": [1, 1, 2, 2], "data": [1, 2, 3, 4]}}],
 "nodes": [{{"name": "n", "op": "conv2d", "args": ["x", "k"], "attrs": {attrs}}}]}}"#
        )
    };
    for (attrs, parts) in [
        (
            r#"{"padding": "full"}"#,
            &["conv2d", "padding", "\"full\"", "\"same\""][..],
        ),
        (
            r#"{"padding_mode": "wrap"}"#,
            &["conv2d", "padding_mode", "wrap", "\"reflect\""][..],
        ),
        (r#"{"padding": [1, 2, 3]}"#, &["conv2d", "padding"][..]),
        (
            r#"{"padding": "same", "stride": 2}"#,
            &["node 'n'", "conv2d", "strided", "[2, 2]"][..],
        ),
    ] {
        let e = GraphFile::parse(&file(attrs)).unwrap_err().to_string();
        assert_mentions(&e, parts);
    }
}
