//! The session protocol (actions 7..=12) against the real server: hold
//! modes, keep-alive, leases, Lost pushes, owner-checked release and
//! extend, server-side wait deadlines, Cancel, fencing tokens across
//! restarts, KEYX. Raw frames over TCP, encoded by
//! `ringlock::protocol::session`.

mod common;

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::{once, Server, TempDir};
use ringlock::protocol::session::{
    self as sp, Answer, HoldMode, LostWhy, Req, Status, WAIT_FOREVER,
};

struct Sess {
    s: TcpStream,
    buf: Vec<u8>,
    next: u32,
    welcome: sp::Welcome,
    /// Answers read while looking for another one.
    stash: VecDeque<Answer>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Got {
    status: Status,
    token: u64,
    ttl_left_ms: Option<u32>,
}

impl Sess {
    fn open(addr: SocketAddr, keepalive_ms: u32) -> Sess {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_nodelay(true).expect("nodelay");
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let mut x = Sess {
            s,
            buf: Vec::new(),
            next: 1,
            welcome: sp::Welcome {
                status: Status::Invalid,
                version: 0,
                keepalive_ms: 0,
                min_ttl_ms: 0,
                max_ttl_ms: 0,
                session_id: 0,
                max_keys: 0,
                max_waiters: 0,
                shards: 0,
                flags: 0,
            },
            stash: VecDeque::new(),
        };
        let rid = x.send(&Req::Hello {
            version: sp::VERSION,
            keepalive_ms,
            auth: b"",
        });
        match x.read(Some(rid)).expect("hello answered") {
            Answer::Welcome { welcome, .. } => x.welcome = welcome,
            other => panic!("hello answered {other:?}"),
        }
        assert_eq!(x.welcome.status, Status::Ok);
        x
    }

    fn send(&mut self, req: &Req<'_>) -> u32 {
        let rid = self.next;
        self.next += 1;
        let mut b = Vec::new();
        sp::encode(rid, req, &mut b);
        self.s.write_all(&b).expect("send");
        rid
    }

    /// The next message from the server; `None` at EOF.
    fn read(&mut self, hello: Option<u32>) -> Option<Answer> {
        loop {
            if let Some((a, n)) = sp::decode_answer(&self.buf, hello).expect("well-formed answer") {
                self.buf.drain(..n);
                return Some(a);
            }
            let mut chunk = [0u8; 4096];
            match self.s.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// The reply to `rid`; other messages are stashed in arrival order.
    fn reply(&mut self, rid: u32) -> Got {
        if let Some(i) = self
            .stash
            .iter()
            .position(|a| matches!(a, Answer::Reply { rid: r, .. } if *r == rid))
        {
            return got(self.stash.remove(i).expect("found"));
        }
        loop {
            let a = self.read(None).expect("connection open");
            match &a {
                Answer::Reply { rid: r, .. } if *r == rid => return got(a),
                _ => self.stash.push_back(a),
            }
        }
    }

    fn acquire(&mut self, key: &str, hold: HoldMode, ttl_ms: u32, wait_ms: u32) -> Got {
        let rid = self.send(&Req::Acquire {
            hold,
            ttl_ms,
            wait_ms,
            key: key.as_bytes(),
            source: b"test",
            access: ringlock::protocol::session::Access::Exclusive,
        });
        self.reply(rid)
    }

    fn release(&mut self, key: &str, token: u64) -> Status {
        let rid = self.send(&Req::Release {
            token,
            key: key.as_bytes(),
        });
        self.reply(rid).status
    }

    fn extend(&mut self, key: &str, token: u64, ttl_ms: u32) -> Got {
        let rid = self.send(&Req::Extend {
            token,
            ttl_ms,
            key: key.as_bytes(),
        });
        self.reply(rid)
    }

    fn ping(&mut self) -> Status {
        let rid = self.send(&Req::Ping);
        self.reply(rid).status
    }

    /// The next unsolicited message (stashed or new).
    fn next_push(&mut self) -> Answer {
        if let Some(a) = self.stash.pop_front() {
            return a;
        }
        self.read(None).expect("connection open")
    }
}

fn got(a: Answer) -> Got {
    match a {
        Answer::Reply {
            status,
            token,
            ttl_left_ms,
            ..
        } => Got {
            status,
            token,
            ttl_left_ms,
        },
        other => panic!("not a reply: {other:?}"),
    }
}

fn start(extra: &[&str]) -> Server {
    Server::start(extra)
}

fn keyx(admin: SocketAddr) -> Vec<ringlock::protocol::admin::KeyInfo> {
    let mut s = TcpStream::connect(admin).expect("admin");
    s.write_all(b"KEYX").expect("send");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some((keys, _)) = ringlock::protocol::admin::decode_keyx(&buf).expect("KEYX answer")
        {
            return keys;
        }
        let n = s.read(&mut chunk).expect("read");
        assert!(n > 0, "admin closed before the KEYX answer");
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[test]
fn session_lock_tokens_and_owner_checks() {
    let srv = start(&[]);
    let mut a = Sess::open(srv.lock_addr, 0);
    let mut b = Sess::open(srv.lock_addr, 0);
    assert_eq!(a.welcome.keepalive_ms, 10_000, "server default");
    // The Hello reply publishes the limits and the lease bounds.
    assert_eq!(
        (a.welcome.min_ttl_ms, a.welcome.max_ttl_ms),
        (10, 86_400_000)
    );
    assert_eq!(
        (a.welcome.max_keys, a.welcome.max_waiters),
        (100_000, 100_000)
    );
    assert!(a.welcome.shards >= 1);
    let g = a.acquire("k", HoldMode::Session, 0, 0);
    assert_eq!(g.status, Status::Ok);
    assert!(g.token > 0);
    assert_eq!(g.ttl_left_ms, None);
    // Held by someone else.
    assert_eq!(b.acquire("k", HoldMode::Session, 0, 0).status, Status::Busy);
    // A wrong token changes nothing; the right one from another session is
    // not that session's to release.
    assert_eq!(b.release("k", g.token + 1), Status::Stale);
    assert_eq!(b.release("k", g.token), Status::NotOwner);
    assert_eq!(b.acquire("k", HoldMode::Session, 0, 0).status, Status::Busy);
    // Extend applies to leases only.
    assert_eq!(a.extend("k", g.token, 1000).status, Status::Invalid);
    assert_eq!(a.release("k", g.token), Status::Ok);
    assert_eq!(a.release("k", g.token), Status::Stale, "released once only");
    let g2 = b.acquire("k", HoldMode::Session, 0, 0);
    assert_eq!(g2.status, Status::Ok);
    assert!(g2.token > g.token, "tokens increase per key");
    // A Locking-Center client sees the session's hold.
    assert_eq!(
        once(srv.lock_addr, &common::frame(5, b"k", Some(b""))),
        b'#'
    );
}

#[test]
fn closing_the_session_grants_the_next_waiter_at_once() {
    let srv = start(&[]);
    let mut a = Sess::open(srv.lock_addr, 0);
    let mut b = Sess::open(srv.lock_addr, 0);
    let ga = a.acquire("k", HoldMode::Session, 0, WAIT_FOREVER);
    assert_eq!(ga.status, Status::Ok);
    let rid = b.send(&Req::Acquire {
        hold: HoldMode::Session,
        ttl_ms: 0,
        wait_ms: WAIT_FOREVER,
        key: b"k",
        source: b"",
        access: ringlock::protocol::session::Access::Exclusive,
    });
    // b is queued (answered only later); a ping on the same connection is
    // not stuck behind it.
    assert_eq!(b.ping(), Status::Ok);
    drop(a);
    let gb = b.reply(rid);
    assert_eq!(gb.status, Status::Ok);
    assert!(gb.token > ga.token);
}

#[test]
fn a_persistent_hold_outlives_its_session() {
    let srv = start(&[]);
    let mut a = Sess::open(srv.lock_addr, 0);
    let g = a.acquire("p", HoldMode::Persistent, 0, 0);
    assert_eq!(g.status, Status::Ok);
    drop(a);
    let mut b = Sess::open(srv.lock_addr, 0);
    // Still held after the session closed ...
    for _ in 0..3 {
        assert_eq!(b.acquire("p", HoldMode::Session, 0, 0).status, Status::Busy);
    }
    // ... and its token is the capability to release it.
    assert_eq!(b.release("p", g.token), Status::Ok);
    assert_eq!(b.acquire("p", HoldMode::Session, 0, 0).status, Status::Ok);
}

#[test]
fn missed_keepalives_end_the_session_and_free_its_keys() {
    let srv = start(&[]);
    let mut a = Sess::open(srv.lock_addr, 300);
    assert_eq!(a.welcome.keepalive_ms, 300);
    let ga = a.acquire("k", HoldMode::Session, 0, 0);
    assert_eq!(ga.status, Status::Ok);
    let mut b = Sess::open(srv.lock_addr, 0);
    // a says nothing more: its deadline passes, the server closes it and
    // b (waiting without deadline) is granted.
    let gb = b.acquire("k", HoldMode::Session, 0, WAIT_FOREVER);
    assert_eq!(gb.status, Status::Ok);
    assert!(gb.token > ga.token);
    assert!(
        a.read(None).is_none(),
        "the server closed the silent session"
    );
}

#[test]
fn keepalive_requests_are_clamped_to_the_servers_bounds() {
    let srv = start(&["--min-keepalive-ms", "500", "--max-keepalive-ms", "2000"]);
    assert_eq!(Sess::open(srv.lock_addr, 1).welcome.keepalive_ms, 500);
    assert_eq!(Sess::open(srv.lock_addr, 99_999).welcome.keepalive_ms, 2000);
}

#[test]
fn lease_expiry_pushes_lost_before_the_next_grant() {
    let srv = start(&[]);
    let mut a = Sess::open(srv.lock_addr, 0);
    let g = a.acquire("lease", HoldMode::Lease, 200, 0);
    assert_eq!(g.status, Status::Ok);
    let left = g.ttl_left_ms.expect("a lease has a TTL");
    assert!(left <= 200);
    // The same session queues for the key again: on one connection the
    // order of the Lost push and the next grant is observable.
    let rid = a.send(&Req::Acquire {
        hold: HoldMode::Session,
        ttl_ms: 0,
        wait_ms: WAIT_FOREVER,
        key: b"lease",
        source: b"",
        access: ringlock::protocol::session::Access::Exclusive,
    });
    match a.next_push() {
        Answer::Lost { key, token, why } => {
            assert_eq!(key, b"lease");
            assert_eq!(token, g.token);
            assert_eq!(why, LostWhy::Expired);
        }
        other => panic!("expected Lost first, got {other:?}"),
    }
    let g2 = a.reply(rid);
    assert_eq!(g2.status, Status::Ok);
    assert!(g2.token > g.token);
    // The expired token is stale now.
    assert_eq!(a.extend("lease", g.token, 1000).status, Status::Stale);
    assert_eq!(a.release("lease", g.token), Status::Stale);
}

#[test]
fn extend_keeps_a_lease_alive_and_a_stale_token_cannot() {
    let srv = start(&[]);
    let mut a = Sess::open(srv.lock_addr, 0);
    let mut b = Sess::open(srv.lock_addr, 0);
    let g = a.acquire("x", HoldMode::Lease, 300, 0);
    assert_eq!(g.status, Status::Ok);
    // Out-of-bounds TTLs are invalid and change nothing.
    assert_eq!(a.extend("x", g.token, 1).status, Status::Invalid);
    assert_eq!(a.extend("x", g.token, u32::MAX - 1).status, Status::Invalid);
    assert_eq!(b.extend("x", g.token + 1, 60_000).status, Status::Stale);
    // Extended far beyond its first TTL, by whoever names the token.
    let e = b.extend("x", g.token, 60_000);
    assert_eq!(e.status, Status::Ok);
    assert_eq!(e.ttl_left_ms, Some(60_000));
    let keys = keyx(srv.admin_addr);
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].token, g.token);
    assert_eq!(keys[0].mode, HoldMode::Lease);
    assert!(keys[0].lease_left_ms.expect("lease") > 300);
    // b waits 500 ms (past the first TTL): the lease holds, b times out.
    let t = b.acquire("x", HoldMode::Session, 0, 500);
    assert_eq!(t.status, Status::TimedOut);
    assert_eq!(a.release("x", g.token), Status::Ok);
}

#[test]
fn server_side_wait_deadline_and_exact_cancel() {
    let srv = start(&[]);
    let mut a = Sess::open(srv.lock_addr, 0);
    let mut b = Sess::open(srv.lock_addr, 0);
    let g = a.acquire("k", HoldMode::Session, 0, 0);
    assert_eq!(
        b.acquire("k", HoldMode::Session, 0, 50).status,
        Status::TimedOut
    );
    // A queued Acquire cancelled: it is answered `cancelled`, the Cancel ok.
    let rid = b.send(&Req::Acquire {
        hold: HoldMode::Session,
        ttl_ms: 0,
        wait_ms: WAIT_FOREVER,
        key: b"k",
        source: b"",
        access: ringlock::protocol::session::Access::Exclusive,
    });
    let c = b.send(&Req::Cancel {
        target: rid,
        key: b"k",
    });
    assert_eq!(b.reply(rid).status, Status::Cancelled);
    assert_eq!(b.reply(c).status, Status::Ok);
    // Nothing left queued: a's release grants nobody, the key is free.
    assert_eq!(a.release("k", g.token), Status::Ok);
    let mut c2 = Sess::open(srv.lock_addr, 0);
    assert_eq!(c2.acquire("k", HoldMode::Session, 0, 0).status, Status::Ok);
    // A Cancel of something already answered: not queued.
    let c = b.send(&Req::Cancel {
        target: rid,
        key: b"k",
    });
    assert_eq!(b.reply(c).status, Status::NotQueued);
}

#[test]
fn a_reset_pushes_lost_to_the_holder() {
    let srv = start(&[]);
    let mut a = Sess::open(srv.lock_addr, 0);
    let g = a.acquire("r", HoldMode::Session, 0, 0);
    assert_eq!(g.status, Status::Ok);
    // A Locking-Center ResetByKey (one-shot connection).
    assert_eq!(once(srv.lock_addr, &common::frame(3, b"r", None)), b'+');
    match a.next_push() {
        Answer::Lost { token, why, .. } => {
            assert_eq!(token, g.token);
            assert_eq!(why, LostWhy::Reset);
        }
        other => panic!("expected Lost, got {other:?}"),
    }
    assert_eq!(a.release("r", g.token), Status::Stale);
}

#[test]
fn bad_input_is_invalid_or_closes_and_changes_nothing() {
    let srv = start(&[]);
    let mut a = Sess::open(srv.lock_addr, 0);
    // A TTL on a session hold, a key of 0 bytes: invalid, the session lives.
    assert_eq!(
        a.acquire("k", HoldMode::Session, 5, 0).status,
        Status::Invalid
    );
    a.s.write_all(&[8, 42, 0, 0, 0, 11, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
        .expect("send");
    assert_eq!(a.reply(42).status, Status::Invalid);
    assert_eq!(a.ping(), Status::Ok);
    // A second Hello is invalid too.
    let rid = a.send(&Req::Hello {
        version: 1,
        keepalive_ms: 0,
        auth: b"",
    });
    assert_eq!(a.reply(rid).status, Status::Invalid);
    // Locking-Center frames are not accepted on a session: the framing is
    // lost, the server closes.
    a.s.write_all(&common::frame(5, b"k", Some(b"")))
        .expect("send");
    assert!(a.read(None).is_none());
    // Nothing was taken.
    assert_eq!(
        once(srv.lock_addr, &common::frame(5, b"k", Some(b""))),
        b'+'
    );
    // A Hello after Persist is not a first frame: `-` and close.
    let mut c = common::Conn::persistent(srv.lock_addr);
    let mut b = Vec::new();
    sp::encode(
        1,
        &Req::Hello {
            version: 1,
            keepalive_ms: 0,
            auth: b"",
        },
        &mut b,
    );
    c.send(&b);
    assert_eq!(c.read_byte_or_eof(), Some(b'-'));
}

#[test]
fn tokens_increase_across_restarts_in_memory_mode() {
    let mut srv = start(&[]);
    let mut a = Sess::open(srv.lock_addr, 0);
    let t1 = a.acquire("m", HoldMode::Persistent, 0, 0).token;
    drop(a);
    srv.kill9();
    let srv = start(&[]);
    let mut a = Sess::open(srv.lock_addr, 0);
    let t2 = a.acquire("m", HoldMode::Persistent, 0, 0).token;
    assert!(t2 > t1, "{t2} after restart, {t1} before");
}

#[test]
fn durable_leases_survive_kill9_and_session_holds_do_not() {
    let dir = TempDir::new("sess-durable");
    let path = dir.path("wal");
    let p = path.to_str().expect("utf-8 path");
    let mut srv = start(&["--data-path", p]);
    let mut a = Sess::open(srv.lock_addr, 0);
    let lease = a.acquire("lease", HoldMode::Lease, 60_000, 0);
    let sess = a.acquire("sess", HoldMode::Session, 0, 0);
    let pers = a.acquire("pers", HoldMode::Persistent, 0, 0);
    for g in [lease, sess, pers] {
        assert_eq!(g.status, Status::Ok);
    }
    let e = a.extend("lease", lease.token, 120_000);
    assert_eq!(e.status, Status::Ok);
    srv.kill9();
    let srv = start(&["--data-path", p]);
    let keys = keyx(srv.admin_addr);
    let names: Vec<_> = keys.iter().map(|k| k.key_lossy()).collect();
    assert_eq!(
        names,
        ["lease", "pers"],
        "the session hold died with its session"
    );
    let l = &keys[0];
    assert_eq!(l.token, lease.token);
    assert_eq!(l.mode, HoldMode::Lease);
    // The extend was durable before its answer: more than the first TTL.
    assert!(
        l.lease_left_ms.expect("lease") > 60_000,
        "{:?}",
        l.lease_left_ms
    );
    let mut b = Sess::open(srv.lock_addr, 0);
    assert_eq!(
        b.acquire("lease", HoldMode::Session, 0, 0).status,
        Status::Busy
    );
    let g = b.acquire("sess", HoldMode::Session, 0, 0);
    assert_eq!(g.status, Status::Ok);
    assert!(
        g.token > pers.token,
        "tokens keep increasing after a restart"
    );
    // The restored lease is extended and released by its token.
    assert_eq!(b.extend("lease", lease.token, 1000).status, Status::Ok);
    assert_eq!(b.release("lease", lease.token), Status::Ok);
}

#[test]
fn one_session_across_every_shard() {
    // Keys spread over 4 shards; the sessions live on whichever shard
    // accepted them, so most requests cross the shard mesh both ways.
    let srv = start(&["--threads", "4"]);
    let keys: Vec<String> = (0..32).map(|i| format!("key-{i}")).collect();
    let mut a = Sess::open(srv.lock_addr, 0);
    let mut b = Sess::open(srv.lock_addr, 0);
    let mut tokens = Vec::new();
    for k in &keys {
        let g = a.acquire(k, HoldMode::Session, 0, 0);
        assert_eq!(g.status, Status::Ok, "{k}");
        tokens.push(g.token);
    }
    let rids: Vec<u32> = keys
        .iter()
        .map(|k| {
            b.send(&Req::Acquire {
                hold: HoldMode::Lease,
                ttl_ms: 300,
                wait_ms: WAIT_FOREVER,
                key: k.as_bytes(),
                source: b"",
                access: ringlock::protocol::session::Access::Exclusive,
            })
        })
        .collect();
    assert_eq!(b.ping(), Status::Ok);
    // The end of a's session reaches every shard: b gets every key.
    drop(a);
    let mut leases = Vec::new();
    for (i, rid) in rids.iter().enumerate() {
        let g = b.reply(*rid);
        assert_eq!(g.status, Status::Ok);
        assert!(g.token > tokens[i]);
        leases.push(g.token);
    }
    // Every lease expires on its own shard and pushes Lost to b's home.
    let mut lost = std::collections::HashSet::new();
    while lost.len() < keys.len() {
        match b.next_push() {
            Answer::Lost { key, token, why } => {
                assert_eq!(why, LostWhy::Expired);
                let i = keys
                    .iter()
                    .position(|k| k.as_bytes() == key)
                    .expect("known key");
                assert_eq!(token, leases[i]);
                assert!(lost.insert(i), "one Lost per lease");
            }
            other => panic!("expected Lost, got {other:?}"),
        }
    }
    assert!(keyx(srv.admin_addr).is_empty());
}

#[test]
fn a_session_frame_that_never_completes_ends_the_session() {
    let srv = start(&["--frame-timeout-ms", "200"]);
    let mut a = Sess::open(srv.lock_addr, 0);
    assert_eq!(a.acquire("k", HoldMode::Session, 0, 0).status, Status::Ok);
    // Three bytes of a frame header, then nothing.
    a.s.write_all(&[12, 1, 0]).expect("send");
    let mut b = Sess::open(srv.lock_addr, 0);
    assert_eq!(
        b.acquire("k", HoldMode::Session, 0, WAIT_FOREVER).status,
        Status::Ok
    );
    assert!(a.read(None).is_none(), "the server closed the session");
}

#[test]
fn one_api_for_both_backends_is_a_change_of_address() {
    use ringlock::lease::{self, Locker};
    let srv = start(&[]);
    let addr = srv.lock_addr.to_string();
    let a: Box<dyn Locker> = ringlock::backend::connect(&addr).expect("a ringlockd session");
    let b: Box<dyn Locker> = ringlock::backend::connect(&addr).expect("another session");
    let l = a.try_lock("shared-api").expect("try").expect("free");
    assert!(
        l.token().is_some(),
        "ringlockd leases carry a fencing token"
    );
    assert!(b.try_lock("shared-api").expect("try").is_none(), "held");
    l.release().expect("release");
    let l2 = b.try_lock("shared-api").expect("try").expect("free again");
    assert!(l2.token() > l.token());
    // A mysql:// address picks the MySQL backend (or says the build has
    // none): never a ringlockd session.
    let mysql_built = std::hint::black_box(ringlock::mysql::ENABLED);
    match ringlock::backend::connect("mysql://nobody@127.0.0.1:1") {
        Err(lease::Error::InvalidArgument(msg)) if !mysql_built => {
            assert!(msg.contains("feature"), "{msg}")
        }
        Err(e) => assert!(mysql_built, "without the mysql feature: {e}"),
        Ok(_) => assert!(mysql_built, "a mysql:// address made a session"),
    }
}

/// The shard count the suite runs with (`RINGLOCK_TEST_THREADS`, default 1).
fn threads() -> usize {
    std::env::var("RINGLOCK_TEST_THREADS").map_or(1, |n| n.parse().expect("a shard count"))
}

/// A key other than `of` owned by the same shard (`same`) or another one.
fn key_near(of: &str, same: bool, shards: usize) -> String {
    let home = ringlock::shard::owner(of.as_bytes(), shards);
    (0..)
        .map(|i| format!("other-{i}"))
        .find(|k| (ringlock::shard::owner(k.as_bytes(), shards) == home) == same)
        .expect("some key")
}

/// Reads raw bytes until `n` whole answer frames arrived; `None` at EOF.
fn raw_frames(s: &mut TcpStream, n: usize) -> Option<Vec<Vec<u8>>> {
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while buf.len() >= sp::HEADER {
            let len = sp::HEADER + u16::from_le_bytes([buf[5], buf[6]]) as usize;
            if buf.len() < len {
                break;
            }
            out.push(buf.drain(..len).collect());
        }
        if out.len() >= n {
            return Some(out);
        }
        match s.read(&mut chunk) {
            Ok(0) => return None,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// Writes `bytes` on a fresh connection and reads until the server closes.
fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    s.write_all(bytes).expect("send");
    let mut out = Vec::new();
    s.read_to_end(&mut out)
        .expect("read until the server closes");
    out
}

#[test]
fn a_cancel_needs_the_rid_and_the_key_whatever_the_shard() {
    let shards = threads();
    let srv = start(&["--metrics-bind", "127.0.0.1:0"]);
    let mut h = Sess::open(srv.lock_addr, 0);
    let mut b = Sess::open(srv.lock_addr, 0);
    assert_eq!(h.acquire("k", HoldMode::Session, 0, 0).status, Status::Ok);
    let rid = b.send(&Req::Acquire {
        hold: HoldMode::Session,
        ttl_ms: 0,
        wait_ms: WAIT_FOREVER,
        key: b"k",
        source: b"",
        access: ringlock::protocol::session::Access::Exclusive,
    });
    common::wait_metric(srv.metrics(), "ringlock_queued_waiters", 1.0);
    // The right rid with another key: not queued, whether that key lives on
    // the Acquire's shard or on another one, and the Acquire stays queued.
    let mut wrong = vec![key_near("k", true, shards)];
    if shards > 1 {
        wrong.push(key_near("k", false, shards));
    }
    for other in &wrong {
        let c = b.send(&Req::Cancel {
            target: rid,
            key: other.as_bytes(),
        });
        assert_eq!(
            b.next_push(),
            Answer::Reply {
                rid: c,
                status: Status::NotQueued,
                token: 0,
                ttl_left_ms: None
            },
            "a Cancel naming {other:?} (the Acquire is on k, {shards} shards)"
        );
    }
    assert_eq!(
        common::metric(srv.metrics(), "ringlock_queued_waiters"),
        1.0,
        "still queued"
    );
    // Another rid with the right key: not queued either.
    let c = b.send(&Req::Cancel {
        target: rid + 1000,
        key: b"k",
    });
    assert_eq!(b.next_push().clone(), reply_of(c, Status::NotQueued));
    // Both right: the Acquire is answered `cancelled`, then the Cancel `ok`,
    // in that order on the wire.
    let c = b.send(&Req::Cancel {
        target: rid,
        key: b"k",
    });
    assert_eq!(b.next_push(), reply_of(rid, Status::Cancelled));
    assert_eq!(b.next_push(), reply_of(c, Status::Ok));
    common::wait_metric(srv.metrics(), "ringlock_queued_waiters", 0.0);
}

fn reply_of(rid: u32, status: Status) -> Answer {
    Answer::Reply {
        rid,
        status,
        token: 0,
        ttl_left_ms: None,
    }
}

#[test]
fn a_hello_of_another_version_is_told_the_versions_spoken_then_closed() {
    let srv = start(&[]);
    // Version 2 with version 1's layout, version 0, and a version 9 Hello
    // laid out differently (3 body bytes): all told "I speak 1", framed,
    // with the Hello's rid; then the server closes.
    for (version, body) in [
        (2u8, &[2u8, 0, 0, 0, 0][..]),
        (0, &[0, 0, 0, 0, 0][..]),
        (9, &[9, 1, 2][..]),
    ] {
        let mut hello = vec![sp::OP_HELLO, 0x44, 0x33, 0x22, 0x11, body.len() as u8, 0];
        hello.extend_from_slice(body);
        let got = raw_exchange(srv.lock_addr, &hello);
        assert_eq!(
            got,
            [0x80, 0x44, 0x33, 0x22, 0x11, 3, 0, 11, 1, 1],
            "version {version}"
        );
        match sp::decode_answer(&got, Some(0x1122_3344)) {
            Ok(Some((
                Answer::Refused {
                    rid,
                    status,
                    detail,
                },
                10,
            ))) => {
                assert_eq!(rid, 0x1122_3344);
                assert_eq!(status, Status::UnsupportedVersion);
                assert_eq!(detail, sp::VERSIONS);
            }
            other => panic!("{other:?}"),
        }
    }
    // A version 1 Hello whose body is malformed (short, trailing bytes,
    // empty): a plain `invalid` Reply (20 bytes on the wire), then close.
    for body in [
        &[1u8, 0, 0][..],
        &[1, 0, 0, 0, 0, 1, b'x', b'y'][..],
        &[][..],
    ] {
        let mut hello = vec![sp::OP_HELLO, 5, 0, 0, 0, body.len() as u8, 0];
        hello.extend_from_slice(body);
        let got = raw_exchange(srv.lock_addr, &hello);
        let mut want = Vec::new();
        sp::encode_reply(5, Status::Invalid, 0, sp::NO_TTL, &mut want);
        assert_eq!(want.len(), 20);
        assert_eq!(got, want, "hello body {body:02x?}");
    }
    // Nothing of it became a session: the server still serves sessions.
    assert_eq!(Sess::open(srv.lock_addr, 0).ping(), Status::Ok);
}

#[test]
fn the_hello_is_framed_its_reply_echoes_its_rid_and_rid_zero_is_ordinary() {
    let srv = start(&[]);
    let mut s = TcpStream::connect(srv.lock_addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut b = Vec::new();
    sp::encode(
        0xA1B2_C3D4,
        &Req::Hello {
            version: 1,
            keepalive_ms: 0,
            auth: b"",
        },
        &mut b,
    );
    // rid 0 for a request: answered as a Reply (kind 0x80) with rid 0, which
    // a Lost push (kind 0x81, also rid 0) cannot be mistaken for.
    sp::encode(0, &Req::Ping, &mut b);
    s.write_all(&b).expect("send");
    let frames = raw_frames(&mut s, 2).expect("two answers");
    // The 32-byte body of version 1, then this version's flags byte.
    assert_eq!(frames[0][..7], [0x80, 0xD4, 0xC3, 0xB2, 0xA1, 33, 0]);
    assert_eq!(frames[0].len(), 7 + sp::WELCOME_BODY + 1);
    let mut pong = Vec::new();
    sp::encode_reply(0, Status::Ok, 0, sp::NO_TTL, &mut pong);
    assert_eq!(frames[1], pong);
}

#[test]
fn session_id_carries_the_home_shard_in_its_top_byte() {
    let shards = threads();
    let srv = start(&[]);
    let mut seen = std::collections::HashSet::new();
    let mut homes = std::collections::HashSet::new();
    for _ in 0..16 {
        let w = Sess::open(srv.lock_addr, 0).welcome;
        assert_eq!(w.shards as usize, shards);
        let home = (w.session_id >> 56) as usize;
        assert!(home < shards, "{:#x}", w.session_id);
        assert_ne!(w.session_id & ((1 << 56) - 1), 0);
        assert!(seen.insert(w.session_id), "session ids are unique");
        homes.insert(home);
    }
    if shards == 1 {
        assert_eq!(homes, [0].into());
    }
}

#[test]
fn malformed_session_bodies_answer_invalid_and_change_nothing() {
    let srv = start(&[]);
    let mut a = Sess::open(srv.lock_addr, 0);
    let g = a.acquire("m", HoldMode::Lease, 5_000, 0);
    assert_eq!(g.status, Status::Ok);
    let mut frames: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut enc = |what, req: &Req<'_>, extra: &[u8]| {
        let mut b = Vec::new();
        sp::encode(77, req, &mut b);
        b.extend_from_slice(extra);
        let blen = (b.len() - sp::HEADER) as u16;
        b[5..7].copy_from_slice(&blen.to_le_bytes());
        frames.push((what, b));
    };
    enc(
        "a Release with trailing bytes",
        &Req::Release {
            token: g.token,
            key: b"m",
        },
        &[0],
    );
    enc("a Ping with a body", &Req::Ping, &[1]);
    enc(
        "an Extend below --min-ttl-ms",
        &Req::Extend {
            token: g.token,
            ttl_ms: a.welcome.min_ttl_ms - 1,
            key: b"m",
        },
        &[],
    );
    enc(
        "an Extend above --max-ttl-ms",
        &Req::Extend {
            token: g.token,
            ttl_ms: a.welcome.max_ttl_ms + 1,
            key: b"m",
        },
        &[],
    );
    enc(
        "a lease Acquire with TTL 0",
        &Req::Acquire {
            hold: HoldMode::Lease,
            ttl_ms: 0,
            wait_ms: 0,
            key: b"n",
            source: b"",
            access: ringlock::protocol::session::Access::Exclusive,
        },
        &[],
    );
    // Key sizes: 1..=127 bytes (the size byte is unsigned on a session;
    // 128..=255 are out of range). A source may be 0..=255 bytes: any size
    // byte says a valid one (tests/proclaim.rs takes a 255-byte one).
    let mut long_key = vec![8, 77, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 128];
    long_key.extend_from_slice(&[b'k'; 128]);
    long_key.push(0);
    let blen = (long_key.len() - sp::HEADER) as u16;
    long_key[5..7].copy_from_slice(&blen.to_le_bytes());
    frames.push(("a 128-byte key", long_key));
    for (what, b) in &frames {
        a.s.write_all(b).expect("send");
        assert_eq!(a.next_push(), reply_of(77, Status::Invalid), "{what}");
    }
    // Nothing changed: the lease is held with its first TTL, n is free.
    let keys = keyx(srv.admin_addr);
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(
        (keys[0].key.as_slice(), keys[0].token),
        (&b"m"[..], g.token)
    );
    assert!(keys[0].lease_left_ms.expect("a lease") <= 5_000);
    assert_eq!(a.ping(), Status::Ok);
}

#[test]
fn a_lease_ttl_starts_at_its_grant_not_at_its_arrival() {
    let srv = start(&["--metrics-bind", "127.0.0.1:0"]);
    let mut h = Sess::open(srv.lock_addr, 0);
    let mut b = Sess::open(srv.lock_addr, 0);
    let gh = h.acquire("t", HoldMode::Session, 0, 0);
    let rid = b.send(&Req::Acquire {
        hold: HoldMode::Lease,
        ttl_ms: 300,
        wait_ms: WAIT_FOREVER,
        key: b"t",
        source: b"",
        access: ringlock::protocol::session::Access::Exclusive,
    });
    common::wait_metric(srv.metrics(), "ringlock_queued_waiters", 1.0);
    // Queued for longer than its TTL: what is measured here, not a wait
    // for something to happen.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(h.release("t", gh.token), Status::Ok);
    let g = b.reply(rid);
    assert_eq!(g.status, Status::Ok);
    assert_eq!(g.ttl_left_ms, Some(300), "the whole TTL, from the grant");
    let held = keyx(srv.admin_addr);
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].token, g.token);
}

#[test]
fn owner_checks_of_extend_and_release_by_token() {
    let srv = start(&[]);
    let mut a = Sess::open(srv.lock_addr, 0);
    let mut b = Sess::open(srv.lock_addr, 0);
    // Another session's session hold: not the owner, for Extend and Release.
    let s = a.acquire("s", HoldMode::Session, 0, 0);
    assert_eq!(b.extend("s", s.token, 1_000).status, Status::NotOwner);
    assert_eq!(b.release("s", s.token), Status::NotOwner);
    // Its own session hold: Extend is only for leases.
    assert_eq!(a.extend("s", s.token, 1_000).status, Status::Invalid);
    // A lease released by token from another session: ok, and its holder is
    // pushed nothing (only expiry and operator resets push Lost).
    let l = a.acquire("l", HoldMode::Lease, 60_000, 0);
    assert_eq!(b.release("l", l.token), Status::Ok);
    assert_eq!(a.ping(), Status::Ok);
    assert!(a.stash.is_empty(), "no Lost: {:?}", a.stash);
    assert_eq!(a.release("l", l.token), Status::Stale);
}

#[test]
fn a_reset_of_a_persistent_hold_pushes_lost_to_its_live_session() {
    let srv = start(&[]);
    let mut a = Sess::open(srv.lock_addr, 0);
    let g = a.acquire("p", HoldMode::Persistent, 0, 0);
    assert_eq!(g.status, Status::Ok);
    assert_eq!(once(srv.lock_addr, &common::frame(3, b"p", None)), b'+');
    assert_eq!(
        a.next_push(),
        Answer::Lost {
            key: b"p".to_vec(),
            token: g.token,
            why: LostWhy::Reset
        }
    );
    // Once its session ended, a persistent hold has nobody to tell.
    let g = a.acquire("p", HoldMode::Persistent, 0, 0);
    assert_eq!(g.status, Status::Ok);
    drop(a);
    let mut b = Sess::open(srv.lock_addr, 0);
    assert_eq!(b.acquire("p", HoldMode::Session, 0, 0).status, Status::Busy);
    assert_eq!(once(srv.lock_addr, &common::frame(3, b"p", None)), b'+');
    assert_eq!(b.acquire("p", HoldMode::Session, 0, 0).status, Status::Ok);
}

#[test]
fn a_half_close_ends_the_session_at_once() {
    let srv = start(&["--metrics-bind", "127.0.0.1:0"]);
    let mut a = Sess::open(srv.lock_addr, 0);
    let mut b = Sess::open(srv.lock_addr, 0);
    assert_eq!(a.acquire("h", HoldMode::Session, 0, 0).status, Status::Ok);
    let rid = b.send(&Req::Acquire {
        hold: HoldMode::Session,
        ttl_ms: 0,
        wait_ms: WAIT_FOREVER,
        key: b"h",
        source: b"",
        access: ringlock::protocol::session::Access::Exclusive,
    });
    common::wait_metric(srv.metrics(), "ringlock_queued_waiters", 1.0);
    a.s.shutdown(std::net::Shutdown::Write).expect("half-close");
    // Like a close: a's session hold goes to b, and a reads EOF.
    assert_eq!(b.reply(rid).status, Status::Ok);
    assert!(a.read(None).is_none(), "the server closed the session");
}

#[test]
fn every_frame_renews_the_keepalive_even_one_answered_invalid() {
    let srv = start(&[]);
    let mut a = Sess::open(srv.lock_addr, 1_000);
    assert_eq!(a.welcome.keepalive_ms, 1_000);
    // Three keep-alive windows of nothing but refused frames (a Ping with a
    // body), one every 200 ms: the session lives on them.
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_millis(3_000) {
        a.s.write_all(&[sp::OP_PING, 9, 0, 0, 0, 1, 0, 0])
            .expect("send");
        assert_eq!(a.next_push(), reply_of(9, Status::Invalid));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(a.ping(), Status::Ok);
}

/// The example tokens docs/protocol.md shows ("A whole session, byte by
/// byte"): the run's real tokens (memory mode: Unix µs at start) are
/// replaced by them before the comparison.
const DOC_TOKENS: [u64; 2] = [1_754_000_000_000_123, 1_754_000_000_000_124];

/// Field groups as hex, `|` between header and body (the document's form).
fn doc_hex(frame: &[u8], groups: &[usize]) -> String {
    let mut out = String::new();
    let mut at = 0;
    for (i, &n) in groups.iter().enumerate() {
        if i == 3 {
            out.push_str(" |");
        }
        if !out.is_empty() {
            out.push(' ');
        }
        for b in &frame[at..at + n] {
            out.push_str(&format!("{b:02x}"));
        }
        at += n;
    }
    assert_eq!(at, frame.len(), "groups cover the frame");
    out
}

/// The `C `/`S ` lines of the document's example, bytes in order.
fn documented_example() -> Vec<(char, Vec<u8>)> {
    let doc = include_str!("../docs/protocol.md");
    let begin = doc
        .find("<!-- session-example:begin -->")
        .expect("the example's begin mark");
    let end = doc
        .find("<!-- session-example:end -->")
        .expect("the example's end mark");
    doc[begin..end]
        .lines()
        .filter_map(|l| {
            let (dir, rest) = l.split_once(' ')?;
            let dir = match dir {
                "C" => 'C',
                "S" => 'S',
                _ => return None,
            };
            let hex: String = rest.chars().filter(|c| c.is_ascii_hexdigit()).collect();
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect();
            Some((dir, bytes))
        })
        .collect()
}

#[test]
fn the_documented_session_example_is_what_the_server_says() {
    // One shard and a fresh server: session ids 1 and 2, in order.
    let srv = start(&["--threads", "1", "--metrics-bind", "127.0.0.1:0"]);
    let mut s = TcpStream::connect(srv.lock_addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    s.set_nodelay(true).expect("nodelay");
    let mut log: Vec<(char, Vec<u8>, &[usize])> = Vec::new();
    let send = |s: &mut TcpStream, log: &mut Vec<_>, rid, req: &Req<'_>, g| {
        let mut b = Vec::new();
        sp::encode(rid, req, &mut b);
        s.write_all(&b).expect("send");
        log.push(('C', b, g));
    };
    let recv = |s: &mut TcpStream, log: &mut Vec<(char, Vec<u8>, &[usize])>, g| {
        let f = raw_frames(s, 1).expect("an answer").remove(0);
        log.push(('S', f.clone(), g));
        f
    };
    const HELLO: &[usize] = &[1, 4, 2, 1, 4];
    const WELCOME: &[usize] = &[1, 4, 2, 1, 1, 4, 4, 4, 8, 4, 4, 2, 1];
    const REPLY: &[usize] = &[1, 4, 2, 1, 8, 4];
    const ACQUIRE: &[usize] = &[1, 4, 2, 1, 4, 4, 1, 3, 1, 2];
    const EXTEND: &[usize] = &[1, 4, 2, 8, 4, 1, 3];
    const LOST: &[usize] = &[1, 4, 2, 8, 1, 1, 3];
    const RELEASE: &[usize] = &[1, 4, 2, 8, 1, 3];
    send(
        &mut s,
        &mut log,
        1,
        &Req::Hello {
            version: 1,
            keepalive_ms: 10_000,
            auth: b"",
        },
        HELLO,
    );
    recv(&mut s, &mut log, WELCOME);
    // Another session holds "job", so the Acquire waits.
    let mut other = Sess::open(srv.lock_addr, 0);
    assert_eq!(other.welcome.session_id, 2);
    assert_eq!(
        other.acquire("job", HoldMode::Session, 0, 0).status,
        Status::Ok
    );
    let acquire = |hold, ttl_ms, wait_ms| Req::Acquire {
        hold,
        ttl_ms,
        wait_ms,
        key: b"job",
        source: b"w1",
        access: ringlock::protocol::session::Access::Exclusive,
    };
    send(
        &mut s,
        &mut log,
        2,
        &acquire(HoldMode::Lease, 30_000, WAIT_FOREVER),
        ACQUIRE,
    );
    common::wait_metric(srv.metrics(), "ringlock_queued_waiters", 1.0);
    drop(other);
    let g = recv(&mut s, &mut log, REPLY);
    let t1 = u64::from_le_bytes(g[8..16].try_into().unwrap());
    let extend = Req::Extend {
        token: t1,
        ttl_ms: 100,
        key: b"job",
    };
    send(&mut s, &mut log, 3, &extend, EXTEND);
    recv(&mut s, &mut log, REPLY);
    // Not extended again: it expires 100 ms later.
    recv(&mut s, &mut log, LOST);
    send(
        &mut s,
        &mut log,
        4,
        &acquire(HoldMode::Session, 0, 0),
        ACQUIRE,
    );
    let g = recv(&mut s, &mut log, REPLY);
    let t2 = u64::from_le_bytes(g[8..16].try_into().unwrap());
    assert!(t2 > t1);
    let release = Req::Release {
        token: t2,
        key: b"job",
    };
    send(&mut s, &mut log, 5, &release, RELEASE);
    recv(&mut s, &mut log, REPLY);

    // The run's tokens become the document's.
    let swap = |b: &mut Vec<u8>| {
        for (real, doc) in [t1, t2].into_iter().zip(DOC_TOKENS) {
            let (r, d) = (real.to_le_bytes(), doc.to_le_bytes());
            for i in 0..b.len().saturating_sub(7) {
                if b[i..i + 8] == r {
                    b[i..i + 8].copy_from_slice(&d);
                }
            }
        }
    };
    let mut shown = String::new();
    let mut got = Vec::new();
    for (dir, mut b, groups) in log {
        swap(&mut b);
        shown.push_str(&format!("{dir} {}\n", doc_hex(&b, groups)));
        got.push((dir, b));
    }
    assert_eq!(
        documented_example(),
        got,
        "docs/protocol.md's example differs from the server's bytes; this run's lines:\n{shown}"
    );
}

#[test]
fn a_reset_by_source_answers_its_queued_acquires_cancelled_without_a_cancel() {
    let srv = start(&["--metrics-bind", "127.0.0.1:0"]);
    let mut h = Sess::open(srv.lock_addr, 0);
    let mut b = Sess::open(srv.lock_addr, 0);
    let g = h.acquire("rs", HoldMode::Session, 0, 0);
    assert_eq!(g.status, Status::Ok);
    for how in ["lock-port ResetBySource", "admin RSBS"] {
        let rid = b.send(&Req::Acquire {
            hold: HoldMode::Session,
            ttl_ms: 0,
            wait_ms: WAIT_FOREVER,
            key: b"rs",
            source: b"w9",
            access: ringlock::protocol::session::Access::Exclusive,
        });
        common::wait_metric(srv.metrics(), "ringlock_queued_waiters", 1.0);
        if how.starts_with("lock") {
            assert_eq!(once(srv.lock_addr, &common::frame(4, b"w9", None)), b'+');
        } else {
            assert_eq!(
                common::admin_names(srv.admin_addr, b"RSBS", &[b"w9"]),
                b"++"
            );
        }
        // The Acquire's own answer, though this session sent no Cancel; the
        // session goes on, and the holder (another source) keeps the key.
        assert_eq!(b.next_push(), reply_of(rid, Status::Cancelled), "{how}");
        assert_eq!(b.ping(), Status::Ok);
        common::wait_metric(srv.metrics(), "ringlock_queued_waiters", 0.0);
        let held = keyx(srv.admin_addr);
        assert_eq!((held.len(), held[0].token), (1, g.token), "{how}");
    }
    assert_eq!(h.ping(), Status::Ok);
    assert!(h.stash.is_empty(), "the holder was pushed {:?}", h.stash);
}

#[test]
fn any_number_of_requests_may_be_outstanding_on_one_session() {
    const N: u32 = 300;
    let srv = start(&[
        "--metrics-bind",
        "127.0.0.1:0",
        "--max-waiters",
        &N.to_string(),
    ]);
    let mut h = Sess::open(srv.lock_addr, 0);
    let mut b = Sess::open(srv.lock_addr, 0);
    let g = h.acquire("many", HoldMode::Session, 0, 0);
    assert_eq!(g.status, Status::Ok);
    // N Acquires of one held key and N Pings, interleaved, in one write.
    let mut bytes = Vec::new();
    for i in 0..N {
        let acquire = Req::Acquire {
            hold: HoldMode::Session,
            ttl_ms: 0,
            wait_ms: WAIT_FOREVER,
            key: b"many",
            source: b"",
            access: ringlock::protocol::session::Access::Exclusive,
        };
        sp::encode(10_000 + i, &acquire, &mut bytes);
        sp::encode(20_000 + i, &Req::Ping, &mut bytes);
    }
    b.s.write_all(&bytes).expect("send");
    // Every Ping is answered while the Acquires wait, in the order sent.
    for i in 0..N {
        assert_eq!(b.next_push(), reply_of(20_000 + i, Status::Ok));
    }
    common::wait_metric(srv.metrics(), "ringlock_queued_waiters", f64::from(N));
    // The queued Acquires count against --max-waiters (server-wide).
    let over = b.send(&Req::Acquire {
        hold: HoldMode::Session,
        ttl_ms: 0,
        wait_ms: WAIT_FOREVER,
        key: b"many",
        source: b"",
        access: ringlock::protocol::session::Access::Exclusive,
    });
    assert_eq!(b.reply(over).status, Status::Limit);
    // FIFO among them: the release grants the first one sent.
    assert_eq!(h.release("many", g.token), Status::Ok);
    match b.next_push() {
        Answer::Reply {
            rid, status, token, ..
        } => assert_eq!((rid, status), (10_000, Status::Ok), "token {token}"),
        other => panic!("expected the first Acquire's grant, got {other:?}"),
    }
}

#[test]
fn a_session_that_does_not_read_its_answers_is_ended() {
    let srv = start(&[]);
    let mut h = Sess::open(srv.lock_addr, 0);
    let mut b = Sess::open(srv.lock_addr, 0);
    assert_eq!(
        h.acquire("unread", HoldMode::Session, 0, 0).status,
        Status::Ok
    );
    let rid = b.send(&Req::Acquire {
        hold: HoldMode::Session,
        ttl_ms: 0,
        wait_ms: WAIT_FOREVER,
        key: b"unread",
        source: b"",
        access: ringlock::protocol::session::Access::Exclusive,
    });
    // h sends Pings and never reads a Pong: once the kernel's buffers are
    // full, the Pongs the server cannot send pile up, and past 64 KiB of
    // them it ends h's session; h's session hold goes to b. (The server
    // stops reading h then, so the writer ends on its write timeout.)
    let mut w = h.s.try_clone().expect("clone");
    w.set_write_timeout(Some(Duration::from_secs(2)))
        .expect("write timeout");
    let flood = std::thread::spawn(move || {
        let mut chunk = Vec::new();
        for _ in 0..10_000 {
            sp::encode(7, &Req::Ping, &mut chunk);
        }
        // At most 64 MiB of Pings (far more than any kernel buffers).
        for _ in 0..(64 << 20) / chunk.len() {
            if w.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    let g = b.reply(rid);
    assert_eq!(g.status, Status::Ok, "b was granted: h's session ended");
    flood.join().expect("flood thread");
    assert_eq!(b.ping(), Status::Ok);
}

#[test]
fn a_sessions_keepalive_is_fixed_by_its_hello() {
    let srv = start(&["--metrics-bind", "127.0.0.1:0"]);
    let mut a = Sess::open(srv.lock_addr, 1_000);
    assert_eq!(a.welcome.keepalive_ms, 1_000);
    // A second Hello asking for 10 minutes: invalid, and it changes nothing.
    let rid = a.send(&Req::Hello {
        version: 1,
        keepalive_ms: 600_000,
        auth: b"",
    });
    assert_eq!(a.reply(rid).status, Status::Invalid);
    // Silent from now on: the server ends the session after the first
    // keep-alive (1 s), well within the 20 s read timeout, not after 600 s.
    assert!(a.read(None).is_none(), "the server closed the session");
    common::wait_metric(srv.metrics(), "ringlock_sessions_expired_total", 1.0);
}

#[test]
fn a_cancel_of_a_try_or_of_an_unknown_rid_is_not_queued() {
    let srv = start(&[]);
    let mut a = Sess::open(srv.lock_addr, 0);
    let mut b = Sess::open(srv.lock_addr, 0);
    let try_of = |key: &'static [u8]| Req::Acquire {
        hold: HoldMode::Session,
        ttl_ms: 0,
        wait_ms: 0,
        key,
        source: b"",
        access: ringlock::protocol::session::Access::Exclusive,
    };
    // A try that is granted, its Cancel pipelined right behind it: the
    // grant comes first and stands, the Cancel is not queued.
    let rid = a.send(&try_of(b"try"));
    let c = a.send(&Req::Cancel {
        target: rid,
        key: b"try",
    });
    let g = match a.next_push() {
        Answer::Reply {
            rid: r,
            status: Status::Ok,
            token,
            ..
        } if r == rid => token,
        other => panic!("expected the try's grant first, got {other:?}"),
    };
    assert_eq!(a.next_push(), reply_of(c, Status::NotQueued));
    assert_eq!(keyx(srv.admin_addr)[0].token, g);
    // A try that finds the key held: busy at once, never queued.
    let rid = b.send(&try_of(b"try"));
    let c = b.send(&Req::Cancel {
        target: rid,
        key: b"try",
    });
    assert_eq!(b.next_push(), reply_of(rid, Status::Busy));
    assert_eq!(b.next_push(), reply_of(c, Status::NotQueued));
    // A rid this session never used.
    let c = b.send(&Req::Cancel {
        target: 0xDEAD_BEEF,
        key: b"try",
    });
    assert_eq!(b.next_push(), reply_of(c, Status::NotQueued));
    // `ttl_ms` with a hold that is not a lease: invalid, nothing taken.
    assert_eq!(
        b.acquire("p", HoldMode::Persistent, 5, 0).status,
        Status::Invalid
    );
    assert_eq!(keyx(srv.admin_addr).len(), 1);
}

/// One round of a request racing a loss decided by the key's shard: either
/// the request is decided first (`ok`, and no Lost for it), or the Lost
/// comes first on the wire and the request is answered `stale token`.
/// Returns whether the Lost came first.
fn lost_before_stale(s: &mut Sess, rid: u32, key: &[u8], token: u64, why: LostWhy) -> bool {
    match s.next_push() {
        Answer::Lost {
            key: k,
            token: t,
            why: w,
        } => {
            assert_eq!(
                (k.as_slice(), t, w),
                (key, token, why),
                "a Lost of this round"
            );
            assert_eq!(
                s.next_push(),
                Answer::Reply {
                    rid,
                    status: Status::Stale,
                    token: 0,
                    ttl_left_ms: None
                },
                "after the Lost, the request it overtook is stale"
            );
            true
        }
        Answer::Reply { rid: r, status, .. } => {
            assert_eq!((r, status), (rid, Status::Ok), "decided before the loss");
            false
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_lost_push_comes_before_the_answer_to_a_request_it_overtook() {
    let dir = TempDir::new("lost-order");
    let wal = dir.path("ringlock.wal");
    let wal = wal.to_str().expect("utf-8 path");
    for extra in [&[][..], &["--data-path", wal][..]] {
        let srv = start(extra);
        let mut a = Sess::open(srv.lock_addr, 0);
        let mut outcomes = [0u32; 2];
        // A Release racing an operator reset (RSET, on another connection).
        for round in 0..40 {
            let key = format!("order-r{round}");
            let g = a.acquire(&key, HoldMode::Lease, 60_000, 0);
            assert_eq!(g.status, Status::Ok);
            let admin = srv.admin_addr;
            let k = key.clone();
            let reset =
                std::thread::spawn(move || common::admin_names(admin, b"RSET", &[k.as_bytes()]));
            let rid = a.send(&Req::Release {
                token: g.token,
                key: key.as_bytes(),
            });
            let first = lost_before_stale(&mut a, rid, key.as_bytes(), g.token, LostWhy::Reset);
            outcomes[usize::from(first)] += 1;
            assert_eq!(reset.join().expect("reset"), b"++");
        }
        // An Extend racing the lease's expiry (TTL 20 ms, sent 0..40 ms after
        // the grant: the delay is the race, not a wait for something).
        for round in 0..40u64 {
            let key = format!("order-e{round}");
            let g = a.acquire(&key, HoldMode::Lease, 20, 0);
            assert_eq!(g.status, Status::Ok);
            std::thread::sleep(Duration::from_millis(round));
            let rid = a.send(&Req::Extend {
                token: g.token,
                ttl_ms: 20,
                key: key.as_bytes(),
            });
            let first = lost_before_stale(&mut a, rid, key.as_bytes(), g.token, LostWhy::Expired);
            if !first {
                // Extended: it expires 20 ms later, pushed as ever.
                assert_eq!(
                    a.next_push(),
                    Answer::Lost {
                        key: key.into_bytes(),
                        token: g.token,
                        why: LostWhy::Expired
                    }
                );
            }
            outcomes[usize::from(first)] += 1;
        }
        assert_eq!(a.ping(), Status::Ok);
        assert!(a.stash.is_empty(), "stray answers {:?}", a.stash);
        eprintln!(
            "{extra:?}: decided first {}, Lost first {}",
            outcomes[0], outcomes[1]
        );
    }
}
