//! `bench-report RAW_DIR OUT_DIR`: turns what `scripts/bench.sh` measured
//! (`RAW_DIR/env.txt`, `scenarios.txt`, `<scenario>/<system>.json|.na`)
//! into `OUT_DIR/latest.md` (links relative to OUT_DIR),
//! `OUT_DIR/results-section.md` (the same, links relative to the repository
//! root — OUT_DIR as seen from the root is the optional third argument,
//! default `bench/results` — ready to paste into RESULTS.md) and one `OUT_DIR/<scenario>.svg`
//! percentile plot per scenario. It computes ratios and prints numbers; it
//! never makes any up: a system that was not run says why.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use ringlock_bench::json::{self, Value};
use ringlock_bench::svg::{percentile_plot, Series};

struct Scenario {
    id: String,
    title: String,
    args: String,
}

/// The round reported (median p99 of all rounds) and what the others did.
struct Run {
    bg_cpu: String,
    rounds: usize,
    p99_range: (f64, f64),
}

enum Outcome {
    Ran(Box<Value>, Run),
    NotRun(String),
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

fn fmt_us(v: Option<f64>) -> String {
    match v {
        None => "–".into(),
        Some(v) if v >= 100_000.0 => format!("{:.0} ms", v / 1000.0),
        Some(v) if v >= 10_000.0 => format!("{:.1} ms", v / 1000.0),
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.1}"),
    }
}

/// Like [`fmt_us`], with the unit spelled out (for prose).
fn fmt_unit(v: f64) -> String {
    let s = fmt_us(Some(v));
    if s.ends_with("ms") {
        s
    } else {
        format!("{s} µs")
    }
}

/// A range of p99s. Bare numbers are µs in the tables, so a range whose
/// ends differ in unit spells both out (`113 µs–812 ms`, never `113–812 ms`).
fn fmt_range(lo: f64, hi: f64) -> String {
    let (a, b) = (fmt_us(Some(lo)), fmt_us(Some(hi)));
    match (a.ends_with("ms"), b.ends_with("ms")) {
        (false, false) | (true, true) => format!("{a}–{b}"),
        _ => format!("{}–{}", fmt_unit(lo), fmt_unit(hi)),
    }
}

/// Whether two p99 ranges over rounds overlap: then the rounds cannot tell
/// the two systems apart.
fn overlap(a: (f64, f64), b: (f64, f64)) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 2 && args.len() != 3 {
        eprintln!("usage: bench-report RAW_DIR OUT_DIR [OUT_DIR_FROM_REPO_ROOT]");
        std::process::exit(2);
    }
    let raw = PathBuf::from(&args[0]);
    let out = PathBuf::from(&args[1]);
    let mut root_prefix = args
        .get(2)
        .cloned()
        .unwrap_or_else(|| "bench/results".into());
    if !root_prefix.is_empty() && !root_prefix.ends_with('/') {
        root_prefix.push('/');
    }
    if let Err(e) = run(&raw, &out, &root_prefix) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(raw: &Path, out: &Path, root_prefix: &str) -> Result<(), String> {
    let env_text = read(&raw.join("env.txt")).ok_or("missing env.txt")?;
    let mut env = BTreeMap::new();
    let mut systems: Vec<String> = Vec::new();
    for line in env_text.lines() {
        if let Some((k, v)) = line.split_once('=') {
            if let Some(rest) = k.strip_prefix("system.") {
                if let Some(name) = rest.strip_suffix(".version") {
                    systems.push(name.to_string());
                }
            }
            env.insert(k.to_string(), v.to_string());
        }
    }
    let scenarios: Vec<Scenario> = read(&raw.join("scenarios.txt"))
        .ok_or("missing scenarios.txt")?
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, '|');
            Some(Scenario {
                id: parts.next()?.to_string(),
                title: parts.next()?.to_string(),
                args: parts.next()?.to_string(),
            })
        })
        .filter(|s| raw.join(&s.id).is_dir())
        .collect();

    let mut results: BTreeMap<(String, String), Outcome> = BTreeMap::new();
    for sc in &scenarios {
        for sys in &systems {
            let base = raw.join(&sc.id).join(sys);
            let mut rounds: Vec<(Value, String)> = Vec::new();
            for k in 1..=1000 {
                let dir = raw.join(&sc.id);
                let Some(text) = read(&dir.join(format!("{sys}.r{k}.json"))) else {
                    break;
                };
                if let Ok(v) = json::parse(text.trim()) {
                    let bg = read(&dir.join(format!("{sys}.r{k}.noise"))).map_or("?".into(), |n| {
                        let field = |k: &str| {
                            n.split_whitespace()
                                .find_map(|w| w.strip_prefix(k))
                                .unwrap_or("?")
                                .to_string()
                        };
                        format!("{} / {}", field("foreign="), field("steal="))
                    });
                    rounds.push((v, bg));
                }
            }
            let outcome = if !rounds.is_empty() {
                let p99 = |v: &Value| v.num("latency_us.p99").unwrap_or(f64::INFINITY);
                rounds.sort_by(|a, b| p99(&a.0).total_cmp(&p99(&b.0)));
                let n = rounds.len();
                let range = (p99(&rounds[0].0), p99(&rounds[n - 1].0));
                let (v, bg) = rounds.swap_remove((n - 1) / 2);
                Outcome::Ran(
                    Box::new(v),
                    Run {
                        bg_cpu: bg,
                        rounds: n,
                        p99_range: range,
                    },
                )
            } else if let Some(reason) = read(&base.with_extension("na")) {
                Outcome::NotRun(reason.trim().to_string())
            } else {
                continue;
            };
            results.insert((sc.id.clone(), sys.clone()), outcome);
        }
    }

    for sc in &scenarios {
        let series: Vec<Series> = systems
            .iter()
            .filter_map(|sys| match results.get(&(sc.id.clone(), sys.clone())) {
                Some(Outcome::Ran(v, run)) => Some(Series {
                    name: sys.clone(),
                    points: curve(v),
                    saturated: saturated(v),
                    p99_range: (run.rounds > 1).then_some(run.p99_range),
                }),
                _ => None,
            })
            .collect();
        if !series.is_empty() {
            let svg = percentile_plot(&format!("{} — lock latency (corrected)", sc.id), &series);
            std::fs::write(out.join(format!("{}.svg", sc.id)), svg).map_err(|e| e.to_string())?;
        }
    }

    for (file, prefix) in [("latest.md", ""), ("results-section.md", root_prefix)] {
        let md = markdown(&env, &systems, &scenarios, &results, prefix);
        std::fs::write(out.join(file), md).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn curve(v: &Value) -> Vec<(f64, f64)> {
    match v.get("curve_us") {
        Some(Value::Arr(points)) => points
            .iter()
            .filter_map(|p| match p {
                Value::Arr(xy) if xy.len() == 2 => match (&xy[0], &xy[1]) {
                    (Value::Num(x), Value::Num(y)) => Some((*x, *y)),
                    _ => None,
                },
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn markdown(
    env: &BTreeMap<String, String>,
    systems: &[String],
    scenarios: &[Scenario],
    results: &BTreeMap<(String, String), Outcome>,
    prefix: &str,
) -> String {
    let e = |k: &str| env.get(k).cloned().unwrap_or_else(|| "?".into());
    let mut o = String::new();
    let _ = writeln!(o, "## Side-by-side benchmark\n");
    let _ = writeln!(
        o,
        "Generated by `scripts/bench.sh` ({}) on {}.\n",
        e("mode"),
        e("date")
    );
    let _ = writeln!(o, "| | |\n|---|---|");
    for (label, key) in [
        ("commit", "commit"),
        ("kernel", "kernel"),
        ("CPU", "cpu"),
        ("pinning", "pinning"),
        ("ringlockd binary", "ringlockd_binary"),
        ("disk", "disk"),
        ("fdatasync (4 KiB append)", "fsync"),
    ] {
        let _ = writeln!(o, "| {label} | {} |", e(key));
    }
    let _ = writeln!(
        o,
        "\n| system | version | durability / notes |\n|---|---|---|"
    );
    for s in systems {
        let _ = writeln!(
            o,
            "| {s} | {} | {} |",
            e(&format!("system.{s}.version")),
            e(&format!("system.{s}.note"))
        );
    }
    let _ = writeln!(
        o,
        "\nMethod: `ringlock-loadgen`, one epoll thread. Open-loop scenarios send at a fixed \
         rate per connection; *latency* is lock acquisition (grant − **intended** start of the \
         cycle, so a stall cannot hide: coordinated-omission corrected); *uncorrected* starts \
         the clock when the attempt actually began. A cycle is lock → unlock (hold 0). Redis \
         has no blocking lock: a Lock is `SET NX PX` retried every 50–150 µs (retries counted), \
         release is a compare-and-delete script. PostgreSQL uses `pg_advisory_lock`, MariaDB \
         `GET_LOCK`, etcd its v3 lock API through the HTTP/JSON gateway. `p99/floor` divides by \
         the floor server's p99 in the same scenario. *saturated* = achieved rate < 95 % of \
         the target (achieved = completed cycles / (duration + drain)). *foreign / steal CPU %* = share \
         of the machine's CPU time during the run used by anything other than the server under \
         test and the load generator, and the share the hypervisor stole: the vCPUs are shared, \
         and such work lands on the pinned CPUs too. With several rounds, each row is the round with the \
         median p99, and the p99 cell shows the range over all rounds.\n"
    );

    // Summary: p99 per scenario and system.
    let _ = write!(
        o,
        "### p99 lock latency (µs), all scenarios\n\n| scenario |"
    );
    for s in systems {
        let _ = write!(o, " {s} |");
    }
    o.push_str("\n|---|");
    for _ in systems {
        o.push_str("---:|");
    }
    o.push('\n');
    for sc in scenarios {
        let _ = write!(o, "| {} |", sc.id);
        for s in systems {
            let cell = match results.get(&(sc.id.clone(), s.clone())) {
                Some(Outcome::Ran(v, _)) => {
                    let mut c = fmt_us(v.num("latency_us.p99"));
                    if saturated(v) {
                        c.push_str(" (sat.)");
                    }
                    if v.num("errors").unwrap_or(0.0) > 0.0 {
                        c.push_str(" (err)");
                    }
                    c
                }
                Some(Outcome::NotRun(_)) => "n/a".into(),
                None => "".into(),
            };
            let _ = write!(o, " {cell} |");
        }
        o.push('\n');
    }
    o.push('\n');

    for sc in scenarios {
        let _ = writeln!(o, "### {}: {}\n", sc.id, sc.title);
        let _ = writeln!(o, "Load generator arguments: `{}`\n", sc.args.trim());
        let floor_p99 = match results.get(&(sc.id.clone(), "floor".into())) {
            Some(Outcome::Ran(v, _)) => v.num("latency_us.p99"),
            _ => None,
        };
        let _ = writeln!(
            o,
            "| system | ops/s (target) | p50 | p90 | p99 | p99.9 | p99.99 | max | p99 uncorr. | p99/floor | hand-off p99 | queue wait p99 | grants/client min–max | retries | errors | foreign / steal CPU % |"
        );
        let _ = writeln!(
            o,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        let mut not_run = Vec::new();
        for s in systems {
            match results.get(&(sc.id.clone(), s.clone())) {
                Some(Outcome::Ran(v, run)) => {
                    let target = v.num("rate_target").unwrap_or(0.0);
                    let ops = v.num("ops_per_sec").unwrap_or(0.0);
                    let rate = if target > 0.0 {
                        format!(
                            "{ops:.0} ({target:.0}){}",
                            if saturated(v) { " saturated" } else { "" }
                        )
                    } else {
                        format!("{ops:.0} (closed)")
                    };
                    let p99 = v.num("latency_us.p99");
                    let ratio = match (p99, floor_p99) {
                        (Some(a), Some(f)) if f > 0.0 => format!("{:.2}×", a / f),
                        _ => "–".into(),
                    };
                    let hq = |k: &str| {
                        if v.num(&format!("{k}.count")).unwrap_or(0.0) > 0.0 {
                            fmt_us(v.num(&format!("{k}.p99")))
                        } else {
                            "–".into()
                        }
                    };
                    let errors = v.num("errors").unwrap_or(0.0);
                    let err_cell = if errors > 0.0 {
                        format!(
                            "{errors:.0} ({})",
                            v.str("first_error").unwrap_or("").replace('|', "/")
                        )
                    } else {
                        "0".into()
                    };
                    let _ = writeln!(
                        o,
                        "| {s} | {rate} | {} | {} | **{}**{} | {} | {} | {} | {} | {ratio} | {} | {} | {:.0}–{:.0} | {:.0} | {err_cell} | {} |",
                        fmt_us(v.num("latency_us.p50")),
                        fmt_us(v.num("latency_us.p90")),
                        fmt_us(p99),
                        if run.rounds > 1 {
                            format!(" ({}, {} rounds)", fmt_range(run.p99_range.0, run.p99_range.1), run.rounds)
                        } else {
                            String::new()
                        },
                        fmt_us(v.num("latency_us.p999")),
                        fmt_us(v.num("latency_us.p9999")),
                        fmt_us(v.num("latency_us.max")),
                        fmt_us(v.num("latency_uncorrected_us.p99")),
                        hq("handoff_us"),
                        hq("queue_wait_us"),
                        v.num("fairness.min").unwrap_or(0.0),
                        v.num("fairness.max").unwrap_or(0.0),
                        v.num("retries").unwrap_or(0.0),
                        run.bg_cpu,
                    );
                }
                Some(Outcome::NotRun(reason)) => not_run.push(format!("{s}: {reason}")),
                None => {}
            }
        }
        if !not_run.is_empty() {
            let _ = writeln!(o, "\nNot run: {}.", not_run.join("; "));
        }
        if results.keys().any(|(id, _)| id == &sc.id)
            && results
                .iter()
                .any(|((id, _), r)| id == &sc.id && matches!(r, Outcome::Ran(..)))
        {
            let _ = writeln!(o, "\n![{} percentiles]({prefix}{}.svg)\n", sc.id, sc.id);
        }
        let _ = writeln!(o, "{}", verdict(sc, systems, results, floor_p99));
    }
    let _ = writeln!(
        o,
        "Raw data: `{prefix}raw/<scenario>/<system>.{{json,hgrm,cmd,err}}`; \
         each `.cmd` is the exact load generator command line."
    );
    o
}

fn saturated(v: &Value) -> bool {
    let target = v.num("rate_target").unwrap_or(0.0);
    target > 0.0 && v.num("ops_per_sec").unwrap_or(0.0) < 0.95 * target
}

/// Plain facts about the goal (ringlockd's p99 below every peer's, within
/// 1.25× of the floor), computed, not judged. Where the p99 ranges over the
/// rounds overlap, the systems are "indistinguishable": no claim either way.
fn verdict(
    sc: &Scenario,
    systems: &[String],
    results: &BTreeMap<(String, String), Outcome>,
    floor_p99: Option<f64>,
) -> String {
    let p99 = |s: &str| match results.get(&(sc.id.clone(), s.to_string())) {
        Some(Outcome::Ran(v, run)) => v.num("latency_us.p99").map(|p| (p, run.p99_range)),
        _ => None,
    };
    let ours = if sc.id.starts_with("durable") {
        "ringlockd-durable"
    } else {
        "ringlockd"
    };
    let Some((mine, mine_range)) = p99(ours) else {
        return format!("{ours} was not measured in this scenario.\n");
    };
    let peers: Vec<(String, f64, (f64, f64))> = systems
        .iter()
        .filter(|s| !s.starts_with("ringlockd") && s.as_str() != "floor")
        .filter_map(|s| p99(s).map(|(p, r)| (s.clone(), p, r)))
        .collect();
    let mut out = String::new();
    if let Some((best, bp, _)) = peers.iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
        let tied: Vec<&str> = peers
            .iter()
            .filter(|(_, _, r)| overlap(mine_range, *r))
            .map(|(name, _, _)| name.as_str())
            .collect();
        let claim = if !tied.is_empty() {
            format!(
                "indistinguishable from {}: the p99 ranges over the rounds overlap",
                tied.join(", ")
            )
        } else if mine < *bp {
            "lower than every peer".to_string()
        } else {
            "NOT lower than every peer".to_string()
        };
        let _ = write!(
            out,
            "{ours} p99 {} vs best peer {best} {} ({:.2}×; {claim}). ",
            fmt_unit(mine),
            fmt_unit(*bp),
            mine / bp,
        );
    }
    if let Some(f) = floor_p99 {
        let floor_range = p99("floor").map_or((f, f), |(_, r)| r);
        let ratio = mine / f;
        let durable = if sc.id.starts_with("durable") {
            "; the floor does not fsync"
        } else {
            ""
        };
        let claim = if overlap(mine_range, floor_range) || ratio < 1.0 {
            format!(
                "indistinguishable from the floor{}",
                if ratio < 1.0 {
                    ": below 1, which only noise can produce"
                } else {
                    ": the p99 ranges over the rounds overlap"
                }
            )
        } else if ratio <= 1.25 {
            format!("within the 1.25× goal{durable}")
        } else {
            format!("outside the 1.25× goal{durable}")
        };
        let _ = write!(
            out,
            "Floor p99 {}, ratio {ratio:.2}× ({claim}).",
            fmt_unit(f)
        );
        if mine < f {
            out.push_str(
                " The floor measured slower than ringlockd, so this scenario's tail is machine \
                 noise rather than either server (see foreign / steal CPU %).",
            );
        }
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_keep_their_units() {
        assert_eq!(fmt_range(262.0, 1282.0), "262–1282");
        assert_eq!(fmt_range(113.0, 812_000.0), "113 µs–812 ms");
        assert_eq!(fmt_range(2_804_000.0, 4_748_000.0), "2804 ms–4748 ms");
        assert_eq!(fmt_range(400.0, 17_100.0), "400 µs–17.1 ms");
    }

    #[test]
    fn overlapping_ranges() {
        assert!(overlap((262.0, 1282.0), (309.0, 2513.0)));
        assert!(overlap((1.0, 2.0), (2.0, 3.0)));
        assert!(!overlap((1.0, 2.0), (2.5, 3.0)));
    }
}
