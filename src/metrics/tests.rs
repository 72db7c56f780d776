//! The metrics' unit tests: the histograms, the text rendering.

use std::sync::atomic::Ordering::Relaxed;

use crate::protocol::session::{self as sp, Status};

use super::histogram::{push_seconds, LatencyHistogram};
use super::*;

fn seconds(us: u64) -> String {
    let mut s = String::new();
    push_seconds(&mut s, us);
    s
}

#[test]
fn seconds_are_exact_decimals() {
    assert_eq!(seconds(0), "0");
    assert_eq!(seconds(10), "0.00001");
    assert_eq!(seconds(2_500), "0.0025");
    assert_eq!(seconds(1_000_000), "1");
    assert_eq!(seconds(2_500_000), "2.5");
    assert_eq!(seconds(10_000_001), "10.000001");
}

#[test]
fn each_loop_counts_on_its_own_cache_lines_and_a_scrape_sums_them() {
    let m = Metrics::new_loops(2);
    let (a, b) = (
        m.at(0) as *const Hot as usize,
        m.at(1) as *const Hot as usize,
    );
    assert_eq!(std::mem::align_of::<Hot>(), 128);
    assert!(
        b - a >= 128 && a % 128 == 0,
        "two loops' counters share a line"
    );
    m.at(0).request(Action::Lock, Outcome::Ok);
    m.at(1).request(Action::Lock, Outcome::Ok);
    m.at(1).grant();
    m.at(0).grant();
    m.at(1).handoff();
    m.at(0).observe_hold_us(10);
    m.at(1).observe_hold_us(3_000_000);
    m.at(1).observe_queue_wait_us(30);
    assert_eq!(m.requests(Action::Lock, Outcome::Ok), 2);
    let mut out = String::new();
    m.render(&mut out, 0);
    for line in [
        "ringlock_grants_total 2",
        "ringlock_handoffs_total 1",
        "ringlock_hold_seconds_bucket{le=\"0.00001\"} 1",
        "ringlock_hold_seconds_bucket{le=\"+Inf\"} 2",
        "ringlock_hold_seconds_sum 3.00001",
        "ringlock_queue_wait_seconds_count 1",
    ] {
        assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
    }
}

#[test]
fn session_statuses_are_indexed_by_their_byte_and_ops_by_theirs() {
    for (i, st) in SESSION_STATUSES.iter().enumerate() {
        assert_eq!(*st as usize, i, "{st:?}");
        assert_eq!(Status::from_byte(i as u8), Some(*st));
    }
    assert_eq!(Status::from_byte(SESSION_STATUSES.len() as u8), None);
    for (i, op) in SessionOp::ALL.iter().enumerate() {
        assert_eq!(op.index(), i);
    }
    // Ops 7..=13 in order; 14 (Locate) opens no session; then Watch,
    // Unwatch, Proclaim.
    for (i, op) in SessionOp::ALL[..7].iter().enumerate() {
        assert_eq!(SessionOp::from_byte(sp::OP_HELLO + i as u8), Some(*op));
    }
    assert_eq!(SessionOp::from_byte(sp::OP_WATCH), Some(SessionOp::Watch));
    assert_eq!(
        SessionOp::from_byte(sp::OP_UNWATCH),
        Some(SessionOp::Unwatch)
    );
    assert_eq!(
        SessionOp::from_byte(sp::OP_PROCLAIM),
        Some(SessionOp::Proclaim)
    );
    assert_eq!(SessionOp::from_byte(sp::OP_HELLO - 1), None);
    assert_eq!(SessionOp::from_byte(sp::OP_LOCATE), None);
    assert_eq!(SessionOp::from_byte(sp::OP_PROCLAIM + 1), None);
}

#[test]
fn session_series_exist_at_zero_and_any_counted_status_shows() {
    let m = Metrics::new_loops(2);
    let line = |out: &str, op: &str, st: &str| {
        let prefix = format!(
            "ringlock_requests_total{{protocol=\"session\",action=\"{op}\",result=\"{st}\"}} "
        );
        out.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()).map(str::to_string))
    };
    let mut out = String::new();
    m.render(&mut out, 0);
    assert_eq!(line(&out, "acquire", "busy").as_deref(), Some("0"));
    assert_eq!(line(&out, "hello", "not_leader").as_deref(), Some("0"));
    assert_eq!(line(&out, "ping", "busy"), None, "not a status of Ping");
    assert_eq!(
        line(&out, "lock", "ok"),
        None,
        "LC actions are not session series"
    );
    assert!(
        out.contains("ringlock_requests_total{protocol=\"lc\",action=\"lock\",result=\"ok\"} 0\n")
    );
    assert!(out.contains(
        "ringlock_requests_total{protocol=\"admin\",action=\"admin_keys\",result=\"ok\"} 0\n"
    ));
    m.at(0).session_request(SessionOp::Acquire, Status::Busy);
    m.at(1).session_request(SessionOp::Acquire, Status::Busy);
    m.at(1)
        .session_request(SessionOp::Ping, Status::ServerError);
    assert_eq!(m.session_requests(SessionOp::Acquire, Status::Busy), 2);
    let mut out = String::new();
    m.render(&mut out, 0);
    assert_eq!(line(&out, "acquire", "busy").as_deref(), Some("2"));
    assert_eq!(line(&out, "ping", "server_error").as_deref(), Some("1"));
}

#[test]
fn histogram_buckets_are_inclusive_upper_bounds() {
    let h = LatencyHistogram::new(&LATENCY_BOUNDS_US);
    h.observe(0);
    h.observe(10);
    h.observe(11);
    h.observe(10_000_000);
    h.observe(10_000_001);
    assert_eq!(h.buckets[0].load(Relaxed), 2);
    assert_eq!(h.buckets[1].load(Relaxed), 1);
    assert_eq!(h.buckets[18].load(Relaxed), 1);
    assert_eq!(h.buckets[19].load(Relaxed), 1);
    assert_eq!(h.count(), 5);
    assert_eq!(h.sum(), 20_000_022);
}
