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
    // One shard: with several, which of 21 connections is the one refused
    // depends on the order the shards accept them.
    let srv = Server::start(&[
        "--max-connections",
        "20",
        "--idle-timeout-ms",
        "0",
        "--threads",
        "1",
    ]);
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
    // The listening line comes before the shard loops run: stop the server
    // only once every shard has started, so the burst meets running loops
    // stopped in mid-flight, not a start-up.
    let first = srv.wait_log("event=shard_start");
    let of: usize = first
        .split_whitespace()
        .find_map(|f| f.strip_prefix("of="))
        .and_then(|n| n.parse().ok())
        .expect("shard_start names the shard count");
    for _ in 1..of {
        srv.wait_log("event=shard_start");
    }
    let before = listen_drops();
    let pid = srv.pid() as i32;
    // SAFETY: signals to the child we started, not reaped before `srv`
    // drops (a reaped pid could be reused by an unrelated process).
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
    // Bounded by time, not by rounds: /proc/net/tcp is slow to read when the
    // machine holds many sockets, and the clients wait at most 20 s.
    let until = std::time::Instant::now() + Duration::from_secs(3);
    while established() < 300 && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    // Running again before the clients' clocks matter (state leaves 'T').
    let stat = || std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while stat().split_whitespace().nth(2) == Some("T") {
        assert!(
            std::time::Instant::now() < until,
            "the server stays stopped after SIGCONT"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
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

fn hello(
    addr: std::net::SocketAddr,
    auth: &[u8],
) -> (Option<ringlock::protocol::session::Status>, bool) {
    use ringlock::protocol::session::{self as sp, Answer, Req};
    use std::io::Write;
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut b = Vec::new();
    sp::encode(
        1,
        &Req::Hello {
            version: sp::VERSION,
            keepalive_ms: 0,
            auth,
        },
        &mut b,
    );
    sp::encode(2, &Req::Ping, &mut b);
    s.write_all(&b).expect("send");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    let mut status = None;
    let mut answers = 0;
    loop {
        while let Some((a, n)) = sp::decode_answer(&buf, Some(1)).expect("well-formed") {
            buf.drain(..n);
            answers += 1;
            match a {
                Answer::Welcome { welcome, .. } => status = Some(welcome.status),
                Answer::Reply {
                    rid: 1, status: st, ..
                } => status = Some(st),
                _ => {}
            }
            if answers == 2 {
                return (status, true); // the Ping was answered: a session
            }
        }
        match s.read(&mut chunk) {
            Ok(0) => return (status, false),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => panic!("read: {e}"),
        }
    }
}

fn token_file(dir: &common::TempDir) -> String {
    let p = dir.path("token");
    std::fs::write(&p, "s3cret-token\n").expect("write token");
    p.to_str().expect("utf-8").to_string()
}

#[test]
fn without_the_token_a_session_hello_is_refused() {
    use ringlock::protocol::session::Status;
    let dir = common::TempDir::new("auth");
    let f = token_file(&dir);
    let srv = Server::start(&["--auth-token-file", &f]);
    assert_eq!(
        hello(srv.lock_addr, b""),
        (Some(Status::Unauthorized), false)
    );
    assert_eq!(
        hello(srv.lock_addr, b"s3cret-tokeN"),
        (Some(Status::Unauthorized), false)
    );
    // The trailing newline of the file is not part of the token: the
    // token with it is a wrong token.
    assert_eq!(
        hello(srv.lock_addr, b"s3cret-token\n"),
        (Some(Status::Unauthorized), false)
    );
    assert_eq!(
        hello(srv.lock_addr, b"s3cret-token"),
        (Some(Status::Ok), true)
    );
    srv.wait_log("event=auth_failed");
    // Without a token configured, any Hello is a session.
    let open = Server::start(&[]);
    assert_eq!(hello(open.lock_addr, b"whatever"), (Some(Status::Ok), true));
}

fn admin_exchange(addr: std::net::SocketAddr, bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut s = TcpStream::connect(addr).expect("admin");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    s.write_all(bytes).expect("send");
    s.shutdown(std::net::Shutdown::Write).expect("half-close");
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("answer");
    out
}

#[test]
fn a_non_loopback_admin_port_requires_auth_first() {
    let dir = common::TempDir::new("auth-admin");
    let f = token_file(&dir);
    let srv = Server::start(&["--admin-bind", "0.0.0.0:0", "--auth-token-file", &f]);
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], srv.admin_addr.port()));
    assert_eq!(
        admin_exchange(admin, b"KEYS"),
        b"-",
        "a command before AUTH"
    );
    let mut wrong = b"AUTH".to_vec();
    wrong.push(5);
    wrong.extend_from_slice(b"guess");
    wrong.extend_from_slice(b"KEYS");
    assert_eq!(admin_exchange(admin, &wrong), b"-");
    let mut right = b"AUTH".to_vec();
    right.push(12);
    right.extend_from_slice(b"s3cret-token");
    right.extend_from_slice(b"KEYS");
    assert_eq!(
        admin_exchange(admin, &right),
        b"+\0\0\0\0",
        "AUTH, then an empty KEYS"
    );
    srv.wait_log("event=auth_failed");
}

#[test]
fn the_lc_admin_actions_policy_refuses_unlock_and_resets() {
    let srv = Server::start(&["--lc-admin-actions", "off"]);
    assert_eq!(once(srv.lock_addr, &frame(1, b"k", Some(b"s"))), b'+');
    assert_eq!(once(srv.lock_addr, &frame(2, b"k", None)), b'-', "Unlock");
    assert_eq!(
        once(srv.lock_addr, &frame(3, b"k", None)),
        b'-',
        "ResetByKey"
    );
    assert_eq!(once(srv.lock_addr, &[4, 1, b's']), b'-', "ResetBySource");
    assert_eq!(keys(srv.admin_addr).len(), 1, "nothing was released");
    assert_eq!(once(srv.lock_addr, &frame(5, b"k", Some(b"t"))), b'#');
    srv.wait_log("event=lc_action_refused");
    // loopback: these clients are on loopback, so they may.
    let lo = Server::start(&["--lc-admin-actions", "loopback"]);
    assert_eq!(once(lo.lock_addr, &frame(1, b"k", Some(b"s"))), b'+');
    assert_eq!(once(lo.lock_addr, &frame(2, b"k", None)), b'+');
    assert!(keys(lo.admin_addr).is_empty());
}

#[test]
fn an_exposed_lock_port_without_a_token_is_warned_about() {
    let srv = Server::start(&["--bind", "0.0.0.0:0"]);
    // Logged at start-up, before the listening line.
    let line = srv
        .startup_log
        .iter()
        .find(|l| l.contains("event=insecure_bind"))
        .unwrap_or_else(|| panic!("no insecure_bind warning in {:?}", srv.startup_log));
    assert!(line.contains("port=lock"), "{line}");
    let quiet = Server::start(&[]);
    assert!(!quiet
        .startup_log
        .iter()
        .any(|l| l.contains("insecure_bind")));
}

#[test]
fn the_cli_authenticates_to_a_non_loopback_admin_port_and_resets_by_token() {
    let dir = common::TempDir::new("auth-cli");
    let f = token_file(&dir);
    let srv = Server::start(&["--admin-bind", "0.0.0.0:0", "--auth-token-file", &f]);
    let admin = format!("127.0.0.1:{}", srv.admin_addr.port());
    assert_eq!(once(srv.lock_addr, &frame(1, b"k", Some(b"s"))), b'+');
    let cli = |auth: bool, args: &[&str]| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_ringlock"));
        c.env_remove("RINGLOCK_AUTH_TOKEN_FILE").args([
            "--addr",
            &srv.lock_addr.to_string(),
            "--admin-addr",
            &admin,
            "--retry",
            "0",
        ]);
        if auth {
            c.args(["--auth-token-file", &f]);
        }
        c.args(args).output().expect("run ringlock")
    };
    let without = cli(false, &["keys"]);
    assert_ne!(without.status.code(), Some(0), "keys without the token");
    let with = cli(true, &["keys"]);
    assert_eq!(with.status.code(), Some(0), "{with:?}");
    assert!(
        String::from_utf8_lossy(&with.stdout).contains("k "),
        "{with:?}"
    );
    // The compare-and-reset path (KEYX, then RSTK) authenticates too.
    let reset = cli(true, &["reset", "k"]);
    assert_eq!(reset.status.code(), Some(0), "{reset:?}");
    assert_eq!(
        once(srv.lock_addr, &frame(5, b"k", Some(b"t"))),
        b'+',
        "the reset released k"
    );
}
