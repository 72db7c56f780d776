//! The checks made after every step, per group: each shard of a node
//! is a replica of its own group, so logs and tables compare group g
//! across nodes, a key's holders are the ones on the shard owning it
//! (`owner(key, groups)`) of the serving node, and grant ids grow per
//! group; a node serves when every one of its shards serves.
//!
//! Lock modes (issue #33): the clients believing they hold a key at one
//! instant can all be right (one access, an exclusive one alone, at most
//! `n` of a semaphore); each believed hold is one of the serving owner's
//! holders, with its token and access; and while one node serves, its
//! table against the previous check (`sim_common::check_key`: exclusive
//! alone, at most `n`, a holder's access unchanged, new tokens above the
//! key's largest, the queue in arrival order, no grant past an earlier
//! waiter). Tables compared across nodes compare accesses too.

use std::collections::BTreeMap;

use ringlock::core::{Access, HoldMode};
use ringlock::shard::owner;

use super::{resume, World, KEEPALIVE_MS, KEYS};
use crate::sim_common::{check_believers, check_key, Belief, KeySeen};

impl World {
    /// The shard (group) owning key `k`.
    pub(super) fn owner(&self, k: usize) -> usize {
        owner(KEYS[k], self.groups)
    }

    /// State machine safety: committed entries of each group agree on
    /// every node.
    fn check_logs(&mut self, g: usize) {
        // Each running node's committed terms, from its snapshot (entries
        // a snapshot replaced are gone from memory): (node, first, terms).
        let logs: Vec<(usize, u64, Vec<Option<u64>>)> = (0..self.nodes.len())
            .filter_map(|i| {
                let r = self.nodes[i].shard(g)?.replica()?;
                let from = r.snapshot_index().max(1);
                let terms = (from..=r.commit_index()).map(|x| r.term_at(x)).collect();
                Some((i, from, terms))
            })
            .collect();
        for i in 0..self.nodes.len() {
            // The newest snapshot is where the log in memory starts
            // (raft-rs says term 0 for an index outside the log).
            let Some(r) = self.nodes[i].shard(g).and_then(|s| s.replica()) else {
                continue;
            };
            let snap = r.snapshot_index();
            if snap > 0 && r.term_at(snap) == Some(0) {
                self.fail(format!(
                    "node {}'s newest snapshot of group {g} ({snap}) is not where its log starts",
                    i + 1
                ));
            }
        }
        for (a, (i, fi, ti)) in logs.iter().enumerate() {
            for (j, fj, tj) in &logs[a + 1..] {
                let from = *fi.max(fj);
                let upto = (fi + ti.len() as u64).min(fj + tj.len() as u64);
                for idx in from..upto {
                    let (x, y) = (ti[(idx - fi) as usize], tj[(idx - fj) as usize]);
                    if x != y {
                        self.fail(format!(
                            "group {g}'s committed entry {idx} differs: node {} has term {x:?}, node {} term {y:?}",
                            i + 1,
                            j + 1,
                        ));
                    }
                }
            }
        }
    }

    /// Every node whose shard of group `g` is its applied state (nothing
    /// of its own waiting for a commit) holds exactly what that shard of
    /// any other node at the same applied index holds.
    fn check_tables(&mut self, g: usize) {
        // applied index → (the first node seen there, its (key, grant, access)s)
        type Held = Vec<(Vec<u8>, u64, Access)>;
        let mut seen: BTreeMap<u64, (usize, Held)> = BTreeMap::new();
        for i in 0..self.nodes.len() {
            let Some(s) = self.nodes[i].shard(g) else {
                continue;
            };
            let Some(r) = s.replica() else { continue };
            if s.log().is_some_and(|l| l.pending()) || r.raft_applied() != r.applied_index() {
                continue;
            }
            let mut held: Held = s
                .table()
                .held_list()
                .iter()
                .map(|h| (h.key.as_bytes().to_vec(), h.grant_id, h.access))
                .collect();
            held.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
            match seen.get(&r.applied_index()) {
                Some((j, other)) if *other != held => self.fail(format!(
                    "group {g}'s tables differ at applied index {}: node {} holds {:?}, node {} holds {:?}",
                    r.applied_index(),
                    j + 1,
                    other,
                    i + 1,
                    held
                )),
                Some(_) => {}
                None => {
                    seen.insert(r.applied_index(), (i, held));
                }
            }
        }
    }

    /// Which node's shard leads each group, and how often that changed.
    fn note_group_leaders(&mut self) {
        for g in 0..self.groups {
            // The leader of the newest term (a deposed one may not know yet).
            let l = (0..self.nodes.len())
                .filter_map(|i| {
                    let r = self.nodes[i].shard(g)?.replica()?;
                    r.is_leader().then(|| (r.term(), i))
                })
                .max()
                .map(|(_, i)| i);
            if l.is_some() && l != self.group_leader[g] {
                if self.group_leader[g].is_some() {
                    self.group_failovers[g] += 1;
                }
                self.group_leader[g] = l;
            }
        }
    }

    pub(super) fn check(&mut self) {
        for g in 0..self.groups {
            self.check_logs(g);
            self.check_tables(g);
        }
        self.note_group_leaders();
        // key → its believers (client, belief); a Locking-Center client's
        // belief is exclusive, its token unknown (0).
        let mut owner: BTreeMap<usize, Vec<(usize, Belief)>> = BTreeMap::new();
        let now = self.now;
        let ka = KEEPALIVE_MS as u64 * 1000;
        for (c, cl) in self.clients.iter().enumerate() {
            let believed: Vec<(usize, Belief)> =
                if cl.session && cl.res.resuming && !resume::gap_belief() {
                    Vec::new()
                } else if cl.session {
                    cl.view
                        .holds
                        .iter()
                        .filter(|(_, b)| cl.view.valid(b, now, ka))
                        .map(|(&k, &b)| (k, b))
                        .collect()
                } else {
                    let lc = Belief {
                        token: 0,
                        mode: HoldMode::Persistent,
                        until_us: u64::MAX,
                        access: Access::Exclusive,
                    };
                    cl.beliefs.iter().map(|&k| (k, lc)).collect()
                };
            for (k, b) in believed {
                owner.entry(k).or_default().push((c, b));
            }
        }
        for (&k, bs) in &owner {
            if let Err(e) = check_believers(KEYS[k], bs) {
                self.fail(e);
            }
        }
        let serving: Vec<usize> = (0..self.nodes.len()).filter(|&i| self.serves(i)).collect();
        if serving.len() > 1 {
            self.fail(format!(
                "nodes {serving:?} (0-based) serve at the same time"
            ));
        }
        let Some(&i) = serving.first() else {
            self.seen_on = None;
            return;
        };
        self.check_server_is_voter(i);
        if self.last_leader != Some(i) {
            if self.last_leader.is_some() {
                self.failovers += 1;
            }
            self.last_leader = Some(i);
        }
        for s in &self.nodes[i].shards {
            s.check_invariants();
        }
        self.check_keys(i);
        for (&k, bs) in &owner {
            let o = self.owner(k);
            let s = self.nodes[i].shard(o).expect("running");
            let holders = s.table().holders_of(KEYS[k]);
            for &(c, b) in bs {
                let cl = &self.clients[c];
                if cl.session {
                    let token = b.token;
                    if !holders
                        .iter()
                        .any(|(h, a)| h.grant_id == token && *a == b.access)
                    {
                        self.fail(format!(
                            "lost grant: session client {c} holds {:?} with token {token} ({:?}) \
                             but node {} (shard {o}) serves with {:?}",
                            String::from_utf8_lossy(KEYS[k]),
                            b.access,
                            i + 1,
                            holders
                                .iter()
                                .map(|(h, a)| (h.grant_id, h.mode, *a))
                                .collect::<Vec<_>>()
                        ));
                    }
                    self.check_lease_bound(i, k, c);
                    continue;
                }
                let src = &cl.source;
                if !holders
                    .iter()
                    .any(|(h, a)| h.source.as_bytes() == src.as_slice() && *a == Access::Exclusive)
                {
                    self.fail(format!(
                        "lost grant: client {c} holds {:?} but node {} (shard {o}) serves with \
                         holders {:?}",
                        String::from_utf8_lossy(KEYS[k]),
                        i + 1,
                        holders
                            .iter()
                            .map(|(h, a)| (String::from_utf8_lossy(h.source.as_bytes()), *a))
                            .collect::<Vec<_>>()
                    ));
                }
            }
        }
        // No shard other than a key's owner holds it.
        for (k, key) in KEYS.iter().enumerate() {
            let o = self.owner(k);
            for (g, s) in self.nodes[i].shards.iter().enumerate() {
                if g != o && s.table().holder_of(key).is_some() {
                    self.fail(format!(
                        "{:?} held on shard {g} of node {}, owned by shard {o}",
                        String::from_utf8_lossy(key),
                        i + 1
                    ));
                }
            }
        }
        for g in 0..self.groups {
            let next = self.nodes[i].shards[g].table().next_grant_id();
            if next <= self.max_acked_grant[g] {
                self.fail(format!(
                    "tokens went back: node {} (group {g}) would grant {next} after {} was answered",
                    i + 1,
                    self.max_acked_grant[g]
                ));
            }
        }
    }

    /// The serving node `i`'s tables against what the previous check saw
    /// while it served in the same term (anything else starts afresh: a
    /// new leader's queue is its own, and a grant another node made and
    /// never committed may have a token this one hands out again).
    fn check_keys(&mut self, i: usize) {
        let terms: Vec<u64> = self.nodes[i]
            .shards
            .iter()
            .map(|s| s.replica().map_or(0, |r| r.term()))
            .collect();
        let at = (i, self.nodes[i].incarnation, terms);
        if self.seen_on.as_ref() != Some(&at) {
            self.seen_on = Some(at);
            for seen in &mut self.seen {
                self.modes.add_seen(seen);
                *seen = KeySeen::default();
            }
        }
        for (k, key) in KEYS.iter().enumerate() {
            let o = self.owner(k);
            let table = self.nodes[i].shards[o].table();
            if let Err(e) = check_key(table, key, &mut self.seen[k]) {
                self.fail(format!("node {} (shard {o}): {e}", i + 1));
            }
        }
    }
}
