//! What the replication metrics are computed from ([`Stats`]).

/// What the replication metrics are computed from (a replica's).
#[derive(Debug, Default)]
pub struct Stats {
    /// `now.mono_us` when the proposal in flight was proposed.
    pub(in crate::shard) proposed_us: u64,
    /// The last leader this shard knew of (0: none yet).
    pub(in crate::shard) last_leader: u64,
    pub(in crate::shard) leader_changes: u64,
}

impl Stats {
    /// The group's leader as this shard knows it now (0: none): a change
    /// to another node counts, the first one learnt of included.
    pub(in crate::shard) fn note_leader(&mut self, leader: u64) {
        if leader != 0 && leader != self.last_leader {
            self.last_leader = leader;
            self.leader_changes += 1;
        }
    }
}
