//! Shared and semaphore holds through `ringlock::client::Session`, against
//! the real `ringlockd`: readers hold a key together and a writer waits
//! for all of them (and is not overtaken by a later reader), a semaphore
//! of 2 admits two and queues the third until a slot is free, a request
//! naming another slot count gets `Error::ModeMismatch`, a semaphore of 0
//! is a usage error, a `--data-path` server offers them too, and a server
//! without the modes flag (an older one, scripted) gets
//! `Error::Unsupported` with no Acquire on the wire. The waits are
//! observed through the server's queued-waiters gauge, which the loop
//! publishes before it sends the answers of the same tick: read after a
//! release was answered, it says whether that release let a waiter in.

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::session::{scripted_welcome, session, Proxy};
use common::{metric, wait_metric, Server, TempDir};
use ringlock::client::{Access, Acquire, Hold, RetryPolicy, Session, Wait};
use ringlock::lease::{Error, Lease, LockOptions};
use ringlock::protocol::session as wire;

const LONG: Duration = Duration::from_secs(30);

fn queued(s: &Server) -> f64 {
    metric(s.metrics(), "ringlock_queued_waiters")
}

/// `lock` on its own thread (its own session): the grant or error comes
/// back on the channel.
fn waiter(
    s: &Server,
    key: &'static str,
    access: Access,
) -> (mpsc::Receiver<Result<Lease, Error>>, Session) {
    let sess = session(s.lock_addr);
    let on_thread = sess.clone();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let what = Acquire {
            wait: Wait::For(LONG),
            access,
            ..Acquire::default()
        };
        let _ = tx.send(on_thread.acquire(key, what, &LockOptions::new()));
    });
    (rx, sess)
}

#[test]
fn readers_hold_together_and_a_writer_waits_for_all_of_them() {
    let s = Server::start(&["--metrics-bind", "127.0.0.1:0"]);
    let (a, b, c) = (
        session(s.lock_addr),
        session(s.lock_addr),
        session(s.lock_addr),
    );
    assert!(a.offers_modes(), "an in-memory server offers modes");
    let ra = a.lock_shared("doc", LONG).expect("first reader");
    let rb = b
        .try_lock_shared("doc")
        .expect("no error")
        .expect("a second reader is admitted at once");
    assert_eq!((ra.access(), rb.access()), (Access::Shared, Access::Shared));
    assert!(rb.token() > ra.token(), "every grant has its own token");
    assert!(
        c.try_lock("doc").unwrap().is_none(),
        "an exclusive try is refused while readers hold"
    );

    let (granted, _w) = waiter(&s, "doc", Access::Exclusive);
    wait_metric(s.metrics(), "ringlock_queued_waiters", 1.0);
    // A reader that comes after the waiting writer does not overtake it.
    assert!(c.try_lock_shared("doc").unwrap().is_none());

    ra.release().unwrap();
    assert_eq!(queued(&s), 1.0, "one reader left holds: the writer waits");
    assert!(granted.try_recv().is_err());
    rb.release().unwrap();
    let w = granted
        .recv_timeout(LONG)
        .expect("the writer is answered")
        .expect("granted once the last reader left");
    assert_eq!(w.access(), Access::Exclusive);
    assert!(w.token() > rb.token());
    assert!(
        c.try_lock_shared("doc").unwrap().is_none(),
        "readers wait for the writer"
    );
    w.release().unwrap();
    let r = c.try_lock_shared("doc").unwrap().expect("free again");
    r.release().unwrap();
}

#[test]
fn a_semaphore_of_two_admits_two_and_the_third_waits_for_a_slot() {
    let s = Server::start(&["--metrics-bind", "127.0.0.1:0"]);
    let (a, b, c) = (
        session(s.lock_addr),
        session(s.lock_addr),
        session(s.lock_addr),
    );
    let pa = a.lock_permit("pool", 2, LONG).expect("first slot");
    let pb = b
        .try_lock_permit("pool", 2)
        .unwrap()
        .expect("second slot at once");
    assert_eq!(pa.access(), Access::Semaphore(2));
    assert_eq!(pb.access(), Access::Semaphore(2));
    assert!(
        c.try_lock_permit("pool", 2).unwrap().is_none(),
        "both slots taken"
    );
    assert!(c.try_lock("pool").unwrap().is_none(), "and not free");

    let (granted, _w) = waiter(&s, "pool", Access::Semaphore(2));
    wait_metric(s.metrics(), "ringlock_queued_waiters", 1.0);
    assert!(granted.try_recv().is_err());
    pa.release().unwrap();
    let third = granted
        .recv_timeout(LONG)
        .expect("the third is answered")
        .expect("granted the slot the first left");
    assert_eq!(third.access(), Access::Semaphore(2));
    assert!(third.token() > pb.token());
    assert_eq!(queued(&s), 0.0);
    assert!(
        c.try_lock_permit("pool", 2).unwrap().is_none(),
        "two hold again"
    );
    pb.release().unwrap();
    third.release().unwrap();
}

#[test]
fn another_slot_count_is_a_mode_mismatch_that_names_the_key() {
    let s = Server::start(&[]);
    let (a, b) = (session(s.lock_addr), session(s.lock_addr));
    let held = a.lock_permit("pool", 2, LONG).unwrap();
    for got in [
        b.lock_permit("pool", 3, LONG).map(Some),
        b.try_lock_permit("pool", 1),
    ] {
        let err = got.expect_err("another count than the key's");
        let Error::ModeMismatch { key, slots } = &err else {
            panic!("expected ModeMismatch, got {err:?}");
        };
        assert_eq!(key, "pool");
        assert!(*slots == 3 || *slots == 1);
        let text = err.to_string();
        assert!(
            text.contains("\"pool\"") && text.contains(&format!("one of {slots} slots")),
            "{text}"
        );
    }
    // Nothing changed: the key's count is still 2, and the session works.
    let second = b.try_lock_permit("pool", 2).unwrap().expect("a free slot");
    held.release().unwrap();
    second.release().unwrap();
    // Free again: the next first holder fixes another count.
    b.try_lock_permit("pool", 3)
        .unwrap()
        .expect("free")
        .release()
        .unwrap();
}

#[test]
fn a_semaphore_of_zero_slots_is_a_usage_error_sent_nowhere() {
    let s = Server::start(&[]);
    let proxy = Proxy::new(s.lock_addr);
    let a = session(proxy.addr);
    for got in [
        a.lock_permit("pool", 0, LONG).map(Some),
        a.try_lock_permit("pool", 0),
    ] {
        let err = got.expect_err("0 slots");
        assert!(err.is_usage(), "{err:?}");
        assert!(err.to_string().contains("at least 1 slot"), "{err}");
    }
    // An answered request after them: the proxy forwarded everything
    // before it, so the count is complete.
    a.try_lock("pool")
        .unwrap()
        .expect("free")
        .release()
        .unwrap();
    assert_eq!(proxy.count(wire::OP_ACQUIRE), 1, "only the exclusive try");
}

#[test]
fn a_durable_server_offers_modes_too() {
    let dir = TempDir::new("client-modes-wal");
    let wal = dir.path("locks.wal");
    let s = Server::start(&["--data-path", wal.to_str().expect("utf-8 path")]);
    let (a, b) = (session(s.lock_addr), session(s.lock_addr));
    assert!(a.offers_modes());
    let ra = a.lock_shared("doc", LONG).unwrap();
    let rb = b.try_lock_shared("doc").unwrap().expect("readers share");
    assert!(b.try_lock("doc").unwrap().is_none());
    ra.release().unwrap();
    rb.release().unwrap();
    b.try_lock_permit("doc", 1)
        .unwrap()
        .expect("free")
        .release()
        .unwrap();
}

#[test]
fn a_server_without_modes_is_refused_here_before_anything_is_sent() {
    // A server older than lock modes (its welcome lacks the flag), plain
    // and resumable: every real ringlockd offers modes now, so a scripted
    // one plays it.
    for flags in [0, wire::FLAG_RESUMABLE] {
        let (addr, seen) = scripted_welcome(flags);
        let a = Session::builder(addr)
            .retry(RetryPolicy::none())
            .connect()
            .expect("session");
        assert!(!a.offers_modes(), "flags {flags}");
        let lease_shared = Acquire {
            hold: Hold::Lease(Duration::from_secs(5)),
            wait: Wait::Try,
            access: Access::Shared,
        };
        for (got, asked) in [
            (a.lock_shared("doc", LONG).map(Some), "a shared hold"),
            (a.try_lock_shared("doc"), "a shared hold"),
            (
                a.lock_permit("doc", 3, LONG).map(Some),
                "a semaphore hold (one of 3 slots)",
            ),
            (
                a.acquire("doc", lease_shared, &LockOptions::new())
                    .map(Some),
                "a shared hold",
            ),
        ] {
            let err = got.expect_err("not offered");
            let Error::Unsupported(why) = &err else {
                panic!("expected Unsupported, got {err:?}");
            };
            assert!(
                why.starts_with(&format!(
                    "{asked} of \"doc\": this server does not offer shared or semaphore holds"
                )) && why.ends_with("nothing was sent"),
                "{why}"
            );
        }
        // Never an exclusive lock instead: the first Acquire on the wire
        // is this exclusive one.
        let w = a.try_lock("doc").unwrap().expect("granted by the script");
        assert_eq!(w.access(), Access::Exclusive);
        w.release().unwrap();
        a.close();
        let ops = seen.join().unwrap();
        assert_eq!(
            ops.iter().filter(|&&op| op == wire::OP_ACQUIRE).count(),
            1,
            "no shared or semaphore Acquire was sent: {ops:?}"
        );
    }
}

#[test]
fn grants_and_holders_are_counted_by_access() {
    let s = Server::start(&["--threads", "2", "--metrics-bind", "127.0.0.1:0"]);
    let a = session(s.lock_addr);
    let by = |access: &str| {
        metric(
            s.metrics(),
            &format!("ringlock_grants_by_access_total{{access=\"{access}\"}}"),
        )
    };
    for key in ["m-one", "m-two"] {
        a.lock_shared(key, LONG).unwrap().release().unwrap();
        a.lock_shared(key, LONG).unwrap().release().unwrap();
        a.lock_permit(key, 3, LONG).unwrap().release().unwrap();
        a.lock(key, LONG).unwrap().release().unwrap();
    }
    // The counters are published by each shard's loop: wait for the total.
    wait_metric(s.metrics(), "ringlock_grants_total", 8.0);
    assert_eq!(
        (by("exclusive"), by("shared"), by("semaphore")),
        (2.0, 4.0, 2.0)
    );

    // The holders gauge, by access: two readers, three permits, one
    // exclusive holder (on keys of both shards), then none.
    let b = session(s.lock_addr);
    let held = [
        a.lock_shared("m-one", LONG).unwrap(),
        b.lock_shared("m-one", LONG).unwrap(),
        a.lock_permit("m-two", 3, LONG).unwrap(),
        b.lock_permit("m-two", 3, LONG).unwrap(),
        session(s.lock_addr).lock_permit("m-two", 3, LONG).unwrap(),
        a.lock("m-three", LONG).unwrap(),
    ];
    let gauge = |access: &str| format!("ringlock_holders{{access=\"{access}\"}}");
    wait_metric(s.metrics(), &gauge("shared"), 2.0);
    wait_metric(s.metrics(), &gauge("semaphore"), 3.0);
    wait_metric(s.metrics(), &gauge("exclusive"), 1.0);
    assert_eq!(metric(s.metrics(), "ringlock_held_keys"), 3.0);
    for h in held {
        h.release().unwrap();
    }
    for access in ["shared", "semaphore", "exclusive"] {
        wait_metric(s.metrics(), &gauge(access), 0.0);
    }
}
