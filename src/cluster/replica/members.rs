//! A replica's configuration: who is a member of its group, the
//! changes it proposes and applies, a node that joins a running group,
//! and the notices that a newer configuration excludes this node.

use protobuf::Message as _;
use raft::eraftpb::{
    ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState, Entry,
    EntryType,
};

use super::Replica;

pub(super) fn single_change(node_id: u64, t: ConfChangeType) -> ConfChangeSingle {
    let mut c = ConfChangeSingle {
        node_id,
        ..Default::default()
    };
    c.set_change_type(t);
    c
}

pub(super) fn conf_change(changes: Vec<ConfChangeSingle>) -> ConfChangeV2 {
    ConfChangeV2 {
        changes: changes.into(),
        ..Default::default()
    }
}

impl Replica {
    /// Every member of a configuration: voters, learners, and during a
    /// joint change the outgoing voters and the learners to be (a node may
    /// appear twice).
    pub fn members_of(cs: &ConfState) -> impl Iterator<Item = u64> + '_ {
        cs.voters
            .iter()
            .chain(&cs.learners)
            .chain(&cs.voters_outgoing)
            .chain(&cs.learners_next)
            .copied()
    }

    /// This node is a voter or a learner of its group.
    pub fn is_member(&self) -> bool {
        let c = self.conf_state();
        c.voters.contains(&self.cfg.id) || c.learners.contains(&self.cfg.id)
    }

    /// A configuration change is proposed and not yet applied, or the
    /// group is in a joint configuration (a change half done).
    pub fn change_in_progress(&self) -> bool {
        self.node.raft.has_pending_conf() || !self.conf_state().voters_outgoing.is_empty()
    }

    /// Proposes a configuration change: `add` become learners (`voter`
    /// false) or voters (a learner promoted, or a new voter), `remove`
    /// leave. More than one voter changing at once goes through a joint
    /// configuration that raft-rs leaves on its own once it is applied.
    /// `context` travels with the change (the added nodes' addresses).
    /// The entry's index, or why not: this node does not lead, or another
    /// change is in progress.
    pub fn propose_change(
        &mut self,
        add: &[u64],
        voter: bool,
        remove: &[u64],
        context: Vec<u8>,
    ) -> Result<u64, String> {
        if !self.is_leader() {
            return Err("this node does not lead the group".into());
        }
        if self.change_in_progress() {
            return Err("another membership change is in progress".into());
        }
        let kind = if voter {
            ConfChangeType::AddNode
        } else {
            ConfChangeType::AddLearnerNode
        };
        let changes = add
            .iter()
            .map(|&n| single_change(n, kind))
            .chain(
                remove
                    .iter()
                    .map(|&n| single_change(n, ConfChangeType::RemoveNode)),
            )
            .collect();
        let mut cc = conf_change(changes);
        cc.set_transition(ConfChangeTransition::Auto);
        cc.context = context.into();
        let before = self.node.raft.raft_log.last_index();
        self.node
            .propose_conf_change(vec![], cc)
            .map_err(|e| format!("raft-rs refused the change: {e}"))?;
        let after = self.node.raft.raft_log.last_index();
        // raft-rs turns a change it will not take into an empty entry.
        let landed = self.node.raft.raft_log.term(after).is_ok()
            && after == before + 1
            && self.node.raft.pending_conf_index == after;
        if !landed {
            return Err("raft-rs did not take the change (another one is in progress)".into());
        }
        Ok(after)
    }

    /// A committed configuration change entry (call before
    /// [`Replica::applied_to`] for its index): the configuration it makes,
    /// and the change itself (its context names added nodes' addresses).
    pub fn apply_change(&mut self, e: &Entry) -> Result<(ConfState, ConfChangeV2), String> {
        if e.get_entry_type() != EntryType::EntryConfChangeV2 {
            // ringlockd proposes only version-2 changes.
            return Err(format!(
                "entry {}: a version-1 configuration change",
                e.index
            ));
        }
        let cc = ConfChangeV2::parse_from_bytes(&e.data)
            .map_err(|err| format!("entry {}: bad configuration change: {err}", e.index))?;
        let cs = self
            .node
            .apply_conf_change(&cc)
            .map_err(|err| format!("entry {}: configuration change refused: {err}", e.index))?;
        self.node.mut_store().mem.wl().set_conf_state(cs.clone());
        if self.joining
            && cc.changes.iter().any(|c| {
                c.node_id == self.cfg.id && c.get_change_type() != ConfChangeType::RemoveNode
            })
        {
            self.joining = false;
        }
        Ok((cs, cc))
    }

    /// This node votes in the configuration it applied (in either half
    /// of a joint one). A leader that applied its own removal is not one:
    /// it no longer serves, and steps down ([`Replica::step_down_removed`]).
    pub fn is_voter(&self) -> bool {
        self.node.raft.prs().conf().voters().contains(self.cfg.id)
    }

    /// A leader that applied its own removal hands leadership over to `to`
    /// (raft-rs tells it to stand at once when it is caught up) and steps
    /// down in its term, as `check_quorum` steps a leader down. raft-rs
    /// would keep it leading, and panics when such a leader commits.
    pub fn step_down_removed(&mut self, to: Option<u64>) {
        if !self.is_leader() || self.is_voter() {
            return;
        }
        if let Some(t) = to {
            self.node.transfer_leader(t);
        }
        let term = self.node.raft.term;
        self.node.raft.become_follower(term, raft::INVALID_ID);
        self.after_raft();
    }

    /// A joining node learned its cluster's founding voters (from a link
    /// Hello): while its log is empty, they are its configuration, as they
    /// were every founder's before entry 1, so that the entries it is sent
    /// from the start replay every change since. A snapshot replaces it.
    pub fn adopt_founders(&mut self, voters: &[u64]) {
        if !self.joining || self.last_index() > 0 || !self.conf_state().voters.is_empty() {
            return;
        }
        for &v in voters {
            let cc = conf_change(vec![single_change(v, ConfChangeType::AddNode)]);
            if let Ok(cs) = self.node.apply_conf_change(&cc) {
                self.node.mut_store().mem.wl().set_conf_state(cs);
            }
        }
    }

    /// Still joining (see [`Replica::adopt_founders`]).
    pub fn is_joining(&self) -> bool {
        self.joining
    }

    /// A peer's replica of this group applied a configuration that
    /// excludes this node, made by the entry at `index` (committed: a
    /// replica applies nothing else). See [`Replica::excluded`].
    pub fn told_excluded(&mut self, index: u64) {
        self.excluded_as_of = self.excluded_as_of.max(index);
    }

    /// True while this node has not applied a configuration that a peer
    /// said excludes it ([`Replica::told_excluded`]): the group's
    /// committed history removes it at or before that index, so whatever
    /// configuration it applied so far, it is no voter of the group any
    /// more (when this node applied a configuration that includes it
    /// below that index, some entry after it removed it). Once it applied
    /// that far, its own configuration says which it is: a stale notice
    /// (this node was added back since, under the same id) says nothing
    /// about what came after it. A joining node (nothing applied from a
    /// leader yet) is no voter anyway and takes no notice.
    pub fn excluded(&self) -> bool {
        !self.joining && self.applied < self.excluded_as_of
    }
}
