//! Proclaim over the session protocol, against the real server (raw
//! frames): a hold's source changes and its token stays; only who may
//! release the hold may proclaim it; a watcher is told (`proclaimed`, the
//! new source, the same token); a durable server keeps the proclaimed
//! source across kill -9 and restart; bad bodies are `invalid` and change
//! nothing. On one shard and on two.

mod common;

use common::raw::RawSession;
use common::{keys, Conn, Server, TempDir};
use ringlock::protocol::session::{self as sp, Access, Answer, EventKind, HoldMode, Req, Status};

fn proclaim(s: &mut RawSession, key: &str, token: u64, source: &[u8]) -> (Status, u64) {
    let rid = s.send(&Req::Proclaim {
        token,
        key: key.as_bytes(),
        source,
    });
    s.reply(rid)
}

fn source_of(admin: std::net::SocketAddr, key: &str) -> Option<Vec<u8>> {
    keys(admin)
        .into_iter()
        .find(|k| k.key == key.as_bytes())
        .map(|k| k.source)
}

#[test]
fn a_proclaim_changes_the_source_keeps_the_token_and_tells_the_watchers() {
    for threads in ["1", "2"] {
        let srv = Server::start(&["--threads", threads]);
        let mut a = RawSession::open(srv.lock_addr);
        let mut b = RawSession::open(srv.lock_addr);
        let mut w = RawSession::open(srv.lock_addr);
        assert_ne!(
            a.flags & sp::FLAG_PROCLAIM,
            0,
            "the welcome offers proclaim"
        );
        for key in ["p-alpha", "p-beta", "p-gamma"] {
            let (st, token) = a.acquire(key, Access::Exclusive, 0);
            assert_eq!(st, Status::Ok);
            assert_eq!(source_of(srv.admin_addr, key).as_deref(), Some(&b"raw"[..]));
            let wrid = w.send(&Req::Watch {
                key: key.as_bytes(),
            });
            assert!(matches!(
                w.read(),
                Answer::Event {
                    kind: EventKind::Holder,
                    ..
                }
            ));
            assert_eq!(w.reply(wrid).0, Status::Ok);
            // Another session may not; a stale token changes nothing.
            assert_eq!(proclaim(&mut b, key, token, b"thief").0, Status::NotOwner);
            assert_eq!(proclaim(&mut a, key, token + 1, b"x").0, Status::Stale);
            assert_eq!(proclaim(&mut a, "p-free", token, b"x").0, Status::Stale);
            assert_eq!(source_of(srv.admin_addr, key).as_deref(), Some(&b"raw"[..]));
            // The holder proclaims: ok, its token in the Reply.
            assert_eq!(
                proclaim(&mut a, key, token, b"leader:7001"),
                (Status::Ok, token)
            );
            assert_eq!(
                source_of(srv.admin_addr, key).as_deref(),
                Some(&b"leader:7001"[..])
            );
            match w.read() {
                Answer::Event {
                    rid,
                    kind,
                    token: t,
                    hold,
                    source,
                    ..
                } => {
                    assert_eq!(rid, wrid);
                    assert_eq!(kind, EventKind::Proclaimed);
                    assert_eq!(t, token, "the same token");
                    assert_eq!(hold, HoldMode::Session);
                    assert_eq!(source, b"leader:7001");
                }
                other => panic!("expected the proclaimed Event, got {other:?}"),
            }
            // A reset by the new source takes the hold: it is the source
            // now, for everything.
            let mut lc = Conn::persistent(srv.lock_addr);
            assert_eq!(lc.reset_source(b"leader:7001"), b'+');
            match w.read() {
                Answer::Event { kind, token: t, .. } => {
                    assert_eq!((kind, t), (EventKind::Reset, token));
                }
                other => panic!("expected the reset Event, got {other:?}"),
            }
            match a.read() {
                Answer::Lost { token: t, .. } => assert_eq!(t, token, "the holder is told"),
                other => panic!("expected the Lost push, got {other:?}"),
            }
            assert_eq!(proclaim(&mut a, key, token, b"late").0, Status::Stale);
        }
        // Bad bodies (a key of 128 bytes, a cut body): invalid, nothing
        // changed, the session goes on.
        let (st, token) = a.acquire("p-bad", Access::Exclusive, 0);
        assert_eq!(st, Status::Ok);
        let mut long = vec![sp::OP_PROCLAIM];
        let mut body = token.to_le_bytes().to_vec();
        body.push(128);
        body.extend_from_slice(&[b'k'; 128]);
        body.push(1);
        body.extend_from_slice(b"v");
        long.extend_from_slice(&99u32.to_le_bytes());
        long.extend_from_slice(&(body.len() as u16).to_le_bytes());
        long.extend_from_slice(&body);
        use std::io::Write;
        a.s.write_all(&long).unwrap();
        assert_eq!(a.reply(99).0, Status::Invalid);
        let mut short = vec![sp::OP_PROCLAIM];
        short.extend_from_slice(&100u32.to_le_bytes());
        short.extend_from_slice(&4u16.to_le_bytes());
        short.extend_from_slice(&[1, 2, 3, 4]);
        a.s.write_all(&short).unwrap();
        assert_eq!(a.reply(100).0, Status::Invalid);
        assert_eq!(
            source_of(srv.admin_addr, "p-bad").as_deref(),
            Some(&b"raw"[..])
        );
        // An empty source is the client's IP address, as in an Acquire.
        assert_eq!(proclaim(&mut a, "p-bad", token, b""), (Status::Ok, token));
        assert_eq!(
            source_of(srv.admin_addr, "p-bad").as_deref(),
            Some(&b"127.0.0.1"[..])
        );
        assert_eq!(a.release("p-bad", token), Status::Ok);
    }
}

#[test]
fn a_durable_server_keeps_a_proclaimed_source_across_kill_9() {
    for threads in ["1", "2"] {
        let dir = TempDir::new("proclaim-wal");
        let wal = dir.path("locks.wal");
        let wal = wal.to_str().expect("utf-8 path");
        let mut srv = Server::start(&["--threads", threads, "--data-path", wal]);
        let mut a = RawSession::open(srv.lock_addr);
        let mut tokens = Vec::new();
        for key in ["d-one", "d-two", "d-three"] {
            let rid = a.acquire_send(key, HoldMode::Lease, 600_000, Access::Exclusive, 0);
            let (st, token) = a.reply(rid);
            assert_eq!(st, Status::Ok);
            let value = format!("{key}-v2");
            assert_eq!(proclaim(&mut a, key, token, value.as_bytes()).0, Status::Ok);
            tokens.push((key, token, value));
        }
        // A persistent hold of a Locking-Center client, proclaimed by token
        // from a session (as a Release by token may).
        let rid = a.acquire_send("d-persist", HoldMode::Persistent, 0, Access::Exclusive, 0);
        let (st, pt) = a.reply(rid);
        assert_eq!(st, Status::Ok);
        let mut other = RawSession::open(srv.lock_addr);
        assert_eq!(proclaim(&mut other, "d-persist", pt, b"p-v2").0, Status::Ok);
        srv.kill9();
        let srv = Server::start(&["--threads", threads, "--data-path", wal]);
        for (key, _, value) in &tokens {
            assert_eq!(
                source_of(srv.admin_addr, key).as_deref(),
                Some(value.as_bytes()),
                "{key} after the restart"
            );
        }
        assert_eq!(
            source_of(srv.admin_addr, "d-persist").as_deref(),
            Some(&b"p-v2"[..])
        );
        // The tokens are the same holds': a Release by each frees it.
        let mut c = RawSession::open(srv.lock_addr);
        for (key, token, _) in &tokens {
            assert_eq!(c.release(key, *token), Status::Ok, "{key}");
        }
        assert_eq!(c.release("d-persist", pt), Status::Ok);
        assert!(keys(srv.admin_addr).is_empty());
    }
}
