//! CSV data files from arbitrary bytes: parse (with or without header), build a data set for a
//! target column, split and standardise it, gather a batch. Property: an `Err` or a table whose
//! rows all have the header's width, never a panic, OOM or hang.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tapegrad_nn::data::{parse_csv, Dataset, Prepared, TaskKind};

fuzz_target!(|bytes: &[u8]| {
    let Some((&flags, rest)) = bytes.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let has_header = flags & 1 == 0;
    let Ok(table) = parse_csv("fuzz.csv", text, has_header) else {
        return;
    };
    assert_eq!(table.rows.len(), table.lines.len());
    for row in &table.rows {
        assert_eq!(row.len(), table.header.len());
    }
    let task = if flags & 2 == 0 {
        TaskKind::Regression
    } else {
        TaskKind::Classification
    };
    let target = match flags >> 2 & 3 {
        0 => "last".to_string(),
        1 => "0".to_string(),
        2 => table.header.first().cloned().unwrap_or_default(),
        _ => "mpg".to_string(),
    };
    let Ok(data) = Dataset::from_table(&table, &target, task) else {
        return;
    };
    let val_fraction = [0.0, 0.2, 0.5, 1.0, -1.0, f64::NAN][(flags >> 4 & 7) as usize % 6];
    if let Ok(prepared) = Prepared::<f32>::new(&data, val_fraction, u64::from(flags)) {
        let rows: Vec<usize> = (0..prepared.train.len()).take(4).collect();
        let batch = prepared.train.batch(&rows).expect("rows of the split");
        assert_eq!(batch.x.dims(), &[rows.len(), data.width()]);
        assert!(prepared.train.batch(&[prepared.train.len()]).is_err());
    }
});
