//! End to end: the real `ringlockd`'s probes. An idle server stays live (its
//! event loop wakes to publish heartbeats even with nothing to do), idle
//! connections to the metrics port do not delay `/healthz`, and the liveness
//! flag is checked. (A stalled loop is simulated against the HTTP endpoint
//! itself in `tests/metrics.rs`: stopping the real process would stop the
//! HTTP thread too.)

mod common;

use common::Server;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

/// Status and body of one GET, which must be answered within `within`.
fn get_within(addr: SocketAddr, path: &str, within: Duration) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics port");
    s.set_read_timeout(Some(within)).expect("timeout");
    write!(s, "GET {path} HTTP/1.1\r\nHost: ringlock\r\n\r\n").expect("send request");
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .unwrap_or_else(|e| panic!("no answer to {path} within {within:?}: {e}"));
    let status = answer
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    get_within(addr, path, Duration::from_secs(10))
}

/// Waits (bounded) until `/readyz` answers 200.
fn wait_ready(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = get(addr, "/readyz");
        if status == 200 {
            assert_eq!(body, "ok\n");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never became 200: {body}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_idle_server_stays_live_over_several_heartbeat_intervals() {
    // The bound is three heartbeat intervals (500 ms): a loop that slept in
    // io_uring without a timeout while idle would fail it within 1.5 s.
    let server = Server::start(&[
        "--metrics-bind",
        "127.0.0.1:0",
        "--liveness-timeout-ms",
        "1500",
    ]);
    let maddr = server.metrics_addr.expect("metrics= in the listening line");
    wait_ready(maddr);
    // Nothing touches the lock or admin port from here on: the loop is idle
    // for twice the liveness bound, and every probe must say it is live.
    let window = Duration::from_secs(3);
    let start = Instant::now();
    let mut probes = 0;
    while start.elapsed() < window {
        for path in ["/livez", "/healthz"] {
            let (status, body) = get(maddr, path);
            assert_eq!(
                (status, body.as_str()),
                (200, "ok\n"),
                "{path} after {:?} idle",
                start.elapsed()
            );
        }
        probes += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(probes >= 10, "only {probes} probes in {window:?}");
    // And the loop still serves.
    assert_eq!(server.connect().try_lock(b"k", b"s"), b'+');
}

#[test]
fn eight_idle_scrapers_do_not_delay_healthz() {
    let server = Server::start(&["--metrics-bind", "127.0.0.1:0"]);
    let maddr = server.metrics_addr.expect("metrics= in the listening line");
    wait_ready(maddr);
    let mut idle = Vec::new();
    for i in 0..8 {
        let mut s = TcpStream::connect(maddr).expect("connect");
        if i % 2 == 0 {
            s.write_all(b"GET /metrics HTTP/1.1\r\nHo").expect("send");
        }
        idle.push(s);
    }
    // Served one connection at a time, this took 8 × 2 s.
    for path in ["/healthz", "/readyz", "/livez"] {
        assert_eq!(
            get_within(maddr, path, Duration::from_secs(1)),
            (200, "ok\n".to_string()),
            "{path}"
        );
    }
    drop(idle);
}

#[test]
fn the_liveness_timeout_is_validated_and_documented() {
    let out = Command::new(env!("CARGO_BIN_EXE_ringlockd"))
        .args(["--liveness-timeout-ms", "999"])
        .output()
        .expect("run ringlockd");
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--liveness-timeout-ms: must be at least 1000"),
        "{stderr}"
    );
    let help = Command::new(env!("CARGO_BIN_EXE_ringlockd"))
        .arg("--help")
        .output()
        .expect("run ringlockd --help");
    let help = String::from_utf8_lossy(&help.stdout);
    for word in ["--liveness-timeout-ms", "/livez", "/readyz", "/healthz"] {
        assert!(help.contains(word), "--help lacks {word}");
    }
}
