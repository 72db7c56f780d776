//! Hostile peers against a real cluster of three `ringlockd` processes:
//! raw peer links (tests/common/peer_link.rs) claiming a real member's id
//! send forged Raft messages — a heartbeat committing 2^60, a term of
//! 2^64-1, a `from` that is not the link's node, a message for another
//! node, an append whose entry does not parse, a snapshot whose data does
//! not parse, a forwarded proposal — to every node. Each is dropped before
//! raft-rs sees it: every node runs on, no term, leader or membership
//! changes, locks are still granted, and the node's
//! `ringlock_raft_messages_dropped_total{reason}` counts it; then every node
//! restarts and serves (nothing poisonous was persisted). And fail-stop: a
//! committed entry in a node's own log that does not parse stops that node
//! (exit 65, one line naming the group and index) at every start, instead
//! of a process that runs on with a dead shard.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::cluster::{test_threads, Cluster};
use common::fault_proxy::poll_until;
use common::peer_link::PeerLink;
use raft::eraftpb::{ConfState, Entry, HardState, Message, MessageType, Snapshot};
use ringlock::client::{Client, RetryPolicy, Session, ShardStatus};

const WAIT: Duration = Duration::from_secs(20);
const VOTERS: [u64; 3] = [1, 2, 3];

fn admin(c: &Cluster, i: usize) -> Client {
    let addr = c.nodes[i].as_ref().expect("running").admin_addr;
    Client::builder(addr)
        .admin_addr(addr)
        .retry(RetryPolicy::none())
        .io_timeout(Duration::from_secs(3))
        .build()
        .expect("client")
}

/// Node `i`'s `CLST`: each shard's term, leader, commit, last index.
fn status(c: &Cluster, i: usize) -> Vec<ShardStatus> {
    admin(c, i)
        .cluster_status()
        .expect("CLST")
        .expect("a cluster member")
}

/// What no forged message may change, as every node sees it: per shard,
/// the term and the leader, and the membership (voters, learners).
type View = Vec<(u64, u32, u64, u64, Vec<u64>, Vec<u64>)>;

fn view(c: &Cluster) -> View {
    let mut v = Vec::new();
    for i in 0..c.nodes.len() {
        let members = admin(c, i)
            .cluster_members()
            .expect("CMEM")
            .expect("a cluster member");
        for s in status(c, i) {
            let m = members
                .iter()
                .find(|m| m.shard == s.shard)
                .expect("each shard's members");
            let mut voters = m.voters.clone();
            voters.sort_unstable();
            let mut learners = m.learners.clone();
            learners.sort_unstable();
            v.push((s.node, s.shard, s.term, s.leader, voters, learners));
        }
    }
    v
}

fn metrics_addr(c: &Cluster, i: usize) -> SocketAddr {
    c.nodes[i].as_ref().expect("running").metrics()
}

/// Node `i`'s count of peer messages dropped for `reason`.
fn dropped(c: &Cluster, i: usize, reason: &str) -> f64 {
    common::metric(
        metrics_addr(c, i),
        &format!("ringlock_raft_messages_dropped_total{{reason=\"{reason}\"}}"),
    )
}

/// Every node's process is alive.
fn all_running(c: &mut Cluster) {
    for (i, s) in c.nodes.iter_mut().enumerate() {
        let s = s.as_mut().expect("started");
        if let Some(status) = s.child.try_wait().expect("try_wait") {
            let log: Vec<String> = s.log.try_iter().collect();
            panic!("node {} exited ({status}):\n{}", i + 1, log.join("\n"));
        }
    }
}

/// A lock granted and released through the real client (a session, which
/// finds the serving node among all of them).
fn lock_works(c: &Cluster, key: &str) {
    let s = Session::builder(c.lock_addrs.as_slice())
        .connect()
        .expect("a session");
    let lease = s.lock(key, Duration::from_secs(10)).expect("granted");
    lease.release().expect("released");
    s.close();
}

/// Waits until every node names the same leader for every shard.
fn settled(c: &Cluster) -> View {
    let t = Instant::now();
    loop {
        let v = view(c);
        // Every shard follows group 0's leader; each group its own term.
        let leader = v[0].3;
        let agree = v.iter().all(|r| {
            let first = v.iter().find(|f| f.1 == r.1).expect("itself");
            r.3 == leader && r.2 == first.2
        });
        if leader != 0 && agree {
            return v;
        }
        assert!(t.elapsed() < WAIT, "the nodes do not agree: {v:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn msg(t: MessageType, from: u64, to: u64, term: u64) -> Message {
    let mut m = Message::default();
    m.set_msg_type(t);
    m.from = from;
    m.to = to;
    m.term = term;
    m
}

/// A proposal as a leader makes one: its clock, then log records (one
/// grant mark). Valid: only its being forwarded is wrong.
fn proposal() -> Vec<u8> {
    let mut records = Vec::new();
    ringlock::wal::record::encode_grant_mark(1 << 40, &mut records);
    let mut data = Vec::new();
    ringlock::cluster::store::proposal(1_700_000_000_000, &records, &mut data);
    data
}

/// One forged message: what it is, the reason it must be dropped for, and
/// how to make it for a node (`to`, in shard state `st`) from a link that
/// claims node `claimed` (`other`: the third node).
struct Case {
    what: &'static str,
    reason: &'static str,
    make: fn(to: u64, claimed: u64, other: u64, st: &ShardStatus) -> Message,
}

const CASES: [Case; 7] = [
    Case {
        what: "a heartbeat committing 2^60",
        reason: "index",
        make: |to, claimed, _, st| {
            let mut m = msg(MessageType::MsgHeartbeat, claimed, to, st.term);
            m.commit = 1 << 60;
            m
        },
    },
    Case {
        what: "a heartbeat of term 2^64-1",
        reason: "term",
        make: |to, claimed, _, _| msg(MessageType::MsgHeartbeat, claimed, to, u64::MAX),
    },
    Case {
        what: "a heartbeat from another node than the link's",
        reason: "from",
        make: |to, _, other, st| {
            let mut m = msg(MessageType::MsgHeartbeat, other, to, st.term);
            m.commit = st.commit;
            m
        },
    },
    Case {
        what: "a heartbeat for another node",
        reason: "to",
        make: |_, claimed, other, st| {
            let mut m = msg(MessageType::MsgHeartbeat, claimed, other, st.term);
            m.commit = st.commit;
            m
        },
    },
    Case {
        what: "an append whose entry does not parse",
        reason: "payload",
        make: |to, claimed, _, st| {
            let mut m = msg(MessageType::MsgAppend, claimed, to, st.term);
            m.index = st.last_index;
            m.log_term = st.term;
            m.commit = st.last_index + 1;
            m.set_entries(
                vec![Entry {
                    index: st.last_index + 1,
                    term: st.term,
                    data: b"\x00\x01 not a proposal".to_vec().into(),
                    ..Default::default()
                }]
                .into(),
            );
            m
        },
    },
    Case {
        what: "a snapshot whose data does not parse, naming a learner",
        reason: "snapshot",
        make: |to, claimed, _, st| {
            let mut m = msg(MessageType::MsgSnapshot, claimed, to, st.term);
            let mut s = Snapshot {
                data: b"\x00 not a table".to_vec().into(),
                ..Default::default()
            };
            s.mut_metadata().index = st.last_index + 100;
            s.mut_metadata().term = st.term;
            s.mut_metadata()
                .set_conf_state(ConfState::from((VOTERS.to_vec(), vec![99])));
            m.set_snapshot(s);
            m
        },
    },
    Case {
        what: "a forwarded proposal",
        reason: "type",
        make: |to, claimed, _, _| {
            let mut m = msg(MessageType::MsgPropose, claimed, to, 0);
            m.set_entries(
                vec![Entry {
                    data: proposal().into(),
                    ..Default::default()
                }]
                .into(),
            );
            m
        },
    },
];

/// Every forged message, to every node (the leader's and the followers'
/// handling differ), over a link claiming a real member (the leader's id
/// to a follower): dropped, counted, nothing changes, the link stays up,
/// every node runs on and locks are granted; then every node restarts
/// (`kill -9`) and the cluster serves again.
#[test]
fn forged_raft_messages_crash_nothing_and_change_nothing() {
    let mut c = Cluster::start(3, test_threads(), &["--metrics-bind", "127.0.0.1:0"]);
    let l = c.leader(WAIT);
    lock_works(&c, "before");
    let base = settled(&c);
    let groups = c.threads;
    let mut k = 0;
    for t in 0..3 {
        // A follower is sent what the leader would send; the leader what
        // a follower would.
        let claimed = if t == l { (l + 1) % 3 } else { l };
        let other = 3 - t - claimed;
        for case in &CASES {
            let g = k % groups;
            k += 1;
            let st = status(&c, t)
                .into_iter()
                .find(|s| s.shard as usize == g)
                .expect("the shard's status");
            let m = (case.make)(t as u64 + 1, claimed as u64 + 1, other as u64 + 1, &st);
            let before = dropped(&c, t, case.reason);
            let refused0 = common::metric(metrics_addr(&c, t), "ringlock_peer_links_refused_total");
            let mut link =
                PeerLink::open(&c, t, claimed as u64 + 1, g as u32, groups as u32, &VOTERS);
            link.send_raft(&m);
            let what = format!(
                "{} to node {} (shard {g}) as node {}",
                case.what,
                t + 1,
                claimed + 1
            );
            poll_until(&format!("{what}: counted"), WAIT, || {
                dropped(&c, t, case.reason) > before
            });
            // The message was dropped, not the link: no refusal counted.
            // (The link itself may be closed meanwhile by the real node
            // redialing: a node keeps one inbound link per peer.)
            assert_eq!(
                common::metric(metrics_addr(&c, t), "ringlock_peer_links_refused_total"),
                refused0,
                "{what}: the link was refused"
            );
            let _ = link.is_open();
            all_running(&mut c);
            assert_eq!(view(&c), base, "{what} changed the cluster");
            lock_works(&c, &format!("after-{k}"));
        }
    }
    // A Hello claiming node 0 (raft-rs's "no node": its messages would be
    // taken as the node's own) is refused: the link is closed.
    let mut link = PeerLink::open(&c, l, 0, 0, groups as u32, &VOTERS);
    poll_until("a Hello of node 0: the link closed", WAIT, || {
        !link.is_open()
    });
    // Bytes that are no Raft message at all, on a link of the leader.
    let before = dropped(&c, l, "malformed");
    let mut link = PeerLink::open(&c, l, ((l + 1) % 3) as u64 + 1, 0, groups as u32, &VOTERS);
    link.send_payload(b"\xff\xff\xff\xff");
    poll_until("bytes that do not parse: counted", WAIT, || {
        dropped(&c, l, "malformed") > before
    });
    all_running(&mut c);
    assert_eq!(view(&c), base);
    // Nothing poisonous was persisted: every node starts again (each
    // replays its log) and the cluster serves.
    for i in 0..3 {
        c.kill9(i);
        c.start_node(i);
        c.leader(WAIT);
        all_running(&mut c);
        lock_works(&c, &format!("restarted-{i}"));
    }
    let v = settled(&c);
    assert!(
        v.iter()
            .all(|r| r.2 < 1 << 48 && r.4 == VOTERS && r.5.is_empty()),
        "{v:?}"
    );
}

/// Malformed Locking-Center forwarding frames on an authenticated link
/// (a forwarded request that is not one whole request, a Persist, an
/// answer byte no leader sends, frames of the wrong size) close that link
/// and change nothing: every node runs on, the cluster's view is the same,
/// locks are granted (through a follower too).
#[test]
fn malformed_forwarding_frames_close_the_link_and_change_nothing() {
    use ringlock::cluster::wire;
    let mut c = Cluster::start(3, test_threads(), &[]);
    let l = c.leader(WAIT);
    lock_works(&c, "before");
    let base = settled(&c);
    let groups = c.threads as u32;
    let client: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let forward = |req: &[u8]| {
        let mut b = Vec::new();
        wire::encode_forward(7, 0, client, req, &mut b);
        b[5..].to_vec()
    };
    let cases: Vec<(&str, u8, Vec<u8>)> = vec![
        (
            "a forwarded request cut short",
            wire::KIND_FORWARD,
            forward(&[1, 3, b'k']),
        ),
        (
            "two requests in one Forward",
            wire::KIND_FORWARD,
            forward(&[5, 1, b'k', 0, 5, 1, b'k', 0]),
        ),
        ("a forwarded Persist", wire::KIND_FORWARD, forward(&[6])),
        ("an address family 9", wire::KIND_FORWARD, {
            let mut p = forward(&[5, 1, b'k', 0]);
            p[16] = 9;
            p
        }),
        ("an answer byte no leader sends", wire::KIND_ANSWER, {
            let mut p = vec![0u8; 21];
            p[8] = b'x';
            p
        }),
        ("a grant on a -", wire::KIND_ANSWER, {
            let mut p = vec![0u8; 21];
            p[8] = b'-';
            p[13] = 1;
            p
        }),
        ("a Withdraw of 9 bytes", wire::KIND_WITHDRAW, vec![0u8; 9]),
        (
            "a GiveBack of 11 bytes",
            wire::KIND_GIVE_BACK,
            vec![0u8; 11],
        ),
        ("an unknown frame kind", 7, vec![0u8; 8]),
    ];
    for (k, (what, kind, payload)) in cases.iter().enumerate() {
        let t = k % 3;
        let claimed = if t == l { (l + 1) % 3 } else { l };
        let m = metrics_addr(&c, t);
        let refused0 = common::metric(m, "ringlock_peer_links_refused_total");
        let mut link = PeerLink::open(&c, t, claimed as u64 + 1, 0, groups, &VOTERS);
        link.send_frame(*kind, payload);
        poll_until(
            &format!("{what} to node {}: the link closed", t + 1),
            WAIT,
            || !link.is_open(),
        );
        assert!(
            common::metric(m, "ringlock_peer_links_refused_total") > refused0,
            "{what}: counted as a refused link"
        );
        all_running(&mut c);
        assert_eq!(view(&c), base, "{what} changed the cluster");
        lock_works(&c, &format!("after-{k}"));
    }
    // A follower still forwards. The forged links replaced real ones, whose
    // ends redial: a request that meets the link to the leader down waits
    // for it (tests/cluster_forward.rs), but one queued on a link that
    // fails before it is read is closed unanswered (its outcome unknown),
    // and the next one is served.
    use std::io::{Read, Write};
    let f = (0..3).find(|&i| i != l).unwrap();
    let mut tries = Vec::new();
    for _ in 0..10 {
        let mut conn = c.conn(f);
        conn.s
            .write_all(&common::frame(5, b"via-follower", Some(b"x")))
            .expect("write");
        let mut b = [0u8; 1];
        match conn.s.read_exact(&mut b) {
            Ok(()) if b[0] == b'+' => {
                assert_eq!(conn.unlock(b"via-follower"), b'+');
                return;
            }
            Ok(()) => tries.push(format!("{:?}", b[0] as char)),
            Err(e) => tries.push(e.to_string()),
        }
    }
    panic!("a follower's TryLock was never granted: {tries:?}");
}

/// A Forward tagged with a term other than the leader's current one (sent
/// to it as the leader of an earlier term, maybe long ago, by a follower
/// that has given its client up since) is not taken up: answered "not the
/// leader", nothing done. The same request in the current term is.
#[test]
fn a_forward_tagged_with_another_term_is_not_taken_up() {
    use ringlock::cluster::wire;
    let c = Cluster::start(3, test_threads(), &[]);
    let groups = c.threads as u32;
    let key = b"stale-term";
    let group = ringlock::shard::owner(key, groups as usize) as u32;
    let client: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let served =
        |n: usize| common::metric(metrics_addr(&c, n), "ringlock_lc_forwards_served_total");
    let mut req = vec![5u8, key.len() as u8];
    req.extend_from_slice(key);
    req.extend_from_slice(&[1, b's']);
    let forward = |id: u64, term: u64| {
        let mut b = Vec::new();
        wire::encode_forward(id, term, client, &req, &mut b);
        b[5..].to_vec()
    };
    // The leader, and its term of the key's group, as every node sees them.
    let leader_term = || {
        let l = c.leader(WAIT);
        let v = settled(&c);
        let row = v.iter().find(|r| r.0 == l as u64 + 1 && r.1 == group);
        (l, row.expect("the leader's row of the key's group").2)
    };
    let (l, term) = leader_term();
    let before = served(l);
    // Never a leader's term: 0, and one far ahead (a term that moves on
    // meanwhile, under load, does not reach it).
    for (id, stale) in [(1u64, 0), (2, term + 1_000_000)] {
        let mut link = PeerLink::open(&c, l, (l as u64 + 1) % 3 + 1, group, groups, &VOTERS);
        link.send_frame(wire::KIND_FORWARD, &forward(id, stale));
        // Frames are read in order: once the next one (malformed) closed
        // the link, the Forward was looked at.
        link.send_frame(7, &[0u8; 8]);
        poll_until("the link closed", WAIT, || !link.is_open());
        assert_eq!(
            served(l),
            before,
            "a Forward of term {stale} (the leader's is {term}) was taken up"
        );
    }
    // The same request in the leader's current term is taken up (read
    // again at each try: an election under load moves it).
    for id in 3..13u64 {
        let (l, term) = leader_term();
        let before = served(l);
        let mut link = PeerLink::open(&c, l, (l as u64 + 1) % 3 + 1, group, groups, &VOTERS);
        link.send_frame(wire::KIND_FORWARD, &forward(id, term));
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            if served(l) > before {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("no Forward of the leader's current term was taken up in 10 tries");
}

/// An entry of a node's own log that cannot be applied (written there by a
/// bad disk, say) stops the node: one line naming the group, the index and
/// why, and exit status 65, at every start, while the others serve on. A
/// running process with a dead shard is what it must never be.
#[test]
fn an_entry_that_does_not_parse_in_a_nodes_own_log_stops_it_at_every_start() {
    use ringlock::cluster::store;
    let mut c = Cluster::start(3, test_threads(), &[]);
    let l = c.leader(WAIT);
    lock_works(&c, "before");
    let f = (l + 1) % 3;
    settled(&c);
    c.kill9(f);
    // The entry after the last one, committed, of the term on file.
    let path = c.log_path(f, 0);
    let image = std::fs::read(&path).expect("the log");
    let r = store::replay(&image, "the log").expect("replays");
    let hs = r.recovered.hard_state.clone();
    let last = r
        .recovered
        .entries
        .last()
        .map_or(r.recovered.snapshot.get_metadata().index, |e| e.index);
    let bad = last + 1;
    let mut records = Vec::new();
    store::encode_entry(
        &Entry {
            index: bad,
            term: hs.term,
            data: b"\x07\x00 a bad sector".to_vec().into(),
            ..Default::default()
        },
        &mut records,
    );
    store::encode_hard_state(
        &HardState {
            commit: bad,
            ..hs.clone()
        },
        &mut records,
    );
    let mut image = image[..r.valid_len as usize].to_vec();
    image.extend_from_slice(&records);
    std::fs::write(&path, &image).expect("write the log");
    let line = format!("event=raft_apply_failed group=0 index={bad} exit_code=65");
    for start in 1..=2 {
        let (code, log) = start_until_exit(&mut c, f);
        assert_eq!(code, 65, "start {start}: exit status\n{log}");
        let said: Vec<&str> = log.lines().filter(|l| l.contains(&line)).collect();
        assert_eq!(said.len(), 1, "start {start}: one line {line:?} in:\n{log}");
        assert!(said[0].contains("does not parse"), "{}", said[0]);
        assert!(said[0].contains("at every start"), "{}", said[0]);
    }
    // The two others serve on.
    c.leader(WAIT);
    lock_works(&c, "after");
    // The entry stays in the log: nothing was rewritten by the failed
    // starts (it is the operator's to replace the node).
    let r = store::replay(&std::fs::read(&path).unwrap(), "the log").unwrap();
    assert!(r
        .recovered
        .entries
        .iter()
        .any(|e| e.index == bad && e.get_data() == b"\x07\x00 a bad sector"));
}

/// Starts node `i` and waits (bounded) for it to exit: its status and
/// everything it printed.
fn start_until_exit(c: &mut Cluster, i: usize) -> (i32, String) {
    match c.try_start_node(i) {
        // Exited before its listening line.
        Err(e) => {
            let code = e
                .split("code ")
                .nth(1)
                .and_then(|s| s.split(')').next())
                .and_then(|s| s.parse().ok())
                .unwrap_or(-1);
            (code, e)
        }
        Ok(()) => {
            let s = c.nodes[i].as_mut().expect("started");
            let t = Instant::now();
            let status = loop {
                if let Some(st) = s.child.try_wait().expect("try_wait") {
                    break st;
                }
                assert!(t.elapsed() < WAIT, "node {} runs on", i + 1);
                std::thread::sleep(Duration::from_millis(20));
            };
            let mut log: Vec<String> = s.startup_log.clone();
            log.extend(s.log.iter());
            c.nodes[i] = None;
            (status.code().unwrap_or(-1), log.join("\n"))
        }
    }
}
