//! `bench-report RAW_DIR OUT_DIR`: turns what `scripts/bench.sh` measured
//! (`RAW_DIR/env.txt`, `scenarios.txt`, `<scenario>/<system>.json|.na`)
//! (`<scenario>/<system>.r<round>.{json,noise,cpu}`)
//! into `OUT_DIR/latest.md` (links relative to OUT_DIR),
//! `OUT_DIR/results-section.md` (the same, links relative to the repository
//! root — OUT_DIR as seen from the root is the optional third argument,
//! default `bench/results` — ready to paste into RESULTS.md) and one `OUT_DIR/<scenario>.svg`
//! percentile plot per scenario. It computes ratios and prints numbers; it
//! never makes any up: a system that was not run says why.
//!
//! Wording rule: where the p99 (or throughput) ranges over the rounds of two
//! systems overlap, the comparison says "indistinguishable" — never that a
//! goal was met or that one was faster.

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
    ops_range: (f64, f64),
    /// The server's CPU time per completed cycle in the reported round, µs.
    cpu_us_per_op: Option<f64>,
}

/// One round's result as read from the raw files.
struct Round {
    v: Value,
    bg: String,
    cpu_us_per_op: Option<f64>,
}

/// Whether two [min, max] ranges share a point.
fn overlap(a: (f64, f64), b: (f64, f64)) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

fn fmt_range(r: (f64, f64)) -> String {
    if r.0 == r.1 {
        fmt_unit(r.0)
    } else {
        format!("{}–{}", fmt_us(Some(r.0)), fmt_unit(r.1))
    }
}

/// `key=value` fields of a one-line raw file (`.noise`, `.cpu`).
fn kv(text: &str, key: &str) -> Option<String> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_string)
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
            let mut rounds: Vec<Round> = Vec::new();
            for k in 1..=1000 {
                let dir = raw.join(&sc.id);
                let Some(text) = read(&dir.join(format!("{sys}.r{k}.json"))) else {
                    break;
                };
                if let Ok(v) = json::parse(text.trim()) {
                    let bg = read(&dir.join(format!("{sys}.r{k}.noise"))).map_or("?".into(), |n| {
                        let field = |k: &str| kv(&n, k).unwrap_or_else(|| "?".into());
                        format!("{} / {}", field("foreign"), field("steal"))
                    });
                    let cpu_us_per_op = read(&dir.join(format!("{sys}.r{k}.cpu")))
                        .and_then(|c| kv(&c, "us_per_op")?.parse().ok());
                    rounds.push(Round {
                        v,
                        bg,
                        cpu_us_per_op,
                    });
                }
            }
            let outcome = if !rounds.is_empty() {
                let p99 = |v: &Value| v.num("latency_us.p99").unwrap_or(f64::INFINITY);
                let ops = |v: &Value| v.num("ops_per_sec").unwrap_or(0.0);
                let ops_range = rounds.iter().fold((f64::INFINITY, 0.0f64), |r, x| {
                    (r.0.min(ops(&x.v)), r.1.max(ops(&x.v)))
                });
                rounds.sort_by(|a, b| p99(&a.v).total_cmp(&p99(&b.v)));
                let n = rounds.len();
                let range = (p99(&rounds[0].v), p99(&rounds[n - 1].v));
                let r = rounds.swap_remove((n - 1) / 2);
                Outcome::Ran(
                    Box::new(r.v),
                    Run {
                        bg_cpu: r.bg,
                        rounds: n,
                        p99_range: range,
                        ops_range,
                        cpu_us_per_op: r.cpu_us_per_op,
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
        "\nMethod: `ringlock-loadgen` (one epoll thread unless the pinning line says \
         `--threads`). Open-loop scenarios send at a fixed \
         rate per connection; *latency* is lock acquisition (grant − **intended** start of the \
         cycle, so a stall cannot hide: coordinated-omission corrected); *uncorrected* starts \
         the clock when the attempt actually began. A cycle is lock → unlock (hold 0): the \
         *lock* columns are the lock's latency, the *cycle* columns the whole lock + unlock \
         (intended start → unlock answered). Redis \
         has no blocking lock: a Lock is `SET NX PX` retried every 50–150 µs (retries counted), \
         release is a compare-and-delete script. `ringlockd-session` is the same server as \
         `ringlockd`, driven over its session protocol (Hello, Acquire with hold = session, \
         Release naming the token). PostgreSQL uses `pg_advisory_lock`, MariaDB \
         `GET_LOCK`, `etcd` its v3 lock API through the gRPC-JSON gateway (HTTP/1.1, \
         `ringlock-loadgen`), `etcd-native` the same server through etcd's own Go client \
         (`bench/peers/etcd-native`: clientv3 `concurrency.Mutex` over native gRPC, one \
         shared connection, a session per client, the same command line and JSON). `p99/floor` divides by \
         the floor server's p99 in the same scenario. *saturated* = achieved rate < 95 % of \
         the target (achieved = completed cycles / (duration + drain)). *foreign / steal CPU %* = share \
         of the machine's CPU time during the run used by anything other than the server under \
         test and the load generator, and the share the hypervisor stole: the vCPUs are shared, \
         and such work lands on the pinned CPUs too. With several rounds, each row is the round with the \
         median p99, and the p99 cell shows the range over all rounds. *Server CPU µs/op* = \
         the server process's utime + stime (its threads and reaped children, from \
         `/proc/PID/stat`, clock ticks of 1/{} s) over the whole load generator run, divided by \
         every cycle completed in it (warm-up and drain included); an op is one lock + unlock \
         cycle, as in ops/s. Where the p99 ranges over the rounds of two systems overlap, \
         they are called *indistinguishable*: the difference is inside the run-to-run noise.\n",
        e("clk_tck")
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
                    let mut c = if measured(v) {
                        fmt_us(v.num("latency_us.p99"))
                    } else {
                        "no cycle measured".into()
                    };
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

    let _ = write!(
        o,
        "### Server CPU per op (µs CPU per lock+unlock cycle), all scenarios\n\n| scenario |"
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
                Some(Outcome::Ran(_, run)) => fmt_cpu(run.cpu_us_per_op),
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
            "| system | ops/s (target) | server CPU µs/op | lock p50 | lock p90 | lock p99 | lock p99.9 | lock p99.99 | lock max | lock p99 uncorr. | lock p99/floor | cycle p50 | cycle p99 | hand-off p99 | queue wait p99 | grants/client min–max | retries | errors | foreign / steal CPU % |"
        );
        let _ = writeln!(
            o,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
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
                    // A run without one measured cycle (an open loop so far
                    // behind that only warm-up cycles completed) has no
                    // latency to show: its cells say "–", not 0.
                    let lat = |p: &str| {
                        if measured(v) {
                            v.num(&format!("latency_us.{p}"))
                        } else {
                            None
                        }
                    };
                    let p99 = lat("p99");
                    let ratio = match (p99, floor_p99) {
                        (Some(a), Some(f)) if f > 0.0 => format!("{:.2}×", a / f),
                        _ => "–".into(),
                    };
                    // A histogram's percentile, "–" when it has no samples.
                    let hp = |k: &str, p: &str| {
                        if v.num(&format!("{k}.count")).unwrap_or(0.0) > 0.0 {
                            fmt_us(v.num(&format!("{k}.{p}")))
                        } else {
                            "–".into()
                        }
                    };
                    let hq = |k: &str| hp(k, "p99");
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
                        "| {s} | {rate} | {} | {} | {} | **{}**{} | {} | {} | {} | {} | {ratio} | {} | {} | {} | {} | {:.0}–{:.0} | {:.0} | {err_cell} | {} |",
                        fmt_cpu(run.cpu_us_per_op),
                        fmt_us(lat("p50")),
                        fmt_us(lat("p90")),
                        fmt_us(p99),
                        if run.rounds > 1 {
                            format!(" ({}–{}, {} rounds)", fmt_us(Some(run.p99_range.0)), fmt_us(Some(run.p99_range.1)), run.rounds)
                        } else {
                            String::new()
                        },
                        fmt_us(lat("p999")),
                        fmt_us(lat("p9999")),
                        fmt_us(lat("max")),
                        hq("latency_uncorrected_us"),
                        hp("cycle_us", "p50"),
                        hq("cycle_us"),
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
        let _ = writeln!(o, "{}", verdict(sc, systems, results));
    }
    let _ = writeln!(
        o,
        "Raw data: `bench/results/raw/<scenario>/<system>.{{json,hgrm,cmd,err}}`; \
         each `.cmd` is the exact load generator command line."
    );
    o
}

/// Whether the run measured at least one lock (its latency figures mean
/// something): a `latency_us.count` of 0 says it did not.
fn measured(v: &Value) -> bool {
    v.num("latency_us.count").is_none_or(|n| n > 0.0)
}

fn saturated(v: &Value) -> bool {
    let target = v.num("rate_target").unwrap_or(0.0);
    target > 0.0 && v.num("ops_per_sec").unwrap_or(0.0) < 0.95 * target
}

fn fmt_cpu(v: Option<f64>) -> String {
    match v {
        None => "–".into(),
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.1}"),
    }
}

/// What a verdict needs of one system's result in one scenario.
struct Fig {
    name: String,
    p99: f64,
    p99_range: (f64, f64),
    ops: f64,
    ops_range: (f64, f64),
    closed: bool,
    cpu: Option<f64>,
    rounds: usize,
}

/// The end of a side-by-side verdict: `other` against `base` in
/// throughput (closed loop only) and server CPU per op, then a full stop.
fn throughput_and_cpu(out: &mut String, base: &Fig, other: &Fig) {
    if base.closed {
        let _ = write!(
            out,
            "; throughput {:.0} vs {:.0} cycles/s ({:.2}×{})",
            other.ops,
            base.ops,
            other.ops / base.ops.max(1e-9),
            if overlap(base.ops_range, other.ops_range) {
                ", ranges overlap: indistinguishable"
            } else {
                ""
            }
        );
    }
    if let (Some(c1), Some(c2)) = (base.cpu, other.cpu) {
        let _ = write!(
            out,
            "; server CPU {} vs {} µs/op ({:.2}×)",
            fmt_cpu(Some(c2)),
            fmt_cpu(Some(c1)),
            c2 / c1
        );
    }
    out.push('.');
}

fn fig(sc: &Scenario, results: &BTreeMap<(String, String), Outcome>, system: &str) -> Option<Fig> {
    match results.get(&(sc.id.clone(), system.to_string())) {
        // A run with no measured cycle has no p99 to compare.
        Some(Outcome::Ran(v, run)) if measured(v) => Some(Fig {
            name: system.to_string(),
            p99: v.num("latency_us.p99")?,
            p99_range: run.p99_range,
            ops: v.num("ops_per_sec").unwrap_or(0.0),
            ops_range: run.ops_range,
            closed: v.num("rate_target").unwrap_or(0.0) <= 0.0,
            cpu: run.cpu_us_per_op,
            rounds: run.rounds,
        }),
        _ => None,
    }
}

/// "indistinguishable, p99 ranges overlap: …" naming every system
/// whose p99 range overlaps `mine`'s, or `None` when none does.
fn p99_overlaps(mine: &Fig, others: &[&Fig]) -> Option<String> {
    let hits: Vec<String> = others
        .iter()
        .filter(|f| overlap(mine.p99_range, f.p99_range))
        .map(|f| format!("{} {}", f.name, fmt_range(f.p99_range)))
        .collect();
    (!hits.is_empty()).then(|| {
        format!(
            "indistinguishable, p99 ranges overlap: {} {} vs {}",
            mine.name,
            fmt_range(mine.p99_range),
            hits.join(", ")
        )
    })
}

/// Plain facts about the goals, computed, not judged: ringlockd's p99
/// against every peer and the floor (goal: below every peer, within 1.25×
/// of the floor); in closed-loop scenarios its throughput against the best
/// peer's; with 2 shards against 1 (goal: p99 within 1.5×). Overlapping
/// ranges are reported as indistinguishable.
fn verdict(
    sc: &Scenario,
    systems: &[String],
    results: &BTreeMap<(String, String), Outcome>,
) -> String {
    let ours = if sc.id.starts_with("durable") {
        "ringlockd-durable"
    } else {
        "ringlockd"
    };
    let mut out = String::new();
    let floor = fig(sc, results, "floor");
    let peers: Vec<Fig> = systems
        .iter()
        .filter(|s| !s.starts_with("ringlockd") && s.as_str() != "floor")
        .filter_map(|s| fig(sc, results, s))
        .collect();
    match fig(sc, results, ours) {
        None => {
            let _ = write!(out, "{ours} was not measured in this scenario. ");
        }
        Some(mine) => {
            if let Some(best) = peers.iter().min_by(|a, b| a.p99.total_cmp(&b.p99)) {
                let all: Vec<&Fig> = peers.iter().collect();
                let judgement = match p99_overlaps(&mine, &all) {
                    Some(text) => text,
                    None if mine.p99 < best.p99 => "lower than every peer".into(),
                    None => "NOT lower than every peer".into(),
                };
                let _ = write!(
                    out,
                    "{ours} p99 {} vs best peer {} {} ({:.2}×: {judgement}). ",
                    fmt_unit(mine.p99),
                    best.name,
                    fmt_unit(best.p99),
                    mine.p99 / best.p99,
                );
            }
            if mine.closed {
                if let Some(best) = peers.iter().max_by(|a, b| a.ops.total_cmp(&b.ops)) {
                    let judgement = if overlap(mine.ops_range, best.ops_range) {
                        format!(
                            "indistinguishable, throughput ranges overlap: {:.0}–{:.0} vs {:.0}–{:.0}",
                            mine.ops_range.0, mine.ops_range.1, best.ops_range.0, best.ops_range.1
                        )
                    } else if mine.ops > best.ops {
                        "higher than every peer".into()
                    } else {
                        "NOT higher than every peer".into()
                    };
                    let _ = write!(
                        out,
                        "Throughput {:.0} vs best peer {} {:.0} cycles/s ({:.2}×: {judgement}). ",
                        mine.ops,
                        best.name,
                        best.ops,
                        mine.ops / best.ops.max(1e-9),
                    );
                }
            }
            if let Some(f) = &floor {
                let ratio = mine.p99 / f.p99;
                let judgement = match p99_overlaps(&mine, &[f]) {
                    Some(text) => text,
                    None if mine.p99 <= 1.25 * f.p99 => "within the 1.25× goal".into(),
                    None => "outside the 1.25× goal".into(),
                };
                let _ = write!(
                    out,
                    "Floor p99 {}, ratio {ratio:.2}× ({judgement}{}).",
                    fmt_unit(f.p99),
                    if sc.id.starts_with("durable") {
                        "; the floor does not fsync"
                    } else {
                        ""
                    }
                );
                if mine.p99 < f.p99 {
                    out.push_str(
                        " The floor measured slower than ringlockd, so this scenario's tail is machine \
                         noise rather than either server (see foreign / steal CPU %).",
                    );
                }
            }
        }
    }
    if let (Some(t1), Some(t2)) = (
        fig(sc, results, "ringlockd-t1"),
        fig(sc, results, "ringlockd-t2"),
    ) {
        let judgement = match p99_overlaps(&t2, &[&t1]) {
            Some(text) => text,
            None if t2.p99 <= 1.5 * t1.p99 => "within the 1.5× bound for 2 shards".into(),
            None => "outside the 1.5× bound for 2 shards".into(),
        };
        let _ = write!(
            out,
            " Shards: ringlockd-t2 p99 {} vs ringlockd-t1 {} ({:.2}×: {judgement})",
            fmt_unit(t2.p99),
            fmt_unit(t1.p99),
            t2.p99 / t1.p99,
        );
        throughput_and_cpu(&mut out, &t1, &t2);
    }
    if let (Some(lc), Some(se)) = (
        fig(sc, results, "ringlockd"),
        fig(sc, results, "ringlockd-session"),
    ) {
        out.push_str(&sessions_verdict(&lc, &se));
    }
    if let (Some(poll), Some(nopoll)) = (
        fig(sc, results, "ringlockd"),
        fig(sc, results, "ringlockd-nopoll"),
    ) {
        let judgement = match p99_overlaps(&poll, &[&nopoll]) {
            Some(text) => text,
            None if poll.p99 < nopoll.p99 => "lower with polling".into(),
            None => "higher with polling".into(),
        };
        let _ = write!(
            out,
            " Idle polling: ringlockd p99 {} vs ringlockd-nopoll {} ({:.2}×: {judgement})",
            fmt_unit(poll.p99),
            fmt_unit(nopoll.p99),
            poll.p99 / nopoll.p99,
        );
        throughput_and_cpu(&mut out, &nopoll, &poll);
    }
    let compared = [
        "floor",
        ours,
        "ringlockd-nopoll",
        "ringlockd-t1",
        "ringlockd-t2",
        "ringlockd-session",
    ]
    .into_iter()
    .filter_map(|s| fig(sc, results, s))
    .chain(peers);
    if compared.into_iter().any(|f| f.rounds < 2) {
        out.push_str(
            " (One round: a range of one value says nothing about the run-to-run noise; \
             rerun with --repeat 2 or more before concluding.)",
        );
    }
    out.push('\n');
    out
}

/// The session protocol against the Locking-Center protocol on the same
/// server, load and pinning (goal: session p99 within 1.1×).
fn sessions_verdict(lc: &Fig, se: &Fig) -> String {
    let mut out = String::new();
    let judgement = match p99_overlaps(se, &[lc]) {
        Some(text) => text,
        None if se.p99 <= 1.1 * lc.p99 => "within the 1.1× goal".into(),
        None => "outside the 1.1× goal".into(),
    };
    let _ = write!(
        out,
        " Sessions: ringlockd-session p99 {} vs ringlockd over the Locking-Center protocol {} \
         ({:.2}×: {judgement})",
        fmt_unit(se.p99),
        fmt_unit(lc.p99),
        se.p99 / lc.p99,
    );
    throughput_and_cpu(&mut out, lc, se);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ran(p99: f64, range: (f64, f64), ops: f64, rate: f64, cpu: Option<f64>) -> Outcome {
        let v = json::parse(&format!(
            r#"{{"rate_target":{rate},"ops_per_sec":{ops},"latency_us":{{"p99":{p99}}}}}"#
        ))
        .expect("valid JSON");
        Outcome::Ran(
            Box::new(v),
            Run {
                bg_cpu: "0 / 0".into(),
                rounds: 3,
                p99_range: range,
                ops_range: (ops, ops),
                cpu_us_per_op: cpu,
            },
        )
    }

    fn scenario(id: &str) -> Scenario {
        Scenario {
            id: id.into(),
            title: String::new(),
            args: String::new(),
        }
    }

    fn verdict_of(id: &str, rows: Vec<(&str, Outcome)>) -> String {
        let systems: Vec<String> = rows.iter().map(|(s, _)| s.to_string()).collect();
        let results = rows
            .into_iter()
            .map(|(s, o)| ((id.to_string(), s.to_string()), o))
            .collect();
        verdict(&scenario(id), &systems, &results)
    }

    #[test]
    fn a_run_without_measured_cycles_has_no_p99() {
        let v = json::parse(
            r#"{"rate_target":10000,"ops_per_sec":0,"latency_us":{"count":0,"p99":0.0}}"#,
        )
        .expect("valid JSON");
        assert!(!measured(&v));
        let sc = Scenario {
            id: "persistent-64".into(),
            title: String::new(),
            args: String::new(),
        };
        let mut results = BTreeMap::new();
        results.insert(
            (sc.id.clone(), "etcd".to_string()),
            Outcome::Ran(
                Box::new(v),
                Run {
                    bg_cpu: "0 / 0".into(),
                    rounds: 1,
                    p99_range: (0.0, 0.0),
                    ops_range: (0.0, 0.0),
                    cpu_us_per_op: None,
                },
            ),
        );
        assert!(fig(&sc, &results, "etcd").is_none(), "no p99 to compare");
    }

    #[test]
    fn overlapping_ranges_are_indistinguishable_never_met() {
        let v = verdict_of(
            "uncontended-1",
            vec![
                ("floor", ran(100.0, (90.0, 300.0), 1000.0, 1000.0, None)),
                (
                    "ringlockd",
                    ran(110.0, (95.0, 200.0), 1000.0, 1000.0, Some(20.0)),
                ),
                ("redis", ran(150.0, (140.0, 400.0), 1000.0, 1000.0, None)),
            ],
        );
        assert!(v.contains("indistinguishable"), "{v}");
        for claim in ["lower than every peer", "within the 1.25", "met", "faster"] {
            assert!(!v.contains(claim), "{claim:?} claimed despite overlap: {v}");
        }
    }

    #[test]
    fn separated_ranges_are_compared() {
        let v = verdict_of(
            "churn-8-max",
            vec![
                ("floor", ran(100.0, (95.0, 105.0), 12000.0, 0.0, None)),
                (
                    "ringlockd",
                    ran(110.0, (108.0, 112.0), 11000.0, 0.0, Some(20.0)),
                ),
                (
                    "locking-center",
                    ran(800.0, (760.0, 830.0), 9000.0, 0.0, Some(60.0)),
                ),
            ],
        );
        assert!(v.contains("lower than every peer"), "{v}");
        assert!(v.contains("higher than every peer"), "{v}");
        assert!(v.contains("within the 1.25× goal"), "{v}");
        assert!(!v.contains("indistinguishable"), "{v}");
    }

    #[test]
    fn shards_are_compared_with_cpu_per_op() {
        let v = verdict_of(
            "persistent-64",
            vec![
                (
                    "ringlockd-t1",
                    ran(60.0, (55.0, 65.0), 10000.0, 10000.0, Some(10.0)),
                ),
                (
                    "ringlockd-t2",
                    ran(100.0, (95.0, 110.0), 10000.0, 10000.0, Some(12.0)),
                ),
            ],
        );
        assert!(v.contains("outside the 1.5× bound"), "{v}");
        assert!(v.contains("server CPU 12.0 vs 10.0 µs/op (1.20×)"), "{v}");
    }

    #[test]
    fn idle_polling_is_compared_with_cpu_per_op() {
        let v = verdict_of(
            "persistent-64",
            vec![
                (
                    "ringlockd",
                    ran(40.0, (38.0, 42.0), 10000.0, 10000.0, Some(15.0)),
                ),
                (
                    "ringlockd-nopoll",
                    ran(60.0, (55.0, 65.0), 10000.0, 10000.0, Some(10.0)),
                ),
            ],
        );
        assert!(v.contains("ringlockd-nopoll 60"), "{v}");
        assert!(v.contains("lower with polling"), "{v}");
        assert!(v.contains("server CPU 15.0 vs 10.0 µs/op (1.50×)"), "{v}");
    }

    #[test]
    fn sessions_are_compared_with_the_locking_center_protocol() {
        let v = verdict_of(
            "persistent-64",
            vec![
                (
                    "ringlockd",
                    ran(60.0, (58.0, 62.0), 10000.0, 10000.0, Some(10.0)),
                ),
                (
                    "ringlockd-session",
                    ran(64.0, (63.0, 65.0), 10000.0, 10000.0, Some(11.0)),
                ),
            ],
        );
        assert!(v.contains("ringlockd-session p99 64"), "{v}");
        assert!(v.contains("(1.07×: within the 1.1× goal)"), "{v}");
        assert!(v.contains("server CPU 11.0 vs 10.0 µs/op (1.10×)"), "{v}");
        assert!(
            !v.contains("best peer ringlockd-session"),
            "not a peer: {v}"
        );
        let v = verdict_of(
            "hot-key-64-max",
            vec![
                ("ringlockd", ran(60.0, (58.0, 62.0), 9000.0, 0.0, None)),
                (
                    "ringlockd-session",
                    ran(80.0, (75.0, 85.0), 8000.0, 0.0, None),
                ),
            ],
        );
        assert!(v.contains("outside the 1.1× goal"), "{v}");
        assert!(v.contains("throughput 8000 vs 9000 cycles/s"), "{v}");
        let v = verdict_of(
            "persistent-64",
            vec![
                ("ringlockd", ran(60.0, (50.0, 90.0), 1.0, 1.0, None)),
                ("ringlockd-session", ran(80.0, (70.0, 95.0), 1.0, 1.0, None)),
            ],
        );
        assert!(v.contains("indistinguishable"), "{v}");
        assert!(!v.contains("goal"), "no goal claimed despite overlap: {v}");
    }

    #[test]
    fn ranges() {
        assert!(overlap((1.0, 2.0), (2.0, 3.0)));
        assert!(!overlap((1.0, 2.0), (2.5, 3.0)));
        assert_eq!(kv("foreign=3 steal=0", "steal").as_deref(), Some("0"));
        assert_eq!(
            kv("server_cpu_s=1 us_per_op=2.50", "us_per_op").as_deref(),
            Some("2.50")
        );
        assert_eq!(kv("us_per_opx=1", "us_per_op"), None);
    }
}
