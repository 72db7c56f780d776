//! `ringlock_requests_total` counts both protocols of the lock port and the
//! admin port, with a `protocol` label: the real `ringlockd` on loopback,
//! known session traffic (raw frames: every op, busy, timed out,
//! cancelled, stale, not owner, invalid, refused first frames), Locking-
//! Center and admin traffic, a session ended by its keep-alive, then every
//! `ringlock_requests_total` series of `/metrics` checked against what was
//! done; the real CLI's default (session) traffic; a follower's `not
//! leader` and a Resume in a 3-node cluster.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use common::{admin_names, keys, Server};
use ringlock::protocol::session::{self as sp, Answer, HoldMode, Req, Status, WAIT_FOREVER};

/// Every series of one scrape: `name{labels}` → value.
fn scrape(addr: SocketAddr) -> (String, BTreeMap<String, f64>) {
    let mut c = TcpStream::connect(addr).expect("connect to the metrics port");
    c.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
        .expect("request");
    let mut answer = String::new();
    c.read_to_string(&mut answer).expect("answer");
    let text = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .expect("an HTTP answer");
    let series = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, v) = l.rsplit_once(' ').expect("`series value`");
            (name.to_string(), v.parse().expect("a number"))
        })
        .collect();
    (text, series)
}

/// The `ringlock_requests_total` series of `protocol`: (action, result) →
/// value.
fn requests(series: &BTreeMap<String, f64>, protocol: &str) -> BTreeMap<(String, String), f64> {
    let prefix = format!("ringlock_requests_total{{protocol=\"{protocol}\",action=\"");
    series
        .iter()
        .filter_map(|(name, v)| {
            let rest = name.strip_prefix(&prefix)?;
            let (action, rest) = rest.split_once("\",result=\"")?;
            let result = rest.strip_suffix("\"}")?;
            Some(((action.to_string(), result.to_string()), *v))
        })
        .collect()
}

/// Checks every series of `protocol`: those in `want` exactly, the others 0.
fn check(text: &str, series: &BTreeMap<String, f64>, protocol: &str, want: &[(&str, &str, f64)]) {
    let got = requests(series, protocol);
    assert!(!got.is_empty(), "no {protocol} series in\n{text}");
    for (action, result, n) in want {
        let key = (action.to_string(), result.to_string());
        assert_eq!(
            got.get(&key),
            Some(n),
            "ringlock_requests_total{{protocol=\"{protocol}\",action=\"{action}\",result=\"{result}\"}}\n{text}"
        );
    }
    for ((action, result), v) in &got {
        if !want.iter().any(|(a, r, _)| a == action && r == result) {
            assert_eq!(
                *v, 0.0,
                "{protocol}/{action}/{result} should be 0 after this traffic\n{text}"
            );
        }
    }
}

/// A raw session connection.
struct Sess {
    s: TcpStream,
    buf: Vec<u8>,
    next: u32,
}

impl Sess {
    fn connect(addr: SocketAddr) -> Sess {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_nodelay(true).expect("nodelay");
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        Sess {
            s,
            buf: Vec::new(),
            next: 1,
        }
    }

    /// A session opened with a Hello asking for `keepalive_ms`.
    fn open(addr: SocketAddr, keepalive_ms: u32) -> Sess {
        Sess::open_welcomed(addr, keepalive_ms).0
    }

    /// A session opened with a Hello, and its Welcome.
    fn open_welcomed(addr: SocketAddr, keepalive_ms: u32) -> (Sess, sp::Welcome) {
        let mut x = Sess::connect(addr);
        match x.first(&Req::Hello {
            version: sp::VERSION,
            keepalive_ms,
            auth: b"",
        }) {
            Some(Answer::Welcome { welcome, .. }) => {
                assert_eq!(welcome.status, Status::Ok);
                (x, welcome)
            }
            other => panic!("hello answered {other:?}"),
        }
    }

    fn send(&mut self, req: &Req<'_>) -> u32 {
        let rid = self.next;
        self.next += 1;
        let mut b = Vec::new();
        sp::encode(rid, req, &mut b);
        self.s.write_all(&b).expect("send");
        rid
    }

    /// A connection's first frame and its answer.
    fn first(&mut self, req: &Req<'_>) -> Option<Answer> {
        let rid = self.send(req);
        self.read(Some(rid))
    }

    /// The next message; `None` at EOF.
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

    /// The next Reply: (rid, status, token).
    fn reply(&mut self) -> (u32, Status, u64) {
        match self.read(None) {
            Some(Answer::Reply {
                rid, status, token, ..
            }) => (rid, status, token),
            other => panic!("expected a Reply, got {other:?}"),
        }
    }

    /// One request and its Reply: (status, token).
    fn call(&mut self, req: &Req<'_>) -> (Status, u64) {
        let rid = self.send(req);
        let (r, status, token) = self.reply();
        assert_eq!(r, rid, "answers come in order here");
        (status, token)
    }
}

fn acquire(key: &[u8], hold: HoldMode, ttl_ms: u32, wait_ms: u32) -> Req<'_> {
    Req::Acquire {
        hold,
        ttl_ms,
        wait_ms,
        key,
        source: b"metrics-test",
        access: ringlock::protocol::session::Access::Exclusive,
    }
}

#[test]
fn session_lc_and_admin_traffic_is_counted_by_protocol() {
    let srv = Server::start(&["--metrics-bind", "127.0.0.1:0"]);
    let m = srv.metrics();

    // Before any traffic: every series of each protocol exists, at zero.
    let (text, series) = scrape(m);
    for protocol in ["lc", "admin", "session"] {
        check(&text, &series, protocol, &[]);
    }

    // a holds k1 (a session hold); b is busy, then times out, then queues
    // and cancels.
    let mut a = Sess::open(srv.lock_addr, 0);
    let (st, t1) = a.call(&acquire(b"k1", HoldMode::Session, 0, 0));
    assert_eq!(st, Status::Ok);
    let mut b = Sess::open(srv.lock_addr, 0);
    assert_eq!(
        b.call(&acquire(b"k1", HoldMode::Session, 0, 0)).0,
        Status::Busy
    );
    assert_eq!(
        b.call(&acquire(b"k1", HoldMode::Session, 0, 100)).0,
        Status::TimedOut
    );
    let queued = b.send(&acquire(b"k1", HoldMode::Session, 0, WAIT_FOREVER));
    let cancel = b.send(&Req::Cancel {
        target: queued,
        key: b"k1",
    });
    assert_eq!(b.reply(), (queued, Status::Cancelled, 0));
    assert_eq!(
        b.reply(),
        (cancel, Status::Ok, 0),
        "the Cancel's own answer"
    );
    assert_eq!(
        b.call(&Req::Cancel {
            target: 999,
            key: b"k1"
        })
        .0,
        Status::NotQueued
    );
    // b names a's token: a session hold is its own session's to release.
    assert_eq!(
        b.call(&Req::Release {
            token: t1,
            key: b"k1"
        })
        .0,
        Status::NotOwner
    );
    let release = Req::Release {
        token: t1,
        key: b"k1",
    };
    assert_eq!(a.call(&release).0, Status::Ok);
    assert_eq!(a.call(&release).0, Status::Stale);
    // A lease, extended; a lease TTL out of bounds; a ping; a Ping with a
    // body (invalid); a second Hello (invalid).
    let (st, t2) = a.call(&acquire(b"k2", HoldMode::Lease, 60_000, 0));
    assert_eq!(st, Status::Ok);
    assert_eq!(
        a.call(&Req::Extend {
            token: t2,
            ttl_ms: 60_000,
            key: b"k2"
        })
        .0,
        Status::Ok
    );
    assert_eq!(
        a.call(&acquire(b"k3", HoldMode::Lease, 1, 0)).0,
        Status::Invalid,
        "a TTL under --min-ttl-ms"
    );
    assert_eq!(a.call(&Req::Ping).0, Status::Ok);
    a.s.write_all(&[sp::OP_PING, 50, 0, 0, 0, 1, 0, 0])
        .expect("send");
    assert_eq!(a.reply(), (50, Status::Invalid, 0));
    assert_eq!(
        a.call(&Req::Hello {
            version: sp::VERSION,
            keepalive_ms: 0,
            auth: b""
        })
        .0,
        Status::Invalid
    );

    // First frames refused: a Hello of another version, a Resume of a
    // session this (single) server does not have.
    let mut v = Sess::connect(srv.lock_addr);
    match v.first(&Req::Hello {
        version: 99,
        keepalive_ms: 0,
        auth: b"",
    }) {
        Some(Answer::Refused { status, .. }) => assert_eq!(status, Status::UnsupportedVersion),
        other => panic!("{other:?}"),
    }
    let mut r = Sess::connect(srv.lock_addr);
    match r.first(&Req::Resume {
        version: sp::VERSION,
        session_id: 12345,
        auth: b"",
    }) {
        Some(Answer::Reply { status, .. }) => assert_eq!(status, Status::UnknownSession),
        other => panic!("{other:?}"),
    }

    // c opens a session with the shortest keep-alive and says nothing
    // more: the server ends it.
    let mut c = Sess::open(srv.lock_addr, 300);
    assert!(c.read(None).is_none(), "the server ended c's session");
    common::wait_metric(m, "ringlock_sessions_expired_total", 1.0);

    // Locking-Center traffic, and the admin port.
    let mut l = srv.connect();
    assert_eq!(l.lock(b"lk", b"l"), b'+');
    let mut l2 = srv.connect();
    assert_eq!(l2.try_lock(b"lk", b"l2"), b'#');
    assert_eq!(l.unlock(b"lk"), b'+');
    let mut bad = srv.connect();
    bad.send(&[1, 0]);
    assert_eq!(bad.read_byte_or_eof(), Some(b'-'));
    assert_eq!(keys(srv.admin_addr).len(), 1, "a's lease on k2");
    assert_eq!(admin_names(srv.admin_addr, b"RSET", &[b"nothing"]), b"++");

    let (text, series) = scrape(m);
    check(
        &text,
        &series,
        "session",
        &[
            ("hello", "ok", 3.0), // a, b, c
            ("hello", "invalid", 1.0),
            ("hello", "unsupported_version", 1.0),
            ("resume", "unknown_session", 1.0),
            ("acquire", "ok", 2.0), // k1, k2
            ("acquire", "busy", 1.0),
            ("acquire", "timed_out", 1.0),
            ("acquire", "cancelled", 1.0),
            ("acquire", "invalid", 1.0),
            ("cancel", "ok", 1.0),
            ("cancel", "not_queued", 1.0),
            ("release", "ok", 1.0),
            ("release", "not_owner", 1.0),
            ("release", "stale_token", 1.0),
            ("extend", "ok", 1.0),
            ("ping", "ok", 1.0),
            ("ping", "invalid", 1.0),
        ],
    );
    check(
        &text,
        &series,
        "lc",
        &[
            ("lock", "ok", 1.0),
            ("lock", "error", 1.0), // the frame that does not decode
            ("trylock", "busy", 1.0),
            ("unlock", "ok", 1.0),
        ],
    );
    check(
        &text,
        &series,
        "admin",
        &[("admin_keys", "ok", 1.0), ("admin_rset", "ok", 1.0)],
    );
    assert_eq!(series["ringlock_sessions_opened_total"], 3.0, "{text}");
    assert_eq!(series["ringlock_sessions_expired_total"], 1.0, "{text}");
    // Every ringlock_requests_total series carries a protocol label.
    for name in series.keys() {
        if name.starts_with("ringlock_requests_total") {
            assert!(
                name.starts_with("ringlock_requests_total{protocol=\""),
                "{name}"
            );
        }
    }
    assert!(common::promtool_check_metrics(&text), "promtool:\n{text}");
    drop((a, b, v, r, l, l2, bad));
}

/// The CLI speaks the session protocol by default: its lock shows as
/// session traffic, none as Locking-Center.
#[test]
fn the_clis_default_traffic_is_session_traffic() {
    let srv = Server::start(&["--metrics-bind", "127.0.0.1:0"]);
    let out = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .args(["--addr", &srv.lock_addr.to_string()])
        .args(["--admin-addr", &srv.admin_addr.to_string()])
        .args(["lock", "cli-key", "--", "true"])
        .output()
        .expect("run ringlock");
    assert!(
        out.status.success(),
        "ringlock lock: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The CLI's session ends as it exits; its answers were counted before
    // they went out.
    let (text, series) = scrape(srv.metrics());
    let s = requests(&series, "session");
    for op in ["hello", "acquire", "release"] {
        assert!(
            s[&(op.to_string(), "ok".to_string())] >= 1.0,
            "session {op} ok\n{text}"
        );
    }
    assert!(
        requests(&series, "lc").values().all(|&v| v == 0.0),
        "{text}"
    );
}

/// A follower refuses a Hello `not leader`: counted on the follower; the
/// leader counts its welcome, and a Resume of the replicated session.
#[test]
fn a_followers_not_leader_answer_and_a_resume_are_counted() {
    let c = common::cluster::Cluster::start(3, 1, &["--metrics-bind", "127.0.0.1:0"]);
    let l = c.leader(Duration::from_secs(20));
    let f = (l + 1) % 3;
    let follower = c.nodes[f].as_ref().expect("running");
    let mut s = Sess::connect(follower.lock_addr);
    match s.first(&Req::Hello {
        version: sp::VERSION,
        keepalive_ms: 0,
        auth: b"",
    }) {
        Some(Answer::Refused { status, .. }) => assert_eq!(status, Status::NotLeader),
        other => panic!("{other:?}"),
    }
    let (text, series) = scrape(follower.metrics());
    let got = requests(&series, "session");
    assert_eq!(
        got[&("hello".to_string(), "not_leader".to_string())],
        1.0,
        "{text}"
    );
    // The leader welcomes one, replicated; a second connection takes it
    // over with a Resume.
    let leader = c.nodes[l].as_ref().expect("running");
    let (_a, welcome) = Sess::open_welcomed(leader.lock_addr, 0);
    assert_ne!(
        welcome.flags & sp::FLAG_RESUMABLE,
        0,
        "a replicated session"
    );
    let mut r = Sess::connect(leader.lock_addr);
    match r.first(&Req::Resume {
        version: sp::VERSION,
        session_id: welcome.session_id,
        auth: b"",
    }) {
        Some(Answer::Welcome { welcome: w, .. }) => {
            assert_eq!((w.status, w.session_id), (Status::Ok, welcome.session_id))
        }
        other => panic!("the Resume was answered {other:?}"),
    }
    let (text, series) = scrape(leader.metrics());
    let got = requests(&series, "session");
    for (op, n) in [("hello", 1.0), ("resume", 1.0)] {
        assert_eq!(got[&(op.to_string(), "ok".to_string())], n, "{op}\n{text}");
    }
    assert_eq!(series["ringlock_sessions_resumed_total"], 1.0, "{text}");
}
