//! Every row of docs/protocol.md sections 1 and 2 against the real binary.

mod common;

use common::*;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A round trip on another connection: the server is one thread and handles
/// arrivals in order, so once this answers, earlier frames were handled.
fn sync(s: &Server) {
    assert_eq!(once(s.lock_addr, &frame(2, b"__sync__", None)), b'+');
}

/// Waits until `n` Lock requests are queued (every shard's total): with
/// several shards a waiter's connection may still be on its way to the
/// key's owner when a round trip on another connection returns, so the
/// queued-waiters gauge is the barrier.
fn queued(s: &Server, n: usize) {
    wait_metric(s.metrics(), "ringlock_queued_waiters", n as f64);
}

/// A server with metrics (for [`queued`]).
fn start() -> Server {
    Server::start(&["--metrics-bind", "127.0.0.1:0"])
}

#[test]
fn lock_unlock_trylock_basics() {
    let s = start();
    let mut a = s.connect();
    assert_eq!(a.lock(b"k", b"svc"), b'+');
    assert_eq!(once(s.lock_addr, &frame(5, b"k", Some(b"other"))), b'#');
    // A key with a waiter is not free for TryLock either.
    let mut w = s.connect();
    w.send(&frame(1, b"k", Some(b"w")));
    queued(&s, 1);
    assert_eq!(a.unlock(b"k"), b'+');
    assert_eq!(w.read_byte(), b'+');
    assert_eq!(once(s.lock_addr, &frame(5, b"k", Some(b"x"))), b'#');
    assert_eq!(w.unlock(b"k"), b'+');
    assert_eq!(once(s.lock_addr, &frame(5, b"k", Some(b"x"))), b'+');
    // Unlock of a free key answers '+'; Unlock has no owner check.
    assert_eq!(once(s.lock_addr, &frame(2, b"never-locked", None)), b'+');
    assert_eq!(once(s.lock_addr, &frame(2, b"k", None)), b'+');
    assert_eq!(once(s.lock_addr, &frame(5, b"k", Some(b"x"))), b'+');
}

#[test]
fn waiters_are_served_in_fifo_order() {
    let s = start();
    let mut holder = s.connect();
    assert_eq!(holder.lock(b"fifo", b"h"), b'+');
    let mut waiters: Vec<Conn> = (0..8)
        .map(|i| {
            let mut c = s.connect();
            c.send(&frame(1, b"fifo", Some(format!("w{i}").as_bytes())));
            queued(&s, i + 1);
            c
        })
        .collect();
    assert!(
        waiters[0].silent_for(50),
        "a waiter was answered while the key is held"
    );
    let mut unlocker = s.connect();
    assert_eq!(unlocker.unlock(b"fifo"), b'+');
    for i in 0..waiters.len() {
        assert_eq!(waiters[i].read_byte(), b'+', "waiter {i} not granted next");
        if i + 1 < waiters.len() {
            assert!(
                waiters[i + 1].silent_for(20),
                "waiter {} granted out of turn",
                i + 1
            );
        }
        assert_eq!(waiters[i].unlock(b"fifo"), b'+');
    }
}

#[test]
fn a_waiter_that_hangs_up_is_withdrawn_and_never_granted() {
    let s = start();
    let mut holder = s.connect();
    assert_eq!(holder.lock(b"hu", b"h"), b'+');
    let mut w1 = s.connect_oneshot();
    w1.send(&frame(1, b"hu", Some(b"w1")));
    queued(&s, 1);
    let w2 = s.connect_oneshot();
    let mut w2 = w2;
    w2.send(&frame(1, b"hu", Some(b"w2")));
    queued(&s, 2);
    let mut w3 = s.connect_oneshot();
    w3.send(&frame(1, b"hu", Some(b"w3")));
    queued(&s, 3);
    // The middle and the first waiter go away (close, then half-close).
    // The FIN of a closed socket leaves only when no process holds it: a
    // server that another test is spawning at this moment holds a copy of
    // our descriptors until its exec. Wait until the server closed w2.
    let fds = s.open_fds();
    drop(w2);
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.open_fds() >= fds {
        assert!(Instant::now() < deadline, "the server never saw w2 hang up");
        std::thread::sleep(Duration::from_millis(2));
    }
    w1.half_close();
    // The server answers nothing to a withdrawn waiter and closes.
    w1.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 1];
    match std::io::Read::read(&mut w1.s, &mut b) {
        Ok(0) => {}
        other => panic!(
            "withdrawn waiter: expected EOF, got {other:?}; holders {:?}",
            keys(s.admin_addr)
        ),
    }
    queued(&s, 1);
    assert_eq!(holder.unlock(b"hu"), b'+');
    w3.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 1];
    match std::io::Read::read(&mut w3.s, &mut b).map(|n| (n, b[0])) {
        Ok((1, b'+')) => {}
        other => panic!(
            "the next live waiter did not get the key ({other:?}); holders: {:?}",
            keys(s.admin_addr)
        ),
    }
    let held = keys(s.admin_addr);
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].source, b"w3");
}

#[test]
fn a_held_key_survives_its_holders_disconnect() {
    let s = Server::start(&[]);
    assert_eq!(once(s.lock_addr, &frame(1, b"kept", Some(b"gone"))), b'+');
    sync(&s);
    assert_eq!(once(s.lock_addr, &frame(5, b"kept", Some(b"x"))), b'#');
    assert_eq!(keys(s.admin_addr)[0].source, b"gone");
}

#[test]
fn reset_by_key_releases_the_holder_and_keeps_the_queue() {
    let s = start();
    let mut h = s.connect();
    assert_eq!(h.lock(b"rk", b"h"), b'+');
    let mut w1 = s.connect();
    w1.send(&frame(1, b"rk", Some(b"w1")));
    queued(&s, 1);
    let mut w2 = s.connect();
    w2.send(&frame(1, b"rk", Some(b"w2")));
    queued(&s, 2);
    assert_eq!(once(s.lock_addr, &frame(3, b"rk", None)), b'+');
    assert_eq!(w1.read_byte(), b'+');
    assert!(w2.silent_for(30));
    assert_eq!(once(s.lock_addr, &frame(3, b"rk", None)), b'+');
    assert_eq!(w2.read_byte(), b'+');
    // Reset of a free key is fine too.
    assert_eq!(once(s.lock_addr, &frame(3, b"nothing", None)), b'+');
}

#[test]
fn reset_by_source_frees_its_keys_and_fails_its_waiters() {
    let s = start();
    let mut a = s.connect();
    assert_eq!(a.lock(b"s1", b"svcA"), b'+');
    assert_eq!(a.lock(b"s2", b"svcA"), b'+');
    let mut b = s.connect();
    assert_eq!(b.lock(b"s3", b"svcB"), b'+');
    // svcA waits on svcB's key; svcB waits on svcA's key.
    let mut a_wait = s.connect();
    a_wait.send(&frame(1, b"s3", Some(b"svcA")));
    queued(&s, 1);
    let mut b_wait = s.connect();
    b_wait.send(&frame(1, b"s1", Some(b"svcB")));
    queued(&s, 2);
    assert_eq!(once(s.lock_addr, &[4, 4, b's', b'v', b'c', b'A']), b'+');
    assert_eq!(
        a_wait.read_byte(),
        b'-',
        "queued Lock of the reset source answers '-'"
    );
    assert_eq!(
        b_wait.read_byte(),
        b'+',
        "svcA's key goes to the next waiter"
    );
    let held: Vec<Vec<u8>> = keys(s.admin_addr).into_iter().map(|k| k.key).collect();
    assert_eq!(held, vec![b"s1".to_vec(), b"s3".to_vec()]);
    // The connection stays usable after a '-' for a reset waiter.
    assert_eq!(a_wait.try_lock(b"s2", b"svcA"), b'+');
}

#[test]
fn empty_source_means_the_peer_ip() {
    let s = Server::start(&[]);
    let mut c = s.connect();
    assert_eq!(c.lock(b"ip1", b""), b'+');
    assert_eq!(c.lock(b"ip2", b""), b'+');
    let k = keys(s.admin_addr);
    assert_eq!(k.len(), 2);
    assert_eq!(k[0].source, b"127.0.0.1");
    let local = c.s.local_addr().unwrap();
    assert_eq!(
        k[0].endpoint,
        local.to_string(),
        "endpoint is the peer ip:port"
    );
    // ResetBySource with an empty source resets "my own IP".
    assert_eq!(once(s.lock_addr, &[4, 0]), b'+');
    assert!(keys(s.admin_addr).is_empty());
    // Admin RSBS with count 0 does the same.
    assert_eq!(c.lock(b"ip3", b""), b'+');
    assert_eq!(admin_names(s.admin_addr, b"RSBS", &[]), b"++");
    assert!(keys(s.admin_addr).is_empty());
}

#[test]
fn keys_listing_byte_format() {
    let s = Server::start(&[]);
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut c = s.connect();
    let long_key = vec![b'z'; 127];
    assert_eq!(c.lock(&long_key, b"src-long"), b'+');
    assert_eq!(c.lock(b"b-key", b"src-b"), b'+');
    assert_eq!(c.lock(b"a-key", b"src-a"), b'+');
    // Raw bytes, checked by hand for the first entry.
    let mut raw = TcpStream::connect(s.admin_addr).unwrap();
    use std::io::{Read, Write};
    raw.write_all(b"KEYS").unwrap();
    let mut head = [0u8; 4 + 1 + 5 + 1 + 5 + 1];
    raw.read_exact(&mut head).unwrap();
    assert_eq!(&head[..4], &3u32.to_le_bytes(), "u32 LE count");
    assert_eq!(&head[4..10], b"\x05a-key", "sorted by key: a-key first");
    assert_eq!(&head[10..16], b"\x05src-a");
    let ep_len = head[16] as usize;
    let mut ep = vec![0u8; ep_len + 8];
    raw.read_exact(&mut ep).unwrap();
    assert_eq!(
        std::str::from_utf8(&ep[..ep_len]).unwrap(),
        c.s.local_addr().unwrap().to_string()
    );
    let t = i64::from_le_bytes(ep[ep_len..].try_into().unwrap());
    assert!(
        t >= before && t <= before + 5,
        "i64 LE unix seconds, got {t}"
    );
    let k = keys(s.admin_addr);
    assert_eq!(
        k.iter().map(|k| k.key.clone()).collect::<Vec<_>>(),
        vec![b"a-key".to_vec(), b"b-key".to_vec(), b"z".repeat(127)]
    );
    // RSET answers '+' per key then a final '+'.
    assert_eq!(
        admin_names(s.admin_addr, b"RSET", &[b"a-key", b"nope"]),
        b"+++"
    );
    assert_eq!(keys(s.admin_addr).len(), 2);
    assert_eq!(
        admin_names(s.admin_addr, b"RSBS", &[b"src-b", b"src-long"]),
        b"+++"
    );
    assert!(keys(s.admin_addr).is_empty());
}

#[test]
fn a_127_byte_key_and_source_work_and_128_is_refused() {
    let s = Server::start(&[]);
    let k = vec![b'x'; 127];
    let mut c = s.connect();
    assert_eq!(c.lock(&k, &[b's'; 127]), b'+');
    assert_eq!(c.try_lock(&k, b"o"), b'#');
    assert_eq!(c.unlock(&k), b'+');
    // Size byte 128 is -128 as a signed byte: bad input.
    let mut bad = vec![1u8, 128];
    bad.extend_from_slice(&[b'x'; 128]);
    bad.extend_from_slice(&[0]);
    assert_eq!(once(s.lock_addr, &bad), b'-');
}

#[test]
fn persistent_connections_carry_sequential_requests() {
    let s = Server::start(&[]);
    let mut c = s.connect();
    for i in 0..50 {
        let key = format!("p{}", i % 3);
        assert_eq!(c.lock(key.as_bytes(), b"p"), b'+');
        assert_eq!(c.try_lock(key.as_bytes(), b"p"), b'#');
        assert_eq!(c.unlock(key.as_bytes()), b'+');
    }
    // Two frames in one write: answered one after the other.
    let mut both = frame(1, b"pp", Some(b"s"));
    both.extend_from_slice(&frame(2, b"pp", None));
    c.send(&both);
    assert_eq!(c.read_byte(), b'+');
    assert_eq!(c.read_byte(), b'+');
    assert_eq!(c.try_lock(b"pp", b"s"), b'+');
}

#[test]
fn bad_frames_answer_minus_close_and_change_nothing() {
    let s = Server::start(&["--frame-timeout-ms", "300"]);
    let mut holder = s.connect();
    assert_eq!(holder.lock(b"safe", b"h"), b'+');
    let cases: Vec<Vec<u8>> = vec![
        vec![0],                // unknown action 0
        vec![7, 1, b'k'],       // unknown action 7
        vec![255],              // unknown action 255
        vec![1, 0, 0],          // key size 0
        vec![1, 0x80],          // key size -128
        vec![5, 1, b'k', 0xFF], // source size -1
        vec![2, 0],             // unlock with key size 0
        vec![3, 0xF0],          // reset with negative key size
        vec![4, 0x81],          // reset-by-source with negative size
    ];
    for bad in &cases {
        let mut c = s.connect();
        c.send(bad);
        assert_eq!(c.read_byte_or_eof(), Some(b'-'), "frame {bad:?}");
        assert_eq!(
            c.read_byte_or_eof(),
            None,
            "connection closed after {bad:?}"
        );
    }
    // A valid request followed by garbage on the same connection.
    let mut c = s.connect();
    let mut b = frame(5, b"other", Some(b"s"));
    b.push(9);
    c.send(&b);
    assert_eq!(c.read_byte(), b'+');
    assert_eq!(c.read_byte_or_eof(), Some(b'-'));
    // Random byte streams.
    let mut seed = 0x2545F4914F6CDD1Du64;
    for _ in 0..50 {
        let mut c = s.connect();
        let n = (seed % 40) as usize + 1;
        let bytes: Vec<u8> = (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 24) as u8
            })
            .collect();
        c.send(&bytes);
        drop(c);
    }
    // A frame that never completes is dropped after the read timeout.
    let mut slow = s.connect();
    slow.send(&[1, 10, b'a', b'b']);
    let t = Instant::now();
    assert_eq!(slow.read_byte_or_eof(), Some(b'-'));
    assert_eq!(slow.read_byte_or_eof(), None);
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "timed out too early: {:?}",
        t.elapsed()
    );
    // The admin port rejects unknown commands the same way.
    let mut a = Conn::connect(s.admin_addr);
    a.send(b"NOPE");
    assert_eq!(a.read_byte_or_eof(), Some(b'-'));
    // Nothing changed: the held key is still held, others are free.
    sync(&s);
    let held = keys(s.admin_addr);
    let names: Vec<&[u8]> = held.iter().map(|k| &k.key[..]).collect();
    assert_eq!(
        names,
        vec![&b"other"[..], &b"safe"[..]],
        "only the valid requests took effect"
    );
    assert_eq!(
        holder.try_lock(b"other", b"h"),
        b'#',
        "the valid TryLock before garbage took effect"
    );
    assert_eq!(holder.unlock(b"safe"), b'+');
}

// Limits are exact for one shard (with several, connections are shared out
// and keys counted per shard: docs/shards.md), so these run with one.
#[test]
fn connections_over_the_limit_are_refused_cleanly() {
    let s = Server::start(&["--max-connections", "4", "--threads", "1"]);
    let mut open: Vec<Conn> = (0..4).map(|_| s.connect()).collect();
    sync_via(&mut open[0]);
    let mut extra = s.connect_oneshot();
    assert_eq!(extra.read_byte_or_eof(), Some(b'-'), "refused with '-'");
    assert_eq!(extra.read_byte_or_eof(), None, "and closed");
    // Existing connections still work, and a slot frees when one closes.
    assert_eq!(open[1].lock(b"lim", b"s"), b'+');
    drop(open.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut c = s.connect_oneshot();
        c.send(&frame(2, b"lim", None));
        match c.read_byte_or_eof() {
            Some(b'+') => break,
            _ if Instant::now() < deadline => std::thread::yield_now(),
            other => panic!("no slot freed: {other:?}"),
        }
    }
}

fn sync_via(c: &mut Conn) {
    assert_eq!(c.unlock(b"__sync__"), b'+');
}

#[test]
fn sigterm_answers_queued_waiters_and_exits_zero() {
    let mut s = start();
    let mut h = s.connect();
    assert_eq!(h.lock(b"t", b"h"), b'+');
    let mut w = s.connect();
    w.send(&frame(1, b"t", Some(b"w")));
    queued(&s, 1);
    let t = Instant::now();
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(s.pid() as i32, libc::SIGTERM) };
    assert_eq!(w.read_byte_or_eof(), Some(b'-'));
    let status = s.child.wait().unwrap();
    assert!(status.success(), "exit status {status}");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "took {:?}",
        t.elapsed()
    );
}

#[test]
fn bad_addresses_and_busy_ports_fail_with_one_line() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().to_string();
    for args in [
        vec![
            "--bind",
            port.as_str(),
            "--admin-bind",
            "127.0.0.1:0",
            "--bind-retry",
            "0",
        ],
        vec!["--bind", "not-an-address"],
        vec![
            "--bind",
            "127.0.0.1:0",
            "--admin-bind",
            port.as_str(),
            "--bind-retry",
            "0",
        ],
        vec!["--max-connections", "0"],
        vec!["--bogus"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringlockd"))
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "one line for {args:?}: {err}"
        );
        assert!(err.starts_with("ringlockd: "), "{err}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringlockd"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("--data-path"));
}

#[test]
fn bind_address_env_accepts_locking_center_form() {
    // ':PORT' means all interfaces.
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = probe.local_addr().unwrap().port();
    drop(probe);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ringlockd"));
    cmd.env("BIND_ADDRESS", format!(":{port}"))
        .args(["--admin-bind", "127.0.0.1:0"]);
    let mut child = cmd
        .env_remove("RINGLOCK_BIND")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::BufRead;
    // BIND_ADDRESS is deprecated (RINGLOCK_BIND): said first, naming the
    // replacement; all interfaces without a token: warned about next, then
    // listening.
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(
        line.contains("event=deprecated_env var=BIND_ADDRESS replacement=RINGLOCK_BIND used=true"),
        "{line}"
    );
    line.clear();
    err.read_line(&mut line).unwrap();
    assert!(line.contains("event=insecure_bind"), "{line}");
    line.clear();
    err.read_line(&mut line).unwrap();
    assert!(line.contains(&format!("lock=0.0.0.0:{port}")), "{line}");
    assert_eq!(
        once(
            format!("127.0.0.1:{port}").parse().unwrap(),
            &frame(5, b"e", Some(b""))
        ),
        b'+'
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn key_and_waiter_limits_answer_minus_log_once_and_change_nothing() {
    let s = Server::start(&["--max-keys", "2", "--max-waiters", "1", "--threads", "1"]);
    let mut c = s.connect();
    assert_eq!(c.lock(b"a", b"s"), b'+');
    assert_eq!(c.lock(b"b", b"s"), b'+');
    assert_eq!(
        c.lock(b"c", b"s"),
        b'-',
        "third distinct key is over --max-keys"
    );
    s.wait_log("event=limit_reached limit=max_keys");
    let mut w = s.connect();
    w.send(&frame(1, b"a", Some(b"w")));
    sync(&s);
    assert_eq!(
        once(s.lock_addr, &frame(1, b"a", Some(b"w2"))),
        b'-',
        "second waiter is over --max-waiters"
    );
    for _ in 0..20 {
        assert_eq!(once(s.lock_addr, &frame(1, b"z", Some(b"w3"))), b'-');
    }
    let held: Vec<Vec<u8>> = keys(s.admin_addr).into_iter().map(|k| k.key).collect();
    assert_eq!(held, vec![b"a".to_vec(), b"b".to_vec()]);
    // The queued waiter is intact and served.
    assert_eq!(c.unlock(b"a"), b'+');
    assert_eq!(w.read_byte(), b'+');
    // Refusals within a second are logged once, not per request.
    let mut lines = 0;
    while let Ok(l) = s.log.try_recv() {
        if l.contains("event=limit_reached") {
            lines += 1;
        }
    }
    assert!(
        lines <= 1,
        "limit refusals flooded the log: {lines} more lines"
    );
}
