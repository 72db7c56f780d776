//! The client conformance suite, Rust edition: every scenario of the list
//! shared by the Rust, Python and Go clients, driven through
//! `ringlock::client::Session` against the real `ringlockd` (shards from
//! `RINGLOCK_TEST_THREADS`, default 1). The list, once:
//!
//! 1. `grant` — a free key is granted with a token > 0 and released;
//!    another session then gets it with a larger token.
//! 2. `fifo` — B, C, D queue (each confirmed queued by the server) behind
//!    A; A releases; they are granted in the order B, C, D.
//! 3. `try` — a try-lock of a held key answers "held" at once; of a free
//!    key grants.
//! 4. `timeout` — a short wait on a held key ends in a timeout; the holder
//!    still holds; the key is not leaked to the timed-out client.
//! 5. `cancel_race` — a queued Acquire is cancelled while the holder
//!    releases, many rounds; afterwards the key is held by the cancelled
//!    client (which releases it) or free: a third session always gets it.
//! 6. `lease_expiry_lost` — an unextended 1 s lease expires on the server;
//!    the holder is told; another session gets a larger token.
//! 7. `session_end_on_close` — closing a session frees its session holds
//!    and a waiter on another session is granted.
//! 8. `keepalive_loss` — the holder's keep-alives stop (a proxy stalls the
//!    connection); the server ends the session, the waiter is granted; the
//!    holder learns the lock is lost.
//! 9. `stale_token_release` — a Release naming an older token is refused
//!    (`stale token`) and the current holder keeps the key.
//! 10. `auth_refused` — with `--auth-token-file`, a Hello without or with
//!     a wrong token is refused (`unauthorized`); the right one works.
//! 11. `server_restart_durable` — with `--data-path`, tokens after a
//!     `kill -9` and restart are larger than every token before; a
//!     persistent hold survives.
//! 12. `shards` — keys spread over the shards, locked and released
//!     concurrently: each key's tokens increase.
//! 13. `modes_fifo` — two readers share a key (tokens increasing); an
//!     exclusive try is refused and writer W queues; a later reader R3's
//!     try is refused and it queues behind W (each confirmed queued); W
//!     waits until both readers left, then is granted while R3 still
//!     waits; after W's release R3 is granted, each with a larger token.
//! 14. `modes_semaphore` — a semaphore of 2 admits two; a third's try is
//!     refused; its request for 3 slots is `Error::ModeMismatch` naming
//!     the key and changes nothing; queued for 2, it is granted when one
//!     holder releases (a larger token); the free key takes a permit of 5.
//! 15. `watch_order` — a watcher of a key held by A lists A; B queues; A
//!     releases: the watcher is told A released, then B granted (B's
//!     token), in that order; B's session closes: B's session ended; the
//!     watch closed, no more changes are reported.
//! 16. `watch_rewatch` — a watch ends with its session (the next read is
//!     an error, not silence); a change made meanwhile is not replayed: a
//!     new session's watch lists the holders as they are now.
//! 17. `election_order` — A, B, C campaign in that order; the observer
//!     sees nobody, A, A's proclaimed value (same token, nobody else
//!     elected), then B and C as A and B resign; a proclaim after the
//!     resignation is leadership lost.
//! 18. `election_handover` — A leads, B waits; A's session ends without
//!     resigning: B is elected with a larger token and the observer told;
//!     A's proclaim is leadership lost.
//!
//! Run: `cargo test --features faults --test conformance [NAME...]`.

mod common;

use std::collections::HashMap;
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::session::{holder_of, session, Proxy};
use common::{Server, TempDir};
use ringlock::client::{
    Access, Acquire, Client, EventKind, Hold, RetryPolicy, Session, Wait, WatchEvent,
};
use ringlock::lease::{CancelToken, Error, LockOptions, LostReason};
use ringlock::protocol::session as wire;

const WAIT: Duration = Duration::from_secs(30);

fn with_metrics() -> Server {
    Server::start(&["--metrics-bind", "127.0.0.1:0"])
}

/// Waits (bounded) until the server shows `n` queued requests.
fn queued(s: &Server, n: usize) {
    common::wait_metric(s.metrics(), "ringlock_queued_waiters", n as f64);
}

/// The server's queued requests now. The loop publishes the gauge before
/// it sends the answers of the same tick, so read after an answer (a
/// release, a grant) it shows whether that answer's tick let a waiter in.
fn waiting(s: &Server) -> usize {
    common::metric(s.metrics(), "ringlock_queued_waiters") as usize
}

fn token(l: &ringlock::lease::Lease) -> u64 {
    l.token().expect("session leases carry a token")
}

fn grant() {
    let s = Server::start(&[]);
    let (a, b) = (session(s.lock_addr), session(s.lock_addr));
    let first = a.lock("c/grant", WAIT).expect("a free key is granted");
    assert!(token(&first) > 0);
    first.release().expect("released");
    let second = b.lock("c/grant", WAIT).expect("free again");
    assert!(token(&second) > token(&first), "tokens increase");
    second.release().expect("released");
}

fn fifo() {
    let s = with_metrics();
    let a = session(s.lock_addr);
    let held = a.lock("c/fifo", WAIT).expect("granted");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (i, name) in ["B", "C", "D"].into_iter().enumerate() {
        let w = session(s.lock_addr);
        let order = order.clone();
        waiters.push(thread::spawn(move || {
            let l = w.lock("c/fifo", WAIT).expect("granted in turn");
            order.lock().unwrap().push((name, token(&l)));
            l.release().expect("released");
        }));
        // Queued before the next one arrives.
        queued(&s, i + 1);
    }
    held.release().expect("released");
    for w in waiters {
        w.join().expect("waiter");
    }
    let order = order.lock().unwrap();
    let names: Vec<&str> = order.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["B", "C", "D"], "granted in arrival order");
    assert!(order.windows(2).all(|w| w[0].1 < w[1].1));
    assert!(order[0].1 > token(&held));
}

fn try_() {
    let s = Server::start(&[]);
    let (a, b) = (session(s.lock_addr), session(s.lock_addr));
    let held = a.lock("c/try", WAIT).expect("granted");
    let t0 = Instant::now();
    assert!(b.try_lock("c/try").expect("answered").is_none(), "held");
    assert!(t0.elapsed() < Duration::from_secs(5), "answered at once");
    held.release().expect("released");
    let got = b
        .try_lock("c/try")
        .expect("answered")
        .expect("free: granted");
    assert!(token(&got) > token(&held));
}

fn timeout() {
    let s = Server::start(&[]);
    let (a, b) = (session(s.lock_addr), session(s.lock_addr));
    let held = a.lock("c/timeout", WAIT).expect("granted");
    assert!(matches!(
        b.lock("c/timeout", Duration::from_millis(200)),
        Err(Error::Timeout)
    ));
    assert_eq!(
        holder_of(&s, "c/timeout").map(|k| k.token),
        held.token(),
        "the holder still holds"
    );
    held.release().expect("released");
    assert!(
        holder_of(&s, "c/timeout").is_none(),
        "not leaked to the timed-out client"
    );
}

fn cancel_race() {
    let s = with_metrics();
    let (a, b, c) = (
        session(s.lock_addr),
        session(s.lock_addr),
        session(s.lock_addr),
    );
    let (mut granted, mut cancelled) = (0, 0);
    for round in 0..40 {
        let held = a.lock("c/cancel", WAIT).expect("holder granted");
        let cancel = CancelToken::new().expect("cancel token");
        let opts = LockOptions::new().cancel(cancel.clone());
        let b2 = b.clone();
        let waiter = thread::spawn(move || b2.lock_with("c/cancel", WAIT, &opts));
        queued(&s, 1);
        // The cancel and the release at about the same moment.
        let go = Arc::new(Barrier::new(2));
        let g = go.clone();
        let releaser = thread::spawn(move || {
            g.wait();
            held.release().expect("holder releases");
        });
        go.wait();
        cancel.cancel();
        releaser.join().expect("releaser");
        match waiter.join().expect("waiter") {
            Ok(l) => {
                granted += 1;
                l.release()
                    .expect("the cancelled client releases its grant");
            }
            Err(e) if e.is_cancellation() => cancelled += 1,
            Err(e) => panic!("round {round}: {e}"),
        }
        // Never held by nobody-knows-whom.
        let third = c
            .try_lock("c/cancel")
            .expect("answered")
            .unwrap_or_else(|| panic!("round {round}: the key is held after the race"));
        third.release().expect("released");
    }
    assert_eq!(granted + cancelled, 40);
}

fn lease_expiry_lost() {
    let s = Server::start(&[]);
    let (a, b) = (session(s.lock_addr), session(s.lock_addr));
    let (tx, rx) = mpsc::channel();
    let opts = LockOptions::new().on_lost(move |_, lost| {
        let _ = tx.send(lost.reason());
    });
    let what = Acquire {
        hold: Hold::Lease(Duration::from_secs(1)),
        wait: Wait::Try,
        ..Acquire::default()
    };
    let lease = a.acquire("c/lease", what, &opts).expect("granted");
    // Not extended: b waits for the server to expire it.
    let next = b.lock("c/lease", WAIT).expect("granted once it expired");
    assert!(token(&next) > token(&lease));
    assert_eq!(rx.recv_timeout(WAIT), Ok(LostReason::Expired), "told");
    assert!(lease.lost().is_some());
    next.release().expect("released");
}

fn session_end_on_close() {
    let s = with_metrics();
    let (a, b) = (session(s.lock_addr), session(s.lock_addr));
    let one = a.lock("c/close/1", WAIT).expect("granted");
    let _two = a.lock("c/close/2", WAIT).expect("granted");
    let waiter = thread::spawn(move || {
        let l = b.lock("c/close/1", WAIT);
        (l, b)
    });
    queued(&s, 1);
    a.close();
    let (got, _b) = waiter.join().expect("waiter");
    assert!(token(&got.expect("granted when the holder closed")) > token(&one));
    assert!(
        holder_of(&s, "c/close/2").is_none(),
        "every session hold freed"
    );
}

fn keepalive_loss() {
    let s = with_metrics();
    let proxy = Proxy::new(s.lock_addr);
    let a = Session::builder(proxy.addr)
        .keepalive(Duration::from_millis(900))
        .retry(RetryPolicy::none())
        .connect()
        .expect("session through the proxy");
    let (tx, rx) = mpsc::channel();
    let opts = LockOptions::new().on_lost(move |_, lost| {
        let _ = tx.send(lost.reason());
    });
    let held = a.lock_with("c/keepalive", WAIT, &opts).expect("granted");
    let b = session(s.lock_addr);
    let waiter = thread::spawn(move || {
        let l = b.lock("c/keepalive", WAIT);
        (l, b)
    });
    queued(&s, 1);
    // Nothing gets through any more: no keep-alive reaches the server.
    proxy.stall();
    let (got, _b) = waiter.join().expect("waiter");
    let next = got.expect("granted when the server ended the silent session");
    assert!(token(&next) > token(&held));
    assert_eq!(
        rx.recv_timeout(WAIT),
        Ok(LostReason::KeepAliveTimedOut),
        "the holder learns it lost the lock"
    );
    Proxy::set(&proxy.up, false);
    Proxy::set(&proxy.down, false);
    assert!(matches!(held.release(), Err(Error::Lost(_))));
}

fn stale_token_release() {
    let s = Server::start(&[]);
    let proxy = Proxy::new(s.lock_addr);
    let a = Session::builder(proxy.addr)
        .retry(RetryPolicy::none())
        .connect()
        .expect("session through the proxy");
    let mine = a
        .acquire(
            "c/stale",
            Acquire {
                hold: Hold::Persistent,
                wait: Wait::Try,
                ..Acquire::default()
            },
            &LockOptions::new(),
        )
        .expect("granted");
    // The holder stops hearing the server (so it does not learn of the
    // reset below) and its token goes stale: reset, then granted to b.
    Proxy::set(&proxy.down, true);
    let admin = Client::builder(s.lock_addr).build().expect("client");
    admin.reset_by_key("c/stale").expect("reset");
    let b = session(s.lock_addr);
    let theirs = b.lock("c/stale", WAIT).expect("granted after the reset");
    assert!(token(&theirs) > token(&mine));
    let release = thread::spawn(move || mine.release());
    common::session::eventually("the stale Release is sent", || {
        proxy.count(wire::OP_RELEASE) == 1
    });
    Proxy::set(&proxy.down, false);
    assert!(
        matches!(release.join().expect("release"), Err(Error::Lost(_))),
        "refused"
    );
    // The session's later request is answered after its Release was decided.
    assert!(a.try_lock("c/stale/sync").expect("answered").is_some());
    assert_eq!(
        holder_of(&s, "c/stale").map(|k| k.token),
        theirs.token(),
        "the current holder keeps the key"
    );
}

fn auth_refused() {
    let dir = TempDir::new("conformance-auth");
    let file = dir.path("token");
    std::fs::write(&file, "conformance-secret\n").expect("token file");
    let s = Server::start(&["--auth-token-file", file.to_str().expect("utf-8")]);
    let open = |token: &[u8]| {
        Session::builder(s.lock_addr)
            .auth_token(token.to_vec())
            .retry(RetryPolicy::none())
            .connect()
    };
    for bad in [&b""[..], b"conformance-secreT"] {
        match open(bad) {
            Err(Error::Unavailable(e)) => {
                assert!(e.to_string().contains("unauthorized"), "{e}")
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a session with token {bad:?}"),
        }
    }
    let ok = open(b"conformance-secret").expect("the right token opens");
    ok.lock("c/auth", WAIT).expect("granted").release().unwrap();
}

fn server_restart_durable() {
    let dir = TempDir::new("conformance-durable");
    let data = dir.path("data");
    let data = data.to_str().expect("utf-8");
    let mut s = Server::start(&["--data-path", data]);
    let a = session(s.lock_addr);
    let mut before = Vec::new();
    for i in 0..8 {
        let l = a.lock(format!("c/durable/{i}"), WAIT).expect("granted");
        before.push(token(&l));
        l.release().expect("released");
    }
    let persistent = a
        .acquire(
            "c/durable/p",
            Acquire {
                hold: Hold::Persistent,
                wait: Wait::Try,
                ..Acquire::default()
            },
            &LockOptions::new(),
        )
        .expect("granted");
    before.push(token(&persistent));
    s.kill9();
    drop((a, persistent));
    let s = Server::start(&["--data-path", data]);
    let b = session(s.lock_addr);
    assert_eq!(
        holder_of(&s, "c/durable/p").map(|k| k.token),
        Some(*before.last().unwrap()),
        "the persistent hold survived"
    );
    assert!(b.try_lock("c/durable/p").expect("answered").is_none());
    let newest = *before.iter().max().unwrap();
    for i in 0..8 {
        let l = b.lock(format!("c/durable/{i}"), WAIT).expect("granted");
        assert!(token(&l) > newest, "after the restart: larger");
        l.release().expect("released");
    }
}

fn shards() {
    let s = Server::start(&[]);
    let keys: Arc<Vec<String>> = Arc::new((0..16).map(|i| format!("c/shards/{i}")).collect());
    let seen: Arc<Mutex<HashMap<String, Vec<u64>>>> = Default::default();
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (sess, keys, seen) = (session(s.lock_addr), keys.clone(), seen.clone());
            thread::spawn(move || {
                for round in 0..5 {
                    for i in 0..keys.len() {
                        let k = &keys[(i + w * 4 + round) % keys.len()];
                        let l = sess.lock(k, WAIT).expect("granted");
                        // Recorded while held: the order of the grants.
                        seen.lock()
                            .unwrap()
                            .entry(k.clone())
                            .or_default()
                            .push(token(&l));
                        l.release().expect("released");
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), keys.len());
    for (k, tokens) in seen.iter() {
        assert_eq!(tokens.len(), 20, "{k}");
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{k}: {tokens:?}");
    }
}

fn modes_fifo() {
    const KEY: &str = "c/modes/fifo";
    let s = with_metrics();
    let (r1, r2, w, r3) = (
        session(s.lock_addr),
        session(s.lock_addr),
        session(s.lock_addr),
        session(s.lock_addr),
    );
    assert!(r1.offers_modes(), "ringlockd offers lock modes");
    let l1 = r1.lock_shared(KEY, WAIT).expect("granted shared");
    let l2 = r2
        .try_lock_shared(KEY)
        .expect("answered")
        .expect("readers share the key");
    assert!(token(&l2) > token(&l1), "tokens increase");
    assert_eq!((l1.access(), l2.access()), (Access::Shared, Access::Shared));
    assert!(
        w.try_lock(KEY).expect("answered").is_none(),
        "an exclusive try is refused while readers hold"
    );
    let w2 = w.clone();
    let writer = thread::spawn(move || w2.lock(KEY, WAIT));
    queued(&s, 1);
    assert!(
        r3.try_lock_shared(KEY).expect("answered").is_none(),
        "a later reader does not overtake the waiting writer"
    );
    let r3b = r3.clone();
    let reader = thread::spawn(move || r3b.lock_shared(KEY, WAIT));
    // Queued behind the writer.
    queued(&s, 2);
    l1.release().expect("released");
    assert_eq!(waiting(&s), 2, "one reader still holds: the writer waits");
    assert!(!writer.is_finished(), "the writer was answered");
    l2.release().expect("released");
    let lw = writer
        .join()
        .expect("writer")
        .expect("granted once both readers left");
    assert_eq!(lw.access(), Access::Exclusive);
    assert!(token(&lw) > token(&l2), "the writer's token is larger");
    assert_eq!(waiting(&s), 1, "the later reader waits for the writer");
    assert!(!reader.is_finished(), "the later reader was answered");
    lw.release().expect("released");
    let l3 = reader
        .join()
        .expect("reader")
        .expect("granted after the writer's release");
    assert_eq!(l3.access(), Access::Shared);
    assert!(
        token(&l3) > token(&lw),
        "the later reader's token is larger"
    );
    l3.release().expect("released");
    assert!(holder_of(&s, KEY).is_none(), "the key is free");
}

fn modes_semaphore() {
    const KEY: &str = "c/modes/sem";
    let s = with_metrics();
    let (a, b, c) = (
        session(s.lock_addr),
        session(s.lock_addr),
        session(s.lock_addr),
    );
    let pa = a.lock_permit(KEY, 2, WAIT).expect("a slot");
    let pb = b
        .try_lock_permit(KEY, 2)
        .expect("answered")
        .expect("the second slot at once");
    assert_eq!(
        (pa.access(), pb.access()),
        (Access::Semaphore(2), Access::Semaphore(2))
    );
    assert!(token(&pb) > token(&pa), "tokens increase");
    assert!(
        c.try_lock_permit(KEY, 2).expect("answered").is_none(),
        "both slots are taken"
    );
    let err = c
        .lock_permit(KEY, 3, WAIT)
        .expect_err("a permit of 3 on a semaphore of 2");
    match &err {
        Error::ModeMismatch { key, slots } => assert_eq!((key.as_str(), *slots), (KEY, 3)),
        e => panic!("expected ModeMismatch, got {e:?}"),
    }
    assert!(err.to_string().contains(KEY), "names the key: {err}");
    // It changed nothing: it does not wait, and the key is still a
    // semaphore of 2 with both slots taken.
    assert_eq!(waiting(&s), 0, "the refused request does not wait");
    assert!(c.try_lock_permit(KEY, 2).expect("answered").is_none());
    let c2 = c.clone();
    let third = thread::spawn(move || c2.lock_permit(KEY, 2, WAIT));
    queued(&s, 1);
    pa.release().expect("released");
    let pc = third
        .join()
        .expect("waiter")
        .expect("granted the slot the first left");
    assert_eq!(pc.access(), Access::Semaphore(2));
    assert!(token(&pc) > token(&pb), "the third's token is larger");
    pb.release().expect("released");
    pc.release().expect("released");
    // Free again: the next first holder fixes another size.
    let p5 = a
        .try_lock_permit(KEY, 5)
        .expect("answered")
        .expect("a permit of 5 on the free key");
    assert_eq!(p5.access(), Access::Semaphore(5));
    p5.release().expect("released");
}

fn event(w: &mut ringlock::client::Watch) -> WatchEvent {
    w.next(Some(WAIT))
        .expect("the watch is open")
        .expect("a change within the bound")
}

fn watch_order() {
    const KEY: &str = "c/watch/order";
    let s = with_metrics();
    let (a, b, w) = (
        session(s.lock_addr),
        session(s.lock_addr),
        session(s.lock_addr),
    );
    let la = a.lock(KEY, WAIT).expect("a holds");
    let mut watch = w.watch(KEY).expect("a watch");
    let listed: Vec<u64> = watch.holders().iter().map(|h| h.token).collect();
    assert_eq!(listed, vec![token(&la)], "the watch lists the holder");
    let b2 = b.clone();
    let waiter = thread::spawn(move || b2.lock(KEY, WAIT));
    queued(&s, 1);
    la.release().expect("released");
    let lb = waiter.join().expect("waiter").expect("b granted");
    let e = event(&mut watch);
    assert_eq!((e.kind, e.holder.token), (EventKind::Released, token(&la)));
    let e = event(&mut watch);
    assert_eq!((e.kind, e.holder.token), (EventKind::Granted, token(&lb)));
    let tb = token(&lb);
    std::mem::forget(lb); // its session's end frees it
    b.close();
    let e = event(&mut watch);
    assert_eq!((e.kind, e.holder.token), (EventKind::SessionEnded, tb));
    watch.close().expect("unwatched");
    // Closed: a change now is reported to nobody (a second watch sees
    // it, and the closed one's session reads nothing).
    let mut again = w.watch(KEY).expect("a second watch");
    let lc = a.lock(KEY, WAIT).expect("a holds again");
    let e = event(&mut again);
    assert_eq!((e.kind, e.holder.token), (EventKind::Granted, token(&lc)));
    lc.release().expect("released");
}

fn watch_rewatch() {
    const KEY: &str = "c/watch/rewatch";
    let s = with_metrics();
    let (a, w) = (session(s.lock_addr), session(s.lock_addr));
    let mut watch = w.watch(KEY).expect("a watch");
    assert!(watch.holders().is_empty(), "a free key");
    w.close();
    let err = watch
        .next(Some(WAIT))
        .expect_err("the watch ended with its session");
    assert!(!err.to_string().is_empty());
    // Changed while nobody watched: not replayed, but listed.
    let la = a.lock(KEY, WAIT).expect("a holds");
    let w2 = session(s.lock_addr);
    let again = w2.watch(KEY).expect("watched again");
    let listed: Vec<u64> = again.holders().iter().map(|h| h.token).collect();
    assert_eq!(listed, vec![token(&la)], "the holders as they are now");
    la.release().expect("released");
}

/// The leader an observer sees after its next change that names one (a
/// "nobody leads" between two leaders is allowed and skipped).
fn next_leader(o: &mut ringlock::client::Observer) -> ringlock::client::Leader {
    loop {
        assert!(
            o.changed(Some(WAIT)).expect("the observation is open"),
            "a change within the bound"
        );
        if let Some(l) = o.leader() {
            return l.clone();
        }
    }
}

fn election_order() {
    const NAME: &str = "c/election/order";
    let s = with_metrics();
    let (a, b, c, w) = (
        session(s.lock_addr),
        session(s.lock_addr),
        session(s.lock_addr),
        session(s.lock_addr),
    );
    let mut o = w.election(NAME).unwrap().observe().expect("observing");
    assert!(o.leader().is_none(), "nobody leads yet");
    let mut la = a
        .election(NAME)
        .unwrap()
        .campaign("a", None)
        .expect("a leads");
    let seen_a = next_leader(&mut o);
    assert_eq!((seen_a.token, &seen_a.value[..]), (la.token(), &b"a"[..]));
    let (tx, rx) = mpsc::channel();
    let mut waiters = Vec::new();
    for (i, (who, sess)) in [("b", b.clone()), ("c", c.clone())].into_iter().enumerate() {
        let e = sess.election(NAME).unwrap();
        let tx = tx.clone();
        waiters.push(thread::spawn(move || {
            let l = e.campaign(who, None).expect("elected");
            tx.send(who).unwrap();
            l
        }));
        queued(&s, i + 1);
    }
    la.proclaim("a2").expect("proclaimed");
    let seen = next_leader(&mut o);
    assert_eq!((seen.token, &seen.value[..]), (seen_a.token, &b"a2"[..]));
    assert!(rx.try_recv().is_err(), "a proclaim elects nobody");
    // A resigns through its lease, keeping the Leadership value (Rust's
    // `resign` consumes it) to proclaim with afterwards.
    la.lease().release().expect("a resigns");
    let seen_b = next_leader(&mut o);
    assert_eq!(rx.recv_timeout(WAIT).expect("b elected"), "b");
    let lb = waiters.remove(0).join().expect("b's campaign");
    assert_eq!((seen_b.token, &seen_b.value[..]), (lb.token(), &b"b"[..]));
    assert!(seen_b.token > seen_a.token);
    lb.resign().expect("b resigns");
    let seen_c = next_leader(&mut o);
    assert_eq!(rx.recv_timeout(WAIT).expect("c elected"), "c");
    let lc = waiters.remove(0).join().expect("c's campaign");
    assert_eq!((seen_c.token, &seen_c.value[..]), (lc.token(), &b"c"[..]));
    assert!(seen_c.token > seen_b.token);
    assert!(matches!(la.proclaim("a3"), Err(Error::Lost(_))));
    lc.resign().expect("c resigns");
}

fn election_handover() {
    const NAME: &str = "c/election/handover";
    let s = with_metrics();
    let (a, b, w) = (
        session(s.lock_addr),
        session(s.lock_addr),
        session(s.lock_addr),
    );
    let mut o = w.election(NAME).unwrap().observe().expect("observing");
    let mut la = a
        .election(NAME)
        .unwrap()
        .campaign("a", None)
        .expect("a leads");
    assert_eq!(next_leader(&mut o).token, la.token());
    let e = b.election(NAME).unwrap();
    let waiter = thread::spawn(move || e.campaign("b", Some(WAIT)));
    queued(&s, 1);
    // A's session ends without resigning (as when its process dies).
    a.close();
    let lb = waiter.join().expect("b's campaign").expect("b elected");
    assert!(lb.token() > la.token());
    let seen = next_leader(&mut o);
    assert_eq!((seen.token, &seen.value[..]), (lb.token(), &b"b"[..]));
    assert!(matches!(la.proclaim("a2"), Err(Error::Lost(_))));
}

fn main() {
    let scenarios: [(&str, fn()); 18] = [
        ("grant", grant),
        ("fifo", fifo),
        ("try", try_),
        ("timeout", timeout),
        ("cancel_race", cancel_race),
        ("lease_expiry_lost", lease_expiry_lost),
        ("session_end_on_close", session_end_on_close),
        ("keepalive_loss", keepalive_loss),
        ("stale_token_release", stale_token_release),
        ("auth_refused", auth_refused),
        ("server_restart_durable", server_restart_durable),
        ("shards", shards),
        ("modes_fifo", modes_fifo),
        ("modes_semaphore", modes_semaphore),
        ("watch_order", watch_order),
        ("watch_rewatch", watch_rewatch),
        ("election_order", election_order),
        ("election_handover", election_handover),
    ];
    // Names given on the command line pick scenarios (cargo's own flags,
    // which start with `-`, are ignored).
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let mut failed = Vec::new();
    for (name, run) in scenarios {
        if !only.is_empty() && !only.iter().any(|o| o == name) {
            continue;
        }
        match std::panic::catch_unwind(run) {
            Ok(()) => println!("conformance rust {name} ok"),
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                println!("conformance rust {name} FAILED: {msg}");
                failed.push(name);
            }
        }
    }
    if !failed.is_empty() {
        eprintln!("conformance rust: failed: {}", failed.join(", "));
        std::process::exit(1);
    }
}
