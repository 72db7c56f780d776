//! One shard's replica of its Raft group: raft-rs's `RawNode` driven by
//! hand, as a pure state machine (no clock, no I/O, no thread).
//!
//! The shard feeds it ticks, peer messages and proposals, and takes from
//! it, after each [`Replica::ready`]:
//! - messages to send now ([`Output::send`]);
//! - log records to make durable ([`Output::persist`], our own record
//!   format, see [`super::store`]), each with a ready number the shard
//!   reports back through [`Replica::persisted`] once its write and
//!   fdatasync landed (group commit covers them: one fdatasync per batch);
//! - committed entries to apply ([`Output::apply`]).
//!
//! Persistence is asynchronous (`advance_append_async`): the loop keeps
//! stepping messages while a batch is being synced. Messages that raft-rs
//! may send only after the state they describe is durable (a follower's
//! append acknowledgement, a vote) are held here until [`Replica::persisted`]
//! covers their ready.
//!
//! # Leadership, and when a leader may serve
//! raft-rs's `check_quorum` makes a leader step down when it has not heard
//! from a quorum within an election timeout, but only at the next check:
//! an isolated leader can outlive the election of its successor by up to
//! an election timeout. So the replica keeps its own **leader lease**: a
//! ReadIndex is issued with every heartbeat round, its context the tick it
//! was sent; when a quorum acknowledges it, none of those nodes will vote
//! for another candidate until an election timeout after they received it
//! (raft-rs rejects votes while it has a live leader, `check_quorum`), so
//! the leader is the only one that can commit until `sent + election ticks`.
//! [`Replica::serving`] is true only inside that lease (less a margin for
//! tick skew) and after the leader applied an entry of its own term.
//! A node that restarts has forgotten whom it heard from: it refuses
//! every vote for one election timeout after it starts.
//!
//! The election timeout is randomized from the replica's own seeded
//! generator (never raft-rs's thread RNG), so the simulator is
//! deterministic.

use std::collections::VecDeque;

use protobuf::Message as _;
use raft::eraftpb::{
    ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState, Entry,
    EntryType, Message, MessageType, Snapshot,
};
use raft::storage::MemStorage;
use raft::{GetEntriesContext, RaftState, RawNode, SnapshotStatus, StateRole, Storage};

/// raft-rs's view of the log: its in-memory store for entries and hard
/// state, and the newest snapshot with its data (the store keeps only a
/// snapshot's metadata). The durable copy of all of it is the shard's log
/// file ([`super::store`]).
pub struct Store {
    mem: MemStorage,
    snap: Snapshot,
    /// A follower needs a snapshot newer than `snap` (one that names it:
    /// a node added since `snap` cannot install it). The shard compacts
    /// at once ([`Replica::take_snapshot_wanted`]).
    wanted: std::cell::Cell<bool>,
}

impl Storage for Store {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.mem.initial_state()
    }
    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.mem.entries(low, high, max_size, context)
    }
    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.mem.term(idx)
    }
    fn first_index(&self) -> raft::Result<u64> {
        self.mem.first_index()
    }
    fn last_index(&self) -> raft::Result<u64> {
        self.mem.last_index()
    }
    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let cs = self.snap.get_metadata().get_conf_state();
        let names = [
            &cs.voters,
            &cs.learners,
            &cs.voters_outgoing,
            &cs.learners_next,
        ]
        .iter()
        .any(|l| l.contains(&to));
        if self.snap.get_metadata().index < request_index.max(1) || !names {
            // raft-rs asks again at the next heartbeat round.
            self.wanted.set(true);
            return Err(raft::Error::Store(
                raft::StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(self.snap.clone())
    }
}

use super::check::{Reason, Refusal};
use super::store;

/// The context raft-rs gives a hand-over's campaign (raft-rs does not
/// export its constant).
const CAMPAIGN_TRANSFER: &[u8] = b"CampaignTransfer";

/// Ticks of slack the leader lease leaves for tick skew between nodes.
pub const LEASE_MARGIN_TICKS: u64 = 2;

/// How a replica is set up.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// This node's id (1..).
    pub id: u64,
    /// The voters of a new group (a log without a snapshot): every voter's
    /// id, this node's included; empty for a node that joins a running
    /// group (it learns the configuration from the leader). A node that
    /// joined (not among them) and has no snapshot yet starts from them
    /// too: its log replays every change since, the one adding it
    /// included. A recovered snapshot's configuration replaces it.
    pub voters: Vec<u64>,
    /// Election timeout in ticks (randomized in `[e, 2e)`).
    pub election_ticks: usize,
    /// Heartbeat interval in ticks.
    pub heartbeat_ticks: usize,
    /// Seed of the election-timeout randomization.
    pub seed: u64,
}

/// What the replica recovered from its log (the log's replay makes it).
pub use super::store::Recovered;

/// One follower as its leader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FollowerStatus {
    pub node: u64,
    /// The highest index known to be in its log.
    pub matched: u64,
    /// Heard from within the last election timeout.
    pub active: bool,
    /// A voter (else a learner: it replicates but neither votes nor
    /// counts for the quorum).
    pub voter: bool,
}

/// A replica's state (see [`Replica::status`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaStatus {
    pub node: u64,
    pub role: &'static str,
    pub term: u64,
    /// 0: no leader known.
    pub leader: u64,
    pub commit: u64,
    pub applied: u64,
    pub last_index: u64,
    pub serving: bool,
    pub lease_valid: bool,
    /// The leader's view of its followers (empty elsewhere).
    pub followers: Vec<FollowerStatus>,
    /// The configuration as this node applied it.
    pub conf: ConfState,
}

/// A role change the shard must act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoleChange {
    /// This node became leader of `term` (it serves once it applied an
    /// entry of that term and holds the lease).
    Leader { term: u64 },
    /// This node was leader and no longer is.
    SteppedDown { term: u64 },
}

/// The work one [`Replica::ready`] produced.
#[derive(Debug, Default)]
pub struct Output {
    /// Messages to send now, `(to node, encoded message)`.
    pub send: Vec<(u64, Vec<u8>)>,
    /// Records to append to the log and fdatasync; report `number` to
    /// [`Replica::persisted`] when they are durable.
    pub persist: Option<(u64, Vec<u8>)>,
    /// A snapshot from the leader to install before `apply`: the table
    /// becomes its data ([`Replica::snapshot_installed`] once it is).
    pub install: Option<Snapshot>,
    /// Committed entries, in order, to apply to the table.
    pub apply: Vec<Entry>,
    /// Read barriers answered: `(id, index)` — a read issued with
    /// [`Replica::read_barrier`] may be served once `index` is applied.
    pub reads: Vec<(u64, u64)>,
    pub role: Option<RoleChange>,
}

/// The protobuf field number that carries a node's [`FEATURES`] in every
/// raft message it sends. raft-rs's `Message` does not define it, so a
/// node of an earlier version parses the message as before and ignores it
/// (protobuf keeps unknown fields aside); this version reads it.
pub const FEATURES_FIELD: u32 = 9001;
/// Feature bit: this node reads session records (SessionOpen, SessionEnd,
/// SessionHold: replicated sessions).
pub const FEATURE_SESSIONS: u64 = 1;
/// What this version announces.
pub const FEATURES: u64 = FEATURE_SESSIONS;

/// A raft message as sent on a peer link: its protobuf encoding followed
/// by the [`FEATURES_FIELD`] varint (a protobuf message may end with any
/// field; a parser merges it in).
pub fn encode_message(m: &Message) -> Vec<u8> {
    let mut b = m.write_to_bytes().expect("encode");
    put_varint((FEATURES_FIELD as u64) << 3, &mut b);
    put_varint(FEATURES, &mut b);
    b
}

/// The protobuf field number of the configuration notices a node adds
/// to the raft messages it sends a peer of one group: "my replica of
/// group `g` applied a configuration that excludes you (no voter, no
/// outgoing voter, no learner), made by the entry at committed index
/// `i`", for each other group `g` of which that is so. Length-delimited,
/// a sequence of varint pairs `(g, i)`. A node removed from group `g`
/// whose removal it never applied (the leader sends a removed node
/// nothing, not even the commit index that would let it apply its
/// removal) learns it so from the groups where it is still a member
/// ([`Replica::told_excluded`]). raft-rs's `Message` does not define the
/// field, so a node of an earlier version ignores it, as [`FEATURES_FIELD`].
pub const EXCLUDED_FIELD: u32 = 9002;

fn put_varint(mut v: u64, b: &mut Vec<u8>) {
    loop {
        if v < 0x80 {
            b.push(v as u8);
            break;
        }
        b.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
}

fn get_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(v);
        }
    }
    None
}

/// The [`EXCLUDED_FIELD`] listing `notes` (`(group, index)` pairs), as
/// bytes to append to an encoded message (a protobuf message may end with
/// any field; a parser merges it in). Nothing for an empty list.
pub fn encode_excluded(notes: &[(u32, u64)], out: &mut Vec<u8>) {
    if notes.is_empty() {
        return;
    }
    let mut payload = Vec::with_capacity(notes.len() * 6);
    for &(g, i) in notes {
        put_varint(u64::from(g), &mut payload);
        put_varint(i, &mut payload);
    }
    put_varint(((EXCLUDED_FIELD as u64) << 3) | 2, out);
    put_varint(payload.len() as u64, out);
    out.extend_from_slice(&payload);
}

/// The `(group, index)` pairs of a message's [`EXCLUDED_FIELD`] (none
/// when absent; a malformed pair and what follows it are ignored).
pub fn decode_excluded(m: &Message) -> Vec<(u32, u64)> {
    let mut notes = Vec::new();
    let Some(values) = m.get_unknown_fields().get(EXCLUDED_FIELD) else {
        return notes;
    };
    for p in &values.length_delimited {
        let mut at = 0;
        while at < p.len() {
            let (Some(g), Some(i)) = (get_varint(p, &mut at), get_varint(p, &mut at)) else {
                break;
            };
            if let Ok(g) = u32::try_from(g) {
                notes.push((g, i));
            }
        }
    }
    notes
}

pub struct Replica {
    node: RawNode<Store>,
    cfg: ReplicaConfig,
    rng: u64,
    /// raft-rs's (role, term) when this replica last drew an election
    /// timeout: raft-rs draws a new one from its thread RNG at every role
    /// or term change (`reset`), which is replaced at once by one of
    /// `rng` ([`Replica::after_raft`]).
    drawn_at: (StateRole, u64),
    /// The term and vote of the last hard state written to the log.
    written_vote: (u64, u64),
    /// A hard state whose only change is its commit index, not written
    /// yet: it goes with the next write of the log (see [`Replica::ready`]).
    commit_unwritten: Option<raft::eraftpb::HardState>,
    /// Ticks since start.
    ticks: u64,
    /// Votes are refused until this tick (a restarted node).
    mute_votes_until: u64,
    /// A node joining a running group (`--join`, new log) that no change
    /// or snapshot has made a member yet: it neither campaigns nor votes.
    joining: bool,
    /// The tick each peer was last heard from (any message): liveness
    /// that, unlike raft-rs's `recent_active`, is not cleared every
    /// election timeout.
    heard: crate::core::idmap::IdMap<u64, u64>,
    /// What each peer's newest message announced it can read
    /// ([`FEATURES`]; 0 for a node of an earlier version).
    features: crate::core::idmap::IdMap<u64, u64>,
    /// The lease: the tick of the newest heartbeat round a quorum
    /// acknowledged (valid for the current term only).
    lease_from: Option<u64>,
    lease_term: u64,
    /// Ticks since the last lease probe.
    since_probe: usize,
    /// Messages held until the ready `number` is durable.
    held: VecDeque<(u64, Vec<Message>)>,
    persisted_number: u64,
    /// The newest ready with records to sync, and the newest ready.
    inflight_max: u64,
    last_number: u64,
    applied: u64,
    /// The index of this leader's first entry of its term (its no-op);
    /// serving starts once it is applied.
    term_start: u64,
    role: StateRole,
    term: u64,
    leader: u64,
    installs: u64,
    /// A leader's snapshot in ready `.0`, up to index `.1`, not yet durable.
    snapshot_ready: Option<(u64, u64)>,
    /// Snapshots this leader sent: follower → the tick it was sent at
    /// (see [`SNAPSHOT_RETRY_TIMEOUTS`]).
    snapshots_sent: crate::core::idmap::IdMap<u64, u64>,
    /// The newest index as of which a peer said this group's committed
    /// configuration excludes this node ([`Replica::told_excluded`]).
    excluded_as_of: u64,
}

/// raft-rs sends a follower nothing more after a snapshot until that
/// follower acknowledges it (it relies on the application to report a
/// snapshot it could not deliver): a snapshot lost on the way (a link that
/// broke, a follower that crashed before the snapshot was durable) would
/// stop the follower's replication until another leader is elected. A
/// snapshot not acknowledged within this many election timeouts is
/// reported failed, and raft-rs probes the follower again (sending a new
/// snapshot if it still needs one).
pub const SNAPSHOT_RETRY_TIMEOUTS: u64 = 4;

fn single_change(node_id: u64, t: ConfChangeType) -> ConfChangeSingle {
    let mut c = ConfChangeSingle {
        node_id,
        ..Default::default()
    };
    c.set_change_type(t);
    c
}

fn conf_change(changes: Vec<ConfChangeSingle>) -> ConfChangeV2 {
    ConfChangeV2 {
        changes: changes.into(),
        ..Default::default()
    }
}

fn next_rand(state: &mut u64) -> u64 {
    // splitmix64: small, seeded, good enough to spread election timeouts.
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Replica {
    /// A replica over what its log held (`Recovered::default()` for a new
    /// node). `restarted`: the log was not empty, so votes are refused for
    /// an election timeout.
    pub fn new(cfg: ReplicaConfig, rec: Recovered) -> Result<Replica, String> {
        if cfg.election_ticks <= cfg.heartbeat_ticks || cfg.heartbeat_ticks == 0 {
            return Err(format!(
                "the election timeout ({} ticks) must exceed the heartbeat ({} ticks)",
                cfg.election_ticks, cfg.heartbeat_ticks
            ));
        }
        let snap_index = rec.snapshot.get_metadata().index;
        let restarted = rec.hard_state.term > 0
            || !rec.entries.is_empty()
            || rec.snapshot.get_metadata().index > 0;
        // Not among the founders and no snapshot: a node that joined by a
        // change (`--join`), restarted before any snapshot named it. Its
        // log replays from the founders' configuration (as
        // `adopt_founders` set it), the change adding it included; with
        // nothing from a leader yet it is still joining.
        let joined = snap_index == 0 && !cfg.voters.contains(&cfg.id);
        // The configuration as of the snapshot (committed entries after it
        // are applied again, their configuration changes included).
        let cs = if snap_index > 0 {
            rec.snapshot.get_metadata().get_conf_state().clone()
        } else {
            ConfState::from((cfg.voters.clone(), vec![]))
        };
        let storage = MemStorage::new_with_conf_state(cs.clone());
        {
            let mut w = storage.wl();
            if snap_index > 0 {
                w.apply_snapshot(rec.snapshot.clone())
                    .map_err(|e| format!("log snapshot: {e}"))?;
            }
            w.append(&rec.entries)
                .map_err(|e| format!("log entries: {e}"))?;
            let mut hs = rec.hard_state.clone();
            let last = rec.entries.last().map_or(snap_index, |e| e.index);
            // A commit index past the recovered entries cannot be true, and
            // one below the snapshot is implied by it.
            hs.commit = hs.commit.min(last).max(snap_index);
            w.set_hardstate(hs);
        }
        let storage = Store {
            mem: storage,
            snap: rec.snapshot.clone(),
            wanted: std::cell::Cell::new(false),
        };
        let rc = raft::Config {
            id: cfg.id,
            election_tick: cfg.election_ticks,
            heartbeat_tick: cfg.heartbeat_ticks,
            check_quorum: true,
            pre_vote: true,
            applied: snap_index,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            ..Default::default()
        };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let node = RawNode::new(&rc, storage, &logger).map_err(|e| format!("raft: {e}"))?;
        let election = cfg.election_ticks as u64;
        let joining = !restarted && joined;
        let mut r = Replica {
            node,
            rng: cfg.seed ^ (cfg.id << 32) ^ 0x5EED,
            drawn_at: (StateRole::Follower, rec.hard_state.term),
            written_vote: (rec.hard_state.term, rec.hard_state.vote),
            commit_unwritten: None,
            cfg,
            ticks: 0,
            mute_votes_until: if restarted { election } else { 0 },
            joining,
            heard: crate::core::idmap::id_map(),
            features: crate::core::idmap::id_map(),
            lease_from: None,
            lease_term: 0,
            since_probe: 0,
            held: VecDeque::new(),
            persisted_number: 0,
            inflight_max: 0,
            last_number: 0,
            applied: snap_index,
            term_start: u64::MAX,
            role: StateRole::Follower,
            term: rec.hard_state.term,
            leader: 0,
            installs: 0,
            snapshot_ready: None,
            snapshots_sent: crate::core::idmap::id_map(),
            excluded_as_of: 0,
        };
        r.randomize_timeout();
        Ok(r)
    }

    fn randomize_timeout(&mut self) {
        let e = self.cfg.election_ticks;
        let t = e + (next_rand(&mut self.rng) % e as u64) as usize;
        self.node.raft.set_randomized_election_timeout(t);
    }

    /// After every call into raft-rs that can change its role or term
    /// (a tick, a message, a transfer, a step-down): a change means raft-rs
    /// drew a randomized election timeout from its thread RNG, which no
    /// seed reaches; it is replaced before any tick can use it, so a run
    /// of the simulator is a function of its seed alone.
    fn after_raft(&mut self) {
        let now = (self.node.raft.state, self.node.raft.term);
        if now != self.drawn_at {
            self.drawn_at = now;
            self.randomize_timeout();
        }
    }

    pub fn id(&self) -> u64 {
        self.cfg.id
    }
    pub fn term(&self) -> u64 {
        self.node.raft.term
    }
    pub fn is_leader(&self) -> bool {
        self.node.raft.state == StateRole::Leader
    }
    /// The leader this node knows of (0: none).
    pub fn leader(&self) -> u64 {
        self.node.raft.leader_id
    }
    pub fn role_name(&self) -> &'static str {
        match self.node.raft.state {
            StateRole::Leader => "leader",
            StateRole::Candidate => "candidate",
            StateRole::PreCandidate => "pre-candidate",
            StateRole::Follower => "follower",
        }
    }
    pub fn commit_index(&self) -> u64 {
        self.node.raft.raft_log.committed
    }
    pub fn applied_index(&self) -> u64 {
        self.applied
    }
    pub fn last_index(&self) -> u64 {
        self.node.raft.raft_log.last_index()
    }
    pub fn ticks(&self) -> u64 {
        self.ticks
    }
    /// What this replica knows, for `ringlock cluster status` and metrics.
    pub fn status(&self) -> ReplicaStatus {
        let r = &self.node.raft;
        let mut followers = Vec::new();
        if self.is_leader() {
            for (&id, p) in r.prs().iter() {
                if id != self.cfg.id {
                    followers.push(FollowerStatus {
                        node: id,
                        voter: r.prs().conf().voters().contains(id),
                        matched: p.matched,
                        active: self
                            .heard
                            .get(&id)
                            .is_some_and(|&t| self.ticks <= t + self.cfg.election_ticks as u64),
                    });
                }
            }
            followers.sort_by_key(|f| f.node);
        }
        ReplicaStatus {
            node: self.cfg.id,
            role: self.role_name(),
            term: r.term,
            leader: r.leader_id,
            commit: r.raft_log.committed,
            applied: self.applied,
            last_index: r.raft_log.last_index(),
            serving: self.serving(),
            lease_valid: self.lease_valid(),
            followers,
            conf: self.conf_state(),
        }
    }

    /// The term of the entry at `index` in this node's log (checks).
    pub fn term_at(&self, index: u64) -> Option<u64> {
        self.node.raft.raft_log.term(index).ok()
    }
    /// The configuration this node applied (voters, learners, and the
    /// outgoing voters while a joint change is in progress).
    pub fn conf_state(&self) -> ConfState {
        self.node.raft.prs().conf().to_conf_state()
    }

    /// Every member of a configuration: voters, learners, and during a
    /// joint change the outgoing voters and the learners to be (a node may
    /// appear twice).
    pub fn members_of(cs: &ConfState) -> impl Iterator<Item = u64> + '_ {
        cs.voters
            .iter()
            .chain(&cs.learners)
            .chain(&cs.voters_outgoing)
            .chain(&cs.learners_next)
            .copied()
    }

    /// This node is a voter or a learner of its group.
    pub fn is_member(&self) -> bool {
        let c = self.conf_state();
        c.voters.contains(&self.cfg.id) || c.learners.contains(&self.cfg.id)
    }

    /// A configuration change is proposed and not yet applied, or the
    /// group is in a joint configuration (a change half done).
    pub fn change_in_progress(&self) -> bool {
        self.node.raft.has_pending_conf() || !self.conf_state().voters_outgoing.is_empty()
    }

    /// Proposes a configuration change: `add` become learners (`voter`
    /// false) or voters (a learner promoted, or a new voter), `remove`
    /// leave. More than one voter changing at once goes through a joint
    /// configuration that raft-rs leaves on its own once it is applied.
    /// `context` travels with the change (the added nodes' addresses).
    /// The entry's index, or why not: this node does not lead, or another
    /// change is in progress.
    pub fn propose_change(
        &mut self,
        add: &[u64],
        voter: bool,
        remove: &[u64],
        context: Vec<u8>,
    ) -> Result<u64, String> {
        if !self.is_leader() {
            return Err("this node does not lead the group".into());
        }
        if self.change_in_progress() {
            return Err("another membership change is in progress".into());
        }
        let kind = if voter {
            ConfChangeType::AddNode
        } else {
            ConfChangeType::AddLearnerNode
        };
        let changes = add
            .iter()
            .map(|&n| single_change(n, kind))
            .chain(
                remove
                    .iter()
                    .map(|&n| single_change(n, ConfChangeType::RemoveNode)),
            )
            .collect();
        let mut cc = conf_change(changes);
        cc.set_transition(ConfChangeTransition::Auto);
        cc.context = context.into();
        let before = self.node.raft.raft_log.last_index();
        self.node
            .propose_conf_change(vec![], cc)
            .map_err(|e| format!("raft-rs refused the change: {e}"))?;
        let after = self.node.raft.raft_log.last_index();
        // raft-rs turns a change it will not take into an empty entry.
        let landed = self.node.raft.raft_log.term(after).is_ok()
            && after == before + 1
            && self.node.raft.pending_conf_index == after;
        if !landed {
            return Err("raft-rs did not take the change (another one is in progress)".into());
        }
        Ok(after)
    }

    /// A committed configuration change entry (call before
    /// [`Replica::applied_to`] for its index): the configuration it makes,
    /// and the change itself (its context names added nodes' addresses).
    pub fn apply_change(&mut self, e: &Entry) -> Result<(ConfState, ConfChangeV2), String> {
        if e.get_entry_type() != EntryType::EntryConfChangeV2 {
            // ringlockd proposes only version-2 changes.
            return Err(format!(
                "entry {}: a version-1 configuration change",
                e.index
            ));
        }
        let cc = ConfChangeV2::parse_from_bytes(&e.data)
            .map_err(|err| format!("entry {}: bad configuration change: {err}", e.index))?;
        let cs = self
            .node
            .apply_conf_change(&cc)
            .map_err(|err| format!("entry {}: configuration change refused: {err}", e.index))?;
        self.node.mut_store().mem.wl().set_conf_state(cs.clone());
        if self.joining
            && cc.changes.iter().any(|c| {
                c.node_id == self.cfg.id && c.get_change_type() != ConfChangeType::RemoveNode
            })
        {
            self.joining = false;
        }
        Ok((cs, cc))
    }
    /// Asks raft-rs to hand leadership to `to` (it must be caught up).
    pub fn transfer_leader(&mut self, to: u64) {
        if self.is_leader() {
            self.node.transfer_leader(to);
            self.after_raft();
        }
    }

    /// True while this node may decide and answer: leader, its own term's
    /// first entry applied, inside its lease, and a voter of the
    /// configuration it applied, not told by a peer that a newer one
    /// excludes it ([`Replica::excluded`]).
    pub fn serving(&self) -> bool {
        self.is_leader()
            && self.applied >= self.term_start
            && self.lease_valid()
            // Handing over: the transferee may be elected any moment.
            && self.node.raft.lead_transferee.is_none()
            && self.is_voter()
            && !self.excluded()
    }

    /// This node votes in the configuration it applied (in either half
    /// of a joint one). A leader that applied its own removal is not one:
    /// it no longer serves, and steps down ([`Replica::step_down_removed`]).
    pub fn is_voter(&self) -> bool {
        self.node.raft.prs().conf().voters().contains(self.cfg.id)
    }

    /// A leader that applied its own removal hands leadership over to `to`
    /// (raft-rs tells it to stand at once when it is caught up) and steps
    /// down in its term, as `check_quorum` steps a leader down. raft-rs
    /// would keep it leading, and panics when such a leader commits.
    pub fn step_down_removed(&mut self, to: Option<u64>) {
        if !self.is_leader() || self.is_voter() {
            return;
        }
        if let Some(t) = to {
            self.node.transfer_leader(t);
        }
        let term = self.node.raft.term;
        self.node.raft.become_follower(term, raft::INVALID_ID);
        self.after_raft();
    }

    /// The leader lease holds (see the module docs).
    pub fn lease_valid(&self) -> bool {
        match self.lease_from {
            Some(from) if self.lease_term == self.node.raft.term => {
                self.ticks + LEASE_MARGIN_TICKS < from + self.cfg.election_ticks as u64
            }
            _ => false,
        }
    }

    /// Election timeout in ticks.
    pub fn election_ticks(&self) -> u64 {
        self.cfg.election_ticks as u64
    }

    /// A joining node learned its cluster's founding voters (from a link
    /// Hello): while its log is empty, they are its configuration, as they
    /// were every founder's before entry 1, so that the entries it is sent
    /// from the start replay every change since. A snapshot replaces it.
    pub fn adopt_founders(&mut self, voters: &[u64]) {
        if !self.joining || self.last_index() > 0 || !self.conf_state().voters.is_empty() {
            return;
        }
        for &v in voters {
            let cc = conf_change(vec![single_change(v, ConfChangeType::AddNode)]);
            if let Ok(cs) = self.node.apply_conf_change(&cc) {
                self.node.mut_store().mem.wl().set_conf_state(cs);
            }
        }
    }

    /// The link to `node` failed (it closed or reset: the node exited or
    /// restarts): it no longer counts as heard from (a hand-over picks a
    /// live node) until its next message.
    pub fn forget_heard(&mut self, node: u64) {
        self.heard.remove(&node);
    }

    /// Still joining (see [`Replica::adopt_founders`]).
    pub fn is_joining(&self) -> bool {
        self.joining
    }

    /// One tick of the logical clock.
    pub fn tick(&mut self) {
        self.ticks += 1;
        if self.joining {
            // Not a member yet: never stands for election.
            return;
        }
        self.node.tick();
        self.after_raft();
        if self.is_leader() {
            self.retry_snapshots();
            self.since_probe += 1;
            if self.since_probe >= self.cfg.heartbeat_ticks {
                self.since_probe = 0;
                self.probe();
            }
        }
    }

    /// `n` ticks of the logical clock passed since the last call: more
    /// than one when the loop comes back late (stalled, or starved of CPU).
    /// The replica's own clock counts them all (a lease runs out in real
    /// time, vote muting too), and so does a leader's raft-rs. raft-rs's
    /// timers of a replica that does not lead take at most a third of an
    /// election timeout of them ([`Replica::catch_up_ticks`]): its
    /// election timer measures a time in which it could have heard from a
    /// leader, and a stalled loop heard nothing (what came meanwhile waits
    /// unread). Taking a whole stall would also undo the randomized
    /// timeouts: when the nodes of a cluster stall together (their CPU
    /// starved by other work), every timer runs out inside the same burst
    /// of ticks, every node stands at once, and the vote splits (a fresh
    /// cluster whose nodes shared a starved CPU took up to 2.4 s for its
    /// first leader instead of 0.5 s). A late loop's usual lateness (up to
    /// the cap) still counts in full. Counting slower than real time is
    /// safe: a follower refuses votes for longer, never shorter, after it
    /// heard from a leader.
    pub fn ticks_passed(&mut self, n: u64) {
        let cap = self.catch_up_ticks();
        for i in 0..n {
            if i < cap || self.is_leader() {
                self.tick();
            } else {
                self.ticks += 1;
            }
        }
    }

    /// The most ticks of one late turn a replica that does not lead gives
    /// raft-rs ([`Replica::ticks_passed`]): a third of an election timeout
    /// (at least one).
    pub fn catch_up_ticks(&self) -> u64 {
        (self.cfg.election_ticks as u64 / 3).max(1)
    }

    /// Reports the snapshots sent [`SNAPSHOT_RETRY_TIMEOUTS`] election
    /// timeouts ago as failed (raft-rs ignores it for a follower that
    /// acknowledged its snapshot meanwhile).
    fn retry_snapshots(&mut self) {
        let wait = SNAPSHOT_RETRY_TIMEOUTS * self.cfg.election_ticks as u64;
        let ticks = self.ticks;
        let due: Vec<u64> = self
            .snapshots_sent
            .iter()
            .filter(|(_, &sent)| ticks >= sent + wait)
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            self.snapshots_sent.remove(&id);
            self.node.report_snapshot(id, SnapshotStatus::Failure);
        }
    }

    /// A lease probe: a ReadIndex whose context is the tick it was sent.
    fn probe(&mut self) {
        if self
            .node
            .raft
            .raft_log
            .term(self.node.raft.raft_log.committed)
            .ok()
            != Some(self.node.raft.term)
        {
            // raft-rs drops a ReadIndex until the leader committed an
            // entry of its term; the no-op's commit renews nothing either.
            return;
        }
        self.node.read_index(self.ticks.to_le_bytes().to_vec());
    }

    /// A linearizable read on a follower (Raft's ReadIndex): the leader
    /// confirms it still leads and names its commit index, which comes back
    /// in [`Output::reads`] with `id`. raft-rs drops it when no leader is
    /// known; the caller bounds the wait.
    pub fn read_barrier(&mut self, id: u64) {
        let mut ctx = vec![b'R'];
        ctx.extend_from_slice(&id.to_le_bytes());
        self.node.read_index(ctx);
    }

    /// Whether session records may be written: every other member of this
    /// group (voters, learners, both halves of a joint configuration) that
    /// this node has heard from since it started announced in its newest
    /// message that it reads them, and those that did, with this node,
    /// are a majority of the voters. A node of an earlier version stops on
    /// a record it does not know; one not heard from (down since this node
    /// started) is assumed to run what it ran before, which the other
    /// nodes' announcements stand for (docs/cluster.md: never bring back an
    /// older version into a cluster whose sessions are replicated).
    pub fn peers_read_sessions(&self) -> bool {
        let cs = self.node.raft.prs().conf().to_conf_state();
        let me = self.cfg.id;
        let reads = |n: &u64| {
            *n == me
                || self
                    .features
                    .get(n)
                    .is_some_and(|f| f & FEATURE_SESSIONS != 0)
        };
        let known_all_read = Self::members_of(&cs)
            .filter(|n| self.features.contains_key(n))
            .all(|n| reads(&n));
        let majority = |voters: &[u64]| {
            voters.is_empty() || voters.iter().filter(|n| reads(n)).count() * 2 > voters.len()
        };
        known_all_read && majority(&cs.voters) && majority(&cs.voters_outgoing)
    }

    /// A message from a peer (already decoded from its frame), that
    /// arrived on the link of node `link`; the configuration notices it
    /// carried (see [`EXCLUDED_FIELD`]), for the shard to pass on to the
    /// groups they name. A message that does not parse, or that
    /// [`super::check::check`] refuses, changes nothing (raft-rs never
    /// sees it): the refusal says why.
    pub fn step(&mut self, link: u64, bytes: &[u8]) -> Result<Vec<(u32, u64)>, Refusal> {
        let m = Message::parse_from_bytes(bytes)
            .map_err(|e| Refusal::new(Reason::Malformed, format!("not a raft message: {e}")))?;
        let notes = decode_excluded(&m);
        self.check_noted(&m, link, &notes)?;
        // A leader's hand-over (its transferee campaigns with this context)
        // is voted for even now: that leader stopped serving when it began
        // the transfer, so no lease of it is left to protect.
        let transfer = m.get_context() == CAMPAIGN_TRANSFER;
        self.heard.insert(m.from, self.ticks);
        let features = m
            .get_unknown_fields()
            .get(FEATURES_FIELD)
            .and_then(|v| v.varint.last().copied())
            .unwrap_or(0);
        self.features.insert(m.from, features);
        if self.joining
            && matches!(
                m.get_msg_type(),
                MessageType::MsgRequestVote | MessageType::MsgRequestPreVote
            )
        {
            return Ok(notes);
        }
        if self.ticks < self.mute_votes_until
            && !transfer
            && matches!(
                m.get_msg_type(),
                MessageType::MsgRequestVote | MessageType::MsgRequestPreVote
            )
        {
            return Ok(notes);
        }
        // A message of an unknown peer, or one for a stale term, is the
        // protocol's business: raft-rs ignores what it must.
        let _ = self.node.step(m);
        self.after_raft();
        Ok(notes)
    }

    /// [`super::check::check`] against this replica's state now.
    pub fn check(&self, m: &Message, link: u64) -> Result<(), Refusal> {
        self.check_noted(m, link, &decode_excluded(m))
    }

    /// [`Replica::check`] with the message's notices decoded already.
    fn check_noted(&self, m: &Message, link: u64, notes: &[(u32, u64)]) -> Result<(), Refusal> {
        let r = &self.node.raft;
        let log = &r.raft_log;
        // raft-rs answers 0 for an index outside the log (compacted, or
        // past its end): not known. Every entry has a term of 1 or more.
        let term_at = |i: u64| log.term(i).ok().filter(|&t| t != 0);
        super::check::check(
            m,
            link,
            notes,
            &super::check::Local {
                id: self.cfg.id,
                term: r.term,
                last_index: log.last_index(),
                committed: log.committed,
                persisted: log.persisted,
                leader: r.state == StateRole::Leader,
                candidate: r.state == StateRole::Candidate,
                term_at: &term_at,
            },
        )
    }

    /// A peer's replica of this group applied a configuration that
    /// excludes this node, made by the entry at `index` (committed: a
    /// replica applies nothing else). See [`Replica::excluded`].
    pub fn told_excluded(&mut self, index: u64) {
        self.excluded_as_of = self.excluded_as_of.max(index);
    }

    /// True while this node has not applied a configuration that a peer
    /// said excludes it ([`Replica::told_excluded`]): the group's
    /// committed history removes it at or before that index, so whatever
    /// configuration it applied so far, it is no voter of the group any
    /// more (when this node applied a configuration that includes it
    /// below that index, some entry after it removed it). Once it applied
    /// that far, its own configuration says which it is: a stale notice
    /// (this node was added back since, under the same id) says nothing
    /// about what came after it. A joining node (nothing applied from a
    /// leader yet) is no voter anyway and takes no notice.
    pub fn excluded(&self) -> bool {
        !self.joining && self.applied < self.excluded_as_of
    }

    /// Proposes `data` (a batch of lock records) as the next entry; the
    /// index it will have, or `None` when this node is not leader (or
    /// raft-rs refused it: the caller fails the batch).
    pub fn propose(&mut self, data: Vec<u8>) -> Option<u64> {
        if !self.is_leader() {
            return None;
        }
        let before = self.node.raft.raft_log.last_index();
        self.node.propose(vec![], data).ok()?;
        let after = self.node.raft.raft_log.last_index();
        (after == before + 1).then_some(after)
    }

    /// The records of ready `number` (and every earlier one) are durable.
    pub fn persisted(&mut self, number: u64, out: &mut Output) {
        // Readies after the newest one with records had nothing of their
        // own to sync: they are durable with it.
        let upto = if number >= self.inflight_max {
            self.last_number
        } else {
            number
        };
        self.mark_persisted(upto, out);
    }

    fn mark_persisted(&mut self, upto: u64, out: &mut Output) {
        if upto <= self.persisted_number {
            return;
        }
        self.persisted_number = upto;
        self.node.on_persist_ready(upto);
        if let Some((number, index)) = self.snapshot_ready {
            if number <= upto {
                self.snapshot_ready = None;
                if index > self.node.raft.raft_log.applied {
                    self.node.advance_apply_to(index);
                }
            }
        }
        while let Some((n, _)) = self.held.front() {
            if *n > upto {
                break;
            }
            let (_, msgs) = self.held.pop_front().expect("front");
            for m in msgs {
                out.send.push((m.to, encode_message(&m)));
            }
        }
    }

    /// The snapshot of [`Output::install`] is the table now.
    pub fn snapshot_installed(&mut self, index: u64) {
        self.applied = self.applied.max(index);
        self.installs += 1;
    }

    /// The index raft-rs counts as applied (behind [`Replica::applied_index`]
    /// while an installed snapshot is not yet durable): the most a
    /// compaction may cover.
    pub fn raft_applied(&self) -> u64 {
        self.node.raft.raft_log.applied
    }

    /// A follower was refused a snapshot because the newest one is too
    /// old for it (true once per refusal): compact now.
    pub fn take_snapshot_wanted(&mut self) -> bool {
        self.node.store().wanted.replace(false)
    }

    /// Snapshots received from a leader and installed since start.
    pub fn snapshots_installed(&self) -> u64 {
        self.installs
    }

    /// The newest snapshot's index (0: none).
    pub fn snapshot_index(&self) -> u64 {
        self.node.store().snap.get_metadata().index
    }

    /// A snapshot of the table as of applied entry `index` (its `data`),
    /// with its metadata; kept for lagging followers once [`Replica::compacted`].
    pub fn make_snapshot(&self, index: u64, data: Vec<u8>) -> Snapshot {
        let mut snap = Snapshot {
            data: data.into(),
            ..Default::default()
        };
        let m = snap.mut_metadata();
        m.index = index;
        m.term = self.node.raft.raft_log.term(index).unwrap_or(0);
        m.set_conf_state(self.conf_state());
        snap
    }

    /// The log file now starts at `snap`: entries up to its index leave
    /// memory, and lagging followers are sent `snap` instead — unless a
    /// leader's newer snapshot was installed while the rewrite was in
    /// flight: that one stays the newest (the file holds it after the
    /// rewritten image), and memory already starts after it.
    pub fn compacted(&mut self, snap: Snapshot) {
        let index = snap.get_metadata().index;
        let store = self.node.mut_store();
        if index < store.snap.get_metadata().index {
            return;
        }
        store.snap = snap;
        // Entries past the applied index stay; compaction never reaches them.
        let _ = store.mem.wl().compact(index);
    }

    /// The hard state and the entries after `index`, as records (the rest
    /// of a compacted log after its snapshot).
    pub fn tail_records(&self, index: u64, out: &mut Vec<u8>) {
        let w = self.node.store().mem.rl();
        store::encode_hard_state(w.hard_state(), out);
        drop(w);
        let last = self.node.store().mem.last_index().unwrap_or(index);
        if last > index {
            let entries = self
                .node
                .store()
                .mem
                .entries(index + 1, last + 1, None, GetEntriesContext::empty(false))
                .expect("the entries after the applied index are in memory");
            for e in &entries {
                store::encode_entry(e, out);
            }
        }
    }

    /// The entries up to `index` were applied to the table.
    pub fn applied_to(&mut self, index: u64) {
        if index > self.applied {
            self.applied = index;
        }
        if self.snapshot_ready.is_none() && index > self.node.raft.raft_log.applied {
            self.node.advance_apply_to(index);
        }
    }

    /// Collects the work raft-rs has now into `out`.
    pub fn ready(&mut self, out: &mut Output) {
        if !self.node.has_ready() {
            self.note_role(out);
            return;
        }
        let mut rd = self.node.ready();
        for m in rd.take_messages() {
            if m.get_msg_type() == MessageType::MsgSnapshot {
                self.snapshots_sent.insert(m.to, self.ticks);
            }
            out.send.push((m.to, encode_message(&m)));
        }
        for rs in rd.take_read_states() {
            if rs.request_ctx.len() == 9 && rs.request_ctx[0] == b'R' {
                let id = u64::from_le_bytes(rs.request_ctx[1..9].try_into().expect("8"));
                out.reads.push((id, rs.index));
                continue;
            }
            // A quorum acknowledged the probe sent at that tick.
            if rs.request_ctx.len() == 8 && self.is_leader() {
                let sent = u64::from_le_bytes(rs.request_ctx[..8].try_into().expect("8"));
                if self.lease_term != self.node.raft.term {
                    self.lease_term = self.node.raft.term;
                    self.lease_from = None;
                }
                self.lease_from = Some(self.lease_from.map_or(sent, |f| f.max(sent)));
            }
        }
        let mut records = Vec::new();
        if rd.snapshot().get_metadata().index > 0 {
            // A leader's snapshot: everything this node had is replaced.
            let snap = rd.snapshot().clone();
            self.node
                .mut_store()
                .mem
                .wl()
                .apply_snapshot(snap.clone())
                .expect("raft-rs hands over only a newer snapshot");
            store::encode_snapshot(&snap, &mut records);
            self.node.mut_store().snap = snap.clone();
            // raft-rs may count it applied only once it is durable.
            self.snapshot_ready = Some((rd.number(), snap.get_metadata().index));
            let named = snap.get_metadata().get_conf_state();
            if named.voters.contains(&self.cfg.id) || named.learners.contains(&self.cfg.id) {
                self.joining = false;
            }
            out.install = Some(snap);
        }
        out.apply.extend(rd.take_committed_entries());
        {
            let entries = rd.entries();
            if !entries.is_empty() {
                self.node
                    .mut_store()
                    .mem
                    .wl()
                    .append(entries)
                    .expect("entries follow the log");
                for e in entries {
                    store::encode_entry(e, &mut records);
                }
            }
        }
        if let Some(hs) = rd.hs() {
            self.node.mut_store().mem.wl().set_hardstate(hs.clone());
            self.commit_unwritten = Some(hs.clone());
        }
        // The hard state is written, and waited for, when its term or vote
        // changed (a vote must be durable before it is sent) or when the
        // log is written anyway; a change of the commit index alone is not
        // worth an fdatasync of its own — it would double the syncs of
        // every commit (the entry's, then its commit's) on every node. The
        // commit index is volatile in Raft: one lost in a crash is lower
        // after the restart, which only means that entries are applied
        // again later, once the leader's messages (or its own next
        // commit, for a leader) say they are committed; an answer never
        // depended on it (a quorum's durable entries did).
        if let Some(hs) = self.commit_unwritten.take() {
            if !records.is_empty() || (hs.term, hs.vote) != self.written_vote {
                self.written_vote = (hs.term, hs.vote);
                store::encode_hard_state(&hs, &mut records);
            } else {
                self.commit_unwritten = Some(hs);
            }
        }
        let number = rd.number();
        let msgs = rd.take_persisted_messages();
        if !msgs.is_empty() {
            self.held.push_back((number, msgs));
        }
        let empty = records.is_empty();
        if !empty {
            out.persist = Some((number, records));
            self.inflight_max = number;
        }
        self.node.advance_append_async(rd);
        self.last_number = number;
        if empty && self.inflight_max <= self.persisted_number {
            // Nothing to make durable, nothing earlier in flight: this
            // ready is as persisted as the one before it.
            self.mark_persisted(number, out);
        }
        self.note_role(out);
    }

    fn note_role(&mut self, out: &mut Output) {
        let (role, term) = (self.node.raft.state, self.node.raft.term);
        if role == self.role && term == self.term && self.leader == self.node.raft.leader_id {
            return;
        }
        let was_leader = self.role == StateRole::Leader;
        // (A change of role or term drew its timeout in after_raft.)
        self.after_raft();
        let prev_term = self.term;
        self.role = role;
        self.term = term;
        self.leader = self.node.raft.leader_id;
        if was_leader && (role != StateRole::Leader || term != prev_term) {
            self.lease_from = None;
            self.term_start = u64::MAX;
            out.role = Some(RoleChange::SteppedDown { term: prev_term });
        }
        if role == StateRole::Leader && (!was_leader || term != prev_term) {
            // raft-rs appended the term's empty entry on becoming leader.
            self.term_start = self.node.raft.raft_log.last_index();
            self.lease_from = None;
            self.lease_term = term;
            self.since_probe = 0;
            out.role = Some(RoleChange::Leader { term });
        }
    }

    /// The type of a committed entry the shard must skip (no records).
    pub fn is_empty_entry(e: &Entry) -> bool {
        e.get_entry_type() != EntryType::EntryNormal || e.data.is_empty()
    }

    /// A configuration change entry (see [`Replica::apply_change`]).
    pub fn is_change(e: &Entry) -> bool {
        e.get_entry_type() != EntryType::EntryNormal
    }
}

#[cfg(test)]
mod tests {
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
                n.ready(&mut out);
                if let Some((num, _)) = out.persist.take() {
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

    /// The notices ride on a raft message as a field raft-rs does not
    /// define: the message parses as before (what a node of an earlier
    /// version reads, the features announcement included), and this
    /// version reads the notices back.
    #[test]
    fn excluded_notices_ride_on_a_message_that_parses_as_before() {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgHeartbeatResponse);
        m.to = 1;
        m.from = 2;
        m.term = 5;
        m.commit = 9;
        let plain = encode_message(&m);
        let mut b = plain.clone();
        let notes = [(2, 13), (0, 300_000), (7, u64::MAX)];
        encode_excluded(&notes, &mut b);
        assert!(b.len() > plain.len());
        let mut got = Message::parse_from_bytes(&b).unwrap();
        assert_eq!(decode_excluded(&got), notes);
        let features = got
            .get_unknown_fields()
            .get(FEATURES_FIELD)
            .and_then(|v| v.varint.last().copied());
        assert_eq!(features, Some(FEATURES));
        protobuf::Clear::clear(got.mut_unknown_fields());
        assert_eq!(
            got.write_to_bytes().unwrap(),
            m.write_to_bytes().unwrap(),
            "the message itself is unchanged"
        );
        // Nothing to say: nothing added.
        let mut b = plain.clone();
        encode_excluded(&[], &mut b);
        assert_eq!(b, plain);
        assert!(decode_excluded(&Message::parse_from_bytes(&plain).unwrap()).is_empty());
        // Two fields (the same one twice) are both read; a truncated pair
        // ends the list, a group beyond u32 is skipped.
        let mut b = plain.clone();
        encode_excluded(&[(1, 4)], &mut b);
        put_varint(((EXCLUDED_FIELD as u64) << 3) | 2, &mut b);
        let mut p = Vec::new();
        put_varint(1 << 40, &mut p);
        put_varint(6, &mut p);
        put_varint(3, &mut p);
        put_varint(8, &mut p);
        p.extend_from_slice(&[5, 0x80]);
        put_varint(p.len() as u64, &mut b);
        b.extend_from_slice(&p);
        let got = Message::parse_from_bytes(&b).unwrap();
        assert_eq!(decode_excluded(&got), [(1, 4), (3, 8)]);
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
        nodes[l].ready(&mut out);
        for (to, b) in out.send {
            if to == fid {
                nodes[f].step(lid, &b).unwrap();
            }
        }
        let mut fo = Output::default();
        nodes[f].ready(&mut fo);
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
        let (n, _) = fo.persist.take().unwrap();
        let mut sent = Vec::new();
        let mut out = Output::default();
        nodes[f].persisted(n, &mut out);
        for _ in 0..3 {
            nodes[f].ready(&mut out);
            if let Some((n, _)) = out.persist.take() {
                nodes[f].persisted(n, &mut out);
            }
            sent.append(&mut out.send);
        }
        assert!(sent.iter().any(|(to, b)| *to == oid
            && Message::parse_from_bytes(b).unwrap().get_msg_type()
                == MessageType::MsgRequestVote));
        assert_eq!(nodes[f].step(oid, &encode_message(&vote)), Ok(vec![]));
        assert!(nodes[f].is_leader());
    }
}
