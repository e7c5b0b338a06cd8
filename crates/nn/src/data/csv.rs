//! A small CSV reader: comma-separated fields, optional header, double-quoted fields with `""`
//! escapes, CRLF or LF line ends, blank lines skipped. Every row must have the header's width;
//! a ragged row is an error naming its line.

use crate::error::{NnError, NnResult};

/// A table of text cells.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// Where the table came from (file path or embedded name), for messages.
    pub name: String,
    /// Column names (`column_0`, `column_1`, ... when the file has no header).
    pub header: Vec<String>,
    /// The rows, each with `header.len()` cells, and the 1-based line each started on.
    pub rows: Vec<Vec<String>>,
    pub lines: Vec<usize>,
}

impl Table {
    /// Index of the column called `name`, or a column given by its 0-based index, or `last`.
    pub fn column(&self, name: &str) -> NnResult<usize> {
        if let Some(i) = self.header.iter().position(|h| h == name) {
            return Ok(i);
        }
        if name == "last" && !self.header.is_empty() {
            return Ok(self.header.len() - 1);
        }
        if let Ok(i) = name.parse::<usize>() {
            if i < self.header.len() {
                return Ok(i);
            }
        }
        Err(NnError::data(
            &self.name,
            format!("no column '{name}' (columns: {})", self.header.join(", ")),
        ))
    }
}

/// Parses CSV `text`. With `has_header`, the first record names the columns.
pub fn parse_csv(name: &str, text: &str, has_header: bool) -> NnResult<Table> {
    let mut records = Vec::new();
    let mut field = String::new();
    let mut record: Vec<String> = Vec::new();
    let mut in_quotes = false;
    let mut line = 1usize;
    let mut record_line = 1usize;
    let mut chars = text.chars().peekable();
    let mut record_has_content = false;
    while let Some(c) = chars.next() {
        if in_quotes {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => in_quotes = false,
                '\n' => {
                    line += 1;
                    field.push(c);
                }
                _ => field.push(c),
            }
            continue;
        }
        match c {
            '"' => {
                in_quotes = true;
                record_has_content = true;
            }
            ',' => {
                record.push(std::mem::take(&mut field));
                record_has_content = true;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                if record_has_content || !field.is_empty() {
                    record.push(std::mem::take(&mut field));
                    records.push((record_line, std::mem::take(&mut record)));
                }
                record_has_content = false;
                line += 1;
                record_line = line;
            }
            _ => {
                field.push(c);
                record_has_content = true;
            }
        }
    }
    if in_quotes {
        return Err(NnError::data(
            name,
            format!("line {record_line}: a quoted field is never closed"),
        ));
    }
    if record_has_content || !field.is_empty() {
        record.push(field);
        records.push((record_line, record));
    }
    let mut records = records.into_iter();
    let header = if has_header {
        match records.next() {
            Some((_, h)) => h.into_iter().map(|s| s.trim().to_string()).collect(),
            None => return Err(NnError::data(name, "the file is empty (no header line)")),
        }
    } else {
        Vec::new()
    };
    let mut rows = Vec::new();
    let mut lines = Vec::new();
    let mut width = if has_header { Some(header.len()) } else { None };
    for (l, r) in records {
        let w = *width.get_or_insert(r.len());
        if r.len() != w {
            return Err(NnError::data(
                name,
                format!("line {l}: expected {w} fields, found {}", r.len()),
            ));
        }
        rows.push(r);
        lines.push(l);
    }
    let header = if has_header {
        header
    } else {
        (0..width.unwrap_or(0))
            .map(|i| format!("column_{i}"))
            .collect()
    };
    Ok(Table {
        name: name.to_string(),
        header,
        rows,
        lines,
    })
}
