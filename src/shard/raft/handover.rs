//! Handing leadership over: a stopping leader's hand-over (SIGTERM), an
//! operator's `XFER`, and every group following group 0's leader, so that
//! one node serves every shard.

use crate::log::Level;
use crate::shard::Shard;

/// How long a stopping node runs on once it handed every group over, in
/// replication ticks ([`Shard::stop_done`]).
const LINGER_TICKS: u64 = 2;

impl Shard {
    /// SIGTERM/SIGINT (from [`Shard::stop`]): a leader hands its group over
    /// to its most caught-up follower, so that a rolling restart costs
    /// clients one retry, not an election timeout. The loop runs on until
    /// [`Shard::stop_done`].
    pub(in crate::shard) fn hand_over_on_stop(&mut self) {
        let now = self.now.mono_us;
        let Some(r) = self.journal.replica_mut() else {
            return;
        };
        r.hand_over_until_us = now + 2 * r.election_us;
        if !r.replica.is_leader() {
            return;
        }
        let st = r.replica.status();
        let target = hand_over_target(&st);
        log!(
            Level::Info,
            "raft_hand_over",
            "group={} node={} to={} term={}",
            r.group,
            st.node,
            target.unwrap_or(0),
            st.term
        );
        if let Some(t) = target {
            r.replica.transfer_leader(t);
        }
        self.journal_pump();
    }

    /// An operator's `XFER`: hands this shard's leadership to node `to`
    /// (0: the follower `hand_over_target` picks). False when this shard does not lead, the
    /// node is not a peer, or there is nobody to hand over to. Public for
    /// the deterministic simulator, which hands over as an operator would.
    pub fn transfer_leadership(&mut self, to: u64) -> bool {
        let Some(r) = self.journal.replica_mut() else {
            return false;
        };
        if !r.replica.is_leader() {
            return false;
        }
        let st = r.replica.status();
        let target = if to == 0 {
            hand_over_target(&st)
        } else {
            st.followers
                .iter()
                .any(|f| f.node == to && f.voter)
                .then_some(to)
        };
        let Some(t) = target else { return false };
        log!(
            Level::Info,
            "raft_hand_over",
            "group={} node={} to={} term={} reason=operator",
            r.group,
            st.node,
            t,
            st.term
        );
        r.replica.transfer_leader(t);
        self.journal_pump();
        true
    }

    /// True once this shard may exit: always without replication; in a
    /// cluster once no group on this node leads any more (every shard's
    /// leadership handed over, as this shard sees them) and this one's
    /// vote is durable, plus `LINGER_TICKS` ticks; or once the
    /// hand-over's bound (two election timeouts) passed.
    ///
    /// The linger is for other nodes' forwarded requests: until they
    /// learn of the new leader they still send to this node, which
    /// answers `not leader` while its loop runs (they go to the new
    /// leader next); a request left unread at exit would instead close
    /// its client's connection with its outcome unknown.
    pub fn stop_done(&mut self) -> bool {
        let now = self.now.mono_us;
        let Some(r) = self.journal.replica_mut() else {
            return true;
        };
        if r.fatal.is_some() || now >= r.hand_over_until_us {
            return true;
        }
        // Handed over: another node leads, and this one's vote for it is
        // on disk and sent (votes wait for their fdatasync).
        let me = r.replica.id();
        let handed = !r.replica.is_leader()
            && r.replica.leader() != 0
            && r.replica.leader() != me
            && r.file.idle()
            && (0..r.view.groups()).all(|g| r.view.leader_of(g) != me);
        if !handed {
            r.handed_at_us = 0;
            return false;
        }
        if r.handed_at_us == 0 {
            r.handed_at_us = now;
        }
        now >= r.handed_at_us + LINGER_TICKS * crate::cluster::TICK_US
    }

    /// Every group follows group 0's leader, so one node serves them all:
    /// a leader of another group hands its leadership over to it.
    ///
    /// Each group makes a membership change alone. While some groups have
    /// made one and others not, a node may be a voter of some groups only
    /// (a replacement, a learner elsewhere; the node replaced, removed
    /// elsewhere): it can never serve, and a group whose leader it is
    /// must not stay there, or nobody serves and the change cannot be
    /// finished (the other groups cannot follow a node that is no voter of
    /// theirs). So a leader of any group, group 0 included, on such a node
    /// hands over to the follower `hand_over_target` picks (the lowest
    /// caught-up voter: the same node for every group), once per election
    /// timeout, instead of following group 0.
    pub(in crate::shard) fn follow_group0(&mut self) {
        let Some(r) = self.journal.replica_mut() else {
            return;
        };
        if r.replica.is_leader() && !r.view.all_voters() {
            let ticks = r.replica.ticks();
            if ticks >= r.last_transfer_tick + r.replica.election_ticks() {
                r.last_transfer_tick = ticks;
                let st = r.replica.status();
                if let Some(t) = hand_over_target(&st) {
                    log!(
                        Level::Info,
                        "raft_hand_over",
                        "group={} node={} to={} term={} reason=not_a_voter_of_every_group",
                        r.group,
                        st.node,
                        t,
                        st.term
                    );
                    r.replica.transfer_leader(t);
                }
            }
            return;
        }
        if r.group == 0 || !r.replica.is_leader() {
            return;
        }
        let want = r.view.leader_of(0);
        let ticks = r.replica.ticks();
        if want != 0
            && want != r.replica.id()
            && ticks >= r.last_transfer_tick + r.replica.election_ticks()
        {
            r.last_transfer_tick = ticks;
            r.replica.transfer_leader(want);
        }
    }
}

/// How far behind the commit index a follower may be and still count as
/// caught up for a hand-over: entries in flight to it (a pipeline of
/// appends not yet acknowledged) must not make one group of a node pick
/// another target than the others.
const HAND_OVER_SLACK: u64 = 1024;

/// Whom a leader hands over to: the lowest id among the live followers
/// that are caught up (within [`HAND_OVER_SLACK`] of the commit index; in
/// a healthy cluster all of them, so every shard of a node picks the same
/// node and no group has to move a second time to follow group 0), else
/// the live follower with the newest log, else any follower with the
/// newest log. raft-rs brings the target fully up to date before it tells
/// it to campaign.
pub(super) fn hand_over_target(st: &crate::cluster::replica::ReplicaStatus) -> Option<u64> {
    let floor = st.commit.saturating_sub(HAND_OVER_SLACK);
    // Only a voter can be elected (a learner is still catching up).
    let voters = || st.followers.iter().filter(|f| f.voter);
    let newest = |live: bool| {
        let pool = || voters().filter(move |f| !live || f.active);
        let best = pool().map(|f| f.matched).max()?;
        pool().filter(|f| f.matched == best).map(|f| f.node).min()
    };
    voters()
        .filter(|f| f.active && f.matched >= floor)
        .map(|f| f.node)
        .min()
        .or_else(|| newest(true))
        .or_else(|| newest(false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::replica::{FollowerStatus, ReplicaStatus};

    fn status(followers: &[(u64, u64, bool)]) -> ReplicaStatus {
        ReplicaStatus {
            node: 2,
            role: "leader",
            term: 5,
            leader: 2,
            commit: 5000,
            applied: 5000,
            last_index: 5000,
            serving: true,
            lease_valid: true,
            followers: followers
                .iter()
                .map(|&(node, matched, active)| FollowerStatus {
                    node,
                    matched,
                    active,
                    voter: node != 9,
                })
                .collect(),
            conf: Default::default(),
        }
    }

    #[test]
    fn every_group_of_a_node_hands_over_to_the_same_live_follower() {
        // Node 1 a few entries behind (appends in flight), node 3 at the
        // commit index: still node 1, as in every other group.
        assert_eq!(
            hand_over_target(&status(&[(1, 4990, true), (3, 5000, true)])),
            Some(1)
        );
        // A follower not heard from is passed over while a live one is
        // caught up.
        assert_eq!(
            hand_over_target(&status(&[(1, 5000, false), (3, 5000, true)])),
            Some(3)
        );
        // Far behind (a restarted node catching up): the caught-up one.
        assert_eq!(
            hand_over_target(&status(&[(1, 100, true), (3, 4999, true)])),
            Some(3)
        );
        // Nobody caught up: the live one with the newest log; nobody live:
        // the newest log.
        assert_eq!(
            hand_over_target(&status(&[(1, 100, true), (3, 200, true)])),
            Some(3)
        );
        assert_eq!(
            hand_over_target(&status(&[(1, 300, false), (3, 200, false)])),
            Some(1)
        );
        assert_eq!(hand_over_target(&status(&[])), None);
        // A learner (node 9 here) is never the target.
        assert_eq!(
            hand_over_target(&status(&[(9, 5000, true), (3, 10, true)])),
            Some(3)
        );
        assert_eq!(hand_over_target(&status(&[(9, 5000, true)])), None);
    }
}
