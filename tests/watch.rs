//! Watching a key's holders over the session protocol, against the real
//! server (raw frames): a Watch lists the holders the key has, then its
//! Reply, then every grant and release of the key as an Event, in the
//! order the server decided them, whoever made them (sessions of any hold
//! and access, Locking-Center clients, expiry, resets, a session's end);
//! Unwatch ends it; a watch takes no slot and blocks nobody; it ends with
//! its session; bad input is `invalid`. On one shard and on two (keys of
//! both, a watcher homed on either).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::raw::RawSession;
use common::{Conn, Server};
use ringlock::protocol::session::{
    self as sp, Access, Answer, EventKind, HoldMode, Req, Status, WAIT_FOREVER,
};

/// One Event as the test compares it: (kind, token, hold, access, source).
type Ev = (EventKind, u64, HoldMode, Access, Vec<u8>);

fn watch(w: &mut RawSession, key: &str) -> (u32, Vec<Ev>) {
    let rid = w.send(&Req::Watch {
        key: key.as_bytes(),
    });
    let mut holders = Vec::new();
    loop {
        match w.read() {
            Answer::Reply { rid: r, status, .. } => {
                assert_eq!(r, rid);
                assert_eq!(status, Status::Ok, "the Watch is answered ok");
                return (rid, holders);
            }
            a @ Answer::Event { .. } => {
                let e = of_watch(a, rid, key);
                assert_eq!(e.0, EventKind::Holder, "only holders before the Reply");
                holders.push(e);
            }
            other => panic!("a Watch answered {other:?}"),
        }
    }
}

/// The next Event of watch `rid` on `key`.
fn event(w: &mut RawSession, rid: u32, key: &str) -> Ev {
    let a = w.read();
    of_watch(a, rid, key)
}

/// `a`, which must be an Event of watch `rid` on `key`.
fn of_watch(a: Answer, rid: u32, key: &str) -> Ev {
    match a {
        Answer::Event {
            rid: r,
            kind,
            token,
            hold,
            access,
            key: k,
            source,
        } => {
            assert_eq!(r, rid, "the Event carries the Watch's rid");
            assert_eq!(k, key.as_bytes());
            (kind, token, hold, access, source)
        }
        other => panic!("expected an Event of {key}, got {other:?}"),
    }
}

fn server(threads: &str) -> Server {
    Server::start(&["--threads", threads, "--min-ttl", "10ms"])
}

/// Keys owned by every shard of a server of `threads` shards, found by
/// asking: the admin `KEYS` does not say, so take many names.
fn keys() -> Vec<String> {
    (0..8).map(|i| format!("watched-{i}")).collect()
}

fn every_change_in_order(threads: &str) {
    let s = server(threads);
    for key in keys() {
        let key = key.as_str();
        let mut a = RawSession::open(s.lock_addr);
        assert_ne!(a.flags & sp::FLAG_WATCH, 0, "the welcome offers watches");
        let ta = a.acquire(key, Access::Exclusive, 0).1;
        let mut w = RawSession::open(s.lock_addr);
        let (rid, now) = watch(&mut w, key);
        assert_eq!(
            now,
            vec![(
                EventKind::Holder,
                ta,
                HoldMode::Session,
                Access::Exclusive,
                b"raw".to_vec()
            )]
        );
        // A waiter queues: nothing changes for the watcher.
        let mut b = RawSession::open(s.lock_addr);
        let brid = b.acquire_send(key, HoldMode::Session, 0, Access::Exclusive, WAIT_FOREVER);
        // a releases: released, then b's grant, in that order.
        assert_eq!(a.release(key, ta), Status::Ok);
        let (st, tb) = b.reply(brid);
        assert_eq!(st, Status::Ok);
        assert_eq!(event(&mut w, rid, key).0, EventKind::Released);
        let e = event(&mut w, rid, key);
        assert_eq!((e.0, e.1), (EventKind::Granted, tb));
        // b's session ends: session_ended.
        drop(b);
        let e = event(&mut w, rid, key);
        assert_eq!((e.0, e.1), (EventKind::SessionEnded, tb));
        // A Locking-Center client: a persistent hold with its source.
        let mut lc = Conn::persistent(s.lock_addr);
        assert_eq!(lc.lock(key.as_bytes(), b"lc-src"), b'+');
        let (kind, tl, hold, access, src) = event(&mut w, rid, key);
        assert_eq!(
            (kind, hold, access, src.as_slice()),
            (
                EventKind::Granted,
                HoldMode::Persistent,
                Access::Exclusive,
                &b"lc-src"[..]
            )
        );
        assert!(tl > tb, "tokens increase");
        assert_eq!(lc.reset_key(key.as_bytes()), b'+');
        assert_eq!(
            event(&mut w, rid, key),
            (EventKind::Reset, tl, hold, access, src)
        );
        // Readers: each its own grant and release.
        let mut r1 = RawSession::open(s.lock_addr);
        let mut r2 = RawSession::open(s.lock_addr);
        let t1 = r1.acquire(key, Access::Shared, 0).1;
        let t2 = r2.acquire(key, Access::Shared, 0).1;
        let e1 = event(&mut w, rid, key);
        let e2 = event(&mut w, rid, key);
        assert_eq!((e1.0, e1.1, e1.3), (EventKind::Granted, t1, Access::Shared));
        assert_eq!((e2.0, e2.1, e2.3), (EventKind::Granted, t2, Access::Shared));
        assert_eq!(r2.release(key, t2), Status::Ok);
        assert_eq!(event(&mut w, rid, key).1, t2);
        assert_eq!(r1.release(key, t1), Status::Ok);
        assert_eq!(event(&mut w, rid, key).1, t1);
        // A lease that runs out: expired.
        let mut l = RawSession::open(s.lock_addr);
        let lrid = l.acquire_send(key, HoldMode::Lease, 10, Access::Semaphore(2), 0);
        let tl = l.reply(lrid).1;
        let e = event(&mut w, rid, key);
        assert_eq!(
            (e.0, e.1, e.2, e.3),
            (
                EventKind::Granted,
                tl,
                HoldMode::Lease,
                Access::Semaphore(2)
            )
        );
        let e = event(&mut w, rid, key);
        assert_eq!((e.0, e.1), (EventKind::Expired, tl));
        // Unwatch: ok, then nothing more; a second one finds nothing.
        let u = w.send(&Req::Unwatch {
            target: rid,
            key: key.as_bytes(),
        });
        assert_eq!(w.reply(u).0, Status::Ok);
        let u = w.send(&Req::Unwatch {
            target: rid,
            key: key.as_bytes(),
        });
        assert_eq!(w.reply(u).0, Status::NotQueued);
        // The watcher's own Acquire of the key: its Reply comes from the
        // key's shard after any Event that shard would have sent.
        assert_eq!(w.acquire(key, Access::Exclusive, 0).0, Status::Ok);
    }
}

#[test]
fn a_watch_lists_the_holders_then_every_change_in_order() {
    every_change_in_order("1");
}

#[test]
fn a_watch_lists_the_holders_then_every_change_in_order_on_two_shards() {
    every_change_in_order("2");
}

/// Several watchers of one key each see every change; a watch blocks
/// nobody and takes no slot: a try-lock of a watched free key is granted.
#[test]
fn every_watcher_sees_every_change_and_a_watch_holds_nothing() {
    let s = server("2");
    let mut ws: Vec<(RawSession, u32)> = (0..3)
        .map(|_| {
            let mut w = RawSession::open(s.lock_addr);
            let (rid, now) = watch(&mut w, "shared-watch");
            assert!(now.is_empty(), "a free key has no holders");
            (w, rid)
        })
        .collect();
    let mut a = RawSession::open(s.lock_addr);
    for _ in 0..5 {
        let (st, t) = a.acquire("shared-watch", Access::Exclusive, 0);
        assert_eq!(st, Status::Ok, "a watched key is free to take");
        assert_eq!(a.release("shared-watch", t), Status::Ok);
        for (w, rid) in ws.iter_mut() {
            assert_eq!(event(w, *rid, "shared-watch").0, EventKind::Granted);
            assert_eq!(event(w, *rid, "shared-watch").0, EventKind::Released);
        }
    }
}

fn metric(addr: SocketAddr, name: &str) -> f64 {
    let mut c = TcpStream::connect(addr).expect("metrics");
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} not exported"))
        .parse()
        .expect("a number")
}

/// A watch ends with its session (the gauge goes back to 0); bad Watch
/// and Unwatch bodies are `invalid` and the session goes on.
#[test]
fn a_watch_ends_with_its_session_and_bad_input_is_invalid() {
    let s = Server::start(&["--threads", "2", "--metrics-bind", "127.0.0.1:0"]);
    let mut w = RawSession::open(s.lock_addr);
    for k in keys() {
        watch(&mut w, &k);
    }
    assert_eq!(metric(s.metrics(), "ringlock_watches"), 8.0);
    // A key of 0 bytes; a body with trailing bytes; a short Unwatch.
    for (op, body) in [
        (sp::OP_WATCH, vec![0u8]),
        (sp::OP_WATCH, vec![1, b'k', 9]),
        (sp::OP_UNWATCH, vec![1, 0, 0]),
    ] {
        let mut f = vec![op];
        f.extend_from_slice(&77u32.to_le_bytes());
        f.extend_from_slice(&(body.len() as u16).to_le_bytes());
        f.extend_from_slice(&body);
        w.s.write_all(&f).unwrap();
        assert_eq!(w.reply(77).0, Status::Invalid, "op {op} body {body:?}");
    }
    let p = w.send(&Req::Ping);
    assert_eq!(w.reply(p).0, Status::Ok, "the session goes on");
    drop(w);
    common::session::eventually("the watches end with their session", || {
        metric(s.metrics(), "ringlock_watches") == 0.0
    });
}
