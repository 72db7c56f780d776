//! The MySQL backend's contract against a real MariaDB: every behaviour the
//! Go original's tests pin, checked from a second session (`IS_USED_LOCK`,
//! `IS_FREE_LOCK`, the server's general log) where that proves something.
//! Faults go through the proxy in `mysql_common::proxy`.

mod mysql_common;

use std::net::TcpListener;
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql_common::proxy::{Mode, Proxy};
use mysql_common::{key, wait_until, Holder, MariaDb, LIVENESS, PASSWORD};
use ringlock::lease::{self, CancelToken, Error, Lease, LockOptions, LostLock, LostReason};
use ringlock::mysql::{Locker, MysqlAddr, Options, PASSWORD_ENV};

/// Runs `f` on its own thread and returns its result; a hang fails the
/// test after LIVENESS instead of blocking the suite.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(LIVENESS)
        .unwrap_or_else(|_| panic!("{what} did not return within {LIVENESS:?}"))
}

/// A handler that forwards every loss it sees.
fn recorder() -> (
    impl Fn(&Lease, &LostLock) + Send + Sync + 'static,
    mpsc::Receiver<LostLock>,
) {
    let (tx, rx) = mpsc::channel();
    (
        move |_: &Lease, lost: &LostLock| drop(tx.send(lost.clone())),
        rx,
    )
}

fn release_stmt(k: &str) -> String {
    format!("RELEASE_LOCK('{k}')")
}

fn fast() -> Options {
    Options::new()
        .keep_alive_interval(Duration::from_millis(20))
        .keep_alive_ping_timeout(Duration::from_millis(300))
        .release_timeout(Duration::from_millis(300))
}

#[test]
fn success_then_release_returns_ok_and_frees_the_key() {
    let db = MariaDb::shared();
    let k = key("ok");
    let locker = Locker::new(db.pool());
    let lease = locker.lock(&k, Duration::from_secs(5)).unwrap();
    assert_eq!(lease.key(), k);
    assert_eq!(lease.token(), None, "MySQL has no fencing token");
    assert_eq!(lease.expires_at(), None, "a MySQL lock has no TTL");
    let id = lease.session_id().expect("MySQL names the session");
    assert_eq!(db.holder(&k), Some(id), "the lease's own session holds it");
    lease.release().unwrap();
    assert!(db.is_free(&k));
    lease
        .release()
        .expect("a second call returns the first result");
    assert_eq!(db.logged(&release_stmt(&k)), 1, "one RELEASE_LOCK");
}

#[test]
fn zero_means_timeout_distinct_from_failure() {
    let db = MariaDb::shared();
    let k = key("timeout");
    let holder = Holder::take(db, &k);
    let locker = Locker::new(db.pool());
    let err = locker.lock(&k, Duration::from_millis(50)).unwrap_err();
    assert!(matches!(err, Error::Timeout), "{err}");
    assert!(!err.is_cancellation());
    assert_eq!(db.holder(&k), Some(holder.id()), "nothing changed hands");
    assert!(
        locker.try_lock(&k).unwrap().is_none(),
        "try_lock: held elsewhere"
    );
    let free = key("try");
    let lease = locker.try_lock(&free).unwrap().expect("a free key");
    assert_eq!(db.holder(&free), lease.session_id());
}

#[test]
fn validation_comes_first_in_order_and_sends_nothing() {
    let db = MariaDb::shared();
    // A pool whose server is gone: anything that reached the network would
    // fail with Unavailable instead of the validation errors.
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let locker = Locker::new(db.pool_via(dead, 2));
    let long = "x".repeat(65);
    let zero = Duration::ZERO;
    let one = Duration::from_secs(1);
    let e = locker.lock("", zero).unwrap_err();
    assert_eq!(e.to_string(), "invalid lock key: must be 1..64 characters");
    assert!(matches!(locker.lock(&long, one), Err(Error::InvalidKey(_))));
    assert!(matches!(locker.try_lock(&long), Err(Error::InvalidKey(_))));
    let e = locker.lock("k", zero).unwrap_err();
    assert_eq!(e.to_string(), "non-positive timeout");
    assert!(e.is_usage());
    // Valid input reaches for a connection: the closed pool fails before any
    // query, without a lease.
    let e = locker.lock("k", one).unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e}");
    assert!(matches!(locker.try_lock("k"), Err(Error::Unavailable(_))));
    // And on a live server, a refused key sends nothing.
    let k = key("refused");
    let refused = format!("{k}{}", "x".repeat(65));
    let live = Locker::new(db.pool());
    assert!(live.lock(&refused, one).is_err());
    assert_eq!(db.logged(&k), 0);
}

#[test]
fn keys_of_64_characters_are_allowed_65_refused_and_quoting_is_exact() {
    let db = MariaDb::shared();
    let locker = Locker::new(db.pool());
    // 'a' (1 byte), 'é' (2 bytes), '€' (3 bytes: 64 of them are MariaDB's
    // 192-byte ceiling for lock names).
    for pad in ['a', 'é', '€'] {
        let k: String = key("chars")
            .chars()
            .chain(std::iter::repeat(pad))
            .take(64)
            .collect();
        assert_eq!(k.chars().count(), 64);
        let lease = locker.lock(&k, Duration::from_secs(5)).unwrap();
        assert_eq!(db.holder(&k), lease.session_id(), "the server holds {k:?}");
        lease.release().unwrap();
        let k65 = format!("{k}{pad}");
        assert!(matches!(
            locker.lock(&k65, Duration::from_secs(1)),
            Err(Error::InvalidKey(_))
        ));
    }
    // 64 four-byte characters pass our rule (characters, as MySQL counts)
    // but exceed MariaDB's 192 bytes: the server refuses, clearly, and
    // nothing is held.
    let k: String = key("emoji")
        .chars()
        .chain(std::iter::repeat('🔒'))
        .take(64)
        .collect();
    let err = locker.lock(&k, Duration::from_secs(1)).unwrap_err();
    assert!(matches!(err, Error::Failed { .. }), "{err}");
    assert!(err.to_string().contains("too long"), "{err}");
    // Quotes, backslashes and SQL in a key name the key and nothing else.
    let k = format!("{}: a'b\\c\"d`e'); DO SLEEP(30); --", key("q"));
    let lease = locker.lock(&k, Duration::from_secs(5)).unwrap();
    assert_eq!(db.holder(&k), lease.session_id());
    lease.release().unwrap();
    assert!(db.is_free(&k));
}

#[test]
fn a_generic_acquire_error_returns_no_lease_and_sends_no_cleanup() {
    let db = MariaDb::shared();
    let k = key("generic");
    let holder = Holder::take(db, &k);
    let locker = Locker::new(db.pool());
    let (l, kk) = (locker.clone(), k.clone());
    let waiting = std::thread::spawn(move || l.lock(&kk, Duration::from_secs(60)));
    let waiter = db.wait_waiting(&k);
    // An operator kills the query: GET_LOCK answers NULL, which is a failure,
    // neither a timeout nor the caller's cancellation.
    db.root()
        .query_drop(format!("KILL QUERY {waiter}"))
        .unwrap();
    let err = within("the killed acquire", move || waiting.join().unwrap()).unwrap_err();
    match &err {
        Error::Failed { key, cause } => {
            assert_eq!(key, &k);
            assert!(cause.to_string().contains("NULL"), "{cause}");
        }
        other => panic!("expected Failed, got {other}"),
    }
    assert_eq!(
        db.logged(&release_stmt(&k)),
        0,
        "no cleanup after a plain failure"
    );
    assert_eq!(db.holder(&k), Some(holder.id()));

    // A connection that breaks mid-wait is a failure too, and no cleanup.
    let k = key("broken");
    let holder = Holder::take(db, &k);
    let proxy = Proxy::start(db.addr());
    let locker = Locker::new(db.pool_via(proxy.addr, 5));
    let kk = k.clone();
    let waiting = std::thread::spawn(move || locker.lock(&kk, Duration::from_secs(60)));
    let waiter = db.wait_waiting(&k);
    proxy.reset(&proxy.link(waiter));
    let err = within("the broken acquire", move || waiting.join().unwrap()).unwrap_err();
    assert!(matches!(err, Error::Failed { .. }), "{err}");
    assert_eq!(db.logged(&release_stmt(&k)), 0);
    assert_eq!(db.holder(&k), Some(holder.id()));
}

#[test]
fn cancellation_sends_exactly_one_cleanup_release_and_returns_the_cancellation() {
    let db = MariaDb::shared();
    let locker = Locker::new(db.pool());

    let k = key("cancel");
    let holder = Holder::take(db, &k);
    let token = CancelToken::new().unwrap();
    let opts = LockOptions::new().cancel(token.clone());
    let (l, kk) = (locker.clone(), k.clone());
    let waiting = std::thread::spawn(move || l.lock_with(&kk, Duration::from_secs(60), &opts));
    let waiter = db.wait_waiting(&k);
    token.cancel();
    let err = within("the cancelled acquire", move || waiting.join().unwrap()).unwrap_err();
    assert!(matches!(err, Error::Cancelled), "{err}");
    assert_eq!(
        db.logged(&release_stmt(&k)),
        1,
        "exactly one cleanup RELEASE_LOCK"
    );
    assert_eq!(
        db.logged_exact(&format!("KILL QUERY {waiter}")),
        1,
        "GET_LOCK was interrupted"
    );
    assert_eq!(
        db.holder(&k),
        Some(holder.id()),
        "the cleanup freed nothing of others'"
    );

    // The caller's deadline is its own error, with the same cleanup.
    let k = key("deadline");
    let _holder = Holder::take(db, &k);
    let opts = LockOptions::new().deadline(Instant::now() + Duration::from_millis(200));
    let err = locker
        .lock_with(&k, Duration::from_secs(60), &opts)
        .unwrap_err();
    assert!(matches!(err, Error::DeadlineExceeded), "{err}");
    assert!(err.is_cancellation());
    assert_eq!(db.logged(&release_stmt(&k)), 1);

    // Cancelled before the call: nothing is sent at all.
    let k = key("precancelled");
    let opts = LockOptions::new().cancel(token);
    assert!(matches!(
        locker.lock_with(&k, Duration::from_secs(1), &opts),
        Err(Error::Cancelled)
    ));
    assert!(matches!(
        locker.try_lock_with(&k, &opts),
        Err(Error::Cancelled)
    ));
    assert_eq!(db.logged(&k), 0);
}

#[test]
fn a_hanging_cleanup_is_bounded() {
    let db = MariaDb::shared();
    let k = key("hangclean");
    let holder = Holder::take(db, &k);
    let proxy = Proxy::start(db.addr());
    let locker = Locker::with_options(db.pool_via(proxy.addr, 5), fast());
    let token = CancelToken::new().unwrap();
    let opts = LockOptions::new().cancel(token.clone());
    let kk = k.clone();
    let waiting = std::thread::spawn(move || locker.lock_with(&kk, Duration::from_secs(60), &opts));
    let waiter = db.wait_waiting(&k);
    let link = proxy.link(waiter);
    // Requests from the waiting session stop reaching the server; answers
    // still arrive. The KILL QUERY goes out on another connection, so
    // GET_LOCK ends, and the cleanup RELEASE_LOCK is what hangs.
    proxy.set_mode(&link, Mode::StallUp);
    token.cancel();
    let err = within("the cancelled acquire", move || waiting.join().unwrap()).unwrap_err();
    assert!(matches!(err, Error::Cancelled), "{err}");
    assert!(
        link.held_c2s() > 0,
        "the cleanup was sent and is stuck in the stall"
    );
    assert_eq!(
        db.logged(&release_stmt(&k)),
        0,
        "it never reached the server"
    );
    assert_eq!(db.logged_exact(&format!("KILL QUERY {waiter}")), 1);
    assert_eq!(db.holder(&k), Some(holder.id()));
}

#[test]
fn a_ping_in_flight_when_release_starts_is_abandoned_never_concurrent_and_no_loss() {
    let db = MariaDb::shared();
    let k = key("pingrel");
    let proxy = Proxy::start(db.addr());
    // Pings every 20 ms, each allowed a minute: only the release can end
    // one that hangs.
    let opts = Options::new()
        .keep_alive_interval(Duration::from_millis(20))
        .keep_alive_ping_timeout(Duration::from_secs(60))
        .release_timeout(Duration::from_millis(300));
    let locker = Locker::with_options(db.pool_via(proxy.addr, 5), opts);
    let (on_lost, lost) = recorder();
    let lease = locker
        .lock_with(
            &k,
            Duration::from_secs(5),
            &LockOptions::new().on_lost(on_lost),
        )
        .unwrap();
    let link = proxy.link(lease.session_id().unwrap());
    proxy.set_mode(&link, Mode::Stall);
    proxy.wait_held(&link);
    let l = lease.clone();
    let err = within("release", move || l.release()).unwrap_err();
    match &err {
        Error::Unreleased { cause, .. } => {
            assert!(cause.to_string().contains("keep-alive ping"), "{cause}")
        }
        other => panic!("expected Unreleased, got {other}"),
    }
    assert!(
        lease.lost().is_none(),
        "a ping cut short by the release is not a loss"
    );
    assert!(lost.try_recv().is_err(), "no handler ran");
    // Only the 9-byte `DO 1` ever left the client after the stall began:
    // RELEASE_LOCK was never sent while the ping was unanswered.
    assert!(link.held_c2s() <= 9, "{} bytes", link.held_c2s());
    // The connection was closed; once the path works again the server sees
    // it and the session (with the lock) ends.
    proxy.set_mode(&link, Mode::Pass);
    wait_until("the key is free", || db.is_free(&k));
}

#[test]
fn a_hung_ping_is_a_loss_once_the_ping_timeout_passes() {
    let db = MariaDb::shared();
    let k = key("hung");
    let proxy = Proxy::start(db.addr());
    let locker = Locker::with_options(db.pool_via(proxy.addr, 5), fast());
    let (on_lost, lost) = recorder();
    let lease = locker
        .lock_with(
            &k,
            Duration::from_secs(5),
            &LockOptions::new().on_lost(on_lost),
        )
        .unwrap();
    proxy.set_mode(&proxy.link(lease.session_id().unwrap()), Mode::Stall);
    let seen = lost
        .recv_timeout(LIVENESS)
        .expect("the hung ping is a loss");
    assert_eq!(seen.reason(), LostReason::KeepAliveTimedOut);
    assert_eq!(seen.key(), k);
    assert!(seen.to_string().contains("300ms"), "{seen}");
    assert_eq!(
        lease.lost().map(|l| l.reason()),
        Some(LostReason::KeepAliveTimedOut)
    );
    assert!(matches!(lease.release(), Err(Error::Lost(_))));
    assert!(lost.try_recv().is_err(), "reported once");
}

#[test]
fn a_failed_ping_notifies_both_handlers_naming_the_key_then_release_says_lost() {
    let db = MariaDb::shared();
    let k = key("failedping");
    let proxy = Proxy::start(db.addr());
    let (locker_wide, from_locker) = recorder();
    let locker = Locker::with_options(db.pool_via(proxy.addr, 5), fast().on_lost(locker_wide));
    let (per_lease, from_lease) = recorder();
    let lease = locker
        .lock_with(
            &k,
            Duration::from_secs(5),
            &LockOptions::new().on_lost(per_lease),
        )
        .unwrap();
    proxy.reset(&proxy.link(lease.session_id().unwrap()));
    for rx in [&from_locker, &from_lease] {
        let seen = rx.recv_timeout(LIVENESS).expect("both handlers run");
        assert_eq!(seen.reason(), LostReason::ConnectionLost, "{seen}");
        assert!(seen.to_string().contains(&format!("{k:?}")), "{seen}");
        assert!(seen.cause().is_some(), "carries the ping's error");
    }
    let err = lease.release().unwrap_err();
    assert_eq!(err.lost().map(|l| l.key()), Some(k.as_str()), "{err}");
    assert!(
        from_locker.try_recv().is_err() && from_lease.try_recv().is_err(),
        "once each"
    );
    // The reset ended the session: the key is free for others.
    wait_until("the key is free", || db.is_free(&k));
}

#[test]
fn a_panicking_locker_handler_does_not_stop_the_lease_handler() {
    let db = MariaDb::shared();
    let k = key("panic");
    let proxy = Proxy::start(db.addr());
    let locker = Locker::with_options(
        db.pool_via(proxy.addr, 5),
        fast().on_lost(|_, _| panic!("a faulty locker-wide handler (this panic is expected)")),
    );
    let (per_lease, from_lease) = recorder();
    let lease = locker
        .lock_with(
            &k,
            Duration::from_secs(5),
            &LockOptions::new().on_lost(per_lease),
        )
        .unwrap();
    proxy.reset(&proxy.link(lease.session_id().unwrap()));
    from_lease
        .recv_timeout(LIVENESS)
        .expect("the per-lease handler still ran");
    assert!(matches!(lease.release(), Err(Error::Lost(_))));
    // The locker is unharmed: it still locks.
    let other = key("afterpanic");
    locker
        .lock(&other, Duration::from_secs(5))
        .unwrap()
        .release()
        .unwrap();
}

#[test]
fn release_from_inside_the_handler_returns() {
    let db = MariaDb::shared();
    let k = key("inhandler");
    let proxy = Proxy::start(db.addr());
    let locker = Locker::with_options(db.pool_via(proxy.addr, 5), fast());
    let (tx, rx) = mpsc::channel();
    let opts = LockOptions::new().on_lost(move |lease, _| drop(tx.send(lease.release())));
    let lease = locker.lock_with(&k, Duration::from_secs(5), &opts).unwrap();
    proxy.reset(&proxy.link(lease.session_id().unwrap()));
    // A deadlock would never send: the bound only turns a hang into a failure.
    let from_handler = rx
        .recv_timeout(LIVENESS)
        .expect("release inside the handler returned");
    assert!(
        matches!(from_handler, Err(Error::Lost(_))),
        "{from_handler:?}"
    );
    assert!(
        matches!(lease.release(), Err(Error::Lost(_))),
        "every caller, the same result"
    );
}

#[test]
fn a_slow_release_lock_is_cut_at_the_release_timeout() {
    let db = MariaDb::shared();
    let k = key("slowrel");
    let proxy = Proxy::start(db.addr());
    let opts = Options::new().release_timeout(Duration::from_millis(300));
    let locker = Locker::with_options(db.pool_via(proxy.addr, 5), opts);
    let lease = locker.lock(&k, Duration::from_secs(5)).unwrap();
    let link = proxy.link(lease.session_id().unwrap());
    proxy.set_mode(&link, Mode::Stall);
    let l = lease.clone();
    let err = within("release", move || l.release()).unwrap_err();
    match &err {
        Error::Unreleased { cause, .. } => {
            assert!(
                cause.to_string().contains("no answer within 300ms"),
                "{cause}"
            )
        }
        other => panic!("expected Unreleased, got {other}"),
    }
    assert!(link.held_c2s() > 0, "RELEASE_LOCK was sent and hung");
    assert!(lease.lost().is_none());
    // The connection was closed: when the path heals, the session ends and
    // the lock with it (no leak on a pooled connection).
    proxy.set_mode(&link, Mode::Pass);
    wait_until("the key is free", || db.is_free(&k));
}

#[test]
fn two_calls_and_eight_concurrent_calls_send_one_release_lock() {
    let db = MariaDb::shared();
    let locker = Locker::new(db.pool());
    let k = key("twice");
    let lease = locker.lock(&k, Duration::from_secs(5)).unwrap();
    lease.release().unwrap();
    lease.release().unwrap();
    assert_eq!(db.logged(&release_stmt(&k)), 1);

    let k = key("eight");
    let lease = locker.lock(&k, Duration::from_secs(5)).unwrap();
    let barrier = Arc::new(Barrier::new(8));
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let (lease, barrier) = (lease.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                lease.release()
            })
        })
        .collect();
    for c in calls {
        c.join()
            .unwrap()
            .expect("every caller gets the first result");
    }
    assert_eq!(db.logged(&release_stmt(&k)), 1);
    assert!(db.is_free(&k));
}

#[test]
fn release_of_a_lost_lock_says_lock_lost() {
    let db = MariaDb::shared();
    let proxy = Proxy::start(db.addr());
    let locker = Locker::new(db.pool_via(proxy.addr, 5));

    // NULL: the session no longer has the lock (freed behind its back).
    let k = key("null");
    let lease = locker.lock(&k, Duration::from_secs(5)).unwrap();
    proxy.inject(
        &proxy.link(lease.session_id().unwrap()),
        "DO RELEASE_ALL_LOCKS()",
    );
    assert!(db.is_free(&k));
    let err = lease.release().unwrap_err();
    let lost = err.lost().expect("lock lost");
    assert_eq!(lost.reason(), LostReason::NotHeld);
    assert!(err.to_string().contains("NULL"), "{err}");

    // 0: another session holds it by now.
    let k = key("zero");
    let lease = locker.lock(&k, Duration::from_secs(5)).unwrap();
    proxy.inject(
        &proxy.link(lease.session_id().unwrap()),
        "DO RELEASE_ALL_LOCKS()",
    );
    let thief = Holder::take(db, &k);
    let err = lease.release().unwrap_err();
    assert!(err.to_string().contains("another session"), "{err}");
    assert_eq!(
        db.holder(&k),
        Some(thief.id()),
        "the release freed nothing of theirs"
    );
}

#[test]
fn extend_proves_the_lock_is_still_held() {
    let db = MariaDb::shared();
    let k = key("extend");
    let proxy = Proxy::start(db.addr());
    let locker = Locker::new(db.pool_via(proxy.addr, 5));
    let (on_lost, lost) = recorder();
    let lease = locker
        .lock_with(
            &k,
            Duration::from_secs(5),
            &LockOptions::new().on_lost(on_lost),
        )
        .unwrap();
    assert_eq!(lease.extend().unwrap(), None, "held, and no TTL to renew");
    proxy.inject(
        &proxy.link(lease.session_id().unwrap()),
        "DO RELEASE_ALL_LOCKS()",
    );
    let err = lease.extend().unwrap_err();
    assert_eq!(
        err.lost().map(|l| l.reason()),
        Some(LostReason::NotHeld),
        "{err}"
    );
    assert_eq!(
        lost.recv_timeout(LIVENESS).unwrap().reason(),
        LostReason::NotHeld
    );
    assert!(matches!(lease.release(), Err(Error::Lost(_))));
    assert!(matches!(lease.extend(), Err(Error::Lost(_))));
    assert!(lost.try_recv().is_err(), "reported once");
}

#[test]
fn dropping_the_last_clone_releases_the_lock() {
    let db = MariaDb::shared();
    let locker = Locker::new(db.pool());
    let k = key("drop");
    let lease = locker.lock(&k, Duration::from_secs(5)).unwrap();
    let clone = lease.clone();
    drop(lease);
    assert!(!db.is_free(&k), "a clone still holds it");
    drop(clone);
    assert!(db.is_free(&k));
    assert_eq!(db.logged(&release_stmt(&k)), 1);
}

#[test]
fn connections_go_back_to_the_pool_and_closed_ones_free_their_slot() {
    let db = MariaDb::shared();
    let proxy = Proxy::start(db.addr());
    let locker = Locker::with_options(db.pool_via(proxy.addr, 1), fast());
    // One connection, reused: each release returned it.
    let mut sessions = Vec::new();
    for _ in 0..3 {
        let lease = locker.lock(&key("reuse"), Duration::from_secs(5)).unwrap();
        sessions.push(lease.session_id().unwrap());
        lease.release().unwrap();
    }
    assert!(sessions.windows(2).all(|w| w[0] == w[1]), "{sessions:?}");
    // A failed release closes its connection, and the pool may open another.
    let k = key("closed");
    let lease = locker.lock(&k, Duration::from_secs(5)).unwrap();
    let link = proxy.link(lease.session_id().unwrap());
    proxy.set_mode(&link, Mode::Stall);
    assert!(matches!(lease.release(), Err(Error::Unreleased { .. })));
    proxy.set_mode(&link, Mode::Pass);
    let again = locker.lock(&key("after"), Duration::from_secs(5)).unwrap();
    assert_ne!(again.session_id(), lease.session_id());
}

#[test]
fn a_second_lease_on_a_held_key_waits_like_any_contender() {
    let db = MariaDb::shared();
    let locker = Locker::new(db.pool());
    let k = key("twolease");
    let first = locker.lock(&k, Duration::from_secs(5)).unwrap();
    let err = locker.lock(&k, Duration::from_millis(50)).unwrap_err();
    assert!(matches!(err, Error::Timeout), "{err}");
    first.release().unwrap();
    locker
        .lock(&k, Duration::from_secs(5))
        .unwrap()
        .release()
        .unwrap();
}

#[test]
fn urls_passwords_and_the_shared_trait() {
    let db = MariaDb::shared();
    let k = key("url");
    // Through the trait object a program would hold.
    let locker: Box<dyn lease::Locker> = Box::new(Locker::from_url(&db.url()).unwrap());
    let lease = locker.lock(&k, Duration::from_secs(5)).unwrap();
    assert_eq!(db.holder(&k), lease.session_id());
    lease.release().unwrap();
    assert!(locker.try_lock(&k).unwrap().is_some());

    // The password from the environment, not the address.
    let bare = format!("mysql://{}@127.0.0.1:{}", mysql_common::USER, db.port);
    let addr = MysqlAddr::parse(&bare)
        .unwrap()
        .with_password_from_env(|name| (name == PASSWORD_ENV).then(|| PASSWORD.into()))
        .unwrap();
    let locker = Locker::from_addr(&addr, Options::default()).unwrap();
    locker
        .lock(&k, Duration::from_secs(5))
        .unwrap()
        .release()
        .unwrap();

    // A wrong password: building works (no traffic), locking is Unavailable.
    let wrong = format!("mysql://{}:nope@127.0.0.1:{}", mysql_common::USER, db.port);
    let locker = Locker::from_url(&wrong).unwrap();
    let err = locker.lock(&k, Duration::from_secs(5)).unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err}");
    assert!(Locker::from_url("mysql://nobody").is_err());
}

#[test]
fn the_bench_binary_compares_the_library_with_raw_get_lock() {
    let db = MariaDb::shared();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringlock-mysql-bench"))
        .args([
            "--url",
            &db.url(),
            "--ops",
            "20",
            "--rounds",
            "2",
            "--key",
            &key("bench"),
        ])
        .output()
        .expect("run the bench binary");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in ["raw GET_LOCK", "ringlock::mysql", "ratio"] {
        assert!(text.contains(needle), "{needle} missing from:\n{text}");
    }
}

/// This process's threads whose name starts with `prefix`, with the
/// signals each blocks (SigBlk of /proc/self/task/*/status).
fn threads_named(prefix: &str) -> Vec<(String, u64)> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").expect("list threads") {
        let dir = task.expect("a thread").path();
        let (Ok(comm), Ok(status)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("status")),
        ) else {
            continue; // it exited meanwhile
        };
        if !comm.starts_with(prefix) {
            continue;
        }
        let blocked = status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .map(|hex| u64::from_str_radix(hex.trim(), 16).expect("a hex mask"))
            .expect("a SigBlk line");
        found.push((dir.display().to_string(), blocked));
    }
    found
}

#[test]
fn background_threads_block_signals() {
    // The CLI forwards SIGINT/SIGTERM/SIGHUP to its command; a handler run
    // on one of these threads at the wrong moment would drop the signal.
    let db = MariaDb::shared();
    let k = key("quiet");
    let locker = Locker::with_options(db.pool(), fast());
    // The keeper and the connection watch start with the first lease, its
    // keep-alive thread one interval later.
    let lease = locker.lock(&k, Duration::from_secs(5)).unwrap();
    let (waiting, token) = {
        let token = CancelToken::new().unwrap();
        let (l, kk, t) = (locker.clone(), k.clone(), token.clone());
        // A cancellable wait has a cancel watcher thread.
        let h = std::thread::spawn(move || {
            l.lock_with(&kk, Duration::from_secs(30), &LockOptions::new().cancel(t))
        });
        (h, token)
    };
    db.wait_waiting(&k);
    let wanted = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP]
        .iter()
        .fold(0u64, |m, s| m | 1 << (s - 1));
    let mut seen = Vec::new();
    wait_until(
        "the keeper, watch, keep-alive and cancel threads run",
        || {
            seen = threads_named("ringlock-mysql");
            seen.len() >= 4
        },
    );
    for (thread, blocked) in &seen {
        assert_eq!(
            blocked & wanted,
            wanted,
            "{thread} can take SIGINT/SIGTERM/SIGHUP (SigBlk {blocked:x})"
        );
    }
    token.cancel();
    assert!(matches!(waiting.join().unwrap(), Err(Error::Cancelled)));
    lease.release().unwrap();
}
