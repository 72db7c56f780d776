//! Resuming a replicated session (`docs/protocol.md`, "Resuming a session
//! (cluster mode)") against scripted peers on 127.0.0.1: the welcome has
//! the resumable flag, the peer closes the connection, and the client
//! connects again with a Resume, which the peer answers with Held frames
//! and a welcome (or refuses). What the client then keeps, loses, finds
//! granted and sends again is checked on the wire and through the lease
//! API. The peer speaks the protocol with the crate's own codec, as in
//! tests/session_fake.rs; nothing here waits by sleeping: each step waits
//! for a frame, a channel or the session's resume report, all bounded.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ringlock::client::{Access, Acquire, Hold, RetryPolicy, Session, SessionBuilder, Wait};
use ringlock::lease::{Error, LockOptions, LostReason};
use ringlock::protocol::session::{self as wire, Decoded, HoldMode, Req, Status, Welcome};

const SESSION_ID: u64 = 0x0100_0000_0000_002a;
/// Bound on every wait of a test.
const BOUND: Duration = Duration::from_secs(30);

/// One request as a peer saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Frame {
    op: u8,
    rid: u32,
    key: Vec<u8>,
    /// A Release's or Extend's token; a Resume's session id.
    token: u64,
    /// An Acquire's access.
    access: Access,
}

/// The server side of one connection.
struct Peer {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Peer {
    fn accept(l: &TcpListener) -> Peer {
        let (s, _) = l.accept().expect("accept");
        s.set_read_timeout(Some(BOUND)).expect("timeout");
        Peer { s, buf: Vec::new() }
    }

    /// The next request other than a Ping (answered `ok`); `None` at EOF.
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
                        access: Access::Exclusive,
                    };
                    match req {
                        Req::Acquire { key, access, .. } => {
                            f.key = key.to_vec();
                            f.access = access;
                        }
                        Req::Cancel { key, .. } | Req::Watch { key } | Req::Unwatch { key, .. } => {
                            f.key = key.to_vec()
                        }
                        Req::Release { token, key }
                        | Req::Extend { token, key, .. }
                        | Req::Proclaim { token, key, .. } => {
                            f.key = key.to_vec();
                            f.token = token;
                        }
                        Req::Resume { session_id, .. } => f.token = session_id,
                        Req::Ping | Req::Hello { .. } => {}
                    }
                    self.buf.drain(..len);
                    if op == wire::OP_PING {
                        self.reply(rid, Status::Ok, 0);
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

    fn expect(&mut self, op: u8) -> Frame {
        let f = self.next().expect("a request, not EOF");
        assert_eq!(f.op, op, "{f:?}");
        f
    }

    fn reply(&mut self, rid: u32, status: Status, token: u64) {
        let mut b = Vec::new();
        wire::encode_reply(rid, status, token, wire::NO_TTL, &mut b);
        // The client may have closed already (a Ping's answer at the end).
        let _ = self.s.write_all(&b);
    }

    fn welcome(&mut self, rid: u32, keepalive_ms: u32, flags: u8) {
        let mut b = Vec::new();
        wire::encode_welcome(
            rid,
            &Welcome {
                status: Status::Ok,
                version: wire::VERSION,
                keepalive_ms,
                min_ttl_ms: 100,
                max_ttl_ms: 60_000,
                session_id: SESSION_ID,
                max_keys: 1000,
                max_waiters: 1000,
                shards: 1,
                flags,
            },
            &mut b,
        );
        self.s.write_all(&b).expect("welcome");
    }

    /// Opens the session: the Hello, answered with `flags`.
    fn open(l: &TcpListener, keepalive_ms: u32, flags: u8) -> Peer {
        let mut p = Peer::accept(l);
        let hello = p.expect(wire::OP_HELLO);
        p.welcome(hello.rid, keepalive_ms, flags);
        p
    }

    /// Reads the Resume (the connection's first frame, naming the session).
    fn resume_frame(l: &TcpListener) -> (Peer, Frame) {
        let mut p = Peer::accept(l);
        let r = p.expect(wire::OP_RESUME);
        assert_eq!(r.token, SESSION_ID, "the Resume names the session");
        (p, r)
    }

    /// Answers a Resume: one Held frame per hold, then the welcome.
    fn resumed(&mut self, rid: u32, held: &[(&[u8], u64, HoldMode, u32)]) {
        self.resumed_with(rid, held, wire::FLAG_RESUMABLE);
    }

    /// [`resumed`](Self::resumed) with a welcome of these flags.
    fn resumed_with(&mut self, rid: u32, held: &[(&[u8], u64, HoldMode, u32)], flags: u8) {
        let mut b = Vec::new();
        for &(key, token, mode, ttl) in held {
            wire::encode_held(rid, key, token, mode, ttl, &mut b);
        }
        self.s.write_all(&b).expect("held");
        self.welcome(rid, KEEPALIVE_MS, flags);
    }

    /// Closes the connection: the failover.
    fn fail(self) {
        let _ = self.s.shutdown(Shutdown::Both);
    }

    /// Reads until the client closes; the requests it still sent.
    fn drain(&mut self) -> Vec<Frame> {
        std::iter::from_fn(|| self.next()).collect()
    }
}

const KEEPALIVE_MS: u32 = 3_000;

fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    (l, addr)
}

/// A builder whose resume reports come through the returned channel.
fn builder(addr: SocketAddr) -> (SessionBuilder, mpsc::Receiver<String>) {
    builder_of(&[addr])
}

/// As [`builder`], for a session with several addresses.
fn builder_of(addrs: &[SocketAddr]) -> (SessionBuilder, mpsc::Receiver<String>) {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let b = Session::builder(addrs.to_vec())
        .retry(RetryPolicy::none())
        .release_timeout(BOUND)
        .on_resume(move |line| {
            let _ = tx.lock().unwrap().send(line.to_string());
        });
    (b, rx)
}

/// Waits for the resume report containing `what`.
fn report(rx: &mpsc::Receiver<String>, what: &str) -> String {
    loop {
        let line = rx.recv_timeout(BOUND).expect("a resume report");
        if line.contains(what) {
            return line;
        }
    }
}

type Seen = Arc<Mutex<Vec<(String, LostReason, String)>>>;

/// Options whose handler records (key, reason, cause) and signals.
fn recording(seen: &Seen, tx: &mpsc::Sender<()>) -> LockOptions {
    let (seen, tx) = (seen.clone(), tx.clone());
    LockOptions::new().on_lost(move |lease, lost| {
        let cause = lost.cause().map(|c| c.to_string()).unwrap_or_default();
        seen.lock()
            .unwrap()
            .push((lease.key().into(), lost.reason(), cause));
        let _ = tx.send(());
    })
}

#[test]
fn a_resumed_session_keeps_its_listed_holds_and_loses_the_others() {
    let (l, addr) = listener();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let h = thread::spawn(move || {
        let mut p = Peer::open(&l, KEEPALIVE_MS, wire::FLAG_RESUMABLE);
        for token in [10, 11] {
            let a = p.expect(wire::OP_ACQUIRE);
            p.reply(a.rid, Status::Ok, token);
        }
        let lease = p.expect(wire::OP_ACQUIRE);
        assert_eq!(lease.key, b"lease");
        p.reply(lease.rid, Status::Ok, 12);
        p.fail();
        let (mut p, r) = Peer::resume_frame(&l);
        // The test asks for a lock while the resume is under way.
        go_rx.recv_timeout(BOUND).unwrap();
        p.resumed(
            r.rid,
            &[
                (b"kept", 10, HoldMode::Session, wire::NO_TTL),
                (b"lease", 12, HoldMode::Lease, 5_000),
            ],
        );
        // The lock asked for meanwhile comes after the Resume's answer.
        let late = p.expect(wire::OP_ACQUIRE);
        assert_eq!(late.key, b"late");
        p.reply(late.rid, Status::Ok, 13);
        let mut released = Vec::new();
        for _ in 0..3 {
            let rel = p.expect(wire::OP_RELEASE);
            released.push(rel.token);
            p.reply(rel.rid, Status::Ok, 0);
        }
        released.sort_unstable();
        (released, p.drain())
    });
    let (b, reports) = builder(addr);
    let session = b.connect().expect("session opens");
    assert!(session.is_resumable());
    let seen: Seen = Default::default();
    let (tx, rx) = mpsc::channel();
    let kept = session
        .lock_with("kept", BOUND, &recording(&seen, &tx))
        .unwrap();
    let gone = session
        .lock_with("gone", BOUND, &recording(&seen, &tx))
        .unwrap();
    let lease = session
        .acquire(
            "lease",
            Acquire {
                hold: Hold::Lease(Duration::from_secs(5)),
                wait: Wait::Try,
                ..Acquire::default()
            },
            &recording(&seen, &tx),
        )
        .unwrap();
    report(&reports, "resuming");
    let s2 = session.clone();
    let late = thread::spawn(move || s2.lock("late", BOUND));
    go_tx.send(()).unwrap();
    let line = report(&reports, "resumed on");
    assert!(line.contains("2 holds kept, 1 lost"), "{line}");
    rx.recv_timeout(BOUND)
        .expect("the unlisted hold is reported");
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(
            (seen[0].0.as_str(), seen[0].1),
            ("gone", LostReason::ConnectionLost)
        );
        assert!(
            seen[0].2.contains("not kept across the failover"),
            "{seen:?}"
        );
    }
    assert!(matches!(gone.release(), Err(Error::Lost(_))));
    let late = late
        .join()
        .unwrap()
        .expect("a lock asked for while resuming");
    assert_eq!(late.token(), Some(13));
    assert_eq!(session.resumes(), 1);
    assert!(session.ended().is_none());
    assert!(kept.lost().is_none() && lease.lost().is_none());
    kept.release()
        .expect("a kept hold releases on the new connection");
    lease.release().expect("a kept lease too");
    late.release().unwrap();
    assert_eq!(seen.lock().unwrap().len(), 1, "no loss for the kept holds");
    drop((kept, gone, lease, late, session));
    let (released, rest) = h.join().unwrap();
    assert_eq!(released, [10, 12, 13]);
    assert!(rest.is_empty(), "{rest:?}");
}

#[test]
fn a_resumed_session_keeps_each_leases_access_and_asks_again_with_it() {
    // Shared and semaphore holds, a shared Acquire in flight at the
    // failover: a Held frame has no access, so the client keeps its own.
    // The second resume lands on a server without the modes flag.
    let (l, addr) = listener();
    let modes = wire::FLAG_RESUMABLE | wire::FLAG_MODES;
    let h = thread::spawn(move || {
        let mut p = Peer::open(&l, KEEPALIVE_MS, modes);
        for (key, access, token) in [
            (&b"doc"[..], Access::Shared, 20),
            (b"pool", Access::Semaphore(3), 21),
        ] {
            let a = p.expect(wire::OP_ACQUIRE);
            assert_eq!((&a.key[..], a.access), (key, access));
            p.reply(a.rid, Status::Ok, token);
        }
        let queued = p.expect(wire::OP_ACQUIRE);
        assert_eq!(
            (&queued.key[..], queued.access),
            (&b"queued"[..], Access::Shared)
        );
        p.fail();
        let (mut p, r) = Peer::resume_frame(&l);
        let held: [(&[u8], u64, HoldMode, u32); 2] = [
            (b"doc", 20, HoldMode::Session, wire::NO_TTL),
            (b"pool", 21, HoldMode::Session, wire::NO_TTL),
        ];
        p.resumed_with(r.rid, &held, modes);
        let again = p.expect(wire::OP_ACQUIRE);
        assert_eq!(
            (&again.key[..], again.access),
            (&b"queued"[..], Access::Shared),
            "sent again with its access"
        );
        p.reply(again.rid, Status::Ok, 22);
        p.fail();
        let (mut p, r) = Peer::resume_frame(&l);
        let held: [(&[u8], u64, HoldMode, u32); 3] = [
            (b"doc", 20, HoldMode::Session, wire::NO_TTL),
            (b"pool", 21, HoldMode::Session, wire::NO_TTL),
            (b"queued", 22, HoldMode::Session, wire::NO_TTL),
        ];
        p.resumed_with(r.rid, &held, wire::FLAG_RESUMABLE);
        let mut released = Vec::new();
        for _ in 0..3 {
            let rel = p.expect(wire::OP_RELEASE);
            released.push(rel.token);
            p.reply(rel.rid, Status::Ok, 0);
        }
        released.sort_unstable();
        (released, p.drain())
    });
    let (b, reports) = builder(addr);
    let session = b.connect().expect("session opens");
    assert!(session.offers_modes());
    let doc = session.lock_shared("doc", BOUND).unwrap();
    let pool = session.lock_permit("pool", 3, BOUND).unwrap();
    let s2 = session.clone();
    let queued = thread::spawn(move || s2.lock_shared("queued", BOUND));
    report(&reports, "resumed on");
    let queued = queued.join().unwrap().expect("granted after the resume");
    assert_eq!(queued.token(), Some(22));
    report(&reports, "resumed on");
    // (Not `resumes()`: the count follows the report line.)
    assert!(
        !session.offers_modes(),
        "the new server's welcome has no modes flag"
    );
    assert_eq!(
        (doc.access(), pool.access(), queued.access()),
        (Access::Shared, Access::Semaphore(3), Access::Shared)
    );
    assert!(doc.lost().is_none() && pool.lost().is_none() && queued.lost().is_none());
    // Not sent to a server that cannot take it.
    assert!(matches!(
        session.try_lock_shared("more"),
        Err(Error::Unsupported(_))
    ));
    for lease in [&doc, &pool, &queued] {
        lease.release().expect("released on the new connection");
    }
    drop((doc, pool, queued, session));
    let (released, rest) = h.join().unwrap();
    assert_eq!(released, [20, 21, 22]);
    assert!(rest.is_empty(), "nothing else was sent: {rest:?}");
}

#[test]
fn requests_in_flight_are_settled_by_the_held_list() {
    // The session's first address answers the Resume `not leader`, naming
    // its second, which has the session (a plaintext session follows a
    // hint only to an address of its own list: see the next test).
    let (l, addr) = listener();
    let (l2, addr2) = listener();
    let h = thread::spawn(move || {
        let mut p = Peer::open(&l, KEEPALIVE_MS, wire::FLAG_RESUMABLE);
        let rel = p.expect(wire::OP_ACQUIRE);
        p.reply(rel.rid, Status::Ok, 5);
        // In flight when the connection fails: two Acquires and a Release.
        let mut keys = Vec::new();
        for _ in 0..3 {
            let f = p.next().expect("a request");
            keys.push((f.op, f.key));
        }
        keys.sort();
        assert_eq!(
            keys,
            [
                (wire::OP_ACQUIRE, b"again".to_vec()),
                (wire::OP_ACQUIRE, b"granted".to_vec()),
                (wire::OP_RELEASE, b"rel".to_vec()),
            ]
        );
        p.fail();
        let (mut p, r) = Peer::resume_frame(&l);
        let mut b = Vec::new();
        wire::encode_refusal(
            r.rid,
            Status::NotLeader,
            addr2.to_string().as_bytes(),
            &mut b,
        );
        p.s.write_all(&b).unwrap();
        p.fail();
        let (mut p, r) = Peer::resume_frame(&l2);
        // "granted" was granted before the failover; "rel" was released.
        p.resumed(r.rid, &[(b"granted", 77, HoldMode::Session, wire::NO_TTL)]);
        let again = p.expect(wire::OP_ACQUIRE);
        assert_eq!(
            again.key, b"again",
            "only the Acquire not listed is sent again"
        );
        p.reply(again.rid, Status::Ok, 78);
        let mut released = Vec::new();
        for _ in 0..2 {
            let f = p.expect(wire::OP_RELEASE);
            released.push(f.token);
            p.reply(f.rid, Status::Ok, 0);
        }
        released.sort_unstable();
        (released, p.drain())
    });
    let (b, reports) = builder_of(&[addr, addr2]);
    let session = b.connect().expect("session opens");
    let rel = session.lock("rel", BOUND).unwrap();
    let spawn_lock = |key: &'static str| {
        let s = session.clone();
        thread::spawn(move || s.lock(key, BOUND))
    };
    let granted = spawn_lock("granted");
    let again = spawn_lock("again");
    let released = thread::spawn(move || rel.release());
    let line = report(&reports, "resumed on");
    assert!(line.contains(&addr2.to_string()), "{line}");
    assert!(
        line.contains("1 acquires found granted, 1 requests sent again"),
        "{line}"
    );
    released
        .join()
        .unwrap()
        .expect("a Release in flight whose hold is not listed happened");
    let granted = granted.join().unwrap().expect("found granted");
    assert_eq!(granted.token(), Some(77));
    let again = again
        .join()
        .unwrap()
        .expect("granted on the new connection");
    assert_eq!(again.token(), Some(78));
    granted.release().unwrap();
    again.release().unwrap();
    assert_eq!(session.resumes(), 1);
    drop((granted, again, session));
    let (released, rest) = h.join().unwrap();
    assert_eq!(released, [77, 78]);
    assert!(rest.is_empty(), "{rest:?}");
}

#[test]
fn a_plaintext_resume_never_takes_the_session_id_to_an_unlisted_hint() {
    // The session's one address answers the Resume `not leader`, naming a
    // stranger's address: without TLS nobody can verify who listens there,
    // and the Resume would hand it the session id and the auth token.
    let (l, addr) = listener();
    let (stranger, stranger_addr) = listener();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let h = thread::spawn(move || {
        let mut p = Peer::open(&l, 900, wire::FLAG_RESUMABLE);
        let a = p.expect(wire::OP_ACQUIRE);
        p.reply(a.rid, Status::Ok, 5);
        p.fail();
        // Every Resume of the window gets the same hint.
        l.set_nonblocking(true).unwrap();
        loop {
            if done_rx.try_recv().is_ok() {
                return;
            }
            match l.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    let mut p = Peer { s, buf: Vec::new() };
                    if let Some(r) = p.next() {
                        let mut b = Vec::new();
                        wire::encode_refusal(
                            r.rid,
                            Status::NotLeader,
                            stranger_addr.to_string().as_bytes(),
                            &mut b,
                        );
                        let _ = p.s.write_all(&b);
                    }
                }
                Err(_) => thread::sleep(Duration::from_millis(5)),
            }
        }
    });
    let (b, reports) = builder(addr);
    let session = b
        .keepalive(Duration::from_millis(900))
        .auth_token("secret-token")
        .connect()
        .expect("session opens");
    let lease = session.lock("a", BOUND).unwrap();
    let line = report(&reports, "not following the hint");
    assert!(line.contains(&stranger_addr.to_string()), "{line}");
    assert!(line.contains("not TLS"), "{line}");
    // The session ends when its window passes, never resumed.
    let t = Instant::now();
    while session.ended().is_none() {
        assert!(t.elapsed() < BOUND, "the session outlived its window");
        thread::sleep(Duration::from_millis(10));
    }
    done_tx.send(()).unwrap();
    h.join().unwrap();
    stranger.set_nonblocking(true).unwrap();
    assert_eq!(
        stranger.accept().map(drop).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "nothing was sent to the hinted stranger"
    );
    drop((lease, session));
}

#[test]
fn an_unknown_session_ends_the_session_and_every_hold_is_lost() {
    // `unknown session`, and the Locking-Center `-` of a server without
    // Resume, which means the same.
    let mut unknown = Vec::new();
    wire::encode_reply(0, Status::UnknownSession, 0, wire::NO_TTL, &mut unknown);
    for answer in [unknown, b"-".to_vec()] {
        let (l, addr) = listener();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let h = thread::spawn(move || {
            let mut p = Peer::open(&l, KEEPALIVE_MS, wire::FLAG_RESUMABLE);
            let a = p.expect(wire::OP_ACQUIRE);
            p.reply(a.rid, Status::Ok, 10);
            go_rx.recv_timeout(BOUND).unwrap();
            p.fail();
            let (mut p, r) = Peer::resume_frame(&l);
            let mut answer = answer;
            if answer.len() > 1 {
                answer[1..5].copy_from_slice(&r.rid.to_le_bytes());
            }
            p.s.write_all(&answer).unwrap();
            p.drain()
        });
        let (b, reports) = builder(addr);
        let session = b.connect().expect("session opens");
        let seen: Seen = Default::default();
        let (tx, rx) = mpsc::channel();
        let lease = session
            .lock_with("a", BOUND, &recording(&seen, &tx))
            .unwrap();
        go_tx.send(()).unwrap();
        rx.recv_timeout(BOUND).expect("the hold is lost");
        let (reason, cause) = session.ended().expect("the session ended");
        assert_eq!(reason, LostReason::ConnectionLost);
        assert!(
            cause
                .to_string()
                .contains("could not be resumed: unknown session"),
            "{cause}"
        );
        assert_eq!(seen.lock().unwrap()[0].1, LostReason::ConnectionLost);
        report(&reports, "unknown session");
        assert_eq!(session.resumes(), 0);
        assert!(matches!(
            session.lock("again", BOUND),
            Err(Error::Unavailable(_))
        ));
        drop((lease, session));
        assert!(h.join().unwrap().is_empty());
    }
}

#[test]
fn without_the_flag_a_failed_connection_ends_the_session_at_once() {
    let (l, addr) = listener();
    let (l_tx, l_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let h = thread::spawn(move || {
        let mut p = Peer::open(&l, KEEPALIVE_MS, 0);
        let a = p.expect(wire::OP_ACQUIRE);
        p.reply(a.rid, Status::Ok, 10);
        // Once the caller has its lease.
        go_rx.recv_timeout(BOUND).unwrap();
        p.fail();
        l_tx.send(l).unwrap();
    });
    let (b, reports) = builder(addr);
    let session = b.connect().expect("session opens");
    assert!(!session.is_resumable());
    let seen: Seen = Default::default();
    let (tx, rx) = mpsc::channel();
    let _lease = session
        .lock_with("a", BOUND, &recording(&seen, &tx))
        .unwrap();
    go_tx.send(()).unwrap();
    rx.recv_timeout(BOUND).expect("the hold is lost");
    h.join().unwrap();
    let (reason, cause) = session.ended().expect("ended at once");
    assert_eq!(reason, LostReason::ConnectionLost);
    assert!(
        cause.to_string().contains("closed the connection"),
        "{cause}"
    );
    // The session ended before its handlers ran: had it tried to resume,
    // its connection would be waiting in the backlog by now.
    let l = l_rx.recv_timeout(BOUND).unwrap();
    l.set_nonblocking(true).unwrap();
    assert_eq!(
        l.accept().map(drop).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "no Resume was attempted"
    );
    assert_eq!(session.resumes(), 0);
    assert!(reports.try_recv().is_err(), "no resume was reported");
}

#[test]
fn a_resume_stops_when_the_keepalive_window_passes() {
    // K = 300 ms; the peer takes the Resume and never answers it.
    let (l, addr) = listener();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let h = thread::spawn(move || {
        let mut p = Peer::open(&l, 300, wire::FLAG_RESUMABLE);
        let a = p.expect(wire::OP_ACQUIRE);
        p.reply(a.rid, Status::Ok, 10);
        go_rx.recv_timeout(BOUND).unwrap();
        p.fail();
        let (_silent, _) = Peer::resume_frame(&l);
        done_rx.recv_timeout(BOUND).unwrap();
    });
    let (b, reports) = builder(addr);
    let session = b
        .keepalive(Duration::from_millis(300))
        .connect()
        .expect("session opens");
    let seen: Seen = Default::default();
    let (tx, rx) = mpsc::channel();
    let lease = session
        .lock_with("a", BOUND, &recording(&seen, &tx))
        .unwrap();
    go_tx.send(()).unwrap();
    rx.recv_timeout(BOUND)
        .expect("the hold is lost once the window passed");
    let (reason, cause) = session.ended().expect("the session ended");
    assert_eq!(reason, LostReason::ConnectionLost);
    assert!(
        cause
            .to_string()
            .contains("could not be resumed within its keep-alive"),
        "{cause}"
    );
    report(&reports, "could not be resumed");
    assert!(matches!(lease.release(), Err(Error::Lost(_))));
    done_tx.send(()).unwrap();
    h.join().unwrap();
}

/// A listed hold nothing of the client's accounts for (a grant whose
/// Acquire's caller is gone) is released by token on the new connection,
/// as the Python and Go clients do; the holds it knows are kept.
#[test]
fn a_listed_hold_the_client_does_not_know_is_released_by_token() {
    let (l, addr) = listener();
    let h = thread::spawn(move || {
        let mut p = Peer::open(&l, KEEPALIVE_MS, wire::FLAG_RESUMABLE);
        let a = p.expect(wire::OP_ACQUIRE);
        p.reply(a.rid, Status::Ok, 10);
        p.fail();
        let (mut p, r) = Peer::resume_frame(&l);
        p.resumed(
            r.rid,
            &[
                (b"kept", 10, HoldMode::Session, wire::NO_TTL),
                (b"stray", 77, HoldMode::Session, wire::NO_TTL),
            ],
        );
        let stray = p.expect(wire::OP_RELEASE);
        p.reply(stray.rid, Status::Ok, 0);
        let kept = p.expect(wire::OP_RELEASE);
        p.reply(kept.rid, Status::Ok, 0);
        (stray, kept, p.drain())
    });
    let (b, reports) = builder(addr);
    let session = b.connect().expect("session opens");
    let kept = session.lock("kept", BOUND).unwrap();
    report(&reports, "resuming");
    let line = report(&reports, "resumed on");
    assert!(
        line.contains("1 holds kept, 0 lost")
            && line.contains("1 listed holds this client does not know released"),
        "{line}"
    );
    assert!(kept.lost().is_none());
    kept.release().expect("the kept hold releases");
    drop((kept, session));
    let (stray, kept, rest) = h.join().unwrap();
    assert_eq!((stray.key.as_slice(), stray.token), (&b"stray"[..], 77));
    assert_eq!((kept.key.as_slice(), kept.token), (&b"kept"[..], 10));
    assert!(rest.is_empty(), "{rest:?}");
}
