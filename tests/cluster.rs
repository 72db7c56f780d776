//! A replicated cluster of three real `ringlockd` processes on loopback,
//! their Raft links through in-repository fault proxies: the leader is
//! killed with `kill -9`, stopped with SIGSTOP past the election timeout,
//! and cut off from the others, and every acknowledged hold must survive
//! on whichever node serves next; a node that does not serve never grants
//! from its own table (a follower's answers are the leader's, forwarded).

mod common;

use std::time::{Duration, Instant};

use common::cluster::{request, Cluster};
use common::frame;

const WAIT: Duration = Duration::from_secs(20);

fn try_lock(c: &Cluster, i: usize, key: &[u8], src: &[u8]) -> Option<u8> {
    request(
        c.lock_addrs[i],
        &frame(5, key, Some(src)),
        Duration::from_secs(5),
    )
}

/// kill -9 of the leader: a follower takes over, every acknowledged hold
/// is still held, released keys are free; the killed node comes back from
/// its log as a follower; a second failover keeps all of it.
#[test]
fn kill9_of_the_leader_keeps_every_acknowledged_hold() {
    let mut c = Cluster::start(3, common::cluster::test_threads(), &[]);
    let l = c.leader(WAIT);
    let mut conn = c.conn(l);
    assert_eq!(conn.lock(b"held", b"alice"), b'+');
    assert_eq!(conn.try_lock(b"freed", b"alice"), b'+');
    assert_eq!(conn.unlock(b"freed"), b'+');
    // Followers forward: their answers are the leader's.
    for i in (0..3).filter(|&i| i != l) {
        assert_eq!(
            try_lock(&c, i, b"held", b"bob"),
            Some(b'#'),
            "node {} answers what the leader holds",
            i + 1
        );
    }
    let f = (0..3).find(|&i| i != l).unwrap();
    assert_eq!(
        try_lock(&c, f, b"fwd", b"bob"),
        Some(b'+'),
        "a forwarded grant"
    );
    assert_eq!(conn.try_lock(b"fwd", b"carol"), b'#', "held at the leader");
    assert_eq!(conn.unlock(b"fwd"), b'+');
    drop(conn);
    c.kill9(l);
    let l2 = c.leader(WAIT);
    assert_ne!(l2, l);
    assert_eq!(
        try_lock(&c, l2, b"held", b"bob"),
        Some(b'#'),
        "the hold survived"
    );
    assert_eq!(
        try_lock(&c, l2, b"freed", b"bob"),
        Some(b'+'),
        "the release survived"
    );
    // The killed node restarts from its log and follows.
    c.start_node(l);
    common::fault_proxy::poll_until("the restarted node follows", WAIT, || {
        !c.serves(l) && c.serves(l2) && try_lock(&c, l, b"held", b"carol") == Some(b'#')
    });
    c.kill9(l2);
    let l3 = c.leader(WAIT);
    assert_ne!(l3, l2);
    assert_eq!(try_lock(&c, l3, b"held", b"dave"), Some(b'#'));
    assert_eq!(
        try_lock(&c, l3, b"freed", b"dave"),
        Some(b'#'),
        "bob's grant survived too"
    );
    let mut conn = c.conn(l3);
    assert_eq!(conn.unlock(b"held"), b'+');
    assert_eq!(conn.try_lock(b"held", b"dave"), b'+');
}

/// SIGSTOP of the leader past the election timeout: another node serves;
/// when the stopped one resumes, it never grants what the new leader holds
/// and it steps down.
#[test]
fn a_paused_leader_resumes_without_granting() {
    let c = Cluster::start(3, common::cluster::test_threads(), &[]);
    let l = c.leader(WAIT);
    assert_eq!(try_lock(&c, l, b"k", b"alice"), Some(b'+'));
    c.signal(l, libc::SIGSTOP);
    let t = Instant::now();
    let l2 = loop {
        if let Some(i) = (0..3).filter(|&i| i != l).find(|&i| c.serves(i)) {
            break i;
        }
        assert!(
            t.elapsed() < WAIT,
            "no new leader while the old one is stopped"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // The new leader takes "k" back from alice and grants it to bob, and
    // grants "k2" (free in the old leader's table) to bob too.
    let mut conn = c.conn(l2);
    assert_eq!(conn.try_lock(b"k", b"bob"), b'#');
    assert_eq!(conn.send_and_read(&frame(4, b"alice", None)), b'+');
    assert_eq!(conn.try_lock(b"k", b"bob"), b'+');
    assert_eq!(conn.try_lock(b"k2", b"bob"), b'+');
    // The old leader wakes up with its table from before: it must not
    // grant from it (once it follows, its answers are the new leader's,
    // forwarded: `#`, bob holds both).
    c.signal(l, libc::SIGCONT);
    for _ in 0..20 {
        for key in [&b"k"[..], b"k2"] {
            let a = try_lock(&c, l, key, b"carol");
            assert_ne!(a, Some(b'+'), "the resumed old leader granted a held key");
        }
    }
    common::fault_proxy::poll_until("the old leader follows", WAIT, || {
        !c.serves(l) && c.serves(l2)
    });
    assert_eq!(conn.try_lock(b"k", b"dave"), b'#', "bob still holds k");
    common::fault_proxy::poll_until("the old leader forwards to the new one", WAIT, || {
        try_lock(&c, l, b"k2", b"carol") == Some(b'#')
    });
}

/// The leader cut off from both others: they elect a leader; the isolated
/// node grants nothing (what it decides cannot commit); after the heal it
/// follows and what it had accepted is gone.
#[test]
fn an_isolated_leader_grants_nothing() {
    let c = Cluster::start(3, common::cluster::test_threads(), &[]);
    let l = c.leader(WAIT);
    assert_eq!(try_lock(&c, l, b"before", b"alice"), Some(b'+'));
    c.isolate(l);
    // While it is cut off, its Lock cannot commit: never `+`.
    let a = try_lock(&c, l, b"during", b"eve");
    assert_ne!(a, Some(b'+'), "an isolated leader granted");
    let t = Instant::now();
    let l2 = loop {
        if let Some(i) = (0..3).filter(|&i| i != l).find(|&i| c.serves(i)) {
            break i;
        }
        assert!(t.elapsed() < WAIT, "the majority elected no leader");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        !c.serves(l),
        "the isolated node still serves next to the new leader"
    );
    assert_eq!(try_lock(&c, l2, b"before", b"bob"), Some(b'#'));
    assert_eq!(
        try_lock(&c, l2, b"during", b"bob"),
        Some(b'+'),
        "eve's uncommitted grant is void"
    );
    c.heal();
    common::fault_proxy::poll_until("the old leader rejoins as a follower", WAIT, || {
        !c.serves(l) && c.serves(l2)
    });
}

/// `KEYS` on a follower is linearizable: a grant the leader acknowledged
/// is listed by a follower asked right after (its read barrier waits until
/// the leader's commit index is applied there), however far behind the
/// follower's own log was; resets stay refused on a follower.
#[test]
fn keys_on_a_follower_list_every_acknowledged_grant() {
    let c = Cluster::start(3, common::cluster::test_threads(), &[]);
    let l = c.leader(WAIT);
    let f = (0..3).find(|&i| i != l).unwrap();
    let admin = c.nodes[f].as_ref().unwrap().admin_addr;
    let mut conn = c.conn(l);
    for n in 0..20 {
        let key = format!("lin{n}");
        assert_eq!(conn.lock(key.as_bytes(), b"alice"), b'+');
        let listed = common::keys(admin);
        assert!(
            listed.iter().any(|k| k.key == key.as_bytes()),
            "follower node {} did not list {key}, acknowledged by the leader",
            f + 1
        );
    }
    let mut a = std::net::TcpStream::connect(admin).expect("admin");
    a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    std::io::Write::write_all(&mut a, b"RSET\x01\x00\x00\x00\x04lin0").unwrap();
    let mut b = Vec::new();
    let _ = std::io::Read::read_to_end(&mut a, &mut b);
    assert_eq!(b, b"-", "a follower refuses resets");
    assert_eq!(conn.try_lock(b"lin0", b"bob"), b'#', "lin0 is still held");
}

/// One fdatasync per commit on every node: a client's lock and unlock are
/// one commit each, and each costs the leader one sync (its append) and
/// each follower one (its append) — a change of the commit index alone is
/// not synced on its own (it is volatile in Raft; `Replica::ready`).
#[test]
fn each_commit_costs_one_fdatasync_per_node() {
    let c = Cluster::start(3, 1, &[]);
    let l = c.leader(WAIT);
    let mut conn = c.conn(l);
    assert_eq!(conn.try_lock(b"warm", b"a"), b'+');
    assert_eq!(conn.unlock(b"warm"), b'+');
    let syncs = |i: usize| {
        common::metric(
            c.nodes[i].as_ref().unwrap().metrics(),
            "ringlock_wal_fdatasync_seconds_count",
        )
    };
    // Every node has synced what was committed so far (heartbeats carry
    // the commit index; nothing else is written while idle).
    let settled = |prev: &mut Vec<f64>| {
        let now: Vec<f64> = (0..3).map(syncs).collect();
        let same = *prev == now;
        *prev = now;
        same
    };
    let mut before = Vec::new();
    common::fault_proxy::poll_until("the nodes' syncs settle", WAIT, || {
        std::thread::sleep(Duration::from_millis(200));
        settled(&mut before)
    });
    const CYCLES: usize = 50;
    for n in 0..CYCLES {
        let key = format!("k{n}");
        assert_eq!(conn.try_lock(key.as_bytes(), b"a"), b'+');
        assert_eq!(conn.unlock(key.as_bytes()), b'+');
    }
    let mut after = Vec::new();
    common::fault_proxy::poll_until("the nodes' syncs settle again", WAIT, || {
        std::thread::sleep(Duration::from_millis(200));
        settled(&mut after)
    });
    let commits = (2 * CYCLES) as f64;
    for i in 0..3 {
        let d = after[i] - before[i];
        assert!(
            d >= commits * 0.5 && d <= commits + 10.0,
            "node {} ({}): {d} fdatasyncs for {commits} commits",
            i + 1,
            if i == l { "leader" } else { "follower" }
        );
    }
}
