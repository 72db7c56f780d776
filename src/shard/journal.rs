//! Where a shard's records become durable ([`Journal`]): nowhere (memory
//! mode), the local write-ahead log, or the shard's Raft group.
//!
//! Either way the shard appends each batch's records to one batcher
//! ([`Log`]) and its durability gate waits on that batcher's lsn: the
//! local log's lsn moves when a write+fdatasync lands, the Raft group's
//! when the entry holding the batch is committed and applied. What only
//! a replica has — the Raft node, the cluster log file, the serving rules
//! — is the [`GroupReplica`] inside `Raft`, driven from `raft.rs`.

use crate::wal::log::Log;

use super::raft::group::GroupReplica;

/// Where a shard's records become durable.
// One per shard: the local log stays inline, as the `Option<Log>` it
// replaces was (no pointer to follow on every record appended).
#[allow(clippy::large_enum_variant)]
pub(super) enum Journal {
    /// In memory: no record is written; everything is durable at once.
    Memory,
    /// The local write-ahead log (`--data-path`).
    Local(Log),
    /// The shard's Raft group (`--peers`): each batch is one proposal.
    Raft(Box<GroupReplica>),
}

impl Journal {
    /// The batcher records are appended to (`None` in memory mode).
    pub(super) fn records(&self) -> Option<&Log> {
        match self {
            Journal::Memory => None,
            Journal::Local(log) => Some(log),
            Journal::Raft(r) => Some(&r.batch),
        }
    }

    pub(super) fn records_mut(&mut self) -> Option<&mut Log> {
        match self {
            Journal::Memory => None,
            Journal::Local(log) => Some(log),
            Journal::Raft(r) => Some(&mut r.batch),
        }
    }

    /// The lsn up to which records are durable (everything in memory mode).
    pub(super) fn durable_lsn(&self) -> u64 {
        self.records().map_or(u64::MAX, Log::durable_lsn)
    }

    /// The replica of the shard's Raft group (`None` without replication).
    pub(super) fn replica(&self) -> Option<&GroupReplica> {
        match self {
            Journal::Raft(r) => Some(r),
            _ => None,
        }
    }

    pub(super) fn replica_mut(&mut self) -> Option<&mut GroupReplica> {
        match self {
            Journal::Raft(r) => Some(r),
            _ => None,
        }
    }

    /// Records are replicated: a batch that is lost means leadership was
    /// lost, not the disk — the records may still be committed by
    /// another leader, and the sessions they name live on in the group's
    /// log (their clients resume them).
    pub(super) fn is_replicated(&self) -> bool {
        matches!(self, Journal::Raft(_))
    }

    /// Sessions opened now are replicated: the group's every peer
    /// announced that it reads session records.
    pub(super) fn sessions_replicated(&self) -> bool {
        self.replica()
            .is_some_and(|r| r.replica.peers_read_sessions())
    }

    /// The election timeout in µs (0 without replication): how long a
    /// leader change may take, what waits for one are sized by.
    pub(super) fn election_us(&self) -> u64 {
        self.replica().map_or(0, |r| r.election_us)
    }

    /// The group's current term (`None` without replication).
    pub(super) fn term(&self) -> Option<u64> {
        self.replica().map(|r| r.replica.term())
    }
}
