//! The replica's tests: replicas in memory, messages delivered by hand.

use raft::eraftpb::ConfChangeType;

use super::members::{conf_change, single_change};
use super::*;

/// An entry's data as a leader proposes it: its clock, then a batch
/// of records (one grant mark, `n`). Peers refuse anything else.
fn payload(n: u64) -> Vec<u8> {
    let mut records = Vec::new();
    crate::wal::record::encode_grant_mark(n, &mut records);
    let mut data = Vec::new();
    store::proposal(1_700_000_000_000, &records, &mut data);
    data
}

/// Three replicas in memory, messages delivered at once, persistence
/// immediate: one is elected, a proposal commits everywhere.
#[test]
fn three_replicas_elect_and_commit() {
    let mut nodes: Vec<Replica> = (1..=3)
        .map(|id| {
            Replica::new(
                ReplicaConfig {
                    id,
                    voters: vec![1, 2, 3],
                    election_ticks: 10,
                    heartbeat_ticks: 2,
                    seed: 7,
                },
                Recovered::default(),
            )
            .unwrap()
        })
        .collect();
    let mut applied: Vec<Vec<Vec<u8>>> = vec![vec![]; 3];
    let mut proposed = false;
    for _ in 0..200 {
        for n in nodes.iter_mut() {
            n.tick();
        }
        if !proposed {
            if let Some(l) = nodes.iter_mut().find(|n| n.serving()) {
                assert!(l.propose(payload(7)).is_some());
                proposed = true;
            }
        }
        drain(&mut nodes, |i, e| {
            if !Replica::is_empty_entry(e) {
                applied[i].push(e.data.to_vec());
            }
        });
    }
    assert!(proposed, "a leader served");
    assert_eq!(nodes.iter().filter(|n| n.is_leader()).count(), 1);
    for a in &applied {
        assert_eq!(a, &vec![payload(7)]);
    }
}

fn replica(id: u64, voters: Vec<u64>) -> Replica {
    Replica::new(
        ReplicaConfig {
            id,
            voters,
            election_ticks: 10,
            heartbeat_ticks: 2,
            seed: 7,
        },
        Recovered::default(),
    )
    .unwrap()
}

/// Ticks every replica `rounds` times, delivering every message at
/// once and persisting at once; applies what commits.
fn run(nodes: &mut [Replica], rounds: usize) {
    for _ in 0..rounds {
        for n in nodes.iter_mut() {
            n.tick();
        }
        drain(nodes, |_, _| {});
    }
}

/// Delivers every message at once and persists at once until the
/// replicas are quiet (at most 20 rounds); `applied(i, entry)` for each
/// entry replica `i` applies.
fn drain(nodes: &mut [Replica], mut applied: impl FnMut(usize, &raft::eraftpb::Entry)) {
    for _ in 0..20 {
        let mut mail = Vec::new();
        for (i, n) in nodes.iter_mut().enumerate() {
            let mut out = Output::default();
            n.ready(&mut out, &mut Vec::new());
            if let Some(num) = out.persist.take() {
                n.persisted(num, &mut out);
            }
            for e in &out.apply {
                applied(i, e);
                n.applied_to(e.index);
            }
            let from = n.id();
            mail.extend(out.send.into_iter().map(|(to, b)| (from, to, b)));
        }
        if mail.is_empty() {
            break;
        }
        for (from, to, bytes) in mail {
            nodes[(to - 1) as usize].step(from, &bytes).unwrap();
        }
    }
}

/// The three replicas of a fresh group stall together (their loops
/// share a CPU that other work starves) for three election timeouts;
/// then the ticks they missed arrive at once. raft-rs's timers take
/// only a few of them, so the randomized timeouts still tell the nodes
/// apart: one stands first and is elected in term 1. (Taking the whole
/// stall, every timer ran out inside the burst, all three stood at
/// once, each voted for itself, and term 1 elected nobody.) The
/// replica's own clock takes the whole stall: a leader's lease runs
/// out in real time.
#[test]
fn a_stall_of_every_node_does_not_split_the_first_vote() {
    let mut nodes: Vec<Replica> = (1..=3).map(|id| replica(id, vec![1, 2, 3])).collect();
    run(&mut nodes, 2);
    assert!(nodes.iter().all(|n| n.role_name() == "follower"));
    for n in nodes.iter_mut() {
        n.ticks_passed(3 * n.election_ticks());
    }
    assert!(nodes.iter().all(|n| n.ticks() == 32));
    drain(&mut nodes, |_, _| {});
    for _ in 0..100 {
        if nodes.iter().any(|n| n.is_leader()) {
            break;
        }
        run(&mut nodes, 1);
    }
    let l = nodes
        .iter()
        .position(|n| n.is_leader())
        .expect("a leader is elected");
    assert_eq!(nodes[l].term(), 1, "the first vote did not split");
    run(&mut nodes, 10);
    assert!(nodes[l].serving());
    // The leader stalls alone: its lease does not outlive the stall.
    let e = nodes[l].election_ticks();
    nodes[l].ticks_passed(e);
    assert!(!nodes[l].lease_valid() && !nodes[l].serving());
}

/// A peer's notice that a configuration as of an index this replica
/// has not applied excludes it makes it no voter (it neither serves
/// nor counts as one) until it applied that far; a notice of an index
/// it applied already (stale: say it was added back since) changes
/// nothing, and a joining node takes no notice.
#[test]
fn a_notice_of_a_newer_configuration_holds_until_applied_that_far() {
    let mut nodes: Vec<Replica> = (1..=3).map(|id| replica(id, vec![1, 2, 3])).collect();
    run(&mut nodes, 60);
    let l = nodes
        .iter()
        .position(|n| n.serving())
        .expect("a leader serves");
    let f = (l + 1) % 3;
    let applied = nodes[f].applied_index();
    assert!(applied > 0 && nodes[f].is_voter());
    nodes[f].told_excluded(applied);
    assert!(!nodes[f].excluded(), "a notice of what it applied already");
    // The notice comes in a peer's message.
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgHeartbeatResponse);
    m.to = f as u64 + 1;
    m.from = l as u64 + 1;
    m.term = nodes[f].term();
    let mut b = encode_message(&m);
    encode_excluded(&[(4, applied + 2)], &mut b);
    let notes = nodes[f].step(l as u64 + 1, &b).unwrap();
    assert_eq!(notes, [(4, applied + 2)]);
    nodes[f].told_excluded(applied + 2);
    assert!(nodes[f].excluded());
    // The leader, told so, stops serving until it applied that far.
    let la = nodes[l].applied_index();
    nodes[l].told_excluded(la + 2);
    assert!(nodes[l].excluded() && !nodes[l].serving());
    for _ in 0..2 {
        assert!(nodes[l].propose(payload(1)).is_some());
        run(&mut nodes, 1);
    }
    run(&mut nodes, 10);
    assert!(nodes[l].applied_index() >= la + 2);
    assert!(!nodes[l].excluded() && nodes[l].serving());
    assert!(!nodes[f].excluded(), "the follower applied that far too");
    // A joining node (no configuration of its own yet) takes none.
    let mut j = replica(9, vec![]);
    assert!(j.is_joining());
    j.told_excluded(100);
    assert!(!j.excluded());
}

/// A message from node `from` to node `to` of type `t` in `term`.
fn msg(t: MessageType, from: u64, to: u64, term: u64) -> Message {
    let mut m = Message::default();
    m.set_msg_type(t);
    m.from = from;
    m.to = to;
    m.term = term;
    m
}

fn entry(index: u64, term: u64, data: Vec<u8>) -> Entry {
    Entry {
        index,
        term,
        data: data.into(),
        ..Default::default()
    }
}

fn snapshot(index: u64, term: u64, conf: ConfState, data: Vec<u8>) -> Snapshot {
    let mut s = Snapshot {
        data: data.into(),
        ..Default::default()
    };
    s.mut_metadata().index = index;
    s.mut_metadata().term = term;
    s.mut_metadata().set_conf_state(conf);
    s
}

/// A snapshot's data as a leader makes it: the membership, then the
/// table as a proposal.
fn snapshot_data(conf: &ConfState) -> Vec<u8> {
    let members = store::Members {
        conf: conf.clone(),
        addrs: Default::default(),
    };
    store::snapshot_data(&members, &payload(9))
}

/// What a refused message must not change.
fn state(n: &Replica) -> (u64, u64, u64, u64, &'static str, ConfState) {
    (
        n.term(),
        n.leader(),
        n.commit_index(),
        n.last_index(),
        n.role_name(),
        n.conf_state(),
    )
}

/// Forged messages, each one a peer of this version never sends, to a
/// follower and to the leader of a running group: every one refused
/// before raft-rs sees it, for its reason, changing nothing; then the
/// group commits as before. Most of them panic raft-rs without their
/// check (noted per case), so removing one fails this test there.
#[test]
fn hostile_messages_are_refused_and_the_group_goes_on() {
    let mut nodes: Vec<Replica> = (1..=3).map(|id| replica(id, vec![1, 2, 3])).collect();
    run(&mut nodes, 60);
    let l = nodes.iter().position(|n| n.serving()).expect("a leader");
    for k in 1..=3 {
        assert!(nodes[l].propose(payload(k)).is_some());
        run(&mut nodes, 2);
    }
    let f = (l + 1) % 3;
    let o = (l + 2) % 3;
    let (lid, fid, oid) = (l as u64 + 1, f as u64 + 1, o as u64 + 1);
    let term = nodes[f].term();
    let last = nodes[f].last_index();
    let committed = nodes[f].commit_index();
    assert!(committed >= 4 && committed == last, "{committed} {last}");
    let conf = nodes[f].conf_state();
    let good = || payload(5);
    // An append of one good entry after the follower's last one.
    let append = |entries: Vec<Entry>| {
        let mut m = msg(MessageType::MsgAppend, lid, fid, term);
        m.index = last;
        m.log_term = term;
        m.commit = committed;
        m.set_entries(entries.into());
        m
    };
    let hb = |commit: u64, term: u64| {
        let mut m = msg(MessageType::MsgHeartbeat, lid, fid, term);
        m.commit = commit;
        m
    };
    let snap = |s: Snapshot| {
        let mut m = msg(MessageType::MsgSnapshot, lid, fid, term);
        m.set_snapshot(s);
        m
    };
    // Node 3 demoted to a learner, node 4 made a voter, half done.
    let mut joint = ConfState::from((vec![1, 2, 4], vec![]));
    joint.voters_outgoing = vec![1, 2, 3];
    joint.learners_next = vec![3];
    let mut learner_voter = conf.clone();
    learner_voter.learners = vec![fid];
    let mut with_zero = conf.clone();
    with_zero.learners = vec![0];
    let mut vote = msg(MessageType::MsgRequestVote, oid, fid, 0);
    vote.index = last;
    let mut read = msg(MessageType::MsgReadIndex, oid, lid, term);
    read.set_entries(vec![entry(0, 0, b"R12345678".to_vec())].into());
    let mut read_no_ctx = msg(MessageType::MsgReadIndex, oid, lid, 0);
    read_no_ctx.set_entries(Vec::new().into());
    let mut propose = msg(MessageType::MsgPropose, oid, lid, 0);
    propose.set_entries(vec![entry(0, 0, good())].into());
    let mut ack_beyond = msg(MessageType::MsgAppendResponse, fid, lid, term);
    ack_beyond.index = last + 1000;
    let mut hint_max = msg(MessageType::MsgAppendResponse, fid, lid, term);
    hint_max.reject = true;
    hint_max.index = last;
    hint_max.reject_hint = u64::MAX;
    let mut ask_snapshot = msg(MessageType::MsgAppendResponse, fid, lid, term);
    ask_snapshot.reject = true;
    ask_snapshot.index = last;
    ask_snapshot.reject_hint = last;
    ask_snapshot.request_snapshot = last + 5;
    let mut conf_v1 = entry(last + 1, term, Vec::new());
    conf_v1.set_entry_type(EntryType::EntryConfChange);
    let mut conf_zero = entry(last + 1, term, Vec::new());
    conf_zero.set_entry_type(EntryType::EntryConfChangeV2);
    conf_zero.data = conf_change(vec![single_change(0, ConfChangeType::AddNode)])
        .write_to_bytes()
        .unwrap()
        .into();
    // (to, link, message, reason, what it does without the check)
    let cases: Vec<(usize, u64, Message, Reason, &str)> = vec![
        // raft-rs: "to_commit 2^60 is out of range" (commit_to).
        (f, lid, hb(1 << 60, term), Reason::Index, "commit 2^60"),
        (
            f,
            lid,
            hb(last + 1, term),
            Reason::Index,
            "commit past the log",
        ),
        // Persisted as the term; `term + 1` overflows at the next
        // election, at every start.
        (f, lid, hb(committed, u64::MAX), Reason::Term, "term 2^64-1"),
        (
            f,
            lid,
            hb(committed, MAX_TERM_PLUS),
            Reason::Term,
            "term 2^48+1",
        ),
        (
            f,
            oid,
            hb(committed, term),
            Reason::From,
            "from another link",
        ),
        (
            f,
            0,
            {
                let mut m = hb(committed, term);
                m.from = 0;
                m
            },
            Reason::From,
            "from node 0 on a link of node 0",
        ),
        (
            f,
            lid,
            {
                let mut m = hb(committed, term);
                m.to = oid;
                m
            },
            Reason::To,
            "to another node",
        ),
        // Appended on the leader and committed cluster-wide.
        (l, oid, propose, Reason::Type, "a forwarded proposal"),
        (
            f,
            lid,
            msg(MessageType::MsgHup, lid, fid, 0),
            Reason::Type,
            "local",
        ),
        (
            f,
            lid,
            msg(MessageType::MsgTransferLeader, lid, fid, term),
            Reason::Type,
            "transfer",
        ),
        // Forwarded with a term: raft-rs's `send` panics.
        (l, oid, read, Reason::Term, "read index with a term"),
        // raft-rs takes `entries[0]`.
        (
            l,
            oid,
            read_no_ctx,
            Reason::Entries,
            "read index without context",
        ),
        // Answered with term 0: raft-rs's `send` panics.
        (f, oid, vote, Reason::Term, "a vote of term 0"),
        // Stored, committed, then stops the node at every start.
        (
            f,
            lid,
            append(vec![entry(last + 1, term, b"garbage".to_vec())]),
            Reason::Payload,
            "an entry that does not parse",
        ),
        (
            f,
            lid,
            append(vec![entry(last + 1, term, {
                let mut d = good();
                d.push(0);
                d
            })]),
            Reason::Payload,
            "an entry with a torn record",
        ),
        (
            f,
            lid,
            append(vec![conf_v1]),
            Reason::Payload,
            "a v1 change",
        ),
        (
            f,
            lid,
            append(vec![conf_zero]),
            Reason::Payload,
            "node 0 added",
        ),
        // `index + entries` overflows (in raft-rs's maybe_append and
        // in the checks after this one).
        (
            f,
            lid,
            {
                let mut m = append(vec![entry(0, term, good())]);
                m.index = u64::MAX;
                m
            },
            Reason::Index,
            "an append after index 2^64-1",
        ),
        // maybe_append slices out of bounds.
        (
            f,
            lid,
            append(vec![entry(last + 3, term, good())]),
            Reason::Entries,
            "entries not following the index",
        ),
        // "entry conflict with committed entry" once the entries do
        // not follow the index (below); following it, raft-rs ignores
        // an append below its commit index, but not its later term.
        (
            f,
            lid,
            {
                let mut m = append(vec![entry(committed, term + 1, good())]);
                m.term = term + 1;
                m.index = committed - 1;
                m
            },
            Reason::Entries,
            "an entry replacing a committed one",
        ),
        (
            f,
            lid,
            append(vec![entry(last + 1, term + 1, good())]),
            Reason::Entries,
            "an entry of a later term than its message",
        ),
        (
            f,
            lid,
            append(vec![
                entry(last + 1, term, good()),
                entry(last + 2, term - 1, good()),
            ]),
            Reason::Entries,
            "terms going down",
        ),
        // Replaces the whole table, adds the attacker as a learner.
        (
            f,
            lid,
            snap(snapshot(last + 10, term, conf.clone(), b"garbage".to_vec())),
            Reason::Snapshot,
            "snapshot data that does not parse",
        ),
        // "to_commit is out of range" (a term-0 snapshot "matches").
        (
            f,
            lid,
            snap(snapshot(last + 10, 0, conf.clone(), snapshot_data(&conf))),
            Reason::Snapshot,
            "a snapshot of term 0",
        ),
        (
            f,
            lid,
            snap(snapshot(
                last + 10,
                term,
                ConfState::default(),
                snapshot_data(&conf),
            )),
            Reason::Snapshot,
            "no voters",
        ),
        // "invalid restore" / "unable to restore config".
        (
            f,
            lid,
            snap(snapshot(
                last + 10,
                term,
                learner_voter.clone(),
                snapshot_data(&conf),
            )),
            Reason::Snapshot,
            "a voter that is also a learner",
        ),
        (
            f,
            lid,
            snap(snapshot(last + 10, term, with_zero, snapshot_data(&conf))),
            Reason::Snapshot,
            "node 0",
        ),
        (
            f,
            lid,
            {
                let mut m = snap(snapshot(
                    committed,
                    term + 1,
                    conf.clone(),
                    snapshot_data(&conf),
                ));
                m.term = term + 1;
                m
            },
            Reason::Snapshot,
            "a snapshot of the committed index with another term",
        ),
        (
            f,
            lid,
            snap(snapshot(
                last + 10,
                term + 1,
                conf.clone(),
                snapshot_data(&conf),
            )),
            Reason::Snapshot,
            "a snapshot of a later term than its message",
        ),
        // The leader: a matched index past its log, a hint + 1 that
        // overflows, a snapshot asked for.
        (
            l,
            fid,
            ack_beyond,
            Reason::Index,
            "an ack past the leader's log",
        ),
        (l, fid, hint_max, Reason::Index, "a hint of 2^64-1"),
        (l, fid, ask_snapshot, Reason::Index, "a snapshot request"),
    ];
    let mut cases: Vec<(usize, u64, Vec<u8>, Reason, &str)> = cases
        .into_iter()
        .map(|(to, link, m, reason, what)| (to, link, encode_message(&m), reason, what))
        .collect();
    let mut noted = encode_message(&hb(committed, term));
    encode_excluded(&[(1, u64::MAX)], &mut noted);
    cases.push((
        f,
        lid,
        noted,
        Reason::Index,
        "a notice that never lets this node serve",
    ));
    // The joint configuration itself is one raft-rs restores.
    assert_eq!(super::super::check::check_conf_state(&joint), Ok(()));
    for (to, link, m, reason, what) in cases {
        let before = state(&nodes[to]);
        let got = nodes[to].step(link, &m);
        assert_eq!(
            got.as_ref().map_err(|r| r.reason),
            Err(reason),
            "{what}: {got:?}"
        );
        assert_eq!(state(&nodes[to]), before, "{what} changed the replica");
    }
    assert_eq!(
        nodes[f].step(lid, b"\xff\xff\xff").map_err(|r| r.reason),
        Err(Reason::Malformed)
    );
    // The group goes on: what it commits now, every replica applies.
    run(&mut nodes, 10);
    let before = nodes.iter().map(|n| n.applied_index()).min().unwrap();
    assert!(nodes[l].propose(payload(6)).is_some());
    run(&mut nodes, 10);
    for n in &nodes {
        assert_eq!(n.term(), term, "no election");
        assert!(n.applied_index() > before);
    }
}

/// The term bound above, plus one.
const MAX_TERM_PLUS: u64 = super::super::check::MAX_TERM + 1;

/// A candidate whose log is not all durable has asked nobody for a
/// vote yet (its requests wait for its log): a vote for it is
/// refused. Counted, a quorum of such votes made it leader with
/// entries not durable, and raft-rs panics (`become_leader` asserts
/// that its log is persisted).
#[test]
fn a_vote_nobody_was_asked_for_is_refused() {
    let mut nodes: Vec<Replica> = (1..=3).map(|id| replica(id, vec![1, 2, 3])).collect();
    run(&mut nodes, 60);
    let l = nodes.iter().position(|n| n.serving()).expect("a leader");
    let f = (l + 1) % 3;
    let o = (l + 2) % 3;
    let (lid, fid, oid) = (l as u64 + 1, f as u64 + 1, o as u64 + 1);
    // The follower receives an entry and has not made it durable.
    assert!(nodes[l].propose(payload(1)).is_some());
    let mut out = Output::default();
    nodes[l].ready(&mut out, &mut Vec::new());
    for (to, b) in out.send {
        if to == fid {
            nodes[f].step(lid, &b).unwrap();
        }
    }
    let mut fo = Output::default();
    nodes[f].ready(&mut fo, &mut Vec::new());
    assert!(fo.persist.is_some(), "the entry is being written");
    // The leader hands over to it (a correct message), then a forged
    // vote arrives before its vote requests left.
    let term = nodes[f].term();
    nodes[f]
        .step(
            lid,
            &encode_message(&msg(MessageType::MsgTimeoutNow, lid, fid, term)),
        )
        .unwrap();
    assert_eq!(nodes[f].role_name(), "candidate");
    let vote = msg(MessageType::MsgRequestVoteResponse, oid, fid, term + 1);
    assert_eq!(
        nodes[f]
            .step(oid, &encode_message(&vote))
            .map_err(|r| r.reason),
        Err(Reason::Vote)
    );
    assert_eq!(nodes[f].role_name(), "candidate");
    // Once its log is durable its requests go out, and votes count.
    let n = fo.persist.take().unwrap();
    let mut sent = Vec::new();
    let mut out = Output::default();
    nodes[f].persisted(n, &mut out);
    for _ in 0..3 {
        nodes[f].ready(&mut out, &mut Vec::new());
        if let Some(n) = out.persist.take() {
            nodes[f].persisted(n, &mut out);
        }
        sent.append(&mut out.send);
    }
    assert!(sent.iter().any(|(to, b)| *to == oid
        && Message::parse_from_bytes(b).unwrap().get_msg_type() == MessageType::MsgRequestVote));
    assert_eq!(nodes[f].step(oid, &encode_message(&vote)), Ok(vec![]));
    assert!(nodes[f].is_leader());
}

/// A leader takes a source over 127 bytes only while its peers announce
/// that they read one (FEATURE_LONG_SOURCES): a peer of an earlier version
/// (announcing sessions only) would refuse the entry and fall behind.
/// Sessions are gated apart: that peer still reads session records.
#[test]
fn long_sources_wait_for_every_peer_to_announce_them() {
    use super::super::wire::FEATURES;
    let mut nodes: Vec<Replica> = (1..=3).map(|id| replica(id, vec![1, 2, 3])).collect();
    run(&mut nodes, 60);
    let l = nodes.iter().position(|n| n.serving()).expect("a leader");
    const {
        assert!(
            FEATURES & FEATURE_LONG_SOURCES != 0,
            "this version reads them"
        )
    };
    assert!(nodes[l].peers_read_long_sources() && nodes[l].peers_read_sessions());
    let (lid, term) = (l as u64 + 1, nodes[l].term());
    let other = (l + 1) % 3 + 1;
    // A heartbeat answer from `other` announcing `features`.
    let answer = |features: u64| {
        let mut b = msg(MessageType::MsgHeartbeatResponse, other as u64, lid, term)
            .write_to_bytes()
            .unwrap();
        // The features field, as a varint key and a varint value.
        for mut x in [u64::from(FEATURES_FIELD) << 3, features] {
            while x >= 0x80 {
                b.push((x as u8 & 0x7f) | 0x80);
                x >>= 7;
            }
            b.push(x as u8);
        }
        b
    };
    nodes[l]
        .step(other as u64, &answer(FEATURE_SESSIONS))
        .unwrap();
    assert!(
        !nodes[l].peers_read_long_sources(),
        "an older peer was heard"
    );
    assert!(nodes[l].peers_read_sessions());
    nodes[l].step(other as u64, &answer(FEATURES)).unwrap();
    assert!(
        nodes[l].peers_read_long_sources(),
        "upgraded: its newest message counts"
    );
}
