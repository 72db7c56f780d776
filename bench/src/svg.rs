//! Percentile plots as plain SVG: x = percentile on the classic HdrHistogram
//! axis (log of 1/(1-p), so 90, 99, 99.9 … are evenly spaced), y = latency
//! on a log scale. One line per system (the round with the median p99); a
//! bar at p99 spans that system's p99 over all rounds, and a system that
//! could not sustain its target rate is dashed and marked "saturated".

use std::fmt::Write as _;

pub struct Series {
    pub name: String,
    /// (percentile 0..=100, latency µs)
    pub points: Vec<(f64, f64)>,
    /// Achieved rate below 95 % of the target: its latencies are a queue.
    pub saturated: bool,
    /// p99 over all rounds (min, max), when there was more than one.
    pub p99_range: Option<(f64, f64)>,
}

const COLORS: [&str; 10] = [
    "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#17becf", "#bcbd22",
];
/// Right end of the x axis: 99.9999 %, where `max` is drawn.
const X_MAX: f64 = 6.0;

fn x_of(pct: f64) -> f64 {
    if pct >= 100.0 {
        return X_MAX;
    }
    (1.0 / (1.0 - pct / 100.0)).log10().min(X_MAX)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

pub fn percentile_plot(title: &str, series: &[Series]) -> String {
    let (w, h) = (760.0, 440.0);
    let (left, right, top, bottom) = (70.0, 190.0, 40.0, 50.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let vals: Vec<f64> = series
        .iter()
        .flat_map(|s| {
            let range = s.p99_range.map(|(a, b)| [a, b]).unwrap_or_default();
            s.points.iter().map(|p| p.1).chain(range)
        })
        .filter(|v| *v > 0.0)
        .collect();
    let lo = vals.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = vals.iter().cloned().fold(0.0, f64::max);
    let (ylo, yhi) = if vals.is_empty() {
        (0.0, 1.0)
    } else {
        (
            lo.log10().floor(),
            hi.log10().ceil().max(lo.log10().floor() + 1.0),
        )
    };
    let px = |pct: f64| left + x_of(pct) / X_MAX * pw;
    let py = |us: f64| top + ph - (us.max(1e-3).log10() - ylo) / (yhi - ylo) * ph;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
        left + pw / 2.0,
        esc(title)
    );
    // Grid: decades on y, nines on x.
    let mut d = ylo;
    while d <= yhi + 1e-9 {
        let y = top + ph - (d - ylo) / (yhi - ylo) * ph;
        let label = 10f64.powf(d);
        let text = if label >= 1e6 {
            format!("{:.0} s", label / 1e6)
        } else if label >= 1e3 {
            format!("{:.0} ms", label / 1e3)
        } else if label >= 1.0 {
            format!("{label:.0} µs")
        } else {
            format!("{label} µs")
        };
        let _ = writeln!(
            o,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{text}</text>"##,
            left + pw,
            left - 6.0,
            y + 4.0
        );
        d += 1.0;
    }
    for (pct, label) in [
        (0.0, "0%"),
        (90.0, "90%"),
        (99.0, "99%"),
        (99.9, "99.9%"),
        (99.99, "99.99%"),
        (99.999, "99.999%"),
        (100.0, "max"),
    ] {
        let x = px(pct);
        let _ = writeln!(
            o,
            r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{label}</text>"##,
            top + ph,
            top + ph + 18.0
        );
    }
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">percentile</text>"#,
        left + pw / 2.0,
        h - 8.0
    );
    let _ = writeln!(
        o,
        r#"<text x="16" y="{:.1}" transform="rotate(-90 16 {:.1})" text-anchor="middle">lock latency (log scale)</text>"#,
        top + ph / 2.0,
        top + ph / 2.0
    );
    let _ = writeln!(
        o,
        r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##
    );
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = s
            .points
            .iter()
            .filter(|p| p.1 > 0.0)
            .map(|&(pct, us)| format!("{:.1},{:.1}", px(pct), py(us)))
            .collect();
        let dash = if s.saturated {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        if !pts.is_empty() {
            let _ = writeln!(
                o,
                r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
                pts.join(" ")
            );
        }
        if let Some((lo, hi)) = s.p99_range {
            // Side by side around the 99 % line, so bars do not hide each other.
            let x = px(99.0) + (i as f64 - (series.len() as f64 - 1.0) / 2.0) * 5.0;
            let (y1, y2) = (py(lo), py(hi));
            let _ = writeln!(
                o,
                r#"<line class="p99-range" x1="{x:.1}" y1="{y1:.1}" x2="{x:.1}" y2="{y2:.1}" stroke="{color}" stroke-width="3"/><line x1="{:.1}" y1="{y1:.1}" x2="{:.1}" y2="{y1:.1}" stroke="{color}"/><line x1="{:.1}" y1="{y2:.1}" x2="{:.1}" y2="{y2:.1}" stroke="{color}"/>"#,
                x - 3.0,
                x + 3.0,
                x - 3.0,
                x + 3.0
            );
        }
        let ly = top + 14.0 + i as f64 * 18.0;
        let lx = left + pw + 14.0;
        let label = if s.saturated {
            format!("{} (saturated)", s.name)
        } else {
            s.name.clone()
        };
        let _ = writeln!(
            o,
            r#"<line x1="{lx}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{color}" stroke-width="3"{dash}/><text x="{:.1}" y="{ly:.1}">{}</text>"#,
            ly - 4.0,
            lx + 20.0,
            ly - 4.0,
            lx + 26.0,
            esc(&label)
        );
    }
    if series.iter().any(|s| s.p99_range.is_some()) {
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" font-size="11">bar at 99%: p99 over</text><text x="{:.1}" y="{:.1}" font-size="11">all rounds; dashed: saturated</text>"#,
            left + pw + 14.0,
            top + ph - 14.0,
            left + pw + 14.0,
            top + ph
        );
    }
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plot_is_svg_with_one_line_per_series() {
        let s = vec![
            Series {
                name: "a<b".into(),
                points: vec![(50.0, 10.0), (99.0, 20.0), (100.0, 300.0)],
                saturated: false,
                p99_range: Some((15.0, 40.0)),
            },
            Series {
                name: "c".into(),
                points: vec![(50.0, 5.0), (100.0, 9.0)],
                saturated: true,
                p99_range: None,
            },
        ];
        let svg = percentile_plot("t", &s);
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("a&lt;b"));
        assert_eq!(
            svg.matches("class=\"p99-range\"").count(),
            1,
            "one range bar"
        );
        assert!(svg.contains("c (saturated)"));
        assert_eq!(
            svg.matches("stroke-dasharray").count(),
            2,
            "line and legend"
        );
        assert!(x_of(99.0) > x_of(90.0) && x_of(100.0) == X_MAX);
    }
}
