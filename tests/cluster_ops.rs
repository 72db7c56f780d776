//! Operating a replicated cluster, with real processes: a rolling restart
//! (SIGTERM, restart, next node) under a lock workload. A node stopped by
//! SIGTERM hands its leadership over before it exits, so a client's
//! operation fails at most once per restart (the connection to the old
//! leader closes) and succeeds on its first retry at the new leader; a
//! client of a follower whose request reached the old leader as it handed
//! over is not failed again (it answers `not leader`, and the follower
//! sends the request on to the new leader).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::frame;

const WAIT: Duration = Duration::from_secs(20);

/// A Locking-Center client on a persistent connection to one node (a
/// follower forwards its requests to the leader); it walks the node list
/// to find one that answers (a node that is down or stopping refuses the
/// connection or its Persist: discovery, not a failed operation).
struct Worker {
    addrs: Arc<Mutex<Vec<SocketAddr>>>,
    conn: Option<TcpStream>,
    next: usize,
    /// The node `conn` is connected to (index into `addrs`).
    at: usize,
}

impl Worker {
    fn ask(&mut self, bytes: &[u8]) -> Option<u8> {
        let s = self.conn.as_mut()?;
        s.write_all(bytes).ok()?;
        let mut b = [0u8; 1];
        match s.read(&mut b) {
            Ok(1) => Some(b[0]),
            _ => None,
        }
    }

    /// Connects to the serving node, bounded.
    fn connect(&mut self, discovery: &AtomicU64) {
        let t = Instant::now();
        loop {
            assert!(t.elapsed() < WAIT, "no node served for {WAIT:?}");
            let addrs = self.addrs.lock().unwrap().clone();
            let a = addrs[self.next % addrs.len()];
            self.next += 1;
            let Ok(mut s) = TcpStream::connect_timeout(&a, Duration::from_millis(300)) else {
                discovery.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = s.set_nodelay(true);
            let mut b = [0u8; 1];
            if s.write_all(&[6]).is_ok() && matches!(s.read(&mut b), Ok(1) if b[0] == b'+') {
                self.next -= 1; // stay with the node that serves
                self.at = self.next % addrs.len();
                self.conn = Some(s);
                return;
            }
            discovery.fetch_add(1, Ordering::Relaxed);
            thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Whether node `j` reports itself leader of every shard (`CLST`).
fn leads_every_shard(c: &Cluster, j: usize) -> bool {
    let Some(s) = c.nodes[j].as_ref() else {
        return false;
    };
    let Ok(client) = ringlock::client::Client::builder(s.admin_addr)
        .admin_addr(s.admin_addr)
        .build()
    else {
        return false;
    };
    match client.cluster_status() {
        Ok(Some(shards)) => {
            !shards.is_empty()
                && shards
                    .iter()
                    .all(|sh| sh.role == ringlock::protocol::status::Role::Leader)
        }
        _ => false,
    }
}

#[test]
fn rolling_restart_under_load_costs_each_operation_at_most_one_retry() {
    let threads = common::cluster::test_threads();
    let mut c = Cluster::start(3, threads, &[]);
    let addrs = Arc::new(Mutex::new(c.lock_addrs.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let retries = Arc::new(AtomicU64::new(0));
    let discovery = Arc::new(AtomicU64::new(0));
    let worst = Arc::new(AtomicU64::new(0));
    // The longest time any worker went without completing a cycle (µs).
    let gap = Arc::new(AtomicU64::new(0));
    // Every failed operation and every restart, in order (printed on failure).
    let events = Arc::new(Mutex::new(Vec::<String>::new()));
    let t0 = Instant::now();
    let mut workers = Vec::new();
    for w in 0..4 {
        let (addrs, stop, cycles, retries, discovery, worst, gap, events) = (
            addrs.clone(),
            stop.clone(),
            cycles.clone(),
            retries.clone(),
            discovery.clone(),
            worst.clone(),
            gap.clone(),
            events.clone(),
        );
        workers.push(thread::spawn(move || {
            let mut wk = Worker {
                addrs,
                conn: None,
                next: w,
                at: 0,
            };
            let key = format!("k{w}");
            let src = format!("w{w}");
            let mut last = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                // One cycle: Lock, then Unlock. A failure (EOF, `-`) is a
                // retry: the outcome of a Lock is then unknown, so the
                // worker first resets its own source, then locks again.
                let mut failed = 0u64;
                let mut dirty = false;
                loop {
                    if wk.conn.is_none() {
                        wk.connect(&discovery);
                    }
                    let mut fail = |wk: &mut Worker, op: &str, answer: Option<u8>| {
                        failed += 1;
                        events.lock().unwrap().push(format!(
                            "{:>8.1?} w{w} {op} at node {} answered {:?}",
                            t0.elapsed(),
                            wk.at + 1,
                            answer.map(char::from)
                        ));
                        wk.conn = None;
                    };
                    if dirty {
                        let a = wk.ask(&frame(4, src.as_bytes(), None));
                        if a != Some(b'+') {
                            fail(&mut wk, "ResetBySource", a);
                            continue;
                        }
                    }
                    // (A reset that succeeded leaves nothing uncertain: a
                    // failure below sets `dirty` again.)
                    let a = wk.ask(&frame(1, key.as_bytes(), Some(src.as_bytes())));
                    if a != Some(b'+') {
                        fail(&mut wk, "Lock", a);
                        dirty = true;
                        continue;
                    }
                    let a = wk.ask(&frame(2, key.as_bytes(), None));
                    if a != Some(b'+') {
                        fail(&mut wk, "Unlock", a);
                        dirty = true;
                        continue;
                    }
                    break;
                }
                retries.fetch_add(failed, Ordering::Relaxed);
                worst.fetch_max(failed, Ordering::Relaxed);
                cycles.fetch_add(1, Ordering::Relaxed);
                gap.fetch_max(last.elapsed().as_micros() as u64, Ordering::Relaxed);
                last = Instant::now();
            }
        }));
    }
    let progress = |what: &str| {
        let before = cycles.load(Ordering::Relaxed);
        common::fault_proxy::poll_until(what, WAIT, || {
            cycles.load(Ordering::Relaxed) > before + 20
        });
    };
    progress("the workload runs");
    // Restart every node in turn, each with SIGTERM: the followers first,
    // the leader last (whichever node leads by then); if leadership moved
    // to a restarted node meanwhile, its leader is restarted once more, so
    // that one hand-over is always measured.
    let mut restarted = Vec::new();
    let mut handed = 0;
    let restart = |c: &mut Cluster, i: usize, handed: &mut u32| {
        let was_leader = c.serves(i);
        events.lock().unwrap().push(format!(
            "{:>8.1?} SIGTERM node {} (leader: {was_leader})",
            t0.elapsed(),
            i + 1
        ));
        c.signal(i, libc::SIGTERM);
        let t = Instant::now();
        let status = c.nodes[i].as_mut().unwrap().child.wait().expect("wait");
        assert!(
            status.success(),
            "node {} exited with {status} after SIGTERM",
            i + 1
        );
        if was_leader {
            *handed += 1;
            eprintln!(
                "node {} (leader) stopped in {:?} after SIGTERM",
                i + 1,
                t.elapsed()
            );
            // It exited only once it had handed over: another node already
            // leads every shard (without the hand-over, nobody would until
            // an election timeout passed).
            let led = (0..3).filter(|&j| j != i).any(|j| leads_every_shard(c, j));
            assert!(led, "node {} exited before another node led", i + 1);
        }
        c.nodes[i] = None;
        c.start_node(i);
        events.lock().unwrap().push(format!(
            "{:>8.1?} node {} started again",
            t0.elapsed(),
            i + 1
        ));
        addrs.lock().unwrap()[i] = c.lock_addrs[i];
        progress(&format!("cycles complete after node {}'s restart", i + 1));
    };
    while restarted.len() < 3 {
        let l = c.leader(WAIT);
        let i = (0..3)
            .find(|&i| i != l && !restarted.contains(&i))
            .unwrap_or(l);
        restart(&mut c, i, &mut handed);
        restarted.push(i);
    }
    if handed == 0 {
        let l = c.leader(WAIT);
        restart(&mut c, l, &mut handed);
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("worker");
    }
    let (n, r, d) = (
        cycles.load(Ordering::Relaxed),
        retries.load(Ordering::Relaxed),
        discovery.load(Ordering::Relaxed),
    );
    eprintln!(
        "rolling restart of 3 nodes x {threads} shards: {n} cycles, {r} failed operations retried, \
         worst cycle {} retries, {d} discovery probes of non-serving nodes, longest gap between a \
         worker's cycles {} ms, {handed} leadership hand-over(s)",
        worst.load(Ordering::Relaxed),
        gap.load(Ordering::Relaxed) / 1000
    );
    assert!(handed >= 1, "the leader was restarted");
    assert!(
        worst.load(Ordering::Relaxed) <= 1,
        "an operation needed more than one retry across a rolling restart:\n{}",
        events.lock().unwrap().join("\n")
    );
}

/// `ringlock cluster transfer-leader NODE` hands every shard to NODE;
/// a hand-over to a node that is not a peer is refused and changes nothing.
#[test]
fn transfer_leader_moves_every_shard_to_the_named_node() {
    let c = Cluster::start(3, common::cluster::test_threads(), &[]);
    let l = c.leader(WAIT);
    let admin: Vec<String> = (0..3)
        .map(|i| c.nodes[i].as_ref().unwrap().admin_addr.to_string())
        .collect();
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ringlock"))
            .args(["--admin-addr", &admin.join(",")])
            .args(["cluster", "transfer-leader"])
            .args(args)
            .output()
            .expect("run ringlock")
    };
    let refused = cli(&["9"]);
    assert_eq!(refused.status.code(), Some(75), "{refused:?}");
    assert!(
        leads_every_shard(&c, l),
        "a refused hand-over moved nothing"
    );
    let to = (0..3).find(|&i| i != l).unwrap();
    let out = cli(&[&(to + 1).to_string()]);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains(&format!("node {} ", to + 1)), "{said}");
    assert!(
        leads_every_shard(&c, to),
        "node {} leads every shard",
        to + 1
    );
    assert!(!leads_every_shard(&c, l));
}

/// A node restarted on a log of another format version (a later ringlockd
/// wrote it) refuses to start, naming both versions, and leaves the log as
/// it was; started again on its own version's log it rejoins with all of
/// it.
#[test]
fn a_later_log_format_is_refused_and_left_intact_and_version_1_is_upgraded() {
    let mut c = Cluster::start(3, common::cluster::test_threads(), &[]);
    let l = c.leader(WAIT);
    let mut conn = c.conn(l);
    assert_eq!(conn.lock(b"kept", b"alice"), b'+');
    drop(conn);
    let f = (0..3).find(|&i| i != l).unwrap();
    c.signal(f, libc::SIGTERM);
    let _ = c.nodes[f].as_mut().unwrap().child.wait();
    c.nodes[f] = None;
    let path = c.log_path(f, 0);
    let original = std::fs::read(&path).expect("the follower's log");
    let mut later = original.clone();
    later[7] = original[7] + 1;
    std::fs::write(&path, &later).unwrap();
    let err = c
        .try_start_node(f)
        .expect_err("a log of another version is refused");
    assert!(
        err.contains(&format!("format version {}", later[7])) && err.contains("reads version"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        later,
        "the refused log is untouched"
    );
    // The version before membership changes (1) is read, and marked 2:
    // this log has no snapshot yet, the one thing version 2 changed.
    assert_eq!(original[7], 2, "this version writes format 2");
    let mut v1 = original.clone();
    v1[7] = 1;
    std::fs::write(&path, &v1).unwrap();
    c.start_node(f);
    let upgraded = std::fs::read(&path).unwrap();
    assert_eq!(
        upgraded[7], 2,
        "a version-1 log is marked version 2 at start"
    );
    assert!(
        c.nodes[f]
            .as_ref()
            .unwrap()
            .startup_log
            .iter()
            .any(|l| l.contains("raft_log_upgraded") && l.contains("from_version=1")),
        "the upgrade is logged"
    );
    // It rejoins: asked right after, it lists the hold (a read barrier
    // through the leader, then its own log replayed and caught up).
    let admin = c.nodes[f].as_ref().unwrap().admin_addr;
    let client = ringlock::client::Client::builder(admin)
        .admin_addr(admin)
        .retry(ringlock::client::RetryPolicy::none())
        .io_timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    common::fault_proxy::poll_until("the restarted follower lists the hold", WAIT, || {
        client
            .keys()
            .is_ok_and(|k| k.iter().any(|k| k.key == b"kept"))
    });
}
