//! A shard's forwarding state ([`Forwards`]): a follower's requests
//! waiting for the leader, a leader's slots serving other nodes'
//! requests, and the links they came on. `forward.rs` keeps the rules.

use std::collections::{BTreeMap, BTreeSet};

use crate::core::Token;
use crate::shard::conn::Conn;

/// Forwarding state of one shard (both sides).
#[derive(Default)]
pub(in crate::shard) struct Forwards {
    /// Follower: forwarded requests waiting for their answer, by id.
    pub(super) waiting: BTreeMap<u64, Waiting>,
    pub(super) next_id: u64,
    /// Leader: the slots serving other nodes' requests, by `(node, id)`.
    pub(super) serving: BTreeMap<(u64, u64), u32>,
    /// Live links from each node (a leader's answers come on its link).
    pub(super) inbound: BTreeMap<u64, u32>,
    /// Nodes whose link from this shard is ready to carry a request (its
    /// TLS handshake done): a Forward is queued only there, so that one
    /// that cannot leave this node stays parked (nothing was done) instead
    /// of meeting a link still dialing and being given up.
    pub(super) ready: BTreeSet<u64>,
}

/// A follower's request waiting for the leader.
pub(in crate::shard) struct Waiting {
    pub(super) token: Token,
    /// The node it was sent to; 0 while parked (no leader known yet, or
    /// the node it went to said it does not serve): nothing done anywhere.
    pub(super) node: u64,
    /// The Locking-Center request as the client sent it.
    pub(super) req: Vec<u8>,
    pub(super) client: std::net::SocketAddr,
    /// Parked past this (mono µs): answered `-`.
    pub(super) until_us: u64,
    /// Not sent again before this (after a refusal).
    pub(super) retry_us: u64,
    /// Sent to a node that is no longer the leader this node knows: its
    /// answer is awaited until this (mono µs; 0 while it went to the
    /// leader), then the request fails.
    pub(super) orphan_us: u64,
}

impl Waiting {
    /// Nothing was done with it where it went: parked again, not sent
    /// before `retry_us`.
    pub(super) fn park_again(&mut self, retry_us: u64) {
        self.node = 0;
        self.orphan_us = 0;
        self.retry_us = retry_us;
    }
}

impl Forwards {
    /// The parked requests (sent nowhere yet), oldest first.
    pub(super) fn parked(&self) -> impl Iterator<Item = (u64, &Waiting)> {
        self.waiting
            .iter()
            .filter(|(_, w)| w.node == 0)
            .map(|(&id, w)| (id, w))
    }

    /// How long a request waits for a leader, in election timeouts: long
    /// enough for an election and the new leader's first commit, so that
    /// a failover costs a client of a follower a wait, not an error.
    pub(super) const PARK_ELECTIONS: u64 = 3;

    /// How long a request sent to a node that is no longer the leader
    /// waits for that node's answer, in replication ticks. A leader that
    /// stopped serving (stepped down, or stopping and handing over)
    /// answers at once — `not leader` parks the request again for the
    /// new leader, a withdrawn Lock is `-`, a decided one is still
    /// answered — so a hand-over costs the client nothing; only a node
    /// that is silent this long leaves the outcome unknown.
    pub(super) const ORPHAN_TICKS: u64 = 3;

    /// Ids start at the start time in µs: a restarted follower's ids are
    /// not an earlier run's (answers never outlive a link, but cheaply so).
    pub(in crate::shard) fn start(&mut self, unix_ms: u64) {
        self.next_id = unix_ms.saturating_mul(1000).max(1);
    }

    /// Every slot serving a forwarded request is known by its id, and
    /// nothing else is.
    pub(in crate::shard) fn check(&self, conns: &[Conn]) {
        let slots = conns.iter().filter(|c| c.live() && c.fwd.is_some()).count();
        assert_eq!(slots, self.serving.len(), "forwarded slots drifted");
        for (&(node, id), &slot) in &self.serving {
            assert_eq!(
                conns[slot as usize].fwd,
                Some((node, id)),
                "forwarded request {id} of node {node} is not its slot's"
            );
        }
    }
}
