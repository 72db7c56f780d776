//! Key watches in a 3-node cluster, with real processes: a watch on the
//! serving leader reports replicated changes; when the leader is cut off
//! (its lease lapses, it stops serving and closes its connections) or
//! killed, the watch ends with a reason (never silence) while the
//! replicated session is resumed on the new leader, and a new watch there
//! lists the holders as the new leader has them (the replicated holds);
//! a shared key's readers are listed each with its token and access by
//! `KEYH` on a follower after the failover.

mod common;

use std::time::Duration;

use common::cluster::Cluster;
use common::fault_proxy::poll_until;
use ringlock::client::{Access, Client, EventKind, RetryPolicy, Session};

const WAIT: Duration = Duration::from_secs(20);

fn session(c: &Cluster) -> Session {
    Session::builder(c.lock_addrs.as_slice())
        .retry(RetryPolicy::none())
        .keepalive(Duration::from_secs(10))
        .connect()
        .expect("session")
}

#[test]
fn a_watch_ends_at_a_failover_and_a_new_watch_lists_the_replicated_holders() {
    let mut c = Cluster::start(3, common::cluster::test_threads(), &[]);
    for fault in ["partition", "kill9"] {
        let l = c.leader(WAIT);
        let holder = session(&c);
        let watcher = session(&c);
        assert!(watcher.is_resumable() && watcher.offers_watches());
        let key = format!("{fault}-watched");
        let mut w = watcher.watch(&key).expect("watch");
        assert!(w.holders().is_empty());
        let held = holder.lock(&key, WAIT).expect("locked");
        let token = held.token().unwrap();
        let shared = format!("{fault}-shared");
        let readers = [
            holder.lock_shared(&shared, WAIT).expect("a reader"),
            watcher.lock_shared(&shared, WAIT).expect("another reader"),
        ];
        let e = w.next(Some(WAIT)).unwrap().expect("the grant is reported");
        assert_eq!((e.kind, e.holder.token), (EventKind::Granted, token));
        match fault {
            "partition" => c.isolate(l),
            _ => c.kill9(l),
        }
        // The watch ends, saying why; it never just goes quiet.
        let err = w
            .next(Some(Duration::from_secs(60)))
            .expect_err("the watch ends with its connection");
        assert!(
            err.to_string().contains("watch again"),
            "{fault}: the reason says what to do: {err}"
        );
        if fault == "partition" {
            c.heal();
        }
        // The watcher's session was resumed on the new leader; a new watch
        // there lists the hold, replicated before the failover.
        let mut again = None;
        poll_until("a watch on the new leader", WAIT, || {
            again = watcher.watch(&key).ok();
            again.is_some()
        });
        let again = again.unwrap();
        let listed: Vec<u64> = again.holders().iter().map(|h| h.token).collect();
        assert_eq!(listed, vec![token], "{fault}: the replicated holder");
        assert!(watcher.resumes() >= 1, "{fault}: the session was resumed");
        // KEYH on a follower of the new leader (a read barrier first):
        // both readers, replicated, each with its token.
        let l2 = c.leader(WAIT);
        let f = (0..3).find(|&i| i != l2 && c.nodes[i].is_some()).unwrap();
        let node = c.nodes[f].as_ref().unwrap();
        let every = Client::builder(node.lock_addr)
            .admin_addr(node.admin_addr)
            .build()
            .expect("admin client")
            .keyh()
            .expect("KEYH on a follower");
        let listed: Vec<(u64, Option<Access>)> = every
            .iter()
            .filter(|k| k.key == shared.as_bytes())
            .map(|k| (k.token, k.access))
            .collect();
        let want: Vec<(u64, Option<Access>)> = readers
            .iter()
            .map(|r| (r.token().unwrap(), Some(Access::Shared)))
            .collect();
        assert_eq!(listed, want, "{fault}: both readers on node {}", f + 1);
        let mut again = again;
        held.release().expect("released by its resumed session");
        let e = again.next(Some(WAIT)).unwrap().expect("the release");
        assert_eq!((e.kind, e.holder.token), (EventKind::Released, token));
        if fault == "kill9" {
            c.start_node(l);
        }
    }
}

/// Lines of a child's pipe, on a channel (read by a thread).
fn lines_of(r: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    rx
}

/// The next line on `rx` that `want` accepts (bounded); every line read
/// is kept in `seen` (for the failure messages).
fn wait_line(
    rx: &std::sync::mpsc::Receiver<String>,
    seen: &mut Vec<String>,
    what: &str,
    want: impl Fn(&str) -> bool,
) -> String {
    let end = std::time::Instant::now() + WAIT;
    loop {
        let left = end.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => {
                seen.push(l.clone());
                if want(&l) {
                    return l;
                }
            }
            Err(e) => panic!("no line {what} within {WAIT:?}: {e}; read: {seen:?}"),
        }
    }
}

/// An election in a 3-node cluster across `kill -9` of the leader node:
/// the elected `ringlock elect` keeps leading (its replicated session is
/// resumed on the new leader, its command keeps running), an `elect
/// --listen` observer carries over (resumed, watching again), and once the
/// leader's command ends the waiting candidate (a library `Election`) is
/// elected with a larger token, which the observer prints. Both values
/// are 255 bytes (a session source's most): replicated whole, in the
/// SessionHold entries the new leader holds.
#[test]
fn an_election_and_its_observer_survive_kill9_of_the_leader_node() {
    use std::process::{Command, Stdio};

    let mut c = Cluster::start(3, common::cluster::test_threads(), &[]);
    let l = c.leader(WAIT);
    let addrs: Vec<String> = c.lock_addrs.iter().map(|a| a.to_string()).collect();
    let ringlock = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringlock"));
        cmd.env_remove("RINGLOCK_ADDR")
            .env_remove("RINGLOCK_SOURCE")
            .args(["--addr", &addrs.join(","), "--retry", "5s"])
            .stdin(Stdio::null());
        cmd
    };
    let go = c.data_path(0).with_extension("elect-go");
    let alpha_value = format!("alpha-{}", "a".repeat(249));
    let beta_value = format!("beta-{}", "b".repeat(250));
    assert_eq!((alpha_value.len(), beta_value.len()), (255, 255));
    let mut listen = ringlock()
        .args(["elect", "--listen", "primary"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = lines_of(listen.stdout.take().unwrap());
    let (mut said, mut alpha_said, mut listen_said) = (Vec::new(), Vec::new(), Vec::new());
    let listen_err = lines_of(listen.stderr.take().unwrap());
    assert_eq!(wait_line(&out, &mut said, "none", |_| true), "none");
    // alpha leads until the file `go` exists (a bound of 60 s of its own).
    let mut alpha = ringlock()
        .args([
            "elect",
            "primary",
            &alpha_value,
            "--keepalive",
            "10s",
            "--",
            "sh",
            "-c",
        ])
        .arg(format!(
            "n=0; while [ ! -e {} ]; do n=$((n+1)); [ $n -gt 6000 ] && exit 9; sleep 0.01; done",
            go.display()
        ))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let alpha_err = lines_of(alpha.stderr.take().unwrap());
    let first = wait_line(&out, &mut said, "alpha leads", |l| l.starts_with("leader "));
    assert!(first.ends_with(&format!(" {alpha_value}")), "{first}");
    let ta: u64 = first.split(' ').nth(1).unwrap().parse().unwrap();
    c.kill9(l);
    let _ = c.leader(WAIT);
    // Both CLIs resumed their sessions on the new leader (each notes it).
    let resumed = |l: &str| l.contains("note:") && l.contains("resum");
    wait_line(&alpha_err, &mut alpha_said, "alpha resumed", resumed);
    wait_line(
        &listen_err,
        &mut listen_said,
        "the listener resumed",
        resumed,
    );
    assert!(
        alpha.try_wait().unwrap().is_none(),
        "alpha still runs: it still leads"
    );
    // A candidate of the library campaigns on the new leader, behind alpha.
    let beta = Session::builder(c.lock_addrs.as_slice())
        .retry(RetryPolicy::none())
        .connect()
        .expect("session");
    let e = beta.election("primary").unwrap();
    assert_eq!(
        e.leader().unwrap().map(|l| (l.token, l.value)),
        Some((ta, alpha_value.clone().into_bytes())),
        "alpha still leads on the new leader"
    );
    let campaign = {
        let v = beta_value.clone();
        std::thread::spawn(move || e.campaign(v, Some(WAIT)))
    };
    // alpha's command ends: alpha resigns, beta is elected.
    std::fs::write(&go, b"").unwrap();
    let st = alpha.wait().unwrap();
    assert!(
        st.success(),
        "alpha's command ended on its own, not lost: {st}"
    );
    let lb = campaign.join().unwrap().expect("beta elected");
    assert!(lb.token() > ta, "a larger token");
    let second = wait_line(&out, &mut said, "beta leads", |l| l.starts_with("leader "));
    assert_eq!(
        second,
        format!("leader {} {beta_value}", lb.token()),
        "the listener printed {said:?} (its notes: {listen_said:?})"
    );
    lb.resign().unwrap();
    assert_eq!(wait_line(&out, &mut said, "none", |_| true), "none");
    listen.kill().unwrap();
    listen.wait().unwrap();
    c.start_node(l);
}
