//! embedding, index_select, gather, scatter_add, select and dropout: values, accumulation of
//! repeated indices, out-of-range indices as `OpError::Index` naming index and bound, laws 5 and 6,
//! and dropout's seeded mask (same seed, same mask, in forward and VJP alike).

use crate::ops_nn_support::{fwd, laws, random, rng, t};
use tapegrad_core::laws::op_vjp;
use tapegrad_core::ops::nn::{
    dropout_mask, Dropout, Embedding, Gather, IndexSelect, IndexTensor, ScatterAdd, Select,
};
use tapegrad_core::{Op, OpError, Session, Shape};

fn ix(dims: &[usize], data: &[usize]) -> IndexTensor {
    IndexTensor::new(dims, data.to_vec()).unwrap()
}

fn embedding(indices: IndexTensor) -> Op {
    Embedding::new(indices).into()
}

#[test]
fn embedding_accumulates_gradients_of_repeated_indices() {
    let w = t(&[4, 2], &[0., 1., 10., 11., 20., 21., 30., 31.]);
    let op = embedding(ix(&[2, 2], &[1, 3, 1, 1]));
    let y = fwd(&op, &[&w]);
    assert_eq!(y.dims(), &[2, 2, 2]);
    assert_eq!(y.data(), &[10., 11., 30., 31., 10., 11., 10., 11.]);
    let seed = t(&[2, 2, 2], &[1., 2., 3., 4., 5., 6., 7., 8.]);
    let g = op_vjp(&op, &[&w], &seed).unwrap();
    // Row 1 is used three times: 1 + 5 + 7 and 2 + 6 + 8; row 3 once; rows 0 and 2 never.
    assert_eq!(g[0].data(), &[0., 0., 13., 16., 0., 0., 3., 4.]);
    laws(&op, &[w], &mut rng(21));
}

#[test]
fn out_of_range_indices_name_the_index_and_the_bound() {
    let w = Shape::new([4, 2]).unwrap();
    let e = embedding(ix(&[3], &[0, 7, 9]))
        .output_shape(&[&w])
        .unwrap_err();
    assert_eq!(
        e,
        OpError::Index {
            op: "embedding",
            what: "index",
            index: 7,
            bound: 4
        }
    );
    assert!(
        e.to_string().contains("7") && e.to_string().contains("4"),
        "{e}"
    );
    let x = Shape::new([2, 3]).unwrap();
    let e = Op::from(IndexSelect {
        dim: 1,
        index: IndexTensor::vector(vec![3]),
    })
    .output_shape(&[&x])
    .unwrap_err();
    assert!(
        matches!(
            e,
            OpError::Index {
                op: "index_select",
                index: 3,
                bound: 3,
                ..
            }
        ),
        "{e}"
    );
    let e = Op::from(Gather {
        dim: 0,
        index: ix(&[1, 1], &[2]),
    })
    .output_shape(&[&x])
    .unwrap_err();
    assert!(
        matches!(
            e,
            OpError::Index {
                op: "gather",
                index: 2,
                bound: 2,
                ..
            }
        ),
        "{e}"
    );
    let e = Op::from(ScatterAdd {
        dim: -1,
        index: ix(&[1, 1], &[5]),
    })
    .output_shape(&[&x, &x])
    .unwrap_err();
    assert!(
        matches!(
            e,
            OpError::Index {
                op: "scatter_add",
                index: 5,
                bound: 3,
                ..
            }
        ),
        "{e}"
    );
    for index in [2, -3, isize::MIN] {
        let e = Op::from(Select { dim: 0, index })
            .output_shape(&[&x])
            .unwrap_err();
        assert!(
            matches!(
                e,
                OpError::Index {
                    op: "select",
                    bound: 2,
                    ..
                }
            ),
            "{e}"
        );
    }
    // Malformed attributes and ranks are errors too, never panics.
    let bad = IndexTensor {
        shape: Shape::new([3]).unwrap(),
        data: vec![0].into(),
    };
    assert!(embedding(bad).output_shape(&[&w]).is_err());
    assert!(embedding(ix(&[1], &[0]))
        .output_shape(&[&Shape::new([4]).unwrap()])
        .is_err());
    assert!(Op::from(Gather {
        dim: 0,
        index: ix(&[3], &[0, 0, 0]),
    })
    .output_shape(&[&x])
    .is_err());
    assert!(Op::from(Select { dim: 2, index: 0 })
        .output_shape(&[&x])
        .is_err());
}

#[test]
fn index_select_values_and_laws() {
    let x = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let op: Op = IndexSelect {
        dim: -1,
        index: IndexTensor::vector(vec![2, 0, 2]),
    }
    .into();
    assert_eq!(fwd(&op, &[&x]).data(), &[3., 1., 3., 6., 4., 6.]);
    let g = op_vjp(&op, &[&x], &t(&[2, 3], &[1., 1., 1., 1., 1., 1.])).unwrap();
    assert_eq!(g[0].data(), &[1., 0., 2., 1., 0., 2.]);
    let mut r = rng(22);
    for (dims, dim, index) in [
        (vec![4, 3], 0, ix(&[5], &[3, 0, 0, 2, 3])),
        (vec![2, 5, 3], 1, ix(&[2], &[4, 1])),
        (vec![2, 3], 1, ix(&[], &[2])),
        (vec![3, 2], 0, ix(&[0], &[])),
    ] {
        laws(
            &IndexSelect { dim, index }.into(),
            &[random(&mut r, &dims)],
            &mut r,
        );
    }
}

#[test]
fn gather_and_scatter_add_values_and_laws() {
    let x = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let index = ix(&[2, 2], &[2, 0, 1, 1]);
    let gather: Op = Gather {
        dim: 1,
        index: index.clone(),
    }
    .into();
    assert_eq!(fwd(&gather, &[&x]).data(), &[3., 1., 5., 5.]);
    let g = op_vjp(&gather, &[&x], &t(&[2, 2], &[1., 2., 3., 4.])).unwrap();
    assert_eq!(g[0].data(), &[2., 0., 1., 0., 7., 0.]);
    // scatter_add: src may be larger than the index; only its index-shaped corner is used.
    let src = t(&[2, 3], &[10., 20., 99., 30., 40., 99.]);
    let scatter: Op = ScatterAdd { dim: 1, index }.into();
    let y = fwd(&scatter, &[&x, &src]);
    assert_eq!(y.data(), &[21., 2., 13., 4., 75., 6.]);
    let seed = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let g = op_vjp(&scatter, &[&x, &src], &seed).unwrap();
    assert_eq!(g[0].data(), seed.data());
    assert_eq!(g[1].data(), &[3., 1., 0., 5., 5., 0.]);
    let mut r = rng(23);
    for (dims, dim, index) in [
        (vec![3, 4], 0, ix(&[2, 3], &[2, 0, 1, 1, 1, 2])),
        (vec![2, 3, 2], -1, ix(&[2, 2, 2], &[1, 0, 0, 0, 1, 1, 0, 1])),
        (vec![4], 0, ix(&[6], &[3, 3, 0, 1, 3, 2])),
    ] {
        let x = random(&mut r, &dims);
        laws(
            &Gather {
                dim,
                index: index.clone(),
            }
            .into(),
            std::slice::from_ref(&x),
            &mut r,
        );
        let mut src_dims = index.shape.dims().to_vec();
        src_dims[0] += 1;
        let src = random(&mut r, &src_dims);
        laws(&ScatterAdd { dim, index }.into(), &[x, src], &mut r);
    }
}

#[test]
fn select_values_and_laws() {
    let x = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let op: Op = Select { dim: 1, index: -1 }.into();
    assert_eq!(fwd(&op, &[&x]).data(), &[3., 6.]);
    let g = op_vjp(&op, &[&x], &t(&[2], &[7., 8.])).unwrap();
    assert_eq!(g[0].data(), &[0., 0., 7., 0., 0., 8.]);
    let mut r = rng(24);
    for (dims, dim, index) in [(vec![3, 4], 0, 2), (vec![2, 3, 4], -2, -3), (vec![5], 0, 4)] {
        laws(
            &Select { dim, index }.into(),
            &[random(&mut r, &dims)],
            &mut r,
        );
    }
}

#[test]
fn dropout_mask_is_a_function_of_the_seed() {
    assert_eq!(dropout_mask(9, 1000, 0.3), dropout_mask(9, 1000, 0.3));
    assert_ne!(dropout_mask(9, 1000, 0.3), dropout_mask(10, 1000, 0.3));
    // 10000 draws at p = 0.3 keep 70% give or take a few standard deviations (0.46%).
    let kept = dropout_mask(1, 10_000, 0.3).iter().filter(|&&k| k).count();
    assert!((6_800..=7_200).contains(&kept), "{kept}");
    assert!(dropout_mask(1, 100, 0.0).iter().all(|&k| k));
    assert!(dropout_mask(1, 100, 1.0).iter().all(|&k| !k));
}

#[test]
fn dropout_scales_survivors_and_its_vjp_uses_the_same_mask() {
    let mut r = rng(25);
    let x = random(&mut r, &[4, 50]);
    let op: Op = Dropout {
        p: 0.25,
        training: true,
        seed: 77,
    }
    .into();
    let y = fwd(&op, &[&x]);
    let mask = dropout_mask(77, 200, 0.25);
    for ((&yv, &xv), &keep) in y.data().iter().zip(x.data()).zip(&mask) {
        assert_eq!(yv, if keep { xv * (1.0 / 0.75) } else { 0.0 });
    }
    assert_eq!(y, fwd(&op, &[&x]), "same seed, same output");
    let seed = random(&mut r, &[4, 50]);
    let g = op_vjp(&op, &[&x], &seed).unwrap();
    for ((&gv, &sv), &keep) in g[0].data().iter().zip(seed.data()).zip(&mask) {
        assert_eq!(gv, if keep { sv * (1.0 / 0.75) } else { 0.0 });
    }
    laws(&op, std::slice::from_ref(&x), &mut r);
    // Evaluation mode and p = 0 are the identity; p = 1 zeroes everything.
    for op in [
        Dropout {
            p: 0.5,
            training: false,
            seed: 1,
        },
        Dropout {
            p: 0.0,
            training: true,
            seed: 1,
        },
    ] {
        let op: Op = op.into();
        assert_eq!(fwd(&op, &[&x]), x);
        laws(&op, std::slice::from_ref(&x), &mut r);
    }
    let all: Op = Dropout {
        p: 1.0,
        training: true,
        seed: 1,
    }
    .into();
    assert!(fwd(&all, &[&x]).is_all_zero());
    for p in [-0.1, 1.5, f64::NAN] {
        let op: Op = Dropout {
            p,
            training: true,
            seed: 1,
        }
        .into();
        let e = op.output_shape(&[x.shape()]).unwrap_err();
        assert!(e.to_string().contains("between 0 and 1"), "{e}");
    }
}

#[test]
fn session_index_methods_route_gradients() {
    let mut s = Session::<f64>::new();
    let w = s
        .parameter("w", t(&[3, 2], &[1., 2., 3., 4., 5., 6.]))
        .unwrap();
    let e = s.embedding(ix(&[3], &[2, 2, 0]), w).unwrap();
    let row = s.select(e, 0, 0).unwrap();
    let l = s.sum(row).unwrap();
    let g = s.backward(l).unwrap();
    assert_eq!(g.get("w").unwrap().data(), &[0., 0., 0., 0., 1., 1.]);
    assert!(s.embedding(ix(&[1], &[3]), w).is_err());
}
