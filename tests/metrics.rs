//! Unit tests of the metrics registry's text output and of the scrape endpoint
//! over a real TCP socket.

mod common;
use common::promtool_check_metrics;
use ringlock::metrics::{self, Action, Metrics, Outcome, SessionOp};
use ringlock::protocol::session::Status;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn known_updates() -> Metrics {
    let m = Metrics::new();
    m.request(Action::Lock, Outcome::Ok);
    m.request(Action::Lock, Outcome::Ok);
    m.request(Action::TryLock, Outcome::Busy);
    m.request(Action::Unlock, Outcome::Error);
    m.request(Action::AdminRsbs, Outcome::Ok);
    m.session_request(SessionOp::Hello, Status::Ok);
    m.session_request(SessionOp::Acquire, Status::Ok);
    m.session_request(SessionOp::Acquire, Status::Ok);
    m.session_request(SessionOp::Acquire, Status::Busy);
    m.session_request(SessionOp::Acquire, Status::TimedOut);
    m.session_request(SessionOp::Release, Status::Stale);
    m.session_request(SessionOp::Resume, Status::UnknownSession);
    m.set_held_keys(3);
    m.set_shard_holders(0, [1, 3, 2]);
    m.set_queued_waiters(2);
    m.set_open_connections(7);
    m.grant();
    m.grant();
    m.handoff();
    m.hangup_withdrawal();
    m.undelivered_grant();
    m.reset(false);
    m.reset(true);
    m.reset(true);
    m.connection_refused();
    m.frame_timeout();
    m.observe_queue_wait_us(5); // le 0.00001
    m.observe_queue_wait_us(2_500); // le 0.0025 (bounds are inclusive)
    m.observe_hold_us(1_500_000); // le 2.5
    m.observe_hold_us(20_000_000); // only +Inf
    m.set_oldest_acquired_unix_ms(1_000_000);
    m.observe_fdatasync_us(300); // le 0.0005
    m.observe_wal_batch(1, 60);
    m.observe_wal_batch(3, 180);
    m.observe_wal_batch(2000, 120_000); // only +Inf
    m.wal_compaction();
    m.wal_io_error();
    m.set_recovery_us(1_234_567);
    m.set_ready();
    m
}

fn render(m: &Metrics, now_unix_ms: u64) -> String {
    let mut out = String::new();
    m.render(&mut out, now_unix_ms);
    out
}

/// Every line checked by hand against `known_updates()`; scrape time is
/// 61.5 s after the oldest acquire.
const KNOWN_RENDER: &str = r#"# HELP ringlock_held_keys Keys currently held.
# TYPE ringlock_held_keys gauge
ringlock_held_keys 3
# HELP ringlock_holders Holders currently, by how they hold their key (a shared key's readers and a semaphore's holders each count).
# TYPE ringlock_holders gauge
ringlock_holders{access="exclusive"} 1
ringlock_holders{access="shared"} 3
ringlock_holders{access="semaphore"} 2
# HELP ringlock_queued_waiters Lock requests currently queued behind a holder.
# TYPE ringlock_queued_waiters gauge
ringlock_queued_waiters 2
# HELP ringlock_open_connections Client connections currently open (lock and admin ports).
# TYPE ringlock_open_connections gauge
ringlock_open_connections 7
# HELP ringlock_requests_total Requests answered, by protocol (lc, admin, session), action and result (lc and admin: + ok, # busy, - error; session: the Reply's status).
# TYPE ringlock_requests_total counter
ringlock_requests_total{protocol="lc",action="lock",result="ok"} 2
ringlock_requests_total{protocol="lc",action="lock",result="busy"} 0
ringlock_requests_total{protocol="lc",action="lock",result="error"} 0
ringlock_requests_total{protocol="lc",action="unlock",result="ok"} 0
ringlock_requests_total{protocol="lc",action="unlock",result="busy"} 0
ringlock_requests_total{protocol="lc",action="unlock",result="error"} 1
ringlock_requests_total{protocol="lc",action="reset_by_key",result="ok"} 0
ringlock_requests_total{protocol="lc",action="reset_by_key",result="busy"} 0
ringlock_requests_total{protocol="lc",action="reset_by_key",result="error"} 0
ringlock_requests_total{protocol="lc",action="reset_by_source",result="ok"} 0
ringlock_requests_total{protocol="lc",action="reset_by_source",result="busy"} 0
ringlock_requests_total{protocol="lc",action="reset_by_source",result="error"} 0
ringlock_requests_total{protocol="lc",action="trylock",result="ok"} 0
ringlock_requests_total{protocol="lc",action="trylock",result="busy"} 1
ringlock_requests_total{protocol="lc",action="trylock",result="error"} 0
ringlock_requests_total{protocol="admin",action="admin_keys",result="ok"} 0
ringlock_requests_total{protocol="admin",action="admin_keys",result="busy"} 0
ringlock_requests_total{protocol="admin",action="admin_keys",result="error"} 0
ringlock_requests_total{protocol="admin",action="admin_rset",result="ok"} 0
ringlock_requests_total{protocol="admin",action="admin_rset",result="busy"} 0
ringlock_requests_total{protocol="admin",action="admin_rset",result="error"} 0
ringlock_requests_total{protocol="admin",action="admin_rsbs",result="ok"} 1
ringlock_requests_total{protocol="admin",action="admin_rsbs",result="busy"} 0
ringlock_requests_total{protocol="admin",action="admin_rsbs",result="error"} 0
ringlock_requests_total{protocol="session",action="hello",result="ok"} 1
ringlock_requests_total{protocol="session",action="hello",result="invalid"} 0
ringlock_requests_total{protocol="session",action="hello",result="unauthorized"} 0
ringlock_requests_total{protocol="session",action="hello",result="unsupported_version"} 0
ringlock_requests_total{protocol="session",action="hello",result="not_leader"} 0
ringlock_requests_total{protocol="session",action="acquire",result="ok"} 2
ringlock_requests_total{protocol="session",action="acquire",result="timed_out"} 1
ringlock_requests_total{protocol="session",action="acquire",result="busy"} 1
ringlock_requests_total{protocol="session",action="acquire",result="invalid"} 0
ringlock_requests_total{protocol="session",action="acquire",result="limit_reached"} 0
ringlock_requests_total{protocol="session",action="acquire",result="cancelled"} 0
ringlock_requests_total{protocol="session",action="release",result="ok"} 0
ringlock_requests_total{protocol="session",action="release",result="not_owner"} 0
ringlock_requests_total{protocol="session",action="release",result="stale_token"} 1
ringlock_requests_total{protocol="session",action="release",result="invalid"} 0
ringlock_requests_total{protocol="session",action="release",result="limit_reached"} 0
ringlock_requests_total{protocol="session",action="extend",result="ok"} 0
ringlock_requests_total{protocol="session",action="extend",result="not_owner"} 0
ringlock_requests_total{protocol="session",action="extend",result="stale_token"} 0
ringlock_requests_total{protocol="session",action="extend",result="invalid"} 0
ringlock_requests_total{protocol="session",action="extend",result="limit_reached"} 0
ringlock_requests_total{protocol="session",action="cancel",result="ok"} 0
ringlock_requests_total{protocol="session",action="cancel",result="invalid"} 0
ringlock_requests_total{protocol="session",action="cancel",result="limit_reached"} 0
ringlock_requests_total{protocol="session",action="cancel",result="not_queued"} 0
ringlock_requests_total{protocol="session",action="ping",result="ok"} 0
ringlock_requests_total{protocol="session",action="ping",result="invalid"} 0
ringlock_requests_total{protocol="session",action="resume",result="ok"} 0
ringlock_requests_total{protocol="session",action="resume",result="invalid"} 0
ringlock_requests_total{protocol="session",action="resume",result="unauthorized"} 0
ringlock_requests_total{protocol="session",action="resume",result="unsupported_version"} 0
ringlock_requests_total{protocol="session",action="resume",result="not_leader"} 0
ringlock_requests_total{protocol="session",action="resume",result="unknown_session"} 1
ringlock_requests_total{protocol="session",action="watch",result="ok"} 0
ringlock_requests_total{protocol="session",action="watch",result="invalid"} 0
ringlock_requests_total{protocol="session",action="watch",result="limit_reached"} 0
ringlock_requests_total{protocol="session",action="unwatch",result="ok"} 0
ringlock_requests_total{protocol="session",action="unwatch",result="invalid"} 0
ringlock_requests_total{protocol="session",action="unwatch",result="not_queued"} 0
ringlock_requests_total{protocol="session",action="proclaim",result="ok"} 0
ringlock_requests_total{protocol="session",action="proclaim",result="not_owner"} 0
ringlock_requests_total{protocol="session",action="proclaim",result="stale_token"} 0
ringlock_requests_total{protocol="session",action="proclaim",result="invalid"} 0
ringlock_requests_total{protocol="session",action="proclaim",result="limit_reached"} 0
# HELP ringlock_grants_total Locks granted, immediately or after waiting.
# TYPE ringlock_grants_total counter
ringlock_grants_total 2
# HELP ringlock_grants_by_access_total Locks granted, by how they hold their key.
# TYPE ringlock_grants_by_access_total counter
ringlock_grants_by_access_total{access="exclusive"} 2
ringlock_grants_by_access_total{access="shared"} 0
ringlock_grants_by_access_total{access="semaphore"} 0
# HELP ringlock_handoffs_total Grants to a waiter that had been queued.
# TYPE ringlock_handoffs_total counter
ringlock_handoffs_total 1
# HELP ringlock_hangup_withdrawals_total Queued lock requests withdrawn because the client hung up.
# TYPE ringlock_hangup_withdrawals_total counter
ringlock_hangup_withdrawals_total 1
# HELP ringlock_undelivered_grants_total Grants released again because the client was gone before its + could be delivered.
# TYPE ringlock_undelivered_grants_total counter
ringlock_undelivered_grants_total 1
# HELP ringlock_sessions_opened_total Session connections opened (Hello).
# TYPE ringlock_sessions_opened_total counter
ringlock_sessions_opened_total 0
# HELP ringlock_sessions_resumed_total Replicated sessions taken over by a new connection (Resume), after a failover or from a connection the server still had.
# TYPE ringlock_sessions_resumed_total counter
ringlock_sessions_resumed_total 0
# HELP ringlock_sessions_ended_total Sessions ended: connection closed or failed, or keep-alive deadline passed.
# TYPE ringlock_sessions_ended_total counter
ringlock_sessions_ended_total 0
# HELP ringlock_sessions_expired_total Sessions ended because nothing arrived from the client within its keep-alive deadline.
# TYPE ringlock_sessions_expired_total counter
ringlock_sessions_expired_total 0
# HELP ringlock_lost_pushed_total Lost messages pushed to sessions (a lease expired, or an operator reset a hold).
# TYPE ringlock_lost_pushed_total counter
ringlock_lost_pushed_total 0
# HELP ringlock_watches Key watches open (session Watch).
# TYPE ringlock_watches gauge
ringlock_watches 0
# HELP ringlock_watch_events_total Events pushed to key watches (a grant or a release of a watched key; not the holders listed when a watch begins).
# TYPE ringlock_watch_events_total counter
ringlock_watch_events_total 0
# HELP ringlock_idle_timeouts_total Connections closed after --idle-timeout without traffic and without a request in flight.
# TYPE ringlock_idle_timeouts_total counter
ringlock_idle_timeouts_total 0
# HELP ringlock_auth_failures_total Session hellos and admin connections refused for a missing or wrong auth token.
# TYPE ringlock_auth_failures_total counter
ringlock_auth_failures_total 0
# HELP ringlock_lc_actions_refused_total Lock-port Unlock, ResetByKey and ResetBySource refused by --lc-admin-actions.
# TYPE ringlock_lc_actions_refused_total counter
ringlock_lc_actions_refused_total 0
# HELP ringlock_resets_total Operator resets, one per key (ResetByKey, RSET) or source (ResetBySource, RSBS) named.
# TYPE ringlock_resets_total counter
ringlock_resets_total{by="key"} 1
ringlock_resets_total{by="source"} 2
# HELP ringlock_connections_refused_total Connections refused because the connection limit was reached.
# TYPE ringlock_connections_refused_total counter
ringlock_connections_refused_total 1
# HELP ringlock_frame_timeouts_total Connections closed because a request frame did not complete in time.
# TYPE ringlock_frame_timeouts_total counter
ringlock_frame_timeouts_total 1
# HELP ringlock_queue_wait_seconds Time a lock request waited in a queue before its grant.
# TYPE ringlock_queue_wait_seconds histogram
ringlock_queue_wait_seconds_bucket{le="0.00001"} 1
ringlock_queue_wait_seconds_bucket{le="0.000025"} 1
ringlock_queue_wait_seconds_bucket{le="0.00005"} 1
ringlock_queue_wait_seconds_bucket{le="0.0001"} 1
ringlock_queue_wait_seconds_bucket{le="0.00025"} 1
ringlock_queue_wait_seconds_bucket{le="0.0005"} 1
ringlock_queue_wait_seconds_bucket{le="0.001"} 1
ringlock_queue_wait_seconds_bucket{le="0.0025"} 2
ringlock_queue_wait_seconds_bucket{le="0.005"} 2
ringlock_queue_wait_seconds_bucket{le="0.01"} 2
ringlock_queue_wait_seconds_bucket{le="0.025"} 2
ringlock_queue_wait_seconds_bucket{le="0.05"} 2
ringlock_queue_wait_seconds_bucket{le="0.1"} 2
ringlock_queue_wait_seconds_bucket{le="0.25"} 2
ringlock_queue_wait_seconds_bucket{le="0.5"} 2
ringlock_queue_wait_seconds_bucket{le="1"} 2
ringlock_queue_wait_seconds_bucket{le="2.5"} 2
ringlock_queue_wait_seconds_bucket{le="5"} 2
ringlock_queue_wait_seconds_bucket{le="10"} 2
ringlock_queue_wait_seconds_bucket{le="+Inf"} 2
ringlock_queue_wait_seconds_sum 0.002505
ringlock_queue_wait_seconds_count 2
# HELP ringlock_hold_seconds Time a key was held, observed at its release.
# TYPE ringlock_hold_seconds histogram
ringlock_hold_seconds_bucket{le="0.00001"} 0
ringlock_hold_seconds_bucket{le="0.000025"} 0
ringlock_hold_seconds_bucket{le="0.00005"} 0
ringlock_hold_seconds_bucket{le="0.0001"} 0
ringlock_hold_seconds_bucket{le="0.00025"} 0
ringlock_hold_seconds_bucket{le="0.0005"} 0
ringlock_hold_seconds_bucket{le="0.001"} 0
ringlock_hold_seconds_bucket{le="0.0025"} 0
ringlock_hold_seconds_bucket{le="0.005"} 0
ringlock_hold_seconds_bucket{le="0.01"} 0
ringlock_hold_seconds_bucket{le="0.025"} 0
ringlock_hold_seconds_bucket{le="0.05"} 0
ringlock_hold_seconds_bucket{le="0.1"} 0
ringlock_hold_seconds_bucket{le="0.25"} 0
ringlock_hold_seconds_bucket{le="0.5"} 0
ringlock_hold_seconds_bucket{le="1"} 0
ringlock_hold_seconds_bucket{le="2.5"} 1
ringlock_hold_seconds_bucket{le="5"} 1
ringlock_hold_seconds_bucket{le="10"} 1
ringlock_hold_seconds_bucket{le="+Inf"} 2
ringlock_hold_seconds_sum 21.5
ringlock_hold_seconds_count 2
# HELP ringlock_oldest_hold_seconds Age of the oldest currently held key; 0 when no key is held.
# TYPE ringlock_oldest_hold_seconds gauge
ringlock_oldest_hold_seconds 61.5
# HELP ringlock_wal_fdatasync_seconds Latency of WAL fdatasync calls.
# TYPE ringlock_wal_fdatasync_seconds histogram
ringlock_wal_fdatasync_seconds_bucket{le="0.00001"} 0
ringlock_wal_fdatasync_seconds_bucket{le="0.000025"} 0
ringlock_wal_fdatasync_seconds_bucket{le="0.00005"} 0
ringlock_wal_fdatasync_seconds_bucket{le="0.0001"} 0
ringlock_wal_fdatasync_seconds_bucket{le="0.00025"} 0
ringlock_wal_fdatasync_seconds_bucket{le="0.0005"} 1
ringlock_wal_fdatasync_seconds_bucket{le="0.001"} 1
ringlock_wal_fdatasync_seconds_bucket{le="0.0025"} 1
ringlock_wal_fdatasync_seconds_bucket{le="0.005"} 1
ringlock_wal_fdatasync_seconds_bucket{le="0.01"} 1
ringlock_wal_fdatasync_seconds_bucket{le="0.025"} 1
ringlock_wal_fdatasync_seconds_bucket{le="0.05"} 1
ringlock_wal_fdatasync_seconds_bucket{le="0.1"} 1
ringlock_wal_fdatasync_seconds_bucket{le="0.25"} 1
ringlock_wal_fdatasync_seconds_bucket{le="0.5"} 1
ringlock_wal_fdatasync_seconds_bucket{le="1"} 1
ringlock_wal_fdatasync_seconds_bucket{le="2.5"} 1
ringlock_wal_fdatasync_seconds_bucket{le="5"} 1
ringlock_wal_fdatasync_seconds_bucket{le="10"} 1
ringlock_wal_fdatasync_seconds_bucket{le="+Inf"} 1
ringlock_wal_fdatasync_seconds_sum 0.0003
ringlock_wal_fdatasync_seconds_count 1
# HELP ringlock_wal_batch_records Records per WAL group-commit batch.
# TYPE ringlock_wal_batch_records histogram
ringlock_wal_batch_records_bucket{le="1"} 1
ringlock_wal_batch_records_bucket{le="2"} 1
ringlock_wal_batch_records_bucket{le="4"} 2
ringlock_wal_batch_records_bucket{le="8"} 2
ringlock_wal_batch_records_bucket{le="16"} 2
ringlock_wal_batch_records_bucket{le="32"} 2
ringlock_wal_batch_records_bucket{le="64"} 2
ringlock_wal_batch_records_bucket{le="128"} 2
ringlock_wal_batch_records_bucket{le="256"} 2
ringlock_wal_batch_records_bucket{le="512"} 2
ringlock_wal_batch_records_bucket{le="1024"} 2
ringlock_wal_batch_records_bucket{le="+Inf"} 3
ringlock_wal_batch_records_sum 2004
ringlock_wal_batch_records_count 3
# HELP ringlock_wal_bytes_written_total Bytes appended to the WAL.
# TYPE ringlock_wal_bytes_written_total counter
ringlock_wal_bytes_written_total 120240
# HELP ringlock_wal_compactions_total WAL compactions completed.
# TYPE ringlock_wal_compactions_total counter
ringlock_wal_compactions_total 1
# HELP ringlock_wal_recovery_seconds Time the last start-up spent replaying the WAL.
# TYPE ringlock_wal_recovery_seconds gauge
ringlock_wal_recovery_seconds 1.234567
# HELP ringlock_wal_io_errors_total WAL write or fdatasync failures.
# TYPE ringlock_wal_io_errors_total counter
ringlock_wal_io_errors_total 1
# HELP ringlock_ready 1 once WAL recovery is done and the server accepts requests.
# TYPE ringlock_ready gauge
ringlock_ready 1
# HELP ringlock_build_info Build information; the value is always 1.
# TYPE ringlock_build_info gauge
ringlock_build_info{version="{VERSION}"} 1
"#;

#[test]
fn render_matches_known_updates_exactly() {
    let expected = KNOWN_RENDER.replace("{VERSION}", env!("CARGO_PKG_VERSION"));
    let got = render(&known_updates(), 1_061_500);
    for (i, (g, e)) in got.lines().zip(expected.lines()).enumerate() {
        assert_eq!(g, e, "line {}", i + 1);
    }
    assert_eq!(got, expected);
}

#[test]
fn fresh_registry_renders_every_series_at_zero() {
    let got = render(&Metrics::new(), 123_456);
    // Same series, same order, as the known render: nothing appears lazily.
    let names = |s: &str| -> Vec<String> {
        s.lines()
            .map(|l| l.rsplit_once(' ').map_or(l, |(name, _)| name).to_string())
            .collect()
    };
    let expected = KNOWN_RENDER.replace("{VERSION}", env!("CARGO_PKG_VERSION"));
    assert_eq!(names(&got), names(&expected));
    for line in got.lines().filter(|l| !l.starts_with('#')) {
        let value = line.rsplit_once(' ').expect("name value").1;
        let want = if line.starts_with("ringlock_build_info") {
            "1"
        } else {
            "0"
        };
        assert_eq!(value, want, "{line}");
    }
}

#[test]
fn oldest_hold_is_computed_at_scrape_time_and_zero_when_none() {
    let m = Metrics::new();
    let age = |m: &Metrics, now| {
        render(m, now)
            .lines()
            .find_map(|l| l.strip_prefix("ringlock_oldest_hold_seconds "))
            .expect("oldest hold line")
            .to_string()
    };
    assert_eq!(age(&m, 5_000), "0");
    m.set_oldest_acquired_unix_ms(1_000);
    assert_eq!(age(&m, 1_000), "0");
    assert_eq!(age(&m, 1_001), "0.001");
    assert_eq!(age(&m, 301_000), "300");
    // A clock that stepped back never yields a negative or huge age.
    assert_eq!(age(&m, 10), "0");
    m.set_oldest_acquired_unix_ms(0);
    assert_eq!(age(&m, 301_000), "0");
}

#[test]
fn updates_from_many_threads_are_all_counted() {
    let m = Arc::new(Metrics::new());
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                for i in 0..10_000u64 {
                    m.grant();
                    m.request(Action::Lock, Outcome::Ok);
                    m.observe_hold_us(i);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("updater thread");
    }
    let out = render(&m, 0);
    assert!(out.contains("\nringlock_grants_total 40000\n"));
    assert!(out.contains(
        "ringlock_requests_total{protocol=\"lc\",action=\"lock\",result=\"ok\"} 40000\n"
    ));
    assert!(out.contains("\nringlock_hold_seconds_count 40000\n"));
    assert!(out.contains("\nringlock_hold_seconds_bucket{le=\"+Inf\"} 40000\n"));
    // 4 × (0 + 1 + … + 9999) µs = 199.98 s
    assert!(out.contains("\nringlock_hold_seconds_sum 199.98\n"));
}

#[test]
fn rendered_text_passes_promtool_when_available() {
    let text = render(&known_updates(), 1_061_500);
    if !promtool_check_metrics(&text) {
        panic!("promtool check metrics rejected the output:\n{text}");
    }
}

// ---- the scrape endpoint over real TCP ----

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid address")
}

/// Serves `m` on an ephemeral loopback port with the defaults changed by `f`.
fn serve_with(m: Arc<Metrics>, f: impl FnOnce(&mut metrics::Options)) -> SocketAddr {
    let mut o = metrics::Options::default();
    f(&mut o);
    metrics::serve_with(loopback(), m, o).expect("bind")
}

/// Sends `request`, half-closes, and reads the whole answer.
fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(request).expect("send");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read answer");
    answer
}

fn get(addr: SocketAddr, path: &str) -> String {
    exchange(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes(),
    )
}

fn status_of(answer: &str) -> u16 {
    answer
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"))
}

fn body_of(answer: &str) -> &str {
    answer.split_once("\r\n\r\n").expect("head and body").1
}

#[test]
fn serves_metrics_and_health_over_tcp() {
    let m = Arc::new(Metrics::new());
    let addr = metrics::serve(loopback(), Arc::clone(&m)).expect("bind");
    assert_ne!(addr.port(), 0);

    let health = get(addr, "/healthz");
    assert_eq!(status_of(&health), 503, "{health}");

    m.set_ready();
    m.grant();
    m.request(Action::TryLock, Outcome::Busy);
    let health = get(addr, "/healthz");
    assert_eq!(status_of(&health), 200, "{health}");
    assert_eq!(body_of(&health), "ok\n");

    let answer = get(addr, "/metrics");
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert!(answer.contains("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
    assert!(answer.contains("\r\nConnection: close\r\n"));
    let body = body_of(&answer);
    let length: usize = answer
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .expect("Content-Length")
        .trim()
        .parse()
        .expect("a number");
    assert_eq!(length, body.len());
    // No key held, so the output is independent of the scrape time.
    assert_eq!(body, render(&m, 0));
    assert!(body.contains("\nringlock_grants_total 1\n"));
    assert!(body.contains(
        "ringlock_requests_total{protocol=\"lc\",action=\"trylock\",result=\"busy\"} 1\n"
    ));
    assert!(promtool_check_metrics(body), "promtool rejected the scrape");

    // A query string is ignored, as Prometheus' params would be.
    assert_eq!(status_of(&get(addr, "/metrics?format=text")), 200);
}

#[test]
fn unknown_paths_methods_and_malformed_requests() {
    let addr = metrics::serve(loopback(), Arc::new(Metrics::new())).expect("bind");
    assert_eq!(status_of(&get(addr, "/")), 404);
    assert_eq!(status_of(&get(addr, "/metricsx")), 404);

    let post = exchange(addr, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(status_of(&post), 405, "{post}");
    assert!(post.contains("\r\nAllow: GET\r\n"));

    for bad in [
        &b"GARBAGE\r\n\r\n"[..],
        b"GET /metrics\r\n\r\n",
        b"GET /metrics HTTP/9.9\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
        b"\x00\xff\xfe\r\n\r\n",
    ] {
        let answer = exchange(addr, bad);
        assert_eq!(status_of(&answer), 400, "{bad:?} -> {answer}");
    }

    // Head cut off by EOF: 400, not a hang.
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(b"GET /metr").expect("send");
    s.shutdown(Shutdown::Write).expect("half-close");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read");
    assert_eq!(status_of(&answer), 400, "{answer}");

    // A head larger than the limit is refused, not buffered.
    let mut huge = b"GET /metrics HTTP/1.1\r\nX-Pad: ".to_vec();
    huge.resize(64 * 1024, b'a');
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    // The server may answer and close before all of it is written.
    let _ = s.write_all(&huge);
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    assert!(
        answer.starts_with(b"HTTP/1.1 431 "),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    // A client that connects and leaves costs nothing.
    drop(TcpStream::connect(addr).expect("connect"));

    // After all that abuse the endpoint still serves.
    assert_eq!(status_of(&get(addr, "/metrics")), 200);
}

/// GET with a read timeout of `within`: an answer that does not arrive in
/// time fails the read (the bounded wait the test asserts on).
fn get_within(addr: SocketAddr, path: &str, within: Duration) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(within)).expect("timeout");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes())
        .expect("send");
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .unwrap_or_else(|e| panic!("no answer to {path} within {within:?}: {e}"));
    answer
}

/// True while the server neither answered nor closed `s`.
fn still_open(s: &TcpStream) -> bool {
    s.set_nonblocking(true).expect("nonblocking");
    let mut b = [0u8; 1];
    let r = (&*s).read(&mut b);
    s.set_nonblocking(false).expect("blocking");
    matches!(r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

#[test]
fn eight_idle_connections_do_not_delay_health() {
    common::pin_current_thread();
    let m = Arc::new(Metrics::new());
    m.set_ready();
    m.loop_heartbeat(0, metrics::monotonic_ms());
    // Idle connections are not timed out during this test: any delay they
    // caused would show, not be hidden by their deadline.
    let addr = serve_with(Arc::clone(&m), |o| {
        o.request_timeout = Duration::from_secs(60);
    });
    let mut idle = Vec::new();
    for i in 0..8 {
        let mut s = TcpStream::connect(addr).expect("connect");
        if i % 2 == 0 {
            // Half send a partial head, half never send a byte.
            s.write_all(b"GET /metrics HTTP/1.1\r\nHo").expect("send");
        }
        idle.push(s);
    }
    // Served concurrently: each answer comes while all eight are still
    // waiting (the issue's bound: one second).
    for path in ["/healthz", "/readyz", "/livez", "/metrics"] {
        let answer = get_within(addr, path, Duration::from_secs(1));
        assert_eq!(status_of(&answer), 200, "{path}: {answer}");
    }
    for (i, s) in idle.iter().enumerate() {
        assert!(still_open(s), "idle connection {i} was answered or closed");
    }
}

#[test]
fn connections_beyond_the_bound_get_503_at_once_and_slots_come_back() {
    common::pin_current_thread();
    let m = Arc::new(Metrics::new());
    m.set_ready();
    let addr = serve_with(Arc::clone(&m), |o| {
        o.request_timeout = Duration::from_secs(60);
        o.connections_max = 4;
    });
    let mut idle: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    // The fifth is refused without waiting for its request.
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("503, then close");
    assert_eq!(status_of(&answer), 503, "{answer}");
    assert_eq!(
        body_of(&answer),
        "too many connections to the metrics endpoint\n"
    );
    assert!(idle.iter().all(still_open));

    // A connection that leaves frees its slot.
    drop(idle.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match status_of(&get(addr, "/healthz")) {
            200 => break,
            503 => assert!(Instant::now() < deadline, "the slot never came back"),
            other => panic!("/healthz answered {other}"),
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Status and body of one GET.
fn probe(addr: SocketAddr, path: &str) -> (u16, String) {
    let answer = get(addr, path);
    (status_of(&answer), body_of(&answer).to_string())
}

#[test]
fn readiness_waits_for_recovery_and_liveness_for_every_loop() {
    let m = Arc::new(Metrics::new_loops(2));
    assert_eq!(m.loops(), 2);
    let addr = serve_with(Arc::clone(&m), |o| {
        o.liveness_timeout = Duration::from_secs(60);
    });
    // Recovering: not ready, but not dead either (loops are not judged yet).
    assert_eq!(probe(addr, "/readyz"), (503, "recovering\n".into()));
    assert_eq!(probe(addr, "/healthz"), (503, "recovering\n".into()));
    let (code, body) = probe(addr, "/livez");
    assert_eq!(code, 200, "{body}");
    assert!(body.starts_with("starting"), "{body}");

    m.set_ready();
    let now = metrics::monotonic_ms();
    m.loop_heartbeat(0, now);
    m.loop_heartbeat(1, now);
    for path in ["/livez", "/readyz", "/healthz"] {
        assert_eq!(probe(addr, path), (200, "ok\n".into()), "{path}");
    }

    // Loop 1's last progress is past the bound: every probe but /metrics fails
    // and says which loop.
    m.loop_heartbeat(1, metrics::monotonic_ms() - 61_000);
    for path in ["/livez", "/readyz", "/healthz"] {
        let (code, body) = probe(addr, path);
        assert_eq!(code, 503, "{path}: {body}");
        assert!(
            body.starts_with("stalled: event loop 1 made no progress for "),
            "{path}: {body}"
        );
        assert!(body.ends_with(" ms (bound 60000 ms)\n"), "{path}: {body}");
    }
    assert_eq!(status_of(&get(addr, "/metrics")), 200);
    // Just inside the bound is live again.
    m.loop_heartbeat(1, metrics::monotonic_ms() - 30_000);
    assert_eq!(probe(addr, "/livez"), (200, "ok\n".into()));
}

/// The reported age from a `stalled: …` body.
fn stalled_age_ms(body: &str) -> u64 {
    body.split_once(" for ")
        .and_then(|(_, rest)| rest.split_once(" ms"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no age in {body:?}"))
}

#[test]
fn liveness_fails_within_its_bound_when_a_loop_stops() {
    // Loop 0 keeps beating; loop 1 never beats at all after readiness (a loop
    // that hung before its first tick).
    let m = Arc::new(Metrics::new_loops(2));
    let bound = Duration::from_millis(300);
    let addr = serve_with(Arc::clone(&m), |o| o.liveness_timeout = bound);
    m.set_ready();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let beater = {
        let (m, stop) = (Arc::clone(&m), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                m.loop_heartbeat(0, metrics::monotonic_ms());
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        let (code, body) = probe(addr, "/livez");
        if code == 503 {
            break body;
        }
        assert_eq!(code, 200, "{body}");
        assert!(Instant::now() < deadline, "liveness never failed");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(body.starts_with("stalled: event loop 1 "), "{body}");
    // Never before its bound.
    assert!(stalled_age_ms(&body) > 300, "{body}");
    assert_eq!(probe(addr, "/readyz").0, 503);
    // The process and the endpoint live on; a beat makes it live again.
    m.loop_heartbeat(1, metrics::monotonic_ms());
    assert_eq!(probe(addr, "/livez"), (200, "ok\n".into()));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    beater.join().expect("beater thread");
}

#[test]
fn a_trickling_scraper_cannot_extend_its_deadline() {
    let timeout = Duration::from_millis(300);
    let addr = serve_with(Arc::new(Metrics::new()), |o| o.request_timeout = timeout);
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_millis(20)))
        .expect("timeout");
    let mut answer = Vec::new();
    // One byte every 50 ms would take > 1 s for the whole request.
    for &b in b"GET /metrics HTTP/1.1\r\nHost: slow\r\n\r\n" {
        if s.write_all(&[b]).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        let mut buf = [0u8; 512];
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
        if !answer.is_empty() {
            break;
        }
    }
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let _ = s.read_to_end(&mut answer);
    // The trickle would complete the request after about 2 s and get a
    // 200 if each byte extended the deadline; a 408 proves it did not,
    // without timing anything.
    assert!(
        answer.starts_with(b"HTTP/1.1 408 "),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert_eq!(status_of(&get(addr, "/healthz")), 503);
}

#[test]
fn binding_a_port_in_use_is_an_error_for_the_caller() {
    let first = metrics::serve(loopback(), Arc::new(Metrics::new())).expect("bind");
    let second = metrics::serve(first, Arc::new(Metrics::new()));
    assert!(second.is_err(), "second bind of {first} succeeded");
}

/// Cluster mode: the `ringlock_raft_*` series pass promtool, follower lag
/// is exported only for the followers the leader reported (static peer
/// labels), and `/readyz` is 200 only while every shard serves.
#[test]
fn cluster_series_and_readiness_follow_every_shard_serving() {
    let m = Arc::new(Metrics::new_loops(2));
    let single = render(&m, 0);
    assert!(!single.contains("ringlock_raft_"), "single-node: none");
    m.enable_raft(2, &[1, 2, 3], 2);
    let r = m.raft().expect("enabled");
    let addr = serve_with(Arc::clone(&m), |o| {
        o.liveness_timeout = Duration::from_secs(60);
    });
    m.set_ready();
    let now = metrics::monotonic_ms();
    m.loop_heartbeat(0, now);
    m.loop_heartbeat(1, now);
    let (code, body) = probe(addr, "/readyz");
    assert_eq!(code, 503, "{body}");
    assert_eq!(
        body,
        "not serving: node 2 is not the serving leader of every shard (no leader known)\n"
    );
    let g = metrics::RaftGauges {
        term: 5,
        leader_id: 2,
        leader: true,
        serving: true,
        commit: 40,
        applied: 38,
        leader_changes: 3,
        forwards_parked: 4,
    };
    r.set_shard(0, &g);
    // One shard serving is not enough: clients of the other would be refused.
    assert_eq!(probe(addr, "/readyz").0, 503);
    assert_eq!(probe(addr, "/healthz").0, 503);
    r.set_shard(1, &g);
    assert_eq!(probe(addr, "/readyz"), (200, "ok\n".into()));
    assert_eq!(probe(addr, "/livez"), (200, "ok\n".into()));
    r.set_follower_lag(0, 1, Some(4));
    r.set_follower_lag(0, 3, Some(0));
    r.set_follower_lag(0, 9, Some(7)); // not a peer: ignored
    r.observe_commit_us(2_500);
    // Refused peer messages, per shard and reason: summed over shards.
    let mut dropped = [0u64; ringlock::cluster::check::Reason::COUNT];
    dropped[ringlock::cluster::check::Reason::Index.index()] = 2;
    r.set_dropped(0, &dropped);
    dropped[ringlock::cluster::check::Reason::From.index()] = 1;
    r.set_dropped(1, &dropped);
    let text = render(&m, 0);
    assert!(promtool_check_metrics(&text), "promtool rejected:\n{text}");
    for line in [
        "ringlock_raft_node_id 2",
        "ringlock_raft_term{shard=\"1\"} 5",
        "ringlock_raft_leader{shard=\"0\"} 1",
        "ringlock_raft_serving{shard=\"1\"} 1",
        "ringlock_raft_leader_changes_total{shard=\"0\"} 3",
        "ringlock_raft_apply_lag{shard=\"0\"} 2",
        "ringlock_lc_forwards_parked{shard=\"1\"} 4",
        "ringlock_raft_follower_lag{shard=\"0\",peer=\"1\"} 4",
        "ringlock_raft_follower_lag{shard=\"0\",peer=\"3\"} 0",
        "ringlock_raft_commit_latency_seconds_bucket{le=\"0.0025\"} 1",
        "ringlock_raft_commit_latency_seconds_count 1",
        "ringlock_raft_messages_dropped_total{reason=\"index\"} 4",
        "ringlock_raft_messages_dropped_total{reason=\"from\"} 1",
        "ringlock_raft_messages_dropped_total{reason=\"payload\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
    }
    assert_eq!(text.matches("ringlock_raft_follower_lag{").count(), 2);
    // Stepping down: no lag reported, not ready.
    r.clear_follower_lag(0);
    r.set_shard(
        0,
        &metrics::RaftGauges {
            leader: false,
            serving: false,
            leader_id: 1,
            ..g
        },
    );
    assert!(!render(&m, 0).contains("ringlock_raft_follower_lag{"));
    let (code, body) = probe(addr, "/readyz");
    assert_eq!(code, 503);
    assert!(body.contains("the leader is node 1"), "{body}");
}
