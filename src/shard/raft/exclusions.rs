//! What this node's groups tell each other of their configurations
//! ([`NodeView`]), and what a group tells its peers of them: the notices
//! that a configuration of one of this node's groups excludes a peer.

use std::sync::atomic::Ordering;

use super::group::GroupReplica;
use crate::cluster::replica::Replica;
use crate::log::Level;

impl GroupReplica {
    /// Tells this node's other shards the configuration this group
    /// applied, made by the entry (or snapshot) at `index`: they tell the
    /// peers it excludes (see [`GroupReplica::excluded_notes`]). Nothing is said
    /// of the founding voters (index 0) nor of a history that
    /// `--force-new-cluster` is rewriting.
    pub(super) fn publish_conf(&self, index: u64) {
        let cs = self.replica.conf_state();
        let members: Vec<u64> = Replica::members_of(&cs).collect();
        let index = if self.forced { 0 } else { index };
        self.view.publish_conf(self.group, index, members);
    }

    /// The notices to add to each message for a member of this group whose
    /// configuration on one of this node's other groups excludes it: a
    /// node removed from a group but still a member of another (a change
    /// made in some groups and not yet in the others) learns of a removal
    /// it never applied — the leader that committed it sends a removed
    /// node nothing more, not even the commit index that would let it
    /// apply its removal — and, no voter of every group, hands over the
    /// leaderships it holds (`follow_group0`) instead of keeping every
    /// group from following one node. Rebuilt when a configuration
    /// changed.
    pub(super) fn excluded_notes(&mut self) {
        let gen = self.view.conf_gen.load(Ordering::Acquire);
        if gen == self.excluded_gen {
            return;
        }
        self.excluded_gen = gen;
        self.excluded_notes.clear();
        let cs = self.replica.conf_state();
        let me = self.replica.id();
        for peer in Replica::members_of(&cs) {
            if peer == me || self.excluded_notes.contains_key(&peer) {
                continue;
            }
            let notes = self.view.exclusions_of(peer, self.group);
            if !notes.is_empty() {
                let mut b = Vec::new();
                crate::cluster::replica::encode_excluded(&notes, &mut b);
                self.excluded_notes.insert(peer, b);
            }
        }
    }

    /// Takes up what peers said of this group's configuration (on any of
    /// this node's links) and publishes whether this shard is a voter.
    pub(super) fn note_excluded(&mut self) {
        let told = self.view.excluded[self.group].load(Ordering::Acquire);
        self.replica.told_excluded(told);
        let excluded = self.replica.excluded();
        if excluded && !self.excluded_logged && self.replica.is_voter() {
            log!(
                Level::Warn,
                "raft_removed",
                "group={} node={} applied={} removed_by_index={} action=\"a peer's configuration \
                 excludes this node; not serving, handing leadership over; stop this node\"",
                self.group,
                self.replica.id(),
                self.replica.applied_index(),
                told
            );
        }
        self.excluded_logged = excluded;
        let voter = self.replica.is_voter() && !excluded;
        self.view.voters[self.group].store(voter, Ordering::Release);
    }
}
