//! The shard as a replica of its Raft group (cluster mode, `--peers`).
//!
//! The leader decides on its table exactly as a single node does; the
//! records of each batch, instead of going to a local file, become one Raft
//! proposal ([`crate::wal::log::Log::replicated`]). The durability gate is
//! unchanged and keyed by the same sequence numbers: an answer waits until
//! the entry holding its records is committed *and applied*, then leaves.
//! Followers apply committed entries with the recovery code
//! ([`crate::wal::apply_replicated`]). Raft's own entries and hard state go
//! to the shard's log file through the ordinary write path (one
//! write+fdatasync per batch, `advance_append_async`).
//!
//! Rules this file keeps:
//! - **Serve only while leading, with the lease.** A node answers lock
//!   requests only when every shard of it leads its group, has applied an
//!   entry of its term, and holds its leader lease
//!   ([`Replica::serving`]). Others answer `not leader` (sessions, with
//!   the leader's client address) or `-` and close (Locking-Center).
//! - **Deadlines only move later.** On starting to serve, every lease
//!   deadline is pushed back by the election timeout. Only a serving
//!   leader expires anything, by proposing the release.
//! - **Stepping down rolls back.** A leader that loses leadership closes
//!   every client connection (their answers were never sent: outcome
//!   unknown to them, as after a crash), fails its in-flight proposal
//!   (undoing its effects: the table is the applied log again) and drops
//!   its sessions; their holds stay, owned by nobody, as its followers
//!   hold them.
//! - **Orphaned session holds outlive their clients' belief.** A leader
//!   that starts serving in a new term turns every session hold owned by
//!   nobody into a lease of the longest keep-alive plus an election
//!   timeout from that moment: the client's last answered renewal was
//!   before it, so its session cannot outlast that in its own eyes.
//! - **A log that cannot be written stops the node** (fail-stop): a
//!   replica that cannot persist must not vote or acknowledge. So does a
//!   committed entry or snapshot that cannot be applied: the whole process
//!   exits ([`FailStop`]), never a process with a dead shard.
//! - **Peers are not trusted.** Every Raft message from a link is checked
//!   ([`crate::cluster::check`]) before raft-rs sees it: one no correct
//!   peer sends is dropped and counted, and cannot crash this node.
//!
//! This file keeps the replica's life (start, ticks, messages, proposals,
//! the cluster log's writes); beside it: `group` (the replica's state and
//! how it is built from a recovered log), `failstop` (why a node stops),
//! `apply` (a Ready carried out: messages sent, entries persisted,
//! committed entries applied), `serving` (stepping down, starting to
//! serve), `members` (membership changes, `CMEM`/`CCHG`), `view` and
//! `exclusions` (what a node's groups share, and tell peers of their
//! configurations), `handover` (SIGTERM, `XFER`, following group 0),
//! `reads` (a follower's linearizable listings), `compact` (snapshots),
//! `stats` and `ops` (`CLST`, the metrics).

use std::sync::atomic::Ordering;

use super::cmd::Cmd;
use super::conn::{Port, State};
use super::gate::Voided;
use super::journal::Journal;
use super::Shard;
use crate::cluster::check::Reason;
use crate::cluster::replica::{Output, Replica, RoleChange};
use crate::cluster::{store, wire, TICK_US};
use crate::log::Level;
use crate::wal::log::{Chain, Landed, Next};

mod compact;
mod exclusions;
pub mod failstop;
pub mod group;
mod handover;
mod members;
mod ops;
mod reads;
mod serving;
pub mod stats;
pub mod view;
use compact::install;
pub use failstop::{FailKind, FailStop};
pub use group::GroupReplica;
use group::{link_addr, ParkedRead};
use handover::hand_over_target;
pub use stats::Stats;
pub use view::NodeView;

impl Shard {
    /// Makes this shard a replica (before it runs): its records become
    /// proposals, `part` holds the Raft node and the cluster log's writer.
    pub fn enable_cluster(&mut self, mut part: GroupReplica) {
        // The configuration as of the log's snapshot (the changes after it
        // are applied again, each published as it is).
        part.publish_conf(part.initial.as_ref().map_or(0, |s| s.get_metadata().index));
        if let Some(snap) = part.initial.take() {
            let now = self.now;
            if let Err(why) = install(&mut self.table, &snap.data, now) {
                let index = snap.get_metadata().index;
                part.apply_failed(index, format!("the log's snapshot: {why}"));
            }
        }
        self.journal = Journal::Raft(Box::new(part));
    }

    pub fn replica(&self) -> Option<&Replica> {
        self.journal.replica().map(|r| &r.replica)
    }

    /// Why the node must stop (its log failed, or an entry of it could
    /// not be applied), once set.
    pub fn cluster_fatal(&self) -> Option<&str> {
        self.cluster_fail_stop().map(|f| f.why.as_str())
    }

    /// [`Shard::cluster_fatal`] with which group, entry and kind: the
    /// driver logs it and ends the process ([`FailStop::exit_code`]).
    pub fn cluster_fail_stop(&self) -> Option<&FailStop> {
        self.journal.replica().and_then(|r| r.fatal.as_ref())
    }

    /// Peer messages this shard refused so far, by reason (in
    /// [`Reason::ALL`] order); `None` without replication.
    pub fn raft_dropped(&self) -> Option<[u64; Reason::COUNT]> {
        self.journal.replica().map(|r| r.dropped)
    }

    /// How long a session hold outlives a session that ended with its
    /// leader (the longest keep-alive plus an election timeout).
    pub(super) fn orphan_keep_us(&self) -> u64 {
        self.journal
            .replica()
            .map_or(0, |r| r.session_keep_ms * 1000)
    }

    /// The node may answer lock requests (always, without replication).
    pub(super) fn may_serve(&self) -> bool {
        match self.journal.replica() {
            None => true,
            Some(r) => !self.stopping && r.replica.serving() && r.view.all_serving(),
        }
    }

    /// This shard's own group serves here (always, without replication):
    /// its table takes requests. A follower's table applies other
    /// leaders' records and never grants from its queues, so nothing may
    /// wait in it.
    pub(super) fn group_serves(&self) -> bool {
        self.journal.replica().is_none_or(|r| r.replica.serving())
    }

    /// Whether this shard may take a source over 127 bytes: always on a
    /// single node; in a cluster once every peer announced that it reads
    /// such records ([`Replica::peers_read_long_sources`]).
    ///
    /// [`Replica::peers_read_long_sources`]: crate::cluster::replica::Replica::peers_read_long_sources
    pub(super) fn long_sources_replicated(&self) -> bool {
        self.journal
            .replica()
            .is_none_or(|r| r.replica.peers_read_long_sources())
    }

    /// `(the node this one knows as group 0's leader (0: none), this
    /// node's id)`, in cluster mode.
    pub(super) fn known_leader(&self) -> Option<(u64, u64)> {
        let r = self.journal.replica()?;
        Some((r.view.leader_of(0), r.replica.id()))
    }

    /// The leader's client address, when known (for `not leader`).
    pub(super) fn leader_hint(&self) -> Vec<u8> {
        let Some(r) = self.journal.replica() else {
            return Vec::new();
        };
        // Group 0's leader is the node every group follows.
        let leader = r.view.leader_of(0);
        if leader == r.replica.id() {
            return r.my_client_addr.clone().into_bytes();
        }
        r.client_addrs
            .get(&leader)
            .map(|a| a.clone().into_bytes())
            .unwrap_or_default()
    }

    /// This node's directory (Locate, `CADR`: [`crate::protocol::locate`]):
    /// its own lock and admin addresses, whether it serves, the leader it
    /// knows of, and every other member's lock address as that member's
    /// link Hello gave it (empty until one arrived). A single node lists
    /// itself alone, as node 0.
    pub(super) fn directory(&self) -> crate::protocol::locate::Directory {
        use crate::protocol::locate::{Directory, NodeAddrs};
        let (lock, admin) = self.advertised.clone();
        let Some(r) = self.journal.replica() else {
            return Directory {
                member: false,
                serving: !self.stopping,
                node: 0,
                leader: 0,
                nodes: vec![NodeAddrs {
                    node: 0,
                    lock,
                    admin,
                }],
            };
        };
        let me = r.replica.id();
        let mut nodes = vec![NodeAddrs {
            node: me,
            lock,
            admin,
        }];
        nodes.extend(r.addrs.keys().filter(|&&id| id != me).map(|&id| NodeAddrs {
            node: id,
            lock: r.client_addrs.get(&id).cloned().unwrap_or_default(),
            admin: String::new(),
        }));
        Directory {
            member: true,
            serving: self.may_serve(),
            node: me,
            leader: r.view.leader_of(0),
            nodes,
        }
    }

    /// A link Hello from `hello.node`: accepted when it belongs to this
    /// cluster and group.
    pub fn on_peer_hello(&mut self, hello: &wire::Hello) -> Result<(), String> {
        let Some(r) = self.journal.replica_mut() else {
            return Err("this node is not a cluster member".into());
        };
        let id = r.replica.id();
        if hello.node == 0 {
            // raft-rs's INVALID_ID: its messages would be taken as this
            // node's own.
            return Err("a Hello from node 0 (node ids are 1 and up)".into());
        }
        if hello.group as usize != r.group || hello.groups as usize != self.shards {
            return Err(format!(
                "node {} runs {} shards and linked its group {} to this node's group {} of {} \
                 (every node of a cluster runs the same --threads)",
                hello.node, hello.groups, hello.group, r.group, self.shards
            ));
        }
        if hello.node == id {
            return Err(format!(
                "node {} linked to itself (two nodes with one --node-id?)",
                id
            ));
        }
        let mine = &r.identity.voters;
        if mine.is_empty() && !hello.voters.is_empty() {
            // Joining: this is the cluster that added us (only its leader
            // sends to a node with an empty log). Its identity is ours,
            // durable with the next records written.
            log!(
                Level::Info,
                "raft_joined",
                "group={} node={} cluster_founders={:?} via={}",
                r.group,
                id,
                hello.voters,
                hello.node
            );
            r.identity.voters = hello.voters.clone();
            r.replica.adopt_founders(&hello.voters);
            let identity = &r.identity;
            let _ = r.file.append_raw(|b| store::encode_identity(identity, b));
        } else if !hello.voters.is_empty() && hello.voters != *mine {
            return Err(format!(
                "node {} belongs to the cluster founded by nodes {:?}, this node to the one \
                 founded by {:?} (a node that joins a running cluster starts with --join and an \
                 empty --data-path)",
                hello.node, hello.voters, mine
            ));
        }
        r.client_addrs.insert(hello.node, hello.client_addr.clone());
        self.forward_link_up(hello.node);
        Ok(())
    }

    /// The Hello this shard's links send.
    pub fn peer_hello(&self) -> Option<wire::Hello> {
        self.journal.replica()?.hello(self.shards)
    }

    /// The link to `node` failed (from the driver).
    pub fn on_peer_link_down(&mut self, node: u64) {
        if let Some(r) = self.journal.replica_mut() {
            r.replica.forget_heard(node);
        }
        self.forward_link_down(node);
        self.apply_effects();
    }

    /// A Raft message from the peer link of node `link_node` (the node its
    /// Hello named). Checked before raft-rs sees it
    /// ([`crate::cluster::check`]): a message no correct peer sends is
    /// dropped, counted and logged, and changes nothing.
    pub fn on_raft_message(&mut self, link_node: u64, bytes: &[u8]) {
        let now_us = self.now.mono_us;
        let Some(r) = self.journal.replica_mut() else {
            return;
        };
        if r.fatal.is_some() {
            return;
        }
        match r.replica.step(link_node, bytes) {
            Ok(notes) => {
                // What the peer's groups say of this node's membership:
                // each group's shard takes it up (`GroupReplica::note_excluded`).
                for (g, index) in notes {
                    if let Some(a) = r.view.excluded.get(g as usize) {
                        a.fetch_max(index, Ordering::AcqRel);
                    }
                }
            }
            Err(refusal) => {
                r.refused(link_node, &refusal, now_us);
                return;
            }
        }
        self.journal_pump();
    }

    /// Advances the replication clock (from `begin_tick`).
    pub(super) fn journal_tick(&mut self) {
        let now = self.now.mono_us;
        let Some(r) = self.journal.replica_mut() else {
            return;
        };
        if r.fatal.is_some() {
            return;
        }
        if r.next_tick_us == 0 {
            r.next_tick_us = now + TICK_US;
        }
        let mut n = 0;
        while now >= r.next_tick_us {
            r.next_tick_us += TICK_US;
            n += 1;
            if n > 2 * r.replica.election_ticks() {
                // Paused far longer than an election timeout: the lease and
                // every timer have long run out; do not spin through them.
                r.next_tick_us = now + TICK_US;
                break;
            }
        }
        // Late (a stall): a follower's election timer does not take the
        // whole stall at once (see `Replica::ticks_passed`).
        r.replica.ticks_passed(n);
        if n > 0 {
            self.follow_group0();
            self.check_forwards();
            // raft-rs drops a ReadIndex it cannot forward (no leader known
            // yet, as right after a restart): ask again each tick until
            // answered.
            if let Some(r) = self.journal.replica_mut() {
                for p in r.reads.iter().filter(|p| p.index.is_none()) {
                    r.replica.read_barrier(p.id);
                }
            }
            self.release_reads();
        }
    }

    /// The next replication tick (for the wait).
    pub(super) fn journal_deadline_us(&self) -> Option<u64> {
        self.journal
            .replica()
            .filter(|r| r.fatal.is_none())
            .map(|r| r.next_tick_us)
    }

    /// A leader that applied its own removal (elected in the joint
    /// configuration that replaces it, or before it applied the change
    /// that removes it) must not lead on: it no longer serves
    /// ([`Replica::serving`]), no other node would stand while it sends
    /// heartbeats, and raft-rs, which does not step a removed leader down,
    /// panics when such a leader commits an entry (`maybe_commit` looks up
    /// its own progress). It hands over to a voter, as a stopping leader
    /// does, and steps down at once: a caught-up transferee is told to
    /// stand now, else the others elect one after an election timeout.
    fn removed_leader_steps_down(&mut self) {
        let Some(r) = self.journal.replica_mut() else {
            return;
        };
        if !r.replica.is_leader() || r.replica.is_voter() {
            return;
        }
        let st = r.replica.status();
        let target = hand_over_target(&st);
        log!(
            Level::Warn,
            "raft_hand_over",
            "group={} node={} to={} term={} reason=removed",
            r.group,
            st.node,
            target.unwrap_or(0),
            st.term
        );
        r.replica.step_down_removed(target);
    }

    /// Proposes a batch of records (the replicated log's next batch).
    pub(super) fn propose(&mut self, buf: Vec<u8>) {
        let serving = self.may_serve();
        let now = self.now;
        let r = self
            .journal
            .replica_mut()
            .expect("a replicated log has a replica");
        let index = if serving {
            let mut data = Vec::with_capacity(buf.len() + 8);
            store::proposal(now.unix_ms, &buf, &mut data);
            r.replica.propose(data)
        } else {
            None
        };
        match index {
            Some(i) => {
                r.proposal = Some((i, r.replica.term(), buf));
                r.stats.proposed_us = now.mono_us;
            }
            None => {
                // Not serving: what was decided meanwhile is void.
                let log = &mut r.batch;
                let landed = log.proposal_landed(Err(()), buf);
                debug_assert!(matches!(landed, Landed::Failed { .. }));
                self.fail_pending(Voided::LeadershipLost, "not the serving leader", 0);
            }
        }
    }

    /// Collects and acts on everything raft-rs has ready, until it has
    /// nothing more.
    pub(super) fn journal_pump(&mut self) {
        for _ in 0..64 {
            let Some(r) = self.journal.replica_mut() else {
                return;
            };
            if r.fatal.is_some() {
                return;
            }
            let mut out = std::mem::take(&mut r.out);
            let replica = &mut r.replica;
            let lsn = r
                .file
                .append_raw(|records| replica.ready(&mut out, records));
            let idle = out.send.is_empty()
                && out.persist.is_none()
                && out.apply.is_empty()
                && out.role.is_none();
            self.raft_output(&mut out, lsn);
            if let Some(r) = self.journal.replica_mut() {
                r.out = out;
            }
            if idle {
                break;
            }
        }
        self.maybe_compact();
        self.raft_file_chains();
        if let Some(r) = self.journal.replica_mut() {
            r.note_excluded();
        }
        self.note_serving();
    }

    /// Submits the cluster log's next write chain.
    fn raft_file_chains(&mut self) {
        let now_us = self.now.mono_us;
        let Some(r) = self.journal.replica_mut() else {
            return;
        };
        loop {
            match r.file.next_chain(&mut self.table, now_us) {
                Next::Chain(chain, buf) => self.cmds.push(Cmd::Log { chain, buf }),
                Next::Idle => return,
                Next::FailPending | Next::Propose(_) => {
                    r.fail(FailKind::Log, None, "the cluster log failed".into());
                    return;
                }
            }
        }
    }

    /// A chain of the cluster log landed.
    pub(super) fn replica_log_landed(
        &mut self,
        chain: Chain,
        result: Result<(), i32>,
        buf: Vec<u8>,
    ) {
        let now_us = self.now.mono_us;
        let r = self.journal.replica_mut().expect("replica");
        match r.file.landed(chain, result, buf, now_us) {
            Landed::Append { took_us, .. } => {
                self.metrics.observe_fdatasync_us(took_us);
                let durable = r.file.durable_lsn();
                let mut number = None;
                while let Some(&(lsn, n)) = r.persisting.front() {
                    if lsn > durable {
                        break;
                    }
                    r.persisting.pop_front();
                    number = Some(n);
                }
                if let Some(n) = number {
                    let mut out = std::mem::take(&mut r.out);
                    r.replica.persisted(n, &mut out);
                    self.raft_output(&mut out, None);
                    if let Some(r) = self.journal.replica_mut() {
                        r.out = out;
                    }
                }
                self.journal_pump();
            }
            Landed::Rewrite { bytes, took_us, .. } => {
                let snap = r.compacting.take().expect("a rewrite is a compaction");
                let index = snap.get_metadata().index;
                r.replica.compacted(snap);
                if r.forced {
                    r.forced = false;
                    log!(
                        Level::Warn,
                        "raft_forced_new_cluster_done",
                        "group={} node={} snapshot_index={} action=\"remove --force-new-cluster; add \
                         nodes with ringlock cluster add\"",
                        r.group,
                        r.replica.id(),
                        index
                    );
                }
                log!(
                    Level::Info,
                    "raft_compacted",
                    "group={} snapshot_index={} log_bytes={} duration_us={}",
                    r.group,
                    index,
                    bytes,
                    took_us
                );
                self.journal_pump();
            }
            other => {
                let err = result.err().unwrap_or(0);
                let why = format!(
                    "the cluster log's write or fdatasync failed ({other:?}, errno {}): \
                     a replica that cannot persist must not vote or acknowledge",
                    -err
                );
                r.fail(FailKind::Log, None, why);
            }
        }
    }
}

impl Shard {
    /// A lock-port frame reached a node that does not serve: a session's
    /// Hello is refused `not leader` with the leader's client address (when
    /// known); a Locking-Center request gets `-` and the connection closes
    /// (its clients retry, as after a restart). False: nothing executed.
    pub(super) fn not_leader(&mut self, slot: u32) -> bool {
        use crate::protocol::session::{self as sp, Status};
        let hint = self.leader_hint();
        let c = &mut self.conns[slot as usize];
        if c.sid == 0 && matches!(c.rbuf.first(), Some(&sp::OP_HELLO | &sp::OP_RESUME)) {
            match sp::decode(&c.rbuf) {
                sp::Decoded::Incomplete => return false,
                sp::Decoded::Frame { rid, op, .. } => {
                    if let Some(op) = crate::metrics::SessionOp::from_byte(op) {
                        self.metrics
                            .at(self.me)
                            .session_request(op, Status::NotLeader);
                    }
                    c.rbuf.clear();
                    sp::encode_refusal(rid, Status::NotLeader, &hint, &mut c.out);
                    c.close_after_send = true;
                    c.state = State::Answered;
                    self.mark_dirty(slot);
                    return false;
                }
                sp::Decoded::Bad(why) => {
                    self.reject(slot, why);
                    return false;
                }
            }
        }
        self.reject(slot, "not the leader");
        false
    }
}

// ----- what a replica's Ready produces, carried out: messages sent over the
// peer links, entries persisted through the cluster log, committed entries
// applied to the table (the rules above) -----

impl Shard {
    /// What raft-rs produced: messages to send, entries and a hard state
    /// to persist (already in the cluster log's batch, as record `lsn`),
    /// committed entries to apply.
    fn raft_output(&mut self, out: &mut Output, lsn: Option<u64>) {
        let r = self.journal.replica_mut().expect("replica");
        if !out.send.is_empty() {
            r.excluded_notes();
        }
        for (to, mut bytes) in out.send.drain(..) {
            if let Some(notes) = r.excluded_notes.get(&to) {
                bytes.extend_from_slice(notes);
            }
            let mut frame = Vec::with_capacity(bytes.len() + 5);
            wire::frame(wire::KIND_RAFT, &bytes, &mut frame);
            self.cmds.push(Cmd::Peer { node: to, frame });
        }
        if let Some(number) = out.persist.take() {
            let lsn = lsn.expect("a ready with records appended them");
            r.persisting.push_back((lsn, number));
        }
        if let Some(role) = out.role.take() {
            self.role_changed(role);
        } else {
            r.view.leaders[r.group].store(r.replica.leader(), Ordering::Release);
        }
        if let Some(snap) = out.install.take() {
            if !self.install_leader_snapshot(snap) {
                return;
            }
        }
        let entries = std::mem::take(&mut out.apply);
        for e in &entries {
            self.apply_entry(e);
            if self.cluster_fatal().is_some() {
                return;
            }
        }
        let r = self.journal.replica_mut().expect("replica");
        for (id, index) in out.reads.drain(..) {
            if let Some(p) = r.reads.iter_mut().find(|p| p.id == id) {
                p.index = Some(index);
            }
        }
        self.release_reads();
    }

    /// This replica became leader, or stopped being one: published to
    /// the node's other shards and logged; a step-down rolls back.
    fn role_changed(&mut self, role: RoleChange) {
        let r = self.journal.replica_mut().expect("replica");
        let group = r.group;
        let id = r.replica.id();
        r.view.leaders[group].store(r.replica.leader(), Ordering::Release);
        r.stats.note_leader(r.replica.leader());
        match role {
            RoleChange::Leader { term } => {
                log!(
                    Level::Info,
                    "raft_leader",
                    "group={} node={} term={}",
                    group,
                    id,
                    term
                );
            }
            RoleChange::SteppedDown { term } => {
                // Expected when this node stops (it hands over first).
                log!(
                    if self.stopping {
                        Level::Info
                    } else {
                        Level::Warn
                    },
                    "raft_stepped_down",
                    "group={} node={} term={} now_term={} leader={}",
                    group,
                    id,
                    term,
                    r.replica.term(),
                    r.replica.leader()
                );
                self.step_down("leadership lost");
            }
        }
    }

    /// A leader's snapshot replaces this node's log: what was in flight
    /// is voided, the table becomes the snapshot's. False when it could
    /// not be installed (the node stops).
    fn install_leader_snapshot(&mut self, snap: raft::eraftpb::Snapshot) -> bool {
        let now = self.now;
        let index = snap.get_metadata().index;
        let r = self.journal.replica_mut().expect("replica");
        if let Some((_, _, buf)) = r.proposal.take() {
            let log = &mut r.batch;
            log.proposal_landed(Err(()), buf);
            self.fail_pending(
                Voided::LeadershipLost,
                "a leader's snapshot replaced this node's log",
                0,
            );
        }
        match install(&mut self.table, &snap.data, now) {
            Ok(keys) => {
                if let Ok((Some(m), _)) = store::split_snapshot(&snap.data) {
                    let r = self.journal.replica_mut().expect("replica");
                    r.addrs = m.addrs;
                    self.members_changed(index);
                }
                let r = self.journal.replica_mut().expect("replica");
                r.replica.snapshot_installed(index);
                r.publish_conf(index);
                log!(
                    Level::Info,
                    "raft_snapshot_installed",
                    "group={} index={} held_keys={}",
                    r.group,
                    index,
                    keys
                );
            }
            Err(why) => {
                let r = self.journal.replica_mut().expect("replica");
                r.apply_failed(index, format!("a leader's snapshot: {why}"));
                return false;
            }
        }
        true
    }

    /// One committed entry.
    fn apply_entry(&mut self, e: &raft::eraftpb::Entry) {
        let now = self.now;
        let r = self.journal.replica_mut().expect("replica");
        match r.proposal.take() {
            Some((index, term, buf)) if index == e.index && term == e.term => {
                // Ours: the table holds its effects already.
                r.replica.applied_to(e.index);
                let log = &mut r.batch;
                log.proposal_landed(Ok(()), buf);
                self.release_durable();
                self.raft_committed();
                return;
            }
            Some((index, term, buf)) if index <= e.index => {
                // Another leader's entry took its place: never committed.
                let _ = term;
                let log = &mut r.batch;
                log.proposal_landed(Err(()), buf);
                self.fail_pending(
                    Voided::LeadershipLost,
                    "the proposal was overwritten by a newer leader",
                    0,
                );
            }
            other => r.proposal = other,
        }
        let r = self.journal.replica_mut().expect("replica");
        if Replica::is_change(e) {
            match r.replica.apply_change(e) {
                Ok((_, cc)) => {
                    for (id, a) in store::decode_addrs(&cc.context) {
                        r.addrs.insert(id, a);
                    }
                    r.publish_conf(e.index);
                    self.members_changed(e.index);
                    self.removed_leader_steps_down();
                }
                Err(why) => {
                    r.apply_failed(e.index, why);
                    return;
                }
            }
        }
        let r = self.journal.replica_mut().expect("replica");
        if !Replica::is_empty_entry(e) {
            let Some((leader_unix_ms, records)) = store::split_proposal(&e.data) else {
                r.apply_failed(e.index, "too short to be a proposal".into());
                return;
            };
            if let Err(why) =
                crate::wal::apply_replicated(records, leader_unix_ms, &mut self.table, now)
            {
                self.journal
                    .replica_mut()
                    .expect("replica")
                    .apply_failed(e.index, why);
                return;
            }
        }
        let r = self.journal.replica_mut().expect("replica");
        r.replica.applied_to(e.index);
    }
}
