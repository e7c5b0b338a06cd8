//! `Standardizer`: per-column mean and standard deviation (population, as scikit-learn's
//! `StandardScaler`) fitted on training rows only, then applied to any split. A constant column
//! gets a deviation of 1 so it maps to zero instead of dividing by zero.

/// Per-column `(x - mean) / std`.
#[derive(Debug, Clone, PartialEq)]
pub struct Standardizer {
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
}

impl Standardizer {
    /// Fits on the rows `rows` of a row-major matrix `data` with `width` columns.
    pub fn fit(data: &[f64], width: usize, rows: &[usize]) -> Standardizer {
        let n = rows.len().max(1) as f64;
        let mut mean = vec![0.0; width];
        for &r in rows {
            for (m, v) in mean.iter_mut().zip(&data[r * width..(r + 1) * width]) {
                *m += v;
            }
        }
        mean.iter_mut().for_each(|m| *m /= n);
        let mut var = vec![0.0; width];
        for &r in rows {
            for ((s, v), m) in var
                .iter_mut()
                .zip(&data[r * width..(r + 1) * width])
                .zip(&mean)
            {
                *s += (v - m) * (v - m);
            }
        }
        let std = var
            .iter()
            .map(|s| {
                let d = (s / n).sqrt();
                if d > 1e-12 {
                    d
                } else {
                    1.0
                }
            })
            .collect();
        Standardizer { mean, std }
    }

    /// Number of columns.
    pub fn width(&self) -> usize {
        self.mean.len()
    }

    /// Standardises one row in place.
    pub fn apply_row(&self, row: &mut [f64]) {
        for ((v, m), s) in row.iter_mut().zip(&self.mean).zip(&self.std) {
            *v = (*v - m) / s;
        }
    }

    /// Maps a standardised value of column `c` back to its original units.
    pub fn invert(&self, c: usize, v: f64) -> f64 {
        v * self.std[c] + self.mean[c]
    }
}
