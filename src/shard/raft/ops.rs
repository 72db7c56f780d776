//! Operations: `CLST` and the replication metrics.

use super::*;

// ----- Operations: `CLST` and the replication metrics ----------------------
//
// Read-only views of the replica for operators: the admin port's `CLST`
// (answered by every node, see `crate::protocol::status`) and the
// `ringlock_raft_*` series, published once per tick from `end_tick`.

impl Shard {
    /// This shard's `CLST` record (`None` without replication).
    pub(in crate::shard) fn shard_status(&self) -> Option<crate::protocol::status::ShardStatus> {
        use crate::protocol::status::{Follower, Role, ShardStatus};
        let r = self.journal.replica()?;
        let s = r.replica.status();
        Some(ShardStatus {
            shard: self.me as u32,
            node: s.node,
            role: Role::from_name(s.role).unwrap_or(if r.replica.is_leader() {
                Role::Leader
            } else {
                Role::Follower
            }),
            serving: self.may_serve(),
            lease_valid: s.lease_valid,
            term: s.term,
            leader: s.leader,
            commit: s.commit,
            applied: s.applied,
            last_index: s.last_index,
            followers: s
                .followers
                .iter()
                .map(|f| Follower {
                    node: f.node,
                    matched: f.matched,
                    active: f.active,
                })
                .collect(),
        })
    }

    /// `CLST` on the admin connection in `slot`: every shard's record, or
    /// at once the empty answer "not a cluster member".
    pub(in crate::shard) fn cluster_status_start(&mut self, slot: u32) {
        if !self.journal.is_replicated() {
            let c = &mut self.conns[slot as usize];
            crate::protocol::status::encode(&[], &mut c.out);
            c.state = State::Answered;
            c.gate_lsn = 0;
            self.mark_dirty(slot);
            return;
        }
        self.scatter(slot, crate::shard::RemoteOp::ClusterStatus, false);
    }

    /// This shard's proposal was committed and applied: its latency.
    pub(in crate::shard) fn raft_committed(&mut self) {
        let Some(r) = self.journal.replica() else {
            return;
        };
        let took = self.now.mono_us.saturating_sub(r.stats.proposed_us);
        if let Some(m) = self.metrics.raft() {
            m.observe_commit_us(took);
        }
    }

    /// Publishes this shard's replication figures (once per tick, from
    /// `end_tick`); nothing without replication.
    pub(in crate::shard) fn publish_raft(&mut self) {
        let forwards_parked = self.forwards_parked();
        let Some(r) = self.journal.replica_mut() else {
            return;
        };
        r.stats.note_leader(r.replica.leader());
        let Some(m) = self.metrics.raft() else { return };
        let rep = &r.replica;
        let leader = rep.is_leader();
        m.set_shard(
            self.me,
            &crate::metrics::RaftGauges {
                term: rep.term(),
                leader_id: rep.leader(),
                leader,
                serving: rep.serving() && r.view.all_serving(),
                commit: rep.commit_index(),
                applied: rep.applied_index(),
                leader_changes: r.stats.leader_changes,
                forwards_parked,
            },
        );
        m.set_dropped(self.me, &r.dropped);
        if leader {
            let s = rep.status();
            for f in &s.followers {
                m.set_follower_lag(
                    self.me,
                    f.node,
                    Some(s.last_index.saturating_sub(f.matched)),
                );
            }
        } else {
            m.clear_follower_lag(self.me);
        }
    }
}
