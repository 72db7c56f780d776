//! What a replica's Ready produces, carried out: messages sent over the
//! peer links, entries persisted through the cluster log, committed
//! entries applied to the table (the rules in the parent module's header).

use super::*;

impl Shard {
    /// What raft-rs produced: messages to send, entries and a hard state
    /// to persist (already in the cluster log's batch, as record `lsn`),
    /// committed entries to apply.
    pub(super) fn raft_output(&mut self, out: &mut Output, lsn: Option<u64>) {
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
