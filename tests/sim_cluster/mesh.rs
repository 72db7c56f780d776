//! The mesh between one node's shards (groundwork for more than one
//! shard per node; see below for what is left).
//!
//! As `tests/sim_shards.rs` models it: cross-shard messages (scatter/gather
//! parts and replies, session requests, answers and ends, connection
//! hand-overs) are queued FIFO per ordered pair of shards, as the real
//! queues are, and delivered one at a time from a random non-empty pair,
//! so reordered across pairs. The queues live in the node's memory: a
//! crash loses them. A node with one shard never queues anything, and
//! then the mesh draws nothing from the seed's generator (the runs of one
//! shard per node are those of before).
//!
//! Left to do for two shards per node (`World::groups`, 1 for now):
//! - `Node` holds one `Shard` and one disk image per group; `start_node`
//!   starts every group's `Part` (`Part::start(&c, g, groups, ..)`) with one
//!   shared `NodeView::new(groups)`, `place(g, groups, ..)`, and links
//!   group g's Hello to group g of every other node;
//! - `Cmd::Peer` from group g goes to group g of the peer (the packet
//!   carries its group), `Cmd::Log` to that group's disk, a crash tears
//!   each group's write in flight and clears this mesh;
//! - `Cmd::Migrate` (a request naming another shard's key): the client's
//!   connection is detached, travels as `Msg::Adopt`, is adopted and
//!   resumed on the owner (bytes and hang-ups arriving meanwhile), as in
//!   `sim_shards.rs`; clients then track (node, shard, token);
//! - the checks per group: logs and tables compare group g across nodes;
//!   a key's holder is looked up on the shard `owner(key, groups)` of the
//!   serving node; "tokens only grow" per group; a node serves when
//!   `view.all_serving()` (every shard leads and holds its lease) — the
//!   "one server" check is unchanged;
//! - membership changes are asked of every group's leader until all made
//!   (`memb.rs`: each group decides alone; the CLI asks again), resumes
//!   (`resume.rs`) reach the session's home shard.

use std::collections::{BTreeMap, VecDeque};

use ringlock::shard::session::SessMsg;
use ringlock::shard::{Detached, RemoteOp, RemoteResult, Shard};

use super::sim_common::Rng;

#[allow(dead_code)] // Adopt and Sess travel once a node runs two shards
pub enum Msg {
    /// A connection handed over to the shard owning its request's key.
    Adopt {
        client: usize,
        d: Detached,
    },
    Request {
        from: usize,
        id: u64,
        op: RemoteOp,
    },
    Reply {
        id: u64,
        result: RemoteResult,
    },
    Sess(Box<SessMsg>),
}

/// One node's intra-node queues: FIFO per ordered pair of shards.
#[derive(Default)]
pub struct Mesh {
    queues: BTreeMap<(usize, usize), VecDeque<Msg>>,
}

impl Mesh {
    pub fn send(&mut self, from: usize, to: usize, m: Msg) {
        self.queues.entry((from, to)).or_default().push_back(m);
    }

    /// The node crashed: what its queues held is gone.
    pub fn clear(&mut self) {
        self.queues.clear();
    }

    /// The next message from a random non-empty pair: `(to, message)`.
    /// Draws from `rng` only when there is one.
    pub fn pick(&mut self, rng: &mut Rng) -> Option<(usize, Msg)> {
        let pairs: Vec<(usize, usize)> = self
            .queues
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(p, _)| *p)
            .collect();
        if pairs.is_empty() {
            return None;
        }
        let (from, to) = pairs[rng.below(pairs.len() as u64) as usize];
        let m = self
            .queues
            .get_mut(&(from, to))
            .and_then(VecDeque::pop_front)
            .expect("non-empty");
        Some((to, m))
    }

    /// `Cmd::Scatter` from shard `s` of `groups`: a part to every other
    /// shard through the queues, its own part at once.
    pub fn scatter(&mut self, shard: &mut Shard, s: usize, groups: usize, id: u64, op: RemoteOp) {
        for t in (0..groups).filter(|&t| t != s) {
            self.send(
                s,
                t,
                Msg::Request {
                    from: s,
                    id,
                    op: op.clone(),
                },
            );
        }
        shard.on_remote(s, id, op);
    }

    /// `Cmd::Reply` from shard `s`: to itself at once, else queued.
    pub fn reply(&mut self, shard: &mut Shard, s: usize, to: usize, id: u64, result: RemoteResult) {
        if to == s {
            shard.on_reply(id, result);
        } else {
            self.send(s, to, Msg::Reply { id, result });
        }
    }

    /// Delivers `m` to shard `to` (its driver's tick); an `Adopt` is the
    /// caller's (it tracks the client), handed back.
    pub fn deliver(to: &mut Shard, m: Msg) -> Option<(usize, Detached)> {
        match m {
            Msg::Request { from, id, op } => to.on_remote(from, id, op),
            Msg::Reply { id, result } => to.on_reply(id, result),
            Msg::Sess(msg) => to.on_sess(msg),
            Msg::Adopt { client, d } => return Some((client, d)),
        }
        None
    }
}
