//! `ringlock cert` run as a program: the files it writes, what it refuses,
//! what `cert list` prints, and that the server and client load what it
//! made and complete a handshake with it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ringlock::tls::gen::{self, Issuer, Validity};
use ringlock::tls::{self, ClientTls, Identity, NodeTls};
use rustls::pki_types::ServerName;
use rustls::{ClientConnection, ServerConnection};

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos();
        let p = std::env::temp_dir().join(format!(
            "ringlock-cert-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cert(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .arg("cert")
        .args(args)
        .output()
        .expect("run ringlock")
}

#[track_caller]
fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "ringlock failed: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Exit code and the stderr line.
#[track_caller]
fn fails(out: Output) -> (i32, String) {
    assert!(!out.status.success(), "ringlock should have failed");
    let err = String::from_utf8(out.stderr).expect("utf-8");
    assert_eq!(err.lines().count(), 1, "one line on stderr: {err}");
    assert!(err.starts_with("ringlock: "), "{err}");
    (out.status.code().expect("exit code"), err)
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("stat").permissions().mode() & 0o777
}

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// A certs dir with a CA, node 1 (two hosts) and client alice, made by
/// the CLI; the CA key sits outside it.
struct Made {
    tmp: TempDir,
    certs: PathBuf,
    ca_key: PathBuf,
}

fn make_all() -> Made {
    let tmp = TempDir::new("all");
    let certs = tmp.path("certs");
    let ca_key = tmp.path("private/ca.key");
    let out = ok(cert(&[
        "create-ca",
        "--certs-dir",
        p(&certs),
        "--ca-key",
        p(&ca_key),
    ]));
    assert!(out.contains("ca.crt"), "{out}");
    ok(cert(&[
        "create-node",
        "--certs-dir",
        p(&certs),
        "--ca-key",
        p(&ca_key),
        "--node-id",
        "1",
        "node1.test",
        "127.0.0.1",
    ]));
    ok(cert(&[
        "create-client",
        "--certs-dir",
        p(&certs),
        "--ca-key",
        p(&ca_key),
        "alice",
    ]));
    Made { tmp, certs, ca_key }
}

#[test]
fn the_files_made_load_and_shake_hands() {
    let m = make_all();
    let mut names: Vec<_> = std::fs::read_dir(&m.certs)
        .expect("ls")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    names.sort();
    // The CA key is not in the certs dir, nor any temporary file.
    assert_eq!(
        names,
        [
            "ca.crt",
            "client.alice.crt",
            "client.alice.key",
            "node.crt",
            "node.key"
        ]
    );
    assert_eq!(mode(&m.ca_key), 0o600);
    assert_eq!(mode(m.ca_key.parent().expect("dir")), 0o700);
    assert_eq!(mode(&m.certs.join("node.key")), 0o600);
    assert_eq!(mode(&m.certs.join("client.alice.key")), 0o600);
    assert_eq!(mode(&m.certs.join("node.crt")), 0o644);
    assert_eq!(mode(&m.certs.join("ca.crt")), 0o644);
    let pem = std::fs::read_to_string(m.certs.join("node.key")).expect("key");
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"), "{pem}");

    let node = NodeTls::load(&m.certs, Some(1)).expect("node 1 loads");
    let client = ClientTls::load(&m.certs, Some("alice")).expect("alice loads");
    // The node's two hosts, as a client dials them.
    for host in ["node1.test", "127.0.0.1"] {
        let name = ServerName::try_from(host.to_owned()).expect("name");
        let mut c = ClientConnection::new(client.config(), name).expect("client");
        let mut s = ServerConnection::new(node.client_acceptor(true)).expect("server");
        gen::handshake(&mut c, &mut s).unwrap_or_else(|e| panic!("{host}: {e}"));
        assert_eq!(
            tls::peer_identity(&s),
            Some(Identity::Client("alice".into()))
        );
        assert_eq!(tls::peer_identity(&c), Some(Identity::Node(1)));
    }
    // Another name is refused.
    let name = ServerName::try_from("node2.test").expect("name");
    let mut c = ClientConnection::new(client.config(), name).expect("client");
    let mut s = ServerConnection::new(node.client_acceptor(true)).expect("server");
    let err = gen::handshake(&mut c, &mut s).expect_err("not node 2's name");
    assert!(err.contains("not valid for name"), "{err}");
    // Peer links: node 1 dials itself (the only node made here).
    let mut c = ClientConnection::new(node.peer_dialer(1), tls::peer_server_name(1)).expect("c");
    let mut s = ServerConnection::new(node.peer_acceptor()).expect("s");
    gen::handshake(&mut c, &mut s).expect("peer handshake");
    assert_eq!(tls::peer_identity(&s), Some(Identity::Node(1)));

    let listed = ok(cert(&["list", "--certs-dir", p(&m.certs)]));
    let lines: Vec<_> = listed.lines().collect();
    assert_eq!(lines.len(), 4, "{listed}");
    assert!(lines[0].starts_with("FILE "), "{listed}");
    assert!(
        lines[1].starts_with("ca.crt ") && lines[1].contains(" CA "),
        "{listed}"
    );
    assert!(
        lines[2].starts_with("node.crt ")
            && lines[2].contains("CN=ringlock node 1 ")
            && lines[2].contains(" node 1 "),
        "{listed}"
    );
    assert!(
        lines[3].starts_with("client.alice.crt ")
            && lines[3].contains(" client alice ")
            && lines[3].ends_with(" ok"),
        "{listed}"
    );
}

#[test]
fn nothing_is_overwritten_without_overwrite() {
    let m = make_all();
    let key = m.certs.join("node.key");
    let crt = m.certs.join("node.crt");
    let before = (std::fs::read(&key).unwrap(), std::fs::read(&crt).unwrap());
    let again = |extra: &[&str]| {
        let mut args = vec![
            "create-node",
            "--certs-dir",
            p(&m.certs),
            "--ca-key",
            p(&m.ca_key),
            "--node-id",
            "1",
            "node1.test",
        ];
        args.extend_from_slice(extra);
        cert(&args)
    };
    let (code, err) = fails(again(&[]));
    assert_eq!(code, 73);
    assert!(
        err.contains("node.crt exists; nothing was written (--overwrite replaces it)"),
        "{err}"
    );
    assert_eq!(
        (std::fs::read(&key).unwrap(), std::fs::read(&crt).unwrap()),
        before
    );
    // Only the key left: still refused, and the key kept.
    std::fs::remove_file(&crt).unwrap();
    let (code, err) = fails(again(&[]));
    assert_eq!((code, err.contains("node.key exists")), (73, true), "{err}");
    assert_eq!(std::fs::read(&key).unwrap(), before.0);
    assert!(!crt.exists(), "nothing written");

    ok(again(&["--overwrite"]));
    assert_ne!(std::fs::read(&key).unwrap(), before.0);
    assert_eq!(mode(&key), 0o600);
    NodeTls::load(&m.certs, Some(1)).expect("the new pair loads");

    let (code, err) = fails(cert(&[
        "create-ca",
        "--certs-dir",
        p(&m.certs),
        "--ca-key",
        p(&m.tmp.path("other.key")),
    ]));
    assert_eq!(code, 73);
    assert!(err.contains("ca.crt exists"), "{err}");
    assert!(!m.tmp.path("other.key").exists());
}

#[test]
fn issuing_needs_ca_crt_and_the_ca_key() {
    let m = make_all();
    let empty = m.tmp.path("empty");
    let (code, err) = fails(cert(&[
        "create-node",
        "--certs-dir",
        p(&empty),
        "--ca-key",
        p(&m.ca_key),
        "--node-id",
        "2",
        "node2.test",
    ]));
    assert_eq!(code, 66);
    assert_eq!(
        err.trim_end(),
        format!(
            "ringlock: {}/ca.crt: no such file; the CA certificate must be in the certs dir: \
             copy in the ca.crt that create-ca wrote",
            p(&empty)
        )
    );
    assert!(!empty.join("node.key").exists());

    let (code, err) = fails(cert(&[
        "create-client",
        "--certs-dir",
        p(&m.certs),
        "--ca-key",
        p(&m.tmp.path("missing.key")),
        "bob",
    ]));
    assert_eq!(code, 66);
    assert!(err.contains("missing.key: no such file"), "{err}");

    // The key of another CA.
    let other = m.tmp.path("other");
    ok(cert(&[
        "create-ca",
        "--certs-dir",
        p(&other),
        "--ca-key",
        p(&other.join("ca.key")),
    ]));
    let (code, err) = fails(cert(&[
        "create-client",
        "--certs-dir",
        p(&m.certs),
        "--ca-key",
        p(&other.join("ca.key")),
        "bob",
    ]));
    assert_eq!(code, 65);
    assert!(
        err.contains("is not the key of any CA certificate in"),
        "{err}"
    );
    assert!(!m.certs.join("client.bob.crt").exists());
}

#[test]
fn bad_arguments_are_usage_errors() {
    let m = make_all();
    // COMMAND --certs-dir DIR --ca-key CAKEY ARGS...
    let issue = |args: &[&str]| {
        let mut all = vec![
            args[0],
            "--certs-dir",
            p(&m.certs),
            "--ca-key",
            p(&m.ca_key),
        ];
        all.extend_from_slice(&args[1..]);
        fails(cert(&all))
    };
    for args in [
        &["create-client", "a/b"][..],
        &["create-client", ""],
        &["create-client", "--days", "1827", "bob"],
        &["create-client", "--days", "0", "bob"],
        &["create-node", "--node-id", "0", "h"],
        &["create-node", "--node-id", "2", "*.example.com"],
        &["create-node", "--node-id", "2"],
    ] {
        let (code, err) = issue(args);
        assert_eq!(code, 64, "{args:?}: {err}");
    }
}

#[test]
fn list_marks_expired_and_expiring_certificates() {
    let m = make_all();
    ok(cert(&[
        "create-client",
        "--certs-dir",
        p(&m.certs),
        "--ca-key",
        p(&m.ca_key),
        "--days",
        "10",
        "soon",
    ]));
    // An expired certificate, made as the tests make them (never by the CLI).
    let issuer = Issuer::from_pem(
        "ca.crt",
        &std::fs::read(m.certs.join("ca.crt")).unwrap(),
        "ca.key",
        &std::fs::read(&m.ca_key).unwrap(),
    )
    .expect("issuer");
    let now = SystemTime::now();
    let old = issuer
        .client(
            "old",
            Validity {
                not_before: now - Duration::from_secs(20 * 86_400),
                not_after: now - Duration::from_secs(86_400),
            },
        )
        .expect("expired cert");
    std::fs::write(m.certs.join("client.old.crt"), old.cert_pem).unwrap();
    let listed = ok(cert(&["list", "--certs-dir", p(&m.certs)]));
    let line = |name: &str| {
        listed
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {listed}"))
            .to_owned()
    };
    assert!(line("client.old.crt").ends_with(" EXPIRED"), "{listed}");
    assert!(
        line("client.soon.crt").ends_with(" expires in 10 days"),
        "{listed}"
    );
    assert!(line("client.alice.crt").ends_with(" ok"), "{listed}");
    // The loader refuses the expired one, naming it.
    std::fs::write(m.certs.join("client.old.key"), old.key_pem).unwrap();
    let err = ClientTls::load(&m.certs, Some("old")).expect_err("expired");
    assert!(err.contains("client.old.crt: expired at "), "{err}");

    let (code, err) = fails(cert(&["list", "--certs-dir", p(&m.tmp.path("nope"))]));
    assert_eq!(code, 66, "{err}");
}

#[test]
fn a_rotated_ca_bundle_issues_and_trusts_both() {
    let m = make_all();
    let new = m.tmp.path("new-ca");
    ok(cert(&[
        "create-ca",
        "--certs-dir",
        p(&new),
        "--ca-key",
        p(&m.tmp.path("new-ca.key")),
    ]));
    // The runbook: append the new CA to every ca.crt.
    let mut bundle = std::fs::read(m.certs.join("ca.crt")).unwrap();
    bundle.extend(std::fs::read(new.join("ca.crt")).unwrap());
    std::fs::write(m.certs.join("ca.crt"), &bundle).unwrap();
    // Node 1's old certificate still loads; node 2's comes from the new CA.
    let n1 = NodeTls::load(&m.certs, Some(1)).expect("old node with the bundle");
    let n2_dir = m.tmp.path("n2");
    std::fs::create_dir(&n2_dir).unwrap();
    std::fs::write(n2_dir.join("ca.crt"), &bundle).unwrap();
    ok(cert(&[
        "create-node",
        "--certs-dir",
        p(&n2_dir),
        "--ca-key",
        p(&m.tmp.path("new-ca.key")),
        "--node-id",
        "2",
        "node2.test",
    ]));
    let n2 = NodeTls::load(&n2_dir, Some(2)).expect("new node");
    let shake = |from: &NodeTls, to: &NodeTls| {
        let cfg: Arc<rustls::ClientConfig> = from.peer_dialer(to.node_id());
        let mut c = ClientConnection::new(cfg, tls::peer_server_name(to.node_id())).unwrap();
        let mut s = ServerConnection::new(to.peer_acceptor()).unwrap();
        gen::handshake(&mut c, &mut s)
    };
    shake(&n1, &n2).expect("old to new");
    shake(&n2, &n1).expect("new to old");
    let listed = ok(cert(&["list", "--certs-dir", p(&n2_dir)]));
    // The ISSUER column (FILE SUBJECT IDENTITY ISSUER ...): cells are
    // separated by two spaces or more, and none holds two.
    let issuer = |listed: &str, file: &str| {
        let line = listed
            .lines()
            .find(|l| l.starts_with(file))
            .unwrap_or_else(|| panic!("no {file} in {listed}"))
            .to_owned();
        line.split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .nth(3)
            .unwrap_or_else(|| panic!("no ISSUER in {line}"))
            .to_owned()
    };
    assert_eq!(issuer(&listed, "ca.crt#1"), "self");
    assert_eq!(issuer(&listed, "ca.crt#2"), "self");
    assert_eq!(issuer(&listed, "node.crt"), "ca.crt#2");
    // Node 1's, in its dir with the bundle: the old CA's.
    let listed = ok(cert(&["list", "--certs-dir", p(&m.certs)]));
    assert_eq!(issuer(&listed, "node.crt"), "ca.crt#1");
}
