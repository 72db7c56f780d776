//! `Session::election` of the Rust client against the real server:
//! candidates elected in the order they campaigned, observers told of
//! every leader, proclaim keeping the token, resign handing over, a
//! leader's session ending handing over at once, leadership lost to a
//! reset reported by proclaim, and bad values refused before anything is
//! sent. On one shard and on two.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::session::session;
use common::{Conn, Server};
use ringlock::client::{Leader, Observer};
use ringlock::lease::Error;

const LONG: Duration = Duration::from_secs(20);

/// The next change an observer sees: the leader after it.
fn change(o: &mut Observer) -> Option<Leader> {
    assert!(
        o.changed(Some(LONG)).expect("the observation is open"),
        "a change within the bound"
    );
    o.leader().cloned()
}

#[test]
fn candidates_lead_in_campaign_order_and_observers_see_each_leader() {
    for threads in ["1", "2"] {
        let s = Server::start(&["--threads", threads, "--metrics-bind", "127.0.0.1:0"]);
        let (a, b, c, obs) = (
            session(s.lock_addr),
            session(s.lock_addr),
            session(s.lock_addr),
            session(s.lock_addr),
        );
        for name in ["e-alpha", "e-beta", "e-gamma"] {
            let mut o = obs.election(name).unwrap().observe().unwrap();
            assert_eq!(o.leader(), None, "nobody leads yet");
            let mut la = a.election(name).unwrap().campaign("a:1", None).unwrap();
            let first = change(&mut o).expect("a leads");
            assert_eq!(first.token, la.token());
            assert_eq!(first.value, b"a:1");
            assert_eq!(
                obs.election(name).unwrap().leader().unwrap(),
                Some(first.clone())
            );
            // b, then c campaign; each waits (in that order).
            let (tx, rx) = mpsc::channel();
            let mut waiters = Vec::new();
            for (who, sess) in [("b", b.clone()), ("c", c.clone())] {
                let tx = tx.clone();
                let e = sess.election(name).unwrap();
                waiters.push(std::thread::spawn(move || {
                    let l = e.campaign(format!("{who}:1"), None).unwrap();
                    tx.send(who).unwrap();
                    l
                }));
                // Queued before the next one campaigns.
                common::wait_metric(s.metrics(), "ringlock_queued_waiters", waiters.len() as f64);
            }
            // a proclaims: the same token, a new value, observers told.
            la.proclaim("a:2").unwrap();
            assert_eq!(la.value(), b"a:2");
            let p = change(&mut o).expect("still a");
            assert_eq!((p.token, &p.value[..]), (first.token, &b"a:2"[..]));
            assert!(rx.try_recv().is_err(), "a proclaim elects nobody");
            // a resigns: b leads (campaigned first), with a larger token.
            la.resign().unwrap();
            assert_eq!(change(&mut o), None, "a's leadership ended");
            let second = change(&mut o).expect("b leads");
            assert_eq!(rx.recv_timeout(LONG).unwrap(), "b");
            assert_eq!(second.value, b"b:1");
            assert!(second.token > first.token);
            let lb = waiters.remove(0).join().unwrap();
            assert_eq!(lb.token(), second.token);
            // b's session ends (its connection closed): c leads at once.
            drop(lb);
            assert_eq!(change(&mut o), None);
            let third = change(&mut o).expect("c leads");
            assert_eq!(rx.recv_timeout(LONG).unwrap(), "c");
            assert_eq!(third.value, b"c:1");
            assert!(third.token > second.token);
            let lc = waiters.remove(0).join().unwrap();
            lc.resign().unwrap();
            assert_eq!(change(&mut o), None);
            o.close().unwrap();
        }
    }
}

#[test]
fn a_leader_whose_session_ends_is_replaced_and_the_observer_told() {
    let s = Server::start(&["--metrics-bind", "127.0.0.1:0"]);
    let obs = session(s.lock_addr);
    let mut o = obs.election("e-end").unwrap().observe().unwrap();
    let a = session(s.lock_addr);
    let la = a.election("e-end").unwrap().campaign("a", None).unwrap();
    assert_eq!(change(&mut o).map(|l| l.token), Some(la.token()));
    let b = session(s.lock_addr);
    let e = b.election("e-end").unwrap();
    let waiter = std::thread::spawn(move || e.campaign("b", Some(LONG)).unwrap());
    common::wait_metric(s.metrics(), "ringlock_queued_waiters", 1.0);
    // The leader's session ends without a release (as when its process
    // is killed: the server sees the connection close).
    a.close();
    assert_eq!(change(&mut o), None);
    let next = change(&mut o).expect("b leads");
    let lb = waiter.join().unwrap();
    assert_eq!((next.token, &next.value[..]), (lb.token(), &b"b"[..]));
    // The old leadership knows it is gone: a proclaim says so.
    let mut la = la;
    assert!(matches!(la.proclaim("a:2"), Err(Error::Lost(_))));
}

#[test]
fn a_reset_leadership_is_reported_lost_by_proclaim_and_bad_values_are_refused() {
    let s = Server::start(&[]);
    let a = session(s.lock_addr);
    let e = a.election("e-reset").unwrap();
    for bad in [&b""[..], &[b'v'; 256][..]] {
        assert!(matches!(
            e.campaign(bad, None),
            Err(Error::InvalidArgument(_))
        ));
    }
    assert!(matches!(a.election(""), Err(Error::InvalidKey(_))));
    let mut l = e.campaign("v", Some(LONG)).unwrap();
    assert!(matches!(
        l.proclaim([b'v'; 256]),
        Err(Error::InvalidArgument(_))
    ));
    let mut lc = Conn::persistent(s.lock_addr);
    assert_eq!(lc.reset_key(b"e-reset"), b'+');
    match l.proclaim("v2") {
        Err(Error::Lost(lost)) => assert!(lost.to_string().contains("e-reset"), "{lost}"),
        other => panic!("expected the leadership lost, got {other:?}"),
    }
    assert_eq!(e.leader().unwrap(), None);
}
