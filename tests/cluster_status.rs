//! The operations surface of a replicated cluster, on three real
//! `ringlockd` processes: the admin command `CLST` answered by every node
//! (leader or not), `ringlock cluster status` (the real CLI binary), the
//! `ringlock_raft_*` metrics (through `promtool check metrics`) and
//! `/readyz`, which is 200 only on the serving leader, before and after a
//! `kill -9` of the leader. A single-node server answers `CLST` "not a
//! cluster member", exports no raft series and stays ready.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Output};
use std::time::Duration;

use common::cluster::Cluster;
use common::fault_proxy::poll_until;
use common::{promtool_check_metrics, Server};
use ringlock::client::{Client, RetryPolicy, Role, ShardStatus};

const WAIT: Duration = Duration::from_secs(20);

/// `CLST` on node `i`'s admin port (`None`: no answer).
fn status(c: &Cluster, i: usize) -> Option<Vec<ShardStatus>> {
    let admin = c.nodes[i].as_ref()?.admin_addr;
    status_at(admin).expect("a cluster node is a member")
}

fn status_at(admin: SocketAddr) -> Option<Option<Vec<ShardStatus>>> {
    let client = Client::builder(admin)
        .admin_addr(admin)
        .retry(RetryPolicy::none())
        .io_timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    client.cluster_status().ok()
}

/// Status and body of one GET on a metrics port.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics port");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(s, "GET {path} HTTP/1.1\r\nHost: ringlock\r\n\r\n").expect("request");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("answer");
    let code = answer[9..12].parse().expect("an HTTP status");
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

fn metrics_addr(c: &Cluster, i: usize) -> SocketAddr {
    c.nodes[i]
        .as_ref()
        .expect("running")
        .metrics_addr
        .expect("metrics= in the listening line")
}

fn readyz(c: &Cluster, i: usize) -> u16 {
    get(metrics_addr(c, i), "/readyz").0
}

/// The value of the series `name` (labels included, exactly) in `text`.
fn series(text: &str, name: &str) -> Option<f64> {
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

fn scrape(c: &Cluster, i: usize) -> String {
    let (code, body) = get(metrics_addr(c, i), "/metrics");
    assert_eq!(code, 200);
    body
}

fn admin_list(c: &Cluster) -> String {
    (0..c.nodes.len())
        .map(|i| admin_addr_of(c, i).to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Node `i`'s admin address, also after it was killed (the address the
/// CLI is given does not change).
fn admin_addr_of(c: &Cluster, i: usize) -> SocketAddr {
    c.nodes[i].as_ref().expect("running").admin_addr
}

fn cli_status(admins: &str, json: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringlock"));
    cmd.env_remove("RINGLOCK_ADDR")
        .env_remove("RINGLOCK_ADMIN_ADDR")
        .env_remove("RINGLOCK_AUTH_TOKEN_FILE")
        .args(["--admin-addr", admins, "cluster", "status"]);
    if json {
        cmd.arg("--json");
    }
    cmd.output().expect("run ringlock")
}

/// The table row of the node at `addr` (shard 0, or its only row).
fn row<'a>(table: &'a str, addr: &str) -> Vec<&'a str> {
    table
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(addr))
        .unwrap_or_else(|| panic!("no row for {addr} in:\n{table}"))
        .split_whitespace()
        .collect()
}

/// Status from all three nodes agrees on one leader, commit ≥ applied and
/// the followers' lag is small after a few grants; the CLI prints it and
/// exits 0; the metrics pass promtool and show the term, the leader and
/// the commit latency; `/readyz` is 200 on the leader only. Then `kill -9`
/// of the leader: the two others show the new leader and the dead node
/// as down, `/readyz` moves to the new leader, the term and the leader
/// changes grow.
#[test]
fn status_metrics_and_readiness_follow_the_leader_through_kill9() {
    let mut c = Cluster::start(3, 1, &["--metrics-bind", "127.0.0.1:0"]);
    let l = c.leader(WAIT);
    let lid = l as u64 + 1;
    let mut conn = c.conn(l);
    for k in 0..5u8 {
        let key = [b'k', b'0' + k];
        assert_eq!(conn.lock(&key, b"ops"), b'+');
        assert_eq!(conn.unlock(&key), b'+');
    }
    assert_eq!(conn.lock(b"kept", b"ops"), b'+');
    drop(conn);

    // Every node answers, followers included, and names the same leader;
    // followers catch up within a few heartbeats.
    let mut last: Vec<Vec<ShardStatus>> = Vec::new();
    poll_until(
        "every node answers CLST, names one leader, caught up",
        WAIT,
        || {
            last = (0..3).filter_map(|i| status(&c, i)).collect();
            last.len() == 3
                && last.iter().flatten().all(|s| s.leader == lid)
                && last
                    .iter()
                    .flatten()
                    .all(|s| s.applied == last[l][0].last_index)
        },
    );
    let leader_rec = &last[l][0];
    assert_eq!(leader_rec.role, Role::Leader);
    assert!(leader_rec.serving && leader_rec.lease_valid);
    assert_eq!(leader_rec.followers.len(), 2, "{leader_rec:?}");
    for f in &leader_rec.followers {
        assert!(
            leader_rec.lag(f) <= 2,
            "follower {} lags by {} ({leader_rec:?})",
            f.node,
            leader_rec.lag(f)
        );
    }
    for (i, recs) in last.iter().enumerate() {
        assert_eq!(recs.len(), 1, "one record per shard");
        let s = &recs[0];
        assert_eq!(s.node, i as u64 + 1);
        assert_eq!(s.term, leader_rec.term, "one term: {last:?}");
        assert!(s.commit >= s.applied, "{s:?}");
        // Each grant and release is an entry: the log grew past them.
        assert!(s.applied >= 11, "{s:?}");
        if i != l {
            assert_eq!(s.role, Role::Follower, "{s:?}");
            assert!(!s.serving && s.followers.is_empty(), "{s:?}");
            // A follower answers KEYS after a read barrier: what the
            // leader holds, no less (linearizable); changes stay refused.
            let keys = |n: usize| {
                let mut k: Vec<Vec<u8>> = common::keys(admin_addr_of(&c, n))
                    .into_iter()
                    .map(|k| k.key)
                    .collect();
                k.sort();
                k
            };
            let held = keys(l);
            assert!(!held.is_empty(), "the test holds keys");
            assert_eq!(keys(i), held, "KEYS on follower node {}", i + 1);
            let mut a = TcpStream::connect(admin_addr_of(&c, i)).expect("admin");
            a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            a.write_all(b"RSBS\0\0\0\0").unwrap();
            let mut b = Vec::new();
            let _ = a.read_to_end(&mut b);
            assert_eq!(b, b"-", "RSBS on a follower is refused");
        }
    }

    // The CLI, against all three.
    let admins = admin_list(&c);
    let out = cli_status(&admins, false);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for i in 0..3 {
        let r = row(&table, &admin_addr_of(&c, i).to_string());
        assert_eq!(r[0], (i + 1).to_string(), "{table}");
        assert_eq!(r[3], if i == l { "leader" } else { "follower" }, "{table}");
        assert_eq!(r[5], lid.to_string(), "{table}");
        let (commit, applied): (u64, u64) = (r[6].parse().unwrap(), r[7].parse().unwrap());
        assert!(commit >= applied, "{table}");
        if i != l {
            let lag: u64 = r[8].parse().unwrap_or_else(|_| panic!("a lag: {table}"));
            assert!(lag <= 2, "{table}");
        }
        assert_eq!(r[9], if i == l { "yes" } else { "no" }, "{table}");
    }
    let json = String::from_utf8_lossy(&cli_status(&admins, true).stdout).into_owned();
    assert_eq!(json.matches("\"up\":true").count(), 3, "{json}");
    assert_eq!(json.matches("\"role\":\"leader\"").count(), 1, "{json}");

    // Metrics: promtool, the term, who leads, the latency of commits.
    let mut term_before = 0.0;
    let mut changes_before = Vec::new();
    for i in 0..3 {
        let text = scrape(&c, i);
        assert!(promtool_check_metrics(&text), "promtool rejected:\n{text}");
        let term = series(&text, "ringlock_raft_term{shard=\"0\"}").expect("term");
        assert_eq!(term, leader_rec.term as f64);
        term_before = term;
        assert_eq!(
            series(&text, "ringlock_raft_leader{shard=\"0\"}"),
            Some(if i == l { 1.0 } else { 0.0 })
        );
        assert_eq!(
            series(&text, "ringlock_raft_serving{shard=\"0\"}"),
            Some(if i == l { 1.0 } else { 0.0 })
        );
        assert_eq!(
            series(&text, "ringlock_raft_leader_id{shard=\"0\"}"),
            Some(lid as f64)
        );
        let changes = series(&text, "ringlock_raft_leader_changes_total{shard=\"0\"}").unwrap();
        assert!(changes >= 1.0, "the first leader counts:\n{text}");
        changes_before.push(changes);
        assert!(series(&text, "ringlock_raft_apply_lag{shard=\"0\"}").is_some());
        let lags = text
            .lines()
            .filter(|l| l.starts_with("ringlock_raft_follower_lag{"))
            .count();
        assert_eq!(lags, if i == l { 2 } else { 0 }, "{text}");
        let commits = series(&text, "ringlock_raft_commit_latency_seconds_count").unwrap();
        if i == l {
            assert!(
                commits >= 11.0,
                "every grant and release committed:\n{text}"
            );
        }
    }

    // /readyz: the leader only.
    poll_until("/readyz is 200 on the leader only", WAIT, || {
        (0..3).all(|i| (readyz(&c, i) == 200) == (i == l))
    });
    let (_, why) = get(metrics_addr(&c, (l + 1) % 3), "/readyz");
    assert!(why.contains("not serving"), "{why}");
    for i in 0..3 {
        assert_eq!(get(metrics_addr(&c, i), "/livez").0, 200, "livez unchanged");
    }

    // kill -9 of the leader.
    let dead_admin = admin_addr_of(&c, l).to_string();
    c.kill9(l);
    let l2 = c.leader(WAIT);
    assert_ne!(l2, l);
    let lid2 = l2 as u64 + 1;
    let other = (0..3).find(|&i| i != l && i != l2).unwrap();
    poll_until("/readyz moves to the new leader", WAIT, || {
        readyz(&c, l2) == 200 && readyz(&c, other) == 503
    });
    let mut table = String::new();
    poll_until("the CLI shows the new leader, exit 0", WAIT, || {
        let out = cli_status(&admins, false);
        table = String::from_utf8_lossy(&out.stdout).into_owned();
        out.status.code() == Some(0)
    });
    let dead = row(&table, &dead_admin);
    assert_eq!(dead[3], "down", "{table}");
    let new = row(&table, &admin_addr_of(&c, l2).to_string());
    assert_eq!((new[3], new[5]), ("leader", &*lid2.to_string()), "{table}");
    let fol = row(&table, &admin_addr_of(&c, other).to_string());
    assert_eq!(
        (fol[3], fol[5]),
        ("follower", &*lid2.to_string()),
        "{table}"
    );
    for i in [l2, other] {
        let text = scrape(&c, i);
        assert!(promtool_check_metrics(&text), "promtool rejected:\n{text}");
        let term = series(&text, "ringlock_raft_term{shard=\"0\"}").unwrap();
        assert!(term > term_before, "a new term: {text}");
        let changes = series(&text, "ringlock_raft_leader_changes_total{shard=\"0\"}").unwrap();
        assert!(changes > changes_before[i], "the change is counted: {text}");
        assert_eq!(
            series(&text, "ringlock_raft_leader{shard=\"0\"}"),
            Some(if i == l2 { 1.0 } else { 0.0 })
        );
    }
    // The new leader reports the dead node's lag (it stopped matching).
    let s = status(&c, l2).expect("the new leader answers");
    assert!(
        s[0].followers.iter().any(|f| f.node == lid),
        "{s:?} lists the dead node"
    );
}

/// A single-node server: `CLST` says "not a cluster member", the CLI says
/// so and exits 76, no raft series, `/readyz` as before.
#[test]
fn a_single_node_server_is_not_a_cluster_member() {
    let s = Server::start(&["--metrics-bind", "127.0.0.1:0"]);
    assert_eq!(status_at(s.admin_addr), Some(None), "not a member");
    // The raw answer: a count of 0, and the connection stays usable.
    let mut a = TcpStream::connect(s.admin_addr).unwrap();
    a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    a.write_all(b"CLSTKEYS").unwrap();
    let mut b = [0u8; 8];
    a.read_exact(&mut b).unwrap();
    assert_eq!(b, [0u8; 8], "CLST: count 0; KEYS: no keys");
    let out = cli_status(&s.admin_addr.to_string(), false);
    assert_eq!(out.status.code(), Some(76));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("not-a-cluster-member"), "{table}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cluster member"), "{err}");
    let m = s.metrics_addr.unwrap();
    poll_until("ready", WAIT, || get(m, "/readyz").0 == 200);
    let (_, text) = get(m, "/metrics");
    assert!(!text.contains("ringlock_raft_"), "{text}");
    assert!(promtool_check_metrics(&text));
    // A node that does not answer is a row, not an error of the command.
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let out = cli_status(&format!("{},{gone}", s.admin_addr), false);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(row(&table, &gone.to_string())[3], "down", "{table}");
    assert_eq!(out.status.code(), Some(76), "{table}");
    let out = cli_status(&gone.to_string(), false);
    assert_eq!(out.status.code(), Some(69));
}

/// `n` consecutive free loopback ports (bound once and released).
fn free_ports(n: u16) -> u16 {
    'outer: for _ in 0..200 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = l.local_addr().unwrap().port();
        if base > 65_000 - n {
            continue;
        }
        let mut held = vec![l];
        for k in 1..n {
            match std::net::TcpListener::bind(("127.0.0.1", base + k)) {
                Ok(l) => held.push(l),
                Err(_) => continue 'outer,
            }
        }
        return base;
    }
    panic!("no {n} consecutive free ports");
}

/// Two shards a node (two Raft groups, linked directly): `CLST` gathers
/// one record per shard from every node, every group ends up led by the
/// same node, and the CLI agrees.
#[test]
fn two_shards_a_node_report_one_record_each() {
    let dir = common::TempDir::new("cluster-status-2");
    let ports: Vec<u16> = (0..3).map(|_| free_ports(2)).collect();
    let peers = (0..3)
        .map(|j| format!("{}=127.0.0.1:{}", j + 1, ports[j]))
        .collect::<Vec<_>>()
        .join(",");
    let nodes: Vec<Server> = (0..3)
        .map(|i| {
            let path = dir.path(&format!("n{i}.log"));
            let id = (i + 1).to_string();
            Server::spawn(
                Command::new(env!("CARGO_BIN_EXE_ringlockd")),
                &[
                    "--bind",
                    "127.0.0.1:0",
                    "--admin-bind",
                    "127.0.0.1:0",
                    "--threads",
                    "2",
                    "--node-id",
                    &id,
                    "--peers",
                    &peers,
                    "--data-path",
                    path.to_str().unwrap(),
                    // Not about TLS (tests/peer_tls.rs is): an open cluster.
                    "--insecure",
                ],
            )
            .expect("node starts")
        })
        .collect();
    let admins = nodes
        .iter()
        .map(|n| n.admin_addr.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let mut table = String::new();
    poll_until("one node leads both groups, all agree", WAIT, || {
        let out = cli_status(&admins, false);
        table = String::from_utf8_lossy(&out.stdout).into_owned();
        out.status.code() == Some(0)
    });
    let all: Vec<Vec<ShardStatus>> = nodes
        .iter()
        .map(|n| status_at(n.admin_addr).unwrap().unwrap())
        .collect();
    let leader = all[0][0].leader;
    for (i, recs) in all.iter().enumerate() {
        let shards: Vec<u32> = recs.iter().map(|r| r.shard).collect();
        assert_eq!(shards, [0, 1], "{recs:?}");
        for r in recs {
            assert_eq!(r.node, i as u64 + 1);
            assert_eq!(r.leader, leader, "{all:?}");
            assert_eq!(r.role == Role::Leader, r.node == leader, "{all:?}");
        }
    }
    // Six rows: three nodes, two shards each; then the membership, the
    // same in both shards.
    assert_eq!(table.lines().count(), 8, "{table}");
    assert_eq!(
        table.lines().last(),
        Some("members: voters 1 2 3  learners -"),
        "{table}"
    );
}
