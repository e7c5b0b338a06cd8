//! The tables and the text compiled into the binary (copied from the repository's `data/` folder, whose
//! README holds their provenance): Auto MPG as text, digits as gzip-compressed CSV, decompressed
//! here with `flate2`.

use super::{parse_csv, Table};
use crate::error::{NnError, NnResult};
use std::io::Read;

/// `data/auto-mpg.csv`: 392 cars, header `mpg,cylinders,...,origin,name`.
pub const AUTO_MPG_CSV: &str = include_str!("../../../../data/auto-mpg.csv");

/// `data/digits.csv.gz`: 1797 8x8 images, 64 pixels (0-16) then the label; no header.
pub const DIGITS_CSV_GZ: &[u8] = include_bytes!("../../../../data/digits.csv.gz");

/// `data/shakespeare.txt.gz`: seven plays, 940,232 bytes of ASCII text.
pub const SHAKESPEARE_TXT_GZ: &[u8] = include_bytes!("../../../../data/shakespeare.txt.gz");

/// The Auto MPG table.
pub fn auto_mpg() -> NnResult<Table> {
    parse_csv("auto-mpg.csv", AUTO_MPG_CSV, true)
}

/// The digits table, columns named `pixel_0` .. `pixel_63` and `label`.
pub fn digits() -> NnResult<Table> {
    let text = gunzip("digits.csv.gz", DIGITS_CSV_GZ)?;
    let mut table = parse_csv("digits.csv.gz", &text, false)?;
    let width = table.header.len();
    for (i, h) in table.header.iter_mut().enumerate() {
        *h = if i + 1 == width {
            "label".to_string()
        } else {
            format!("pixel_{i}")
        };
    }
    Ok(table)
}

/// Decompresses gzip bytes into UTF-8 text.
pub fn gunzip(name: &str, bytes: &[u8]) -> NnResult<String> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_string(&mut text)
        .map_err(|e| NnError::data(name, format!("cannot decompress: {e}")))?;
    Ok(text)
}
