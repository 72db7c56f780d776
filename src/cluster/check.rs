//! Every Raft message from a peer is checked here before raft-rs sees it.
//!
//! raft-rs trusts its peers: a field out of range makes it panic (a
//! `fatal!`, an `assert!`, an index out of bounds or an overflow), and a
//! panic in a shard's loop takes the node down — again at every start when
//! the bad value was persisted first. A bug, a bad disk or a bad actor on
//! another node must not do that to this one, so [`check`] refuses, before
//! raft-rs sees it, any message that a correct peer of this version never
//! sends and that could reach one of those panics or store something this
//! node could not apply later. A refused message is dropped whole (the
//! shard counts it, `ringlock_raft_messages_dropped_total{reason}`, and
//! logs the first of each reason every 10 s); the link stays up.
//!
//! The checks fall in three kinds:
//! - **structural**, true of every message a correct peer sends whatever
//!   this node's state: who sent it (`from` is the node of the link it
//!   came on, `to` is this node), its type, the fields no peer sets, the
//!   terms and indexes below [`MAX_TERM`] / [`MAX_INDEX`], an append's
//!   entries contiguous and in term order, every entry's payload and every
//!   snapshot's data decodable as this node would apply them;
//! - **relative to this node's state**, only on a message raft-rs acts on
//!   (its term is this node's term or later: raft-rs ignores an older
//!   one, which a correct peer may well send late): a heartbeat's commit
//!   within this node's log, an append's entries within its term and not
//!   replacing committed entries, a snapshot that does not contradict the
//!   committed log;
//! - **relative to this node's role**: what a leader is told of its own
//!   log (acknowledged and rejected indexes within it), and a vote a
//!   candidate did not ask for yet.
//!
//! Each bound says below why a correct peer never exceeds it: a check that
//! a correct peer trips is a bug (the cluster simulator counts every
//! refusal and fails on any).

use protobuf::Message as _;
use raft::eraftpb::{
    ConfChangeSingle, ConfChangeType, ConfChangeV2, ConfState, Entry, EntryType, Message,
    MessageType, Snapshot,
};

use super::store;

/// The largest term a message may carry (2^48). Terms only grow, by one
/// per election (a pre-vote round at least: an election timeout, 300 ms by
/// default): a cluster electing a leader every millisecond would take
/// 8 900 years to reach it. raft-rs adds 1 to a term when it campaigns
/// (`term + 1`, `become_candidate`) and when it refuses a snapshot as a
/// non-follower: `u64::MAX` from one heartbeat, persisted as this node's
/// term, overflowed at every start after it. Below this bound, 2^64 -
/// 2^48 elections remain.
pub const MAX_TERM: u64 = 1 << 48;

/// The largest index a message may carry (2^56): at a million entries a
/// second (a batch of records per entry), 2 284 years of one group's
/// log. raft-rs adds an append's entry count to its index and 1 to a
/// rejection hint (`maybe_append`, `maybe_decr_to`): below this bound
/// neither overflows (a frame holds at most 2^28 bytes, so fewer
/// entries).
pub const MAX_INDEX: u64 = 1 << 56;

/// Why a message was dropped: the `reason` label of
/// `ringlock_raft_messages_dropped_total` (a small fixed set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The bytes are not a raft message.
    Malformed,
    /// `from` is not the node whose link it came on.
    From,
    /// `to` is not this node.
    To,
    /// A message type no peer sends (local-only, or one this version never
    /// sends: proposals and leader transfers are never forwarded).
    Type,
    /// A term out of range.
    Term,
    /// An index out of range.
    Index,
    /// An append's (or read index's) entries out of order or place.
    Entries,
    /// An entry whose payload this node could not apply.
    Payload,
    /// A snapshot whose metadata, configuration or data is not sane.
    Snapshot,
    /// A vote this node did not ask for.
    Vote,
}

impl Reason {
    pub const COUNT: usize = 10;
    pub const ALL: [Reason; Reason::COUNT] = [
        Reason::Malformed,
        Reason::From,
        Reason::To,
        Reason::Type,
        Reason::Term,
        Reason::Index,
        Reason::Entries,
        Reason::Payload,
        Reason::Snapshot,
        Reason::Vote,
    ];

    /// The metric's label value and the log's `reason=`.
    pub fn label(self) -> &'static str {
        match self {
            Reason::Malformed => "malformed",
            Reason::From => "from",
            Reason::To => "to",
            Reason::Type => "type",
            Reason::Term => "term",
            Reason::Index => "index",
            Reason::Entries => "entries",
            Reason::Payload => "payload",
            Reason::Snapshot => "snapshot",
            Reason::Vote => "vote",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// A refused message: why, and what exactly (for the log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reason: Reason,
    pub detail: String,
}

impl Refusal {
    pub fn new(reason: Reason, detail: impl Into<String>) -> Refusal {
        Refusal {
            reason,
            detail: detail.into(),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason.label(), self.detail)
    }
}

fn refuse<T>(reason: Reason, detail: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal::new(reason, detail))
}

/// What the checks read of the receiving replica (raft-rs's state as of
/// the message's arrival).
pub struct Local<'a> {
    /// This node's id.
    pub id: u64,
    pub term: u64,
    pub last_index: u64,
    pub committed: u64,
    /// The highest index of this node's log known durable.
    pub persisted: u64,
    pub leader: bool,
    /// A candidate (not a pre-candidate): its vote requests are out once
    /// its log is durable.
    pub candidate: bool,
    /// The term of the entry at an index of this node's log, when known.
    pub term_at: &'a dyn Fn(u64) -> Option<u64>,
}

/// The message types a peer of this version sends. Not: the local ones
/// (MsgHup, MsgBeat, MsgUnreachable, MsgSnapStatus, MsgCheckQuorum: the
/// application steps them itself; raft-rs's RawNode refuses them too),
/// MsgPropose (a follower forwards a proposal to its leader, but
/// `Replica::propose` and `propose_change` propose only on the leader: a
/// proposal from a peer would append whatever it holds to the leader's log
/// and commit it cluster-wide), MsgTransferLeader (a follower forwards it,
/// but `Replica::transfer_leader` asks only a leader). MsgReadIndex is
/// forwarded: a follower's read barrier (`Replica::read_barrier`) goes to
/// its leader.
fn sent_by_peers(t: MessageType) -> bool {
    use MessageType::*;
    matches!(
        t,
        MsgAppend
            | MsgAppendResponse
            | MsgRequestVote
            | MsgRequestVoteResponse
            | MsgRequestPreVote
            | MsgRequestPreVoteResponse
            | MsgSnapshot
            | MsgHeartbeat
            | MsgHeartbeatResponse
            | MsgTimeoutNow
            | MsgReadIndex
            | MsgReadIndexResp
    )
}

/// Checks `m`, which arrived on the link of node `link`, against this
/// replica (`local`); `notes`: the configuration notices it carries, as the
/// replica decoded them (group, index); `Err`: drop it whole, raft-rs must
/// not see it.
pub fn check(
    m: &Message,
    link: u64,
    notes: &[(u32, u64)],
    local: &Local<'_>,
) -> Result<(), Refusal> {
    let t = m.get_msg_type();
    check_sender(m, t, link, local)?;
    check_bounds(m, t, notes)?;
    check_acted(m, t, local)
}

/// Who sent `m` (of type `t`) on the link of node `link`, to whom, and
/// whether a peer sends its type at all.
fn check_sender(m: &Message, t: MessageType, link: u64, local: &Local<'_>) -> Result<(), Refusal> {
    // Who: the link's Hello named its node (and a Hello naming this node,
    // or node 0, is refused); raft-rs takes `from` as given, and from 0
    // (INVALID_ID) it answers a read index as if this node had asked
    // itself — a lease probe's context, a lease of the sender's choosing.
    if m.from == 0 || m.from != link {
        return refuse(
            Reason::From,
            format!("a message from node {} on node {link}'s link", m.from),
        );
    }
    if m.to != local.id {
        return refuse(Reason::To, format!("a message for node {}", m.to));
    }
    if !sent_by_peers(t) {
        return refuse(Reason::Type, format!("{t:?} is never sent by a peer"));
    }
    Ok(())
}

/// The terms and indexes `m` (of type `t`) and its configuration notices
/// (`notes`) carry, each within what any correct peer sends.
fn check_bounds(m: &Message, t: MessageType, notes: &[(u32, u64)]) -> Result<(), Refusal> {
    use MessageType::*;
    // Term 0 is a local message to raft-rs (no term check at all: an
    // append of term 0 is taken from anyone, a vote of term 0 is answered
    // with term 0, which raft-rs's `send` refuses with a panic). raft-rs
    // sends every message with its term, but a forwarded MsgReadIndex
    // without one (and panics forwarding one that has one).
    if (t == MsgReadIndex) != (m.term == 0) {
        return refuse(Reason::Term, format!("{t:?} of term {}", m.term));
    }
    if m.term > MAX_TERM || m.log_term > MAX_TERM || m.commit_term > MAX_TERM {
        return refuse(
            Reason::Term,
            format!(
                "term {}, log term {}, commit term {} (at most {MAX_TERM})",
                m.term, m.log_term, m.commit_term
            ),
        );
    }
    for (name, v) in [
        ("index", m.index),
        ("commit", m.commit),
        ("reject hint", m.reject_hint),
    ] {
        if v > MAX_INDEX {
            return refuse(Reason::Index, format!("{name} {v} (at most {MAX_INDEX})"));
        }
    }
    // raft-rs asks for a snapshot only when the application calls
    // `request_snapshot`, which ringlock never does; a leader told so
    // would ask its storage for a snapshot up to any index, again at
    // every heartbeat.
    if m.request_snapshot != 0 {
        return refuse(
            Reason::Index,
            format!(
                "a request for a snapshot up to {} (this version never asks)",
                m.request_snapshot
            ),
        );
    }
    // The configuration notices (`wire::EXCLUDED_FIELD`) keep this node
    // from serving until it applied that far: an index beyond any log's
    // would keep it from serving for good.
    for &(g, i) in notes {
        if i > MAX_INDEX {
            return refuse(
                Reason::Index,
                format!("a configuration notice of group {g} at index {i}"),
            );
        }
    }
    Ok(())
}

/// What `m` (of type `t`) says of the logs, checked against this node's
/// when raft-rs acts on it.
fn check_acted(m: &Message, t: MessageType, local: &Local<'_>) -> Result<(), Refusal> {
    use MessageType::*;
    // raft-rs acts on a message of this node's term or a later one (it
    // moves to that term first); an older one it ignores but for an
    // empty answer, and a correct peer sends those late (a deposed leader,
    // a delayed packet): the checks against this node's log apply only to
    // messages raft-rs acts on.
    let acted = m.term != 0 && m.term >= local.term;
    match t {
        MsgAppend => check_append(m, local, acted)?,
        // raft-rs commits to a heartbeat's commit (`commit_to`), and panics
        // when it is beyond the log ("to_commit is out of range"). A leader
        // sends min(the follower's matched index, its commit): the follower
        // acknowledged those entries once they were durable, and entries up
        // to a commit index are never truncated.
        MsgHeartbeat if acted && m.commit > local.last_index => {
            return refuse(
                Reason::Index,
                format!(
                    "a heartbeat's commit {} beyond this node's last index {}",
                    m.commit, local.last_index
                ),
            );
        }
        MsgSnapshot => check_snapshot(m, local, acted)?,
        // What a follower says of this leader's own log: it acknowledges (or
        // rejects, hinting at its own end) what this leader sent in this
        // term, or its commit index, which this leader's log holds (every
        // committed entry is in the log of every later leader). Beyond it,
        // raft-rs takes a matched index past its log (a next index that
        // overflows) or probes from an index + 1 that overflows.
        MsgAppendResponse
            if local.leader
                && m.term == local.term
                && (m.index > local.last_index
                    || (m.reject && m.reject_hint > local.last_index)) =>
        {
            return refuse(
                Reason::Index,
                format!(
                    "an append response for index {} (hint {}) beyond this leader's last \
                     index {}",
                    m.index, m.reject_hint, local.last_index
                ),
            );
        }
        MsgRequestVoteResponse
            if !m.reject
                && local.candidate
                && m.term == local.term
                && local.persisted < local.last_index =>
        {
            // raft-rs sends a candidate's vote requests only once its log
            // is durable (a non-leader's messages wait for their ready to
            // persist), and a candidate appends nothing: while its log is
            // not all durable it asked nobody yet. A quorum of such votes
            // would make it leader with entries not yet durable, which
            // raft-rs asserts never happens (`become_leader`).
            return refuse(
                Reason::Vote,
                format!(
                    "a vote for term {} before this node asked for one (its log is durable up \
                     to {} of {})",
                    m.term, local.persisted, local.last_index
                ),
            );
        }
        MsgReadIndex | MsgReadIndexResp if m.entries.len() != 1 => {
            // A read index carries its context as its one entry, and the
            // leader answers with it: raft-rs takes `entries[0]` of a
            // request without looking.
            return refuse(
                Reason::Entries,
                format!("{t:?} with {} entries (one)", m.entries.len()),
            );
        }
        _ => {}
    }
    Ok(())
}

/// An append (MsgAppend): `index`/`log_term` name the entry its entries
/// follow.
fn check_append(m: &Message, local: &Local<'_>, acted: bool) -> Result<(), Refusal> {
    if acted {
        // raft-rs truncates at the first entry whose term differs from
        // this node's, and panics when that one is committed ("entry
        // conflict with committed entry"). A correct leader's log holds
        // every committed entry as it was committed.
        for e in m.entries.iter().filter(|e| e.index <= local.committed) {
            if let Some(t) = (local.term_at)(e.index).filter(|&t| t != e.term) {
                return refuse(
                    Reason::Entries,
                    format!(
                        "entry {} of term {} would replace a committed entry of term {t} \
                         (committed {})",
                        e.index, e.term, local.committed
                    ),
                );
            }
        }
    }
    // raft-rs takes the entries as the ones following `index`, one by one
    // (`maybe_append` slices them at `conflict - (index + 1)`, an
    // underflow or an index out of bounds otherwise, and stores them as
    // given). A leader sends a run of its log.
    let mut prev_term = 0;
    for (i, e) in m.entries.iter().enumerate() {
        let want = m.index + 1 + i as u64;
        if e.index != want {
            return refuse(
                Reason::Entries,
                format!(
                    "entry {} at position {i} of an append after index {} (expected {want})",
                    e.index, m.index
                ),
            );
        }
        // A log's terms never decrease, and every entry has one.
        if e.term == 0 || e.term < prev_term || e.term > MAX_TERM {
            return refuse(
                Reason::Entries,
                format!(
                    "entry {} of term {} after one of term {prev_term}",
                    e.index, e.term
                ),
            );
        }
        prev_term = e.term;
    }
    if acted {
        // A leader's entries are of its term or earlier ones, and follow
        // the entry of `log_term` in its log. An entry of a later term
        // than the message's would make this node's log claim terms that
        // were never elected (and outvote correct logs).
        let first = m.entries.first().map_or(m.log_term, |e| e.term);
        if m.log_term > m.term || first < m.log_term || prev_term > m.term {
            return refuse(
                Reason::Entries,
                format!(
                    "an append of term {} after log term {} with entries of terms {first}..={}",
                    m.term, m.log_term, prev_term
                ),
            );
        }
    }
    // Decoded as this node will apply them once committed: an entry that
    // does not parse is never stored (stored and committed, it would stop
    // this node at every start).
    for e in m.entries.iter() {
        if let Err(why) = check_entry(e) {
            return refuse(Reason::Payload, format!("entry {}: {why}", e.index));
        }
    }
    Ok(())
}

/// An entry's payload, decoded as the shard applies a committed entry
/// (`Shard::apply_entry`): a normal entry is empty (a leader's first
/// entry) or a proposal (the leader's clock, then a batch of log
/// records); a configuration change is a version-2 change naming nodes
/// 1 and up.
pub fn check_entry(e: &Entry) -> Result<(), String> {
    match e.get_entry_type() {
        EntryType::EntryNormal if e.data.is_empty() => Ok(()),
        EntryType::EntryNormal => {
            let (_, records) =
                store::split_proposal(&e.data).ok_or("too short to be a proposal")?;
            crate::wal::record::each_in_batch(records, |_| {})
                .map(|_| ())
                .map_err(|why| format!("its records do not parse: {why}"))
        }
        EntryType::EntryConfChangeV2 => {
            let cc = ConfChangeV2::parse_from_bytes(&e.data)
                .map_err(|why| format!("a configuration change that does not parse: {why}"))?;
            if cc.changes.iter().any(|c| c.node_id == 0) {
                return Err("a configuration change naming node 0".into());
            }
            Ok(())
        }
        // Replica::apply_change refuses it: ringlockd proposes version 2.
        EntryType::EntryConfChange => Err("a version-1 configuration change".into()),
    }
}

/// A snapshot a leader sends (MsgSnapshot).
fn check_snapshot(m: &Message, local: &Local<'_>, acted: bool) -> Result<(), Refusal> {
    let s = m.get_snapshot();
    let meta = s.get_metadata();
    // Every snapshot is of an applied entry: index and term 1 and up. Of
    // term 0, raft-rs finds it "matching" any index past its log and
    // commits to it (`restore`: "to_commit is out of range").
    if meta.index == 0 || meta.term == 0 || meta.index > MAX_INDEX || meta.term > MAX_TERM {
        return refuse(
            Reason::Snapshot,
            format!("a snapshot at index {} of term {}", meta.index, meta.term),
        );
    }
    if acted {
        // A leader's snapshot is of its committed log: its terms are the
        // leader's or earlier.
        if meta.term > m.term {
            return refuse(
                Reason::Snapshot,
                format!(
                    "a snapshot of term {} in a message of term {}",
                    meta.term, m.term
                ),
            );
        }
        // One ending at this node's commit index names that entry's
        // term: raft-rs would otherwise replace the log with it, and the
        // replica's storage refuses a snapshot no newer than its own.
        if meta.index == local.committed && (local.term_at)(meta.index) != Some(meta.term) {
            return refuse(
                Reason::Snapshot,
                format!(
                    "a snapshot at committed index {} of term {}, not the committed entry's",
                    meta.index, meta.term
                ),
            );
        }
    }
    if let Err(why) = check_conf_state(meta.get_conf_state()) {
        return refuse(Reason::Snapshot, format!("its configuration: {why}"));
    }
    if let Err(why) = check_snapshot_data(s) {
        return refuse(Reason::Snapshot, format!("its data: {why}"));
    }
    Ok(())
}

/// A snapshot's data, decoded as `install` reads it: the membership
/// (when present), then a proposal of log records.
pub fn check_snapshot_data(s: &Snapshot) -> Result<(), String> {
    let (_, table) = store::split_snapshot(&s.data)?;
    let (_, records) = store::split_proposal(table).ok_or("too short to be a table")?;
    crate::wal::record::each_in_batch(records, |_| {})
        .map(|_| ())
        .map_err(|why| format!("its records do not parse: {why}"))
}

/// A configuration raft-rs can restore: voters (some), learners, and a
/// joint change's outgoing voters and future learners, each once, none 0,
/// accepted by raft-rs's own configuration changer in the order raft-rs
/// restores it (`confchange::restore`) and giving back the same
/// configuration — raft-rs panics otherwise ("unable to restore config",
/// "invalid restore").
pub fn check_conf_state(cs: &ConfState) -> Result<(), String> {
    if cs.voters.is_empty() {
        return Err("no voters".into());
    }
    for (name, ids) in [
        ("voters", &cs.voters),
        ("learners", &cs.learners),
        ("outgoing voters", &cs.voters_outgoing),
        ("next learners", &cs.learners_next),
    ] {
        if ids.contains(&0) {
            return Err(format!("node 0 among the {name}"));
        }
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(format!("a node named twice among the {name}"));
        }
    }
    // raft-rs's `confchange::restore`, on a scratch tracker.
    let single = |id: u64, t: ConfChangeType| {
        let mut c = ConfChangeSingle {
            node_id: id,
            ..Default::default()
        };
        c.set_change_type(t);
        c
    };
    let mut incoming: Vec<ConfChangeSingle> = Vec::new();
    incoming.extend(
        cs.voters_outgoing
            .iter()
            .map(|&id| single(id, ConfChangeType::RemoveNode)),
    );
    incoming.extend(
        cs.voters
            .iter()
            .map(|&id| single(id, ConfChangeType::AddNode)),
    );
    incoming.extend(
        cs.learners
            .iter()
            .chain(&cs.learners_next)
            .map(|&id| single(id, ConfChangeType::AddLearnerNode)),
    );
    let mut tracker = raft::ProgressTracker::new(1);
    let err = |e: raft::Error| format!("raft-rs refuses it: {e}");
    if cs.voters_outgoing.is_empty() {
        for c in incoming {
            let (cfg, changes) = raft::Changer::new(&tracker).simple(&[c]).map_err(err)?;
            tracker.apply_conf(cfg, changes, 1);
        }
    } else {
        for &id in cs.voters_outgoing.iter() {
            let c = single(id, ConfChangeType::AddNode);
            let (cfg, changes) = raft::Changer::new(&tracker).simple(&[c]).map_err(err)?;
            tracker.apply_conf(cfg, changes, 1);
        }
        let (cfg, changes) = raft::Changer::new(&tracker)
            .enter_joint(cs.auto_leave, &incoming)
            .map_err(err)?;
        tracker.apply_conf(cfg, changes, 1);
    }
    let got = tracker.conf().to_conf_state();
    let same = |a: &[u64], b: &[u64]| {
        let (mut a, mut b) = (a.to_vec(), b.to_vec());
        a.sort_unstable();
        b.sort_unstable();
        a == b
    };
    if !(same(&got.voters, &cs.voters)
        && same(&got.learners, &cs.learners)
        && same(&got.voters_outgoing, &cs.voters_outgoing)
        && same(&got.learners_next, &cs.learners_next)
        && got.auto_leave == cs.auto_leave)
    {
        return Err(format!("raft-rs would restore it as {got:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proposal(records: &[u8]) -> Vec<u8> {
        let mut data = Vec::new();
        store::proposal(1_700_000_000_000, records, &mut data);
        data
    }

    fn grant_mark() -> Vec<u8> {
        let mut r = Vec::new();
        crate::wal::record::encode_grant_mark(42, &mut r);
        r
    }

    fn change(ids: &[u64]) -> Vec<u8> {
        let cc = ConfChangeV2 {
            changes: ids
                .iter()
                .map(|&id| {
                    let mut c = ConfChangeSingle {
                        node_id: id,
                        ..Default::default()
                    };
                    c.set_change_type(ConfChangeType::AddLearnerNode);
                    c
                })
                .collect::<Vec<_>>()
                .into(),
            ..Default::default()
        };
        cc.write_to_bytes().unwrap()
    }

    fn entry(t: EntryType, data: Vec<u8>) -> Entry {
        let mut e = Entry {
            index: 7,
            term: 2,
            data: data.into(),
            ..Default::default()
        };
        e.set_entry_type(t);
        e
    }

    /// What the shard applies passes; what it cannot apply is named.
    #[test]
    fn entries_decode_as_the_shard_applies_them() {
        use EntryType::*;
        let ok = [
            entry(EntryNormal, Vec::new()),
            entry(EntryNormal, proposal(&grant_mark())),
            entry(EntryNormal, proposal(&[])),
            entry(EntryConfChangeV2, change(&[4])),
            // Leaving a joint configuration: an empty change.
            entry(EntryConfChangeV2, Vec::new()),
        ];
        for e in ok {
            assert_eq!(check_entry(&e), Ok(()), "{e:?}");
        }
        let mut torn = proposal(&grant_mark());
        torn.pop();
        let mut flipped = proposal(&grant_mark());
        *flipped.last_mut().unwrap() ^= 1;
        let bad = [
            (entry(EntryNormal, b"short".to_vec()), "too short"),
            (entry(EntryNormal, torn), "do not parse"),
            (entry(EntryNormal, flipped), "checksum"),
            (entry(EntryConfChangeV2, vec![0xff, 0xff]), "does not parse"),
            (entry(EntryConfChangeV2, change(&[4, 0])), "node 0"),
            (entry(EntryConfChange, Vec::new()), "version-1"),
        ];
        for (e, why) in bad {
            let got = check_entry(&e).unwrap_err();
            assert!(got.contains(why), "{e:?}: {got}");
        }
    }

    #[test]
    fn snapshot_data_decodes_as_install_reads_it() {
        let conf = ConfState::from((vec![1, 2, 3], vec![]));
        let members = store::Members {
            conf,
            addrs: Default::default(),
        };
        let table = proposal(&grant_mark());
        let mut s = Snapshot {
            data: store::snapshot_data(&members, &table).into(),
            ..Default::default()
        };
        assert_eq!(check_snapshot_data(&s), Ok(()));
        // A version-1 snapshot: the table alone.
        s.data = table.clone().into();
        assert_eq!(check_snapshot_data(&s), Ok(()));
        for data in [b"x".to_vec(), store::snapshot_data(&members, b"abc")] {
            s.data = data.into();
            assert!(check_snapshot_data(&s).is_err());
        }
        let mut cut = store::snapshot_data(&members, &table);
        cut.truncate(20);
        s.data = cut.into();
        assert!(check_snapshot_data(&s).unwrap_err().contains("cut short"));
    }

    /// What raft-rs restores passes (simple and joint); the rest is
    /// named before raft-rs would panic restoring it.
    #[test]
    fn a_configuration_must_be_one_raft_rs_restores() {
        let plain = ConfState::from((vec![1, 2, 3], vec![4]));
        // Node 3 leaving for a learner, node 4 joining as a voter.
        let mut joint = ConfState::from((vec![1, 2, 4], vec![]));
        joint.voters_outgoing = vec![1, 2, 3];
        joint.learners_next = vec![3];
        joint.auto_leave = true;
        for cs in [&plain, &joint] {
            assert_eq!(check_conf_state(cs), Ok(()), "{cs:?}");
        }
        let with = |f: &dyn Fn(&mut ConfState)| {
            let mut cs = plain.clone();
            f(&mut cs);
            cs
        };
        let bad = [
            (ConfState::default(), "no voters"),
            (with(&|c| c.learners = vec![0]), "node 0 among the learners"),
            (with(&|c| c.voters = vec![1, 0]), "node 0 among the voters"),
            (
                with(&|c| c.voters = vec![1, 2, 1]),
                "twice among the voters",
            ),
            // A voter that is also a learner, next learners with no joint
            // change: raft-rs restores something else.
            (with(&|c| c.learners = vec![2]), "raft-rs"),
            (with(&|c| c.learners_next = vec![5]), "raft-rs"),
        ];
        for (cs, why) in bad {
            let got = check_conf_state(&cs).unwrap_err();
            assert!(got.contains(why), "{cs:?}: {got}");
        }
    }
}
