//! The session client against a scripted peer on 127.0.0.1: the faults a
//! real server cannot be made to show on demand (a Ping that is never
//! answered while the connection stays open, a Lost push right behind its
//! grant, a grant that races a Cancel, a Release that is never answered,
//! a server that is not a session server). The peer speaks the session
//! protocol with the crate's own codec (`ringlock::protocol::session`).
//! Behaviour the real server shows is tested in tests/session_client.rs.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ringlock::client::{Acquire, Hold, RetryPolicy, Session, Wait};
use ringlock::lease::{CancelToken, Error, LockOptions, LostReason};
use ringlock::protocol::session::{self as wire, Decoded, LostWhy, Req, Status, Welcome};

/// One request as the peer saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Frame {
    op: u8,
    rid: u32,
    key: Vec<u8>,
    token: u64,
    target: u32,
    hold: u8,
    ttl_ms: u32,
    wait_ms: u32,
}

/// The server side of one session connection.
struct Peer {
    s: TcpStream,
    buf: Vec<u8>,
    /// Answer Pings by itself (the default) or swallow them.
    answer_pings: bool,
    pings: usize,
}

impl Peer {
    /// Reads the next request; `None` at EOF. Pings are answered (or
    /// swallowed) and counted, not returned.
    fn next(&mut self) -> Option<Frame> {
        loop {
            match wire::decode(&self.buf) {
                Decoded::Frame { op, rid, req, len } => {
                    let req = req.expect("the client sends well-formed bodies");
                    let mut f = Frame {
                        op,
                        rid,
                        key: Vec::new(),
                        token: 0,
                        target: 0,
                        hold: 0,
                        ttl_ms: 0,
                        wait_ms: 0,
                    };
                    match req {
                        Req::Acquire {
                            hold,
                            ttl_ms,
                            wait_ms,
                            key,
                            ..
                        } => {
                            f.key = key.to_vec();
                            f.hold = hold as u8;
                            f.ttl_ms = ttl_ms;
                            f.wait_ms = wait_ms;
                        }
                        Req::Release { token, key } | Req::Proclaim { token, key, .. } => {
                            f.key = key.to_vec();
                            f.token = token;
                        }
                        Req::Extend { token, ttl_ms, key } => {
                            f.key = key.to_vec();
                            f.token = token;
                            f.ttl_ms = ttl_ms;
                        }
                        Req::Cancel { target, key } | Req::Unwatch { target, key } => {
                            f.key = key.to_vec();
                            f.target = target;
                        }
                        Req::Watch { key } => f.key = key.to_vec(),
                        Req::Ping | Req::Hello { .. } | Req::Resume { .. } => {}
                    }
                    self.buf.drain(..len);
                    if op == wire::OP_PING {
                        self.pings += 1;
                        if self.answer_pings {
                            self.reply(rid, Status::Ok, 0);
                        }
                        continue;
                    }
                    return Some(f);
                }
                Decoded::Incomplete => {}
                Decoded::Bad(why) => panic!("the client broke the framing: {why}"),
            }
            let mut chunk = [0u8; 4096];
            match self.s.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                Err(e) => panic!("peer read: {e}"),
            }
        }
    }

    /// Reads (and answers) Pings until `n` have arrived in all; any other
    /// request meanwhile is a failure.
    fn pings_until(&mut self, n: usize) {
        while self.pings < n {
            if let Decoded::Frame { op, rid, len, .. } = wire::decode(&self.buf) {
                assert_eq!(op, wire::OP_PING, "only pings expected");
                self.buf.drain(..len);
                self.pings += 1;
                if self.answer_pings {
                    self.reply(rid, Status::Ok, 0);
                }
                continue;
            }
            let mut chunk = [0u8; 4096];
            let n = self.s.read(&mut chunk).expect("peer read");
            assert!(n > 0, "EOF while waiting for pings");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The next request, which must be `op`.
    fn expect(&mut self, op: u8) -> Frame {
        let f = self.next().expect("a request, not EOF");
        assert_eq!(f.op, op, "{f:?}");
        f
    }

    fn reply(&mut self, rid: u32, status: Status, token: u64) {
        let mut b = Vec::new();
        wire::encode_reply(rid, status, token, wire::NO_TTL, &mut b);
        self.s.write_all(&b).expect("peer write");
    }

    fn lost(&mut self, key: &[u8], token: u64, why: LostWhy) {
        let mut b = Vec::new();
        wire::encode_lost(key, token, why, &mut b);
        self.s.write_all(&b).expect("peer write");
    }

    /// Reads until the client closes; returns the requests it still sent.
    fn drain(&mut self) -> Vec<Frame> {
        std::iter::from_fn(|| self.next()).collect()
    }
}

const KEEPALIVE_MS: u32 = 3_000;

/// A peer that accepts one session (answering its Hello with
/// `keepalive_ms`) and runs `script` on it in a thread; the script's
/// result comes back through the join handle.
fn peer<T: Send + 'static>(
    keepalive_ms: u32,
    script: impl FnOnce(&mut Peer) -> T + Send + 'static,
) -> (SocketAddr, thread::JoinHandle<T>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let h = thread::spawn(move || {
        let (s, _) = l.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let mut p = Peer {
            s,
            buf: Vec::new(),
            answer_pings: true,
            pings: 0,
        };
        let hello = p.expect(wire::OP_HELLO);
        let mut b = Vec::new();
        wire::encode_welcome(
            hello.rid,
            &Welcome {
                status: Status::Ok,
                version: wire::VERSION,
                keepalive_ms,
                min_ttl_ms: 100,
                max_ttl_ms: 60_000,
                session_id: 42,
                max_keys: 1000,
                max_waiters: 1000,
                shards: 1,
                flags: 0,
            },
            &mut b,
        );
        p.s.write_all(&b).expect("welcome");
        script(&mut p)
    });
    (addr, h)
}

fn connect(addr: SocketAddr) -> Session {
    Session::builder(addr)
        .retry(RetryPolicy::none())
        .release_timeout(Duration::from_millis(500))
        .connect()
        .expect("session opens")
}

type Seen = Arc<Mutex<Vec<(String, String, LostReason)>>>;

/// Options whose handler records ("lease", key, reason) and signals.
fn recording(tag: &'static str, seen: &Seen, tx: &mpsc::Sender<()>) -> LockOptions {
    let (seen, tx) = (seen.clone(), tx.clone());
    LockOptions::new().on_lost(move |lease, lost| {
        seen.lock()
            .unwrap()
            .push((tag.into(), lease.key().into(), lost.reason()));
        let _ = tx.send(());
    })
}

#[test]
fn hello_numbers_come_from_the_server() {
    let (addr, h) = peer(3_000, |p| p.drain());
    let s = connect(addr);
    assert_eq!(s.keepalive(), Duration::from_secs(3));
    assert_eq!(s.ping_interval(), Duration::from_secs(1));
    assert_eq!(s.ping_timeout(), Duration::from_secs(1));
    assert!(s.detection_window() < s.keepalive());
    assert_eq!(
        s.ttl_bounds(),
        (Duration::from_millis(100), Duration::from_secs(60))
    );
    assert_eq!(s.session_id(), 42);
    assert!(s.ended().is_none());
    drop(s);
    assert!(h.join().unwrap().is_empty(), "nothing but pings was sent");
}

#[test]
fn a_ping_that_is_never_answered_is_a_loss_not_a_stall() {
    // K = 300 ms: I = T = 100 ms.
    let (addr, h) = peer(300, |p| {
        let a = p.expect(wire::OP_ACQUIRE);
        p.reply(a.rid, Status::Ok, 7);
        // From now on the connection "hangs": open, but Pings go unanswered.
        p.answer_pings = false;
        let rest = p.drain();
        (p.pings, rest)
    });
    let session = Session::builder(addr)
        .keepalive(Duration::from_millis(300))
        .retry(RetryPolicy::none())
        .connect()
        .unwrap();
    let seen: Seen = Default::default();
    let (tx, rx) = mpsc::channel();
    let lease = session
        .lock_with(
            "hang",
            Duration::from_secs(5),
            &recording("lease", &seen, &tx),
        )
        .unwrap();
    rx.recv_timeout(Duration::from_secs(30))
        .expect("the loss is reported");
    assert_eq!(
        *seen.lock().unwrap(),
        [("lease".into(), "hang".into(), LostReason::KeepAliveTimedOut)]
    );
    let err = lease.release().unwrap_err();
    assert_eq!(err.lost().unwrap().reason(), LostReason::KeepAliveTimedOut);
    assert!(err.to_string().contains("no answer to a ping"), "{err}");
    let (reason, _) = session.ended().expect("the session ended");
    assert_eq!(reason, LostReason::KeepAliveTimedOut);
    assert!(matches!(
        session.lock("again", Duration::from_secs(1)),
        Err(Error::Unavailable(_))
    ));
    drop((lease, session));
    let (pings, rest) = h.join().unwrap();
    // The client gave up at the first unanswered Ping and then closed the
    // connection: it neither kept pinging into the void nor sent a Release.
    assert_eq!(pings, 1, "one unanswered ping is the loss");
    assert!(rest.is_empty(), "{rest:?}");
}

#[test]
fn a_closed_connection_loses_every_lease_once_session_handler_first() {
    let (close_tx, close_rx) = mpsc::channel::<()>();
    let (addr, h) = peer(KEEPALIVE_MS, move |p| {
        for token in [10, 11] {
            let a = p.expect(wire::OP_ACQUIRE);
            p.reply(a.rid, Status::Ok, token);
        }
        close_rx.recv().unwrap();
        p.s.shutdown(Shutdown::Both).unwrap();
    });
    let order = Arc::new(Mutex::new(Vec::new()));
    let o = order.clone();
    let (tx, rx) = mpsc::channel();
    let session = Session::builder(addr)
        .retry(RetryPolicy::none())
        .on_lost(move |lease, lost| {
            o.lock()
                .unwrap()
                .push(format!("session {} {:?}", lease.key(), lost.reason()));
            panic!("a faulty session-wide handler");
        })
        .connect()
        .unwrap();
    let seen: Seen = Default::default();
    let a = session
        .lock_with("a", Duration::from_secs(5), &recording("lease", &seen, &tx))
        .unwrap();
    let b = session
        .lock_with("b", Duration::from_secs(5), &recording("lease", &seen, &tx))
        .unwrap();
    assert_eq!((a.token(), b.token()), (Some(10), Some(11)));
    close_tx.send(()).unwrap();
    h.join().unwrap();
    for _ in 0..2 {
        rx.recv_timeout(Duration::from_secs(30))
            .expect("each lease is reported");
    }
    let mut got = seen.lock().unwrap().clone();
    got.sort_by(|x, y| x.1.cmp(&y.1));
    assert_eq!(
        got,
        [
            ("lease".into(), "a".into(), LostReason::ConnectionLost),
            ("lease".into(), "b".into(), LostReason::ConnectionLost)
        ],
        "the per-lease handler runs although the session-wide one panicked"
    );
    let mut o = order.lock().unwrap().clone();
    o.sort();
    assert_eq!(o, ["session a ConnectionLost", "session b ConnectionLost"]);
    assert!(matches!(a.release(), Err(Error::Lost(_))));
    assert!(matches!(b.extend(), Err(Error::Lost(_))));
    assert_eq!(
        rx.try_recv().err(),
        Some(mpsc::TryRecvError::Empty),
        "once each"
    );
}

#[test]
fn a_lost_push_reports_its_reason_and_the_session_lives_on() {
    let (addr, h) = peer(KEEPALIVE_MS, |p| {
        let a = p.expect(wire::OP_ACQUIRE);
        assert_eq!((a.hold, a.ttl_ms), (2, 1_500), "a lease of 1.5 s");
        p.reply(a.rid, Status::Ok, 20);
        // Another session's lease of the same key is not this one's.
        p.lost(b"k", 19, LostWhy::Expired);
        p.lost(b"k", 20, LostWhy::Expired);
        let b = p.expect(wire::OP_ACQUIRE);
        p.reply(b.rid, Status::Ok, 21);
        let r = p.expect(wire::OP_RELEASE);
        assert_eq!(r.token, 21);
        p.reply(r.rid, Status::Ok, 0);
        p.drain()
    });
    let session = connect(addr);
    let seen: Seen = Default::default();
    let (tx, rx) = mpsc::channel();
    let lease = session
        .acquire(
            "k",
            Acquire {
                hold: Hold::Lease(Duration::from_millis(1_500)),
                wait: Wait::Forever,
                ..Acquire::default()
            },
            &recording("lease", &seen, &tx),
        )
        .unwrap();
    assert!(lease.expires_at().is_some());
    rx.recv_timeout(Duration::from_secs(30)).expect("pushed");
    assert_eq!(
        *seen.lock().unwrap(),
        [("lease".into(), "k".into(), LostReason::Expired)]
    );
    let err = lease.release().unwrap_err();
    assert!(
        err.to_string()
            .contains("pushed Lost (expired) for token 20"),
        "{err}"
    );
    // The session is fine: the next lock works and releases normally.
    let again = session.lock("k", Duration::from_secs(5)).unwrap();
    assert_eq!(again.token(), Some(21));
    again.release().unwrap();
    drop((lease, again, session));
    let rest = h.join().unwrap();
    assert!(
        rest.is_empty(),
        "no Release for the pushed-out lease: {rest:?}"
    );
}

#[test]
fn release_from_inside_the_handler_returns_for_this_and_other_leases() {
    let (addr, h) = peer(KEEPALIVE_MS, |p| {
        let a = p.expect(wire::OP_ACQUIRE);
        assert_eq!(a.key, b"second");
        p.reply(a.rid, Status::Ok, 30);
        let b = p.expect(wire::OP_ACQUIRE);
        assert_eq!(b.key, b"first");
        p.reply(b.rid, Status::Ok, 31);
        p.lost(b"first", 31, LostWhy::Reset);
        // The handler of "first" releases "second": its Release must be
        // read and answered while the handler runs.
        let r = p.expect(wire::OP_RELEASE);
        assert_eq!((r.key.as_slice(), r.token), (&b"second"[..], 30));
        p.reply(r.rid, Status::Ok, 0);
        p.drain()
    });
    let session = connect(addr);
    let (tx, rx) = mpsc::channel();
    let second = session.lock("second", Duration::from_secs(5)).unwrap();
    let other = second.clone();
    let opts = LockOptions::new().on_lost(move |lease, lost| {
        assert_eq!(lost.reason(), LostReason::Reset);
        let own = lease.release();
        let others = other.release();
        let _ = tx.send((own, others));
    });
    let first = session
        .lock_with("first", Duration::from_secs(5), &opts)
        .unwrap();
    let (own, others) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the handler returned");
    assert!(matches!(own, Err(Error::Lost(_))), "{own:?}");
    others.expect("the other lease was released from inside the handler");
    assert!(second.is_released());
    drop((first, second, opts, session));
    assert!(h.join().unwrap().is_empty());
}

#[test]
fn a_grant_that_races_the_cancel_is_released_and_never_handed_out() {
    let (addr, h) = peer(KEEPALIVE_MS, |p| {
        let a = p.expect(wire::OP_ACQUIRE);
        let c = p.expect(wire::OP_CANCEL);
        assert_eq!((c.target, c.key.as_slice()), (a.rid, &b"race"[..]));
        // The grant was decided before the Cancel arrived: the Acquire's
        // answer stands and goes first, then the Cancel's "not queued".
        p.reply(a.rid, Status::Ok, 40);
        p.reply(c.rid, Status::NotQueued, 0);
        let r = p.expect(wire::OP_RELEASE);
        p.reply(r.rid, Status::Ok, 0);
        (r.token, p.drain())
    });
    let session = connect(addr);
    let token = CancelToken::new().unwrap();
    let t2 = token.clone();
    let canceller = thread::spawn(move || {
        thread::sleep(Duration::from_millis(20));
        t2.cancel();
    });
    let got = session.lock_with(
        "race",
        Duration::from_secs(30),
        &LockOptions::new().cancel(token),
    );
    canceller.join().unwrap();
    assert!(matches!(got, Err(Error::Cancelled)), "{got:?}");
    drop(session);
    let (released, rest) = h.join().unwrap();
    assert_eq!(released, 40, "the raced grant was released by its token");
    assert!(rest.is_empty(), "{rest:?}");
}

#[test]
fn a_cancel_of_a_queued_acquire_and_a_deadline_are_exact() {
    let (addr, h) = peer(KEEPALIVE_MS, |p| {
        let mut releases = 0;
        for _ in 0..2 {
            let a = p.expect(wire::OP_ACQUIRE);
            assert_eq!(a.wait_ms, 30_000, "the lock timeout is the server's");
            let c = p.expect(wire::OP_CANCEL);
            assert_eq!(c.target, a.rid);
            p.reply(a.rid, Status::Cancelled, 0);
            p.reply(c.rid, Status::Ok, 0);
        }
        releases += p
            .drain()
            .iter()
            .filter(|f| f.op == wire::OP_RELEASE)
            .count();
        releases
    });
    let session = connect(addr);
    let token = CancelToken::new().unwrap();
    token.cancel();
    // Already cancelled: refused before any traffic.
    assert!(matches!(
        session.lock_with(
            "q",
            Duration::from_secs(30),
            &LockOptions::new().cancel(token.clone())
        ),
        Err(Error::Cancelled)
    ));
    let token = CancelToken::new().unwrap();
    let t2 = token.clone();
    let c = thread::spawn(move || {
        thread::sleep(Duration::from_millis(20));
        t2.cancel();
    });
    let got = session.lock_with(
        "q",
        Duration::from_secs(30),
        &LockOptions::new().cancel(token),
    );
    c.join().unwrap();
    assert!(matches!(got, Err(Error::Cancelled)), "{got:?}");
    let got = session.lock_with(
        "q",
        Duration::from_secs(30),
        &LockOptions::new().deadline(Instant::now() + Duration::from_millis(20)),
    );
    assert!(matches!(got, Err(Error::DeadlineExceeded)), "{got:?}");
    drop(session);
    assert_eq!(
        h.join().unwrap(),
        0,
        "nothing was granted, nothing released"
    );
}

#[test]
fn eight_concurrent_releases_send_one_release() {
    let (addr, h) = peer(KEEPALIVE_MS, |p| {
        let a = p.expect(wire::OP_ACQUIRE);
        p.reply(a.rid, Status::Ok, 50);
        let r = p.expect(wire::OP_RELEASE);
        p.reply(r.rid, Status::Ok, 0);
        1 + p
            .drain()
            .iter()
            .filter(|f| f.op == wire::OP_RELEASE)
            .count()
    });
    let session = connect(addr);
    let lease = session.lock("eight", Duration::from_secs(5)).unwrap();
    let barrier = Arc::new(Barrier::new(8));
    let ok = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (lease, barrier, ok) = (lease.clone(), barrier.clone(), ok.clone());
            thread::spawn(move || {
                barrier.wait();
                if lease.release().is_ok() {
                    ok.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(
        ok.load(Ordering::SeqCst),
        8,
        "every caller gets the first result"
    );
    drop((lease, session));
    assert_eq!(h.join().unwrap(), 1, "one Release frame");
}

#[test]
fn stale_answers_are_losses_and_an_unanswered_release_is_bounded() {
    let (addr, h) = peer(KEEPALIVE_MS, |p| {
        // A lease whose Extend finds it gone, then a Release answered stale.
        let a = p.expect(wire::OP_ACQUIRE);
        p.reply(a.rid, Status::Ok, 60);
        let e = p.expect(wire::OP_EXTEND);
        assert_eq!((e.token, e.ttl_ms), (60, 1_000));
        p.reply(e.rid, Status::Stale, 0);
        let b = p.expect(wire::OP_ACQUIRE);
        p.reply(b.rid, Status::Ok, 61);
        let r = p.expect(wire::OP_RELEASE);
        p.reply(r.rid, Status::Stale, 0);
        // A Release that is never answered.
        let c = p.expect(wire::OP_ACQUIRE);
        p.reply(c.rid, Status::Ok, 62);
        let _ = p.expect(wire::OP_RELEASE);
        p.drain()
    });
    let session = connect(addr);
    let seen: Seen = Default::default();
    let (tx, rx) = mpsc::channel();
    let lease = session
        .acquire(
            "s",
            Acquire {
                hold: Hold::Lease(Duration::from_secs(1)),
                wait: Wait::Try,
                ..Acquire::default()
            },
            &recording("lease", &seen, &tx),
        )
        .unwrap();
    let err = lease.extend().unwrap_err();
    assert_eq!(err.lost().expect("lost").reason(), LostReason::NotHeld);
    rx.recv_timeout(Duration::from_secs(30))
        .expect("handler ran");
    assert!(matches!(lease.release(), Err(Error::Lost(_))));

    drop(lease);

    let lease = session.lock("s2", Duration::from_secs(5)).unwrap();
    let err = lease.release().unwrap_err();
    assert!(err.to_string().contains("stale_token"), "{err}");
    drop(lease);

    let lease = session.lock("s3", Duration::from_secs(5)).unwrap();
    let err = lease.release().unwrap_err();
    assert!(matches!(err, Error::Unreleased { .. }), "{err:?}");
    assert!(err.to_string().contains("release timeout"), "{err}");
    drop((lease, session));
    assert!(h.join().unwrap().is_empty());
}

#[test]
fn a_grant_lost_at_once_is_never_held_silently() {
    for _ in 0..20 {
        let (addr, h) = peer(KEEPALIVE_MS, |p| {
            let a = p.expect(wire::OP_ACQUIRE);
            // Grant and push in one write: the push may be read before the
            // caller has wrapped its grant in a lease.
            let mut b = Vec::new();
            wire::encode_reply(a.rid, Status::Ok, 70, wire::NO_TTL, &mut b);
            wire::encode_lost(b"now", 70, LostWhy::Reset, &mut b);
            p.s.write_all(&b).unwrap();
            p.drain()
        });
        let session = connect(addr);
        let (tx, rx) = mpsc::channel();
        let opts = LockOptions::new().on_lost(move |_, lost| {
            let _ = tx.send(lost.reason());
        });
        match session.lock_with("now", Duration::from_secs(5), &opts) {
            Err(Error::Lost(lost)) => assert_eq!(lost.reason(), LostReason::Reset),
            Ok(lease) => {
                assert_eq!(
                    rx.recv_timeout(Duration::from_secs(30)),
                    Ok(LostReason::Reset),
                    "a lease handed out is told"
                );
                assert!(matches!(lease.release(), Err(Error::Lost(_))));
            }
            Err(e) => panic!("{e}"),
        }
        drop(session);
        assert!(
            h.join().unwrap().is_empty(),
            "no Release for a pushed-out hold"
        );
    }
}

#[test]
fn bad_arguments_are_refused_before_any_traffic() {
    let (addr, h) = peer(KEEPALIVE_MS, |p| p.drain());
    let session = connect(addr);
    let long = "k".repeat(128);
    for key in ["", long.as_str()] {
        assert!(matches!(
            session.lock(key, Duration::from_secs(1)),
            Err(Error::InvalidKey(_))
        ));
    }
    assert!(matches!(
        session.lock("k", Duration::ZERO),
        Err(Error::InvalidTimeout)
    ));
    for ttl in [Duration::from_millis(99), Duration::from_secs(61)] {
        let err = session
            .acquire(
                "k",
                Acquire {
                    hold: Hold::Lease(ttl),
                    wait: Wait::Try,
                    ..Acquire::default()
                },
                &LockOptions::new(),
            )
            .unwrap_err();
        assert!(err.is_usage(), "{err:?}");
        assert!(err.to_string().contains("this server's bounds"), "{err}");
    }
    drop(session);
    assert!(h.join().unwrap().is_empty(), "nothing reached the server");

    let err = Session::builder("127.0.0.1:99999").connect().unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let err = Session::builder("127.0.0.1:1")
        .source(vec![b's'; 256])
        .connect()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("a source is at most 255 bytes, got 256"),
        "{err}"
    );
}

#[test]
fn a_server_without_sessions_is_named_as_such() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let h = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        // A Locking-Center server refuses an unknown action with `-`.
        let mut b = [0u8; 12];
        s.read_exact(&mut b).unwrap();
        s.write_all(b"-").unwrap();
    });
    let err = Session::builder(addr)
        .retry(RetryPolicy::none())
        .connect()
        .unwrap_err();
    h.join().unwrap();
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("does not speak the session protocol"),
        "{err}"
    );

    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let err = Session::builder(closed)
        .retry(RetryPolicy::none())
        .connect()
        .unwrap_err();
    assert!(
        err.to_string().contains("unavailable after 1 attempt"),
        "{err}"
    );
}

#[test]
fn a_lease_granted_after_a_long_wait_is_extended_before_it_is_handed_out() {
    // K = 300 ms: a Ping every 100 ms; the lease's TTL is 100 ms.
    let (addr, h) = peer(300, |p| {
        let a = p.expect(wire::OP_ACQUIRE);
        assert_eq!((a.hold, a.ttl_ms, a.wait_ms), (2, 100, wire::WAIT_FOREVER));
        // Two Pings later, more than the TTL has passed since the Acquire
        // was sent: `sent + ttl` is over before the grant arrives.
        let seen = p.pings;
        p.pings_until(seen + 2);
        p.reply(a.rid, Status::Ok, 80);
        let e = p.expect(wire::OP_EXTEND);
        assert_eq!((e.token, e.ttl_ms), (80, 100));
        p.reply(e.rid, Status::Ok, 0);
        let r = p.expect(wire::OP_RELEASE);
        p.reply(r.rid, Status::Ok, 0);
        p.drain()
    });
    let session = Session::builder(addr)
        .keepalive(Duration::from_millis(300))
        .retry(RetryPolicy::none())
        .connect()
        .unwrap();
    let lease = session
        .acquire(
            "late",
            Acquire {
                hold: Hold::Lease(Duration::from_millis(100)),
                wait: Wait::Forever,
                ..Acquire::default()
            },
            &LockOptions::new(),
        )
        .expect("a late grant is a grant, not an instant loss");
    assert!(lease.lost().is_none());
    lease.release().expect("released normally");
    drop((lease, session));
    assert!(h.join().unwrap().is_empty());
}

/// A one-connection server that reads a Hello and answers `answer` (with
/// the Hello's rid patched in), then closes.
fn refusing_server(answer: Vec<u8>) -> (SocketAddr, thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let h = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut head = [0u8; wire::HEADER];
        s.read_exact(&mut head).unwrap();
        assert_eq!(head[0], wire::OP_HELLO);
        let mut body = vec![0u8; u16::from_le_bytes([head[5], head[6]]) as usize];
        s.read_exact(&mut body).unwrap();
        assert_eq!(body[0], wire::VERSION, "the client's version first");
        let mut a = answer;
        a[1..5].copy_from_slice(&head[1..5]);
        s.write_all(&a).unwrap();
    });
    (addr, h)
}

#[test]
fn a_server_of_other_versions_is_reported_with_the_versions_it_speaks() {
    let mut a = Vec::new();
    wire::encode_refusal(0, Status::UnsupportedVersion, &[2, 3], &mut a);
    let (addr, h) = refusing_server(a);
    // Final: no retry would change the answer (the fake accepts once).
    let err = Session::builder(addr).connect().unwrap_err();
    h.join().unwrap();
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("unsupported version (this client speaks session protocol version 1, the server speaks versions 2, 3)"),
        "{msg}"
    );
}

#[test]
fn a_reserved_not_leader_answer_means_try_another_address() {
    let mut a = Vec::new();
    wire::encode_refusal(0, Status::NotLeader, b"10.0.0.9:22119", &mut a);
    let (addr, h) = refusing_server(a);
    let err = Session::builder(addr)
        .retry(RetryPolicy::none())
        .connect()
        .unwrap_err();
    h.join().unwrap();
    let msg = err.to_string();
    assert!(
        msg.contains("unavailable after 1 attempt") && msg.contains("the leader is 10.0.0.9:22119"),
        "{msg}"
    );
}
