//! Loss curves as a hand-written SVG chart: the training loss per step (thin, with a moving
//! average) and the validation loss at each evaluation, on a log scale when the losses span more
//! than a decade.

use std::fmt::Write;

/// One named curve: `(step, value)` points.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub color: String,
    pub points: Vec<(f64, f64)>,
    /// Stroke width in pixels.
    pub width: f64,
}

const W: f64 = 720.0;
const H: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A moving average over `window` points (shorter at the start).
pub fn moving_average(points: &[(f64, f64)], window: usize) -> Vec<(f64, f64)> {
    let window = window.max(1);
    let mut sum = 0.0;
    let mut out = Vec::with_capacity(points.len());
    for (i, &(x, y)) in points.iter().enumerate() {
        sum += y;
        if i >= window {
            sum -= points[i - window].1;
        }
        out.push((x, sum / (i + 1).min(window) as f64));
    }
    out
}

/// Round tick values covering `[lo, hi]`.
fn ticks(lo: f64, hi: f64, count: usize) -> Vec<f64> {
    let span = (hi - lo).max(1e-12);
    let raw = span / count.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 {
        out.push(t);
        t += step;
    }
    out
}

fn fmt_num(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1e4 || v.abs() < 1e-3 {
        format!("{v:.0e}")
    } else {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The SVG text of a chart of `series` titled `title`.
pub fn svg(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let finite: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    let (mut x0, mut x1) = (f64::INFINITY, f64::NEG_INFINITY);
    let (mut y0, mut y1) = (f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in &finite {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if finite.is_empty() {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let log = y0 > 0.0 && y1 / y0 > 10.0;
    let ty = |y: f64| if log { y.log10() } else { y };
    let (mut ly0, mut ly1) = (ty(y0), ty(y1));
    if ly1 <= ly0 {
        ly1 = ly0 + 1.0;
    }
    if !log {
        ly0 = ly0.min(0.0);
    }
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let sx = |x: f64| LEFT + (x - x0) / (x1 - x0) * pw;
    let sy = |y: f64| TOP + ph - (ty(y) - ly0) / (ly1 - ly0) * ph;

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
        W / 2.0,
        escape(title)
    );
    // Grid and ticks.
    for t in ticks(x0, x1, 6) {
        let x = sx(t);
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#e5e5e5"/>"##,
            TOP + ph
        );
        let _ = writeln!(
            out,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            TOP + ph + 16.0,
            fmt_num(t)
        );
    }
    let ytick_values: Vec<f64> = if log {
        ticks(
            ly0.floor(),
            ly1.ceil(),
            (ly1.ceil() - ly0.floor()).max(1.0) as usize,
        )
        .into_iter()
        .filter(|e| *e >= ly0 - 1e-9 && *e <= ly1 + 1e-9)
        .map(|e| 10f64.powf(e))
        .collect()
    } else {
        ticks(ly0, ly1, 5)
    };
    for t in ytick_values {
        let y = sy(t);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e5e5e5"/>"##,
            LEFT + pw
        );
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            y + 4.0,
            fmt_num(t)
        );
    }
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        H - 12.0,
        escape(x_label)
    );
    let ylab = if log {
        format!("{y_label} (log scale)")
    } else {
        y_label.to_string()
    };
    let _ = writeln!(
        out,
        r#"<text x="16" y="{:.1}" text-anchor="middle" transform="rotate(-90 16 {:.1})">{}</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        escape(&ylab)
    );
    // Curves.
    for s in series {
        let pts: Vec<String> = s
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite() && (!log || *y > 0.0))
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        if pts.len() == 1 {
            let _ = writeln!(
                out,
                r#"<circle cx="{}" r="3" fill="{}"/>"#,
                pts[0].replace(',', "\" cy=\""),
                escape(&s.color)
            );
        } else if !pts.is_empty() {
            let _ = writeln!(
                out,
                r#"<polyline fill="none" stroke="{}" stroke-width="{}" points="{}"/>"#,
                escape(&s.color),
                s.width,
                pts.join(" ")
            );
        }
    }
    // Legend.
    for (i, s) in series.iter().enumerate() {
        let y = TOP + 14.0 + 18.0 * i as f64;
        let x = LEFT + pw - 180.0;
        let _ = writeln!(
            out,
            r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{}" stroke-width="3"/>"#,
            x + 24.0,
            escape(&s.color)
        );
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}">{}</text>"#,
            x + 30.0,
            y + 4.0,
            escape(&s.name)
        );
    }
    out.push_str("</svg>\n");
    out
}
