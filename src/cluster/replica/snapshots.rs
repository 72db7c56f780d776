//! A replica's snapshots: those a leader sends (and sends again when
//! one is not acknowledged), those it installs from a leader, and the
//! compaction of its log into a snapshot of its own.

use raft::eraftpb::Snapshot;
use raft::{GetEntriesContext, SnapshotStatus, Storage};

use super::super::store;
use super::Replica;

/// raft-rs sends a follower nothing more after a snapshot until that
/// follower acknowledges it (it relies on the application to report a
/// snapshot it could not deliver): a snapshot lost on the way (a link that
/// broke, a follower that crashed before the snapshot was durable) would
/// stop the follower's replication until another leader is elected. A
/// snapshot not acknowledged within this many election timeouts is
/// reported failed, and raft-rs probes the follower again (sending a new
/// snapshot if it still needs one).
pub const SNAPSHOT_RETRY_TIMEOUTS: u64 = 4;

impl Replica {
    /// Reports the snapshots sent [`SNAPSHOT_RETRY_TIMEOUTS`] election
    /// timeouts ago as failed (raft-rs ignores it for a follower that
    /// acknowledged its snapshot meanwhile).
    pub(super) fn retry_snapshots(&mut self) {
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

    /// The snapshot of [`Output::install`](super::Output::install) is the table now.
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
}
