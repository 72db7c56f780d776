//! Several requests in one write, frames split at every byte, and requests
//! pipelined behind a queued Lock: every request is answered in order and
//! none is ever served from stale bytes (the one-key-two-owners bug came
//! from a receive buffer drained while the kernel was writing into it).

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn cat(frames: &[Vec<u8>]) -> Vec<u8> {
    frames.concat()
}

fn read_n(c: &mut Conn, n: usize) -> Vec<u8> {
    (0..n).map(|_| c.read_byte()).collect()
}

/// The reproduction: Lock+Unlock in one write, then another client takes
/// the key, then the first connection's next request must not replay the
/// stale Unlock.
#[test]
fn pipelined_frames_never_replay_stale_bytes() {
    let s = Server::start(&[]);
    let mut a = s.connect();
    a.send(&cat(&[frame(1, b"kx", Some(b"a")), frame(2, b"kx", None)]));
    assert_eq!(read_n(&mut a, 2), b"++");
    let mut b = s.connect();
    assert_eq!(b.lock(b"kx", b"b"), b'+');
    assert_eq!(
        a.try_lock(b"ky", b"a"),
        b'+',
        "A's TryLock ky was not served"
    );
    assert_eq!(
        once(s.lock_addr, &frame(5, b"kx", Some(b"c"))),
        b'#',
        "kx handed to a second owner while B holds it"
    );
    let held = keys(s.admin_addr);
    let kx = held.iter().find(|k| k.key == b"kx").expect("kx held");
    assert_eq!(kx.source, b"b");
    assert!(held.iter().any(|k| k.key == b"ky" && k.source == b"a"));
}

#[test]
fn pipelined_frames_three_in_one_write_answer_in_order() {
    let s = Server::start(&[]);
    let mut other = s.connect();
    assert_eq!(other.lock(b"taken", b"o"), b'+');
    let mut a = s.connect();
    a.send(&cat(&[
        frame(5, b"p1", Some(b"a")),
        frame(5, b"taken", Some(b"a")),
        frame(2, b"p1", None),
    ]));
    assert_eq!(read_n(&mut a, 3), b"+#+");
    // The third frame released p1; the second never took `taken`.
    assert_eq!(once(s.lock_addr, &frame(5, b"p1", Some(b"z"))), b'+');
    let held = keys(s.admin_addr);
    let t = held.iter().find(|k| k.key == b"taken").expect("taken held");
    assert_eq!(t.source, b"o");
}

#[test]
fn pipelined_frames_split_byte_by_byte_then_a_pipelined_one() {
    let s = Server::start(&[]);
    let mut a = s.connect();
    let first = frame(1, b"split-key", Some(b"src"));
    for b in &first {
        a.send(std::slice::from_ref(b));
        // Each byte is its own segment: nodelay is set by the harness.
        std::thread::yield_now();
    }
    a.send(&cat(&[
        frame(5, b"split-key", Some(b"src")),
        frame(2, b"split-key", None),
    ]));
    assert_eq!(read_n(&mut a, 3), b"+#+");
    assert!(keys(s.admin_addr).is_empty());
}

#[test]
fn pipelined_frames_behind_a_queued_lock_wait_their_turn() {
    let s = Server::start(&[]);
    let mut holder = s.connect();
    assert_eq!(holder.lock(b"q", b"h"), b'+');
    let mut w = s.connect();
    // Lock (queues), then a TryLock and an Unlock of another key.
    w.send(&cat(&[
        frame(1, b"q", Some(b"w")),
        frame(5, b"q2", Some(b"w")),
        frame(2, b"q2", None),
    ]));
    assert!(
        w.silent_for(100),
        "a request behind a queued Lock was answered first"
    );
    // Nothing behind the queued Lock took effect yet.
    assert_eq!(once(s.lock_addr, &frame(5, b"q2", Some(b"x"))), b'+');
    assert_eq!(once(s.lock_addr, &frame(2, b"q2", None)), b'+');
    assert_eq!(holder.unlock(b"q"), b'+');
    assert_eq!(read_n(&mut w, 3), b"+++");
    let held = keys(s.admin_addr);
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].key, b"q");
    assert_eq!(held[0].source, b"w");
}

fn admin_frame(cmd: &[u8; 4], names: &[&[u8]]) -> Vec<u8> {
    let mut b = cmd.to_vec();
    b.extend_from_slice(&(names.len() as u32).to_le_bytes());
    for n in names {
        b.push(n.len() as u8);
        b.extend_from_slice(n);
    }
    b
}

/// Reads one KEYS answer and returns its count.
fn read_keys_count(s: &mut TcpStream) -> u32 {
    let mut n = [0u8; 4];
    s.read_exact(&mut n).expect("KEYS count");
    let count = u32::from_le_bytes(n);
    for _ in 0..count {
        for _ in 0..3 {
            let mut l = [0u8; 1];
            s.read_exact(&mut l).expect("len");
            let mut v = vec![0u8; l[0] as usize];
            s.read_exact(&mut v).expect("field");
        }
        let mut t = [0u8; 8];
        s.read_exact(&mut t).expect("acquired");
    }
    count
}

#[test]
fn pipelined_admin_commands_answer_in_order() {
    let s = Server::start(&[]);
    let mut h = s.connect();
    assert_eq!(h.lock(b"ak", b"h"), b'+');
    let mut adm = TcpStream::connect(s.admin_addr).expect("admin");
    adm.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut req = b"KEYS".to_vec();
    req.extend_from_slice(&admin_frame(b"RSET", &[b"ak"]));
    req.extend_from_slice(b"KEYS");
    adm.write_all(&req).expect("write");
    assert_eq!(read_keys_count(&mut adm), 1);
    let mut rset = [0u8; 2];
    adm.read_exact(&mut rset).expect("RSET answer");
    assert_eq!(&rset, b"++");
    assert_eq!(
        read_keys_count(&mut adm),
        0,
        "stale KEYS bytes or RSET not applied"
    );
    // A command split byte by byte, then a pipelined one.
    let mut req = admin_frame(b"RSET", &[b"none"]);
    req.extend_from_slice(b"KEYS");
    for b in &req[..9] {
        adm.write_all(std::slice::from_ref(b)).expect("write");
        std::thread::yield_now();
    }
    adm.write_all(&req[9..]).expect("write");
    let mut rset = [0u8; 2];
    adm.read_exact(&mut rset).expect("RSET answer");
    assert_eq!(&rset, b"++");
    assert_eq!(read_keys_count(&mut adm), 0);
}

// ------------------------------------------------ one-shot and half-close

/// A Locking-Center connection carries one request: the server answers and
/// closes first (the FIN follows the answer).
#[test]
fn one_shot_connections_are_closed_by_the_server_after_the_answer() {
    let s = Server::start(&[]);
    let mut c = s.connect_oneshot();
    c.send(&frame(5, b"os", Some(b"a")));
    assert_eq!(c.read_byte_or_eof(), Some(b'+'));
    assert_eq!(
        c.read_byte_or_eof(),
        None,
        "the server closes after the answer"
    );
    // A second request on a one-shot connection is not served: `-`, then
    // the FIN. The first one took effect, the second did not.
    let mut c = s.connect_oneshot();
    c.send(&cat(&[frame(2, b"os", None), frame(5, b"os", Some(b"b"))]));
    assert_eq!(c.read_byte_or_eof(), Some(b'+'));
    assert_eq!(
        c.read_byte_or_eof(),
        Some(b'-'),
        "the extra request is refused"
    );
    assert_eq!(c.read_byte_or_eof(), None);
    assert!(
        keys(s.admin_addr).is_empty(),
        "the refused TryLock took nothing"
    );
}

/// Frames followed by a half-close: every received frame is executed and
/// answered in order; a Lock that would have to wait is withdrawn (`-` in
/// its place); then the server closes.
#[test]
fn half_close_after_pipelined_frames_answers_every_frame() {
    let s = Server::start(&[]);
    let mut other = s.connect();
    assert_eq!(other.lock(b"busy", b"o"), b'+');
    let mut c = s.connect();
    c.send(&cat(&[
        frame(5, b"h1", Some(b"c")),
        frame(1, b"busy", Some(b"c")),
        frame(1, b"h2", Some(b"c")),
        frame(2, b"h1", None),
    ]));
    c.half_close();
    assert_eq!(read_n(&mut c, 4), b"+-++");
    assert_eq!(c.read_byte_or_eof(), None, "closed after the last answer");
    let held = keys(s.admin_addr);
    let names: Vec<&[u8]> = held.iter().map(|k| k.key.as_slice()).collect();
    assert_eq!(names, vec![&b"busy"[..], &b"h2"[..]]);
    assert_eq!(held[0].source, b"o", "the withdrawn Lock never took busy");
    assert_eq!(s.connect().unlock(b"busy"), b'+');
    assert!(
        keys(s.admin_addr).iter().all(|k| k.key != b"busy"),
        "no ghost waiter"
    );
}

/// A half-close in the middle of a frame: the whole frames before it are
/// served, the partial one is answered `-`.
#[test]
fn half_close_inside_a_frame_serves_the_whole_ones_then_refuses() {
    let s = Server::start(&[]);
    let mut c = s.connect();
    let mut bytes = frame(5, b"w1", Some(b"c"));
    bytes.extend_from_slice(&frame(5, b"w2", Some(b"c"))[..3]);
    c.send(&bytes);
    c.half_close();
    assert_eq!(read_n(&mut c, 2), b"+-");
    assert_eq!(c.read_byte_or_eof(), None);
    let held = keys(s.admin_addr);
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].key, b"w1");
}

/// After `kill -9` an immediate restart on the same ports succeeds (the
/// dead server's io_uring may hold its listener for a while).
#[test]
fn restart_right_after_kill9_on_the_same_ports_succeeds() {
    let dir = TempDir::new("restart");
    let log = dir.path("wal.log");
    let log_arg = log.to_str().expect("utf-8 temp path").to_string();
    let mut s = Server::start(&["--data-path", &log_arg]);
    let (lock, admin) = (s.lock_addr.to_string(), s.admin_addr.to_string());
    let mut c = s.connect();
    assert_eq!(c.lock(b"survives", b"a"), b'+');
    for round in 0..5 {
        s.kill9();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ringlockd"));
        cmd.args([
            "--bind",
            &lock,
            "--admin-bind",
            &admin,
            "--data-path",
            &log_arg,
        ]);
        s = Server::spawn(cmd, &[]).unwrap_or_else(|e| panic!("restart {round} failed: {e}"));
        assert_eq!(s.lock_addr.to_string(), lock);
        // Serve traffic so the next kill hits a busy ring.
        let mut c = s.connect();
        assert_eq!(c.try_lock(b"survives", b"b"), b'#', "round {round}");
        assert_eq!(c.try_lock(b"other", b"b"), b'+');
        assert_eq!(c.unlock(b"other"), b'+');
    }
}
