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
