//! Property tests of the reductions: `sum_axes`, `mean_axes` and `max_axes` over any subset of axes
//! with and without keepdim, against a reference that loops over each output's reduced indices;
//! the trailing-axes fast path against the general walk (bit for bit); `expand_reduced`; and
//! `pairwise_sum`, which has `sum_axes`'s bits, and its several-rows and zero-padded forms.

mod common;

use common::*;
use proptest::prelude::*;
use tapegrad_tensor::kernels::{
    expand_reduced, max_axes, mean_axes, pairwise_span, pairwise_sum, pairwise_sum_by,
    pairwise_sums_by, reduced_shape, sum_axes,
};
use tapegrad_tensor::{Error, Shape, Tensor};

fn shape(dims: &[usize]) -> Shape {
    Shape::new(dims).unwrap()
}

/// The shape with each reduced axis either kept as 1 or removed.
fn reference_shape(dims: &[usize], axes: &[usize], keepdim: bool) -> Vec<usize> {
    (0..dims.len())
        .filter_map(|i| match (axes.contains(&i), keepdim) {
            (false, _) => Some(dims[i]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

/// For each output position (row-major over the kept shape), the input elements it reduces, in
/// row-major order of the reduced axes.
fn groups(x: &[f64], dims: &[usize], axes: &[usize]) -> Vec<Vec<f64>> {
    let kept = reference_shape(dims, axes, true);
    let reduced: Vec<usize> = axes.iter().map(|&a| dims[a]).collect();
    indices(&kept)
        .into_iter()
        .map(|out_idx| {
            indices(&reduced)
                .into_iter()
                .map(|r| {
                    let mut idx = out_idx.clone();
                    for (&a, &i) in axes.iter().zip(&r) {
                        idx[a] = i;
                    }
                    x[ravel(&idx, dims)]
                })
                .collect()
        })
        .collect()
}

fn input() -> impl Strategy<Value = (Vec<usize>, Vec<usize>, bool, u64)> {
    dims(5, 3).prop_flat_map(|d| {
        let rank = d.len();
        (Just(d), axes_subset(rank), any::<bool>(), any::<u64>())
    })
}

proptest! {
    #![proptest_config(config(192))]

    #[test]
    fn sum_mean_max_equal_the_reference((dims, axes, keepdim, seed) in input()) {
        let values = small_ints(numel(&dims), seed);
        let x = tensor::<f64>(&dims, &values);
        let want_dims = reference_shape(&dims, &axes, keepdim);
        let groups = groups(&values, &dims, &axes);

        let sum = sum_axes(&x, &axes, keepdim).unwrap();
        let want: Vec<f64> = groups.iter().map(|g| g.iter().sum()).collect();
        prop_assert_eq!(sum.dims(), &want_dims[..]);
        prop_assert_eq!(sum.data(), &want[..]);

        // Mean is the correctly rounded quotient; 0 / 0 is NaN for an empty group, as in PyTorch.
        let mean = mean_axes(&x, &axes, keepdim).unwrap();
        let want: Vec<f64> = groups
            .iter()
            .map(|g| g.iter().sum::<f64>() / g.len() as f64)
            .collect();
        prop_assert_eq!(mean.dims(), &want_dims[..]);
        prop_assert!(same_bits(mean.data(), &want), "mean {:?} vs {:?}", mean, want);

        let max = max_axes(&x, &axes, keepdim);
        if axes.iter().any(|&a| dims[a] == 0) {
            prop_assert!(matches!(max, Err(Error::Invalid { op: "amax", .. })), "{:?}", max);
        } else {
            let max = max.unwrap();
            let want: Vec<f64> = groups
                .iter()
                .map(|g| g.iter().copied().fold(f64::NEG_INFINITY, f64::max))
                .collect();
            prop_assert_eq!(max.dims(), &want_dims[..]);
            prop_assert_eq!(max.data(), &want[..]);
        }

        prop_assert_eq!(reduced_shape(x.shape(), &axes, keepdim).unwrap().dims().to_vec(), want_dims);
    }

    #[test]
    fn trailing_fast_path_and_general_walk_agree_bit_for_bit(
        dims in nonempty_dims(4, 4),
        lead in 0usize..=4,
        keepdim in any::<bool>(),
        seed in any::<u64>(),
    ) {
        // Reducing the trailing axes of `dims` takes the contiguous fast path; appending a unit
        // axis leaves the data unchanged but makes the same axes non-trailing (the general walk).
        let lead = lead.min(dims.len());
        let axes: Vec<usize> = (lead..dims.len()).collect();
        let values = floats(numel(&dims), seed, 1.0);
        let x = tensor::<f64>(&dims, &values);
        let mut padded = dims.clone();
        padded.push(1);
        let xp = x.reshape(&padded).unwrap();
        let xf = tensor::<f32>(&dims, &values);
        let xfp = xf.reshape(&padded).unwrap();
        let fast = sum_axes(&x, &axes, keepdim).unwrap();
        let general = sum_axes(&xp, &axes, keepdim).unwrap();
        prop_assert!(same_bits(fast.data(), general.data()), "{:?} vs {:?}", fast, general);
        let fast = sum_axes(&xf, &axes, keepdim).unwrap();
        let general = sum_axes(&xfp, &axes, keepdim).unwrap();
        prop_assert!(same_bits(fast.data(), general.data()), "{:?} vs {:?}", fast, general);
        let fast = mean_axes(&x, &axes, keepdim).unwrap();
        let general = mean_axes(&xp, &axes, keepdim).unwrap();
        prop_assert!(same_bits(fast.data(), general.data()), "{:?} vs {:?}", fast, general);
        let fast = max_axes(&x, &axes, keepdim).unwrap();
        let general = max_axes(&xp, &axes, keepdim).unwrap();
        prop_assert!(same_bits(fast.data(), general.data()), "{:?} vs {:?}", fast, general);
    }

    #[test]
    fn expand_reduced_restores_the_input_shape((dims, axes, keepdim, seed) in input()) {
        let x = tensor::<f64>(&dims, &small_ints(numel(&dims), seed));
        let g = sum_axes(&x, &axes, keepdim).unwrap();
        let back = expand_reduced(&g, x.shape(), &axes, keepdim).unwrap();
        prop_assert_eq!(back.dims(), &dims[..]);
        // Every input position receives the gradient of the output it was reduced into.
        let kept = reference_shape(&dims, &axes, true);
        for (lin, idx) in indices(&dims).iter().enumerate() {
            let out_idx: Vec<usize> =
                idx.iter().enumerate().map(|(i, &v)| if axes.contains(&i) { 0 } else { v }).collect();
            prop_assert_eq!(back.data()[lin], g.data()[ravel(&out_idx, &kept)]);
        }
    }

    #[test]
    fn max_propagates_nan((dims, axes, keepdim, seed) in input(), pick in any::<prop::sample::Index>()) {
        prop_assume!(numel(&dims) > 0);
        let mut values = small_ints(numel(&dims), seed);
        let at = pick.index(values.len());
        values[at] = f64::NAN;
        let x = tensor::<f64>(&dims, &values);
        let max = max_axes(&x, &axes, keepdim).unwrap();
        let groups = groups(&values, &dims, &axes);
        for (got, g) in max.data().iter().zip(&groups) {
            prop_assert_eq!(got.is_nan(), g.iter().any(|v| v.is_nan()));
        }
    }
}

#[test]
fn max_over_an_empty_axis_errors_and_names_the_shape() {
    let x = Tensor::<f32>::zeros(&shape(&[2, 0, 3]));
    let err = max_axes(&x, &[1], false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "amax: cannot take the max over an empty axis of shape [2, 0, 3]"
    );
    // Reducing only non-empty axes of an empty tensor is fine and empty.
    let y = max_axes(&x, &[2], true).unwrap();
    assert_eq!((y.dims(), y.numel()), (&[2usize, 0, 1][..], 0));
}

#[test]
fn sum_and_mean_over_an_empty_axis_give_zero_and_nan() {
    let x = Tensor::<f64>::zeros(&shape(&[2, 0]));
    assert_eq!(sum_axes(&x, &[1], false).unwrap().data(), &[0.0, 0.0]);
    assert!(mean_axes(&x, &[1], false)
        .unwrap()
        .data()
        .iter()
        .all(|v| v.is_nan()));
}

#[test]
fn mean_is_the_correctly_rounded_quotient() {
    // `sum * fl(1/n)` can differ from `fl(sum / n)` in the last bit; sweep small cases.
    for n in 1..=12usize {
        for total in -40i32..=40 {
            let mut values = vec![0.0; n];
            values[0] = total as f64;
            let x = tensor::<f64>(&[n], &values);
            let got = mean_axes(&x, &[0], false).unwrap().data()[0];
            assert_eq!(got, total as f64 / n as f64, "mean of {values:?}");
        }
    }
}

#[test]
fn reduction_axes_out_of_range_or_repeated_are_errors_not_panics() {
    let x = tensor::<f64>(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    for axes in [&[2usize][..], &[0, 5], &[1, 1]] {
        assert!(sum_axes(&x, axes, false).is_err(), "sum over {axes:?}");
        assert!(mean_axes(&x, axes, false).is_err(), "mean over {axes:?}");
        assert!(max_axes(&x, axes, false).is_err(), "max over {axes:?}");
    }
    let g = Tensor::<f64>::zeros(&shape(&[2]));
    assert!(expand_reduced(&g, x.shape(), &[3], false).is_err());
    // Unsorted but distinct axes are accepted and mean the same set.
    assert_eq!(sum_axes(&x, &[1, 0], false).unwrap().data(), &[21.0]);
}

#[test]
fn expand_reduced_rejects_a_gradient_of_the_wrong_shape() {
    let in_shape = shape(&[2, 3]);
    // Same element count as the reduced shape [2], but not that shape.
    let g = Tensor::<f64>::zeros(&shape(&[1, 2]));
    let err = expand_reduced(&g, &in_shape, &[1], false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "expand_reduced: shape mismatch: expected [2], found [1, 2]"
    );
    let g = Tensor::<f64>::zeros(&shape(&[1, 1]));
    assert!(expand_reduced(&g, &in_shape, &[1], true).is_err());
}

/// The error of an f32 sum against the f64 sum of the same values, in f32 ulps of the sum of
/// their magnitudes.
fn ulps_of_magnitudes(got: f32, values: &[f32]) -> f64 {
    let exact: f64 = values.iter().map(|&v| f64::from(v)).sum();
    let size: f64 = values.iter().map(|&v| f64::from(v).abs()).sum();
    (f64::from(got) - exact).abs() / (size * f64::from(f32::EPSILON))
}

#[test]
fn long_f32_sums_stay_within_a_few_ulps_on_every_path() {
    // 60000 positive values (so no cancellation hides the error): one running total is 34 to
    // 106 ulps of the sum off on such runs (and PyTorch's under 1.5); the pairwise order keeps it
    // to a few on the trailing, leading and middle-axis paths alike.
    let n = 60_000;
    let values: Vec<f32> = (0..n as u64)
        .map(|i| 1.0 + ((i.wrapping_mul(2_654_435_761) >> 8) % 65536) as f32 / 65536.0)
        .collect();
    let x = Tensor::new(&[n], values.clone()).unwrap();
    let all = sum_axes(&x, &[0], false).unwrap().data()[0];
    assert!(ulps_of_magnitudes(all, &values) <= 8.0, "trailing: {all}");
    let mean = mean_axes(&x, &[0], false).unwrap().data()[0];
    assert!(
        ulps_of_magnitudes(mean * n as f32, &values) <= 8.0,
        "mean: {mean}"
    );
    // [n/2, 2] over axis 0 (leading) and [2, n/4, 2] over axis 1 (middle): column 0 of each.
    let column = |stride: usize, offset: usize| -> Vec<f32> {
        values
            .iter()
            .skip(offset)
            .step_by(stride)
            .copied()
            .collect()
    };
    let rows = Tensor::new(&[n / 2, 2], values.clone()).unwrap();
    let lead = sum_axes(&rows, &[0], false).unwrap().data()[0];
    assert!(
        ulps_of_magnitudes(lead, &column(2, 0)) <= 8.0,
        "leading: {lead}"
    );
    let middle = Tensor::new(&[2, n / 4, 2], values.clone()).unwrap();
    let mid = sum_axes(&middle, &[1], false).unwrap().data()[0];
    let first_block: Vec<f32> = column(2, 0)[..n / 4].to_vec();
    assert!(
        ulps_of_magnitudes(mid, &first_block) <= 8.0,
        "middle: {mid}"
    );
}

proptest! {
    /// `pairwise_sum` (the losses' reductions, softmax's denominators) and `pairwise_sum_by` add
    /// in `sum_axes`'s order: the same bits, in f32 and f64, on lengths around the block splits.
    #[test]
    fn pairwise_sum_has_the_bits_of_sum_axes(n in 0usize..700, seed in any::<u64>()) {
        let x64: Tensor<f64> = tensor(&[n], &floats(n, seed, 3.0));
        let x32 = x64.cast::<f32>();
        let want64 = sum_axes(&x64, &[0], false).unwrap().data()[0];
        let want32 = sum_axes(&x32, &[0], false).unwrap().data()[0];
        prop_assert_eq!(pairwise_sum(x64.data()).to_bits(), want64.to_bits());
        prop_assert_eq!(pairwise_sum(x32.data()).to_bits(), want32.to_bits());
        let by = pairwise_sum_by(n, |i| x32.data()[i]);
        prop_assert_eq!(by.to_bits(), want32.to_bits());
    }

    /// Three rows summed together have each row's own bits; a row followed by zeros up to its
    /// `pairwise_span` too (mixed signs, so the totals pass through cancellations).
    #[test]
    fn rows_together_and_padded_rows_keep_the_bits(n in 0usize..300, seed in any::<u64>()) {
        let rows: Vec<Vec<f32>> = (0..3)
            .map(|r| floats(n, seed.wrapping_add(r), 3.0).iter().map(|&v| v as f32).collect())
            .collect();
        let together = pairwise_sums_by::<f32, 3>(n, &|g, j| rows[g][j]);
        for (row, total) in rows.iter().zip(together) {
            prop_assert_eq!(total.to_bits(), pairwise_sum(row).to_bits());
            let mut padded = row.clone();
            let span = pairwise_span(n);
            prop_assert!(span >= n && span < n + 32);
            padded.resize(span, 0.0);
            let alone = pairwise_sum_by(span, |j| padded[j]);
            prop_assert_eq!(alone.to_bits(), pairwise_sum(row).to_bits());
        }
    }
}
