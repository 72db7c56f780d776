//! raft-rs's `Storage` of a [replica](super::replica::Replica): what
//! raft-rs reads of the log, kept in memory.

use raft::eraftpb::{Entry, Snapshot};
use raft::storage::MemStorage;
use raft::{GetEntriesContext, RaftState, Storage};

/// raft-rs's view of the log: its in-memory store for entries and hard
/// state, and the newest snapshot with its data (the store keeps only a
/// snapshot's metadata). The durable copy of all of it is the shard's log
/// file ([`super::store`]).
pub struct Store {
    pub(super) mem: MemStorage,
    pub(super) snap: Snapshot,
    /// A follower needs a snapshot newer than `snap` (one that names it:
    /// a node added since `snap` cannot install it). The shard compacts
    /// at once ([`Replica::take_snapshot_wanted`](super::replica::Replica::take_snapshot_wanted)).
    pub(super) wanted: std::cell::Cell<bool>,
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
