//! `ringlock elect` against the real server: candidates are elected in
//! the order they campaigned; a `kill -9` of the elected CLI (its command
//! dies with it) hands leadership to the next candidate at once, with a
//! larger fencing token, and `elect --listen` prints every change; bad
//! values are usage errors.

mod common;

use std::io::{BufRead, BufReader, Lines};
use std::process::{Child, ChildStdout, Command, Stdio};

use common::{wait_metric, Server, TempDir};

fn ringlock(s: &Server) -> Command {
    let mut c = common::ringlock_cmd(s.lock_addr, s.admin_addr);
    c.stdin(Stdio::null());
    c
}

/// A candidate whose command writes its token into `dir/NAME` and then
/// waits (for ever, or until killed).
fn candidate(s: &Server, dir: &TempDir, value: &str) -> Child {
    let file = dir.path(value);
    ringlock(s)
        .args(["elect", "db-primary", value, "--", "sh", "-c"])
        .arg(format!(
            "echo $RINGLOCK_TOKEN > {}.tmp && mv {0}.tmp {0} && exec sleep 1000",
            file.display()
        ))
        .stdout(Stdio::null())
        .spawn()
        .expect("ringlock elect")
}

fn next(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    lines.next().expect("a line").expect("utf-8")
}

fn token_in(dir: &TempDir, value: &str) -> u64 {
    common::session::eventually(&format!("{value} leads"), || dir.path(value).exists());
    std::fs::read_to_string(dir.path(value))
        .unwrap()
        .trim()
        .parse()
        .expect("a token")
}

#[test]
fn a_killed_leader_hands_over_to_the_next_candidate_and_listen_prints_it() {
    let s = Server::start(&["--metrics-bind", "127.0.0.1:0"]);
    let dir = TempDir::new("elect");
    let mut listen = ringlock(&s)
        .args(["elect", "--listen", "db-primary"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(listen.stdout.take().unwrap()).lines();
    assert_eq!(next(&mut lines), "none", "nobody leads yet");
    let mut a = candidate(&s, &dir, "alpha");
    let ta = token_in(&dir, "alpha");
    assert_eq!(next(&mut lines), format!("leader {ta} alpha"));
    // beta campaigns and waits behind alpha.
    let mut b = candidate(&s, &dir, "beta");
    wait_metric(s.metrics(), "ringlock_queued_waiters", 1.0);
    assert!(!dir.path("beta").exists(), "one leader at a time");
    // kill -9 of the elected CLI: its session ends, beta is elected.
    a.kill().unwrap();
    a.wait().unwrap();
    let tb = token_in(&dir, "beta");
    assert!(tb > ta, "the new leadership's token is larger");
    assert_eq!(next(&mut lines), "none");
    assert_eq!(next(&mut lines), format!("leader {tb} beta"));
    b.kill().unwrap();
    b.wait().unwrap();
    assert_eq!(next(&mut lines), "none");
    listen.kill().unwrap();
    listen.wait().unwrap();
}

#[test]
fn elect_refuses_a_bad_value_and_source_before_anything_is_sent() {
    let s = Server::start(&[]);
    for (args, why) in [
        (
            vec!["elect", "e", "", "--", "true"],
            "1 to 255 bytes, got 0",
        ),
        (
            vec!["elect", "e", &"v".repeat(256), "--", "true"],
            "elect VALUE: 1 to 255 bytes, got 256",
        ),
        (vec!["elect", "e", "v"], "<CMD>"),
        (vec!["elect", "--listen", "e", "v"], "cannot be used with"),
    ] {
        let o = ringlock(&s).args(&args).output().unwrap();
        assert_eq!(o.status.code(), Some(64), "{args:?}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(why), "{args:?}: {err}");
    }
    let o = ringlock(&s)
        .args(["--source", "x", "elect", "e", "v", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("VALUE is the candidate's source"));
}

#[test]
fn listen_prints_a_proclaimed_value_and_keeps_the_leader() {
    let s = Server::start(&["--threads", "2"]);
    let mut listen = ringlock(&s)
        .args(["elect", "--listen", "svc-leader", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(listen.stdout.take().unwrap()).lines();
    assert_eq!(next(&mut lines), r#"{"leader":null}"#);
    let sess = common::session::session(s.lock_addr);
    let mut l = sess
        .election("svc-leader")
        .unwrap()
        .campaign("10.0.0.1:80", None)
        .unwrap();
    let t = l.token();
    assert!(next(&mut lines).contains(&format!(r#""token":{t},"value":"10.0.0.1:80""#)));
    l.proclaim("10.0.0.2:80").unwrap();
    // The same leader, its new value: no "null" between.
    assert!(next(&mut lines).contains(&format!(r#""token":{t},"value":"10.0.0.2:80""#)));
    l.resign().unwrap();
    assert_eq!(next(&mut lines), r#"{"leader":null}"#);
    listen.kill().unwrap();
    listen.wait().unwrap();
}

/// A value of 255 bytes (a session source's most) is taken: the leader's
/// command sees its leadership under it, `keys` lists it, and `reset
/// --source` with it (the admin port's RSBS: over 127 bytes) ends it.
#[test]
fn a_255_byte_value_is_elected_listed_and_reset_by_source() {
    let s = Server::start(&["--threads", "2"]);
    let value = format!("10.0.0.7:5432/{}", "v".repeat(241));
    assert_eq!(value.len(), 255);
    // Leads at once (nobody does), prints who leads from inside CMD.
    let o = ringlock(&s)
        .args(["elect", "--timeout", "0", "long-e", &value, "--"])
        .args(["sh", "-c", "echo $RINGLOCK_TOKEN"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    // A library leader holds it; the CLI lists and resets it by its value.
    let sess = common::session::session(s.lock_addr);
    let l = sess
        .election("long-e")
        .unwrap()
        .campaign(&value, None)
        .unwrap();
    let listed = ringlock(&s).args(["keys", "--json"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains(&format!("\"source\":\"{value}\"")),
        "{listed:?}"
    );
    let o = ringlock(&s)
        .args(["reset", "--source", &value])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    common::session::eventually("the reset took the leadership", || {
        l.lease().lost().is_some()
    });
    assert!(common::keys(s.admin_addr).is_empty());
}
