//! Proof that the event loop does not allocate per request in steady state:
//! a counting global allocator counts only allocations made on the server
//! thread, while a client drives connection-per-request and persistent
//! traffic (lock, contended hand-off, try-lock, unlock) and session traffic
//! (acquire, busy, ping, release: each answer also counted in the metrics).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ringlock::protocol::session as sp;

struct Counting;
static SERVER_ALLOCS: AtomicU64 = AtomicU64::new(0);
thread_local!(static ON_SERVER: Cell<bool> = const { Cell::new(false) });

// SAFETY: forwards to the system allocator; only adds a counter.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ON_SERVER.with(|c| c.get()) {
            SERVER_ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if ON_SERVER.with(|c| c.get()) {
            SERVER_ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn req(s: &mut TcpStream, b: &[u8]) -> u8 {
    s.write_all(b).unwrap();
    let mut r = [0u8; 1];
    s.read_exact(&mut r).unwrap();
    r[0]
}

fn round(addr: std::net::SocketAddr, persistent: &mut TcpStream, waiter: &mut TcpStream, i: usize) {
    let key = [b'k', b'0' + (i % 10) as u8];
    let lock = [1u8, 2, key[0], key[1], 1, b's'];
    let unlock = [2u8, 2, key[0], key[1]];
    // Connection per request.
    let mut c = TcpStream::connect(addr).unwrap();
    assert_eq!(req(&mut c, &lock), b'+');
    drop(c);
    // A contended hand-off to a queued waiter on a persistent connection.
    waiter.write_all(&lock).unwrap();
    assert_eq!(req(persistent, &[5u8, 2, key[0], key[1], 0]), b'#');
    assert_eq!(req(persistent, &unlock), b'+');
    let mut r = [0u8; 1];
    waiter.read_exact(&mut r).unwrap();
    assert_eq!(r[0], b'+');
    assert_eq!(req(persistent, &unlock), b'+');
}

/// One session request and its Reply: (status byte, token).
fn sess_req(s: &mut TcpStream, r: &sp::Req<'_>, rid: u32) -> (u8, u64) {
    let mut b = Vec::with_capacity(sp::FRAME_MAX);
    sp::encode(rid, r, &mut b);
    s.write_all(&b).unwrap();
    let mut h = [0u8; sp::HEADER];
    s.read_exact(&mut h).unwrap();
    assert_eq!(u32::from_le_bytes([h[1], h[2], h[3], h[4]]), rid);
    let mut body = vec![0u8; u16::from_le_bytes([h[5], h[6]]) as usize];
    s.read_exact(&mut body).unwrap();
    let token = body
        .get(1..9)
        .map_or(0, |t| u64::from_le_bytes(t.try_into().unwrap()));
    (body[0], token)
}

fn session(addr: std::net::SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    let hello = sp::Req::Hello {
        version: sp::VERSION,
        keepalive_ms: 600_000,
        auth: b"",
    };
    assert_eq!(sess_req(&mut s, &hello, 0).0, sp::Status::Ok as u8);
    s
}

/// Session traffic: a acquires, b is busy, a pings and releases.
fn session_round(a: &mut TcpStream, b: &mut TcpStream, i: usize) {
    let key = [b'k', b'0' + (i % 10) as u8];
    let acquire = sp::Req::Acquire {
        hold: sp::HoldMode::Session,
        ttl_ms: 0,
        wait_ms: 0,
        key: &key,
        source: b"s",
        access: sp::Access::Exclusive,
    };
    let rid = i as u32 * 4 + 1;
    let (status, token) = sess_req(a, &acquire, rid);
    assert_eq!(status, sp::Status::Ok as u8);
    assert_eq!(sess_req(b, &acquire, rid).0, sp::Status::Busy as u8);
    assert_eq!(sess_req(a, &sp::Req::Ping, rid + 1).0, sp::Status::Ok as u8);
    let release = sp::Req::Release { token, key: &key };
    assert_eq!(sess_req(a, &release, rid + 2).0, sp::Status::Ok as u8);
}

fn persistent(addr: std::net::SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    assert_eq!(req(&mut s, &[6u8]), b'+', "Persist refused");
    s
}

/// Runs 200 warm-up rounds, then counts the server thread's allocations
/// over 2000 more.
fn allocations_in_steady_state(cfg: ringlock::config::Config) -> (u64, u64) {
    let metrics = Arc::new(ringlock::metrics::Metrics::new());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let server = ringlock::driver::Server::bind(cfg, metrics).expect("bind");
        tx.send(server.lock_addr()).unwrap();
        ON_SERVER.with(|c| c.set(true));
        server.run().expect("run");
    });
    let addr = rx.recv().unwrap();
    let mut persistent = persistent(addr);
    let mut waiter = persistent_conn(addr);
    let (mut sa, mut sb) = (session(addr), session(addr));
    for i in 0..200 {
        round(addr, &mut persistent, &mut waiter, i);
        session_round(&mut sa, &mut sb, i);
    }
    let before = SERVER_ALLOCS.load(Ordering::Relaxed);
    for i in 0..2000 {
        round(addr, &mut persistent, &mut waiter, i);
        session_round(&mut sa, &mut sb, i);
    }
    let after = SERVER_ALLOCS.load(Ordering::Relaxed);
    (before, after - before)
}

fn persistent_conn(addr: std::net::SocketAddr) -> TcpStream {
    persistent(addr)
}

fn config() -> ringlock::config::Config {
    let mut cfg = ringlock::config::Config::new("127.0.0.1:0".parse().unwrap());
    cfg.admin_bind = "127.0.0.1:0".parse().unwrap();
    cfg.max_connections = 64;
    cfg.threads = 1;
    cfg
}

// One test function: both servers count into the same per-thread flag, and
// the counter is global, so the two modes run one after the other.
#[test]
fn steady_state_requests_do_not_allocate_on_the_server_thread() {
    let (before, during) = allocations_in_steady_state(config());
    assert_eq!(
        during, 0,
        "in memory: the server thread allocated {during} times in 2000 rounds"
    );
    assert!(
        before > 0,
        "the counter sees the server thread's start-up allocations"
    );

    let dir = std::env::temp_dir().join(format!("ringlock-noalloc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg = config();
    cfg.data_path = Some(dir.join("locks.wal"));
    // Compaction allocates its snapshot once per compaction, not per
    // request: keep it out of the measured window.
    cfg.compact_floor_bytes = 1 << 40;
    let (_, during) = allocations_in_steady_state(cfg);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        during, 0,
        "durable: the server thread allocated {during} times in 2000 rounds"
    );
}
