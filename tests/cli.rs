//! The `ringlock` CLI against the real `ringlockd` binary.

mod common;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::Server;
use ringlock::client::Client;

fn cli(lock: SocketAddr, admin: SocketAddr) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ringlock"));
    c.env_remove("RINGLOCK_ADDR")
        .env_remove("RINGLOCK_ADMIN_ADDR")
        .env_remove("RINGLOCK_SOURCE")
        .args([
            "--addr",
            &lock.to_string(),
            "--admin-addr",
            &admin.to_string(),
        ])
        .args(["--retry", "1s"]);
    c
}

fn ringlock(s: &Server) -> Command {
    cli(s.lock_addr, s.admin_addr)
}

fn run(mut c: Command) -> Output {
    c.stdin(Stdio::null()).output().expect("run ringlock")
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("ringlock exits, it is not killed")
}

fn stderr_line(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "one-line message, got {err:?}");
    assert!(err.starts_with("ringlock: "), "{err:?}");
    err
}

fn held_keys(s: &Server) -> Vec<String> {
    common::keys(s.admin_addr)
        .into_iter()
        .map(|k| String::from_utf8_lossy(&k.key).into_owned())
        .collect()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ringlock-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn lib_client(s: &Server, source: &str) -> Client {
    Client::builder(s.lock_addr)
        .admin_addr(s.admin_addr)
        .source(source)
        .build()
        .unwrap()
}

fn sigterm(pid: u32) {
    // SAFETY: plain kill(2) on a child process we started and have not reaped.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
}

fn wait_bounded(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            t0.elapsed() < limit,
            "ringlock did not exit within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn concurrent_locks_never_interleave() {
    let s = Server::start(&[]);
    let dir = scratch("interleave");
    let log = dir.join("log");
    let children: Vec<_> = (0..4)
        .map(|i| {
            let script = format!(
                "echo start{i} >> {log}; sleep 0.05; echo end{i} >> {log}",
                log = log.display()
            );
            let mut c = ringlock(&s);
            c.args(["lock", "shared", "--", "sh", "-c", &script]);
            c.stdin(Stdio::null()).spawn().unwrap()
        })
        .collect();
    for mut child in children {
        assert!(wait_bounded(&mut child, Duration::from_secs(20)).success());
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 8, "{text}");
    for pair in lines.chunks(2) {
        let who = pair[0].strip_prefix("start").expect("a start line");
        assert_eq!(pair[1], format!("end{who}"), "interleaved:\n{text}");
    }
    assert!(held_keys(&s).is_empty());
}

#[test]
fn exit_status_passes_through_and_the_key_is_released() {
    let s = Server::start(&[]);
    for (cmd, want) in [
        (&["true"][..], 0),
        (&["sh", "-c", "exit 3"], 3),
        (&["sh", "-c", "kill -KILL $$"], 128 + 9),
        (&["/nonexistent/command"], 127),
    ] {
        let mut c = ringlock(&s);
        c.args(["lock", "k", "--"]).args(cmd);
        let o = run(c);
        assert_eq!(
            code(&o),
            want,
            "{cmd:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(held_keys(&s).is_empty(), "{cmd:?} left the key held");
    }
}

#[test]
fn sigterm_is_forwarded_and_the_key_released_after_the_child() {
    let s = Server::start(&[]);
    let mut c = ringlock(&s);
    c.args([
        "lock",
        "term",
        "--",
        "sh",
        "-c",
        "echo ready; exec sleep 30",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    assert_eq!(held_keys(&s), ["term"]);
    sigterm(child.id());
    let status = wait_bounded(&mut child, Duration::from_secs(5));
    assert_eq!(status.code(), Some(128 + 15), "the child died of SIGTERM");
    assert!(held_keys(&s).is_empty());
}

#[test]
fn sigterm_while_waiting_withdraws_the_request() {
    let s = Server::start(&[]);
    let holder = lib_client(&s, "holder").lock("w").unwrap();
    let mut c = ringlock(&s);
    c.args(["lock", "w", "--", "true"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    // Give it time to queue. On a slow machine the signal may land before
    // the handlers are installed (then it simply dies of it); either way it
    // must not leave a holder behind.
    std::thread::sleep(Duration::from_millis(100));
    sigterm(child.id());
    let status = wait_bounded(&mut child, Duration::from_secs(5));
    use std::os::unix::process::ExitStatusExt;
    assert!(
        status.code() == Some(128 + 15) || status.signal() == Some(libc::SIGTERM),
        "{status:?}"
    );
    drop(holder);
    assert!(
        held_keys(&s).is_empty(),
        "no ghost holder after the withdrawal"
    );
}

#[test]
fn try_lock_on_a_held_key_does_not_run_the_command() {
    let s = Server::start(&[]);
    let dir = scratch("trylock");
    let marker = dir.join("ran");
    let holder = lib_client(&s, "holder").lock("t").unwrap();
    let mut c = ringlock(&s);
    c.args(["try-lock", "t", "--", "touch"]).arg(&marker);
    let o = run(c);
    assert_eq!(code(&o), 75);
    assert!(stderr_line(&o).contains("held"));
    assert!(!marker.exists(), "command must not run");
    drop(holder);

    let mut c = ringlock(&s);
    c.args(["try-lock", "t", "--", "touch"]).arg(&marker);
    assert_eq!(code(&run(c)), 0);
    assert!(marker.exists());
    assert!(held_keys(&s).is_empty());
}

#[test]
fn lock_timeout_gives_up_with_tempfail() {
    let s = Server::start(&[]);
    let holder = lib_client(&s, "holder").lock("slow").unwrap();
    let mut c = ringlock(&s);
    c.args(["lock", "slow", "--timeout", "100ms", "--", "true"]);
    let o = run(c);
    assert_eq!(code(&o), 75);
    assert!(stderr_line(&o).contains("timed out"));
    assert_eq!(held_keys(&s), ["slow"]);
    drop(holder);
    assert!(held_keys(&s).is_empty());
}

#[test]
fn keys_lists_held_keys() {
    let s = Server::start(&[]);
    let g = lib_client(&s, "svc-a").lock("deploy/prod").unwrap();
    let o = run({
        let mut c = ringlock(&s);
        c.arg("keys");
        c
    });
    assert_eq!(code(&o), 0);
    let out = String::from_utf8(o.stdout).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].starts_with("KEY") && lines[0].contains("HELD"),
        "{out}"
    );
    let cols: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(cols[0], "deploy/prod");
    assert_eq!(cols[1], "svc-a");
    assert_eq!(cols[2], g.endpoint().unwrap().to_string());
    assert!(cols[3].ends_with('s'), "held for: {}", cols[3]);

    let o = run({
        let mut c = ringlock(&s);
        c.args(["keys", "-d"]);
        c
    });
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.contains("ACQUIRED"), "{out}");
    assert!(out.lines().nth(1).unwrap().ends_with('Z'), "{out}");
}

#[test]
fn unlock_and_resets() {
    let s = Server::start(&[]);
    let other = lib_client(&s, "x");
    let guards: Vec<_> = ["k1", "k2", "k3", "k4"]
        .iter()
        .map(|k| other.lock(k).unwrap())
        .collect();
    let ok = |args: &[&str]| {
        let mut c = ringlock(&s);
        c.args(args);
        let o = run(c);
        assert_eq!(
            code(&o),
            0,
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    ok(&["unlock", "k1"]);
    assert_eq!(held_keys(&s), ["k2", "k3", "k4"]);
    ok(&["reset", "k2", "k3"]);
    assert_eq!(held_keys(&s), ["k4"]);
    ok(&["reset", "--source", "x"]);
    assert!(held_keys(&s).is_empty());
    drop(guards);
}

#[test]
fn usage_errors_send_nothing_and_exit_64() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    let long = "k".repeat(128);
    for args in [
        &["lock", "", "--", "true"][..],
        &["lock", &long, "--", "true"],
        &["try-lock", "", "--", "true"],
        &["unlock", &long],
        &["reset", "ok", ""],
        &["reset", "--source", &long],
        &["lock", "k"],
        &["lock", "k", "--timeout", "soon", "--", "true"],
        &["frob"],
        &[],
    ] {
        let mut c = cli(addr, addr);
        c.args(args);
        let o = run(c);
        assert_eq!(code(&o), 64, "{args:?}");
        stderr_line(&o);
    }
    assert_eq!(
        l.accept().unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "no connection was made"
    );
    for args in [&["--help"][..], &["lock", "--help"], &["keys", "-h"]] {
        let mut c = cli(addr, addr);
        c.args(args);
        let o = run(c);
        assert_eq!(code(&o), 0);
        assert!(String::from_utf8_lossy(&o.stdout).starts_with("usage: ringlock"));
    }
}

#[test]
fn unreachable_server_exits_69() {
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    for args in [
        &["lock", "k", "--", "true"][..],
        &["keys"],
        &["unlock", "k"],
    ] {
        let mut c = cli(closed, closed);
        c.args(["--retry", "0"]).args(args);
        let o = run(c);
        assert_eq!(code(&o), 69, "{args:?}");
        assert!(stderr_line(&o).contains("unavailable"));
    }
}
