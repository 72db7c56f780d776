//! What a node's shards tell each other ([`NodeView`]) and what a node's
//! groups tell a peer of its membership: the configuration notices that
//! let a node learn of a removal from one group it never applied, while
//! it is still a member of another (see `GroupReplica::excluded_notes`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What this node's shards tell each other (one per node, built by the
/// driver's `mesh::Shared`, which gives each group's replica a clone):
/// which node leads each group, whether each shard serves, whether each is a voter
/// of its group, each group's applied configuration, and what the peers
/// said of this node's membership (see `GroupReplica::excluded_notes`).
pub struct NodeView {
    pub(super) leaders: Vec<AtomicU64>,
    pub(super) serving: Vec<AtomicBool>,
    pub(super) voters: Vec<AtomicBool>,
    /// Each group's applied configuration: `(the index of the entry or
    /// snapshot that made it, every member)`; index 0 for the founding
    /// voters (or a log rewritten by `--force-new-cluster`), of which
    /// nothing is said to peers.
    pub(super) confs: Vec<Mutex<(u64, Vec<u64>)>>,
    /// Bumped by each change of `confs`.
    pub(super) conf_gen: AtomicU64,
    /// Per group: the newest index as of which a peer said the group's
    /// configuration excludes this node (a notice may come on any
    /// group's link; the group's shard takes it up at its next pump).
    pub(super) excluded: Vec<AtomicU64>,
}

impl NodeView {
    pub fn new(groups: usize) -> Arc<NodeView> {
        Arc::new(NodeView {
            leaders: (0..groups).map(|_| AtomicU64::new(0)).collect(),
            serving: (0..groups).map(|_| AtomicBool::new(false)).collect(),
            voters: (0..groups).map(|_| AtomicBool::new(true)).collect(),
            confs: (0..groups).map(|_| Mutex::new((0, Vec::new()))).collect(),
            conf_gen: AtomicU64::new(0),
            excluded: (0..groups).map(|_| AtomicU64::new(0)).collect(),
        })
    }
    pub(super) fn publish_conf(&self, group: usize, index: u64, members: Vec<u64>) {
        let mut c = self.confs[group].lock().unwrap_or_else(|e| e.into_inner());
        *c = (index, members);
        drop(c);
        self.conf_gen.fetch_add(1, Ordering::AcqRel);
    }
    /// What this node's groups other than `group` say of `peer`: the
    /// `(group, index)` of each whose configuration, made at `index`,
    /// excludes it.
    pub(super) fn exclusions_of(&self, peer: u64, group: usize) -> Vec<(u32, u64)> {
        (0..self.confs.len())
            .filter(|&g| g != group)
            .filter_map(|g| {
                let c = self.confs[g].lock().unwrap_or_else(|e| e.into_inner());
                (c.0 > 0 && !c.1.contains(&peer)).then_some((g as u32, c.0))
            })
            .collect()
    }
    /// True when every shard of this node is a voter of its group (false
    /// while a membership change is made in some groups and not yet in
    /// the others: then this node can never serve).
    pub fn all_voters(&self) -> bool {
        self.voters.iter().all(|s| s.load(Ordering::Acquire))
    }
    /// True when every shard of this node serves.
    pub fn all_serving(&self) -> bool {
        self.serving.iter().all(|s| s.load(Ordering::Acquire))
    }
    pub fn groups(&self) -> usize {
        self.leaders.len()
    }
    pub fn leader_of(&self, group: usize) -> u64 {
        self.leaders[group].load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a node's group tells a peer: every other group whose applied
    /// configuration (made by a change, not the founding voters) excludes
    /// it, with the index of the change; nothing of its own group.
    #[test]
    fn a_peer_is_told_of_the_other_groups_whose_configuration_excludes_it() {
        let v = NodeView::new(3);
        let gen = v.conf_gen.load(Ordering::Acquire);
        for g in 0..3 {
            v.publish_conf(g, 0, vec![1, 2, 3]);
        }
        assert!(v.conf_gen.load(Ordering::Acquire) > gen);
        assert!(v.exclusions_of(4, 0).is_empty(), "the founders say nothing");
        // Node 1 replaced by node 4 in group 2, learner 4 added in group 1.
        v.publish_conf(2, 13, vec![2, 3, 4]);
        v.publish_conf(1, 9, vec![1, 2, 3, 4]);
        assert_eq!(v.exclusions_of(1, 0), [(2, 13)]);
        assert_eq!(v.exclusions_of(1, 1), [(2, 13)]);
        assert!(v.exclusions_of(1, 2).is_empty(), "not of its own group");
        assert!(v.exclusions_of(4, 0).is_empty());
        // Group 0's founding configuration says nothing of node 4 either.
        assert!(v.exclusions_of(4, 2).is_empty());
        assert!(v.exclusions_of(2, 0).is_empty());
    }
}
