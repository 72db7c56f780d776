//! Linearizable listings on a follower: `KEYS`/`KEYX` parked until a read
//! barrier (Raft's ReadIndex) says everything committed when they were
//! asked is applied here.

use super::*;

impl Shard {
    /// A listing (`KEYS`/`KEYX`) asked of this shard while it does not
    /// serve: answered from this follower's table once a read barrier
    /// (ReadIndex) says everything committed when it was asked is applied
    /// here, so a follower's answer is linearizable too. True when parked.
    pub(in crate::shard) fn park_read(
        &mut self,
        from: usize,
        request: u64,
        op: &crate::shard::RemoteOp,
    ) -> bool {
        let now = self.now.mono_us;
        let Some(r) = self.journal.replica_mut() else {
            return false;
        };
        if r.replica.serving() || !matches!(op, crate::shard::RemoteOp::KeysOpen { .. }) {
            return false;
        }
        let id = r.next_read;
        r.next_read += 1;
        r.reads.push(ParkedRead {
            id,
            index: None,
            asked_us: now,
            from,
            request,
            op: op.clone(),
        });
        r.replica.read_barrier(id);
        self.journal_pump();
        true
    }

    /// Runs every parked listing whose barrier is applied; fails those
    /// that waited more than an election timeout (no leader answered).
    pub(in crate::shard) fn release_reads(&mut self) {
        let now = self.now.mono_us;
        let Some(r) = self.journal.replica_mut() else {
            return;
        };
        if r.reads.is_empty() {
            return;
        }
        let applied = r.replica.applied_index();
        let limit = r.election_us;
        let (ready, waiting): (Vec<ParkedRead>, Vec<ParkedRead>) = std::mem::take(&mut r.reads)
            .into_iter()
            .partition(|p| p.index.is_some_and(|i| i <= applied) || now >= p.asked_us + limit);
        r.reads = waiting;
        for p in ready {
            if p.index.is_some_and(|i| i <= applied) {
                if let Some(result) = self.keys_remote(p.from, &p.op) {
                    self.reply_when_durable(p.from, p.request, result);
                }
            } else {
                self.cmds.push(Cmd::Reply {
                    to: p.from,
                    id: p.request,
                    result: crate::shard::RemoteResult::Failed,
                });
            }
        }
    }
}
