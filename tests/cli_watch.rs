//! `ringlock watch KEY` against the real server: the holders, then one
//! line per change as it happens (text and `--json`), `--count` ending
//! it; a killed watcher leaves no watch behind; a server without watches
//! is exit 76 with nothing sent.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::session::{scripted_welcome, session};
use common::{wait_metric, Conn, Server};
use ringlock::protocol::session as wire;

const LONG: Duration = Duration::from_secs(20);

fn ringlock(addr: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ringlock"));
    c.env_remove("RINGLOCK_ADDR")
        .env_remove("RINGLOCK_ADMIN_ADDR")
        .env_remove("RINGLOCK_SOURCE")
        .env_remove("RINGLOCK_AUTH_TOKEN_FILE")
        .args(["--addr", addr])
        .args(["--retry", "1s"])
        .stdin(Stdio::null());
    c
}

#[test]
fn watch_prints_the_holders_then_each_change_and_count_ends_it() {
    let s = Server::start(&["--metrics-bind", "127.0.0.1:0"]);
    let a = session(s.lock_addr);
    for json in [false, true] {
        // Held by a session when the watch begins.
        let first = a.lock("job", LONG).unwrap();
        let mut c = ringlock(&s.lock_addr.to_string());
        c.args(["watch", "job", "--count", "3"]);
        if json {
            c.arg("--json");
        }
        let mut child = c.stdout(Stdio::piped()).spawn().expect("ringlock watch");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut next = || lines.next().expect("a line").expect("utf-8");
        // The holder line comes once the watch is set up.
        let holder = next();
        wait_metric(s.metrics(), "ringlock_watches", 1.0);
        let t0 = first.token().unwrap();
        if json {
            assert_eq!(
                holder,
                format!(
                    "{{\"event\":\"holder\",\"key\":\"job\",\"key_hex\":\"6a6f62\",\"token\":{t0},\"mode\":\"session\",\"access\":\"exclusive\",\"slots\":null,\"source\":{},\"source_hex\":\"{}\"}}",
                    "\"127.0.0.1\"",
                    "3132372e302e302e31"
                )
            );
        } else {
            assert_eq!(holder, format!("holder {t0} session exclusive 127.0.0.1"));
        }
        // Three changes: a Locking-Center lock and unlock around nothing
        // (the session's holder stays), then a semaphore lease.
        let mut lc = Conn::persistent(s.lock_addr);
        assert_eq!(lc.reset_key(b"job"), b'+');
        assert_eq!(lc.lock(b"job", b"batch"), b'+');
        assert_eq!(lc.unlock(b"job"), b'+');
        let got: Vec<String> = (0..3).map(|_| next()).collect();
        if json {
            assert!(got[0].starts_with("{\"event\":\"reset\""), "{got:?}");
            assert!(
                got[1].starts_with("{\"event\":\"granted\"")
                    && got[1].contains("\"mode\":\"persistent\"")
                    && got[1].ends_with("\"source\":\"batch\",\"source_hex\":\"6261746368\"}"),
                "{got:?}"
            );
            assert!(got[2].starts_with("{\"event\":\"released\""), "{got:?}");
        } else {
            assert_eq!(got[0], format!("reset {t0} session exclusive 127.0.0.1"));
            let t1: u64 = got[1].split(' ').nth(1).unwrap().parse().unwrap();
            assert!(t1 > t0);
            assert_eq!(got[1], format!("granted {t1} persistent exclusive batch"));
            assert_eq!(got[2], format!("released {t1} persistent exclusive batch"));
        }
        let status = child.wait().unwrap();
        assert!(status.success(), "--count 3 ends it: {status}");
        wait_metric(s.metrics(), "ringlock_watches", 0.0);
        // Reset: the lease is lost (its release says so).
        assert!(first.release().is_err());
    }
}

#[test]
fn a_killed_watcher_leaves_no_watch_behind() {
    let s = Server::start(&["--metrics-bind", "127.0.0.1:0"]);
    let mut child = ringlock(&s.lock_addr.to_string())
        .args(["watch", "anything"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_metric(s.metrics(), "ringlock_watches", 1.0);
    child.kill().unwrap();
    child.wait().unwrap();
    wait_metric(s.metrics(), "ringlock_watches", 0.0);
}

#[test]
fn a_server_without_watches_is_exit_76_and_nothing_is_sent() {
    let (addr, seen) = scripted_welcome(wire::FLAG_MODES);
    let o = ringlock(&addr.to_string())
        .args(["watch", "doc"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(76), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("does not offer key watches") && err.contains("nothing was sent"),
        "{err}"
    );
    let ops = seen.join().unwrap();
    assert!(!ops.contains(&wire::OP_WATCH), "{ops:?}");
}
