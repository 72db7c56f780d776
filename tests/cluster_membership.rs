//! Membership changes with real processes and the real CLI: a killed node
//! replaced by a fresh one while a lock workload runs, a running node
//! replaced (one that missed its removal from one shard's group while it
//! still leads another's), a node removed and added back with an empty
//! disk, and the changes that are refused.
//!
//! The workload takes fresh keys on persistent Locking-Center connections
//! to whichever node serves; every key it was answered `+` for must be held
//! at the end (no acknowledged operation lost), as the last leader lists
//! them. Logs are compacted every 30 entries, so a node that joins is far
//! behind the first entry kept and is sent a snapshot.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::fault_proxy::{poll_until, Dir, Mode};
use common::frame;

const WAIT: Duration = Duration::from_secs(30);
const COMPACT: &[&str] = &["--raft-compact-entries", "30"];

/// Workers taking fresh keys; what was acknowledged.
struct Workload {
    addrs: Arc<Mutex<Vec<SocketAddr>>>,
    acked: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

fn serving_conn(addrs: &Mutex<Vec<SocketAddr>>, next: &mut usize) -> TcpStream {
    let t = Instant::now();
    loop {
        assert!(t.elapsed() < WAIT, "no node served for {WAIT:?}");
        let list = addrs.lock().unwrap().clone();
        let a = list[*next % list.len()];
        *next += 1;
        if let Ok(mut s) = TcpStream::connect_timeout(&a, Duration::from_millis(300)) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = s.set_nodelay(true);
            let mut b = [0u8; 1];
            if s.write_all(&[6]).is_ok() && matches!(s.read(&mut b), Ok(1) if b[0] == b'+') {
                *next -= 1;
                return s;
            }
        }
        thread::sleep(Duration::from_millis(2));
    }
}

impl Workload {
    fn start(c: &Cluster, workers: usize) -> Workload {
        let addrs = Arc::new(Mutex::new(c.lock_addrs.clone()));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..workers)
            .map(|w| {
                let (addrs, acked, stop) = (addrs.clone(), acked.clone(), stop.clone());
                thread::spawn(move || {
                    let mut next = w;
                    let mut conn: Option<TcpStream> = None;
                    let src = format!("w{w}");
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let s = conn.get_or_insert_with(|| serving_conn(&addrs, &mut next));
                        let key = format!("w{w}-{n}");
                        n += 1;
                        let mut b = [0u8; 1];
                        let ok = s
                            .write_all(&frame(1, key.as_bytes(), Some(src.as_bytes())))
                            .is_ok()
                            && matches!(s.read(&mut b), Ok(1) if b[0] == b'+');
                        if ok {
                            acked.lock().unwrap().push(key);
                        } else {
                            // Unknown outcome: this key may or may not be
                            // held; the next one is fresh.
                            conn = None;
                        }
                    }
                })
            })
            .collect();
        Workload {
            addrs,
            acked,
            stop,
            threads,
        }
    }

    fn acked(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    /// Waits until `more` further grants were acknowledged.
    fn progress(&self, what: &str, more: usize) {
        let before = self.acked();
        poll_until(what, WAIT, || self.acked() >= before + more);
    }

    /// Stops the workers; every acknowledged key.
    fn finish(self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().expect("worker");
        }
        let v = self.acked.lock().unwrap().clone();
        v
    }
}

fn cli(c: &Cluster, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .arg("--admin-addr")
        .arg(c.admin_list())
        .args(["cluster"])
        .args(args)
        .output()
        .expect("run ringlock");
    eprintln!(
        "ringlock cluster {}: {}\nstdout: {}stderr: {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn cli_ok(c: &Cluster, args: &[&str]) -> String {
    let out = cli(c, args);
    assert!(out.status.success(), "ringlock cluster {args:?} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn admin(addr: SocketAddr) -> ringlock::client::Client {
    ringlock::client::Client::builder(addr)
        .admin_addr(addr)
        .retry(ringlock::client::RetryPolicy::none())
        .io_timeout(Duration::from_secs(3))
        .build()
        .expect("client")
}

/// Every acknowledged key is held, as node `i` lists them.
fn all_held(c: &Cluster, i: usize, acked: &[String]) {
    let listed: std::collections::HashSet<Vec<u8>> =
        admin(c.nodes[i].as_ref().expect("running").admin_addr)
            .keys()
            .expect("KEYS")
            .into_iter()
            .map(|k| k.key)
            .collect();
    let lost: Vec<&String> = acked
        .iter()
        .filter(|k| !listed.contains(k.as_bytes()))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged grants lost, e.g. {:?}",
        lost.len(),
        acked.len(),
        &lost[..lost.len().min(5)]
    );
}

/// Waits until node `i` printed a log line containing `what`.
fn logged(c: &Cluster, i: usize, what: &str) {
    let s = c.nodes[i].as_ref().expect("running");
    let end = Instant::now() + WAIT;
    loop {
        match s.log.recv_timeout(Duration::from_millis(100)) {
            Ok(line) if line.contains(what) => return,
            _ if Instant::now() > end => panic!("node {} never logged {what:?}", i + 1),
            _ => {}
        }
    }
}

fn members_of(c: &Cluster, i: usize) -> Vec<ringlock::client::members::MemberStatus> {
    admin(c.nodes[i].as_ref().expect("running").admin_addr)
        .cluster_members()
        .expect("CMEM")
        .expect("a cluster member")
}

#[test]
fn a_killed_node_is_replaced_by_a_fresh_one_under_load_and_nothing_acknowledged_is_lost() {
    let threads = common::cluster::test_threads();
    let mut c = Cluster::start(3, threads, COMPACT);
    let w = Workload::start(&c, 3);
    w.progress("the workload runs", 50);
    let l = c.leader(WAIT);
    let dead = (0..3).find(|&i| i != l).unwrap();
    c.kill9(dead);
    // Far past a few compactions: the new node cannot be sent entries
    // from the start.
    w.progress("the workload runs on two nodes", 200);
    let new = c.add_node();
    w.addrs.lock().unwrap().push(c.lock_addrs[new]);
    let (old_id, new_id) = ((dead + 1).to_string(), (new + 1).to_string());
    let out = cli_ok(
        &c,
        &[
            "replace",
            &old_id,
            &new_id,
            &c.raft_addr(new).to_string(),
            "--timeout",
            "30s",
        ],
    );
    let mut want: Vec<u64> = (1..=3).filter(|&n| n != dead as u64 + 1).collect();
    want.push(new as u64 + 1);
    assert_eq!(out.trim(), format!("voters {want:?}"));
    logged(&c, new, "raft_snapshot_installed");
    for m in members_of(&c, new) {
        assert_eq!(m.voters, want, "shard {} on the new node", m.shard);
        assert!(m.outgoing.is_empty() && m.learners.is_empty());
        assert!(!m.addrs.contains_key(&(dead as u64 + 1)));
    }
    // The new node serves once it leads.
    cli_ok(&c, &["transfer-leader", &new_id]);
    poll_until("the new node serves", WAIT, || c.serves(new));
    w.progress("the workload runs against the new node", 30);
    // It is a voter: with one of the original nodes killed too, the new
    // node and the last original one still make a quorum.
    let other = (0..3).find(|&i| i != dead && i != l).unwrap_or(l);
    let other = if c.nodes[other].is_some() { other } else { l };
    c.kill9(other);
    w.progress("the workload runs on the new node and one original", 30);
    let acked = w.finish();
    let now = c.leader(WAIT);
    all_held(&c, now, &acked);
    eprintln!("{} grants acknowledged, all held", acked.len());
}

/// A node replaced while it still runs (a hardware migration), in a
/// cluster of two shards per node, with the change made in shard 1's group
/// only so far (the new node's shard 0 is cut off and cannot catch up),
/// and node 1 cut off from shard 1's traffic meanwhile: it never learns
/// from shard 1's leader that it was removed (a leader sends a removed
/// node nothing more). Then node 1 leads shard 0's group (handed to it
/// here, as an election could): shard 1's group cannot follow it there,
/// so nobody would serve and the change could never be finished — but
/// the other nodes' shard 0 tell it, on their messages, that shard 1's
/// configuration excludes it; it hands its leadership back, a node
/// serves, and `ringlock cluster replace` finishes while node 1 runs on.
#[test]
fn a_running_node_replaced_in_one_group_only_hands_its_other_leaderships_over() {
    use ringlock::client::members::{Change, MemberStatus};
    let shard = |m: &[MemberStatus], g: u32| m.iter().find(|s| s.shard == g).cloned().unwrap();
    let pause = || thread::sleep(Duration::from_millis(50));
    let threads = common::cluster::test_threads().max(2);
    let mut c = Cluster::start(3, threads, &[]);
    // Node 2 serves.
    if c.leader(WAIT) != 1 {
        cli_ok(&c, &["transfer-leader", "2"]);
    }
    poll_until("node 2 serves", WAIT, || c.serves(1));
    let new = c.add_node();
    let front = c.front(new);
    let addr = front[0].addr().to_string();
    let two = admin(c.nodes[1].as_ref().unwrap().admin_addr);
    let add = Change::AddLearner {
        node: 4,
        addr: addr.clone(),
    };
    poll_until("node 4 is a learner of every shard", WAIT, || {
        let _ = two.change_members(&add);
        pause();
        members_of(&c, 1).iter().all(|m| m.learners == [4])
    });
    // Node 1 hears nothing more of shard 1's group; node 4's shard 0
    // nothing at all.
    for from in [1, 2] {
        c.proxies[&(from, 0)][1].set_mode(Dir::Forward, Mode::Blackhole);
    }
    front[0].partition();
    poll_until("node 4 is caught up in shard 1 only", WAIT, || {
        pause();
        let st = two.cluster_status().unwrap().unwrap();
        let f = |g: u32| {
            let s = st.iter().find(|s| s.shard == g).unwrap();
            let f = s.followers.iter().find(|f| f.node == 4).unwrap();
            (f.active, f.matched + 100 >= s.commit)
        };
        !f(0).0 && f(1) == (true, true)
    });
    let refused = two
        .change_members(&Change::Replace { old: 1, new: 4 })
        .unwrap()
        .unwrap_err();
    assert!(refused.contains("has not caught up"), "{refused}");
    poll_until("shard 1's group replaced node 1", WAIT, || {
        pause();
        let m = members_of(&c, 1);
        let (m0, m1) = (shard(&m, 0), shard(&m, 1));
        m1.voters == [2, 3, 4] && !m1.change_in_progress && m0.voters == [1, 2, 3]
    });
    for from in [1, 2] {
        c.proxies[&(from, 0)][1].heal();
    }
    assert_eq!(
        shard(&members_of(&c, 0), 1).voters,
        [1, 2, 3],
        "node 1 missed its removal"
    );
    // Node 1 leads shard 0's group (shard 1's group refuses: node 1 is no
    // voter there).
    while c.nodes[0].as_ref().unwrap().log.try_recv().is_ok() {}
    let _ = two.transfer_leader(1);
    logged(&c, 0, "event=raft_leader group=0 node=1");
    let l = c.leader(Duration::from_secs(10));
    assert_ne!(l, 0, "the node that left no longer serves");
    // Told by its peers' shard 0 that shard 1's configuration excludes
    // it, though it never applied that configuration.
    let m = members_of(&c, 0);
    assert!(shard(&m, 1).removed && !shard(&m, 0).removed, "{m:?}");
    assert_eq!(shard(&m, 1).voters, [1, 2, 3]);
    front[0].heal();
    let out = cli_ok(&c, &["replace", "1", "4", &addr, "--timeout", "30s"]);
    assert_eq!(out.trim(), "voters [2, 3, 4]");
    assert!(
        c.nodes[0]
            .as_mut()
            .unwrap()
            .child
            .try_wait()
            .unwrap()
            .is_none(),
        "node 1 runs on"
    );
    for m in members_of(&c, c.leader(WAIT)) {
        assert_eq!(m.voters, [2, 3, 4], "shard {}", m.shard);
    }
}

#[test]
fn a_removed_node_added_back_with_an_empty_disk_catches_up_and_serves() {
    let threads = common::cluster::test_threads();
    let mut c = Cluster::start(3, threads, COMPACT);
    let w = Workload::start(&c, 3);
    w.progress("the workload runs", 50);
    // The leader itself: the CLI hands its leadership over first.
    let l = c.leader(WAIT);
    let id = (l + 1).to_string();
    let out = cli(&c, &["remove", &id, "--timeout", "30s"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("handing its leadership over"));
    let rest: Vec<usize> = (0..3).filter(|&i| i != l).collect();
    for &i in &rest {
        poll_until("the others apply the removal", WAIT, || {
            members_of(&c, i)
                .iter()
                .all(|m| m.voters.len() == 2 && !m.voters.contains(&(l as u64 + 1)))
        });
    }
    w.progress("the workload runs on the two others", 100);
    // Stop it, empty its disk, start it to join, add it back.
    c.kill9(l);
    for g in 0..threads {
        let _ = std::fs::remove_file(c.log_path(l, g));
    }
    c.join[l] = true;
    c.start_node(l);
    w.addrs.lock().unwrap()[l] = c.lock_addrs[l];
    w.progress("the workload runs while the node is down", 30);
    let out = cli_ok(
        &c,
        &["add", &id, &c.raft_addr(l).to_string(), "--timeout", "30s"],
    );
    assert_eq!(out.trim(), "voters [1, 2, 3]");
    cli_ok(&c, &["transfer-leader", &id]);
    poll_until("the node added back serves", WAIT, || c.serves(l));
    w.progress("the workload runs against it", 30);
    let acked = w.finish();
    all_held(&c, l, &acked);
    eprintln!("{} grants acknowledged, all held", acked.len());
}

#[test]
fn changes_that_cannot_be_made_are_refused_with_the_reason() {
    let threads = common::cluster::test_threads();
    let c = Cluster::start(3, threads, &[]);
    // An address nothing listens on: refused before anything changes.
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let out = cli(&c, &["add", "7", &closed.to_string(), "--timeout", "2s"]);
    assert_eq!(out.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not reachable"));
    // Something listens, but no ringlockd: the learner never catches up,
    // is never promoted, and blocks other additions until removed.
    let squatter = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = squatter.local_addr().unwrap().to_string();
    let out = cli(&c, &["add", "9", &addr, "--timeout", "2s"]);
    assert_eq!(out.status.code(), Some(75));
    assert!(String::from_utf8_lossy(&out.stderr).contains("node 9 catches up: not done"));
    let l = c.leader(WAIT);
    for m in members_of(&c, l) {
        assert_eq!(
            (m.voters.clone(), m.learners.clone()),
            (vec![1, 2, 3], vec![9])
        );
    }
    let out = cli(&c, &["add", "8", &addr, "--timeout", "2s"]);
    assert_eq!(out.status.code(), Some(75));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("learner 9 is still being added"),
        "a second addition while one is in progress"
    );
    let out = cli(&c, &["remove", "5", "--timeout", "2s"]);
    assert_eq!(out.status.code(), Some(75));
    assert!(String::from_utf8_lossy(&out.stderr).contains("node 5 is not a member"));
    cli_ok(&c, &["remove", "9", "--timeout", "10s"]);
    for m in members_of(&c, l) {
        assert!(m.learners.is_empty(), "the learner is gone");
    }
    drop(squatter);
}

#[test]
fn the_last_voter_cannot_be_removed() {
    let c = Cluster::start(1, common::cluster::test_threads(), &[]);
    let out = cli(&c, &["remove", "1", "--timeout", "2s"]);
    assert_eq!(out.status.code(), Some(75));
    assert!(String::from_utf8_lossy(&out.stderr).contains("last voter"));
    assert!(c.serves(0), "the node still serves");
}

#[test]
fn disaster_recovery_from_one_surviving_nodes_log_keeps_what_it_acknowledged() {
    let threads = common::cluster::test_threads();
    let mut c = Cluster::start(3, threads, &[]);
    let l = c.leader(WAIT);
    let mut conn = c.conn(l);
    let keys: Vec<String> = (0..20).map(|i| format!("kept{i}")).collect();
    for k in &keys {
        assert_eq!(conn.lock(k.as_bytes(), b"alice"), b'+');
    }
    drop(conn);
    // Every node lost but the leader's disk; nothing serves.
    for i in 0..3 {
        c.kill9(i);
    }
    c.extra.push("--force-new-cluster".into());
    c.start_node(l);
    c.extra.pop();
    logged(&c, l, "raft_forced_new_cluster_done");
    poll_until("the survivor serves alone", WAIT, || c.serves(l));
    all_held(&c, l, &keys);
    let mut conn = c.conn(l);
    assert_eq!(
        conn.lock(b"after", b"bob"),
        b'+',
        "a one-voter cluster commits"
    );
    drop(conn);
    // Durable: restarted without the flag, it is still the only voter.
    c.signal(l, libc::SIGTERM);
    let _ = c.nodes[l].as_mut().unwrap().child.wait();
    c.nodes[l] = None;
    c.start_node(l);
    poll_until("the survivor serves alone after a restart", WAIT, || {
        c.serves(l)
    });
    for m in members_of(&c, l) {
        assert_eq!(m.voters, vec![l as u64 + 1]);
    }
    let mut all = keys.clone();
    all.push("after".into());
    all_held(&c, l, &all);
    // And grows again: a fresh node joins.
    let new = c.add_node();
    let out = cli_ok(
        &c,
        &[
            "add",
            &(new + 1).to_string(),
            &c.raft_addr(new).to_string(),
            "--timeout",
            "30s",
        ],
    );
    let mut want = vec![l as u64 + 1, new as u64 + 1];
    want.sort();
    assert_eq!(out.trim(), format!("voters {want:?}"));
}
