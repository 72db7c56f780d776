//! The fault proxy (tests/common/fault_proxy.rs) the cluster tests put on
//! Raft peer links, checked against plain loopback servers: an echo server,
//! and a bare listener whose accepted end the test holds itself (to see
//! each direction separately).

mod common;

use common::fault_proxy::{poll_until, Dir, FaultProxy, Mode};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Bound on every wait that should succeed; it only turns a hang into a
/// failure.
const BOUND: Duration = Duration::from_secs(10);

/// How long a direction must stay silent to count as delivering nothing.
const QUIET_MS: u64 = 300;

struct Echo {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
}

/// An echo server on 127.0.0.1: writes back what it reads, half-closes on
/// end-of-stream. Its threads end with the test process.
fn echo() -> Echo {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind echo");
    let addr = l.local_addr().expect("echo addr");
    let accepted = Arc::new(AtomicU64::new(0));
    let received = Arc::new(AtomicU64::new(0));
    let (a, r) = (accepted.clone(), received.clone());
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            a.fetch_add(1, Ordering::SeqCst);
            let r = r.clone();
            thread::spawn(move || {
                let mut buf = [0u8; 8192];
                loop {
                    let n = match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    r.fetch_add(n as u64, Ordering::SeqCst);
                    if s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = s.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    Echo {
        addr,
        accepted,
        received,
    }
}

/// A listener whose accepted connections the test holds: the upstream end
/// of a proxied link.
struct Upstream(TcpListener);

impl Upstream {
    fn new() -> Upstream {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
        l.set_nonblocking(true).expect("nonblocking");
        Upstream(l)
    }

    fn addr(&self) -> SocketAddr {
        self.0.local_addr().expect("upstream addr")
    }

    /// The next connection the proxy opens to us, if one comes within `d`.
    fn accept_within(&self, d: Duration) -> Option<TcpStream> {
        let end = Instant::now() + d;
        loop {
            match self.0.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).expect("blocking");
                    s.set_read_timeout(Some(BOUND)).expect("timeout");
                    return Some(s);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() > end {
                        return None;
                    }
                    thread::sleep(Duration::from_millis(2));
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
    }

    fn accept(&self) -> TcpStream {
        self.accept_within(BOUND)
            .expect("the proxy connects upstream")
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect to the proxy");
    s.set_nodelay(true).expect("nodelay");
    s.set_read_timeout(Some(BOUND)).expect("timeout");
    s
}

fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    s.read_exact(&mut v).expect("read the expected bytes");
    v
}

fn round_trip(s: &mut TcpStream, msg: &[u8]) {
    s.write_all(msg).expect("write");
    assert_eq!(read_n(s, msg.len()), msg, "echoed back");
}

/// True if nothing arrives within `ms`; panics if the connection ends
/// (silence must come from a held link, not a closed one).
fn silent_for(s: &mut TcpStream, ms: u64) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(ms)))
        .expect("timeout");
    let mut b = [0u8; 64];
    let r = loop {
        match s.read(&mut b) {
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            r => break r,
        }
    };
    s.set_read_timeout(Some(BOUND)).expect("timeout");
    match r {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => true,
        Ok(0) => panic!("the connection closed; expected it held open"),
        Ok(n) => {
            eprintln!("received {:?}", &b[..n]);
            false
        }
        Err(e) => panic!("read: {e}"),
    }
}

/// Reads until the connection ends (EOF or reset) and returns what came
/// before the end; panics if it does not end within the bound.
fn read_until_closed(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) => {
                return got
            }
            Err(e) => panic!("connection did not end within {BOUND:?}: {e}"),
        }
    }
}

#[test]
fn pass_delivers_both_ways_and_counts() {
    let e = echo();
    let p = FaultProxy::start(e.addr);
    let mut c = connect(p.addr());
    round_trip(&mut c, b"hello");
    // More than one socket buffer's worth, written from a second thread so
    // the echo can answer while we still write.
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut w = c.try_clone().expect("clone");
    let sent = data.clone();
    let writer = thread::spawn(move || w.write_all(&sent).expect("write"));
    assert_eq!(read_n(&mut c, data.len()), data, "every byte, in order");
    writer.join().expect("writer");
    let total = 5 + data.len() as u64;
    poll_until("forward count", BOUND, || {
        p.bytes_forwarded(Dir::Forward) == total
    });
    poll_until("back count", BOUND, || {
        p.bytes_forwarded(Dir::Back) == total
    });
    assert_eq!(p.bytes_forwarded(Dir::Both), 2 * total);
    assert_eq!(e.received.load(Ordering::SeqCst), total);
    assert_eq!(p.connections_accepted(), 1);
    assert_eq!(p.open_connections(), 1);

    // End-of-stream passes through: the echo half-closes back.
    c.shutdown(std::net::Shutdown::Write).expect("half-close");
    assert!(read_until_closed(&mut c).is_empty());
    poll_until("the link is gone", BOUND, || p.open_connections() == 0);
}

#[test]
fn delay_delays_each_direction_and_keeps_order() {
    let e = echo();
    let p = FaultProxy::start(e.addr);
    let d = Duration::from_millis(150);
    p.set_mode_both(Mode::Delay(d));
    let mut c = connect(p.addr());
    let t = Instant::now();
    round_trip(&mut c, b"ping");
    let rt = t.elapsed();
    assert!(rt >= 2 * d, "a round trip through two delays took {rt:?}");

    // Many small writes: order is kept across chunks.
    let mut want = Vec::new();
    for i in 0..50u8 {
        let chunk = [i; 3];
        c.write_all(&chunk).expect("write");
        want.extend_from_slice(&chunk);
    }
    assert_eq!(read_n(&mut c, want.len()), want);

    // One direction only.
    p.set_mode(Dir::Back, Mode::Pass);
    assert_eq!(p.modes(), (Mode::Delay(d), Mode::Pass));
    let t = Instant::now();
    round_trip(&mut c, b"one-way");
    let rt = t.elapsed();
    assert!(rt >= d, "a round trip through one delay took {rt:?}");
}

#[test]
fn blackhole_delivers_nothing_and_keeps_the_connection_open() {
    let e = echo();
    let p = FaultProxy::start(e.addr);
    let mut c = connect(p.addr());
    round_trip(&mut c, b"before");
    p.partition();
    c.write_all(b"held").expect("write while blackholed");
    poll_until("the proxy read the bytes", BOUND, || {
        p.bytes_blackholed(Dir::Forward) == 4
    });
    assert!(silent_for(&mut c, QUIET_MS), "nothing comes back");
    assert_eq!(
        e.received.load(Ordering::SeqCst),
        6,
        "the echo server never saw the held bytes"
    );
    // Still open: more writes succeed, and are held too.
    c.write_all(b"more").expect("write while blackholed");
    poll_until("held again", BOUND, || {
        p.bytes_blackholed(Dir::Forward) == 8
    });
    assert!(silent_for(&mut c, QUIET_MS));
    assert_eq!(p.open_connections(), 1);
    assert_eq!(p.bytes_forwarded(Dir::Forward), 6);
}

#[test]
fn heal_discards_what_was_held_and_resets_then_new_connections_work() {
    let u = Upstream::new();
    let p = FaultProxy::start(u.addr());
    let mut c = connect(p.addr());
    let mut s = u.accept();
    c.write_all(b"up").expect("write");
    assert_eq!(read_n(&mut s, 2), b"up");
    p.partition();
    c.write_all(b"lost-forward").expect("write");
    s.write_all(b"lost-back").expect("write");
    poll_until("both held", BOUND, || {
        p.bytes_blackholed(Dir::Forward) == 12 && p.bytes_blackholed(Dir::Back) == 9
    });
    p.heal();
    assert_eq!(p.modes(), (Mode::Pass, Mode::Pass));
    assert!(
        read_until_closed(&mut s).is_empty(),
        "the upstream's end was reset without the held bytes"
    );
    assert!(
        read_until_closed(&mut c).is_empty(),
        "the client's end was reset without the held bytes"
    );
    poll_until("the link is gone", BOUND, || p.open_connections() == 0);

    let mut c = connect(p.addr());
    let mut s = u.accept();
    c.write_all(b"again").expect("write");
    assert_eq!(read_n(&mut s, 5), b"again");
    s.write_all(b"back").expect("write");
    assert_eq!(read_n(&mut c, 4), b"back");
    assert_eq!(p.connections_accepted(), 2);
}

#[test]
fn one_way_blackhole_passes_the_other_direction() {
    let u = Upstream::new();
    let p = FaultProxy::start(u.addr());

    p.set_mode(Dir::Forward, Mode::Blackhole);
    let mut c = connect(p.addr());
    let mut s = u.accept();
    c.write_all(b"to-upstream").expect("write");
    poll_until("held forward", BOUND, || {
        p.bytes_blackholed(Dir::Forward) == 11
    });
    assert!(silent_for(&mut s, QUIET_MS), "forward is blackholed");
    s.write_all(b"to-client").expect("write");
    assert_eq!(read_n(&mut c, 9), b"to-client", "back still passes");

    // Leaving the blackhole resets; then the other way round.
    p.set_mode(Dir::Forward, Mode::Pass);
    assert!(read_until_closed(&mut c).is_empty());
    assert!(read_until_closed(&mut s).is_empty());
    p.set_mode(Dir::Back, Mode::Blackhole);
    let mut c = connect(p.addr());
    let mut s = u.accept();
    s.write_all(b"to-client").expect("write");
    poll_until("held back", BOUND, || p.bytes_blackholed(Dir::Back) == 9);
    assert!(silent_for(&mut c, QUIET_MS), "back is blackholed");
    c.write_all(b"to-upstream").expect("write");
    assert_eq!(read_n(&mut s, 11), b"to-upstream", "forward still passes");
}

#[test]
fn a_full_partition_does_not_dial_the_upstream() {
    let u = Upstream::new();
    let p = FaultProxy::start(u.addr());
    p.partition();
    let mut c = connect(p.addr());
    poll_until("accepted", BOUND, || p.connections_accepted() == 1);
    assert!(u.accept_within(Duration::from_millis(QUIET_MS)).is_none());
    assert!(silent_for(&mut c, QUIET_MS), "held open");
    p.heal();
    assert!(read_until_closed(&mut c).is_empty(), "reset by the heal");
    let mut c = connect(p.addr());
    let mut s = u.accept();
    c.write_all(b"x").expect("write");
    assert_eq!(read_n(&mut s, 1), b"x");
}

#[test]
fn drop_discards_bytes_but_keeps_the_connection() {
    let u = Upstream::new();
    let p = FaultProxy::start(u.addr());
    let mut c = connect(p.addr());
    let mut s = u.accept();
    p.set_mode(Dir::Forward, Mode::Drop);
    c.write_all(b"gone").expect("write");
    poll_until("dropped", BOUND, || p.bytes_dropped(Dir::Forward) == 4);
    assert!(silent_for(&mut s, QUIET_MS));
    p.set_mode(Dir::Forward, Mode::Pass);
    c.write_all(b"kept").expect("write");
    assert_eq!(
        read_n(&mut s, 4),
        b"kept",
        "the stream resumes, minus a hole"
    );
    // The counter moves just after the write that delivered the bytes.
    poll_until("only the kept bytes counted", BOUND, || {
        p.bytes_forwarded(Dir::Forward) == 4
    });
    assert_eq!(p.bytes_dropped(Dir::Forward), 4);
}

#[test]
fn refuse_closes_new_connections_at_once() {
    let e = echo();
    let p = FaultProxy::start(e.addr);
    let mut open = connect(p.addr());
    round_trip(&mut open, b"open");
    p.refuse(true);
    let mut c = connect(p.addr());
    assert!(
        read_until_closed(&mut c).is_empty(),
        "refused: closed at once"
    );
    assert_eq!(p.connections_refused(), 1);
    assert_eq!(p.connections_accepted(), 1);
    assert_eq!(
        e.accepted.load(Ordering::SeqCst),
        1,
        "never reached upstream"
    );
    round_trip(&mut open, b"untouched");
    p.refuse(false);
    let mut c = connect(p.addr());
    round_trip(&mut c, b"accepted again");
    assert_eq!(p.connections_accepted(), 2);
}

#[test]
fn reset_all_closes_every_connection() {
    let e = echo();
    let p = FaultProxy::start(e.addr);
    let mut a = connect(p.addr());
    let mut b = connect(p.addr());
    round_trip(&mut a, b"a");
    round_trip(&mut b, b"b");
    assert_eq!(p.open_connections(), 2);
    p.reset_all();
    assert!(read_until_closed(&mut a).is_empty());
    assert!(read_until_closed(&mut b).is_empty());
    poll_until("links gone", BOUND, || p.open_connections() == 0);
    let mut c = connect(p.addr());
    round_trip(&mut c, b"after the reset");
    assert_eq!(p.connections_accepted(), 3);
}

#[test]
fn set_upstream_sends_new_connections_elsewhere() {
    let (ua, ub) = (Upstream::new(), Upstream::new());
    let p = FaultProxy::start(ua.addr());
    let mut c1 = connect(p.addr());
    let mut s1 = ua.accept();
    p.set_upstream(ub.addr());
    assert_eq!(p.upstream(), ub.addr());
    let mut c2 = connect(p.addr());
    let mut s2 = ub.accept();
    c2.write_all(b"to-b").expect("write");
    assert_eq!(read_n(&mut s2, 4), b"to-b");
    c1.write_all(b"to-a").expect("write");
    assert_eq!(read_n(&mut s1, 4), b"to-a", "the open link stays on A");
    assert!(ua.accept_within(Duration::from_millis(50)).is_none());
}

#[test]
fn a_down_upstream_closes_the_client() {
    let gone = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = gone.local_addr().expect("addr");
    drop(gone);
    let p = FaultProxy::start(addr);
    let mut c = connect(p.addr());
    assert!(read_until_closed(&mut c).is_empty());
    assert_eq!(p.upstream_failures(), 1);
    assert_eq!(p.connections_accepted(), 0);
}

#[test]
fn dropping_the_proxy_closes_connections_and_frees_its_port() {
    let e = echo();
    let p = FaultProxy::start(e.addr);
    let addr = p.addr();
    let mut c = connect(addr);
    round_trip(&mut c, b"alive");
    let mut held = connect(addr);
    p.set_mode(Dir::Forward, Mode::Blackhole);
    held.write_all(b"x").expect("write");
    poll_until("held", BOUND, || p.bytes_blackholed(Dir::Forward) == 1);
    drop(p);
    assert!(read_until_closed(&mut c).is_empty());
    assert!(read_until_closed(&mut held).is_empty());
    let end = Instant::now() + BOUND;
    let l = loop {
        match TcpListener::bind(addr) {
            Ok(l) => break l,
            Err(err) if Instant::now() < end => {
                eprintln!("bind {addr}: {err}; retrying");
                thread::sleep(Duration::from_millis(20));
            }
            Err(err) => panic!("the proxy's port {addr} was not released: {err}"),
        }
    };
    assert_eq!(l.local_addr().expect("addr"), addr);
}
