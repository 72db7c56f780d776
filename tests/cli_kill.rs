//! `kill -9` of `ringlock lock` while its command runs, against the real
//! `ringlockd`: the command (and what it started: a shell's commands) dies
//! before the server can grant the key to anyone else, for session locks
//! and leases, over 50 rounds; with `--persistent` the command dies too and
//! the key stays held (Locking-Center semantics). The MySQL backend's
//! rounds are in tests/cli_mysql.rs.

mod common;
mod kill_common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Server, TempDir};

fn ringlock(s: &Server) -> Command {
    common::ringlock_cmd(s.lock_addr, s.admin_addr)
}

#[test]
fn kill_9_of_the_cli_never_lets_a_second_holder_in_while_its_command_runs() {
    let s = Server::start(&[]);
    let dir = TempDir::new("cli-kill");
    // A short keep-alive: were the command's children left running with
    // the connection inherited, the server would still end A's session a
    // second after A's death, and B would find them running.
    kill9_rounds(&s, "job", &["--keepalive", "1s"], 50, &dir);
}

#[test]
fn kill_9_of_the_cli_holding_a_lease_kills_its_command_before_the_lease_expires() {
    let s = Server::start(&[]);
    let dir = TempDir::new("cli-kill-ttl");
    kill9_rounds(&s, "lease-job", &["--ttl", "300ms"], 10, &dir);
}

fn kill9_rounds(s: &Server, key: &str, a_flags: &[&str], rounds: usize, dir: &TempDir) {
    kill_common::kill9_rounds(|| ringlock(s), key, a_flags, rounds, &dir.0);
}

#[test]
fn kill_9_of_the_cli_holding_a_persistent_lock_kills_its_command_and_keeps_the_key() {
    let s = Server::start(&[]);
    let dir = TempDir::new("cli-kill-persistent");
    let log = dir.path("log");
    let a = ringlock(&s)
        .args(["lock", "--persistent", "lc", "--", "sh", "-c"])
        .arg(r#"sleep 300 & echo "$$ $!" >> "$LOG"; wait"#)
        .env("LOG", &log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ringlock");
    let started = Instant::now();
    let pids: Vec<i32> = loop {
        if let Some(line) = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .next()
        {
            break line
                .split_whitespace()
                .map(|p| p.parse().unwrap())
                .collect();
        }
        assert!(started.elapsed() < Duration::from_secs(30), "never started");
        std::thread::sleep(Duration::from_millis(2));
    };
    // SAFETY: plain kill(2) of our own unreaped child.
    assert_eq!(unsafe { libc::kill(a.id() as i32, libc::SIGKILL) }, 0);
    kill_common::wait_bounded(a, "ringlock");
    let gone = |p: i32| {
        std::fs::read_to_string(format!("/proc/{p}/stat"))
            .ok()
            .and_then(|st| st.rsplit_once(") ").map(|(_, r)| r.starts_with(['Z', 'X'])))
            .unwrap_or(true)
    };
    let started = Instant::now();
    while !pids.iter().all(|&p| gone(p)) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the command outlived ringlock: {pids:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Locking-Center semantics: the key stays held until a reset.
    let out = ringlock(&s)
        .args(["try-lock", "lc", "--", "true"])
        .output()
        .expect("try-lock");
    assert_eq!(out.status.code(), Some(75), "{out:?}");
}

/// The descriptors of CMD that are sockets (readlink of /proc/self/fd).
fn command_sockets(s: &Server, flags: &[&str]) -> usize {
    let out = ringlock(s)
        .arg("lock")
        .args(flags)
        .args([
            "fds",
            "--",
            "sh",
            "-c",
            "for f in /proc/$$/fd/*; do readlink $f || true; done",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run ringlock");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("socket:"))
        .count()
}

#[test]
fn the_command_inherits_the_connection_that_holds_its_lock() {
    let s = Server::start(&[]);
    // Session locks and leases: the session's connection, so the server
    // cannot see it close before the command is gone.
    assert_eq!(command_sockets(&s, &[]), 1);
    assert_eq!(command_sockets(&s, &["--ttl", "5s"]), 1);
    // A persistent lock does not end with a connection: nothing to inherit.
    assert_eq!(command_sockets(&s, &["--persistent"]), 0);
}
