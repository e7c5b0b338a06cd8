//! Data: CSV parsing (quotes, ragged rows), tables to data sets (text columns dropped, stray
//! non-numbers reported with line and column), standardisation fitted on the training rows only,
//! the seeded split, and the per-epoch batch order and its restorable position.

use std::collections::BTreeSet;
use tapegrad_nn::data::{
    embedded, parse_csv, split_indices, BatchOrder, Dataset, Prepared, Standardizer, Targets,
    TaskKind,
};

#[test]
fn csv_with_quotes_crlf_and_blank_lines() {
    let text = "a,\"b, with comma\",c\r\n1,\"2\",3\r\n\r\n4,\"say \"\"hi\"\"\",6\n";
    let t = parse_csv("t.csv", text, true).unwrap();
    assert_eq!(t.header, ["a", "b, with comma", "c"]);
    assert_eq!(t.rows, [vec!["1", "2", "3"], vec!["4", "say \"hi\"", "6"]]);
    assert_eq!(t.lines, [2, 4]);
}

#[test]
fn ragged_rows_and_open_quotes_are_errors_with_line_numbers() {
    let e = parse_csv("t.csv", "a,b\n1,2\n3\n", true)
        .unwrap_err()
        .to_string();
    assert_eq!(e, "t.csv: line 3: expected 2 fields, found 1");
    let e = parse_csv("t.csv", "a,b\n1,\"2\n", true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 2") && e.contains("never closed"), "{e}");
    assert!(parse_csv("t.csv", "", true)
        .unwrap_err()
        .to_string()
        .contains("empty"));
}

#[test]
fn auto_mpg_drops_the_name_column_and_predicts_mpg() {
    let d =
        Dataset::from_table(&embedded::auto_mpg().unwrap(), "mpg", TaskKind::Regression).unwrap();
    assert_eq!(d.rows, 392);
    assert_eq!(
        d.feature_names,
        [
            "cylinders",
            "displacement",
            "horsepower",
            "weight",
            "acceleration",
            "model_year",
            "origin"
        ]
    );
    assert_eq!(d.dropped, ["name"]);
    // First row: 18,8,307,130,3504,12,70,1,chevrolet chevelle malibu
    assert_eq!(
        &d.features[..7],
        &[8.0, 307.0, 130.0, 3504.0, 12.0, 70.0, 1.0]
    );
    let Targets::Values(y) = &d.targets else {
        panic!("regression targets")
    };
    assert_eq!(y[0], 18.0);
}

#[test]
fn digits_are_decompressed_with_ten_classes() {
    let d = Dataset::from_table(
        &embedded::digits().unwrap(),
        "label",
        TaskKind::Classification,
    )
    .unwrap();
    assert_eq!((d.rows, d.width()), (1797, 64));
    let Targets::Classes { labels, names } = &d.targets else {
        panic!("classes")
    };
    assert_eq!(names, &(0..10).map(|i| i.to_string()).collect::<Vec<_>>());
    assert_eq!(&labels[..3], &[0, 1, 2]);
    assert!(d.features.iter().all(|&v| (0.0..=16.0).contains(&v)));
}

#[test]
fn a_stray_non_number_names_line_and_column() {
    let t = parse_csv("cars.csv", "hp,mpg\n100,20\n?,21\n120,19\n", true).unwrap();
    let e = Dataset::from_table(&t, "mpg", TaskKind::Regression)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "cars.csv: line 3, column 'hp': '?' is not a finite number"
    );
    let e = Dataset::from_table(&t, "speed", TaskKind::Regression)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no column 'speed'") && e.contains("hp, mpg"),
        "{e}"
    );
}

#[test]
fn class_labels_are_sorted_numerically_or_by_text() {
    let t = parse_csv("t.csv", "x,y\n1,10\n2,9\n3,10\n4,2\n", true).unwrap();
    let d = Dataset::from_table(&t, "y", TaskKind::Classification).unwrap();
    let Targets::Classes { labels, names } = d.targets else {
        panic!()
    };
    assert_eq!(names, ["2", "9", "10"]);
    assert_eq!(labels, [2, 1, 2, 0]);
}

#[test]
fn standardizer_uses_population_statistics_and_guards_constant_columns() {
    // Column 0: 1, 2, 3, 100 (row 3 excluded from the fit); column 1 constant.
    let data = [1.0, 5.0, 2.0, 5.0, 3.0, 5.0, 100.0, 5.0];
    let s = Standardizer::fit(&data, 2, &[0, 1, 2]);
    assert_eq!(s.mean, [2.0, 5.0]);
    assert_eq!(s.std, [(2.0f64 / 3.0).sqrt(), 1.0]);
    let mut row = [3.0, 5.0];
    s.apply_row(&mut row);
    assert_eq!(row, [1.0 / (2.0f64 / 3.0).sqrt(), 0.0]);
}

#[test]
fn standardisation_is_fitted_on_the_training_rows_only() {
    let d =
        Dataset::from_table(&embedded::auto_mpg().unwrap(), "mpg", TaskKind::Regression).unwrap();
    let p = Prepared::<f64>::new(&d, 0.2, 3).unwrap();
    let (train, _) = split_indices(d.rows, 0.2, 3).unwrap();
    assert_eq!(p.features, Standardizer::fit(&d.features, 7, &train));
    // The training split has mean 0 per column; the validation split in general does not.
    let width = 7;
    let mean_of = |x: &[f64], c: usize| {
        let n = x.len() / width;
        (0..n).map(|r| x[r * width + c]).sum::<f64>() / n as f64
    };
    for c in 0..width {
        assert!(mean_of(p.train.x.data(), c).abs() < 1e-12);
    }
    assert!((0..width).any(|c| mean_of(p.val.x.data(), c).abs() > 1e-3));
}

#[test]
fn split_is_seeded_disjoint_and_complete() {
    let (a_train, a_val) = split_indices(100, 0.25, 9).unwrap();
    let (b_train, b_val) = split_indices(100, 0.25, 9).unwrap();
    assert_eq!((a_train.clone(), a_val.clone()), (b_train, b_val));
    assert_eq!(a_val.len(), 25);
    let all: BTreeSet<usize> = a_train.iter().chain(&a_val).copied().collect();
    assert_eq!(all, (0..100).collect());
    assert_ne!(split_indices(100, 0.25, 10).unwrap().1, a_val);
    assert!(split_indices(10, 1.0, 0).is_err());
}

#[test]
fn each_epoch_visits_every_row_once_in_a_new_order() {
    let mut order = BatchOrder::new(10, 4, 1).unwrap();
    let mut epochs = Vec::new();
    for _ in 0..2 {
        let mut seen: Vec<usize> = Vec::new();
        let sizes: Vec<usize> = (0..3)
            .map(|_| {
                let b = order.next_batch();
                seen.extend(&b);
                b.len()
            })
            .collect();
        assert_eq!(
            sizes,
            [4, 4, 2],
            "the last batch of an epoch is short, as drop_last=False"
        );
        let mut sorted = seen.clone();
        sorted.sort();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        epochs.push(seen);
    }
    assert_ne!(epochs[0], epochs[1]);
    assert_eq!(order.epoch(), 2);
}

#[test]
fn batch_order_position_restores() {
    let mut a = BatchOrder::new(23, 5, 4).unwrap();
    for _ in 0..7 {
        a.next_batch();
    }
    let mut b = BatchOrder::at(23, 5, 4, a.epoch(), a.cursor()).unwrap();
    assert_eq!(a, b);
    for _ in 0..10 {
        assert_eq!(a.next_batch(), b.next_batch());
    }
    assert!(BatchOrder::at(23, 5, 4, 0, 23).is_err());
    assert!(BatchOrder::new(23, 0, 4).is_err());
}
