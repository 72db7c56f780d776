//! `cluster-ops table`: the markdown tables of `cluster-ops run`'s JSON
//! files (one per system and scenario, see [`crate::ops::to_json`]).
//!
//! Three tables: one row per run; one row per operation (a restart or a
//! replacement) with its client-side numbers; and, when a run replaced
//! nodes, one row per replacement with what only a replacement has (the
//! new node, the time until the replacement was done, whether the new node
//! installed a snapshot). No I/O: the caller reads the files and prints.

use crate::json::Value;

/// A field for a cell: integers without decimals, other numbers with one,
/// `–` where it is absent or null.
fn f(v: &Value, path: &str) -> String {
    match v.get(path) {
        Some(Value::Num(n)) if n.fract() == 0.0 => format!("{n:.0}"),
        Some(Value::Num(n)) => format!("{n:.1}"),
        Some(Value::Str(s)) => s.clone(),
        _ => "–".into(),
    }
}

fn ops(v: &Value) -> &[Value] {
    match v.get("restarts") {
        Some(Value::Arr(rs)) => rs,
        _ => &[],
    }
}

fn is_replacement(r: &Value) -> bool {
    matches!(r.get("new_node"), Some(Value::Num(_)))
}

fn row(cells: &[String]) -> String {
    format!("| {} |\n", cells.join(" | "))
}

pub fn table(runs: &[Value]) -> String {
    let mut out = String::new();
    out += "| system | scenario | operations | workers | cycles | max gap ms | per-operation max gap p50 / p99 ms | leader's: max gap p50 / max ms | followers': max gap p50 / max ms | steady-state max gap ms | retries | of which timeouts | max retries per op | walks |\n";
    out += "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for v in runs {
        let pair = |a: &str, b: &str| format!("{} / {}", f(v, a), f(v, b));
        out += &row(&[
            f(v, "system"),
            f(v, "scenario"),
            f(v, "restart_max_gap.count"),
            f(v, "workers"),
            f(v, "cycles"),
            f(v, "max_gap_ms"),
            pair("restart_max_gap.p50_ms", "restart_max_gap.p99_ms"),
            pair(
                "leader_restart_max_gap.p50_ms",
                "leader_restart_max_gap.max_ms",
            ),
            pair(
                "follower_restart_max_gap.p50_ms",
                "follower_restart_max_gap.max_ms",
            ),
            f(v, "baseline_max_gap_ms"),
            f(v, "retries"),
            f(v, "timeouts"),
            f(v, "max_retries_per_op"),
            f(v, "walks"),
        ]);
    }
    out += "\n| system | scenario | op | node | role | signal → exit ms | exit status | signal → started ms | started → ready ms | max gap ms | it ended, ms after the signal | retries | of which timeouts | max retries per op | walks | workers that retried |\n";
    out += "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for v in runs {
        for r in ops(v) {
            out += &row(&[
                f(v, "system"),
                f(v, "scenario"),
                f(r, "k"),
                f(r, "node"),
                f(r, "role"),
                f(r, "stop_ms"),
                f(r, "exit_status"),
                f(r, "down_ms"),
                f(r, "rejoin_ms"),
                f(r, "max_gap_ms"),
                f(r, "max_gap_ended_ms"),
                f(r, "retries"),
                f(r, "timeouts"),
                f(r, "max_retries_per_op"),
                f(r, "walks"),
                f(r, "workers_retried"),
            ]);
        }
    }
    if runs.iter().flat_map(ops).any(is_replacement) {
        out += "\n| system | op | killed node | role | new node | kill → new node listens ms | kill → replaced ms | kill → ready ms | max gap ms | new node installed a snapshot | voters after |\n";
        out += "|---|---:|---:|---|---:|---:|---:|---:|---:|---|---|\n";
        for v in runs {
            for r in ops(v).iter().filter(|r| is_replacement(r)) {
                out += &row(&[
                    f(v, "system"),
                    f(r, "k"),
                    f(r, "node"),
                    f(r, "role"),
                    f(r, "new_node"),
                    f(r, "down_ms"),
                    f(r, "replaced_ms"),
                    f(r, "ready_ms"),
                    f(r, "max_gap_ms"),
                    f(r, "snapshot"),
                    f(r, "voters"),
                ]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replacement_gets_its_own_table() {
        let run = |ops: &str| {
            crate::json::parse(&format!(
                "{{\"system\":\"s\",\"scenario\":\"x\",\"max_gap_ms\":12.5,\"restarts\":[{ops}]}}"
            ))
            .unwrap()
        };
        let restart = run("{\"k\":1,\"node\":2,\"role\":\"leader\",\"new_node\":null}");
        let t = table(std::slice::from_ref(&restart));
        assert!(t.contains("| s | x | – | – | – | 12.5 |"), "{t}");
        assert!(t.contains("| s | x | 1 | 2 | leader |"));
        assert!(!t.contains("killed node"), "no replacement table: {t}");
        let replace = run(
            "{\"k\":1,\"node\":2,\"role\":\"follower\",\"new_node\":4,\"replaced_ms\":1500,\"snapshot\":\"yes\",\"voters\":\"1,3,4\"}",
        );
        let t = table(&[restart, replace]);
        assert!(t.contains("killed node"));
        assert!(
            t.contains("| s | 1 | 2 | follower | 4 | – | 1500 | – | – | yes | 1,3,4 |"),
            "{t}"
        );
    }
}
