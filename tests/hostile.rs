//! Hostile or careless clients must not deny service to everyone else:
//! silent connections time out (a queued waiter is not idle), the admin
//! port keeps its own connection budget during a flood, and a burst of
//! connections after a stall waits in the listen queue instead of being
//! dropped into SYN retransmits.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

use common::{frame, keys, once, Conn, Server};

#[test]
fn silent_connections_are_closed_after_the_idle_timeout_but_waiters_are_not() {
    let srv = Server::start(&["--idle-timeout-ms", "300"]);
    let mut holder = srv.connect();
    assert_eq!(holder.lock(b"k", b"a"), b'+');
    // A queued waiter on a persistent connection, connected first.
    let mut waiter = srv.connect();
    waiter.send(&frame(1, b"k", Some(b"b")));
    // Silent connections, on both ports, opened after it.
    let mut silent: Vec<TcpStream> = (0..4)
        .map(|i| {
            let addr = if i % 2 == 0 {
                srv.lock_addr
            } else {
                srv.admin_addr
            };
            let s = TcpStream::connect(addr).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(20)))
                .expect("timeout");
            s
        })
        .collect();
    for s in &mut silent {
        let mut b = [0u8; 1];
        assert_eq!(s.read(&mut b).expect("EOF, not a timeout"), 0);
    }
    // The holder's connection was idle too (a Locking-Center hold does not
    // live in its connection): closed, the key still held.
    assert_eq!(holder.read_byte_or_eof(), None);
    assert_eq!(keys(srv.admin_addr).len(), 1);
    // The waiter's deadline came first, yet it is still queued.
    assert_eq!(once(srv.lock_addr, &frame(2, b"k", None)), b'+');
    assert_eq!(waiter.read_byte(), b'+');
}

#[test]
fn the_admin_port_answers_during_a_flood_of_silent_lock_connections() {
    let srv = Server::start(&["--max-connections", "20", "--idle-timeout-ms", "0"]);
    assert_eq!(once(srv.lock_addr, &frame(1, b"held", Some(b"x"))), b'+');
    let _flood: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(srv.lock_addr).expect("connect"))
        .collect();
    // The 21st lock-port connection is refused ...
    let mut refused = Conn::connect(srv.lock_addr);
    assert_eq!(refused.read_byte_or_eof(), Some(b'-'));
    // ... while the operator still gets in.
    let k = keys(srv.admin_addr);
    assert_eq!(k.len(), 1);
    assert_eq!(k[0].key, b"held");
}

/// `ListenOverflows + ListenDrops` of this network namespace: a SYN or an
/// accepted handshake dropped because a listen queue was full.
fn listen_drops() -> u64 {
    let text = std::fs::read_to_string("/proc/net/netstat").expect("/proc/net/netstat");
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let names: Vec<&str> = lines
        .next()
        .expect("TcpExt names")
        .split_whitespace()
        .collect();
    let values: Vec<&str> = lines
        .next()
        .expect("TcpExt values")
        .split_whitespace()
        .collect();
    names
        .iter()
        .zip(values)
        .filter(|(n, _)| **n == "ListenOverflows" || **n == "ListenDrops")
        .map(|(_, v)| v.parse::<u64>().expect("counter"))
        .sum()
}

#[test]
fn a_burst_of_300_connections_after_a_stall_waits_in_the_listen_queue() {
    let mut srv = Server::start(&[]);
    let before = listen_drops();
    let pid = srv.pid() as i32;
    // SAFETY: signals to the child we started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let addr = srv.lock_addr;
    let conns: Vec<std::thread::JoinHandle<u8>> = (0..300)
        .map(|i| {
            std::thread::spawn(move || {
                // Completes in the kernel while the server is stopped, if
                // the listen queue has room.
                let mut c = Conn::connect(addr);
                c.send(&frame(5, format!("burst-{i}").as_bytes(), Some(b"")));
                c.read_byte()
            })
        })
        .collect();
    // Every handshake is done (or dropped) before the server runs again:
    // wait until the threads have connected, by polling the counter of
    // established connections to the port.
    let port = addr.port();
    let established = || {
        std::fs::read_to_string("/proc/net/tcp")
            .expect("/proc/net/tcp")
            .lines()
            .skip(1)
            .filter(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                // local address ends with the port, state 01 = ESTABLISHED
                f.len() > 3 && f[1].ends_with(&format!(":{port:04X}")) && f[3] == "01"
            })
            .count()
    };
    for _ in 0..2000 {
        if established() >= 300 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    for c in conns {
        assert_eq!(c.join().expect("client thread"), b'+');
    }
    assert_eq!(
        listen_drops() - before,
        0,
        "handshakes were dropped: the listen backlog is too small"
    );
    srv.kill9();
}

fn keyx(admin: std::net::SocketAddr) -> Vec<ringlock::protocol::admin::KeyInfo> {
    use std::io::Write;
    let mut s = TcpStream::connect(admin).expect("admin");
    s.write_all(b"KEYX").expect("send");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some((k, _)) = ringlock::protocol::admin::decode_keyx(&buf).expect("KEYX answer") {
            return k;
        }
        let n = s.read(&mut chunk).expect("read");
        assert!(n > 0, "closed before the answer");
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn rstk(admin: std::net::SocketAddr, entries: &[(&[u8], u64)]) -> Vec<u8> {
    use std::io::Write;
    let mut s = TcpStream::connect(admin).expect("admin");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut req = Vec::new();
    ringlock::protocol::admin::encode_rstk(entries, &mut req);
    s.write_all(&req).expect("send");
    let mut out = vec![0u8; entries.len() + 1];
    s.read_exact(&mut out).expect("RSTK answer");
    out
}

#[test]
fn a_compare_and_reset_against_a_holder_that_changed_does_nothing() {
    let srv = Server::start(&[]);
    assert_eq!(once(srv.lock_addr, &frame(1, b"k", Some(b"first"))), b'+');
    let seen = keyx(srv.admin_addr);
    let t1 = seen[0].token;
    let mut waiter = srv.connect();
    waiter.send(&frame(1, b"k", Some(b"second")));
    // A token the holder does not have: nothing happens (`#`).
    assert_eq!(
        rstk(srv.admin_addr, &[(b"k", t1 + 1), (b"free", 1)]),
        b"##+"
    );
    assert_eq!(keyx(srv.admin_addr)[0].token, t1);
    // The holder the operator saw: reset, the waiter is granted.
    assert_eq!(rstk(srv.admin_addr, &[(b"k", t1)]), b"++");
    assert_eq!(waiter.read_byte(), b'+');
    let now = keyx(srv.admin_addr);
    assert_eq!(now[0].source, b"second");
    assert!(now[0].token > t1);
    // The operator's stale view cannot reset the new holder.
    assert_eq!(rstk(srv.admin_addr, &[(b"k", t1)]), b"#+");
    assert_eq!(keyx(srv.admin_addr)[0].source, b"second");
}
