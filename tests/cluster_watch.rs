//! Key watches in a 3-node cluster, with real processes: a watch on the
//! serving leader reports replicated changes; when the leader is cut off
//! (its lease lapses, it stops serving and closes its connections) or
//! killed, the watch ends with a reason (never silence) while the
//! replicated session is resumed on the new leader, and a new watch there
//! lists the holders as the new leader has them (the replicated holds).

mod common;

use std::time::Duration;

use common::cluster::Cluster;
use common::fault_proxy::poll_until;
use ringlock::client::{EventKind, RetryPolicy, Session};

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
        let mut again = again;
        held.release().expect("released by its resumed session");
        let e = again.next(Some(WAIT)).unwrap().expect("the release");
        assert_eq!((e.kind, e.holder.token), (EventKind::Released, token));
        if fault == "kill9" {
            c.start_node(l);
        }
    }
}
