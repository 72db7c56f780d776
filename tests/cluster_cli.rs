//! The `ringlock` CLI finds its way in a cluster (issue #31 item 4), on
//! three real `ringlockd` processes laid out as README's cluster example:
//! lock ports consecutive, admin ports in another block, so that a lock
//! port + 1 is the next node's lock port, never an admin port (the old
//! guess). Each test fails on the CLI that guessed the admin port, did not
//! walk past a follower's `-`, asked only the nodes it was given, or did
//! not wait out an election.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::cluster::{request, test_threads, Cluster};
use common::frame;

const WAIT: Duration = Duration::from_secs(20);

fn start() -> Cluster {
    let c = Cluster::start_fixed_ports(3, test_threads(), &[]);
    for (i, (lock, admin)) in c.client_ports.iter().enumerate() {
        let s = c.nodes[i].as_ref().expect("running");
        assert_eq!((s.lock_addr.port(), s.admin_addr.port()), (*lock, *admin));
        assert_ne!(*admin, lock + 1, "the layout this suite is about");
    }
    c
}

fn ringlock(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .env_remove("RINGLOCK_ADDR")
        .env_remove("RINGLOCK_ADMIN_ADDR")
        .env_remove("RINGLOCK_SOURCE")
        .env_remove("RINGLOCK_AUTH_TOKEN_FILE")
        .env_remove("RINGLOCK_CERTS_DIR")
        .env_remove("RINGLOCK_CLIENT")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run ringlock")
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}stderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn list(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(SocketAddr::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The lock addresses, the followers' first, then the leader's.
fn followers_first(c: &Cluster, leader: usize) -> String {
    let mut order: Vec<SocketAddr> = (0..3)
        .filter(|&i| i != leader)
        .map(|i| c.lock_addrs[i])
        .collect();
    order.push(c.lock_addrs[leader]);
    list(&order)
}

/// A persistent Locking-Center lock of `key` by `source`, on the leader.
fn hold(c: &Cluster, leader: usize, key: &[u8], source: &[u8]) {
    let answer = request(
        c.lock_addrs[leader],
        &frame(1, key, Some(source)),
        Duration::from_secs(5),
    );
    assert_eq!(answer, Some(b'+'), "the leader grants {key:?}");
}

/// Whether `key` is free, by a TryLock on the leader (released again).
fn free(c: &Cluster, leader: usize, key: &[u8]) -> bool {
    let addr = c.lock_addrs[leader];
    match request(addr, &frame(5, key, Some(b"probe")), Duration::from_secs(5)) {
        Some(b'+') => {
            assert_eq!(
                request(addr, &frame(2, key, None), Duration::from_secs(5)),
                Some(b'+')
            );
            true
        }
        Some(b'#') => false,
        other => panic!("TryLock {key:?} answered {other:?}"),
    }
}

/// With only the lock addresses, `keys` lists what the cluster holds and
/// `try-lock` names the holder: the admin ports come from the nodes'
/// directories, not from the lock port + 1 (a lock port here).
#[test]
fn keys_and_the_holder_of_a_key_are_found_from_the_lock_addresses() {
    let c = start();
    let leader = c.leader(WAIT);
    hold(&c, leader, b"readme/deploy", b"holder-7");
    let addrs = list(&c.lock_addrs);

    let o = ringlock(&["--addr", &addrs, "keys"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.lines()
            .any(|l| l.starts_with("readme/deploy ") && l.contains("holder-7")),
        "{}",
        text(&o)
    );

    // A session try-lock of the held key: refused, and the holder named.
    let o = ringlock(&["--addr", &addrs, "try-lock", "readme/deploy", "--", "true"]);
    assert_eq!(o.status.code(), Some(75), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("source holder-7"), "{}", text(&o));
    assert!(!err.contains("unknown"), "{}", text(&o));
}

/// Locking-Center requests (`--persistent`, `unlock`) sent to a follower
/// first are answered by the leader: a follower's `-` is passed over.
/// Given one follower only, its directory names the leader.
#[test]
fn locking_center_requests_move_past_followers() {
    let c = start();
    let leader = c.leader(WAIT);
    let addrs = followers_first(&c, leader);

    let o = ringlock(&[
        "--addr",
        &addrs,
        "lock",
        "--persistent",
        "lc/job",
        "--",
        "sh",
        "-c",
        "echo ran",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ran\n", "{}", text(&o));
    assert!(free(&c, leader, b"lc/job"), "released after the command");

    let o = ringlock(&[
        "--addr",
        &addrs,
        "try-lock",
        "--persistent",
        "lc/try",
        "--",
        "true",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    hold(&c, leader, b"lc/held", b"someone");
    let o = ringlock(&["--addr", &addrs, "unlock", "lc/held"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(free(&c, leader, b"lc/held"), "{}", text(&o));

    // One follower alone: its directory names the leader's lock address.
    let follower = (0..3).find(|&i| i != leader).expect("a follower");
    hold(&c, leader, b"lc/held", b"someone");
    let o = ringlock(&[
        "--addr",
        &c.lock_addrs[follower].to_string(),
        "unlock",
        "lc/held",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(free(&c, leader, b"lc/held"), "{}", text(&o));
}

/// A session opened at a follower alone follows its `not leader` hint
/// (over TLS: the leader's certificate is verified).
#[test]
fn a_session_follows_the_not_leader_hint_from_a_single_follower() {
    let c = start();
    let leader = c.leader(WAIT);
    let follower = (0..3).find(|&i| i != leader).expect("a follower");
    let ca = c.dir.path("ca");
    let o = ringlock(&[
        "--certs-dir",
        ca.to_str().expect("utf-8"),
        "--retry",
        "2s",
        "--addr",
        &c.lock_addrs[follower].to_string(),
        "lock",
        "session/job",
        "--",
        "sh",
        "-c",
        "echo held",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "held\n", "{}", text(&o));
}

/// `cluster status` given one node (by its admin address, or by its lock
/// address) shows every member and finds the serving one; run right
/// after the leader's `kill -9`, it waits out the election.
#[test]
fn cluster_status_from_one_address_shows_every_member() {
    let mut c = start();
    let leader = c.leader(WAIT);
    let follower = (0..3).find(|&i| i != leader).expect("a follower");
    let admin = |i: usize| c.nodes[i].as_ref().expect("running").admin_addr;
    for given in [
        vec!["--admin-addr".to_string(), admin(follower).to_string()],
        vec!["--addr".to_string(), c.lock_addrs[follower].to_string()],
    ] {
        let mut args: Vec<&str> = given.iter().map(String::as_str).collect();
        args.extend(["cluster", "status"]);
        let o = ringlock(&args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        for i in 0..3 {
            let a = admin(i).to_string();
            assert!(
                out.lines().any(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.get(1) == Some(&a.as_str()) && f[0] == (i + 1).to_string()
                }),
                "node {} at {a}: {args:?}: {}",
                i + 1,
                text(&o)
            );
        }
    }

    let follower_admin = admin(follower).to_string();
    c.kill9(leader);
    let o = ringlock(&[
        "--admin-addr",
        &follower_admin,
        "cluster",
        "status",
        "--timeout",
        "20s",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let dead = c.lock_addrs[leader].to_string();
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().nth(1) == Some(dead.as_str()) && l.contains("down")),
        "{}",
        text(&o)
    );
}

/// `cluster remove` of the leader right after its `kill -9` waits out the
/// election it is part of, then removes it.
#[test]
fn cluster_remove_right_after_the_leader_dies_waits_for_the_election() {
    let mut c = start();
    let leader = c.leader(WAIT);
    let admins = c.admin_list();
    let id = (leader + 1).to_string();
    c.kill9(leader);
    let t = Instant::now();
    let o = ringlock(&[
        "--admin-addr",
        &admins,
        "cluster",
        "remove",
        &id,
        "--timeout",
        "20s",
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "after {:?}: {}",
        t.elapsed(),
        text(&o)
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let voters = out
        .lines()
        .find_map(|l| l.strip_prefix("voters "))
        .unwrap_or_else(|| panic!("{}", text(&o)));
    assert!(!voters.contains(&id), "{}", text(&o));
    // The others serve; status from the lock addresses (the dead one
    // among them) says so.
    let o = ringlock(&["--addr", &list(&c.lock_addrs), "cluster", "status"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// A single node answers Locate too (its own addresses, not a member,
/// serving): the library finds its admin port (never the lock port + 1
/// here) and lists through it; another Locate version is answered with
/// the versions spoken, a session Reply.
#[test]
fn a_single_node_tells_where_its_admin_port_is() {
    use std::io::{Read, Write};
    let s = common::Server::start(&[]);
    assert_ne!(s.admin_addr.port(), s.lock_addr.port() + 1);
    let c = ringlock::client::Client::builder(s.lock_addr)
        .build()
        .expect("client");
    let d = c.locate().expect("answered").expect("a directory");
    assert!(!d.member && d.serving && d.node == 0, "{d:?}");
    let me = d.me().expect("its own entry");
    assert_eq!(me.lock, s.lock_addr.to_string());
    assert_eq!(me.admin, s.admin_addr.to_string());
    assert_eq!(c.cluster_directory().expect("CADR"), d);
    assert_eq!(c.admin_addrs(), [s.admin_addr], "found for the CADR above");
    let held = ringlock::client::Client::builder(s.lock_addr)
        .source("me")
        .build()
        .expect("client");
    let _g = held.lock("single/key").expect("granted");
    let keys = held.keys().expect("listed through the found admin port");
    assert_eq!(keys.len(), 1, "{keys:?}");

    let mut t = std::net::TcpStream::connect(s.lock_addr).expect("connect");
    t.write_all(&[14, 9, 0, 0, 0, 1, 0, 2]).expect("write");
    let mut answer = Vec::new();
    t.read_to_end(&mut answer).expect("read until the close");
    assert_eq!(
        answer,
        [0x80, 9, 0, 0, 0, 3, 0, 11, 1, 1],
        "unsupported version"
    );
}
