//! Membership changes of a shard's group (see docs/cluster.md, "Changing
//! the membership"): the admin port's `CMEM` and `CCHG` for this shard,
//! and what a node does when a change is applied (addresses, links, a
//! node that was removed).
//!
//! A change is decided by each group's leader alone; the checks are the
//! same in every group, so that on one node every shard accepts or refuses
//! alike, and a change made by some shards and refused or lost by others
//! is made again by asking again (every accepted change answers `+` when
//! asked twice). The CLI (`ringlock cluster add|remove|replace`) does so.

use super::*;

impl Shard {
    /// The configuration changed (applied at `index`): members that left
    /// lose their address and link, every member's link goes to its
    /// address, and a node that was removed says so and stops serving.
    pub(in crate::shard) fn members_changed(&mut self, index: u64) {
        let r = self.journal.replica_mut().expect("replica");
        let cs = r.replica.conf_state();
        let members: std::collections::BTreeSet<u64> = Replica::members_of(&cs).collect();
        let me = r.replica.id();
        let gone: Vec<u64> = r
            .addrs
            .keys()
            .filter(|id| !members.contains(id))
            .copied()
            .collect();
        for id in gone {
            r.addrs.remove(&id);
            if id != me {
                self.cmds.push(Cmd::PeerLink {
                    node: id,
                    addr: None,
                });
            }
        }
        for (&id, a) in r.addrs.iter().filter(|(&id, _)| id != me) {
            match link_addr(a, r.group) {
                Some(addr) => self.cmds.push(Cmd::PeerLink {
                    node: id,
                    addr: Some(addr),
                }),
                None => log!(
                    Level::Warn,
                    "raft_member_unresolved",
                    "group={} node={} addr={:?}",
                    r.group,
                    id,
                    a
                ),
            }
        }
        log!(
            Level::Info,
            "raft_membership",
            "group={} node={} index={} voters={:?} learners={:?} outgoing={:?}",
            r.group,
            me,
            index,
            sorted(&cs.voters),
            sorted(&cs.learners),
            sorted(&cs.voters_outgoing)
        );
        let member = members.contains(&me);
        if !member && !r.removed {
            log!(
                Level::Warn,
                "raft_removed",
                "group={} node={} index={} action=\"not serving; stop this node\"",
                r.group,
                me,
                index
            );
        }
        r.removed = !member && (index > 0);
    }

    /// `CMEM` on the admin connection in `slot`: every shard's membership,
    /// or at once the empty answer "not a cluster member".
    pub(in crate::shard) fn cluster_members_start(&mut self, slot: u32) {
        if !self.journal.is_replicated() {
            let c = &mut self.conns[slot as usize];
            crate::protocol::members::encode(&[], &mut c.out);
            c.state = State::Answered;
            c.gate_lsn = 0;
            self.mark_dirty(slot);
            return;
        }
        self.scatter(slot, crate::shard::RemoteOp::Members, false);
    }

    /// This shard's part of `CMEM` or `CCHG`.
    pub(in crate::shard) fn members_op(
        &mut self,
        op: &crate::shard::RemoteOp,
    ) -> crate::shard::RemoteResult {
        use crate::shard::{RemoteOp, RemoteResult};
        match op {
            RemoteOp::Members => match self.member_status() {
                Some(m) => RemoteResult::Members(Box::new(m)),
                None => RemoteResult::Failed,
            },
            RemoteOp::ChangeMembers(change) => match self.raft_change(change) {
                Ok(()) => RemoteResult::Done,
                Err(why) => RemoteResult::Refused(why),
            },
            _ => unreachable!("a membership op"),
        }
    }

    /// This shard's membership as it applied it (its part of `CMEM`):
    /// voters, the outgoing voters of a joint change, learners, whether
    /// a change is in progress and whether this node was removed (it
    /// applied its removal, or a peer said a configuration it has not
    /// applied yet excludes it: `Replica::excluded`).
    pub fn member_status(&self) -> Option<crate::protocol::members::MemberStatus> {
        let r = self.journal.replica()?;
        let cs = r.replica.conf_state();
        Some(crate::protocol::members::MemberStatus {
            shard: self.me as u32,
            node: r.replica.id(),
            change_in_progress: r.replica.change_in_progress(),
            removed: r.removed || r.replica.excluded(),
            voters: sorted(&cs.voters),
            outgoing: sorted(&cs.voters_outgoing),
            learners: sorted(&cs.learners),
            addrs: r.addrs.clone(),
        })
    }

    /// Proposes `change` in this shard's group: the very call the admin
    /// port's `CCHG` makes on every shard (through `members_op`),
    /// public for the deterministic simulator (`tests/sim_cluster.rs`),
    /// which plays the admin client itself. `Ok` once proposed (watch
    /// [`Shard::member_status`] for it applied); refusals as for `CCHG`.
    pub fn change_members(
        &mut self,
        change: &crate::protocol::members::Change,
    ) -> Result<(), String> {
        self.raft_change(change)
    }

    /// Proposes `change` in this shard's group, or says why not (the
    /// checks every group makes alike, so that all change together or
    /// none does, as far as one node can see).
    fn raft_change(&mut self, change: &crate::protocol::members::Change) -> Result<(), String> {
        let serving = self.may_serve();
        let g = self.me;
        let Some(r) = self.journal.replica_mut() else {
            return Err("this server is not a cluster member".into());
        };
        let me = r.replica.id();
        if !serving || !r.replica.is_leader() {
            return Err(format!(
                "node {me} does not serve shard {g} (the leader is node {}); ask the serving node",
                r.replica.leader()
            ));
        }
        if r.forced {
            return Err(format!(
                "shard {g}: the log of --force-new-cluster is being rewritten; try again in a moment"
            ));
        }
        let cs = r.replica.conf_state();
        if r.replica.change_in_progress() {
            return Err(format!(
                "shard {g}: another membership change is in progress (voters {:?}, outgoing {:?}); wait until `ringlock cluster status` shows it done",
                cs.voters, cs.voters_outgoing
            ));
        }
        let st = r.replica.status();
        let Some(ChangePlan {
            add,
            as_voter,
            remove,
            context,
        }) = plan_change(change, &cs, &st, &r.addrs, me, g)?
        else {
            return Ok(()); // asked again: already done
        };
        let index = r.replica.propose_change(&add, as_voter, &remove, context)?;
        log!(
            Level::Info,
            "raft_change_proposed",
            "group={} node={} index={} add={:?} as_voter={} remove={:?}",
            g,
            me,
            index,
            add,
            as_voter,
            remove
        );
        self.journal_pump();
        Ok(())
    }
}

/// A membership change as raft-rs takes it: nodes to add (as voters or
/// as learners), nodes to remove, and the entry's context (the added
/// nodes' addresses).
struct ChangePlan {
    add: Vec<u64>,
    as_voter: bool,
    remove: Vec<u64>,
    context: Vec<u8>,
}

/// What `change` asks of group `g` as its configuration `cs` and its
/// followers `st` stand, checked as every group checks it (so that all
/// make it or none does): `Ok(None)` when it is done already (asked
/// again), `Err` why it cannot be made now.
fn plan_change(
    change: &crate::protocol::members::Change,
    cs: &raft::eraftpb::ConfState,
    st: &crate::cluster::replica::ReplicaStatus,
    addrs: &std::collections::BTreeMap<u64, String>,
    me: u64,
    g: usize,
) -> Result<Option<ChangePlan>, String> {
    use crate::protocol::members::Change;
    let group = GroupConf {
        cs,
        st,
        addrs,
        me,
        g,
    };
    match change {
        Change::AddLearner { node, addr } => group.add_learner(*node, addr),
        Change::Promote { node } => group.promote(*node),
        Change::Remove { node } => group.remove(*node),
        Change::Replace { old, new } => group.replace(*old, *new),
    }
}

/// Group `g` as [`plan_change`] checks a change against it: its
/// configuration `cs`, its followers `st`, its members' addresses, and
/// `me`, the node that leads it.
struct GroupConf<'a> {
    cs: &'a raft::eraftpb::ConfState,
    st: &'a crate::cluster::replica::ReplicaStatus,
    addrs: &'a std::collections::BTreeMap<u64, String>,
    me: u64,
    g: usize,
}

impl GroupConf<'_> {
    /// `Ok` when learner `node` has caught up with the commit index (and
    /// is heard from), else why not.
    fn caught_up(&self, node: u64) -> Result<(), String> {
        let (st, g) = (self.st, self.g);
        let f = st.followers.iter().find(|f| f.node == node);
        match f {
            Some(f) if f.matched + CATCH_UP_SLACK >= st.commit && f.active => Ok(()),
            Some(f) => Err(format!(
                "shard {g}: learner {node} has not caught up (it has entries up to {} of {}{})",
                f.matched,
                st.commit,
                if f.active { "" } else { "; not heard from" }
            )),
            None => Err(format!("shard {g}: node {node} is not a learner")),
        }
    }

    fn voter(&self, n: u64) -> bool {
        self.cs.voters.contains(&n)
    }

    fn learner(&self, n: u64) -> bool {
        self.cs.learners.contains(&n)
    }

    /// `Err` when `n`, to leave the voters, is this node, the leader.
    fn leader_gone(&self, n: u64) -> Result<(), String> {
        let me = self.me;
        if n == me {
            Err(format!(
                "node {me} leads; hand leadership over first (ringlock cluster transfer-leader), then ask the new leader"
            ))
        } else {
            Ok(())
        }
    }

    /// `AddLearner`: `node`, at `addr`, joins as a learner (one at a time).
    fn add_learner(&self, node: u64, addr: &str) -> Result<Option<ChangePlan>, String> {
        let (me, g) = (self.me, self.g);
        if self.voter(node) {
            return Err(format!("node {node} is already a voter"));
        }
        if self.learner(node) {
            if self.addrs.get(&node).is_some_and(|a| a == addr) {
                return Ok(None); // asked again: already done
            }
            return Err(format!(
                "node {node} is already a learner at {}",
                self.addrs.get(&node).map_or("?", |a| a.as_str())
            ));
        }
        if let Some(other) = self.cs.learners.first() {
            return Err(format!(
                "learner {other} is still being added; promote or remove it first"
            ));
        }
        if link_addr(addr, g).is_none() {
            return Err(format!(
                "{addr:?} does not resolve to an address (with port) on node {me}"
            ));
        }
        let ctx = store::encode_addrs(&[(node, addr.to_owned())]);
        Ok(Some(ChangePlan {
            add: vec![node],
            as_voter: false,
            remove: vec![],
            context: ctx,
        }))
    }

    /// `Promote`: learner `node`, caught up, becomes a voter.
    fn promote(&self, node: u64) -> Result<Option<ChangePlan>, String> {
        if self.voter(node) {
            return Ok(None); // already done
        }
        self.caught_up(node)?;
        Ok(Some(ChangePlan {
            add: vec![node],
            as_voter: true,
            remove: vec![],
            context: vec![],
        }))
    }

    /// `Remove`: voter or learner `node` leaves (not the last voter, not
    /// the leader).
    fn remove(&self, node: u64) -> Result<Option<ChangePlan>, String> {
        if !self.voter(node) && !self.learner(node) {
            // Asked again after this shard made it: done (the CLI
            // checks first that some shard has the node).
            return Ok(None);
        }
        if self.voter(node) && self.cs.voters.len() == 1 {
            return Err(format!(
                "node {node} is the last voter; a cluster cannot remove its last voter"
            ));
        }
        self.leader_gone(node)?;
        Ok(Some(ChangePlan {
            add: vec![],
            as_voter: false,
            remove: vec![node],
            context: vec![],
        }))
    }

    /// `Replace`: learner `new`, caught up, becomes a voter in voter
    /// `old`'s place (not the leader's), in one joint change.
    fn replace(&self, old: u64, new: u64) -> Result<Option<ChangePlan>, String> {
        if self.voter(new) && !self.voter(old) {
            return Ok(None); // asked again: done
        }
        if !self.voter(old) {
            return Err(format!(
                "node {old} is not a voter (voters {:?})",
                self.cs.voters
            ));
        }
        if self.voter(new) {
            return Err(format!("node {new} is already a voter"));
        }
        self.caught_up(new)?;
        self.leader_gone(old)?;
        Ok(Some(ChangePlan {
            add: vec![new],
            as_voter: true,
            remove: vec![old],
            context: vec![],
        }))
    }
}

fn sorted(ids: &[u64]) -> Vec<u64> {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v
}

/// How far behind the commit index a learner may be and be promoted:
/// under load the entries in flight to it (not yet acknowledged) keep it
/// a few entries behind at any instant; what remains is sent within a
/// heartbeat.
const CATCH_UP_SLACK: u64 = 100;
