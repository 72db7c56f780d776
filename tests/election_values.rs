//! Election values of up to 255 bytes (a session's source: its size byte
//! is unsigned) against the real server: a campaign and a proclaim of
//! 255-byte values, observed whole by the library's observer and by a raw
//! watcher, listed whole by the admin port, reset by that source (the
//! admin port's RSBS, through `Client::reset_by_source`), and a 256-byte
//! value refused before anything is sent; on a durable server, holds of
//! every record shape under 255-byte sources survive `kill -9` and
//! restart, twice, with the log compacted meanwhile. On one shard and on
//! two.

mod common;

use std::time::Duration;

use common::raw::RawSession;
use common::session::session;
use common::{keys, Server, TempDir};
use ringlock::client::{Client, Leader, Observer};
use ringlock::lease::Error;
use ringlock::protocol::session::{Access, Answer, EventKind, HoldMode, Req, Status};

const LONG: Duration = Duration::from_secs(20);

/// A 255-byte value, not UTF-8, different for each `tag`.
fn value(tag: u8) -> Vec<u8> {
    (0..255u8)
        .map(|i| i.wrapping_mul(7).wrapping_add(tag) | 0x80)
        .collect()
}

fn source_of(admin: std::net::SocketAddr, key: &str) -> Option<Vec<u8>> {
    keys(admin)
        .into_iter()
        .find(|k| k.key == key.as_bytes())
        .map(|k| k.source)
}

/// The next change an observer sees: the leader after it.
fn change(o: &mut Observer) -> Option<Leader> {
    assert!(
        o.changed(Some(LONG)).expect("the observation is open"),
        "a change within the bound"
    );
    o.leader().cloned()
}

/// The next Event a raw watcher reads: `(kind, token, source)`.
fn event(w: &mut RawSession) -> (EventKind, u64, Vec<u8>) {
    match w.read() {
        Answer::Event {
            kind,
            token,
            source,
            ..
        } => (kind, token, source),
        other => panic!("expected an Event, got {other:?}"),
    }
}

#[test]
fn a_255_byte_value_is_campaigned_proclaimed_observed_and_reset_whole() {
    for threads in ["1", "2"] {
        let s = Server::start(&["--threads", threads]);
        let (a, obs) = (session(s.lock_addr), session(s.lock_addr));
        let name = "e-long-value";
        let mut o = obs.election(name).unwrap().observe().unwrap();
        assert_eq!(o.leader(), None, "nobody leads yet");
        let v1 = value(1);
        let mut l = a.election(name).unwrap().campaign(&v1, Some(LONG)).unwrap();
        let first = change(&mut o).expect("a leads");
        assert_eq!((first.token, &first.value[..]), (l.token(), &v1[..]));
        assert_eq!(source_of(s.admin_addr, name), Some(v1.clone()));
        // A raw watcher reads the holder's whole source off the wire.
        let mut w = RawSession::open(s.lock_addr);
        let wrid = w.send(&Req::Watch {
            key: name.as_bytes(),
        });
        assert_eq!(event(&mut w), (EventKind::Holder, l.token(), v1.clone()));
        assert_eq!(w.reply(wrid).0, Status::Ok);
        // Another 255-byte value, proclaimed: the same token, told whole.
        let v2 = value(2);
        l.proclaim(&v2).unwrap();
        assert_eq!(l.value(), &v2[..]);
        let p = change(&mut o).expect("still a");
        assert_eq!((p.token, &p.value[..]), (first.token, &v2[..]));
        assert_eq!(
            event(&mut w),
            (EventKind::Proclaimed, first.token, v2.clone())
        );
        assert_eq!(source_of(s.admin_addr, name), Some(v2.clone()));
        assert_eq!(
            obs.election(name).unwrap().leader().unwrap(),
            Some(p.clone()),
            "a one-off read agrees"
        );
        // 256 bytes: refused before anything is sent (the leader stays).
        assert!(matches!(
            l.proclaim(vec![b'v'; 256]),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            a.election("e-other")
                .unwrap()
                .campaign(vec![b'v'; 256], Some(LONG)),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(source_of(s.admin_addr, name), Some(v2.clone()));
        assert!(o.leader().is_some(), "no change from a refused proclaim");
        // A reset by the 255-byte source (the admin port's RSBS: the lock
        // port's ResetBySource carries 127 at most) takes the leadership.
        let c = Client::builder(s.lock_addr)
            .admin_addr(s.admin_addr)
            .build()
            .unwrap();
        c.reset_by_source(&v2).unwrap();
        assert_eq!(change(&mut o), None, "the reset ended the leadership");
        assert_eq!(event(&mut w).0, EventKind::Reset);
        assert!(matches!(l.proclaim("late"), Err(Error::Lost(_))));
        assert!(keys(s.admin_addr).is_empty());
        o.close().unwrap();
    }
}

/// Sends an Acquire of `key` under `source` and reads its answer.
fn acquire(
    s: &mut RawSession,
    key: &str,
    hold: HoldMode,
    access: Access,
    source: &[u8],
) -> (Status, u64) {
    let rid = s.send(&Req::Acquire {
        hold,
        ttl_ms: if hold == HoldMode::Lease { 600_000 } else { 0 },
        wait_ms: 0,
        key: key.as_bytes(),
        source,
        access,
    });
    s.reply(rid)
}

#[test]
fn a_durable_server_keeps_255_byte_sources_across_kill_9_and_compaction() {
    for threads in ["1", "2"] {
        let dir = TempDir::new("long-values-wal");
        let wal = dir.path("locks.wal");
        let wal = wal.to_str().expect("utf-8 path");
        let args = [
            "--threads",
            threads,
            "--data-path",
            wal,
            "--compact-floor-bytes",
            "256",
        ];
        let mut srv = Server::start(&args);
        let mut a = RawSession::open(srv.lock_addr);
        // Every hold record that outlives its session: a lease (Hold), a
        // persistent hold (Acquire), shared and semaphore holds (Share),
        // two of them proclaimed to a 255-byte source (the record written
        // anew).
        let mut want = Vec::new();
        for (key, hold, access, tag) in [
            ("d-lease", HoldMode::Lease, Access::Exclusive, 3),
            ("d-persist", HoldMode::Persistent, Access::Exclusive, 4),
            ("d-shared", HoldMode::Lease, Access::Shared, 5),
            ("d-sem", HoldMode::Persistent, Access::Semaphore(2), 6),
        ] {
            let first = if tag % 2 == 1 {
                value(tag)
            } else {
                b"raw".to_vec()
            };
            let (st, token) = acquire(&mut a, key, hold, access, &first);
            assert_eq!(st, Status::Ok, "{key}");
            let v = value(tag);
            if first != v {
                let rid = a.send(&Req::Proclaim {
                    token,
                    key: key.as_bytes(),
                    source: &v,
                });
                assert_eq!(a.reply(rid), (Status::Ok, token), "{key}");
            }
            want.push((key, token, v));
        }
        // Churn under a 255-byte source grows the log past twice what the
        // holders need: the server compacts it (rewrites the holders).
        for _ in 0..64 {
            let (st, token) = acquire(
                &mut a,
                "d-churn",
                HoldMode::Session,
                Access::Exclusive,
                &value(9),
            );
            assert_eq!(st, Status::Ok);
            assert_eq!(a.release("d-churn", token), Status::Ok);
        }
        srv.wait_log("event=compaction_done");
        for round in 0..2 {
            srv.kill9();
            srv = Server::start(&args);
            for (key, _, v) in &want {
                assert_eq!(
                    source_of(srv.admin_addr, key).as_ref(),
                    Some(v),
                    "{key} after restart {round} ({threads} shards)"
                );
            }
        }
        // The tokens are the same holds': a Release by each frees it.
        let mut c = RawSession::open(srv.lock_addr);
        for (key, token, _) in &want {
            assert_eq!(c.release(key, *token), Status::Ok, "{key}");
        }
        assert!(keys(srv.admin_addr).is_empty());
    }
}
