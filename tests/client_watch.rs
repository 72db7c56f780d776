//! `Session::watch` of the Rust client against the real server: the
//! holders a key has, then every change in order (other sessions, a
//! Locking-Center client, a session's end), shared holders, `close`
//! stopping the events, the watch ending with a clear error when its
//! session ends, and a server without watches refused before anything is
//! sent.

mod common;

use std::time::Duration;

use common::session::{scripted_welcome, session};
use common::{Conn, Server};
use ringlock::client::{Access, EventKind, HeldAs, RetryPolicy, Session};
use ringlock::lease::Error;
use ringlock::protocol::session as wire;

const LONG: Duration = Duration::from_secs(20);

fn next(w: &mut ringlock::client::Watch) -> ringlock::client::WatchEvent {
    w.next(Some(LONG))
        .expect("the watch is open")
        .expect("an event within the bound")
}

#[test]
fn a_watch_lists_the_holders_then_reports_every_change_in_order() {
    for threads in ["1", "2"] {
        let s = Server::start(&["--threads", threads]);
        let a = session(s.lock_addr);
        let b = session(s.lock_addr);
        let watcher = session(s.lock_addr);
        assert!(watcher.offers_watches());
        for key in ["w-alpha", "w-beta", "w-gamma"] {
            let held = a.lock(key, LONG).unwrap();
            let mut w = watcher.watch(key).unwrap();
            assert_eq!(w.key(), key.as_bytes());
            assert_eq!(w.holders().len(), 1);
            assert_eq!(w.holders()[0].token, held.token().unwrap());
            assert_eq!(w.holders()[0].hold, HeldAs::Session);
            // b waits; a releases: released, then b's grant.
            let b2 = b.clone();
            let k = key.to_string();
            let waiter = std::thread::spawn(move || b2.lock(&k, LONG).unwrap());
            let t_a = held.token().unwrap();
            held.release().unwrap();
            let got = waiter.join().unwrap();
            let e = next(&mut w);
            assert_eq!((e.kind, e.holder.token), (EventKind::Released, t_a));
            let e = next(&mut w);
            assert_eq!(
                (e.kind, e.holder.token),
                (EventKind::Granted, got.token().unwrap())
            );
            got.release().unwrap();
            assert_eq!(next(&mut w).kind, EventKind::Released);
            // A Locking-Center client, with its source.
            let mut lc = Conn::persistent(s.lock_addr);
            assert_eq!(lc.lock(key.as_bytes(), b"lc"), b'+');
            let e = next(&mut w);
            assert_eq!(e.kind, EventKind::Granted);
            assert_eq!(e.holder.hold, HeldAs::Persistent);
            assert_eq!(e.holder.source, b"lc");
            assert_eq!(lc.unlock(key.as_bytes()), b'+');
            assert_eq!(next(&mut w).kind, EventKind::Released);
            // Readers, each its own grant.
            let r1 = a.lock_shared(key, LONG).unwrap();
            let r2 = b.lock_shared(key, LONG).unwrap();
            for r in [&r1, &r2] {
                let e = next(&mut w);
                assert_eq!(
                    (e.kind, e.holder.token, e.holder.access),
                    (EventKind::Granted, r.token().unwrap(), Access::Shared)
                );
            }
            r1.release().unwrap();
            r2.release().unwrap();
            assert_eq!(next(&mut w).holder.token, r1.token().unwrap());
            assert_eq!(next(&mut w).holder.token, r2.token().unwrap());
            // close: no event after it; nothing pending on the wire.
            w.close().unwrap();
        }
        // A watch ends, with a reason, when its session does.
        let mut w = watcher.watch("w-end").unwrap();
        assert!(w.holders().is_empty());
        watcher.close();
        let err = w.next(Some(LONG)).expect_err("the session ended");
        assert!(
            matches!(&err, Error::Failed { cause, .. } if cause.to_string().contains("session ended")),
            "{err:?}"
        );
        assert!(w.next(Some(LONG)).is_err(), "and stays ended");
    }
}

/// A session holder's end is `SessionEnded`; an event within a bound that
/// passes is `Ok(None)`, the watch still open.
#[test]
fn a_holders_session_end_is_reported_and_a_quiet_key_times_out() {
    let s = Server::start(&[]);
    let watcher = session(s.lock_addr);
    let mut w = watcher.watch("quiet").unwrap();
    assert!(w.next(Some(Duration::from_millis(20))).unwrap().is_none());
    let a = session(s.lock_addr);
    let held = a.lock("quiet", LONG).unwrap();
    assert_eq!(next(&mut w).holder.token, held.token().unwrap());
    a.close();
    let e = next(&mut w);
    assert_eq!(
        (e.kind, e.holder.token),
        (EventKind::SessionEnded, held.token().unwrap())
    );
}

#[test]
fn a_server_without_watches_is_refused_here_before_anything_is_sent() {
    // A server older than watches (its welcome has the modes flag only).
    let (addr, seen) = scripted_welcome(wire::FLAG_MODES);
    let a = Session::builder(addr)
        .retry(RetryPolicy::none())
        .connect()
        .expect("session");
    assert!(!a.offers_watches());
    let err = a.watch("doc").expect_err("not offered");
    let Error::Unsupported(why) = &err else {
        panic!("expected Unsupported, got {err:?}");
    };
    assert!(why.ends_with("nothing was sent"), "{why}");
    assert!(matches!(a.watch(""), Err(Error::InvalidKey(_))));
    a.close();
    let ops = seen.join().unwrap();
    assert!(!ops.contains(&wire::OP_WATCH), "no Watch was sent: {ops:?}");
}

#[test]
fn changes_read_together_with_the_watch_answer_are_kept_in_order() {
    // A server that answers the Watch with its holder, its Reply and three
    // changes in one write: the I/O thread reads them all before the
    // caller of `watch` wakes. (Seen with the real server when a grant
    // raced the watch: `ringlock elect --listen` failed with "a granted
    // event before the watch's answer".)
    use std::io::{Read, Write};
    use wire::{Decoded, EventHolder, Status};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let (mut buf, mut chunk) = (Vec::new(), [0u8; 4096]);
        loop {
            while let Decoded::Frame { op, rid, len, .. } = wire::decode(&buf) {
                buf.drain(..len);
                let mut out = Vec::new();
                let h = |token| EventHolder {
                    token,
                    hold: wire::HoldMode::Session,
                    access: Access::Exclusive,
                    key: b"k",
                    source: b"s",
                };
                match op {
                    wire::OP_HELLO => {
                        let welcome = common::session::scripted(wire::FLAG_WATCH);
                        wire::encode_welcome(rid, &welcome, &mut out)
                    }
                    wire::OP_WATCH => {
                        wire::encode_event(rid, EventKind::Holder, &h(1), &mut out);
                        wire::encode_reply(rid, Status::Ok, 0, wire::NO_TTL, &mut out);
                        wire::encode_event(rid, EventKind::Released, &h(1), &mut out);
                        wire::encode_event(rid, EventKind::Granted, &h(2), &mut out);
                        wire::encode_event(rid, EventKind::Proclaimed, &h(2), &mut out);
                    }
                    _ => wire::encode_reply(rid, Status::Ok, 0, wire::NO_TTL, &mut out),
                }
                s.write_all(&out).unwrap();
            }
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    });
    let a = Session::builder(addr)
        .retry(RetryPolicy::none())
        .connect()
        .expect("session");
    for _ in 0..20 {
        let mut w = a.watch("k").expect("the watch opens");
        assert_eq!(w.holders().len(), 1);
        let got: Vec<(EventKind, u64)> = (0..3)
            .map(|_| {
                let e = next(&mut w);
                (e.kind, e.holder.token)
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (EventKind::Released, 1),
                (EventKind::Granted, 2),
                (EventKind::Proclaimed, 2)
            ]
        );
    }
    a.close();
    server.join().unwrap();
}
