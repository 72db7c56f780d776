//! The mesh between one node's shards.
//!
//! As `tests/sim_shards.rs` models it: cross-shard messages (scatter/gather
//! parts and replies, session requests, answers and ends, connection
//! hand-overs) are queued FIFO per ordered pair of shards, as the real
//! queues are, and delivered one at a time from a random non-empty pair,
//! so reordered across pairs, at the node's next tick (`node.rs`). The
//! queues live in the node's memory: a crash loses them (and every
//! connection handed over in them sees EOF). A node with one shard never
//! queues anything, and then the mesh draws nothing from the seed's
//! generator.
//!
//! With several shards per node (`World::groups`, see `shards.rs`):
//! - each shard is the replica of its own group, all started with one
//!   shared `NodeView::new(groups)` (`start_node`), group g's Hello linked
//!   to group g of every other node; group g's Raft frames go to group g
//!   of the peer (the packet carries its group), its log to its own disk;
//! - `Cmd::Migrate` (a Locking-Center request naming another shard's key,
//!   a Resume reaching a shard other than its session's home): the
//!   connection is detached at the node's next tick (its receive is back),
//!   travels as `Msg::Adopt`, is adopted and resumed on the owner; bytes
//!   the client sends meanwhile wait for it; clients track (node, shard,
//!   token);
//! - session requests for another shard's keys travel as `Msg::Sess`,
//!   `ResetBySource` as a scatter/gather.
//!
//! Not modelled: a shard's loop stalling alone (a node pauses or crashes
//! as a whole), a full queue (`limit=shard_queue`), the link to one group
//! of a peer failing while its other groups' stay up (the network cuts
//! links between nodes, for every group at once).

use std::collections::{BTreeMap, VecDeque};

use ringlock::shard::session::SessMsg;
use ringlock::shard::{Detached, RemoteOp, RemoteResult, Shard};

use super::sim_common::Rng;

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
