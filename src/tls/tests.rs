//! Certificates made at test time with [`gen`] (as `ringlock cert` makes
//! them), handshakes driven in memory with [`gen::handshake`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, ServerConfig, ServerConnection};

use super::gen::{self, Issued, Issuer, Validity};
use super::testkit::{new_ca, Ca};
use super::*;

/// A window that ended yesterday.
fn expired() -> Validity {
    let now = SystemTime::now();
    Validity {
        not_before: now - Duration::from_secs(10 * 86_400),
        not_after: now - Duration::from_secs(86_400),
    }
}

/// A NodeTls from parts that `NodeTls::from_pem` would refuse (an expired
/// certificate, say), to see the handshake refuse them too.
fn unchecked_node(ca_pem: &[u8], c: &Issued, id: u64) -> NodeTls {
    let pem = |label: &str, bytes: &[u8]| Pem {
        label: label.into(),
        bytes: bytes.to_vec(),
    };
    let roots = pem_roots(&pem("ca.crt", ca_pem)).expect("roots");
    let chain = pem_certs(&pem("node.crt", c.cert_pem.as_bytes())).expect("chain");
    let key =
        certified_key(chain, &pem("node.key", c.key_pem.as_bytes()), "node.crt").expect("key");
    NodeTls::assemble(roots, key, id, c.not_after).expect("configs")
}

/// Both ends of a handshake and how it went.
struct Shake {
    result: Result<(), String>,
    client: ClientConnection,
    server: ServerConnection,
}

fn shake(client: Arc<ClientConfig>, name: ServerName<'static>, server: Arc<ServerConfig>) -> Shake {
    let mut client = ClientConnection::new(client, name).expect("client connection");
    let mut server = ServerConnection::new(server).expect("server connection");
    let result = gen::handshake(&mut client, &mut server);
    Shake {
        result,
        client,
        server,
    }
}

fn dns(name: &str) -> ServerName<'static> {
    ServerName::try_from(name.to_owned()).expect("server name")
}

#[track_caller]
fn assert_fails(s: &Shake, side: &str, words: &[&str]) {
    let err = s.result.as_ref().expect_err("the handshake must fail");
    assert!(
        err.starts_with(&format!("{side}: ")),
        "the {side} should refuse: {err}"
    );
    for w in words {
        assert!(err.contains(w), "{err:?} should say {w:?}");
    }
}

#[test]
fn peers_handshake_and_see_each_others_node_id() {
    let ca = new_ca();
    let (n1, n2) = (ca.node(1), ca.node(2));
    assert_eq!((n1.node_id(), n2.node_id()), (1, 2));
    let s = shake(n1.peer_dialer(2), peer_server_name(2), n2.peer_acceptor());
    s.result.expect("node 1 dials node 2");
    assert_eq!(peer_identity(&s.client), Some(Identity::Node(2)));
    assert_eq!(peer_identity(&s.server), Some(Identity::Node(1)));
    assert_eq!(
        s.client.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
}

#[test]
fn no_tickets_no_session_cache_no_early_data() {
    let ca = new_ca();
    let n1 = ca.node(1);
    for server in [
        n1.peer_acceptor(),
        n1.client_acceptor(true),
        n1.client_acceptor(false),
    ] {
        assert_eq!(server.send_tls13_tickets, 0);
        assert_eq!(server.max_early_data_size, 0);
        assert!(!server.session_storage.can_cache());
    }
    for client in [n1.peer_dialer(2), ca.client(None).config()] {
        assert!(!client.enable_early_data);
    }
    // A completed handshake leaves nothing to send: no NewSessionTicket.
    let n2 = ca.node(2);
    let mut s = shake(n1.peer_dialer(2), peer_server_name(2), n2.peer_acceptor());
    s.result.expect("handshake");
    assert!(!s.server.wants_write());
    assert!(s.server.process_new_packets().is_ok());
}

#[test]
fn a_client_certificate_is_refused_on_the_peer_port() {
    let ca = new_ca();
    let alice = ca.client(Some("alice"));
    let s = shake(
        alice.config_for_node(1),
        peer_server_name(1),
        ca.node(1).peer_acceptor(),
    );
    assert_fails(&s, "server", &["client alice", "a node's is required"]);
}

#[test]
fn dialling_node_1_refuses_node_2() {
    let ca = new_ca();
    let s = shake(
        ca.node(3).peer_dialer(1),
        peer_server_name(1),
        ca.node(2).peer_acceptor(),
    );
    assert_fails(&s, "client", &["node 2's, not node 1's"]);
}

#[test]
fn a_node_of_another_ca_is_refused_both_ways() {
    let (a, b) = (new_ca(), new_ca());
    let a1 = a.node(1);
    let b2 = b.node(2);
    // As the server: a1 does not trust b.
    let s = shake(a1.peer_dialer(2), peer_server_name(2), b2.peer_acceptor());
    assert_fails(&s, "client", &["UnknownIssuer"]);
    // As the client: a dialler trusting both CAs but holding b's
    // certificate is refused by a1, which trusts only a.
    let both = [a.pem(), b.pem()].concat();
    let c = b.node_cert(2);
    let b2_trusting_both =
        NodeTls::from_pem(&both, c.cert_pem.as_bytes(), c.key_pem.as_bytes(), Some(2))
            .expect("b's node 2 with both CAs");
    let s = shake(
        b2_trusting_both.peer_dialer(1),
        peer_server_name(1),
        a1.peer_acceptor(),
    );
    assert_fails(&s, "server", &["UnknownIssuer"]);
}

#[test]
fn an_expired_node_certificate_is_refused() {
    let ca = new_ca();
    let c = ca
        .issuer
        .node(2, &["node2.example".into()], expired())
        .expect("cert");
    let err = NodeTls::from_pem(ca.pem(), c.cert_pem.as_bytes(), c.key_pem.as_bytes(), None)
        .expect_err("load refuses an expired certificate");
    assert!(err.starts_with("node.crt: expired at "), "{err}");
    let old2 = unchecked_node(ca.pem(), &c, 2);
    let n1 = ca.node(1);
    // Served: the dialler refuses it.
    let s = shake(n1.peer_dialer(2), peer_server_name(2), old2.peer_acceptor());
    assert_fails(&s, "client", &["certificate expired"]);
    // Presented by the dialler: the acceptor refuses it.
    let s = shake(old2.peer_dialer(1), peer_server_name(1), n1.peer_acceptor());
    assert_fails(&s, "server", &["certificate expired"]);
    // To a client.
    let s = shake(
        ca.client(None).config(),
        dns("node2.example"),
        old2.client_acceptor(false),
    );
    assert_fails(&s, "client", &["certificate expired"]);
}

#[test]
fn client_port_with_and_without_a_client_certificate() {
    let ca = new_ca();
    let n1 = ca.node(1);
    let s = shake(
        ca.client(Some("alice")).config(),
        dns("node1.example"),
        n1.client_acceptor(false),
    );
    s.result.expect("with a certificate");
    assert_eq!(
        peer_identity(&s.server),
        Some(Identity::Client("alice".into()))
    );
    assert_eq!(peer_identity(&s.client), Some(Identity::Node(1)));

    let s = shake(
        ca.client(None).config(),
        dns("node1.example"),
        n1.client_acceptor(false),
    );
    s.result.expect("without one, where it is optional");
    assert_eq!(peer_identity(&s.server), None);

    let s = shake(
        ca.client(None).config(),
        dns("node1.example"),
        n1.client_acceptor(true),
    );
    assert_fails(&s, "server", &["peer sent no certificates"]);

    let s = shake(
        ca.client(Some("bob")).config(),
        dns("node1.example"),
        n1.client_acceptor(true),
    );
    s.result.expect("with one, where it is required");
}

#[test]
fn a_node_certificate_is_refused_as_a_client_certificate() {
    let ca = new_ca();
    let n1 = ca.node(1);
    let s = shake(
        ca.node(2).peer_dialer(1),
        peer_server_name(1),
        n1.client_acceptor(false),
    );
    assert_fails(&s, "server", &["node 2's; a client's is required"]);
    let c = ca.node_cert(2);
    let err = ClientTls::from_pem(
        ca.pem(),
        Some((c.cert_pem.as_bytes(), c.key_pem.as_bytes())),
    )
    .expect_err("a node certificate is not a client's");
    assert_eq!(err, "client.crt: is node 2's certificate, not a client's");
}

#[test]
fn the_client_checks_the_host_name_dialled() {
    let ca = new_ca();
    let n1 = ca.node(1);
    let client = ca.client(None);
    for good in [dns("node1.example"), dns("10.1.2.1")] {
        let s = shake(client.config(), good.clone(), n1.client_acceptor(false));
        s.result
            .unwrap_or_else(|e| panic!("{good:?} is named by node 1's certificate: {e}"));
    }
    for bad in [dns("node2.example"), dns("10.1.2.2")] {
        let s = shake(client.config(), bad, n1.client_acceptor(false));
        assert_fails(&s, "client", &["certificate not valid for name"]);
    }
    // Following a "not leader" hint: the node id counts, not the name.
    let s = shake(
        client.config_for_node(1),
        peer_server_name(1),
        n1.client_acceptor(false),
    );
    s.result.expect("node 1 by id");
    let s = shake(
        client.config_for_node(2),
        dns("node1.example"),
        n1.client_acceptor(false),
    );
    assert_fails(&s, "client", &["node 1's, not node 2's"]);
}

#[test]
fn a_ca_bundle_trusts_the_old_and_the_new_ca() {
    let (old, new) = (new_ca(), new_ca());
    let bundle = [old.pem(), new.pem()].concat();
    // The issuer is picked from the bundle by its key.
    let new_issuer = Issuer::from_pem("ca.crt", &bundle, "new.key", new.cert.key_pem.as_bytes())
        .expect("new CA found in the bundle");
    let c2 = new_issuer
        .node(2, &["node2.example".into()], Validity::days(1))
        .expect("node 2 under the new CA");
    NodeTls::from_pem(
        new.pem(),
        c2.cert_pem.as_bytes(),
        c2.key_pem.as_bytes(),
        Some(2),
    )
    .expect("signed by the new CA");
    let c1 = old.node_cert(1);
    let n1 = NodeTls::from_pem(
        &bundle,
        c1.cert_pem.as_bytes(),
        c1.key_pem.as_bytes(),
        Some(1),
    )
    .expect("old CA's node with the bundle");
    let n2 = NodeTls::from_pem(
        &bundle,
        c2.cert_pem.as_bytes(),
        c2.key_pem.as_bytes(),
        Some(2),
    )
    .expect("new CA's node with the bundle");
    shake(n1.peer_dialer(2), peer_server_name(2), n2.peer_acceptor())
        .result
        .expect("old dials new");
    shake(n2.peer_dialer(1), peer_server_name(1), n1.peer_acceptor())
        .result
        .expect("new dials old");
    let client = ClientTls::from_pem(&bundle, None).expect("client with the bundle");
    for (name, node) in [("node1.example", &n1), ("node2.example", &n2)] {
        shake(client.config(), dns(name), node.client_acceptor(false))
            .result
            .expect("client reaches both");
    }
}

#[test]
fn an_issuer_needs_the_key_of_a_ca_in_the_bundle() {
    let (a, b) = (new_ca(), new_ca());
    let err = Issuer::from_pem("ca.crt", a.pem(), "b.key", b.cert.key_pem.as_bytes())
        .expect_err("b's key does not sign for a");
    assert!(
        err.starts_with("b.key is not the key of any CA certificate in ca.crt (1 certificate)"),
        "{err}"
    );
    let err = Issuer::from_pem("ca.crt", a.pem(), "a.crt", a.pem()).expect_err("not a key");
    assert!(
        err.starts_with("a.crt: not a PKCS#8 PEM private key"),
        "{err}"
    );
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "ringlock-tls-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }

    fn write(&self, name: &str, bytes: &[u8]) {
        std::fs::write(self.0.join(name), bytes).expect("write");
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn load_reads_and_checks_the_certs_dir() {
    let ca = new_ca();
    let dir = TempDir::new();
    let path = |f: &str| dir.0.join(f).display().to_string();
    let c1 = ca.node_cert(1);
    dir.write(CA_FILE, ca.pem());
    dir.write(NODE_CERT_FILE, c1.cert_pem.as_bytes());

    let err = NodeTls::load(&dir.0, None).expect_err("no key yet");
    assert!(
        err.starts_with(&format!("{}: cannot read: ", path("node.key"))),
        "{err}"
    );

    // Another node's key.
    dir.write(NODE_KEY_FILE, ca.node_cert(1).key_pem.as_bytes());
    let err = NodeTls::load(&dir.0, None).expect_err("wrong key");
    assert_eq!(
        err,
        format!(
            "{}: is not the key of {} (the certificate holds another public key)",
            path("node.key"),
            path("node.crt")
        )
    );

    dir.write(NODE_KEY_FILE, c1.key_pem.as_bytes());
    let n1 = NodeTls::load(&dir.0, Some(1)).expect("loads");
    assert_eq!(n1.node_id(), 1);
    assert_eq!(n1.not_after(), c1.not_after);
    let err = NodeTls::load(&dir.0, Some(2)).expect_err("not node 2");
    assert_eq!(
        err,
        format!(
            "{}: is node 1's certificate, but this is node 2",
            path("node.crt")
        )
    );

    // A client's certificate and key as node.crt / node.key.
    let alice = ca.client_cert("alice");
    dir.write(NODE_CERT_FILE, alice.cert_pem.as_bytes());
    dir.write(NODE_KEY_FILE, alice.key_pem.as_bytes());
    let err = NodeTls::load(&dir.0, None).expect_err("not a node");
    assert_eq!(
        err,
        format!(
            "{}: is client alice's certificate, not a node's",
            path("node.crt")
        )
    );

    // The node's certificate where the CA's should be.
    dir.write(CA_FILE, c1.cert_pem.as_bytes());
    let err = NodeTls::load(&dir.0, None).expect_err("ca.crt is no CA");
    assert_eq!(
        err,
        format!(
            "{}: CN=ringlock node 1 is not a CA certificate (ca.crt holds only the CA's)",
            path("ca.crt")
        )
    );

    // A node certificate of another CA.
    dir.write(CA_FILE, ca.pem());
    let other = new_ca().node_cert(1);
    dir.write(NODE_CERT_FILE, other.cert_pem.as_bytes());
    dir.write(NODE_KEY_FILE, other.key_pem.as_bytes());
    let err = NodeTls::load(&dir.0, None).expect_err("another CA");
    assert_eq!(
        err,
        format!(
            "{}: not issued by any CA in {}",
            path("node.crt"),
            path("ca.crt")
        )
    );

    // Clients.
    dir.write("client.alice.crt", alice.cert_pem.as_bytes());
    dir.write("client.alice.key", alice.key_pem.as_bytes());
    let client = ClientTls::load(&dir.0, Some("alice")).expect("alice loads");
    assert_eq!(client.client_name(), Some("alice"));
    ClientTls::load(&dir.0, None).expect("no client certificate");
    let err = ClientTls::load(&dir.0, Some("bob")).expect_err("no bob");
    assert!(
        err.starts_with(&format!("{}: cannot read", path("client.bob.crt"))),
        "{err}"
    );
    // alice's files under bob's name.
    dir.write("client.bob.crt", alice.cert_pem.as_bytes());
    dir.write("client.bob.key", alice.key_pem.as_bytes());
    let err = ClientTls::load(&dir.0, Some("bob")).expect_err("alice is not bob");
    assert_eq!(
        err,
        format!(
            "{}: is client alice's certificate, not client bob's",
            path("client.bob.crt")
        )
    );
    let err = ClientTls::load(&dir.0, Some("../x")).expect_err("bad name");
    assert!(err.contains("'/' is not allowed"), "{err}");
}

#[test]
fn list_names_every_certificate_of_the_dir() {
    let (old, new) = (new_ca(), new_ca());
    let dir = TempDir::new();
    dir.write(CA_FILE, &[old.pem(), new.pem()].concat());
    dir.write(NODE_CERT_FILE, new.node_cert(7).cert_pem.as_bytes());
    // zed's is of the old CA.
    dir.write("client.zed.crt", old.client_cert("zed").cert_pem.as_bytes());
    dir.write("client.amy.crt", new.client_cert("amy").cert_pem.as_bytes());
    dir.write(NODE_KEY_FILE, b"not listed");
    let listed = list(&dir.0).expect("list");
    let rows: Vec<_> = listed
        .iter()
        .map(|c| {
            (
                c.path.file_name().unwrap().to_string_lossy().into_owned(),
                c.index,
                c.count,
                c.subject.clone(),
                c.is_ca,
                c.identity.clone().ok(),
                c.issued_by,
            )
        })
        .collect();
    let ca_row = |i, ca: &Ca| {
        let subject = parse(&CertificateDer::from_pem_slice(ca.pem()).expect("der"))
            .expect("parse")
            .subject;
        assert!(subject.starts_with("CN=ringlock CA, OU=key "), "{subject}");
        ("ca.crt".to_string(), i, 2, subject, true, None, Some(i))
    };
    assert_eq!(
        rows,
        [
            ca_row(0, &old),
            ca_row(1, &new),
            (
                "node.crt".into(),
                0,
                1,
                "CN=ringlock node 7".into(),
                false,
                Some(Identity::Node(7)),
                Some(1)
            ),
            (
                "client.amy.crt".into(),
                0,
                1,
                "CN=ringlock client amy".into(),
                false,
                Some(Identity::Client("amy".into())),
                Some(1)
            ),
            (
                "client.zed.crt".into(),
                0,
                1,
                "CN=ringlock client zed".into(),
                false,
                Some(Identity::Client("zed".into())),
                Some(0)
            ),
        ]
    );
    assert!(listed[2].not_before < SystemTime::now() && SystemTime::now() < listed[2].not_after);
}

#[test]
fn identity_uris_have_one_spelling() {
    assert_eq!(
        Identity::from_uri("ringlock://node/1"),
        Ok(Identity::Node(1))
    );
    assert_eq!(
        Identity::from_uri("ringlock://node/18446744073709551615"),
        Ok(Identity::Node(u64::MAX))
    );
    assert_eq!(
        Identity::from_uri("ringlock://client/a.B_9-z"),
        Ok(Identity::Client("a.B_9-z".into()))
    );
    let max = "x".repeat(CLIENT_NAME_MAX);
    assert!(Identity::from_uri(&format!("ringlock://client/{max}")).is_ok());
    for bad in [
        "ringlock://node/0",
        "ringlock://node/01",
        "ringlock://node/+1",
        "ringlock://node/-1",
        "ringlock://node/",
        "ringlock://node/1/",
        "ringlock://node/18446744073709551616",
        "ringlock://client/",
        "ringlock://client/a/b",
        "ringlock://client/a b",
        "ringlock://client/é",
        "RINGLOCK://node/1",
        "ringlock://Node/1",
        "ringlock://server/1",
    ] {
        assert!(Identity::from_uri(bad).is_err(), "{bad} must be refused");
    }
    assert!(Identity::from_uri(&format!("ringlock://client/{max}x")).is_err());
    for id in [Identity::Node(42), Identity::Client("ops-1".into())] {
        assert_eq!(Identity::from_uri(&id.uri()), Ok(id.clone()));
    }
    assert_eq!(Identity::Node(3).to_string(), "node 3");
    assert_eq!(
        Identity::Client("x".into()).common_name(),
        "ringlock client x"
    );
}

/// A self-signed certificate with these URI names (identity_of does not
/// look at the chain).
fn with_uris(uris: &[&str]) -> Vec<u8> {
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = uris
        .iter()
        .map(|u| rcgen::SanType::URI(u.to_string().try_into().expect("ia5")))
        .collect();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    params.self_signed(&key).expect("cert").der().to_vec()
}

#[test]
fn identity_of_wants_exactly_one_well_formed_ringlock_uri() {
    assert_eq!(
        identity_of(&with_uris(&["https://example.com/", "ringlock://node/5"])),
        Ok(Identity::Node(5))
    );
    let err = identity_of(&with_uris(&["ringlock://node/1", "ringlock://client/x"])).unwrap_err();
    assert_eq!(
        err,
        "2 ringlock:// URI names (ringlock://node/1, ringlock://client/x); \
         a certificate names exactly one identity"
    );
    let err = identity_of(&with_uris(&["https://example.com/"])).unwrap_err();
    assert!(err.starts_with("no ringlock identity"), "{err}");
    let err = identity_of(&with_uris(&[])).unwrap_err();
    assert!(err.starts_with("no ringlock identity"), "{err}");
    // A near miss is an error, not ignored.
    let err = identity_of(&with_uris(&["RingLock://node/1"])).unwrap_err();
    assert!(err.contains("is neither ringlock://node/<id>"), "{err}");
    let err = identity_of(&with_uris(&["ringlock://node/007"])).unwrap_err();
    assert!(err.contains("without leading zeros"), "{err}");
    let err = identity_of(b"not DER").unwrap_err();
    assert!(err.starts_with("not an X.509 certificate"), "{err}");
    let ca = new_ca();
    let der = CertificateDer::from_pem_slice(ca.pem()).expect("der");
    assert!(identity_of(&der)
        .unwrap_err()
        .starts_with("no ringlock identity"));
}

#[test]
fn hosts_are_ip_addresses_or_dns_names() {
    for good in [
        "localhost",
        "node-1.example.com",
        "10.0.0.1",
        "::1",
        "fe80::1",
    ] {
        gen::check_host(good).unwrap_or_else(|e| panic!("{good}: {e}"));
    }
    for bad in [
        "",
        "*.example.com",
        "[::1]",
        "host:22119",
        "a b",
        "under_score..x",
    ] {
        assert!(gen::check_host(bad).is_err(), "{bad:?} must be refused");
    }
}

#[test]
fn a_leaf_never_outlives_its_ca() {
    let ca = gen::ca(Validity::days(2)).expect("short CA");
    let issuer = Issuer::from_pem(
        "ca.crt",
        ca.cert_pem.as_bytes(),
        "ca.key",
        ca.key_pem.as_bytes(),
    )
    .expect("issuer");
    let c = issuer
        .client("x", Validity::days(gen::CLIENT_DAYS))
        .expect("client");
    assert_eq!(c.not_after, ca.not_after);
    let gone = gen::ca(expired()).expect("expired CA");
    let err = Issuer::from_pem(
        "ca.crt",
        gone.cert_pem.as_bytes(),
        "ca.key",
        gone.key_pem.as_bytes(),
    )
    .expect_err("an expired CA issues nothing");
    assert!(
        err.starts_with("ca.crt: the CA of ca.key expired at "),
        "{err}"
    );
}

#[test]
fn handshakes_use_x25519() {
    // P-384 (listed first by this rustls for ring) costs ~20 times more per
    // handshake: the provider puts X25519 first for both ends.
    let ca = new_ca();
    let n1 = ca.node(1);
    let s = shake(
        ca.client(None).config(),
        dns("node1.example"),
        n1.client_acceptor(false),
    );
    s.result.expect("handshake");
    assert_eq!(
        s.server.negotiated_key_exchange_group().map(|g| g.name()),
        Some(rustls::NamedGroup::X25519)
    );
    let s = shake(n1.peer_dialer(1), peer_server_name(1), n1.peer_acceptor());
    s.result.expect("peer handshake");
    assert_eq!(
        s.client.negotiated_key_exchange_group().map(|g| g.name()),
        Some(rustls::NamedGroup::X25519)
    );
}
