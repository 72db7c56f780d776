//! Turning [`Stats`] into the text report, the `--json` line and `.hgrm` files.

use std::fmt::Write as _;

use hdrhistogram::Histogram;

use crate::config::{Config, Mix};
use crate::engine::Stats;

pub const PERCENTILES: [(&str, f64); 6] = [
    ("p50", 50.0),
    ("p90", 90.0),
    ("p99", 99.0),
    ("p999", 99.9),
    ("p9999", 99.99),
    ("max", 100.0),
];

/// Points for percentile plots (x = percentile).
pub const CURVE: [f64; 14] = [
    0.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 99.995, 99.999, 100.0,
];

fn us(h: &Histogram<u64>, pct: f64) -> f64 {
    if h.is_empty() {
        return 0.0;
    }
    let v = if pct >= 100.0 {
        h.max()
    } else {
        h.value_at_percentile(pct)
    };
    v as f64 / 1e3
}

fn json_hist(out: &mut String, name: &str, h: &Histogram<u64>) {
    let _ = write!(out, "\"{name}\":{{\"count\":{}", h.len());
    for (label, pct) in PERCENTILES {
        let _ = write!(out, ",\"{label}\":{:.3}", us(h, pct));
    }
    let _ = write!(
        out,
        ",\"mean\":{:.3}}}",
        if h.is_empty() { 0.0 } else { h.mean() / 1e3 }
    );
}

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for ch in s.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// Why the run is a failure when every request failed: errors, and not one
/// cycle completed, lock granted or try-lock answered `busy`. (A report of
/// connect errors alone, exit 0, read like a result.)
pub fn all_failed(st: &Stats) -> Option<String> {
    let errors = st.errors.total();
    if errors == 0 || st.cycles_all > 0 || st.grants > 0 || st.busy > 0 {
        return None;
    }
    let e = &st.errors;
    Some(format!(
        "every request failed: {errors} errors (connect {}, tls {}, server {}, io {}, \
         protocol {}, not-held {}, incomplete {}), no lock granted; first error: {}",
        e.connect,
        e.tls,
        e.server,
        e.io,
        e.protocol,
        e.not_held,
        e.incomplete,
        st.first_error.as_deref().unwrap_or("none recorded")
    ))
}

pub fn fairness(grants: &[u64]) -> (u64, u64, f64) {
    let min = grants.iter().copied().min().unwrap_or(0);
    let max = grants.iter().copied().max().unwrap_or(0);
    let sum: f64 = grants.iter().map(|&g| g as f64).sum();
    let sq: f64 = grants.iter().map(|&g| (g as f64) * (g as f64)).sum();
    // Jain's index: 1.0 = perfectly even, 1/n = one client got everything.
    let jain = if sq > 0.0 {
        sum * sum / (grants.len() as f64 * sq)
    } else {
        0.0
    };
    (min, max, jain)
}

/// Completed cycles per second. Cycles that finish during the drain count,
/// and so does the drain time, so a system that falls behind shows a rate
/// below its target instead of catching up for free after the end.
pub fn ops_per_sec(st: &Stats) -> f64 {
    let ns = st.measured_ns + st.drain_used_ns;
    if ns == 0 {
        // A --cycles run that was done before the warm-up ended.
        return 0.0;
    }
    st.cycles as f64 / (ns as f64 / 1e9)
}

/// The `handshake` histogram's name in the text report.
fn handshake_label(cfg: &Config) -> &'static str {
    if cfg.tls.is_some() {
        "connect + TLS handshake"
    } else {
        "connect (TCP)"
    }
}

pub fn to_json(cfg: &Config, st: &Stats) -> String {
    let mut o = String::from("{");
    let _ = write!(
        o,
        "\"target\":{},\"label\":{},\"connections\":{},\"threads\":{},\"rate_target\":{},\"mode\":\"{}\",\"conn_mode\":\"{}\",\"mix\":\"{}\",\"keys\":{},\"dist\":\"{}\",\"access\":\"{}\",\"hold_us\":{:.3},\"duration_s\":{:.3},\"warmup_s\":{:.3},",
        json_str(&format!("{}://{}:{}", cfg.target.scheme(), cfg.target.host, cfg.target.port)),
        json_str(&cfg.label),
        cfg.connections,
        cfg.threads,
        cfg.rate_per_s,
        if cfg.rate_per_s > 0.0 { "open" } else { "closed" },
        cfg.conn_mode.name(),
        if cfg.mix == Mix::LockUnlock { "lock-unlock" } else { "try-lock" },
        cfg.keys,
        cfg.dist.describe(),
        crate::config::access_name(cfg.access),
        cfg.hold_ns as f64 / 1e3,
        st.measured_ns as f64 / 1e9,
        cfg.warmup_ns as f64 / 1e9,
    );
    let (fmin, fmax, jain) = fairness(&st.grants_per_client);
    let e = &st.errors;
    let _ = write!(
        o,
        "\"tls\":{},\"tls_client\":{},\"cycles_cap\":{},",
        cfg.tls.is_some(),
        cfg.tls
            .as_ref()
            .and_then(|t| t.client.as_deref())
            .map_or("null".to_string(), json_str),
        cfg.cycles.map_or("null".to_string(), |n| n.to_string()),
    );
    let _ = write!(
        o,
        "\"ops_per_sec\":{:.1},\"cycles\":{},\"cycles_all\":{},\"grants\":{},\"busy\":{},\"retries\":{},\"connects\":{},\"errors\":{},\"error_detail\":{{\"server\":{},\"connect\":{},\"tls\":{},\"io\":{},\"protocol\":{},\"not_held\":{},\"incomplete\":{}}},\"first_error\":{},\"fairness\":{{\"min\":{fmin},\"max\":{fmax},\"jain\":{jain:.4}}},\"drain_s\":{:.3},\"run_start_mono_ns\":{},\"run_end_mono_ns\":{},\"loadgen_cpu_s\":{{\"user\":{:.3},\"sys\":{:.3}}},",
        ops_per_sec(st),
        st.cycles,
        st.cycles_all,
        st.grants,
        st.busy,
        st.retries,
        st.connects,
        e.total(),
        e.server,
        e.connect,
        e.tls,
        e.io,
        e.protocol,
        e.not_held,
        e.incomplete,
        st.first_error.as_deref().map_or("null".to_string(), json_str),
        st.drain_used_ns as f64 / 1e9,
        st.started_ns,
        st.ended_ns,
        st.cpu_user_s,
        st.cpu_sys_s,
    );
    json_hist(&mut o, "latency_us", &st.lock);
    o.push(',');
    json_hist(&mut o, "latency_uncorrected_us", &st.lock_uncorrected);
    o.push(',');
    json_hist(&mut o, "unlock_us", &st.unlock);
    o.push(',');
    json_hist(&mut o, "cycle_us", &st.cycle);
    o.push(',');
    json_hist(&mut o, "queue_wait_us", &st.queue_wait);
    o.push(',');
    json_hist(&mut o, "handoff_us", &st.handoff);
    o.push(',');
    json_hist(&mut o, "handshake_us", &st.handshake);
    json_mixed(&mut o, cfg, st);
    o.push_str(",\"curve_us\":[");
    for (i, pct) in CURVE.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(o, "[{pct},{:.3}]", us(&st.lock, *pct));
    }
    o.push_str("]}");
    o
}

/// `--writers`' fields (after a comma): `writers` (0 without the option),
/// and with it `readers_latency_us` / `writers_latency_us` (the lock
/// latency of each side) and `fifo` (`crate::fifo`'s figures; `null`
/// without the option).
fn json_mixed(o: &mut String, cfg: &Config, st: &Stats) {
    let _ = write!(o, ",\"writers\":{}", cfg.writers);
    let Some(f) = st.fifo.as_ref().filter(|_| cfg.writers > 0) else {
        o.push_str(",\"fifo\":null");
        return;
    };
    o.push(',');
    json_hist(o, "readers_latency_us", &st.lock_readers);
    o.push(',');
    json_hist(o, "writers_latency_us", &st.lock_writers);
    let _ = write!(
        o,
        ",\"fifo\":{{\"guard_us\":{:.3},\"writer_acquires\":{},\"analysed\":{},",
        f.guard_ns as f64 / 1e3,
        f.writer_acquires,
        f.analysed,
    );
    json_hist(o, "excess_us", &f.excess);
    let _ = write!(
        o,
        ",\"overtakes\":{},\"writers_overtaken\":{},\"writers_overtaken_share\":{:.6},\"max_overtaken_by\":{}}}",
        f.overtakes,
        f.writers_overtaken,
        f.overtaken_share(),
        f.max_overtaken_by,
    );
}

/// `--writers`' part of the text report.
fn text_mixed(o: &mut String, cfg: &Config, st: &Stats) {
    let Some(f) = st.fifo.as_ref().filter(|_| cfg.writers > 0) else {
        return;
    };
    let _ = writeln!(
        o,
        "mixed: {} writer(s) exclusive, {} reader(s) {}",
        cfg.writers,
        cfg.connections - cfg.writers,
        crate::config::access_name(cfg.access),
    );
    let _ = writeln!(
        o,
        "{:<24}{:>10}{:>10}{:>10}{:>10}",
        "lock wait (us)", "count", "p50", "p99", "max"
    );
    for (name, h) in [
        ("readers", &st.lock_readers),
        ("writers", &st.lock_writers),
        ("writers' excess", &f.excess),
    ] {
        let _ = writeln!(
            o,
            "{name:<24}{:>10}{:>10.1}{:>10.1}{:>10.1}",
            h.len(),
            us(h, 50.0),
            us(h, 99.0),
            us(h, 100.0)
        );
    }
    let _ = writeln!(
        o,
        "FIFO (guard {:.0}us): writer acquires {}, analysed {}; overtaken by later readers: \
         {} grant(s) in all, {} writer acquire(s) ({:.2}%), at most {} at once",
        f.guard_ns as f64 / 1e3,
        f.writer_acquires,
        f.analysed,
        f.overtakes,
        f.writers_overtaken,
        f.overtaken_share() * 100.0,
        f.max_overtaken_by,
    );
}

pub fn to_text(cfg: &Config, st: &Stats) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "target {}://{}:{}{}  {}  connections={}{} {} mix={} keys={} dist={}{} hold={}us",
        cfg.target.scheme(),
        cfg.target.host,
        cfg.target.port,
        match &cfg.tls {
            None => String::new(),
            Some(t) => match &t.client {
                None => " (TLS)".to_string(),
                Some(name) => format!(" (TLS, client {name})"),
            },
        },
        if cfg.rate_per_s > 0.0 {
            format!("open-loop rate={}/s", cfg.rate_per_s)
        } else {
            "closed-loop".into()
        },
        cfg.connections,
        if cfg.threads > 1 {
            format!(" threads={}", cfg.threads)
        } else {
            String::new()
        },
        cfg.conn_mode.name(),
        if cfg.mix == Mix::LockUnlock {
            "lock-unlock"
        } else {
            "try-lock"
        },
        cfg.keys,
        cfg.dist.describe(),
        match (cfg.access, cfg.writers) {
            (crate::config::Access::Exclusive, _) => String::new(),
            (a, 0) => format!(" access={}", crate::config::access_name(a)),
            (a, w) => format!(" access={} writers={w}", crate::config::access_name(a)),
        },
        cfg.hold_ns as f64 / 1e3,
    );
    let _ = writeln!(
        o,
        "cycles {} in {:.2}s = {:.1}/s   grants {}  busy {}  retries {}  connects {}",
        st.cycles,
        st.measured_ns as f64 / 1e9,
        ops_per_sec(st),
        st.grants,
        st.busy,
        st.retries,
        st.connects
    );
    let _ = writeln!(
        o,
        "{:<24}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
        "latency (us)", "count", "p50", "p90", "p99", "p99.9", "p99.99", "max"
    );
    for (name, h) in [
        ("lock (corrected)", &st.lock),
        ("lock (uncorrected)", &st.lock_uncorrected),
        ("unlock", &st.unlock),
        ("cycle", &st.cycle),
        ("queue wait (contended)", &st.queue_wait),
        ("hand-off", &st.handoff),
        (handshake_label(cfg), &st.handshake),
    ] {
        let _ = write!(o, "{name:<24}{:>10}", h.len());
        for (_, pct) in PERCENTILES {
            let _ = write!(o, "{:>10.1}", us(h, pct));
        }
        o.push('\n');
    }
    text_mixed(&mut o, cfg, st);
    let (fmin, fmax, jain) = fairness(&st.grants_per_client);
    let e = &st.errors;
    let _ = writeln!(
        o,
        "fairness: grants per client min={fmin} max={fmax} jain={jain:.3}"
    );
    let _ = writeln!(
        o,
        "errors {} (server {}, connect {}, tls {}, io {}, protocol {}, not-held {}, incomplete {})",
        e.total(),
        e.server,
        e.connect,
        e.tls,
        e.io,
        e.protocol,
        e.not_held,
        e.incomplete
    );
    if let Some(f) = &st.first_error {
        let _ = writeln!(o, "first error: {f}");
    }
    let _ = writeln!(
        o,
        "load generator CPU: user {:.2}s, system {:.2}s",
        st.cpu_user_s, st.cpu_sys_s
    );
    o
}

/// `--latency-log`: one line `START_NS LATENCY_NS` per recorded lock
/// latency, in order of intended start (CLOCK_MONOTONIC ns).
pub fn to_latency_log(st: &Stats) -> String {
    let mut samples = st.samples.clone();
    samples.sort_unstable();
    let mut o = String::with_capacity(samples.len() * 24);
    for (start, latency) in samples {
        let _ = writeln!(o, "{start} {latency}");
    }
    o
}

/// HdrHistogram's classic percentile-distribution text (values in µs).
pub fn to_hgrm(h: &Histogram<u64>) -> String {
    let mut o = String::from("       Value     Percentile TotalCount 1/(1-Percentile)\n\n");
    if h.is_empty() {
        return o;
    }
    for v in h.iter_quantiles(5) {
        let q = v.quantile_iterated_to();
        let inv = if q < 1.0 {
            format!("{:.2}", 1.0 / (1.0 - q))
        } else {
            "inf".into()
        };
        let _ = writeln!(
            o,
            "{:12.3} {:14.12} {:10} {:>14}",
            v.value_iterated_to() as f64 / 1e3,
            q,
            v.count_since_last_iteration(),
            inv
        );
    }
    let _ = writeln!(
        o,
        "#[Mean    = {:12.3}, StdDeviation   = {:12.3}]\n#[Max     = {:12.3}, Total count    = {:12}]",
        h.mean() / 1e3,
        h.stdev() / 1e3,
        h.max() as f64 / 1e3,
        h.len()
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fairness_index() {
        assert_eq!(fairness(&[5, 5, 5, 5]), (5, 5, 1.0));
        let (min, max, jain) = fairness(&[10, 0, 0, 0]);
        assert_eq!((min, max), (0, 10));
        assert!((jain - 0.25).abs() < 1e-9);
    }

    #[test]
    fn json_escapes() {
        assert_eq!(json_str("a\"b\\\n"), "\"a\\\"b\\\\\\u000a\"");
    }

    #[test]
    fn hgrm_has_header_and_footer() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 3).unwrap();
        for v in 1..1000u64 {
            h.record(v * 1000).unwrap();
        }
        let s = to_hgrm(&h);
        assert!(s.starts_with("       Value"));
        assert!(s.contains("#[Max"));
    }
}
