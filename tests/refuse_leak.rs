//! A connection refused past `--max-connections` (or the admin port's
//! budget) is answered `-` and closed, whatever the client did meanwhile.
//!
//! The refusal used to be a send linked to a close: when the client reset
//! first, the send failed, the kernel cancelled the linked close, and the
//! descriptor stayed open. Overload (the only time refusals happen) then
//! walked the server into RLIMIT_NOFILE. Here hostile clients connect past
//! both limits with `SO_LINGER 0` and close at once (an RST), on 1, 2 and 4
//! shards, and the server's descriptor count must come back to what it was.
//!
//! The same count for a connection the server ends while its last send can
//! never complete: a session client that never reads its answers.

mod common;

use common::*;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Connects and closes with an RST (SO_LINGER 0) without reading anything.
fn connect_and_reset(addr: SocketAddr) {
    let s = TcpStream::connect(addr).expect("connect");
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `s` is an open socket owned here; the option value is a
    // plain struct that lives across the call. A wrong size would make
    // setsockopt fail, which the assert reports.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_LINGER");
    drop(s);
}

fn no_leak_with(threads: &str) {
    let srv = Server::start(&[
        "--max-connections",
        "4",
        "--admin-connections",
        "2",
        "--idle-timeout-ms",
        "0",
        "--threads",
        threads,
        "--metrics-bind",
        "127.0.0.1:0",
    ]);
    // Fill both budgets with silent connections, then check that a further
    // one is really refused on each port.
    let _lock: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(srv.lock_addr).expect("connect"))
        .collect();
    let _admin: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(srv.admin_addr).expect("connect"))
        .collect();
    // Accepted by the server (not only by the kernel's listen queue), so
    // that the probes below are the ones over the limit.
    wait_metric(srv.metrics(), "ringlock_open_connections", 6.0);
    let refused_before = wait_refusals(&srv, 0.0);
    for addr in [srv.lock_addr, srv.admin_addr] {
        let mut c = Conn::connect(addr);
        assert_eq!(c.read_byte_or_eof(), Some(b'-'), "{addr} is over its limit");
    }
    let refused = wait_refusals(&srv, refused_before + 2.0);
    let baseline = wait_fds(&srv, None);

    const HOSTILE: usize = 300;
    for _ in 0..HOSTILE {
        connect_and_reset(srv.lock_addr);
        connect_and_reset(srv.admin_addr);
    }
    // Every one of them was refused (none took a slot) ...
    wait_refusals(&srv, refused + 2.0 * HOSTILE as f64);
    // ... and every refused socket was closed.
    let after = wait_fds(&srv, Some(baseline));
    assert_eq!(
        after,
        baseline,
        "{threads} shard(s): descriptors after {} refused resets",
        2 * HOSTILE
    );
    // The server still serves (the held budget is intact).
    drop(_lock);
    let mut ok = None;
    for _ in 0..200 {
        let mut c = Conn::connect(srv.lock_addr);
        c.send(&frame(5, b"k", Some(b"s")));
        match c.read_byte_or_eof() {
            Some(b'+') => {
                ok = Some(());
                break;
            }
            // The freed slots are given back as the server sees the EOFs.
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    assert!(ok.is_some(), "{threads} shard(s): served again");
}

/// Waits until the refusal counter reaches `want` (bounded), returns it.
fn wait_refusals(srv: &Server, want: f64) -> f64 {
    let m = srv.metrics();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = metric(m, "ringlock_connections_refused_total");
        if v >= want || Instant::now() > deadline {
            assert!(v >= want, "refusals: {v} of {want}");
            return v;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The server's descriptor count once it stops changing (or reaches
/// `want`), bounded in time.
fn wait_fds(srv: &Server, want: Option<usize>) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = srv.open_fds();
    let mut stable = 0;
    loop {
        std::thread::sleep(Duration::from_millis(10));
        let n = srv.open_fds();
        if Some(n) == want || Instant::now() > deadline {
            return n;
        }
        stable = if n == last { stable + 1 } else { 0 };
        last = n;
        if want.is_none() && stable >= 20 {
            return n;
        }
    }
}

#[test]
fn refused_connections_that_reset_leave_no_descriptor_one_shard() {
    no_leak_with("1");
}

#[test]
fn refused_connections_that_reset_leave_no_descriptor_two_shards() {
    no_leak_with("2");
}

#[test]
fn refused_connections_that_reset_leave_no_descriptor_four_shards() {
    no_leak_with("4");
}

/// A session client that sends and never reads: the server ends the
/// session once its unread answers pass the limit, and must then close the
/// socket, although its last send can never complete (the peer's window is
/// full). The close used to wait for that send, so the descriptor stayed
/// open for as long as the client kept the connection.
fn unread_session_is_closed_with(threads: &str) {
    use ringlock::protocol::session::{self as sp, Req};
    use std::io::{ErrorKind, Write};
    let srv = Server::start(&[
        "--idle-timeout-ms",
        "0",
        "--threads",
        threads,
        "--metrics-bind",
        "127.0.0.1:0",
    ]);
    let baseline = wait_fds(&srv, None);
    let ended_before = metric(srv.metrics(), "ringlock_sessions_ended_total");
    let mut s = TcpStream::connect(srv.lock_addr).expect("connect");
    s.set_write_timeout(Some(Duration::from_secs(2)))
        .expect("write timeout");
    let mut hello = Vec::new();
    sp::encode(
        1,
        &Req::Hello {
            version: sp::VERSION,
            keepalive_ms: 0,
            auth: b"",
        },
        &mut hello,
    );
    s.write_all(&hello).expect("hello");
    let mut pings = Vec::new();
    for rid in 2..1002u32 {
        sp::encode(rid, &Req::Ping, &mut pings);
    }
    // Pings until the server stops taking them: it ended the session (a
    // reset, or a write that times out once it no longer reads). Bounded:
    // 20 000 batches are ~20 M answers, far past any socket buffer.
    let mut batches = 0;
    while batches < 20_000 {
        match s.write_all(&pings) {
            Ok(()) => batches += 1,
            Err(e) => {
                assert!(
                    matches!(
                        e.kind(),
                        ErrorKind::WouldBlock
                            | ErrorKind::TimedOut
                            | ErrorKind::ConnectionReset
                            | ErrorKind::BrokenPipe
                    ),
                    "{e}"
                );
                break;
            }
        }
    }
    assert!(batches < 20_000, "the server never stopped taking pings");
    // The session ended for not reading ...
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(srv.metrics(), "ringlock_sessions_ended_total") < ended_before + 1.0 {
        assert!(Instant::now() < deadline, "the session never ended");
        std::thread::sleep(Duration::from_millis(5));
    }
    // ... and its socket is closed while the client still holds its end
    // open and unread.
    let after = wait_fds(&srv, Some(baseline));
    assert_eq!(
        after, baseline,
        "{threads} shard(s): descriptors after the unread session ended"
    );
    drop(s);
}

#[test]
fn a_session_that_does_not_read_its_answers_is_closed_one_shard() {
    unread_session_is_closed_with("1");
}

#[test]
fn a_session_that_does_not_read_its_answers_is_closed_two_shards() {
    unread_session_is_closed_with("2");
}
