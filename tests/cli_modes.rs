//! `ringlock lock --shared` and `--limit N` against the real `ringlockd`:
//! two `--shared` commands run at the same time (each waits for the
//! other's marker file), three `--limit 2` commands never run more than
//! two at once (and all three run), `--shared --limit` and `--limit 0` are
//! usage errors that send nothing, another `--limit` than the key's is
//! refused, a `--data-path` server takes them too, and a backend without
//! shared or semaphore holds (an older server, scripted; `mysql://`) is an
//! error, never an exclusive lock instead. Commands wait on files with a
//! bounded loop; the test waits on files and on the server's
//! queued-waiters gauge, never on a timer.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::session::{scripted_welcome, session};
use common::{wait_metric, Server, TempDir};

const EX_USAGE: i32 = 64;
const EX_PROTOCOL: i32 = 76;

/// `sh` code that waits (bounded: ~60 s, then exit 9) for `$1` to exist.
const WAIT_FOR: &str = "wait_for() { n=0; while [ ! -e \"$1\" ]; do n=$((n+1)); \
                        [ $n -gt 6000 ] && exit 9; sleep 0.01; done; }";

fn ringlock_at(lock: SocketAddr, admin: SocketAddr) -> Command {
    let mut c = common::ringlock_cmd(lock, admin);
    c.stdin(Stdio::null());
    c
}

fn ringlock(s: &Server) -> Command {
    ringlock_at(s.lock_addr, s.admin_addr)
}

/// `ringlock ARGS -- sh -c SCRIPT`, started.
fn spawn_sh(s: &Server, args: &[&str], script: &str) -> Child {
    let mut c = ringlock(s);
    c.args(args)
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c.spawn().expect("spawn ringlock")
}

/// Waits for the child (bounded only to turn a hang into a failure).
fn wait_exit(child: Child) -> (ExitStatus, String) {
    let (tx, rx) = mpsc::channel();
    let pid = child.id();
    thread::spawn(move || {
        let out = child.wait_with_output().expect("wait for ringlock");
        let _ = tx.send((
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    });
    rx.recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| panic!("ringlock (pid {pid}) never exited"))
}

fn one_line(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "one-line message, got {err:?}");
    assert!(err.starts_with("ringlock: "), "{err:?}");
    err
}

/// Polls (bounded) until `cond` holds: the commands' files appear as they
/// run.
fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..6_000 {
        if cond() {
            return;
        }
        thread::sleep(Duration::from_millis(10));
    }
    panic!("never: {what}");
}

fn files(dir: &Path, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read the scratch dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    names
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

#[test]
fn two_shared_holders_run_their_commands_at_the_same_time() {
    let s = Server::start(&[]);
    let dir = TempDir::new("cli-shared");
    let d = path_str(&dir.0);
    // Each marks itself, then waits for the other: with exclusive locks
    // the first would wait for a command that cannot start (exit 9).
    let children: Vec<Child> = [("a", "b"), ("b", "a")]
        .iter()
        .map(|(me, other)| {
            let script = format!("{WAIT_FOR}; touch {d}/{me}; wait_for {d}/{other}");
            spawn_sh(&s, &["lock", "--shared", "doc"], &script)
        })
        .collect();
    for child in children {
        let (status, err) = wait_exit(child);
        assert_eq!(status.code(), Some(0), "{err}");
        assert!(err.is_empty(), "{err}");
    }
    // Both released: an exclusive lock is free at once.
    let o = ringlock(&s)
        .args(["try-lock", "doc", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_limit_of_two_runs_at_most_two_commands_at_once_and_all_three() {
    let s = Server::start(&["--metrics-bind", "127.0.0.1:0"]);
    let dir = TempDir::new("cli-limit");
    let d = path_str(&dir.0);
    let log = dir.path("log");
    // Each logs its start, says it runs, waits until told to leave, then
    // logs its end; appends of one short line are atomic.
    let children: Vec<Child> = (0..3)
        .map(|i| {
            let script = format!(
                "{WAIT_FOR}; echo start {i} >> {d}/log; touch {d}/in.{i}; \
                 wait_for {d}/leave.{i}; rm {d}/in.{i}; echo end {i} >> {d}/log"
            );
            spawn_sh(&s, &["lock", "--limit", "2", "pool"], &script)
        })
        .collect();
    // Two run; the third is queued at the server, not running.
    until("two commands run", || files(&dir.0, "in.").len() == 2);
    wait_metric(s.metrics(), "ringlock_queued_waiters", 1.0);
    let running = files(&dir.0, "in.");
    assert_eq!(running.len(), 2, "{running:?}");
    // One leaves: the third gets its slot.
    let first = running[0].strip_prefix("in.").unwrap().to_string();
    std::fs::write(dir.path(&format!("leave.{first}")), "").unwrap();
    until("the third runs", || {
        let now = files(&dir.0, "in.");
        now.len() == 2 && !now.contains(&running[0])
    });
    for i in 0..3 {
        std::fs::write(dir.path(&format!("leave.{i}")), "").unwrap();
    }
    for child in children {
        let (status, err) = wait_exit(child);
        assert_eq!(status.code(), Some(0), "{err}");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let (mut now, mut max, mut started) = (0, 0, 0);
    for line in text.lines() {
        if line.starts_with("start") {
            now += 1;
            started += 1;
            max = max.max(now);
        } else {
            assert!(line.starts_with("end"), "{text}");
            now -= 1;
        }
    }
    assert_eq!(started, 3, "all three ran:\n{text}");
    assert_eq!(max, 2, "never more than two at once, and two did:\n{text}");
}

/// A listener that must never see a connection: usage errors send nothing.
struct NoTraffic(TcpListener);

impl NoTraffic {
    fn new() -> NoTraffic {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        NoTraffic(l)
    }
    fn addr(&self) -> SocketAddr {
        self.0.local_addr().unwrap()
    }
}

impl Drop for NoTraffic {
    fn drop(&mut self) {
        if !thread::panicking() {
            assert_eq!(
                self.0.accept().unwrap_err().kind(),
                std::io::ErrorKind::WouldBlock,
                "no connection was made"
            );
        }
    }
}

#[test]
fn shared_with_limit_and_a_limit_of_zero_are_usage_errors() {
    let quiet = NoTraffic::new();
    let addr = quiet.addr();
    for (args, says) in [
        (&["lock", "--shared", "--limit", "2", "k"][..], "--limit"),
        (&["try-lock", "--limit", "2", "--shared", "k"], "--shared"),
        (&["lock", "--limit", "0", "k"], "at least 1 slot"),
        (&["try-lock", "--limit", "0", "k"], "at least 1 slot"),
        (&["lock", "--limit", "many", "k"], "slot count"),
        (&["lock", "--shared", "--persistent", "k"], "--persistent"),
        (
            &["lock", "--limit", "2", "--persistent", "k"],
            "--persistent",
        ),
    ] {
        let o = ringlock_at(addr, addr)
            .args(args)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(EX_USAGE), "{args:?}: {:?}", o.stderr);
        let line = one_line(&o);
        assert!(line.contains(says), "{args:?}: {line}");
    }
}

#[test]
fn a_server_without_modes_is_an_error_never_an_exclusive_lock() {
    // A server older than lock modes (every real ringlockd offers them
    // now): a scripted one whose welcome lacks the flag and which would
    // grant any Acquire.
    let dir = TempDir::new("cli-modes-old");
    let ran = dir.path("ran");
    let quiet = NoTraffic::new();
    for args in [
        &["lock", "--shared", "doc"][..],
        &["try-lock", "--limit", "3", "doc"],
    ] {
        let (addr, seen) = scripted_welcome(0);
        let o = ringlock_at(addr, quiet.addr())
            .args(args)
            .args(["--", "touch", path_str(&ran)])
            .output()
            .unwrap();
        let line = one_line(&o);
        assert_eq!(o.status.code(), Some(EX_PROTOCOL), "{args:?}: {line}");
        assert!(
            line.contains("\"doc\": this server does not offer shared or semaphore holds")
                && line.contains("nothing was sent"),
            "{line}"
        );
        assert!(!ran.exists(), "{args:?}: the command must not run");
        let ops = seen.join().unwrap();
        assert!(
            !ops.contains(&ringlock::protocol::session::OP_ACQUIRE),
            "{args:?}: no Acquire was sent: {ops:?}"
        );
    }
}

#[test]
fn a_durable_server_takes_shared_holds_too() {
    let dir = TempDir::new("cli-modes-wal");
    let wal = dir.path("locks.wal");
    let s = Server::start(&["--data-path", path_str(&wal)]);
    let d = path_str(&dir.0);
    let children: Vec<Child> = [("a", "b"), ("b", "a")]
        .iter()
        .map(|(me, other)| {
            let script = format!("{WAIT_FOR}; touch {d}/{me}; wait_for {d}/{other}");
            spawn_sh(&s, &["lock", "--shared", "doc"], &script)
        })
        .collect();
    for child in children {
        let (status, err) = wait_exit(child);
        assert_eq!(status.code(), Some(0), "{err}");
    }
}

#[test]
fn mysql_is_refused_before_connecting() {
    let quiet = NoTraffic::new();
    let url = format!("mysql://app@{}", quiet.addr());
    for flag in [&["--shared"][..], &["--limit", "2"]] {
        let o = Command::new(env!("CARGO_BIN_EXE_ringlock"))
            .env_remove("RINGLOCK_ADDR")
            .args(["--addr", &url, "lock"])
            .args(flag)
            .args(["k", "--", "true"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(EX_USAGE), "{flag:?}: {:?}", o.stderr);
        let line = one_line(&o);
        assert!(
            line.contains("--shared and --limit do not apply over mysql://"),
            "{line}"
        );
    }
}

#[test]
fn another_limit_than_the_keys_is_refused_and_names_the_key() {
    let s = Server::start(&[]);
    let holder = session(s.lock_addr);
    let held = holder
        .lock_permit("pool", 2, Duration::from_secs(5))
        .unwrap();
    let ran: PathBuf =
        std::env::temp_dir().join(format!("ringlock-cli-modes-{}", std::process::id()));
    let o = ringlock(&s)
        .args(["lock", "--limit", "3", "--timeout", "10s", "pool", "--"])
        .args(["touch", path_str(&ran)])
        .output()
        .unwrap();
    let line = one_line(&o);
    assert_eq!(o.status.code(), Some(EX_PROTOCOL), "{line}");
    assert!(
        line.contains("mode mismatch")
            && line.contains("one of 3 slots")
            && line.contains("\"pool\""),
        "{line}"
    );
    assert!(!ran.exists(), "the command must not run");
    // The same limit is admitted beside the holder.
    let o = ringlock(&s)
        .args(["try-lock", "--limit", "2", "pool", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A reader is not let in beside semaphore holders, and is told why.
    let o = ringlock(&s)
        .args(["try-lock", "--shared", "pool", "--", "true"])
        .output()
        .unwrap();
    let line = one_line(&o);
    assert_eq!(o.status.code(), Some(75), "{line}");
    assert!(line.contains("pool is held other than --shared"), "{line}");
    held.release().unwrap();
}

#[test]
fn help_describes_shared_and_limit() {
    let o = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .args(["lock", "--help"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("--shared") && text.contains("--limit <N>"),
        "{text}"
    );
}
