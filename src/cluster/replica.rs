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
//!
//! # Files
//! This file has the replica, its set-up, clock, peer messages, proposals
//! and readies; `replica/members.rs` its configuration (membership
//! changes, joining, exclusion notices), `replica/snapshots.rs` its
//! snapshots and compaction. raft-rs's `Storage` is [`super::store::Store`];
//! the fields added to every message sent are in [`super::wire`].

mod members;
mod snapshots;

use std::collections::VecDeque;

use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, EntryType, Message, MessageType, Snapshot};
use raft::storage::MemStorage;
use raft::{RawNode, StateRole};

use super::check::{Reason, Refusal};
use super::store;
use super::store::Store;
use super::wire::{decode_excluded, FEATURES_FIELD, FEATURE_LONG_SOURCES, FEATURE_SESSIONS};
pub use super::wire::{encode_excluded, encode_message, EXCLUDED_FIELD};

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
    /// The ready `number` whose log records [`Replica::ready`] appended
    /// to the buffer it was given: once they are written and fdatasynced,
    /// report `number` to [`Replica::persisted`].
    pub persist: Option<u64>,
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
    /// yet: it goes with the next write of the log (see
    /// [`Replica::write_hard_state`]).
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
    /// ([`FEATURES`](super::wire::FEATURES); 0 for a node of an
    /// earlier version).
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
    /// (see [`SNAPSHOT_RETRY_TIMEOUTS`](snapshots::SNAPSHOT_RETRY_TIMEOUTS)).
    snapshots_sent: crate::core::idmap::IdMap<u64, u64>,
    /// The newest index as of which a peer said this group's committed
    /// configuration excludes this node ([`Replica::told_excluded`]).
    excluded_as_of: u64,
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

    /// The link to `node` failed (it closed or reset: the node exited or
    /// restarts): it no longer counts as heard from (a hand-over picks a
    /// live node) until its next message.
    pub fn forget_heard(&mut self, node: u64) {
        self.heard.remove(&node);
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
        self.peers_read(FEATURE_SESSIONS)
    }

    /// Whether a record with a source over 127 bytes may be written (a
    /// session Acquire or Proclaim of one taken): as
    /// [`peers_read_sessions`](Self::peers_read_sessions), for
    /// [`FEATURE_LONG_SOURCES`]. A node of an earlier version refuses an
    /// entry holding one and would fall behind for good.
    pub fn peers_read_long_sources(&self) -> bool {
        self.peers_read(FEATURE_LONG_SOURCES)
    }

    /// Every member heard from announced `feature`, and those that did,
    /// with this node, are a majority of the voters (of both halves of a
    /// joint configuration).
    fn peers_read(&self, feature: u64) -> bool {
        let cs = self.node.raft.prs().conf().to_conf_state();
        let me = self.cfg.id;
        let reads = |n: &u64| *n == me || self.features.get(n).is_some_and(|f| f & feature != 0);
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

    /// The entries up to `index` were applied to the table.
    pub fn applied_to(&mut self, index: u64) {
        if index > self.applied {
            self.applied = index;
        }
        if self.snapshot_ready.is_none() && index > self.node.raft.raft_log.applied {
            self.node.advance_apply_to(index);
        }
    }

    /// Collects the work raft-rs has now into `out`; its log records
    /// (snapshot, entries, hard state) are appended to `records` — the
    /// cluster log's batch being filled, so that they are encoded where
    /// they are written from, not copied there.
    pub fn ready(&mut self, out: &mut Output, records: &mut Vec<u8>) {
        if !self.node.has_ready() {
            self.note_role(out);
            return;
        }
        let mut rd = self.node.ready();
        self.queue_messages(rd.take_messages(), out);
        self.note_read_states(rd.take_read_states(), out);
        let start = records.len();
        if rd.snapshot().get_metadata().index > 0 {
            self.take_leader_snapshot(rd.snapshot(), rd.number(), out, records);
        }
        out.apply.extend(rd.take_committed_entries());
        self.append_entries(rd.entries(), records);
        self.write_hard_state(rd.hs(), records, start);
        let number = rd.number();
        let msgs = rd.take_persisted_messages();
        if !msgs.is_empty() {
            self.held.push_back((number, msgs));
        }
        let empty = records.len() == start;
        if !empty {
            out.persist = Some(number);
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

    /// A ready's messages that may go now, encoded into `out` (a snapshot
    /// sent to a node noted with the tick).
    fn queue_messages(&mut self, msgs: Vec<Message>, out: &mut Output) {
        for m in msgs {
            if m.get_msg_type() == MessageType::MsgSnapshot {
                self.snapshots_sent.insert(m.to, self.ticks);
            }
            out.send.push((m.to, encode_message(&m)));
        }
    }

    /// A ready's read states: read barriers answered (into `out`), and the
    /// leader's lease probes a quorum acknowledged.
    fn note_read_states(&mut self, states: Vec<raft::ReadState>, out: &mut Output) {
        for rs in states {
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
    }

    /// A leader's snapshot in ready `number`: everything this node had is
    /// replaced; its record appended to `records`, the table's install
    /// put in `out`.
    fn take_leader_snapshot(
        &mut self,
        snap: &Snapshot,
        number: u64,
        out: &mut Output,
        records: &mut Vec<u8>,
    ) {
        let snap = snap.clone();
        self.node
            .mut_store()
            .mem
            .wl()
            .apply_snapshot(snap.clone())
            .expect("raft-rs hands over only a newer snapshot");
        store::encode_snapshot(&snap, records);
        self.node.mut_store().snap = snap.clone();
        // raft-rs may count it applied only once it is durable.
        self.snapshot_ready = Some((number, snap.get_metadata().index));
        let named = snap.get_metadata().get_conf_state();
        if named.voters.contains(&self.cfg.id) || named.learners.contains(&self.cfg.id) {
            self.joining = false;
        }
        out.install = Some(snap);
    }

    /// A ready's new entries: appended to the in-memory log, their records
    /// to `records`.
    fn append_entries(&mut self, entries: &[Entry], records: &mut Vec<u8>) {
        if !entries.is_empty() {
            self.node
                .mut_store()
                .mem
                .wl()
                .append(entries)
                .expect("entries follow the log");
            for e in entries {
                store::encode_entry(e, records);
            }
        }
    }

    /// A ready's hard state `hs`: kept in memory, and its record appended
    /// to `records` when it must be written (what this ready appended
    /// starts at `start`), else left for the next write.
    fn write_hard_state(
        &mut self,
        hs: Option<&raft::eraftpb::HardState>,
        records: &mut Vec<u8>,
        start: usize,
    ) {
        if let Some(hs) = hs {
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
            if records.len() > start || (hs.term, hs.vote) != self.written_vote {
                self.written_vote = (hs.term, hs.vote);
                store::encode_hard_state(&hs, records);
            } else {
                self.commit_unwritten = Some(hs);
            }
        }
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
mod tests;
