//! `ringlock lock` / `try-lock` with session locks and leases, against the
//! real `ringlockd`: `kill -9` of the CLI kills its command and frees its
//! key at once, a CLI paused past its lease is told when it runs again (its
//! command is stopped, exit 79), `--kill-after`, `RINGLOCK_KEY` /
//! `RINGLOCK_TOKEN`, and `ringlock keys` with mode, token and lease time
//! left.

mod common;
mod kill_common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::Server;
use ringlock::client::{Client, KeyInfo, RetryPolicy, Session};
use ringlock::protocol::session::HoldMode;

const EX_LOST: i32 = 79;

fn ringlock(s: &Server) -> Command {
    common::ringlock_cmd(s.lock_addr, s.admin_addr)
}

/// Starts `ringlock ARGS` with piped stdout and stderr.
fn spawn(s: &Server, args: &[&str]) -> Child {
    let mut c = ringlock(s);
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c.spawn().expect("spawn ringlock")
}

/// The command's first line of output, split on whitespace.
fn first_line(child: &mut Child) -> Vec<String> {
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped stdout"))
        .read_line(&mut line)
        .expect("read the command's line");
    line.split_whitespace().map(str::to_string).collect()
}

/// Waits for the child (bounded only to turn a hang into a failure).
fn wait_exit(mut child: Child) -> (ExitStatus, String) {
    let (tx, rx) = mpsc::channel();
    let pid = child.id();
    thread::spawn(move || {
        let status = child.wait().expect("wait for ringlock");
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        let _ = tx.send((status, err));
    });
    rx.recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| panic!("ringlock (pid {pid}) never exited"))
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: plain kill(2) on a process this test started and has not
    // reaped yet (a reaped pid could be reused by an unrelated process).
    assert_eq!(
        unsafe { libc::kill(pid as i32, sig) },
        0,
        "kill {pid} {sig}"
    );
}

/// True while a process with this pid exists.
fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence; it delivers nothing, so a
    // reused pid costs a wrong answer at worst, never a stray signal.
    unsafe { libc::kill(pid, 0) == 0 }
}

fn keyx(s: &Server) -> Vec<KeyInfo> {
    Client::builder(s.lock_addr)
        .admin_addr(s.admin_addr)
        .build()
        .expect("client")
        .keyx()
        .expect("KEYX")
}

fn holder(s: &Server, key: &str) -> Option<KeyInfo> {
    keyx(s).into_iter().find(|k| k.key == key.as_bytes())
}

fn session(addr: SocketAddr) -> Session {
    Session::builder(addr)
        .retry(RetryPolicy::none())
        .connect()
        .expect("session opens")
}

#[test]
fn kill_9_of_a_cli_holding_a_session_lock_frees_the_key_at_once() {
    let s = Server::start(&["--metrics-bind", "127.0.0.1:0"]);
    let mut cli = spawn(
        &s,
        &[
            "lock",
            "k9",
            "--",
            "sh",
            "-c",
            "echo ready $$ $RINGLOCK_KEY $RINGLOCK_TOKEN; exec sleep 60",
        ],
    );
    let line = first_line(&mut cli);
    assert_eq!(line[0], "ready", "{line:?}");
    let cmd_pid: i32 = line[1].parse().unwrap();
    assert_eq!(line[2], "k9", "RINGLOCK_KEY");
    let token: u64 = line[3].parse().expect("RINGLOCK_TOKEN is a number");
    let held = holder(&s, "k9").expect("held");
    assert_eq!((held.mode, held.token), (HoldMode::Session, token));

    // A waiter queued behind it gets at most a second, decided by the
    // server: the key must be freed within it.
    let w = session(s.lock_addr);
    let waiter = thread::spawn(move || w.lock("k9", Duration::from_secs(1)));
    common::wait_metric(s.metrics(), "ringlock_queued_waiters", 1.0);
    signal(cli.id(), libc::SIGKILL);
    let got = waiter.join().unwrap();
    let lease = got.expect("the server freed the key when the CLI's connection closed");
    assert!(lease.token().unwrap() > token);
    // The command died with the CLI, before the key was freed (it held the
    // connection too): a zombie at most (tests/cli_kill.rs checks the
    // order over many rounds).
    assert!(
        !kill_common::running(cmd_pid),
        "kill -9 of the CLI left its command running"
    );
    let (status, _) = wait_exit(cli);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
}

#[test]
fn a_cli_paused_past_its_lease_stops_its_command_and_exits_79() {
    let s = Server::start(&[]);
    let mut cli = spawn(
        &s,
        &[
            "lock",
            "paused",
            "--ttl",
            "1s",
            "--",
            "sh",
            "-c",
            "echo ready $$ $RINGLOCK_TOKEN; exec sleep 60",
        ],
    );
    let line = first_line(&mut cli);
    assert_eq!(line[0], "ready", "{line:?}");
    let cmd_pid: i32 = line[1].parse().unwrap();
    let token: u64 = line[2].parse().unwrap();
    let held = holder(&s, "paused").expect("held");
    assert_eq!((held.mode, held.token), (HoldMode::Lease, token));
    assert!(held.lease_left_ms.is_some());

    // The CLI stops; its command goes on. The lease runs out on the server.
    signal(cli.id(), libc::SIGSTOP);
    let other = session(s.lock_addr);
    let theirs = other
        .lock("paused", Duration::from_secs(60))
        .expect("granted once the paused CLI's lease expired");
    assert!(theirs.token().unwrap() > token, "a larger token");
    assert!(alive(cmd_pid), "the command still runs: nobody told it yet");

    // Running again, the CLI learns it lost the lock, stops the command and
    // says so in one line.
    signal(cli.id(), libc::SIGCONT);
    let (status, err) = wait_exit(cli);
    assert_eq!(status.code(), Some(EX_LOST), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(
        err.starts_with(&format!(
            "ringlock: lost the lock on paused (token {token}): "
        )),
        "{err}"
    );
    assert!(
        err.trim_end()
            .ends_with("while the command ran; it got SIGTERM"),
        "SIGTERM was enough, no SIGKILL: {err}"
    );
    assert!(!alive(cmd_pid), "the command was stopped (and reaped)");
    // The new holder was never disturbed.
    assert_eq!(holder(&s, "paused").unwrap().token, theirs.token().unwrap());
}

#[test]
fn a_command_that_ignores_sigterm_gets_sigkill_after_kill_after() {
    let s = Server::start(&[]);
    let mut cli = spawn(
        &s,
        &[
            "lock",
            "--kill-after",
            "200ms",
            "stubborn",
            "--",
            "sh",
            "-c",
            // An ignored signal stays ignored across exec.
            "trap '' TERM; echo ready $$; exec sleep 60",
        ],
    );
    let line = first_line(&mut cli);
    let cmd_pid: i32 = line[1].parse().unwrap();
    // An operator reset takes the lock away; the server pushes Lost.
    assert_eq!(
        common::admin_names(s.admin_addr, b"RSET", &[b"stubborn"]),
        b"++"
    );
    let (status, err) = wait_exit(cli);
    assert_eq!(status.code(), Some(EX_LOST), "{err}");
    assert_eq!(err.lines().count(), 1, "{err:?}");
    assert!(err.contains("an operator reset it"), "{err}");
    assert!(
        err.contains("it got SIGTERM, then SIGKILL after 200ms"),
        "{err}"
    );
    assert!(!alive(cmd_pid));
}

#[test]
fn the_command_gets_key_and_token_and_the_key_is_released_after_it() {
    let s = Server::start(&[]);
    for (mode, args) in [
        ("session", &["lock", "env/k"][..]),
        ("lease", &["try-lock", "--ttl", "30s", "env/k"]),
        ("persistent", &["lock", "--persistent", "env/k"]),
    ] {
        let mut c = ringlock(&s);
        c.args(args).args([
            "--",
            "sh",
            "-c",
            "echo \"${RINGLOCK_KEY}|${RINGLOCK_TOKEN-unset}\"",
        ]);
        let o = c.stdin(Stdio::null()).output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{mode}: {o:?}");
        let out = String::from_utf8(o.stdout).unwrap();
        let (key, token) = out.trim().split_once('|').expect("key|token");
        assert_eq!(key, "env/k", "{mode}");
        match mode {
            // The Locking-Center `+` carries no token.
            "persistent" => assert_eq!(token, "unset"),
            _ => assert!(token.parse::<u64>().is_ok_and(|t| t > 0), "{mode}: {token}"),
        }
        assert!(holder(&s, "env/k").is_none(), "{mode}: released after CMD");
    }
}

#[test]
fn keys_shows_mode_token_and_lease_time_left() {
    let s = Server::start(&[]);
    let mut cli = spawn(
        &s,
        &[
            "--source",
            "cli",
            "lock",
            "--ttl",
            "30s",
            "keys/lease",
            "--",
            "sh",
            "-c",
            "echo ready $RINGLOCK_TOKEN; exec sleep 60",
        ],
    );
    let line = first_line(&mut cli);
    let token = &line[1];
    let a = session(s.lock_addr);
    let sess = a.lock("keys/session", Duration::from_secs(5)).unwrap();
    let mut c = ringlock(&s);
    c.arg("keys");
    let o = c.output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    let out = String::from_utf8(o.stdout).unwrap();
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["KEY", "SOURCE", "ENDPOINT", "HELD", "MODE", "TOKEN", "LEASE", "ACCESS"],
        "{out}"
    );
    let lease_row = rows.iter().find(|r| r[0] == "keys/lease").expect("{out}");
    assert_eq!(lease_row[1], "cli");
    assert_eq!(lease_row[4], "lease");
    assert_eq!(&lease_row[5], token);
    assert!(lease_row[6].ends_with('s'), "time left: {}", lease_row[6]);
    let sess_row = rows.iter().find(|r| r[0] == "keys/session").expect("{out}");
    assert_eq!(sess_row[4], "session");
    assert_eq!(sess_row[5], sess.token().unwrap().to_string());
    assert_eq!(sess_row[6], "-");

    let mut c = ringlock(&s);
    c.args(["keys", "--json"]);
    let out = String::from_utf8(c.output().unwrap().stdout).unwrap();
    assert!(
        out.contains(&format!(
            "\"mode\":\"lease\",\"token\":{token},\"lease_ms_left\":"
        )),
        "{out}"
    );
    signal(cli.id(), libc::SIGTERM);
    let (status, _) = wait_exit(cli);
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "SIGTERM forwarded to the command"
    );
    assert!(
        holder(&s, "keys/lease").is_none(),
        "released after the command"
    );
}

#[test]
fn lease_ttls_outside_the_servers_bounds_are_usage_errors() {
    let s = Server::start(&["--max-ttl-ms", "60000"]);
    let mut c = ringlock(&s);
    c.args(["lock", "--ttl", "2m", "t", "--", "true"]);
    let o = c.stdin(Stdio::null()).output().unwrap();
    assert_eq!(o.status.code(), Some(64), "{o:?}");
    let err = String::from_utf8(o.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("this server's bounds"), "{err}");
    assert!(holder(&s, "t").is_none());
}

#[test]
fn help_lists_the_lost_lock_exit_code_and_the_hold_flags() {
    let o = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(o.stdout).unwrap();
    assert!(
        help.contains("79   the lock was lost while CMD ran"),
        "{help}"
    );
    assert!(help.contains("RINGLOCK_TOKEN"), "{help}");
    let o = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .args(["lock", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(o.stdout).unwrap();
    for flag in ["--ttl <D>", "--persistent", "--kill-after <D>"] {
        assert!(help.contains(flag), "{flag}: {help}");
    }
}

#[test]
fn a_server_without_sessions_is_named_and_points_at_persistent() {
    use std::io::{Read, Write};
    // A Locking-Center server refuses the unknown Hello action with `-`.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let peer = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut hello = [0u8; 12];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(hello[0], 7, "a Hello");
        s.write_all(b"-").unwrap();
    });
    let o = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .env_remove("RINGLOCK_ADDR")
        .args(["--addr", &addr.to_string(), "--retry", "0"])
        .args(["lock", "k", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    peer.join().unwrap();
    assert_eq!(o.status.code(), Some(69), "{o:?}");
    let err = String::from_utf8(o.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("does not speak the session protocol"), "{err}");
    assert!(err.contains("--persistent"), "{err}");
}
