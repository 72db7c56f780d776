//! Membership changes in the cluster simulation, made as an operator
//! makes them with `ringlock cluster replace`/`remove`/`add` (docs/cluster.md,
//! "Changing the membership"): every step, the serving leader is asked the
//! next change (`Shard::change_members`, the call behind the admin port's
//! `CCHG`, made inside one of its ticks as the admin connection's would
//! be), and asked again while it refuses for a passing reason (a change in
//! progress, a learner not caught up, not serving) or lost the proposal
//! to a leader change, until it is made: the configuration of the serving
//! node (which applied everything committed before its term) shows it
//! done, with no change in progress, as `ringlock cluster` reads it.
//! - **replace** voter `old` (at random, possibly down, never the leader:
//!   a leader that is to go is asked to hand over first) by a fresh node:
//!   the spare slot starts with `--join` and an empty disk, is added as a
//!   learner, then swapped for `old` in one joint change (`Replace`);
//!   once made, `old` runs on for up to 1.5 s (faults may crash and
//!   restart it from its disk meanwhile) until the operator stops it:
//!   its disk is wiped (frames in flight to it dropped) and it never runs
//!   again; a new spare slot (a new id) takes its place (one or two
//!   replacements a run);
//! - **remove and add back** (5 nodes, so 4 voters stay): `Remove`; once
//!   made the node runs on a while as above, then is stopped, its disk
//!   wiped, and it starts again under its id with `--join`:
//!   `AddLearner`, `Promote`.
//!
//! So a wiped disk never comes back as a member that had acknowledged
//! anything: a removed node is gone for good, or rejoins as a learner
//! that must catch up; every check of the main file (two owners, a lost
//! grant, tokens, logs, tables) runs unchanged over whatever nodes run.
//!
//! A refusal the CLI would not retry fails the run.

use ringlock::protocol::members::{Change, MemberStatus};

use super::{addr, World};

/// The change in progress (slots, not node ids).
pub enum Memb {
    Idle,
    /// `old` is being removed; it comes back with an empty disk.
    Removing {
        old: usize,
    },
    /// The `--join` node in slot `new` is being added, as `old`'s
    /// replacement or (None) as a new voter.
    Adding {
        new: usize,
        old: Option<usize>,
    },
    /// `old` was removed but runs on (and may restart from its disk)
    /// until the operator stops it, at `until`; then its disk is wiped
    /// and it joins again (`rejoin`) or never runs again.
    Leaving {
        old: usize,
        until: u64,
        rejoin: bool,
    },
}

/// What the leader is asked at its next tick.
pub enum Ask {
    Change(Change),
    /// Hand leadership over (it leads and is the one to go).
    Transfer,
}

fn id(slot: usize) -> u64 {
    slot as u64 + 1
}

/// `node` is in the configuration at all (voter, outgoing, learner).
fn in_conf(ms: &MemberStatus, node: u64) -> bool {
    ms.voters.contains(&node) || ms.outgoing.contains(&node) || ms.learners.contains(&node)
}

impl World {
    /// The voter sets a quorum is needed of while the change in progress
    /// is made: the voters before it, and after it.
    pub(super) fn voter_sets(&self) -> Vec<Vec<usize>> {
        let before = self.voters.clone();
        let after: Vec<usize> = match self.memb {
            Memb::Idle | Memb::Leaving { .. } => return vec![before],
            Memb::Removing { old } => before.iter().copied().filter(|&v| v != old).collect(),
            Memb::Adding { new, old } => before
                .iter()
                .copied()
                .filter(|&v| Some(v) != old)
                .chain([new])
                .collect(),
        };
        vec![before, after]
    }

    /// Slot `i` may be (re)started: a voter, the node being added, a
    /// removed one not yet stopped for good; not the spare, not a node
    /// whose disk was wiped.
    pub(super) fn startable(&self, i: usize) -> bool {
        !self.nodes[i].retired
            && (self.voters.contains(&i)
                || matches!(self.memb, Memb::Adding { new, .. } if new == i)
                || matches!(self.memb, Memb::Leaving { old, .. } if old == i))
    }

    fn note(&mut self, what: String) {
        if super::trace() {
            eprintln!("t={} membership: {what}", self.now);
        }
        self.memb_log.push(format!("t={} {what}", self.now));
    }

    /// The next membership step: start a change now and then, see whether
    /// the one in progress is done, else ask the leader for it again.
    pub(super) fn memb_step(&mut self, quiesce: bool) {
        self.ask.clear();
        let idle = matches!(self.memb, Memb::Idle);
        if idle && (quiesce || self.replaces_left + self.readds_left == 0) {
            return;
        }
        if idle || matches!(self.memb, Memb::Leaving { .. }) {
            return self.memb_idle(quiesce);
        }
        // Each group decides alone, and the change is made once every
        // group made it, as the serving node shows it (as `ringlock
        // cluster` reads it: CMEM of the node that serves every shard):
        // each of its shards applied its own term's first entry, so every
        // entry committed before its term, and its configuration is the
        // newest known committed. Not the running node that applied the
        // most: that view goes back when the nodes that applied a change
        // crash (the commit index is volatile; a restarted node applies
        // again only what a leader says is committed), and the
        // configuration before a removal then looks like the node added
        // back (seed 8337).
        let Some(l) = (0..self.nodes.len()).find(|&i| self.serves(i)) else {
            return;
        };
        let done = |g: usize| {
            let Some(m) = self.members_of(l, g) else {
                return false;
            };
            if m.change_in_progress {
                return false;
            }
            match self.memb {
                Memb::Removing { old } => !in_conf(&m, id(old)),
                Memb::Adding { new, old } => {
                    m.voters.contains(&id(new))
                        && m.outgoing.is_empty()
                        && old.is_none_or(|o| !in_conf(&m, id(o)))
                }
                Memb::Idle | Memb::Leaving { .. } => true,
            }
        };
        let pending: Vec<usize> = (0..self.groups).filter(|&g| !done(g)).collect();
        if !pending.is_empty() {
            // Asked again of every group not done, as the CLI does.
            return self.memb_ask_next(l, &pending);
        }
        match self.memb {
            Memb::Idle | Memb::Leaving { .. } => unreachable!("handled by memb_idle"),
            Memb::Removing { old } => {
                // Committed: no longer a voter; it runs on a while.
                self.note(format!("node {} removed", id(old)));
                self.voters.retain(|&v| v != old);
                self.changes_done += 1;
                self.leave(old, true);
            }
            Memb::Adding { new, old } => {
                self.voters.push(new);
                self.voters.sort_unstable();
                self.changes_done += 1;
                match old {
                    Some(o) => {
                        self.note(format!("node {} replaced by {}", id(o), id(new)));
                        self.voters.retain(|&v| v != o);
                        self.leave(o, false);
                    }
                    None => {
                        self.note(format!("node {} is a voter again", id(new)));
                        self.memb = Memb::Idle;
                    }
                }
            }
        }
    }

    /// No change in progress: start one now and then; or a removed node
    /// running on: stop it once its time is up.
    fn memb_idle(&mut self, quiesce: bool) {
        match self.memb {
            Memb::Idle => {
                if quiesce || !self.rng.chance(4) {
                    return;
                }
                if let Some(l) = (0..self.nodes.len()).find(|&i| self.serves(i)) {
                    self.memb_start(l);
                }
            }
            Memb::Leaving { until, .. } if self.now < until => {}
            Memb::Leaving { old, rejoin, .. } => {
                // The operator stops it and empties its disk.
                self.wipe(old);
                if rejoin {
                    self.note(format!("node {} wiped, joins again", id(old)));
                    self.nodes[old].join = true;
                    self.memb = Memb::Adding {
                        new: old,
                        old: None,
                    };
                    self.start_node(old);
                } else {
                    self.note(format!("node {} wiped, gone for good", id(old)));
                    self.nodes[old].retired = true;
                    self.memb = Memb::Idle;
                }
            }
            Memb::Removing { .. } | Memb::Adding { .. } => unreachable!("a change in progress"),
        }
    }

    /// The removed `old` runs on for up to 1.5 s before the operator stops
    /// it (a removed node must neither serve nor disturb the others).
    fn leave(&mut self, old: usize, rejoin: bool) {
        let until = self.now + self.rng.below(1_500_000);
        self.memb = Memb::Leaving { old, until, rejoin };
    }

    /// Stops node `i` for good and empties its disk. Frames in flight to
    /// it die with its links: a process started on the empty disk is
    /// reached on new links only (a peer link's queue is emptied when it
    /// is dialed again), never by what was sent to the one it replaces.
    fn wipe(&mut self, i: usize) {
        self.crash(i);
        self.nodes[i].disks.iter_mut().for_each(Vec::clear);
        self.net.retain(|p| p.to != i);
    }

    /// What the serving leader `l` is asked next, of each group in
    /// `pending` (the ones that did not make the change yet).
    fn memb_ask_next(&mut self, l: usize, pending: &[usize]) {
        // A leader that is to go hands over (group 0; the other groups
        // follow its leader).
        let going = match self.memb {
            Memb::Removing { old } => l == old,
            Memb::Adding { old, .. } => old == Some(l),
            Memb::Idle | Memb::Leaving { .. } => unreachable!("nothing to ask"),
        };
        for &g in pending {
            let ms = self.members_of(l, g).expect("a cluster node");
            let change = match self.memb {
                Memb::Idle | Memb::Leaving { .. } => unreachable!("nothing to ask"),
                Memb::Removing { old } => Change::Remove { node: id(old) },
                Memb::Adding { new, .. } if !in_conf(&ms, id(new)) => Change::AddLearner {
                    node: id(new),
                    addr: addr(new).to_string(),
                },
                Memb::Adding { new, old: Some(o) } => Change::Replace {
                    old: id(o),
                    new: id(new),
                },
                Memb::Adding { new, old: None } => Change::Promote { node: id(new) },
            };
            // Only a change that removes the leader waits for the hand-over.
            let removes = matches!(change, Change::Remove { .. } | Change::Replace { .. });
            if going && removes {
                self.ask.push((l, 0, Ask::Transfer));
                return;
            }
            self.ask.push((l, g, Ask::Change(change)));
        }
    }

    /// Starts a change: replace a voter other than the leader `l`, or
    /// remove it to add it back.
    fn memb_start(&mut self, l: usize) {
        let others: Vec<usize> = self.voters.iter().copied().filter(|&v| v != l).collect();
        let old = others[self.rng.below(others.len() as u64) as usize];
        let readd = self.readds_left > 0
            && self.voters.len() >= 4
            && (self.replaces_left == 0 || self.rng.chance(500));
        if readd {
            self.readds_left -= 1;
            self.note(format!("remove node {} to add it back", id(old)));
            self.memb = Memb::Removing { old };
        } else if self.replaces_left > 0 {
            self.replaces_left -= 1;
            // The spare joins; a new spare (a new id) waits behind it.
            let new = self.nodes.len() - 1;
            self.nodes.push(super::Node::new(true, self.groups));
            self.note(format!("replace node {} by node {}", id(old), id(new)));
            self.memb = Memb::Adding {
                new,
                old: Some(old),
            };
            self.start_node(new);
        }
    }

    /// Node `i`'s tick: asks what [`World::memb_step`] chose of it, if
    /// anything.
    pub(super) fn memb_ask(&mut self, i: usize) {
        let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(&mut self.ask)
            .into_iter()
            .partition(|a| a.0 == i);
        self.ask = others;
        for (_, g, ask) in mine {
            self.memb_ask_group(i, g, ask);
        }
    }

    fn memb_ask_group(&mut self, i: usize, g: usize, ask: Ask) {
        let s = &mut self.nodes[i].shards[g];
        let change = match ask {
            Ask::Transfer => {
                if s.transfer_leadership(0) {
                    self.note(format!("node {} leads and is to go: hands over", i + 1));
                }
                return;
            }
            Ask::Change(c) => c,
        };
        match s.change_members(&change) {
            Ok(()) => self.note(format!("node {} (group {g}) took {change:?}", i + 1)),
            Err(why) => {
                // What `ringlock cluster` asks again: a change in progress,
                // a learner catching up, a leader that stopped serving.
                let passing = ["in progress", "has not caught up", "does not serve"];
                if !passing.iter().any(|p| why.contains(p)) {
                    self.fail(format!(
                        "node {} (group {g}) refused {change:?}: {why}",
                        i + 1
                    ));
                }
            }
        }
    }

    /// A serving node is a voter of the membership the changes made (or
    /// the node being added), and one in its own configuration.
    pub(super) fn check_server_is_voter(&mut self, i: usize) {
        let adding = matches!(self.memb, Memb::Adding { new, .. } if new == i);
        if !self.voters.contains(&i) && !adding {
            self.fail(format!(
                "node {} serves but is not a voter (voters {:?})",
                i + 1,
                self.voters.iter().map(|&v| id(v)).collect::<Vec<_>>()
            ));
        }
        for g in 0..self.groups {
            let ms = self.members_of(i, g).expect("a cluster node");
            if ms.removed || !(ms.voters.contains(&id(i)) || ms.outgoing.contains(&id(i))) {
                self.fail(format!(
                    "node {} serves outside group {g}'s configuration: {ms:?}",
                    i + 1
                ));
            }
        }
    }

    /// At the end, once quiet: every running node has applied the same
    /// membership, the one the changes made, and none is in a change.
    pub(super) fn check_membership_agrees(&mut self) {
        let want: Vec<u64> = self.voters.iter().map(|&v| id(v)).collect();
        let deadline = self.now + 3_000_000;
        loop {
            let views: Vec<MemberStatus> = (0..self.nodes.len())
                .flat_map(|i| (0..self.groups).map(move |g| (i, g)))
                .filter_map(|(i, g)| self.members_of(i, g))
                .collect();
            let agree = views.iter().all(|m| {
                m.voters == want
                    && m.outgoing.is_empty()
                    && m.learners.is_empty()
                    && !m.change_in_progress
                    && !m.removed
            });
            if agree && views.len() == want.len() * self.groups {
                return;
            }
            if self.now > deadline {
                let leader: Vec<String> = (0..self.nodes.len())
                    .flat_map(|i| self.nodes[i].shards.iter())
                    .filter_map(|s| s.replica())
                    .filter(|r| r.is_leader())
                    .map(|r| format!("{:?}", r.status()))
                    .collect();
                self.fail(format!(
                    "the membership differs 3 s after quiet: want voters {want:?}, nodes have {views:?}; leader: {leader:?}"
                ));
            }
            self.step(true);
        }
    }
}
