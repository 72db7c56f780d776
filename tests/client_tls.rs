//! TLS on the lock and admin ports (`--certs-dir`), end to end: the real
//! server, certificates made by the real `ringlock cert`, the Rust client
//! and the CLI over real sockets on 127.0.0.1.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::cluster::cert_cli;
use common::{metric, Server, TempDir};
use ringlock::client::{Client, RetryPolicy, Session};
use ringlock::protocol::session::{self as wire, Req};
use ringlock::tls::ClientTls;

const BOUND: Duration = Duration::from_secs(10);

/// A CA, a node certificate for `hosts`, and client certificates alice
/// and bob, in `dir/certs` (the CA key beside it, as the docs say).
struct Pki {
    dir: TempDir,
}

impl Pki {
    fn new(tag: &str, hosts: &[&str]) -> Pki {
        let dir = TempDir::new(tag);
        let certs = dir.path("certs");
        let key = dir.path("ca.key");
        let (c, k) = (certs.to_str().unwrap(), key.to_str().unwrap());
        cert_cli(&["create-ca", "--certs-dir", c, "--ca-key", k]);
        let mut node = vec![
            "create-node",
            "--certs-dir",
            c,
            "--ca-key",
            k,
            "--node-id",
            "1",
        ];
        node.extend_from_slice(hosts);
        cert_cli(&node);
        for name in ["alice", "bob"] {
            cert_cli(&["create-client", "--certs-dir", c, "--ca-key", k, name]);
        }
        Pki { dir }
    }

    fn certs(&self) -> PathBuf {
        self.dir.path("certs")
    }

    fn certs_arg(&self) -> String {
        self.certs().to_string_lossy().into_owned()
    }

    fn client(&self, name: Option<&str>) -> ClientTls {
        ClientTls::load(&self.certs(), name).expect("client TLS")
    }

    fn start(&self, extra: &[&str]) -> Server {
        let certs = self.certs_arg();
        let mut args = vec![
            "--certs-dir",
            certs.as_str(),
            "--metrics-bind",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(extra);
        Server::start(&args)
    }
}

fn session(srv: &Server, tls: Option<ClientTls>) -> ringlock::lease::Result<Session> {
    let mut b = Session::builder(srv.lock_addr).retry(RetryPolicy::none());
    if let Some(t) = tls {
        b = b.tls(t);
    }
    b.connect()
}

fn lock_release(s: &Session, key: &str) {
    let lease = s.lock(key, BOUND).expect("lock");
    lease.release().expect("release");
}

fn series(srv: &Server, name: &str) -> f64 {
    metric(srv.metrics(), name)
}

#[test]
fn sessions_over_tls_with_and_without_a_client_certificate() {
    let pki = Pki::new("tls-sessions", &["localhost", "127.0.0.1"]);
    let srv = pki.start(&["--threads", "2"]);
    let anon = session(&srv, Some(pki.client(None))).expect("TLS without a client certificate");
    lock_release(&anon, "k1");
    let alice = session(&srv, Some(pki.client(Some("alice")))).expect("with alice's");
    lock_release(&alice, "k2");
    // Both hold keys of both shards at once, answers in order.
    let leases: Vec<_> = (0..8)
        .map(|i| alice.lock(format!("many-{i}"), BOUND).expect("lock"))
        .collect();
    assert!(
        anon.try_lock("many-3").expect("try").is_none(),
        "held by alice"
    );
    for l in leases {
        l.release().expect("release");
    }
    assert!(series(&srv, "ringlock_tls_handshakes_total{result=\"ok\"}") >= 2.0);
    // Plaintext: refused with a status that says why.
    let err = session(&srv, None).expect_err("plaintext session");
    let text = err.to_string();
    assert!(text.contains("tls_required"), "{text}");
    assert_eq!(
        series(
            &srv,
            "ringlock_plaintext_refused_total{protocol=\"session\"}"
        ),
        1.0
    );
    // By host name too (the certificate names localhost).
    let by_name = Session::builder(format!("localhost:{}", srv.lock_addr.port()))
        .tls(pki.client(None))
        .retry(RetryPolicy::none())
        .connect()
        .expect("dialled as localhost");
    lock_release(&by_name, "k3");
}

#[test]
fn client_cert_auth_requires_a_client_certificate_which_stands_for_the_token() {
    let pki = Pki::new("tls-cert-auth", &["127.0.0.1"]);
    let token = pki.dir.path("token");
    std::fs::write(&token, "s3cret").unwrap();
    let token_arg = token.to_string_lossy().into_owned();
    let srv = pki.start(&["--client-cert-auth", "--auth-token-file", &token_arg]);
    let err = session(&srv, Some(pki.client(None))).expect_err("no client certificate");
    let text = err.to_string();
    assert!(text.contains("client certificate"), "{text}");
    // No token needed with a certificate the server verified.
    let bob = session(&srv, Some(pki.client(Some("bob")))).expect("bob's certificate");
    lock_release(&bob, "k");
    assert!(series(&srv, "ringlock_tls_handshakes_total{result=\"failed\"}") >= 1.0);

    // Without --client-cert-auth a TLS client without a certificate still
    // needs the token.
    drop(srv);
    let srv = pki.start(&["--auth-token-file", &token_arg]);
    let err = session(&srv, Some(pki.client(None))).expect_err("no certificate, no token");
    assert!(err.to_string().contains("unauthorized"), "{err}");
    let ok = Session::builder(srv.lock_addr)
        .tls(pki.client(None))
        .auth_token("s3cret")
        .retry(RetryPolicy::none())
        .connect()
        .expect("the token");
    lock_release(&ok, "k");
}

#[test]
fn a_server_of_another_ca_or_another_host_is_refused() {
    let pki = Pki::new("tls-verify", &["localhost"]);
    let other = Pki::new("tls-verify-other", &["127.0.0.1"]);
    let srv = pki.start(&[]);
    // Its certificate names localhost only: dialled as 127.0.0.1 it fails.
    let err = session(&srv, Some(pki.client(None))).expect_err("wrong host");
    let text = err.to_string();
    assert!(text.contains("does not name the host"), "{text}");
    // Another CA's bundle does not trust it.
    let err = Session::builder(format!("localhost:{}", srv.lock_addr.port()))
        .tls(other.client(None))
        .retry(RetryPolicy::none())
        .connect()
        .expect_err("wrong CA");
    let text = err.to_string();
    assert!(text.contains("not signed by a CA in ca.crt"), "{text}");
    // A client certificate of another CA is refused by the server.
    let err = Session::builder(format!("localhost:{}", srv.lock_addr.port()))
        .tls(mixed_client(&pki, &other))
        .retry(RetryPolicy::none())
        .connect()
        .expect_err("a client certificate of another CA");
    assert!(!err.to_string().is_empty());
    assert!(series(&srv, "ringlock_tls_handshakes_total{result=\"failed\"}") >= 1.0);
}

/// Trusts `pki`'s CA but presents a client certificate of `other`'s.
fn mixed_client(pki: &Pki, other: &Pki) -> ClientTls {
    let ca = std::fs::read(pki.certs().join("ca.crt")).unwrap();
    let crt = std::fs::read(other.certs().join("client.alice.crt")).unwrap();
    let key = std::fs::read(other.certs().join("client.alice.key")).unwrap();
    // A bundle of both CAs lets the client load the certificate; the
    // server trusts only its own.
    let oca = std::fs::read(other.certs().join("ca.crt")).unwrap();
    let bundle = [ca, oca].concat();
    ClientTls::from_pem(&bundle, Some((&crt, &key))).expect("loads")
}

fn cli(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .args(args)
        .env_remove("RINGLOCK_ADDR")
        .env_remove("RINGLOCK_ADMIN_ADDR")
        .env_remove("RINGLOCK_CERTS_DIR")
        .env_remove("RINGLOCK_CLIENT")
        .output()
        .expect("run ringlock");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_admin_port_takes_tls_with_a_certificate_or_the_token_on_loopback_too() {
    let pki = Pki::new("tls-admin", &["127.0.0.1"]);
    let token = pki.dir.path("token");
    std::fs::write(&token, "adm1n").unwrap();
    let token_arg = token.to_string_lossy().into_owned();
    let srv = pki.start(&["--auth-token-file", &token_arg]);
    let certs = pki.certs_arg();
    let addr = srv.lock_addr.to_string();
    let admin = srv.admin_addr.to_string();
    let base = [
        "--addr",
        addr.as_str(),
        "--admin-addr",
        admin.as_str(),
        "--retry",
        "0",
    ];
    // A session lock held by the CLI's own command, listed by another CLI.
    let keys_cmd = format!(
        "{} --addr {addr} --admin-addr {admin} --certs-dir {certs} --client alice keys",
        env!("CARGO_BIN_EXE_ringlock")
    );
    let mut args: Vec<&str> = base.to_vec();
    args.extend([
        "--certs-dir",
        &certs,
        "--client",
        "bob",
        "lock",
        "held-key",
        "--",
        "sh",
        "-c",
        &keys_cmd,
    ]);
    let (rc, out, err) = cli(&args);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("held-key"), "keys lists the CLI's hold: {out}");

    let mut plain = base.to_vec();
    plain.push("keys");
    let (rc, _, err) = cli(&plain);
    assert_ne!(rc, 0);
    assert!(err.contains("the admin port refused"), "{err}");

    let mut anon = base.to_vec();
    anon.extend(["--certs-dir", &certs, "keys"]);
    let (rc, _, err) = cli(&anon);
    assert_ne!(rc, 0, "TLS without a certificate or the token, on loopback");
    assert!(err.contains("client certificate"), "{err}");

    let mut with_token = base.to_vec();
    with_token.extend([
        "--certs-dir",
        &certs,
        "--auth-token-file",
        &token_arg,
        "keys",
    ]);
    let (rc, _, err) = cli(&with_token);
    assert_eq!(rc, 0, "the token over TLS: {err}");

    // Raw plaintext on the admin port: `-`, then closed.
    let mut s = TcpStream::connect(srv.admin_addr).unwrap();
    s.set_read_timeout(Some(BOUND)).unwrap();
    s.write_all(b"KEYS").unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"-");
}

#[test]
fn locking_center_requests_over_tls_and_plaintext_only_with_lc_plaintext() {
    let pki = Pki::new("tls-lc", &["127.0.0.1"]);
    let srv = pki.start(&["--threads", "4"]);
    let c = Client::builder(srv.lock_addr)
        .admin_addr(srv.admin_addr)
        .tls(pki.client(Some("alice")))
        .retry(RetryPolicy::none())
        .build()
        .unwrap();
    // Keys of every shard: a connection moves to its key's shard with its
    // TLS session.
    for i in 0..24 {
        let mut g = c.lock(format!("lc-{i}")).expect("lock over TLS");
        assert!(c.try_lock(format!("lc-{i}")).unwrap().is_none());
        g.release().expect("unlock over TLS");
    }
    assert_eq!(
        common::once(srv.lock_addr, &common::frame(1, b"p", Some(b""))),
        b'-'
    );
    assert!(
        series(
            &srv,
            "ringlock_plaintext_refused_total{protocol=\"lc_or_admin\"}"
        ) >= 1.0
    );
    drop(srv);
    let srv = pki.start(&["--lc-plaintext"]);
    assert_eq!(
        common::once(srv.lock_addr, &common::frame(1, b"p", Some(b""))),
        b'+'
    );
    let err = session(&srv, None).expect_err("sessions still need TLS");
    assert!(err.to_string().contains("tls_required"), "{err}");
}

#[test]
fn a_handshake_that_does_not_finish_is_closed_at_its_deadline() {
    let pki = Pki::new("tls-deadline", &["127.0.0.1"]);
    let srv = pki.start(&["--frame-timeout-ms", "300"]);
    let mut s = TcpStream::connect(srv.lock_addr).unwrap();
    // A TLS record header announcing a ClientHello that never comes.
    s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).unwrap();
    s.set_read_timeout(Some(BOUND)).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    // Closed with nothing, or a TLS alert record (close_notify) at most.
    assert!(
        got.is_empty() || got[0] == 21 && got.len() == 7,
        "closed without an answer: {got:?}"
    );
    assert_eq!(
        series(&srv, "ringlock_tls_handshakes_total{result=\"timed_out\"}"),
        1.0
    );
    // The server serves on.
    let ok = session(&srv, Some(pki.client(None))).expect("a session after it");
    lock_release(&ok, "k");
}

#[test]
fn an_expired_client_certificate_is_refused_before_anything_is_sent() {
    let pki = Pki::new("tls-expired", &["127.0.0.1"]);
    // Issue one that ended yesterday with the CA's key (as `ringlock cert`
    // would with a clock set back).
    let ca_pem = std::fs::read(pki.certs().join("ca.crt")).unwrap();
    let ca_key = std::fs::read(pki.dir.path("ca.key")).unwrap();
    let issuer =
        ringlock::tls::gen::Issuer::from_pem("ca.crt", &ca_pem, "ca.key", &ca_key).expect("issuer");
    let now = std::time::SystemTime::now();
    let old = issuer
        .client(
            "old",
            ringlock::tls::gen::Validity {
                not_before: now - Duration::from_secs(10 * 86_400),
                not_after: now - Duration::from_secs(86_400),
            },
        )
        .expect("issued");
    write(&pki.certs().join("client.old.crt"), &old.cert_pem);
    write(&pki.certs().join("client.old.key"), &old.key_pem);
    let srv = pki.start(&[]);
    let addr = srv.lock_addr.to_string();
    let certs = pki.certs_arg();
    let (rc, _, err) = cli(&[
        "--addr",
        &addr,
        "--certs-dir",
        &certs,
        "--client",
        "old",
        "lock",
        "k",
        "--",
        "true",
    ]);
    assert_eq!(rc, 78, "{err}");
    assert!(err.contains("expired"), "{err}");
    assert_eq!(
        series(&srv, "ringlock_tls_handshakes_total{result=\"ok\"}"),
        0.0
    );
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[test]
fn sighup_reloads_the_certificates_under_load_without_a_failed_request() {
    let pki = Pki::new("tls-reload", &["127.0.0.1"]);
    let srv = pki.start(&["--threads", "2"]);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (stop, done) = (stop.clone(), done.clone());
            let tls = pki.client(if w % 2 == 0 { Some("alice") } else { None });
            let addr = srv.lock_addr;
            std::thread::spawn(move || {
                // A new session (a new handshake) every few requests, and
                // requests on the established ones.
                while !stop.load(Ordering::Relaxed) {
                    let s = Session::builder(addr)
                        .tls(tls.clone())
                        .retry(RetryPolicy::none())
                        .connect()
                        .expect("a session during reloads");
                    for i in 0..5 {
                        let l = s.lock(format!("w{w}-{i}"), BOUND).expect("lock");
                        l.release().expect("release");
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let key = pki.dir.path("ca.key");
    let (c, k) = (pki.certs_arg(), key.to_string_lossy().into_owned());
    for round in 0..5 {
        let seen = done.load(Ordering::Relaxed);
        common::fault_proxy::poll_until("the workers make progress", BOUND, || {
            done.load(Ordering::Relaxed) >= seen + 20
        });
        // A new node certificate (another expiry), then SIGHUP.
        let days = (400 + round).to_string();
        cert_cli(&[
            "create-node",
            "--certs-dir",
            &c,
            "--ca-key",
            &k,
            "--node-id",
            "1",
            "--days",
            &days,
            "--overwrite",
            "127.0.0.1",
        ]);
        let before = series(&srv, "ringlock_cert_reloads_total{result=\"ok\"}");
        // SAFETY: a plain syscall; the pid is the server's, a child this
        // test owns and has not reaped, so it names no other process. A
        // signal that went elsewhere is seen: the reload count below never
        // rises and the bounded wait fails.
        unsafe { libc::kill(srv.pid() as i32, libc::SIGHUP) };
        common::fault_proxy::poll_until("the reload is counted", BOUND, || {
            series(&srv, "ringlock_cert_reloads_total{result=\"ok\"}") >= before + 1.0
        });
    }
    let expiry = series(&srv, "ringlock_cert_expiry_timestamp_seconds");
    let want = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        + 404.0 * 86_400.0;
    assert!(
        (expiry - want).abs() < 3_600.0,
        "the last certificate is in use: {expiry} vs {want}"
    );
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("no worker saw a failure");
    }
    assert!(done.load(Ordering::Relaxed) >= 100);
    assert_eq!(
        series(&srv, "ringlock_tls_handshakes_total{result=\"failed\"}"),
        0.0
    );
}

#[test]
fn a_plaintext_hello_on_a_tls_only_port_is_answered_tls_required() {
    // What a client of another language sees: a session Reply, status 14.
    let pki = Pki::new("tls-status", &["127.0.0.1"]);
    let srv = pki.start(&[]);
    let mut s = TcpStream::connect(srv.lock_addr).unwrap();
    s.set_read_timeout(Some(BOUND)).unwrap();
    let mut frame = Vec::new();
    wire::encode(
        9,
        &Req::Hello {
            version: wire::VERSION,
            keepalive_ms: 0,
            auth: b"",
        },
        &mut frame,
    );
    s.write_all(&frame).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    match wire::decode_answer(&got, Some(9)) {
        Ok(Some((wire::Answer::Reply { status, .. }, _))) => {
            assert_eq!(status, wire::Status::TlsRequired)
        }
        other => panic!("{other:?} ({got:?})"),
    }
}

#[test]
fn a_storm_of_handshakes_is_served_whole_while_established_sessions_go_on() {
    // More handshakes at once than a loop takes per tick: the ones over
    // the budget wait for later ticks (their bytes kept, their receive
    // not re-armed) and every one completes; an established session is
    // served throughout.
    let pki = Pki::new("tls-storm", &["127.0.0.1"]);
    let srv = pki.start(&["--threads", "2"]);
    let steady = session(&srv, Some(pki.client(Some("alice")))).expect("established");
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let bg = {
        let (stop, served) = (stop.clone(), served.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                lock_release(&steady, "steady");
                served.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let n = 48;
    let go = Arc::new(std::sync::Barrier::new(n));
    let storm: Vec<_> = (0..n)
        .map(|i| {
            let go = go.clone();
            let tls = pki.client(if i % 3 == 0 { Some("bob") } else { None });
            let addr = srv.lock_addr;
            std::thread::spawn(move || {
                go.wait();
                for j in 0..4 {
                    let s = Session::builder(addr)
                        .tls(tls.clone())
                        .retry(RetryPolicy::none())
                        .connect()
                        .expect("a session in the storm");
                    lock_release(&s, &format!("storm-{i}-{j}"));
                }
            })
        })
        .collect();
    for t in storm {
        t.join().expect("every storm session was served");
    }
    stop.store(true, Ordering::Relaxed);
    bg.join()
        .expect("the established session was served throughout");
    assert!(served.load(Ordering::Relaxed) > 0);
    let ok = series(&srv, "ringlock_tls_handshakes_total{result=\"ok\"}");
    assert!(ok >= (n * 4 + 1) as f64, "{ok} handshakes");
    assert_eq!(
        series(&srv, "ringlock_tls_handshakes_total{result=\"failed\"}"),
        0.0
    );
}
