//! Sessions in durable mode under a failing log (`RINGLOCK_FAULTS`): an
//! answer that waited for a voided record is never sent; its session is
//! ended instead, so the client learns it lost whatever that window gave
//! it, and the undone grant is free again.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::{Server, TempDir};
use ringlock::protocol::session::{self as sp, Answer, HoldMode, Req, Status};

fn send(s: &mut TcpStream, rid: u32, req: &Req<'_>) {
    let mut b = Vec::new();
    sp::encode(rid, req, &mut b);
    s.write_all(&b).expect("send");
}

/// Every answer until EOF (the server closes the session).
fn answers_until_eof(s: &mut TcpStream) -> Vec<Answer> {
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).expect("read to EOF");
    let mut out = Vec::new();
    let mut at = 0;
    while let Some((a, n)) = sp::decode_answer(&buf[at..], Some(1)).expect("well-formed") {
        out.push(a);
        at += n;
    }
    assert_eq!(at, buf.len(), "a partial answer before EOF");
    out
}

fn acquire<'a>(key: &'a [u8], hold: HoldMode, ttl_ms: u32) -> Req<'a> {
    Req::Acquire {
        hold,
        ttl_ms,
        wait_ms: 0,
        key,
        source: b"",
        access: ringlock::protocol::session::Access::Exclusive,
    }
}

#[test]
fn a_failed_fdatasync_ends_the_session_it_would_have_answered() {
    let dir = TempDir::new("sess-faults");
    let log = dir.path("wal");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringlockd"));
    cmd.args(["--bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0"])
        .arg("--data-path")
        .arg(&log)
        // fdatasync 1: the lease's grant; 2: the session hold's (fails).
        .env("RINGLOCK_FAULTS", "fail_fsync_at=2");
    let srv = Server::spawn(cmd, &[]).expect("ringlockd starts");
    let mut s = TcpStream::connect(srv.lock_addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    send(
        &mut s,
        1,
        &Req::Hello {
            version: sp::VERSION,
            keepalive_ms: 0,
            auth: b"",
        },
    );
    send(&mut s, 2, &acquire(b"lease", HoldMode::Lease, 60_000));
    // Wait for the lease's answer before the second request, so that the
    // two grants land in different fdatasyncs.
    let mut buf = Vec::new();
    let mut got = 0;
    while got < 2 {
        let mut chunk = [0u8; 256];
        let n = s.read(&mut chunk).expect("read");
        assert!(n > 0, "closed early");
        buf.extend_from_slice(&chunk[..n]);
        got = 0;
        let mut at = 0;
        while let Some((_, n)) = sp::decode_answer(&buf[at..], Some(1)).expect("well-formed") {
            at += n;
            got += 1;
        }
    }
    send(&mut s, 3, &acquire(b"sess", HoldMode::Session, 0));
    let after = answers_until_eof(&mut s);
    assert!(
        !after.iter().any(|a| matches!(
            a,
            Answer::Reply {
                rid: 3,
                status: Status::Ok,
                ..
            }
        )),
        "a grant whose record was voided was answered: {after:?}"
    );
    srv.wait_log("event=wal_records_voided");
    srv.wait_log("event=session_end");
    srv.wait_log("event=compaction_done");
    // The voided grant is free; the lease, durable before its answer,
    // outlives the ended session.
    let mut t = TcpStream::connect(srv.lock_addr).expect("connect");
    t.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    send(
        &mut t,
        1,
        &Req::Hello {
            version: sp::VERSION,
            keepalive_ms: 0,
            auth: b"",
        },
    );
    send(&mut t, 2, &acquire(b"sess", HoldMode::Session, 0));
    send(&mut t, 3, &acquire(b"lease", HoldMode::Session, 0));
    let mut buf = Vec::new();
    let mut answers = Vec::new();
    while answers.len() < 3 {
        let mut chunk = [0u8; 256];
        let n = t.read(&mut chunk).expect("read");
        assert!(n > 0, "closed early");
        buf.extend_from_slice(&chunk[..n]);
        while let Some((a, n)) = sp::decode_answer(&buf, Some(1)).expect("well-formed") {
            buf.drain(..n);
            answers.push(a);
        }
    }
    let status = |rid| {
        answers
            .iter()
            .find_map(|a| match a {
                Answer::Reply { rid: r, status, .. } if *r == rid => Some(*status),
                _ => None,
            })
            .expect("answered")
    };
    assert_eq!(status(2), Status::Ok, "the undone grant is free again");
    assert_eq!(status(3), Status::Busy, "the durable lease is still held");
}
