//! `ringlock::client::Session` against the real `ringlockd`: session
//! holds freed when the session ends, missed keep-alives (through a
//! stalling proxy), lease expiry and its Lost push, stale tokens, one
//! Release for eight callers, release from inside the lost handler, and
//! cancellations that land at the moment of grant. Faults the real server
//! cannot be made to show are in tests/session_fake.rs.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use common::session::{eventually, holder_of, session, Proxy};
use common::Server;
use ringlock::client::{Acquire, Hold, RetryPolicy, Session, Wait};
use ringlock::lease::{CancelToken, Error, Lease, LockOptions, LostReason};
use ringlock::protocol::session::{self as wire, HoldMode};

#[test]
fn closing_the_session_frees_its_session_holds_at_once() {
    let s = Server::start(&["--metrics-bind", "127.0.0.1:0"]);
    let a = session(s.lock_addr);
    let (tx, rx) = mpsc::channel();
    let opts = LockOptions::new().on_lost(move |_, lost| {
        let _ = tx.send(lost.reason());
    });
    let lease = a.lock_with("k", Duration::from_secs(5), &opts).unwrap();
    let first = lease.token().expect("a token");
    assert_eq!(lease.session_id(), Some(a.session_id()));
    let held = holder_of(&s, "k").expect("held");
    assert_eq!((held.token, held.mode), (first, HoldMode::Session));
    assert_eq!(held.endpoint, a.local_addr().unwrap().to_string());

    // A waiter queued behind it is granted the moment the session ends.
    let b = session(s.lock_addr);
    let waiter = thread::spawn(move || {
        let got = b.lock("k", Duration::from_secs(30));
        (got, b)
    });
    common::wait_metric(s.metrics(), "ringlock_queued_waiters", 1.0);
    a.close();
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(30)),
        Ok(LostReason::ConnectionLost),
        "the holder is told"
    );
    let (got, b) = waiter.join().unwrap();
    let second = got.expect("granted when the first session closed");
    assert!(second.token().unwrap() > first, "tokens increase");
    let err = lease.release().unwrap_err();
    assert_eq!(err.lost().unwrap().reason(), LostReason::ConnectionLost);
    assert!(matches!(
        a.lock("other", Duration::from_secs(1)),
        Err(Error::Unavailable(_))
    ));
    second.release().unwrap();
    assert!(holder_of(&s, "k").is_none());
    drop(b);
}

#[test]
fn dropping_the_last_handle_ends_the_session() {
    let s = Server::start(&[]);
    let a = session(s.lock_addr);
    let lease = a.lock("d", Duration::from_secs(5)).unwrap();
    // The lease keeps the session open: dropping the Session alone does not
    // end it.
    drop(a);
    assert!(holder_of(&s, "d").is_some());
    // Dropping the lease releases it (one Release) and then closes.
    drop(lease);
    eventually("free", || holder_of(&s, "d").is_none());
    let b = session(s.lock_addr);
    b.try_lock("d").unwrap().expect("free at once");
}

#[test]
fn a_stalled_connection_is_lost_here_before_the_server_frees_the_key() {
    // K = 1.5 s: I = T = 500 ms, so the client gives up after at most 1 s
    // and the server no sooner than 1.5 s after the last frame it got.
    let s = Server::start(&[]);
    let proxy = Proxy::new(s.lock_addr);
    let a = Session::builder(proxy.addr)
        .keepalive(Duration::from_millis(1_500))
        .retry(RetryPolicy::none())
        .connect()
        .unwrap();
    assert_eq!(a.keepalive(), Duration::from_millis(1_500));
    assert_eq!(a.detection_window(), Duration::from_secs(1));
    let events = Arc::new(Mutex::new(Vec::<String>::new()));
    let ev = events.clone();
    let opts = LockOptions::new().on_lost(move |lease, lost| {
        ev.lock()
            .unwrap()
            .push(format!("lost {} {:?}", lease.key(), lost.reason()));
    });
    let lease = a.lock_with("hang", Duration::from_secs(5), &opts).unwrap();
    let b = session(s.lock_addr);
    let ev = events.clone();
    let waiter = thread::spawn(move || {
        let got = b.lock("hang", Duration::from_secs(60));
        ev.lock().unwrap().push("granted elsewhere".into());
        (got, b)
    });
    proxy.stall();
    let (got, _b) = waiter.join().unwrap();
    let next = got.expect("the server ended the silent session and freed the key");
    assert!(next.token() > lease.token());
    assert_eq!(
        *events.lock().unwrap(),
        ["lost hang KeepAliveTimedOut", "granted elsewhere"],
        "the holder learns it lost the lock before anyone else can get it"
    );
    assert!(matches!(lease.release(), Err(Error::Lost(_))));
}

#[test]
fn ping_timeout_can_only_shorten_the_sessions_own() {
    // K = 3 s: the session's own ping timeout is K/3 = 1 s.
    let s = Server::start(&[]);
    let open = |t: Option<Duration>| {
        let mut b = Session::builder(s.lock_addr)
            .keepalive(Duration::from_secs(3))
            .retry(RetryPolicy::none());
        if let Some(t) = t {
            b = b.ping_timeout(t);
        }
        b.connect().unwrap()
    };
    assert_eq!(open(None).ping_timeout(), Duration::from_secs(1));
    let short = open(Some(Duration::from_millis(200)));
    assert_eq!(short.ping_timeout(), Duration::from_millis(200));
    assert_eq!(short.ping_interval(), Duration::from_secs(1));
    assert_eq!(
        open(Some(Duration::from_secs(5))).ping_timeout(),
        Duration::from_secs(1),
        "longer than K/3 would let the server end the session first"
    );
    let lease = short.lock("short-ping", Duration::from_secs(5)).unwrap();
    lease.release().unwrap();
}

#[test]
fn lease_expiry_is_reported_and_the_next_waiter_gets_a_larger_token() {
    let s = Server::start(&[]);
    let a = session(s.lock_addr);
    let (tx, rx) = mpsc::channel();
    let opts = LockOptions::new().on_lost(move |lease, lost| {
        let _ = tx.send((lease.token(), lost.reason()));
    });
    let lease = a
        .acquire(
            "lease/k",
            Acquire {
                hold: Hold::Lease(Duration::from_millis(300)),
                wait: Wait::Try,
                ..Acquire::default()
            },
            &opts,
        )
        .unwrap();
    let first = lease.token().unwrap();
    let info = holder_of(&s, "lease/k").expect("held");
    assert_eq!(info.mode, HoldMode::Lease);
    assert!(info.lease_left_ms.is_some_and(|ms| ms <= 300), "{info:?}");
    // Extending works while it is alive, and moves the client's expiry.
    let before = lease.expires_at().unwrap();
    let after = lease.extend().unwrap().expect("a lease has an expiry");
    assert!(after >= before);

    let b = session(s.lock_addr);
    let next = b
        .lock("lease/k", Duration::from_secs(30))
        .expect("granted once the lease expired");
    assert!(next.token().unwrap() > first, "a larger token");
    let (token, reason) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!((token, reason), (Some(first), LostReason::Expired));
    assert!(matches!(lease.release(), Err(Error::Lost(_))));
    assert!(matches!(lease.extend(), Err(Error::Lost(_))));
    assert_eq!(
        holder_of(&s, "lease/k").unwrap().token,
        next.token().unwrap()
    );
    // A's session outlived its lease: it still works.
    assert!(a.try_lock("lease/other").unwrap().is_some());
}

/// A lease through the proxy, and a handler that reports its loss.
fn lease_through(
    proxy: &Proxy,
    key: &str,
    ttl_ms: u64,
) -> (Session, Lease, mpsc::Receiver<LostReason>) {
    let a = Session::builder(proxy.addr)
        .retry(RetryPolicy::none())
        .release_timeout(Duration::from_millis(300))
        .connect()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let opts = LockOptions::new().on_lost(move |_, lost| {
        let _ = tx.send(lost.reason());
    });
    let what = Acquire {
        hold: Hold::Lease(Duration::from_millis(ttl_ms)),
        wait: Wait::Try,
        ..Acquire::default()
    };
    let lease = a.acquire(key, what, &opts).unwrap();
    (a, lease, rx)
}

#[test]
fn a_stale_token_cannot_unlock() {
    let s = Server::start(&[]);
    let proxy = Proxy::new(s.lock_addr);
    let (a, lease, lost) = lease_through(&proxy, "stale/release", 200);
    // The server's answers and pushes stop reaching the holder.
    Proxy::set(&proxy.down, true);
    let b = session(s.lock_addr);
    let theirs = b
        .lock("stale/release", Duration::from_secs(30))
        .expect("granted when the lease expired");
    assert!(theirs.token() > lease.token());
    // The holder's own clock expired it (no push got through).
    assert_eq!(
        lost.recv_timeout(Duration::from_secs(30)),
        Ok(LostReason::Expired)
    );
    // Its release still names its token: the server refuses it and the new
    // holder keeps the key.
    assert!(matches!(lease.release(), Err(Error::Lost(_))));
    assert_eq!(
        proxy.count(wire::OP_RELEASE),
        1,
        "the stale Release was sent"
    );
    // The server handles a session's requests in order: once a later one
    // is answered, the Release was decided.
    Proxy::set(&proxy.down, false);
    assert!(a.try_lock("stale/sync").unwrap().is_some());
    let now = holder_of(&s, "stale/release").expect("still held");
    assert_eq!(
        Some(now.token),
        theirs.token(),
        "the new holder keeps the key"
    );
    theirs.release().unwrap();
}

#[test]
fn a_stale_token_cannot_extend() {
    let s = Server::start(&[]);
    let proxy = Proxy::new(s.lock_addr);
    let (_a, lease, _lost) = lease_through(&proxy, "stale/extend", 200);
    // An acquire whose answer took more than half the TTL (a loaded
    // machine) is extended once before it is handed out: not this one.
    let before = proxy.count(wire::OP_EXTEND);
    // The Extend leaves before the lease expires but reaches the server
    // after someone else got the key.
    Proxy::set(&proxy.up, true);
    let l2 = lease.clone();
    let extend = thread::spawn(move || l2.extend());
    let b = session(s.lock_addr);
    let theirs = b
        .lock("stale/extend", Duration::from_secs(30))
        .expect("granted when the lease expired");
    Proxy::set(&proxy.up, false);
    let got = extend.join().unwrap();
    assert!(matches!(got, Err(Error::Lost(_))), "{got:?}");
    assert_eq!(
        proxy.count(wire::OP_EXTEND),
        before + 1,
        "the stale Extend was sent, once"
    );
    let now = holder_of(&s, "stale/extend").expect("still held");
    assert_eq!(
        Some(now.token),
        theirs.token(),
        "the new holder keeps the key"
    );
    assert_eq!(now.mode, HoldMode::Session);
    theirs.release().unwrap();
}

#[test]
fn a_reset_of_a_session_hold_is_pushed_to_its_holder() {
    let s = Server::start(&[]);
    let a = session(s.lock_addr);
    let (tx, rx) = mpsc::channel();
    let opts = LockOptions::new().on_lost(move |_, lost| {
        let _ = tx.send(lost.reason());
    });
    let lease = a.lock_with("r", Duration::from_secs(5), &opts).unwrap();
    assert_eq!(common::admin_names(s.admin_addr, b"RSET", &[b"r"]), b"++");
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(30)),
        Ok(LostReason::Reset)
    );
    assert!(matches!(lease.release(), Err(Error::Lost(_))));
}

#[test]
fn eight_concurrent_releases_send_one_release() {
    let s = Server::start(&[]);
    let proxy = Proxy::new(s.lock_addr);
    let a = session(proxy.addr);
    let lease = a.lock("eight", Duration::from_secs(5)).unwrap();
    let barrier = Arc::new(Barrier::new(8));
    let ok = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (lease, barrier, ok) = (lease.clone(), barrier.clone(), ok.clone());
            thread::spawn(move || {
                barrier.wait();
                if lease.release().is_ok() {
                    ok.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(ok.load(Ordering::SeqCst), 8);
    assert!(holder_of(&s, "eight").is_none());
    assert_eq!(proxy.count(wire::OP_RELEASE), 1, "one Release on the wire");
    drop(lease);
    assert_eq!(proxy.count(wire::OP_RELEASE), 1, "the drop sends none");
}

#[test]
fn release_from_inside_the_lost_handler_returns() {
    let s = Server::start(&[]);
    let a = session(s.lock_addr);
    let other = a.lock("other", Duration::from_secs(5)).unwrap();
    let (tx, rx) = mpsc::channel();
    let o = other.clone();
    let opts = LockOptions::new().on_lost(move |lease: &Lease, _| {
        let own = lease.release();
        let theirs = o.release();
        let _ = tx.send((own.is_err(), theirs.is_ok()));
    });
    let lease = a
        .acquire(
            "short",
            Acquire {
                hold: Hold::Lease(Duration::from_millis(50)),
                wait: Wait::Try,
                ..Acquire::default()
            },
            &opts,
        )
        .unwrap();
    let (own_lost, other_released) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the handler returned");
    assert!(own_lost, "its own release reports the loss");
    assert!(other_released, "another lease released from the handler");
    assert!(holder_of(&s, "other").is_none());
    drop((lease, opts));
}

#[test]
fn cancellation_at_the_moment_of_grant_never_leaks_a_key() {
    let s = Server::start(&["--metrics-bind", "127.0.0.1:0"]);
    let holder = session(s.lock_addr);
    let waiter = session(s.lock_addr);
    let (mut granted, mut cancelled) = (0, 0);
    for round in 0..60 {
        let lease = holder.lock("race", Duration::from_secs(5)).unwrap();
        let token = CancelToken::new().unwrap();
        let w = waiter.clone();
        let t2 = token.clone();
        let t = thread::spawn(move || {
            w.lock_with(
                "race",
                Duration::from_secs(30),
                &LockOptions::new().cancel(t2),
            )
        });
        common::wait_metric(s.metrics(), "ringlock_queued_waiters", 1.0);
        // Release and cancel at once: the grant and the Cancel race.
        if round % 2 == 0 {
            token.cancel();
            lease.release().unwrap();
        } else {
            lease.release().unwrap();
            token.cancel();
        }
        match t.join().unwrap() {
            // Cancelled before the grant could exist: a cancelled caller
            // never gets a lease, even when the grant beat its Cancel to
            // the server (then the grant is released for it).
            Ok(_) if round % 2 == 0 => panic!("round {round}: a lease after the cancel"),
            Ok(l) => {
                granted += 1;
                l.release().unwrap();
            }
            Err(Error::Cancelled) => cancelled += 1,
            Err(e) => panic!("round {round}: {e}"),
        }
        // Whatever happened, nobody holds the key and nobody waits for it.
        assert!(holder_of(&s, "race").is_none(), "round {round}: leaked");
        common::wait_metric(s.metrics(), "ringlock_queued_waiters", 0.0);
    }
    assert_eq!(granted + cancelled, 60);
}

#[test]
fn waits_are_decided_by_the_server() {
    let s = Server::start(&[]);
    let a = session(s.lock_addr);
    let b = session(s.lock_addr);
    let lease = a.lock("w", Duration::from_secs(5)).unwrap();
    assert!(b.try_lock("w").unwrap().is_none(), "busy");
    assert!(matches!(
        b.lock("w", Duration::from_millis(50)),
        Err(Error::Timeout)
    ));
    lease.release().unwrap();
    let mine = b.try_lock("w").unwrap().expect("free");
    assert!(mine.token() > lease.token());
}
