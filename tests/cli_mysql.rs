//! The `ringlock` CLI over MySQL/MariaDB (`--addr mysql://…`): two commands
//! are serialized exactly as over ringlockd, try-lock on a held name exits
//! 75 without running its command, and the lock is gone afterwards (checked
//! from another session with IS_FREE_LOCK); a lock lost while the command
//! runs (its session `KILL`ed, or its pings unanswered) stops the command
//! and exits 79, as over ringlockd; `--keepalive` and `--ping-timeout` take
//! effect and refuse bad values; `kill -9` of the CLI kills its command
//! (and the command's children) before MySQL can grant the lock to the next
//! waiter, over 50 rounds. Against a private mariadbd.

mod kill_common;
mod mysql_common;

use mysql::prelude::Queryable;
use mysql_common::proxy::{Mode, Proxy};
use mysql_common::{wait_until, MariaDb, LIVENESS};
use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

fn ringlock(url: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ringlock"));
    c.args(["--addr", url])
        .env_remove("RINGLOCK_ADDR")
        .stdin(Stdio::null());
    c
}

#[test]
fn cli_serializes_two_commands_over_mysql() {
    let db = MariaDb::shared();
    let dir = std::env::temp_dir().join(format!("ringlock-cli-mysql-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let log = dir.join("log");
    let children: Vec<_> = (0..3)
        .map(|i| {
            let script = format!(
                "echo start{i} >> {log}; sleep 0.05; echo end{i} >> {log}",
                log = log.display()
            );
            ringlock(&db.url())
                .args(["lock", "cli/serial", "--", "sh", "-c", &script])
                .spawn()
                .expect("spawn ringlock")
        })
        .collect();
    for mut c in children {
        assert!(c.wait().expect("wait").success());
    }
    let text = std::fs::read_to_string(&log).expect("log");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    for pair in lines.chunks(2) {
        let who = pair[0].strip_prefix("start").expect("a start line");
        assert_eq!(pair[1], format!("end{who}"), "interleaved:\n{text}");
    }
    assert!(db.is_free("cli/serial"), "the lock outlived the command");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kill_9_of_the_cli_never_lets_a_second_holder_in_over_mysql() {
    let db = MariaDb::shared();
    let dir = std::env::temp_dir().join(format!("ringlock-cli-mysql-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    kill_common::kill9_rounds(|| ringlock(&db.url()), "cli/kill9", &[], 50, &dir);
    assert!(db.is_free("cli/kill9"), "the lock outlived the rounds");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cli_try_lock_over_mysql_exits_75_when_held_and_passes_the_exit_code() {
    let db = MariaDb::shared();
    let holder = mysql_common::Holder::take(db, "cli/held");
    let out = ringlock(&db.url())
        .args(["try-lock", "cli/held", "--", "sh", "-c", "echo ran"])
        .output()
        .expect("run ringlock");
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(out.stdout.is_empty(), "the command ran: {out:?}");
    drop(holder);
    let out = ringlock(&db.url())
        .args(["lock", "cli/free", "--", "sh", "-c", "exit 3"])
        .output()
        .expect("run ringlock");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(db.is_free("cli/free"));
    // Commands that need the lock server's table are usage errors here.
    let out = ringlock(&db.url())
        .args(["keys"])
        .output()
        .expect("run ringlock");
    assert_eq!(out.status.code(), Some(64), "{out:?}");
}

/// Waits for `child` to exit (failing after LIVENESS); its status and when.
fn exited(child: &mut Child) -> (ExitStatus, Instant) {
    let end = Instant::now() + LIVENESS;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return (status, Instant::now());
        }
        assert!(Instant::now() < end, "ringlock did not exit");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn stderr_of(child: &mut Child) -> String {
    let mut text = String::new();
    child
        .stderr
        .take()
        .expect("piped stderr")
        .read_to_string(&mut text)
        .expect("read stderr");
    text
}

/// `ringlock lock KEY -- sleep 60` on `url`, once it holds KEY: the child
/// and the holder's session id.
fn hold_sleeping(db: &MariaDb, url: &str, key: &str, extra: &[&str]) -> (Child, u64) {
    let mut child = ringlock(url)
        .args(["lock", "--kill-after", "5s"])
        .args(extra)
        .args([key, "--", "sleep", "60"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ringlock");
    let mut id = None;
    wait_until(&format!("ringlock holds {key}"), || {
        id = db.holder(key);
        id.is_some() || child.try_wait().expect("try_wait").is_some()
    });
    let id = id.unwrap_or_else(|| panic!("ringlock exited: {}", stderr_of(&mut child)));
    (child, id)
}

#[test]
fn cli_over_mysql_stops_the_command_at_once_when_its_session_is_killed() {
    let db = MariaDb::shared();
    let key = format!("cli/killed-{}", std::process::id());
    // The default keep-alive (30 s): only the connection watch can see the
    // KILL within the second allowed.
    let (mut child, id) = hold_sleeping(db, &db.url(), &key, &[]);
    let started = Instant::now();
    db.root()
        .query_drop(format!("KILL {id}"))
        .expect("KILL the holder's session");
    let (status, at) = exited(&mut child);
    let elapsed = at - started;
    let err = stderr_of(&mut child);
    assert_eq!(status.code(), Some(79), "{status}: {err}");
    assert!(
        elapsed < Duration::from_secs(1),
        "the command was stopped {elapsed:?} after the KILL: {err}"
    );
    assert!(
        err.contains(&format!("ringlock: lost the lock on {key}: "))
            && err.contains("connection watch")
            && err.contains("while the command ran; it got SIGTERM"),
        "{err}"
    );
    eprintln!("KILL to exit 79: {elapsed:?}");
}

#[test]
fn cli_over_mysql_stops_the_command_when_its_pings_go_unanswered() {
    // A stalled path shows nothing to the watch: the pings, at the
    // interval and timeout the flags set, find it.
    let db = MariaDb::shared();
    let proxy = Proxy::start(db.addr());
    let url = format!(
        "mysql://{}:{}@127.0.0.1:{}",
        mysql_common::USER,
        mysql_common::PASSWORD,
        proxy.addr.port()
    );
    let key = format!("cli/stalled-{}", std::process::id());
    let flags = ["--keepalive", "100ms", "--ping-timeout", "300ms"];
    let (mut child, id) = hold_sleeping(db, &url, &key, &flags);
    proxy.set_mode(&proxy.link(id), Mode::Stall);
    let (status, _) = exited(&mut child);
    let err = stderr_of(&mut child);
    assert_eq!(status.code(), Some(79), "{status}: {err}");
    assert!(
        err.contains("the keep-alive got no answer within its ping timeout")
            && err.contains("no answer within 300ms")
            && err.contains("it got SIGTERM"),
        "{err}"
    );
}

#[test]
fn cli_refuses_bad_keepalive_and_ping_timeout_before_any_traffic() {
    // Port 9 (discard): nothing listens there; a value is refused first.
    for (args, want) in [
        (
            &["--keepalive", "0"][..],
            "invalid value '0' for '--keepalive <D>': \"0\" is too short (at least 1ms)",
        ),
        (
            &["--ping-timeout", "soon"],
            "invalid value 'soon' for '--ping-timeout <D>': bad duration \"soon\"",
        ),
        (
            &["--keepalive", "50d"],
            "invalid value '50d' for '--keepalive <D>'",
        ),
        (
            &["--ping-timeout", "5000000s"],
            "\"5000000s\" is too long (at most 4294967295ms, about 49 days)",
        ),
    ] {
        for addr in ["mysql://u:p@127.0.0.1:9", "127.0.0.1:9"] {
            let out = ringlock(addr)
                .args(["lock"])
                .args(args)
                .args(["k", "--", "true"])
                .output()
                .expect("run ringlock");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(64), "{args:?} {addr}: {err}");
            assert!(
                err.starts_with("ringlock: ") && err.contains(want) && err.lines().count() == 1,
                "{args:?} {addr}: {err}"
            );
        }
    }
}

#[test]
fn cli_over_mysql_sigterm_while_waiting_withdraws_the_request() {
    let db = MariaDb::shared();
    let key = format!("cli/waiting-{}", std::process::id());
    let mut holder = mysql_common::Holder::take(db, &key);
    let mut child = ringlock(&db.url())
        .args(["lock", &key, "--", "sh", "-c", "echo ran"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ringlock");
    db.wait_waiting(&key);
    // SAFETY: plain syscall on our own, unreaped child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let (status, _) = exited(&mut child);
    let err = stderr_of(&mut child);
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{err}");
    assert!(
        err.contains("interrupted by signal 15, request withdrawn"),
        "{err}"
    );
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("piped stdout")
        .read_to_string(&mut out)
        .expect("read stdout");
    assert!(out.is_empty(), "the command ran: {out}");
    let needle = format!("GET_LOCK('{key}'");
    wait_until("no session waits", || db.waiting(&needle).is_empty());
    holder.release(&key);
    assert!(db.is_free(&key));
}
