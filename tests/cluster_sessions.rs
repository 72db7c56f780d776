//! Replicated sessions on a cluster of three real `ringlockd` processes:
//! a session's holds survive `kill -9` of its leader, the client takes the
//! session over on the new leader with a Resume (every hold listed, none
//! granted to anyone else meanwhile), a session nobody resumes ends after
//! its window, and a session whose connection closes on a serving leader
//! ends there and then. Raw protocol frames, so that what is on the wire
//! is what is checked.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::cluster::{request, Cluster};
use common::fault_proxy::poll_until;
use common::frame;
use ringlock::core::HoldMode;
use ringlock::protocol::session::{self as sp, Access, Answer, Req, Status, Welcome};

const WAIT: Duration = Duration::from_secs(20);

/// `(key, token, mode)` of a Held frame.
type Held = (Vec<u8>, u64, HoldMode);

/// A session connection speaking raw frames.
struct Raw {
    s: TcpStream,
    buf: Vec<u8>,
    next: u32,
}

impl Raw {
    fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_nodelay(true).expect("nodelay");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        Raw {
            s,
            buf: Vec::new(),
            next: 1,
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

    /// The next answer; `None` when the server closed the connection.
    fn read(&mut self, hello_rid: Option<u32>) -> Option<Answer> {
        loop {
            if let Some((a, n)) = sp::decode_answer(&self.buf, hello_rid).expect("well-formed") {
                self.buf.drain(..n);
                return Some(a);
            }
            let mut chunk = [0u8; 4096];
            match self.s.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    fn hello(addr: SocketAddr, keepalive_ms: u32) -> (Raw, Welcome) {
        let mut r = Raw::connect(addr);
        let rid = r.send(&Req::Hello {
            version: sp::VERSION,
            keepalive_ms,
            auth: b"",
        });
        match r.read(Some(rid)) {
            Some(Answer::Welcome { welcome, .. }) => (r, welcome),
            other => panic!("Hello answered {other:?}"),
        }
    }

    /// Sends a Resume: the Held frames, then the welcome (or the refusal).
    fn resume(addr: SocketAddr, sid: u64) -> (Raw, Vec<Held>, Answer) {
        let mut r = Raw::connect(addr);
        let rid = r.send(&Req::Resume {
            version: sp::VERSION,
            session_id: sid,
            auth: b"",
        });
        let mut held = Vec::new();
        loop {
            match r.read(Some(rid)).expect("the Resume is answered") {
                Answer::Held {
                    rid: r2,
                    key,
                    token,
                    hold,
                    ..
                } => {
                    assert_eq!(r2, rid);
                    held.push((key, token, hold));
                }
                other => {
                    held.sort_by(|a, b| a.0.cmp(&b.0));
                    return (r, held, other);
                }
            }
        }
    }

    /// One request and its Reply `(status, token)` (Lost pushes skipped).
    fn call(&mut self, req: &Req<'_>) -> (Status, u64) {
        let rid = self.send(req);
        loop {
            match self.read(None).expect("answered") {
                Answer::Reply {
                    rid: r,
                    status,
                    token,
                    ..
                } if r == rid => return (status, token),
                Answer::Lost { .. } => continue,
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    fn take(&mut self, key: &[u8], hold: HoldMode) -> u64 {
        self.take_as(key, hold, Access::Exclusive)
    }

    /// A try-Acquire of `key` in `access`: its `(status, token)`.
    fn try_as(&mut self, key: &[u8], hold: HoldMode, access: Access) -> (Status, u64) {
        self.call(&Req::Acquire {
            hold,
            ttl_ms: if hold == HoldMode::Lease { 60_000 } else { 0 },
            wait_ms: 0,
            key,
            source: b"resumer",
            access,
        })
    }

    fn take_as(&mut self, key: &[u8], hold: HoldMode, access: Access) -> u64 {
        let (st, token) = self.try_as(key, hold, access);
        assert_eq!(st, Status::Ok, "{key:?} granted");
        token
    }
}

/// A Locking-Center TryLock on node `i`: `+` free, `#` held, `None` when
/// the node does not serve.
fn try_lock(c: &Cluster, i: usize, key: &[u8]) -> Option<u8> {
    request(
        c.lock_addrs[i],
        &frame(5, key, Some(b"other")),
        Duration::from_secs(5),
    )
}

fn welcome_of(a: Answer) -> Welcome {
    match a {
        Answer::Welcome { welcome, .. } => welcome,
        other => panic!("the Resume was answered {other:?}"),
    }
}

/// kill -9 of the leader: the session's holds (a session hold, a lease, a
/// persistent hold) stay held for it, the Resume on the new leader lists
/// each with its token, and the resumed session releases them.
#[test]
fn a_session_survives_kill9_of_its_leader_and_is_resumed() {
    let mut c = Cluster::start(3, common::cluster::test_threads(), &[]);
    let l = c.leader(WAIT);
    let (mut s, w) = Raw::hello(c.lock_addrs[l], 10_000);
    assert_eq!(
        w.flags & sp::FLAG_RESUMABLE,
        sp::FLAG_RESUMABLE,
        "a cluster session is resumable"
    );
    let sid = w.session_id;
    let t_sess = s.take(b"sess-key", HoldMode::Session);
    let t_lease = s.take(b"lease-key", HoldMode::Lease);
    let t_pers = s.take(b"pers-key", HoldMode::Persistent);
    c.kill9(l);
    let l2 = c.leader(WAIT);
    assert_ne!(l2, l);
    // Nobody else gets the session's keys meanwhile.
    for k in [&b"sess-key"[..], b"lease-key", b"pers-key"] {
        assert_eq!(try_lock(&c, l2, k), Some(b'#'), "{k:?} still held");
    }
    // A follower refuses the Resume and names the leader.
    let f = (0..3).find(|&i| i != l && i != l2).expect("a follower");
    let (_, held, a) = Raw::resume(c.lock_addrs[f], sid);
    assert!(held.is_empty());
    assert!(
        matches!(
            a,
            Answer::Refused {
                status: Status::NotLeader,
                ..
            }
        ),
        "a follower answered {a:?}"
    );
    let (mut r, held, a) = Raw::resume(c.lock_addrs[l2], sid);
    let w2 = welcome_of(a);
    assert_eq!(w2.session_id, sid);
    assert_eq!(w2.keepalive_ms, w.keepalive_ms);
    assert_eq!(w2.flags & sp::FLAG_RESUMABLE, sp::FLAG_RESUMABLE);
    assert_eq!(
        held,
        vec![
            (b"lease-key".to_vec(), t_lease, HoldMode::Lease),
            (b"pers-key".to_vec(), t_pers, HoldMode::Persistent),
            (b"sess-key".to_vec(), t_sess, HoldMode::Session),
        ],
        "every hold of the session, with its token"
    );
    // The session is the connection's again: its session hold is its own.
    let (st, _) = r.call(&Req::Release {
        token: t_sess,
        key: b"sess-key",
    });
    assert_eq!(st, Status::Ok);
    assert_eq!(try_lock(&c, l2, b"sess-key"), Some(b'+'));
    // New grants of the resumed session are larger than every earlier one.
    let t_new = r.take(b"new-key", HoldMode::Session);
    assert!(t_new > t_pers, "{t_new} > {t_pers}");
    // Its end (the connection closes) releases its session holds at once.
    drop(r);
    poll_until("the resumed session's end frees its key", WAIT, || {
        try_lock(&c, l2, b"new-key") == Some(b'+')
    });
    assert_eq!(try_lock(&c, l2, b"pers-key"), Some(b'#'), "persistent");
    drop(s);
}

/// Shared and semaphore holds are replicated: after kill -9 of the
/// leader, the new leader has every holder with its own token and the
/// semaphore's limit, and a resumed session gets its holds back.
#[test]
fn shared_and_semaphore_holds_survive_kill9_of_their_leader() {
    let mut c = Cluster::start(3, common::cluster::test_threads(), &[]);
    let l = c.leader(WAIT);
    let (mut a, w) = Raw::hello(c.lock_addrs[l], 10_000);
    assert_ne!(w.flags & sp::FLAG_MODES, 0, "a cluster serves modes");
    let (mut b, _) = Raw::hello(c.lock_addrs[l], 10_000);
    let a_doc = a.take_as(b"doc", HoldMode::Session, Access::Shared);
    let b_doc = b.take_as(b"doc", HoldMode::Persistent, Access::Shared);
    let a_pool = a.take_as(b"pool", HoldMode::Lease, Access::Semaphore(2));
    c.kill9(l);
    let l2 = new_leader(&c, l);
    // Held shared: a writer is refused, a reader joins.
    let (mut n, _) = Raw::hello(c.lock_addrs[l2], 10_000);
    assert_eq!(try_lock(&c, l2, b"doc"), Some(b'#'));
    assert_eq!(
        n.try_as(b"doc", HoldMode::Session, Access::Exclusive).0,
        Status::Busy
    );
    let n_doc = n.take_as(b"doc", HoldMode::Session, Access::Shared);
    assert!(n_doc > a_pool);
    // The semaphore kept its limit and its holder.
    assert_eq!(
        n.try_as(b"pool", HoldMode::Session, Access::Semaphore(3)).0,
        Status::ModeMismatch
    );
    n.take_as(b"pool", HoldMode::Session, Access::Semaphore(2));
    assert_eq!(
        n.try_as(b"pool", HoldMode::Session, Access::Semaphore(2)).0,
        Status::Busy
    );
    // The persistent reader's token still names its hold.
    let (st, _) = n.call(&Req::Release {
        token: b_doc,
        key: b"doc",
    });
    assert_eq!(st, Status::Ok);
    // Session a resumes with both of its holds.
    let (_r, held, ans) = Raw::resume(c.lock_addrs[l2], w.session_id);
    welcome_of(ans);
    assert_eq!(
        held,
        vec![
            (b"doc".to_vec(), a_doc, HoldMode::Session),
            (b"pool".to_vec(), a_pool, HoldMode::Lease),
        ]
    );
    drop((a, b));
}

/// A session nobody resumes ends once its window (keep-alive plus an
/// election timeout after the new leader started) passes; a Resume after
/// that is `unknown session`.
#[test]
fn a_session_nobody_resumes_ends_after_its_window() {
    let mut c = Cluster::start(3, common::cluster::test_threads(), &[]);
    let l = c.leader(WAIT);
    let (mut s, w) = Raw::hello(c.lock_addrs[l], 1_000);
    assert_eq!(w.keepalive_ms, 1_000);
    s.take(b"orphan-key", HoldMode::Session);
    c.kill9(l);
    let l2 = c.leader(WAIT);
    assert_eq!(try_lock(&c, l2, b"orphan-key"), Some(b'#'));
    poll_until("the unresumed session's hold is released", WAIT, || {
        try_lock(&c, l2, b"orphan-key") == Some(b'+')
    });
    let (_, held, a) = Raw::resume(c.lock_addrs[l2], w.session_id);
    assert!(held.is_empty());
    assert!(
        matches!(
            a,
            Answer::Reply {
                status: Status::UnknownSession,
                ..
            }
        ),
        "{a:?}"
    );
    drop(s);
}

/// On a serving leader a connection's close ends its session at once (as
/// on a single node), and a Resume of it is `unknown session`; a Resume of
/// a session another connection still has takes it over.
#[test]
fn a_close_ends_a_session_and_a_resume_takes_over_a_live_one() {
    let c = Cluster::start(3, common::cluster::test_threads(), &[]);
    let l = c.leader(WAIT);
    let (mut s, w) = Raw::hello(c.lock_addrs[l], 10_000);
    s.take(b"closed-key", HoldMode::Session);
    drop(s);
    poll_until("the closed session's key is free", WAIT, || {
        try_lock(&c, l, b"closed-key") == Some(b'+')
    });
    let (_, _, a) = Raw::resume(c.lock_addrs[l], w.session_id);
    assert!(
        matches!(
            a,
            Answer::Reply {
                status: Status::UnknownSession,
                ..
            }
        ),
        "{a:?}"
    );

    let (mut s, w) = Raw::hello(c.lock_addrs[l], 10_000);
    let t = s.take(b"live-key", HoldMode::Session);
    let (mut r, held, a) = Raw::resume(c.lock_addrs[l], w.session_id);
    welcome_of(a);
    assert_eq!(held, vec![(b"live-key".to_vec(), t, HoldMode::Session)]);
    // The earlier connection is closed; the session (and its hold) is not.
    assert!(s.read(None).is_none(), "the taken-over connection closes");
    assert_eq!(try_lock(&c, l, b"live-key"), Some(b'#'));
    let (st, _) = r.call(&Req::Release {
        token: t,
        key: b"live-key",
    });
    assert_eq!(st, Status::Ok);
    // A session of a single node, or never opened, is unknown.
    let (_, _, a) = Raw::resume(c.lock_addrs[l], 12345);
    assert!(
        matches!(
            a,
            Answer::Reply {
                status: Status::UnknownSession,
                ..
            }
        ),
        "{a:?}"
    );
}

/// The serving node other than `old`, waiting for one.
fn new_leader(c: &Cluster, old: usize) -> usize {
    let mut found = None;
    poll_until("another node serves", WAIT, || {
        found = (0..3).filter(|&i| i != old).find(|&i| c.serves(i));
        found.is_some()
    });
    found.expect("found")
}

/// SIGSTOP of the leader past the election timeout, and its Raft links cut
/// (the session's own connection stays up, so its client hears nothing):
/// the session is resumed on the new leader with its hold; when the old
/// leader runs (or is reachable) again it closes the old connection, and
/// what it did meanwhile (a keep-alive expiry, on its stale clock) does not
/// end the session.
#[test]
fn a_session_is_resumed_when_its_leader_pauses_or_is_cut_off() {
    let c = Cluster::start(3, common::cluster::test_threads(), &[]);
    for fault in ["pause", "partition"] {
        let l = c.leader(WAIT);
        let (mut s, w) = Raw::hello(c.lock_addrs[l], 10_000);
        let key = format!("{fault}-key");
        let t = s.take(key.as_bytes(), HoldMode::Session);
        match fault {
            "pause" => c.signal(l, libc::SIGSTOP),
            _ => c.isolate(l),
        }
        let l2 = new_leader(&c, l);
        let (mut r, held, a) = Raw::resume(c.lock_addrs[l2], w.session_id);
        welcome_of(a);
        assert_eq!(
            held,
            vec![(key.as_bytes().to_vec(), t, HoldMode::Session)],
            "{fault}: the hold is the session's on the new leader"
        );
        match fault {
            "pause" => c.signal(l, libc::SIGCONT),
            _ => c.heal(),
        }
        // The old leader's connection closes (it steps down when it hears
        // of the new term): that does not end the session.
        assert!(s.read(None).is_none(), "{fault}: the old connection closes");
        poll_until("the old leader follows", WAIT, || {
            !c.serves(l) && c.serves(l2)
        });
        assert_eq!(r.call(&Req::Ping).0, Status::Ok);
        assert_eq!(try_lock(&c, l2, key.as_bytes()), Some(b'#'), "{fault}");
        let (st, _) = r.call(&Req::Release {
            token: t,
            key: key.as_bytes(),
        });
        assert_eq!(st, Status::Ok, "{fault}: released by the resumed session");
    }
}

/// The Rust session client, given every node's address, resumes its
/// session on the new leader after `kill -9` of its leader: its locks are
/// kept (no Lost), still its own, and released by it; `ringlock lock` keeps
/// its command running across the failover and exits with the command's
/// status, not 79.
#[test]
fn the_rust_client_and_the_cli_resume_across_kill9() {
    use ringlock::client::{RetryPolicy, Session};
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let mut c = Cluster::start(3, common::cluster::test_threads(), &[]);
    let lost = Arc::new(AtomicUsize::new(0));
    let l = c.leader(WAIT);
    let session = {
        let lost = lost.clone();
        Session::builder(c.lock_addrs.as_slice())
            .retry(RetryPolicy::none())
            .keepalive(Duration::from_secs(10))
            .on_lost(move |_, _| {
                lost.fetch_add(1, Ordering::SeqCst);
            })
            .connect()
            .expect("session")
    };
    assert!(session.is_resumable(), "a cluster session is resumable");
    let lease = session
        .lock("client-key", Duration::from_secs(5))
        .expect("locked");
    // The CLI holds another key while its command waits for a file.
    let go = c.data_path(0).with_extension("go");
    let started = c.data_path(0).with_extension("started");
    let addrs: Vec<String> = c.lock_addrs.iter().map(|a| a.to_string()).collect();
    let mut cli = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .args([
            "--addr",
            &addrs.join(","),
            "lock",
            "cli-key",
            "--",
            "sh",
            "-c",
        ])
        .arg(format!(
            "touch {}; while [ ! -e {} ]; do sleep 0.02; done",
            started.display(),
            go.display()
        ))
        .stderr(Stdio::piped())
        .spawn()
        .expect("ringlock lock");
    let stderr = cli.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    // (Not a TryLock probe: it would take the key if it were still free.)
    poll_until("the CLI's command runs", WAIT, || started.exists());
    c.kill9(l);
    let l2 = c.leader(WAIT);
    poll_until("the client resumed its session", WAIT, || {
        session.resumes() == 1
    });
    let mut notes = Vec::new();
    poll_until("the CLI resumed its session", WAIT, || {
        notes.extend(rx.try_iter());
        notes.iter().any(|n| n.contains("resumed"))
    });
    assert_eq!(lost.load(Ordering::SeqCst), 0, "nothing was lost");
    assert!(lease.lost().is_none());
    assert_eq!(
        cli.try_wait().expect("wait"),
        None,
        "the command still runs"
    );
    for k in [&b"client-key"[..], b"cli-key"] {
        assert_eq!(
            try_lock(&c, l2, k),
            Some(b'#'),
            "{k:?} held through the failover"
        );
    }
    lease.release().expect("released by the resumed session");
    assert_eq!(try_lock(&c, l2, b"client-key"), Some(b'+'));
    std::fs::write(&go, b"").expect("go");
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(st) = cli.try_wait().expect("wait") {
            break st;
        }
        if t.elapsed() > WAIT {
            let _ = cli.kill();
            notes.extend(rx.try_iter());
            panic!("the CLI did not exit once its command did: {notes:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    notes.extend(rx.try_iter());
    assert!(status.success(), "the CLI exited {status:?}: {notes:?}");
    poll_until("the CLI's key is free after it exits", WAIT, || {
        try_lock(&c, l2, b"cli-key") == Some(b'+')
    });
}

/// Requests pipelined right behind a Resume (a client re-sending what was
/// in flight) wait for the Resume's answer, then are served in order.
#[test]
fn requests_pipelined_behind_a_resume_are_served_after_it() {
    let c = Cluster::start(3, common::cluster::test_threads(), &[]);
    let l = c.leader(WAIT);
    let (s, w) = Raw::hello(c.lock_addrs[l], 10_000);
    let mut r = Raw::connect(c.lock_addrs[l]);
    let mut b = Vec::new();
    sp::encode(
        1,
        &Req::Resume {
            version: sp::VERSION,
            session_id: w.session_id,
            auth: b"",
        },
        &mut b,
    );
    sp::encode(
        2,
        &Req::Acquire {
            hold: HoldMode::Session,
            ttl_ms: 0,
            wait_ms: sp::WAIT_FOREVER,
            key: b"piped",
            source: b"resumer",
            access: ringlock::protocol::session::Access::Exclusive,
        },
        &mut b,
    );
    r.s.write_all(&b).expect("send");
    welcome_of(r.read(Some(1)).expect("the Resume is answered"));
    match r.read(None).expect("the Acquire is answered") {
        Answer::Reply {
            rid: 2,
            status: Status::Ok,
            ..
        } => {}
        other => panic!("the pipelined Acquire was answered {other:?}"),
    }
    assert_eq!(try_lock(&c, l, b"piped"), Some(b'#'));
    drop(s);
}

/// A server with `--auth-token-file` refuses a Resume without the token
/// (`unauthorized`, then close) before it looks the session up.
#[test]
fn a_resume_without_the_auth_token_is_unauthorized() {
    let token = std::env::temp_dir().join(format!("ringlock-resume-auth-{}", std::process::id()));
    std::fs::write(&token, b"s3cret\n").expect("token file");
    let path = token.to_str().expect("utf-8 path").to_string();
    let c = Cluster::start(
        3,
        common::cluster::test_threads(),
        &["--auth-token-file", &path],
    );
    let l = c.leader(WAIT);
    let (_, held, a) = Raw::resume(c.lock_addrs[l], 12345);
    assert!(held.is_empty());
    assert!(
        matches!(
            a,
            Answer::Reply {
                status: Status::Unauthorized,
                ..
            }
        ),
        "{a:?}"
    );
    drop(c);
    let _ = std::fs::remove_file(&token);
}

/// Sessions over TLS on a cluster whose client ports take sessions only
/// over TLS (Locking-Center stays plaintext for the harness's probes):
/// a plaintext Hello is refused `tls_required`; a session whose leader
/// hands over is resumed through the old leader's `not leader` hint on a
/// node the session was never given, the hint's certificate verified.
#[test]
fn a_tls_session_follows_a_verified_hint_after_a_hand_over() {
    use ringlock::client::{Client, RetryPolicy, Session};
    use ringlock::tls::ClientTls;
    use std::sync::{Arc, Mutex};

    let c = Cluster::start(
        3,
        common::cluster::test_threads(),
        &["--tls-clients-only", "--lc-plaintext"],
    );
    let l = c.leader(WAIT);
    let ca = c.dir.path("ca");
    let key = c.ca_key();
    common::cluster::cert_cli(&[
        "create-client",
        "--certs-dir",
        ca.to_str().unwrap(),
        "--ca-key",
        key.to_str().unwrap(),
        "ops",
    ]);
    let tls = ClientTls::load(&ca, Some("ops")).expect("client TLS");
    let other = (0..3).find(|&i| i != l).unwrap();
    let third = (0..3).find(|&i| i != l && i != other).unwrap();

    // Plaintext: refused with the status that says why.
    let mut s = TcpStream::connect(c.lock_addrs[l]).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut hello = Vec::new();
    sp::encode(
        3,
        &Req::Hello {
            version: sp::VERSION,
            keepalive_ms: 0,
            auth: b"",
        },
        &mut hello,
    );
    s.write_all(&hello).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert!(
        matches!(
            sp::decode_answer(&got, Some(3)),
            Ok(Some((
                Answer::Reply {
                    status: Status::TlsRequired,
                    ..
                },
                _
            )))
        ),
        "{got:?}"
    );

    let events = Arc::new(Mutex::new(Vec::<String>::new()));
    let session = {
        let events = events.clone();
        Session::builder(vec![c.lock_addrs[l], c.lock_addrs[other]])
            .tls(tls.clone())
            .retry(RetryPolicy::none())
            .keepalive(Duration::from_secs(10))
            .on_resume(move |line| events.lock().unwrap().push(line.to_string()))
            .connect()
            .expect("a TLS session")
    };
    let lease = session.lock("tls-key", WAIT).expect("locked");
    // The leader hands over to the node the session does not know.
    let admin = c.nodes[l].as_ref().unwrap().admin_addr;
    let client = Client::builder(c.lock_addrs[l])
        .admin_addr(admin)
        .tls(tls)
        .retry(RetryPolicy::none())
        .build()
        .unwrap();
    poll_until("the hand-over is accepted", WAIT, || {
        client.transfer_leader((third + 1) as u32).is_ok()
    });
    poll_until("the third node serves", WAIT, || c.serves(third));
    poll_until("the session resumed", WAIT, || session.resumes() == 1);
    let resumed = events.lock().unwrap().join("\n");
    assert!(
        resumed.contains(&format!("resumed on {}", c.lock_addrs[third])),
        "resumed through the hint: {resumed}"
    );
    assert!(lease.lost().is_none());
    assert_eq!(try_lock(&c, third, b"tls-key"), Some(b'#'), "still held");
    lease.release().expect("released by the resumed session");
    assert_eq!(try_lock(&c, third, b"tls-key"), Some(b'+'));
}
