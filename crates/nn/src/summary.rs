//! Plain-text tables for the end of a run: rows of a label and cells, columns padded to line up.

/// A table with a header row.
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with column titles `header` (the first column holds row labels).
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as lines: first column left-aligned, others right-aligned.
    pub fn render(&self) -> String {
        let cols = self
            .header
            .len()
            .max(self.rows.iter().map(Vec::len).max().unwrap_or(0));
        let mut widths = vec![0; cols];
        for r in std::iter::once(&self.header).chain(&self.rows) {
            for (i, c) in r.iter().enumerate() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let line = |r: &Vec<String>| {
            let mut s = String::new();
            for (i, w) in widths.iter().enumerate() {
                let c = r.get(i).map(String::as_str).unwrap_or("");
                if i == 0 {
                    s.push_str(&format!("{c:<w$}"));
                } else {
                    s.push_str(&format!("  {c:>w$}"));
                }
            }
            s.trim_end().to_string()
        };
        let mut out = line(&self.header);
        out.push('\n');
        out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (cols.saturating_sub(1))));
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r));
            out.push('\n');
        }
        out
    }
}

/// A metric value for display: accuracy as a percentage, other metrics with 4 digits.
pub fn format_metric(name: &str, v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    match name {
        "accuracy" => format!("{:.2}%", 100.0 * v),
        _ => format!("{v:.4}"),
    }
}
