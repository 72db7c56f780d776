//! The Grafana dashboard `deploy/grafana/ringlock.json`: a dashboard
//! Grafana can import (its structure, panels that do not overlap, every
//! query PromQL that `promtool` parses), and every metric its queries name
//! is one a live server exports, with the labels the query uses: the
//! non-cluster series on a real single-node `ringlockd`, the
//! `ringlock_raft_*` series on a real 3-node cluster (certificates from
//! `ringlock cert`, as tests/common/cluster.rs starts it). A renamed metric
//! or label breaks this test, not somebody's dashboard.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

const DASHBOARD: &str = "deploy/grafana/ringlock.json";

fn dashboard() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DASHBOARD);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"))
}

/// Every PromQL expression of the dashboard: each target's `expr`, and the
/// template variables' queries (`label_values(...)`).
fn expressions(d: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr", Value::String(e)) => out.push(e.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&d["panels"], &mut out);
    for var in d["templating"]["list"].as_array().expect("templating.list") {
        if var["type"] == "query" {
            let q = match &var["query"] {
                Value::String(q) => q.clone(),
                q => q["query"]
                    .as_str()
                    .expect("a query variable's query")
                    .to_string(),
            };
            out.push(q);
        }
    }
    out
}

/// What one expression names: metrics, and labels (in matchers and in
/// `by`/`without`/`on`/`ignoring`/`group_*` lists, and `label_values`'
/// label).
#[derive(Debug, Default)]
struct Names {
    metrics: BTreeSet<String>,
    labels: BTreeSet<String>,
}

/// Operators and aggregations (an aggregation may be followed by `by
/// (...)` before its parenthesis), never metrics.
const KEYWORDS: [&str; 20] = [
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];
const LABEL_LISTS: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

fn ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b':'
}

fn ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

/// A small PromQL scanner: skips strings, range selectors, numbers and
/// Grafana variables; a name not followed by `(` and not a keyword is a
/// metric; names inside `{...}` and in label lists are labels.
fn names(expr: &str) -> Names {
    let b = expr.as_bytes();
    let mut n = Names::default();
    let mut i = 0;
    let skip_string = |i: &mut usize| {
        let q = b[*i];
        *i += 1;
        while *i < b.len() && b[*i] != q {
            if b[*i] == b'\\' {
                *i += 1;
            }
            *i += 1;
        }
        *i += 1;
    };
    let ident = |i: &mut usize| -> String {
        let s = *i;
        while *i < b.len() && ident_char(b[*i]) {
            *i += 1;
        }
        expr[s..*i].to_string()
    };
    // Labels inside a parenthesised list or a matcher block, up to `close`.
    let labels_until = |i: &mut usize, close: u8, out: &mut BTreeSet<String>| {
        *i += 1;
        while *i < b.len() && b[*i] != close {
            match b[*i] {
                b'"' | b'\'' | b'`' => skip_string(i),
                c if ident_start(c) => {
                    out.insert(ident(i));
                }
                _ => *i += 1,
            }
        }
        *i += 1;
    };
    while i < b.len() {
        match b[i] {
            b'"' | b'\'' | b'`' => skip_string(&mut i),
            b'{' => labels_until(&mut i, b'}', &mut n.labels),
            b'[' => {
                while i < b.len() && b[i] != b']' {
                    i += 1;
                }
                i += 1;
            }
            b'$' => {
                i += 1;
                while i < b.len() && ident_char(b[i]) {
                    i += 1;
                }
            }
            c if c.is_ascii_digit() || c == b'.' => {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                    i += 1;
                }
            }
            c if ident_start(c) => {
                let name = ident(&mut i);
                let mut j = i;
                while j < b.len() && b[j].is_ascii_whitespace() {
                    j += 1;
                }
                let call = j < b.len() && b[j] == b'(';
                if call && LABEL_LISTS.contains(&name.as_str()) {
                    i = j;
                    labels_until(&mut i, b')', &mut n.labels);
                } else if call && name == "label_values" {
                    // label_values(metric{...}, label) or label_values(label).
                    let close = expr[j..].find(')').expect("label_values(...)") + j;
                    let args = &expr[j + 1..close];
                    match args.rsplit_once(',') {
                        Some((series, label)) => {
                            let inner = names(series);
                            n.metrics.extend(inner.metrics);
                            n.labels.extend(inner.labels);
                            n.labels.insert(label.trim().to_string());
                        }
                        None => {
                            n.labels.insert(args.trim().to_string());
                        }
                    }
                    i = close + 1;
                } else if !call
                    && !KEYWORDS.contains(&name.to_ascii_lowercase().as_str())
                    && !LABEL_LISTS.contains(&name.as_str())
                    && !name.eq_ignore_ascii_case("nan")
                {
                    n.metrics.insert(name);
                }
            }
            _ => i += 1,
        }
    }
    n
}

#[test]
fn the_scanner_finds_metrics_and_labels() {
    let n = names(
        r#"sum by (protocol, result) (rate(ringlock_requests_total{instance=~"$instance",result=~"a|b"}[$__rate_interval])) / on (job) group_left sum(rate(x_total[5m] offset 1h)) > 0.5"#,
    );
    assert_eq!(
        n.metrics,
        BTreeSet::from(["ringlock_requests_total".into(), "x_total".into()])
    );
    assert_eq!(
        n.labels,
        BTreeSet::from([
            "instance".into(),
            "job".into(),
            "protocol".into(),
            "result".into()
        ])
    );
    let n = names("label_values(ringlock_build_info{job=\"x\"}, instance)");
    assert_eq!(n.metrics, BTreeSet::from(["ringlock_build_info".into()]));
    assert_eq!(n.labels, BTreeSet::from(["instance".into(), "job".into()]));
    let n = names("histogram_quantile(0.99, sum by (le) (rate(a_bucket[1m]))) * 1e3");
    assert_eq!(n.metrics, BTreeSet::from(["a_bucket".into()]));
}

/// Grafana's variables replaced by what Prometheus would get.
fn as_promql(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m")
        .replace("$__interval", "1m")
        .replace("$instance", ".*")
}

#[test]
fn the_dashboard_is_an_importable_grafana_dashboard() {
    let d = dashboard();
    assert_eq!(d["uid"], "ringlock");
    assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 30));
    assert!(d["id"].is_null(), "an exported dashboard has no id");
    let vars: BTreeMap<&str, &Value> = d["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .map(|v| (v["name"].as_str().expect("a variable's name"), v))
        .collect();
    assert_eq!(vars["datasource"]["type"], "datasource");
    assert_eq!(vars["datasource"]["query"], "prometheus");
    assert_eq!(vars["instance"]["type"], "query");

    let panels = d["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    let mut cells: BTreeMap<(u64, u64), String> = BTreeMap::new();
    let mut graphs = 0;
    for p in panels {
        let title = p["title"].as_str().expect("a panel title").to_string();
        assert!(
            ids.insert(p["id"].as_u64().expect("a panel id")),
            "{title}: duplicate id"
        );
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().expect("x"),
            g["y"].as_u64().expect("y"),
            g["w"].as_u64().expect("w"),
            g["h"].as_u64().expect("h"),
        );
        assert!(w >= 1 && x + w <= 24 && h >= 1, "{title}: gridPos {g}");
        for cx in x..x + w {
            for cy in y..y + h {
                if let Some(other) = cells.insert((cx, cy), title.clone()) {
                    panic!("panels {other:?} and {title:?} overlap at ({cx}, {cy})");
                }
            }
        }
        if p["type"] == "row" {
            continue;
        }
        graphs += 1;
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        let mut refs = BTreeSet::new();
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
            assert!(refs.insert(t["refId"].as_str().expect("refId")), "{title}");
            let e = t["expr"].as_str().expect("expr");
            assert!(
                e.contains("instance=~\"$instance\""),
                "{title}: every query follows the instance variable: {e}"
            );
        }
    }
    assert!(graphs >= 10, "{graphs} graphs");

    // Every expression is PromQL that promtool parses: each one a
    // recording rule of a rules file that `promtool check rules` reads.
    let dir = common::TempDir::new("dashboard");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in expressions(&d).iter().enumerate() {
        if e.starts_with("label_values(") {
            continue;
        }
        let e = serde_json::to_string(&as_promql(e)).expect("a JSON string is YAML");
        rules.push_str(&format!(
            "      - record: dashboard:expr_{i}\n        expr: {e}\n"
        ));
    }
    let file = dir.path("dashboard-rules.yml");
    std::fs::write(&file, &rules).expect("write rules");
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool is not on PATH: install it (Debian: apt-get install prometheus)");
    assert!(
        out.status.success(),
        "promtool rejected a dashboard query:\n{}{}\n{rules}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One scrape: metric name → the label names its samples carry.
fn scrape(addr: SocketAddr) -> BTreeMap<String, BTreeSet<String>> {
    let mut c = TcpStream::connect(addr).expect("connect to the metrics port");
    c.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
        .expect("request");
    let mut answer = String::new();
    c.read_to_string(&mut answer).expect("answer");
    let (_, text) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, _) = line.rsplit_once(' ').expect("`series value`");
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.trim_end_matches('}')),
            None => (series, ""),
        };
        let set = out.entry(name.to_string()).or_default();
        for pair in labels.split("\",").filter(|p| !p.is_empty()) {
            set.insert(pair.split_once('=').expect("label=value").0.to_string());
        }
    }
    out
}

/// Checks one expression against what servers export: each metric it names
/// has samples in `exported`, and each label it names (but `instance` and
/// `job`, which Prometheus adds) is on the samples of one of its metrics.
fn missing(expr: &str, exported: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let n = names(expr);
    let mut gaps = Vec::new();
    for m in &n.metrics {
        if !exported.contains_key(m) {
            gaps.push(format!("metric {m}"));
        }
    }
    for l in n
        .labels
        .iter()
        .filter(|l| !["instance", "job"].contains(&l.as_str()))
    {
        if !n
            .metrics
            .iter()
            .any(|m| exported.get(m).is_some_and(|ls| ls.contains(l)))
        {
            gaps.push(format!("label {l} on {:?}", n.metrics));
        }
    }
    gaps
}

/// Series only a cluster node exports: the Raft series and Locking-Center
/// forwarding.
const CLUSTER_ONLY: [&str; 2] = ["ringlock_raft_", "ringlock_lc_forward"];

#[test]
fn every_metric_the_dashboard_queries_is_exported() {
    let exprs = expressions(&dashboard());
    let (raft, single): (Vec<&String>, Vec<&String>) = exprs.iter().partition(|e| {
        names(e)
            .metrics
            .iter()
            .any(|m| CLUSTER_ONLY.iter().any(|p| m.starts_with(p)))
    });
    assert!(!raft.is_empty() && !single.is_empty());
    for e in &exprs {
        for m in names(e).metrics {
            assert!(m.starts_with("ringlock_"), "{m} in {e}");
        }
    }

    // A single node: everything but the cluster series.
    let srv = common::Server::start(&["--metrics-bind", "127.0.0.1:0"]);
    let exported = scrape(srv.metrics());
    let gaps: Vec<String> = single
        .iter()
        .flat_map(|e| {
            missing(e, &exported)
                .into_iter()
                .map(move |g| format!("{g} in {e}"))
        })
        .collect();
    assert!(
        gaps.is_empty(),
        "the dashboard queries what a single node does not export:\n{}",
        gaps.join("\n")
    );

    // A 3-node cluster: the raft series, from all nodes together (follower
    // lag comes from the leader once it has heard from its followers).
    let c = common::cluster::Cluster::start(3, 1, &["--metrics-bind", "127.0.0.1:0"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut exported: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for node in c.nodes.iter().flatten() {
            for (m, ls) in scrape(node.metrics()) {
                exported.entry(m).or_default().extend(ls);
            }
        }
        let gaps: Vec<String> = raft
            .iter()
            .flat_map(|e| {
                missing(e, &exported)
                    .into_iter()
                    .map(move |g| format!("{g} in {e}"))
            })
            .collect();
        if gaps.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dashboard queries what a 3-node cluster does not export:\n{}",
            gaps.join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
