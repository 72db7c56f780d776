//! The Raft (peer) ports of a cluster with certificates, attacked from
//! outside with real sockets: a plaintext dialer, a client certificate, a
//! node certificate claiming another node, oversized frames, thousands of
//! silent connections — none changes the term or the table, none crashes
//! a node, and the real peers and clients keep being served. Plus the
//! secure default: a cluster node without certificates refuses to start
//! unless told `--insecure`.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cluster::{cert_cli, Cluster};
use ringlock::cluster::wire;

const WAIT: Duration = Duration::from_secs(20);

fn start() -> Cluster {
    Cluster::start(3, 1, &["--metrics-bind", "127.0.0.1:0"])
}

/// Every node's shard-0 term, as its `/metrics` says.
fn terms(c: &Cluster) -> Vec<f64> {
    c.nodes
        .iter()
        .flatten()
        .map(|s| raft_series(s.metrics(), "ringlock_raft_term"))
        .collect()
}

/// The first sample of a labelled series.
fn raft_series(addr: SocketAddr, name: &str) -> f64 {
    let text = scrape(addr);
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

fn scrape(addr: SocketAddr) -> String {
    let mut c = TcpStream::connect(addr).expect("metrics port");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut s = String::new();
    c.read_to_string(&mut s).expect("metrics");
    s
}

fn refused(c: &Cluster, i: usize) -> f64 {
    common::metric(
        c.nodes[i].as_ref().unwrap().metrics(),
        "ringlock_peer_links_refused_total",
    )
}

/// Waits (bounded) until node `i` has counted more than `before` refused
/// peer links.
fn wait_refused(c: &Cluster, i: usize, before: f64) {
    let t = Instant::now();
    while refused(c, i) <= before {
        assert!(t.elapsed() < WAIT, "node {} refused no peer link", i + 1);
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The leader grants and releases a lock (the cluster still serves).
fn serves(c: &Cluster) {
    let l = c.leader(WAIT);
    let mut conn = c.conn(l);
    assert_eq!(conn.lock(b"peer-tls-probe", b"t"), b'+');
    assert_eq!(conn.unlock(b"peer-tls-probe"), b'+');
}

/// Reads until the server closes the connection (EOF or reset), bounded.
fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

fn hello(node: u64, voters: Vec<u64>) -> Vec<u8> {
    let mut b = Vec::new();
    wire::encode_hello(
        &wire::Hello {
            node,
            group: 0,
            groups: 1,
            voters,
            client_addr: "203.0.113.9:22119".into(),
        },
        &mut b,
    );
    b
}

/// A plaintext dialer (a Hello, a forged heartbeat) on a TLS peer port is
/// closed at its first byte; nothing it sent reaches Raft.
#[test]
fn a_plaintext_peer_is_closed_at_its_first_byte() {
    let c = start();
    let before = terms(&c);
    let target = 0;
    let r0 = refused(&c, target);
    let mut s = TcpStream::connect(c.raft_addr(target)).expect("peer port");
    let mut bytes = hello(2, vec![1, 2, 3]);
    // A heartbeat from "node 2" with a huge term right behind the Hello.
    let mut m = raft::eraftpb::Message::default();
    m.set_msg_type(raft::eraftpb::MessageType::MsgHeartbeat);
    m.from = 2;
    m.to = 1;
    m.term = 1 << 40;
    let payload = protobuf::Message::write_to_bytes(&m).unwrap();
    wire::frame(wire::KIND_RAFT, &payload, &mut bytes);
    s.write_all(&bytes).expect("send");
    assert!(closed_by_server(&mut s), "the plaintext link was closed");
    wait_refused(&c, target, r0);
    serves(&c);
    assert_eq!(terms(&c), before, "no term moved");
}

/// A certificate from the cluster's own CA that names a client, not a
/// node, does not pass the peer port's handshake.
#[test]
fn a_client_certificate_is_refused_on_a_peer_port() {
    let c = start();
    let before = terms(&c);
    let dir = c.dir.path("client-certs");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(c.dir.path("ca").join("ca.crt"), dir.join("ca.crt")).unwrap();
    cert_cli(&[
        "create-client",
        "--certs-dir",
        dir.to_str().unwrap(),
        "--ca-key",
        c.ca_key().to_str().unwrap(),
        "mallory",
    ]);
    let tls = ringlock::tls::ClientTls::load(&dir, Some("mallory")).expect("client certs");
    let r0 = refused(&c, 0);
    let mut s = tls_dial(c.raft_addr(0), tls.config_for_node(1));
    let mut bytes = hello(2, vec![1, 2, 3]);
    let _ = s.write_all(&bytes);
    bytes.clear();
    let _ = s.flush();
    let mut b = [0u8; 16];
    assert!(
        !matches!(s.read(&mut b), Ok(n) if n > 0),
        "the peer port sent data to a client certificate"
    );
    wait_refused(&c, 0, r0);
    serves(&c);
    assert_eq!(terms(&c), before, "no term moved");
}

/// Node 2's real certificate cannot speak for node 1 (or 3): its Hello
/// claiming another id is refused and logged.
#[test]
fn a_node_certificate_cannot_claim_another_node() {
    let c = start();
    let before = terms(&c);
    let node2 = ringlock::tls::NodeTls::load(&c.certs_dir(1), Some(2)).expect("node 2 certs");
    for claimed in [1u64, 3] {
        // To node 1 as "node 3", to node 3 as "node 1": never its own id.
        let target = if claimed == 1 { 2 } else { 0 };
        let r0 = refused(&c, target);
        let mut s = tls_dial(c.raft_addr(target), node2.peer_dialer(target as u64 + 1));
        s.write_all(&hello(claimed, vec![1, 2, 3])).expect("send");
        let _ = s.flush();
        let mut b = [0u8; 16];
        assert!(
            !matches!(s.read(&mut b), Ok(n) if n > 0),
            "a Hello claiming node {claimed} over node 2's certificate was answered"
        );
        wait_refused(&c, target, r0);
    }
    serves(&c);
    assert_eq!(terms(&c), before, "no term moved");
}

/// A frame header announcing 256 MiB before any Hello is refused from its
/// four length bytes (nothing is waited for or buffered), on a TLS link
/// of a real node certificate and on an `--insecure` cluster's plaintext
/// link alike.
#[test]
fn a_huge_frame_before_the_hello_is_refused_at_once() {
    let c = start();
    let node2 = ringlock::tls::NodeTls::load(&c.certs_dir(1), Some(2)).expect("node 2 certs");
    let r0 = refused(&c, 0);
    let mut s = tls_dial(c.raft_addr(0), node2.peer_dialer(1));
    s.write_all(&(256u32 << 20).to_le_bytes()).expect("send");
    let _ = s.flush();
    // Refused for its length, at once (not at the Hello deadline).
    c.nodes[0]
        .as_ref()
        .unwrap()
        .wait_log("peer frame of 268435456 bytes (at most 4096 here)");
    let mut b = [0u8; 16];
    assert!(!matches!(s.read(&mut b), Ok(n) if n > 0));
    wait_refused(&c, 0, r0);
    serves(&c);
    drop(c);

    // Not about TLS: the same bound on a plaintext (--insecure) link.
    let c = Cluster::start(3, 1, &["--metrics-bind", "127.0.0.1:0", "--insecure"]);
    let r0 = refused(&c, 0);
    let rss0 = rss_kb(c.nodes[0].as_ref().unwrap().pid());
    let mut conns = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(c.raft_addr(0)).expect("peer port");
        s.write_all(&(256u32 << 20).to_le_bytes()).expect("send");
        // Bytes of the announced frame follow; none of it is kept.
        let _ = s.write_all(&vec![0u8; 1 << 20]);
        conns.push(s);
    }
    c.nodes[0]
        .as_ref()
        .unwrap()
        .wait_log("peer frame of 268435456 bytes (at most 4096 here)");
    for s in &mut conns {
        assert!(closed_by_server(s), "the oversized frame's link was closed");
    }
    wait_refused(&c, 0, r0);
    let grown_kb = rss_kb(c.nodes[0].as_ref().unwrap().pid()).saturating_sub(rss0);
    assert!(
        grown_kb < 64 * 1024,
        "three 256 MiB frame headers grew node 1 by {grown_kb} KiB"
    );
    serves(&c);
}

/// 2 000 connections that never speak: the pending links are capped (a
/// new one evicts the oldest) and closed at the Hello deadline, the
/// node's descriptors stay bounded, and the cluster keeps serving (its
/// real links are not crowded out).
#[test]
fn two_thousand_silent_peer_connections_change_nothing() {
    let c = start();
    let before = terms(&c);
    let leader = c.leader(WAIT);
    let fds0 = c.nodes[leader].as_ref().unwrap().open_fds();
    let mut silent = Vec::new();
    for _ in 0..2000 {
        if let Ok(s) = TcpStream::connect_timeout(&c.raft_addr(leader), Duration::from_secs(2)) {
            silent.push(s);
        }
    }
    // The node closes all but the newest few as they come: evicted, not
    // left for the Hello deadline.
    c.nodes[leader]
        .as_ref()
        .unwrap()
        .wait_log("evicted: 16 links were waiting for their Hello");
    let t = Instant::now();
    loop {
        let fds = c.nodes[leader].as_ref().unwrap().open_fds();
        if fds <= fds0 + ringlock::driver::PEER_PENDING_MAX + 8 {
            break;
        }
        assert!(
            t.elapsed() < WAIT,
            "node {} holds {fds} descriptors (was {fds0}) for 2000 silent peers",
            leader + 1
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    serves(&c);
    assert_eq!(c.leader(WAIT), leader, "the leader kept its leadership");
    assert_eq!(terms(&c), before, "no term moved");
    // The ones kept are closed at the deadline: every connection ends.
    let t = Instant::now();
    for s in &mut silent {
        let left = WAIT
            .saturating_sub(t.elapsed())
            .max(Duration::from_millis(1));
        s.set_read_timeout(Some(left)).unwrap();
        let mut b = [0u8; 1];
        assert!(
            !matches!(s.read(&mut b), Ok(n) if n > 0),
            "a silent peer connection got data"
        );
    }
}

/// Secure by default: `--peers` without `--certs-dir` refuses to start and
/// says what to do; `--insecure` runs the cluster open, warned at start
/// and exported on `/metrics`.
#[test]
fn a_cluster_node_without_certificates_needs_insecure() {
    let dir = common::TempDir::new("peer-tls-default");
    let wal = dir.path("n1.log");
    let out = Command::new(env!("CARGO_BIN_EXE_ringlockd"))
        .args([
            "--node-id",
            "1",
            "--peers",
            "1=127.0.0.1:0",
            "--data-path",
            wal.to_str().unwrap(),
        ])
        .output()
        .expect("run ringlockd");
    assert_eq!(out.status.code(), Some(64), "refused as a usage error");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--certs-dir") && err.contains("ringlock cert") && err.contains("--insecure"),
        "the refusal says how to make certificates or what --insecure does: {err}"
    );
    assert!(!wal.exists(), "nothing was written");

    let c = Cluster::start(3, 1, &["--metrics-bind", "127.0.0.1:0", "--insecure"]);
    for s in c.nodes.iter().flatten() {
        assert_eq!(common::metric(s.metrics(), "ringlock_insecure"), 1.0);
    }
    serves(&c);
    drop(c);
    let c = start();
    for s in c.nodes.iter().flatten() {
        assert_eq!(common::metric(s.metrics(), "ringlock_insecure"), 0.0);
    }
}

/// A node with certificates and one without cannot link (either way), so
/// a half-converted cluster is noticed, not silently open.
#[test]
fn a_plaintext_node_cannot_join_a_tls_cluster() {
    let mut c = start();
    let leader = c.leader(WAIT);
    let other = (leader + 1) % 3;
    c.kill9(other);
    c.extra.push("--insecure".into());
    c.start_node(other);
    // The insecure node never learns a leader from the TLS nodes.
    let metrics = c.nodes[other].as_ref().unwrap().metrics();
    let r0 = refused(&c, leader);
    wait_refused(&c, leader, r0);
    assert_eq!(raft_series(metrics, "ringlock_raft_leader_id"), 0.0);
    serves(&c);
}

fn tls_dial(
    addr: SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let sock = TcpStream::connect(addr).expect("peer port");
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let name = rustls::pki_types::ServerName::try_from("ringlock-node").unwrap();
    let conn = rustls::ClientConnection::new(cfg, name).expect("client connection");
    rustls::StreamOwned::new(conn, sock)
}

fn rss_kb(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn reloads(c: &Cluster, i: usize, result: &str) -> f64 {
    common::metric(
        c.nodes[i].as_ref().unwrap().metrics(),
        &format!("ringlock_cert_reloads_total{{result=\"{result}\"}}"),
    )
}

/// Waits (bounded) until node `i` counted `want` reloads with `result`.
fn wait_reloads(c: &Cluster, i: usize, result: &str, want: f64) {
    let t = Instant::now();
    while reloads(c, i, result) < want {
        assert!(
            t.elapsed() < WAIT,
            "node {} never counted a {result} reload",
            i + 1
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGHUP with a certificate that does not parse, or a key of another
/// certificate, keeps the ones in use: the node keeps linking (a peer
/// restarted meanwhile links again) and says why.
#[test]
fn a_bad_reload_keeps_the_certificates_in_use() {
    let mut c = start();
    let dir = c.certs_dir(0);
    let good = std::fs::read(dir.join("node.crt")).unwrap();
    std::fs::write(
        dir.join("node.crt"),
        b"-----BEGIN CERTIFICATE-----\nnot base64\n",
    )
    .unwrap();
    c.signal(0, libc::SIGHUP);
    wait_reloads(&c, 0, "failed", 1.0);
    // A key that belongs to node 2's certificate.
    std::fs::write(dir.join("node.crt"), &good).unwrap();
    let key = std::fs::read(dir.join("node.key")).unwrap();
    std::fs::copy(c.certs_dir(1).join("node.key"), dir.join("node.key")).unwrap();
    c.signal(0, libc::SIGHUP);
    wait_reloads(&c, 0, "failed", 2.0);
    assert_eq!(reloads(&c, 0, "ok"), 0.0);
    // Node 1 still links with what it had: restart the others, one at a
    // time, and the cluster serves each time.
    for i in [1, 2] {
        c.kill9(i);
        c.start_node(i);
        serves(&c);
    }
    std::fs::write(dir.join("node.key"), key).unwrap();
    c.signal(0, libc::SIGHUP);
    wait_reloads(&c, 0, "ok", 1.0);
    serves(&c);
}

/// The CA is rotated across a rolling restart: the new CA is added to
/// every node's bundle, every node gets a certificate of the new CA, the
/// old CA is removed — the cluster serves at every step, and at the end a
/// certificate of the old CA is refused.
#[test]
fn the_ca_is_rotated_across_a_rolling_restart() {
    let mut c = start();
    let n = c.nodes.len();
    let new_ca = c.dir.path("newca");
    let new_key = c.dir.path("newca.key");
    cert_cli(&[
        "create-ca",
        "--certs-dir",
        new_ca.to_str().unwrap(),
        "--ca-key",
        new_key.to_str().unwrap(),
    ]);
    let old_pem = std::fs::read(c.dir.path("ca").join("ca.crt")).unwrap();
    let new_pem = std::fs::read(new_ca.join("ca.crt")).unwrap();
    let old_crt2 = std::fs::read(c.certs_dir(1).join("node.crt")).unwrap();
    let old_key2 = std::fs::read(c.certs_dir(1).join("node.key")).unwrap();
    let restart = |c: &mut Cluster, i: usize| {
        c.kill9(i);
        c.start_node(i);
        serves(c);
    };
    // 1. Both CAs trusted everywhere (a SIGHUP for one node, a restart
    //    for the others: both ways of picking it up).
    for i in 0..n {
        let mut both = old_pem.clone();
        both.extend_from_slice(&new_pem);
        std::fs::write(c.certs_dir(i).join("ca.crt"), both).unwrap();
    }
    c.signal(0, libc::SIGHUP);
    wait_reloads(&c, 0, "ok", 1.0);
    for i in 1..n {
        restart(&mut c, i);
    }
    // 2. Each node gets a certificate of the new CA, one at a time.
    for i in 0..n {
        let dir = c.certs_dir(i);
        std::fs::remove_file(dir.join("node.crt")).unwrap();
        std::fs::remove_file(dir.join("node.key")).unwrap();
        cert_cli(&[
            "create-node",
            "--certs-dir",
            dir.to_str().unwrap(),
            "--ca-key",
            new_key.to_str().unwrap(),
            "--node-id",
            &(i + 1).to_string(),
            "127.0.0.1",
        ]);
        restart(&mut c, i);
    }
    // 3. The old CA goes.
    for i in 0..n {
        std::fs::write(c.certs_dir(i).join("ca.crt"), &new_pem).unwrap();
        restart(&mut c, i);
    }
    // Node 2's old certificate (old CA) is refused now, by the node: the
    // dialer trusts both CAs, so it is the acceptor that says no.
    let mut both = old_pem.clone();
    both.extend_from_slice(&new_pem);
    let old_node2 = ringlock::tls::NodeTls::from_pem(&both, &old_crt2, &old_key2, Some(2)).unwrap();
    let r0 = refused(&c, 0);
    let mut s = tls_dial(c.raft_addr(0), old_node2.peer_dialer(1));
    let _ = s.write_all(&hello(2, vec![1, 2, 3]));
    let _ = s.flush();
    let mut b = [0u8; 16];
    assert!(!matches!(s.read(&mut b), Ok(n) if n > 0));
    wait_refused(&c, 0, r0);
    serves(&c);
}
