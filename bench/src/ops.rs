//! What a client saw while a cluster was operated on (`cluster-ops`,
//! `scripts/cluster-ops-bench.sh`): each worker's completed cycles and
//! retries, cut into one window per operation by the script's marks.
//!
//! No I/O here: the tool records, this module reduces.
//!
//! An **operation** is a restart (SIGTERM, the same node started again on
//! its data path) or a replacement (`kill -9`, a fresh node started and
//! made a voter in the killed one's place); the code calls both restarts.
//!
//! - A **gap** is the time between two successive completed cycles of one
//!   worker (its first cycle opens the record; the time from its last cycle
//!   to the stop counts as a gap too, so a worker stuck at the end is not
//!   hidden). The longest gap is the unavailability that worker saw.
//! - Restart *k*'s **window** runs from its signal (exclusive) to the next
//!   restart's signal (inclusive), the last one to the stop. A gap belongs
//!   to the window in which it *ended*, so an outage that began just before
//!   a signal is still that restart's. Gaps that ended before the first
//!   signal are the **baseline** (the steady state's longest gap).
//! - A **retry** is a request that was sent and not answered as it should
//!   have been (a closed connection, `-`, an error status, a timeout); a
//!   **walk** is a step along the address list past a node that did not
//!   serve (connection refused, a follower's `-` to Persist). Both are
//!   counted per cycle and the cycle's counts go to the window it ended in.
//!   **Timeouts** are the retries whose request got no answer within the
//!   client's I/O timeout (a gap that long is the timeout's, not only the
//!   server's).

/// One line of the script's marks file: `UNIX_SECONDS EVENT K NODE INFO`.
#[derive(Clone, Debug, PartialEq)]
pub struct Mark {
    pub t: f64,
    /// `signal`, `exited`, `started`, `ready`; a replacement also
    /// `replaced` and `snapshot`.
    pub event: String,
    /// The operation's number, from 1.
    pub k: u32,
    /// The node signalled (for a replacement: the node replaced).
    pub node: u32,
    /// signal: the node's role (`leader`/`follower`); exited: its exit
    /// status; started: `-` (the same node again) or the new node's id;
    /// replaced: the voters after it (`2,3,4`); snapshot: `yes`/`no`
    /// (whether the new node installed one); ready: the serving node
    /// after it.
    pub info: String,
}

pub fn parse_marks(text: &str) -> Result<Vec<Mark>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        let bad = || format!("marks line {}: {line:?}", i + 1);
        if f.len() != 5 {
            return Err(bad());
        }
        out.push(Mark {
            t: f[0].parse().map_err(|_| bad())?,
            event: f[1].to_string(),
            k: f[2].parse().map_err(|_| bad())?,
            node: f[3].parse().map_err(|_| bad())?,
            info: f[4].to_string(),
        });
    }
    Ok(out)
}

/// One restart or replacement, as the marks tell it (unix seconds).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Restart {
    pub k: u32,
    pub node: u32,
    pub role: String,
    pub signal: f64,
    pub exited: Option<f64>,
    pub exit_status: Option<String>,
    /// The node (the same one, or the new one) listens.
    pub started: Option<f64>,
    /// A replacement's new node.
    pub new_node: Option<u32>,
    /// A replacement: done (the new node a voter, the old one gone).
    pub replaced: Option<f64>,
    pub voters: Option<String>,
    /// A replacement: whether the new node installed a snapshot.
    pub snapshot: Option<String>,
    pub ready: Option<f64>,
}

/// The restarts in signal order; every restart needs its `signal` mark.
pub fn restarts(marks: &[Mark]) -> Result<Vec<Restart>, String> {
    let mut out: Vec<Restart> = Vec::new();
    for m in marks {
        if m.event == "signal" {
            if out.iter().any(|r| r.k == m.k) {
                return Err(format!("restart {} signalled twice", m.k));
            }
            out.push(Restart {
                k: m.k,
                node: m.node,
                role: m.info.clone(),
                signal: m.t,
                ..Restart::default()
            });
            continue;
        }
        let r = out
            .iter_mut()
            .find(|r| r.k == m.k)
            .ok_or_else(|| format!("mark {} of restart {} before its signal", m.event, m.k))?;
        match m.event.as_str() {
            "exited" => {
                r.exited = Some(m.t);
                r.exit_status = Some(m.info.clone());
            }
            "started" => {
                r.started = Some(m.t);
                if m.info != "-" {
                    let n = m
                        .info
                        .parse()
                        .map_err(|_| format!("restart {}: started names node {:?}", m.k, m.info))?;
                    r.new_node = Some(n);
                }
            }
            "replaced" => {
                r.replaced = Some(m.t);
                r.voters = Some(m.info.clone());
            }
            "snapshot" => r.snapshot = Some(m.info.clone()),
            "ready" => r.ready = Some(m.t),
            other => return Err(format!("unknown mark {other:?}")),
        }
    }
    out.sort_by(|a, b| a.signal.total_cmp(&b.signal));
    Ok(out)
}

/// A cycle that needed a retry or a walk.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Trouble {
    /// When the cycle completed, µs after the run's start.
    pub at_us: u64,
    pub retries: u32,
    pub walks: u32,
    /// Of the retries, those after an I/O timeout.
    pub timeouts: u32,
}

/// What one worker recorded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkerLog {
    /// Each completed cycle's end, µs after the run's start, ascending.
    pub done_us: Vec<u64>,
    pub troubles: Vec<Trouble>,
    /// Retries and walks of the cycle the stop interrupted.
    pub pending_retries: u64,
    pub pending_walks: u64,
    pub pending_timeouts: u64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct WindowStats {
    pub max_gap_us: u64,
    /// When that gap ended, µs after the run's start.
    pub max_gap_end_us: u64,
    pub retries: u64,
    pub max_retries: u32,
    pub walks: u64,
    pub timeouts: u64,
    /// Workers with a retry in this window.
    pub workers_retried: u32,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkerStats {
    pub cycles: u64,
    pub max_gap_us: u64,
    pub retries: u64,
    pub max_retries: u32,
    pub walks: u64,
    pub timeouts: u64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Analysis {
    pub workers: Vec<WorkerStats>,
    pub baseline: WindowStats,
    /// One per restart, in order.
    pub windows: Vec<WindowStats>,
    /// Each restart's signal, µs after the run's start.
    pub signals_us: Vec<i64>,
}

/// The window a moment belongs to: 0 = baseline, k = restart k's.
fn window_of(at_us: u64, signals_us: &[i64]) -> usize {
    // Windows are (signal_k, signal_k+1]: count the signals strictly before.
    signals_us.partition_point(|&s| s < at_us as i64)
}

pub fn analyse(t0_unix: f64, stop_us: u64, logs: &[WorkerLog], rs: &[Restart]) -> Analysis {
    let signals: Vec<i64> = rs
        .iter()
        .map(|r| ((r.signal - t0_unix) * 1e6).round() as i64)
        .collect();
    let mut win = vec![WindowStats::default(); rs.len() + 1];
    let mut workers = Vec::with_capacity(logs.len());
    for log in logs {
        let mut ws = WorkerStats {
            cycles: log.done_us.len() as u64,
            retries: log.pending_retries,
            walks: log.pending_walks,
            timeouts: log.pending_timeouts,
            ..WorkerStats::default()
        };
        let ends = log.done_us.iter().copied().chain(
            // The open gap at the stop.
            log.done_us.last().map(|&l| stop_us.max(l)),
        );
        let mut prev: Option<u64> = None;
        for end in ends {
            if let Some(p) = prev {
                let gap = end.saturating_sub(p);
                ws.max_gap_us = ws.max_gap_us.max(gap);
                let w = &mut win[window_of(end, &signals)];
                if gap > w.max_gap_us {
                    w.max_gap_us = gap;
                    w.max_gap_end_us = end;
                }
            }
            prev = Some(end);
        }
        let mut retried_in = vec![false; win.len()];
        for t in &log.troubles {
            ws.retries += u64::from(t.retries);
            ws.walks += u64::from(t.walks);
            ws.timeouts += u64::from(t.timeouts);
            ws.max_retries = ws.max_retries.max(t.retries);
            let i = window_of(t.at_us, &signals);
            let w = &mut win[i];
            w.retries += u64::from(t.retries);
            w.walks += u64::from(t.walks);
            w.timeouts += u64::from(t.timeouts);
            w.max_retries = w.max_retries.max(t.retries);
            retried_in[i] |= t.retries > 0;
        }
        for (w, hit) in win.iter_mut().zip(retried_in) {
            w.workers_retried += u32::from(hit);
        }
        workers.push(ws);
    }
    let baseline = win.remove(0);
    Analysis {
        workers,
        baseline,
        windows: win,
        signals_us: signals,
    }
}

/// Nearest rank (with up to 100 values p99 is the largest).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

fn ms(us: u64) -> String {
    format!("{:.3}", us as f64 / 1e3)
}

/// A JSON string or null (the marks' words have no quotes or escapes).
fn opt_str(v: Option<&str>) -> String {
    v.map(|e| format!("\"{e}\""))
        .unwrap_or_else(|| "null".into())
}

fn opt_ms(from: f64, to: Option<f64>) -> String {
    to.map(|t| format!("{:.3}", (t - from) * 1e3))
        .unwrap_or_else(|| "null".into())
}

fn dist(v: &[u64]) -> String {
    let mut v: Vec<f64> = v.iter().map(|&u| u as f64 / 1e3).collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return "{\"count\":0}".into();
    }
    format!(
        "{{\"count\":{},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"max_ms\":{:.3}}}",
        v.len(),
        percentile(&v, 50.0),
        percentile(&v, 99.0),
        v[v.len() - 1]
    )
}

/// The run's JSON object. `head` is the caller's leading fields (system,
/// scenario, settings), a JSON object body without braces.
pub fn to_json(a: &Analysis, rs: &[Restart], head: &str, duration_s: f64) -> String {
    let cycles: u64 = a.workers.iter().map(|w| w.cycles).sum();
    let retries: u64 = a.workers.iter().map(|w| w.retries).sum();
    let walks: u64 = a.workers.iter().map(|w| w.walks).sum();
    let timeouts: u64 = a.workers.iter().map(|w| w.timeouts).sum();
    let max_retries = a.workers.iter().map(|w| w.max_retries).max().unwrap_or(0);
    let max_gap = a.workers.iter().map(|w| w.max_gap_us).max().unwrap_or(0);
    let gaps = |role: Option<&str>| -> Vec<u64> {
        rs.iter()
            .zip(&a.windows)
            .filter(|(r, _)| role.is_none_or(|x| r.role == x))
            .map(|(_, w)| w.max_gap_us)
            .collect()
    };
    // Signal -> replacement done, of the replacements.
    let replace_us: Vec<u64> = rs
        .iter()
        .filter_map(|r| r.replaced.map(|t| ((t - r.signal).max(0.0) * 1e6) as u64))
        .collect();
    let mut s = format!("{{{head}");
    s += &format!(
        ",\"duration_s\":{duration_s:.3},\"cycles\":{cycles},\"max_gap_ms\":{},\"baseline_max_gap_ms\":{},\"restart_max_gap\":{},\"leader_restart_max_gap\":{},\"follower_restart_max_gap\":{},\"replace\":{},\"retries\":{retries},\"max_retries_per_op\":{max_retries},\"walks\":{walks},\"timeouts\":{timeouts}",
        ms(max_gap),
        ms(a.baseline.max_gap_us),
        dist(&gaps(None)),
        dist(&gaps(Some("leader"))),
        dist(&gaps(Some("follower"))),
        dist(&replace_us),
    );
    let items: Vec<String> = rs
        .iter()
        .zip(&a.windows)
        .zip(&a.signals_us)
        .map(|((r, w), &sig)| {
            format!(
                "{{\"k\":{},\"node\":{},\"role\":\"{}\",\"exit_status\":{},\"stop_ms\":{},\"down_ms\":{},\"rejoin_ms\":{},\"new_node\":{},\"replaced_ms\":{},\"voters\":{},\"snapshot\":{},\"ready_ms\":{},\"max_gap_ms\":{},\"max_gap_ended_ms\":{:.3},\"retries\":{},\"max_retries_per_op\":{},\"walks\":{},\"timeouts\":{},\"workers_retried\":{}}}",
                r.k,
                r.node,
                r.role,
                opt_str(r.exit_status.as_deref()),
                opt_ms(r.signal, r.exited),
                opt_ms(r.signal, r.started),
                r.started.map(|s| opt_ms(s, r.ready)).unwrap_or_else(|| "null".into()),
                r.new_node.map(|n| n.to_string()).unwrap_or_else(|| "null".into()),
                opt_ms(r.signal, r.replaced),
                opt_str(r.voters.as_deref()),
                opt_str(r.snapshot.as_deref()),
                opt_ms(r.signal, r.ready),
                ms(w.max_gap_us),
                (w.max_gap_end_us as i64 - sig) as f64 / 1e3,
                w.retries,
                w.max_retries,
                w.walks,
                w.timeouts,
                w.workers_retried
            )
        })
        .collect();
    s += &format!(",\"restarts\":[{}]", items.join(","));
    let items: Vec<String> = a
        .workers
        .iter()
        .map(|w| {
            format!(
                "{{\"cycles\":{},\"max_gap_ms\":{},\"retries\":{},\"max_retries_per_op\":{},\"walks\":{},\"timeouts\":{}}}",
                w.cycles,
                ms(w.max_gap_us),
                w.retries,
                w.max_retries,
                w.walks,
                w.timeouts
            )
        })
        .collect();
    s += &format!(",\"per_worker\":[{}]}}", items.join(","));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restart(k: u32, signal: f64, role: &str) -> Restart {
        Restart {
            k,
            node: k,
            role: role.into(),
            signal,
            exited: Some(signal + 0.01),
            exit_status: Some("0".into()),
            started: Some(signal + 0.02),
            ready: Some(signal + 0.5),
            ..Restart::default()
        }
    }

    #[test]
    fn marks_make_restarts() {
        let m = parse_marks(
            "100.5 signal 1 2 follower\n100.6 exited 1 2 0\n100.7 started 1 2 -\n101.0 ready 1 2 3\n\n\
             102.0 signal 2 3 leader\n102.1 exited 2 3 0\n",
        )
        .unwrap();
        let rs = restarts(&m).unwrap();
        assert_eq!(rs.len(), 2);
        assert_eq!((rs[0].node, rs[0].role.as_str()), (2, "follower"));
        assert_eq!(rs[0].ready, Some(101.0));
        assert_eq!((rs[1].exited, rs[1].started), (Some(102.1), None));
        assert!(parse_marks("1 signal x 2 leader").is_err());
        assert!(parse_marks("1 signal 1 2").is_err());
        assert!(restarts(&parse_marks("1 exited 1 2 0").unwrap()).is_err());
        assert!(restarts(&parse_marks("1 signal 1 2 a\n2 signal 1 3 b").unwrap()).is_err());
        assert!(restarts(&parse_marks("1 signal 1 2 a\n2 bogus 1 2 x").unwrap()).is_err());
    }

    #[test]
    fn a_replacement_has_its_new_node_voters_and_snapshot() {
        let m = parse_marks(
            "10.0 signal 1 2 leader\n10.1 exited 1 2 137\n10.5 started 1 2 4\n\
             12.0 replaced 1 2 1,3,4\n12.5 ready 1 2 3\n12.5 snapshot 1 2 yes\n",
        )
        .unwrap();
        let rs = restarts(&m).unwrap();
        assert_eq!(rs[0].new_node, Some(4));
        assert_eq!(rs[0].replaced, Some(12.0));
        assert_eq!(rs[0].voters.as_deref(), Some("1,3,4"));
        assert_eq!(rs[0].snapshot.as_deref(), Some("yes"));
        assert!(restarts(&parse_marks("1 signal 1 2 a\n2 started 1 2 x").unwrap()).is_err());
        let w = WorkerLog {
            done_us: vec![1_000_000, 2_000_000],
            ..WorkerLog::default()
        };
        let a = analyse(9.0, 4_000_000, &[w], &rs);
        let v = crate::json::parse(&to_json(&a, &rs, "\"system\":\"x\"", 4.0)).unwrap();
        assert_eq!(v.num("replace.count"), Some(1.0));
        assert_eq!(v.num("replace.max_ms"), Some(2000.0));
        match v.get("restarts") {
            Some(crate::json::Value::Arr(r)) => {
                assert_eq!(r[0].num("new_node"), Some(4.0));
                assert_eq!(r[0].num("replaced_ms"), Some(2000.0));
                assert_eq!(r[0].num("ready_ms"), Some(2500.0));
                assert_eq!(r[0].str("voters"), Some("1,3,4"));
                assert_eq!(r[0].str("snapshot"), Some("yes"));
                assert_eq!(r[0].str("exit_status"), Some("137"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn gaps_go_to_the_window_they_end_in() {
        // t0 = 1000 s; restarts signalled at +1 s and +2 s.
        let rs = [restart(1, 1001.0, "follower"), restart(2, 1002.0, "leader")];
        let w = WorkerLog {
            // Baseline gaps 100 ms; a 300 ms gap spanning the first signal;
            // a 50 ms gap ending exactly at the second signal (still the
            // first window's); then a 700 ms gap in the second window.
            done_us: vec![
                100_000, 200_000, 300_000, 900_000, 1_200_000, 1_950_000, 2_000_000, 2_700_000,
            ],
            troubles: vec![
                Trouble {
                    at_us: 1_200_000,
                    retries: 1,
                    walks: 2,
                    timeouts: 0,
                },
                Trouble {
                    at_us: 2_700_000,
                    retries: 2,
                    walks: 0,
                    timeouts: 1,
                },
            ],
            pending_retries: 0,
            pending_walks: 0,
            pending_timeouts: 0,
        };
        let a = analyse(1000.0, 2_750_000, &[w], &rs);
        assert_eq!(a.baseline.max_gap_us, 600_000); // 300 ms -> 900 ms
        assert_eq!(a.windows[0].max_gap_us, 750_000); // 1.2 s -> 1.95 s
        assert_eq!(a.windows[1].max_gap_us, 700_000);
        assert_eq!(a.windows[0].max_gap_end_us, 1_950_000);
        assert_eq!(a.signals_us, [1_000_000, 2_000_000]);
        assert_eq!((a.windows[0].retries, a.windows[0].walks), (1, 2));
        assert_eq!((a.windows[1].retries, a.windows[1].max_retries), (2, 2));
        assert_eq!(a.windows[1].workers_retried, 1);
        assert_eq!((a.windows[0].timeouts, a.windows[1].timeouts), (0, 1));
        assert_eq!(a.workers[0].timeouts, 1);
        assert_eq!(a.workers[0].max_gap_us, 750_000);
        assert_eq!(a.workers[0].cycles, 8);
        assert_eq!((a.workers[0].retries, a.workers[0].max_retries), (3, 2));
    }

    #[test]
    fn a_worker_stuck_at_the_stop_shows_its_open_gap() {
        let w = WorkerLog {
            done_us: vec![10, 20],
            pending_retries: 4,
            ..WorkerLog::default()
        };
        let a = analyse(0.0, 5_000_020, &[w, WorkerLog::default()], &[]);
        assert_eq!(a.workers[0].max_gap_us, 5_000_000);
        assert_eq!(a.baseline.max_gap_us, 5_000_000);
        assert_eq!(a.workers[0].retries, 4);
        assert_eq!(a.workers[1], WorkerStats::default());
    }

    #[test]
    fn json_has_the_summary_and_every_restart() {
        let rs = [restart(1, 1.0, "follower"), restart(2, 2.0, "leader")];
        let w = WorkerLog {
            done_us: vec![500_000, 1_100_000, 1_150_000, 2_300_000],
            ..WorkerLog::default()
        };
        let a = analyse(0.0, 2_300_000, &[w], &rs);
        let j = to_json(&a, &rs, "\"system\":\"x\"", 2.3);
        let v = crate::json::parse(&j).unwrap();
        assert_eq!(v.str("system"), Some("x"));
        assert_eq!(v.num("max_gap_ms"), Some(1150.0));
        assert_eq!(v.num("restart_max_gap.count"), Some(2.0));
        assert_eq!(v.num("restart_max_gap.p50_ms"), Some(600.0));
        assert_eq!(v.num("leader_restart_max_gap.max_ms"), Some(1150.0));
        assert_eq!(v.num("follower_restart_max_gap.max_ms"), Some(600.0));
        assert_eq!(v.num("replace.count"), Some(0.0));
        match v.get("restarts") {
            Some(crate::json::Value::Arr(r)) => {
                assert_eq!(r.len(), 2);
                assert_eq!(r[1].num("stop_ms"), Some(10.0));
                assert_eq!(r[1].num("rejoin_ms"), Some(480.0));
                assert_eq!(r[1].get("new_node"), Some(&crate::json::Value::Null));
                assert_eq!(r[1].get("replaced_ms"), Some(&crate::json::Value::Null));
                assert_eq!(r[0].num("max_gap_ended_ms"), Some(100.0));
                assert_eq!(r[1].num("max_gap_ended_ms"), Some(300.0));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=15).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 8.0);
        assert_eq!(percentile(&v, 99.0), 15.0);
    }
}
