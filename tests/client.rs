//! `ringlock::client` against the real `ringlockd` binary.

mod common;

use std::net::TcpListener;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::Server;
use ringlock::client::{CancelToken, Client, Error, LateGrant, LockOptions, RetryPolicy};

fn client_with_source(s: &Server, source: &str) -> Client {
    Client::builder(s.lock_addr)
        .admin_addr(s.admin_addr)
        .source(source)
        .io_timeout(Duration::from_secs(5))
        .retry(RetryPolicy {
            max_elapsed: Duration::from_secs(2),
            ..RetryPolicy::default()
        })
        .build()
        .expect("valid client")
}

fn client(s: &Server) -> Client {
    client_with_source(s, "test")
}

/// The server's table as (key, endpoint) pairs, read with the lead's
/// independent decoder.
fn held(s: &Server) -> Vec<(String, String)> {
    common::keys(s.admin_addr)
        .into_iter()
        .map(|k| (String::from_utf8_lossy(&k.key).into_owned(), k.endpoint))
        .collect()
}

#[test]
fn client_and_guard_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Client>();
    send::<ringlock::client::Guard>();
    send_sync::<CancelToken>();
}

#[test]
fn lock_lists_holder_and_release_frees() {
    let s = Server::start(&[]);
    let c = client(&s);
    let mut g = c.lock("a/b").expect("free key is granted");
    let endpoint = g.endpoint().expect("granted on a connection").to_string();
    assert_eq!(held(&s), vec![("a/b".to_string(), endpoint.clone())]);

    let keys = c.keys().expect("keys");
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].key, b"a/b");
    assert_eq!(keys[0].source, b"test");
    assert_eq!(keys[0].endpoint, endpoint);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(
        (keys[0].acquired_unix_s - now).abs() <= 5,
        "acquired time is now"
    );
    assert!(g.is_held().expect("admin reachable"));

    g.release().expect("release");
    assert!(held(&s).is_empty());
    assert!(!g.is_held().unwrap());
    g.release()
        .expect("second release returns the first result");
}

#[test]
fn try_lock_tells_held_apart_from_errors() {
    let s = Server::start(&[]);
    let c = client(&s);
    let g = c.lock("t").unwrap();
    assert!(c.try_lock("t").expect("`#` is not an error").is_none());
    drop(g);
    assert!(held(&s).is_empty(), "drop released");
    let g2 = c.try_lock("t").unwrap().expect("free key");
    assert_eq!(held(&s)[0].1, g2.endpoint().unwrap().to_string());
    drop(g2);
    assert!(held(&s).is_empty());
}

#[test]
fn release_happens_exactly_once() {
    let s = Server::start(&[]);
    let c = client(&s);
    let mut first = c.lock("once").unwrap();
    first.release().unwrap();
    let second = c.lock("once").unwrap();
    // A second release (and the drop) must not unlock the new holder.
    first.release().unwrap();
    drop(first);
    assert_eq!(
        held(&s),
        vec![("once".to_string(), second.endpoint().unwrap().to_string())]
    );
    drop(second);
    assert!(held(&s).is_empty());
}

#[test]
fn waiter_is_granted_when_guard_drops() {
    let s = Server::start(&[]);
    let c = client(&s);
    let g = c.lock("fifo").unwrap();
    let (tx, rx) = mpsc::channel();
    let c2 = c.clone();
    let waiter = thread::spawn(move || {
        let g = c2.lock("fifo").expect("granted after the holder leaves");
        tx.send(g.endpoint().unwrap().to_string()).unwrap();
        g
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(100)).is_err(),
        "must wait"
    );
    drop(g);
    let endpoint = rx.recv_timeout(Duration::from_secs(10)).expect("granted");
    assert_eq!(held(&s), vec![("fifo".to_string(), endpoint)]);
    drop(waiter.join().unwrap());
    assert!(held(&s).is_empty());
}

#[test]
fn resets_unlock_and_wait() {
    let s = Server::start(&[]);
    let c = client(&s);
    let mut g = c.lock("r").unwrap();
    c.reset_by_key("r").unwrap();
    assert!(held(&s).is_empty());
    assert!(!g.is_held().unwrap(), "the guard notices the lost lock");
    g.release().expect("unlocking a free key answers +");

    let other = client_with_source(&s, "other");
    let g1 = other.lock("r1").unwrap();
    let g2 = other.lock("r2").unwrap();
    let mine = c.lock("r3").unwrap();
    c.reset_by_source("other").unwrap();
    assert_eq!(held(&s).len(), 1, "only the other source's keys go");
    drop((g1, g2));

    c.unlock("r3").unwrap();
    assert!(held(&s).is_empty());
    drop(mine);
    c.wait("r3").expect("free key: wait returns at once");
    assert!(held(&s).is_empty(), "wait leaves the key free");
}

#[test]
fn lock_timeout_withdraws_exactly() {
    let s = Server::start(&[]);
    let c = client(&s);
    let g = c.lock("busy").unwrap();
    let t0 = Instant::now();
    let err = c
        .lock_timeout("busy", Duration::from_millis(50))
        .unwrap_err();
    assert!(matches!(err, Error::Timeout), "{err:?}");
    // A deadline never fires early (no upper bound: a slow machine may
    // take its time, and the withdrawal below is what matters).
    assert!(
        t0.elapsed() >= Duration::from_millis(50),
        "{:?}",
        t0.elapsed()
    );
    drop(g);
    // The withdrawn waiter was not granted behind our back.
    assert!(held(&s).is_empty());
}

#[test]
fn cancel_token_stops_a_wait_exactly() {
    let s = Server::start(&["--metrics-bind", "127.0.0.1:0"]);
    let c = client(&s);
    let g = c.lock("c").unwrap();
    let token = CancelToken::new().unwrap();
    let t2 = token.clone();
    // Cancel once the wait is really queued on the server.
    let metrics = s.metrics();
    let canceller = thread::spawn(move || {
        common::wait_metric(metrics, "ringlock_queued_waiters", 1.0);
        t2.cancel();
    });
    let err = c
        .lock_with("c", &LockOptions::new().cancel(token.clone()))
        .unwrap_err();
    assert!(matches!(err, Error::Cancelled), "{err:?}");
    canceller.join().unwrap();
    common::wait_metric(metrics, "ringlock_queued_waiters", 0.0);
    // A cancelled token refuses new waits without touching the network.
    assert!(matches!(
        c.lock_with("c", &LockOptions::new().cancel(token)),
        Err(Error::Cancelled)
    ));
    drop(g);
    assert!(held(&s).is_empty());
}

/// The server's side of exact cancellation: a queued Lock followed by a
/// half-close is withdrawn, answered with nothing, and the connection closed.
#[test]
fn server_answers_nothing_after_half_close_withdrawal() {
    let s = Server::start(&[]);
    let mut holder = s.connect();
    assert_eq!(holder.lock(b"h", b"a"), b'+');
    let mut waiter = s.connect_oneshot();
    waiter.send(&common::frame(1, b"h", Some(b"b")));
    assert!(waiter.silent_for(50), "queued behind the holder");
    waiter.half_close();
    assert_eq!(waiter.read_byte_or_eof(), None, "no answer, just EOF");
    assert_eq!(holder.unlock(b"h"), b'+');
    assert!(held(&s).is_empty(), "no ghost holder");
}

/// Deadlines set to expire around the moment of grant, many times, with both
/// late-grant policies: after every iteration the key is either free or held
/// by exactly the guard the caller got.
#[test]
fn exact_cancellation_race_never_leaks() {
    let s = Server::start(&[]);
    let c = client(&s);
    let (mut in_time, mut timed_out) = (0, 0);
    const WAIT_MS: i64 = 12;
    for i in 0..160i64 {
        let mut holder = c.lock("race").unwrap();
        let late = if i % 2 == 0 {
            LateGrant::Keep
        } else {
            LateGrant::Release
        };
        let start = Instant::now();
        let deadline = start + Duration::from_millis(WAIT_MS as u64);
        let c2 = c.clone();
        let waiter = thread::spawn(move || {
            c2.lock_with(
                "race",
                &LockOptions::new().deadline(deadline).late_grant(late),
            )
        });
        // Release somewhere in [deadline - 4 ms, deadline + 4 ms), sweeping
        // in 100 us steps so some releases land on the deadline itself.
        let offset_us = (i % 80) * 100 - 4000;
        let release_at = start + Duration::from_micros((WAIT_MS * 1000 + offset_us) as u64);
        thread::sleep(release_at.saturating_duration_since(Instant::now()));
        holder.release().unwrap();
        match waiter.join().unwrap() {
            Ok(mut g) => {
                in_time += 1;
                let endpoint = g.endpoint().unwrap().to_string();
                assert_eq!(
                    held(&s),
                    vec![("race".to_string(), endpoint)],
                    "iteration {i}"
                );
                g.release().unwrap();
            }
            Err(Error::Timeout) => timed_out += 1,
            Err(other) => panic!("iteration {i}: {other:?}"),
        }
        assert!(held(&s).is_empty(), "iteration {i} leaked the lock");
    }
    eprintln!("race: {in_time} granted, {timed_out} timed out");
    assert_eq!(in_time + timed_out, 160);
}

#[test]
fn bad_keys_fail_before_any_network_traffic() {
    // A listener that must never see a connection.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let c = Client::builder(l.local_addr().unwrap())
        .admin_addr(l.local_addr().unwrap())
        .io_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let long = "k".repeat(128);
    for key in ["", long.as_str()] {
        let len = key.len();
        let is_invalid =
            |r: Result<(), Error>| matches!(r, Err(Error::InvalidKey { len: l }) if l == len);
        assert!(is_invalid(c.lock(key).map(drop)));
        assert!(is_invalid(
            c.lock_timeout(key, Duration::from_secs(1)).map(drop)
        ));
        assert!(is_invalid(c.lock_with(key, &LockOptions::new()).map(drop)));
        assert!(is_invalid(c.try_lock(key).map(drop)));
        assert!(is_invalid(c.unlock(key)));
        assert!(is_invalid(c.wait(key)));
        assert!(is_invalid(c.reset_by_key(key)));
    }
    // The listener does see traffic when there is some: 127 bytes is valid,
    // and the silent listener makes the unlock's outcome unknown.
    assert!(matches!(c.unlock("k".repeat(127)), Err(Error::Io(_))));
    let _ = l.accept().expect("the valid key did connect");
    // A reset by source takes up to 255 bytes (128..=255 by the admin
    // port's RSBS: a session's source).
    assert!(matches!(
        c.reset_by_source("s".repeat(256)),
        Err(Error::InvalidSource { len: 256 })
    ));
    assert!(matches!(
        Client::builder(l.local_addr().unwrap())
            .source("s".repeat(128))
            .build(),
        Err(Error::InvalidSource { len: 128 })
    ));
    assert_eq!(
        l.accept().unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "nothing else connected"
    );
}

#[test]
fn unreachable_server_is_unavailable_within_the_budget() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let c = Client::builder(("127.0.0.1", port))
        .retry(RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(50),
            max_elapsed: Duration::from_millis(300),
        })
        .build()
        .unwrap();
    // The budget ends the streak: it returns (no infinite retry) after
    // several attempts, and says where it tried.
    match c.lock("k") {
        Err(Error::Unavailable { addr, attempts, .. }) => {
            assert!(attempts >= 3, "{attempts}");
            assert_eq!(addr.to_string(), format!("127.0.0.1:{port}"));
        }
        other => panic!("{other:?}"),
    }
    match c.keys() {
        Err(e @ Error::Unavailable { .. }) => {
            let text = e.to_string();
            assert!(
                text.starts_with(&format!("server 127.0.0.1:{} unavailable after ", port + 1)),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_host_without_port_gets_the_lock_port_and_bad_addresses_are_usage_errors() {
    let c = Client::builder("127.0.0.1")
        .build()
        .expect("host without port");
    assert_eq!(c.addrs(), ["127.0.0.1:22119".parse().unwrap()]);
    assert_eq!(c.admin_addrs(), ["127.0.0.1:22120".parse().unwrap()]);
    let c = Client::builder("[::1]")
        .admin_addr("127.0.0.1")
        .build()
        .expect("bracketed IPv6 without port");
    assert_eq!(c.addrs(), ["[::1]:22119".parse().unwrap()]);
    assert_eq!(c.admin_addrs(), ["127.0.0.1:22120".parse().unwrap()]);
    let c = Client::new("localhost:7").expect("a name resolves");
    assert!(c
        .addrs()
        .iter()
        .all(|a| a.port() == 7 && a.ip().is_loopback()));
    for (addr, reason) in [
        ("127.0.0.1:99999", "invalid port \"99999\""),
        (
            "nonsense.invalid",
            "cannot resolve host \"nonsense.invalid\"",
        ),
        ("", "empty address"),
    ] {
        match Client::builder(addr).build() {
            Err(e @ Error::InvalidAddress { .. }) => {
                assert!(e.is_usage());
                let text = e.to_string();
                assert!(
                    text.contains(&format!("{addr:?}")) && text.contains(reason),
                    "{text}"
                );
            }
            other => panic!("{addr:?}: {other:?}"),
        }
    }
    assert!(matches!(
        Client::builder("127.0.0.1").admin_addr("h:0").build(),
        Err(Error::InvalidAddress { .. })
    ));
}

/// Holds `n` keys of 100 bytes each (persistent TryLocks, pipelined 4 deep
/// on one connection: the server takes 512 bytes of pipelined requests)
/// and returns them in key order.
fn hold_many(s: &Server, n: usize) -> Vec<Vec<u8>> {
    let key = |i: usize| format!("{i:09}-{}", "x".repeat(90)).into_bytes();
    let mut c = s.connect();
    let mut buf = Vec::new();
    for first in (0..n).step_by(4) {
        let last = (first + 4).min(n);
        buf.clear();
        for i in first..last {
            buf.extend_from_slice(&common::frame(5, &key(i), Some(b"many")));
        }
        c.send(&buf);
        for _ in first..last {
            assert_eq!(c.read_byte(), b'+', "a TryLock of a free key");
        }
    }
    (0..n).map(key).collect()
}

/// The streams list every key once, in key order, one at a time; `keys()`
/// and `keyx()` (collected streams) list the same.
#[test]
fn key_streams_list_every_key_in_order() {
    const N: usize = 5_000;
    let s = Server::start(&[]);
    let want = hold_many(&s, N);
    let c = client(&s);
    let mut stream = c.keys_stream().expect("KEYS stream");
    assert_eq!((stream.total(), stream.remaining()), (N as u32, N as u32));
    assert!(!stream.extended());
    for (i, key) in want.iter().enumerate() {
        let k = stream.next().expect("an entry").expect("read");
        assert_eq!(&k.key, key, "entry {i}");
        assert_eq!(k.source, b"many");
        assert_eq!(stream.remaining() as usize, N - i - 1);
    }
    assert!(stream.next().is_none(), "the answer ends after its count");
    assert!(stream.next().is_none(), "and stays ended");

    let listed: Vec<_> = c
        .keyx_stream()
        .expect("KEYX stream")
        .collect::<Result<_, _>>()
        .expect("read");
    assert_eq!(listed.len(), N);
    assert!(listed.iter().zip(&want).all(|(k, w)| &k.key == w));
    assert!(listed.iter().all(|k| k.token != 0), "KEYX has the tokens");
    assert_eq!(c.keyx().expect("keyx"), listed);
    let keys = c.keys().expect("keys");
    assert_eq!(keys.len(), N);
    assert!(keys.iter().zip(&want).all(|(k, w)| &k.key == w));
}

/// A stream whose connection breaks after it handed out keys ends with an
/// error and does not reconnect (a retry would hand them out again);
/// `keys()` through the same path still works, opening a new connection.
#[test]
fn a_key_stream_cut_short_ends_in_an_error_and_is_not_retried() {
    use common::fault_proxy::FaultProxy;
    // About 2.6 MB of answer: far more than the socket buffers and the
    // proxy hold, so the cut is seen before the end.
    const N: usize = 20_000;
    let s = Server::start(&[]);
    let want = hold_many(&s, N);
    let proxy = FaultProxy::start(s.admin_addr);
    let c = Client::builder(s.lock_addr)
        .admin_addr(proxy.addr())
        .retry(RetryPolicy {
            max_elapsed: Duration::from_secs(2),
            ..RetryPolicy::default()
        })
        .build()
        .expect("valid client");
    let mut stream = c.keys_stream().expect("KEYS stream");
    assert_eq!(stream.total() as usize, N);
    let first = stream.next().expect("an entry").expect("read");
    assert_eq!(first.key, want[0]);
    proxy.reset_all();
    let mut got = 1;
    let err = loop {
        match stream.next() {
            Some(Ok(k)) => {
                assert_eq!(k.key, want[got], "entry {got}, once and in order");
                got += 1;
            }
            Some(Err(e)) => break e,
            None => panic!("the whole answer arrived through a cut connection"),
        }
    };
    assert!(got < N, "{got}");
    assert!(matches!(err, Error::Io(_)), "the read's own error: {err:?}");
    assert!(stream.next().is_none(), "nothing after the error");
    assert_eq!(proxy.connections_accepted(), 1, "no reconnection");
    eprintln!("cut after {got} of {N} keys: {err}");
    assert_eq!(c.keys().expect("keys after the cut").len(), N);
    assert_eq!(proxy.connections_accepted(), 2);
}
