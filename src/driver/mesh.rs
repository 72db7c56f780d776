//! Everything shard threads share. They share nothing except through
//! this module: its queues and doorbells, which carry every request,
//! answer, connection and session one shard hands another, and
//! [`Shared`], the one handle to what they hold in common, built once by
//! `Server::bind` and given to every shard thread.
//!
//! Messages: one bounded single-producer single-consumer queue per
//! ordered pair of shards (`rtrb`, wait-free, no lock), and an
//! `IORING_OP_MSG_RING` doorbell that posts a completion on the receiver's
//! ring so a shard asleep in `io_uring_enter` wakes up.
//!
//! [`Shared`] holds only what a message cannot do, none of it a lock
//! table's state; each field says why it is an atomic, a `Mutex` or
//! read-only instead of a message:
//! - each shard's ring fd and the start barrier (the doorbells' targets:
//!   needed before any message can be sent);
//! - the key and waiter [`Budget`] (`--max-keys`/`--max-waiters` for the
//!   whole server: two atomic counts) and the connection count of
//!   `--max-connections` ([`ConnCounts`]): each limit is the server's,
//!   checked at once by the shard that would add a key, a waiter or a
//!   connection (a message would add a round trip to each);
//! - in cluster mode the [`NodeView`] (which node leads each group, which
//!   shards serve, each group's applied configuration: atomics, and a
//!   `Mutex` per group's configuration): what every shard reads of the
//!   other groups on its own requests;
//! - the metrics registry (atomics the shards write, read by the metrics
//!   endpoint's thread, which has no ring): the one item made elsewhere,
//!   by `Server::bind`'s caller, which gives it to that thread too;
//! - the node's certificates (read at each accept and dial; replaced whole
//!   on SIGHUP by shard 0: a `Mutex` and a generation atomic);
//! - the generation counter of accepted peer links (one atomic).
//!
//! The shard layer does not see this module (`src/shard` does not import
//! the driver): start-up (`start.rs`) hands it clones of what it uses out
//! of [`Shared`] — the [`Budget`] in each shard's table, the [`NodeView`]
//! in each group's replica, the [`ConnCounts`] through `Shard::place`, the
//! metrics through `Shard::new`.
//!
//! The only other things shard threads touch in common are process-wide
//! leaves below every layer, none of them shard state: the log level (set
//! by the binary before the shards start) and stderr's lock (one per log
//! line), the thread that closes replaced log files (`wal::retire`: a
//! channel behind a `Mutex`), the read-only zero mapping preallocation
//! writes from (`wal::zeros`), the TLS crypto provider (built once,
//! read-only), and the kernel's `SO_REUSEPORT` group of each port.
//!
//! [`Budget`]: crate::core::Budget
//! [`ConnCounts`]: crate::shard::ConnCounts
//! [`NodeView`]: crate::shard::raft::NodeView
//!
//! Backpressure: a message that does not fit in its queue waits in a
//! per-destination outbox, flushed every tick. The outbox is bounded for
//! the messages that can be refused (a connection hand-over is answered
//! `-`, a scatter request fails with `-`); replies always wait (there are
//! at most as many as requests in flight, which connections bound).

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, Barrier};

use super::certs::Certs;
use crate::core::{Budget, Limits};
use crate::metrics::Metrics;
use crate::shard::raft::NodeView;
use crate::shard::session::SessMsg;
use crate::shard::{ConnCounts, Detached, RemoteOp, RemoteResult};

/// Slots per queue (per ordered pair of shards).
pub const QUEUE_SLOTS: usize = 1024;
/// Refusable messages waiting beyond a full queue, per destination.
pub const OUTBOX_MAX: usize = 4096;

#[derive(Debug)]
pub enum Msg {
    /// A connection moves to the shard that owns its next request's key.
    Adopt {
        fd: RawFd,
        conn: Detached,
        /// A TLS connection's session state (its keys and buffers).
        tls: Option<Box<super::clienttls_state::ConnTls>>,
    },
    /// Run a scatter/gather part and reply.
    Request {
        from: usize,
        id: u64,
        op: RemoteOp,
    },
    Reply {
        id: u64,
        result: RemoteResult,
    },
    /// Session traffic (requests, answers, ends): never refused, since
    /// a lost End would leave a session's hold behind.
    Sess(Box<SessMsg>),
    /// Shutdown (SIGINT/SIGTERM reached another shard).
    Stop,
}

/// One shard's ends of the mesh.
pub struct MeshEnd {
    pub me: usize,
    tx: Vec<Option<rtrb::Producer<Msg>>>,
    rx: Vec<Option<rtrb::Consumer<Msg>>>,
    outbox: Vec<VecDeque<Msg>>,
    /// Destinations that got messages since the last doorbell.
    pub to_ring: Vec<bool>,
}

/// The ends of a mesh of `n` shards, indexed by shard.
pub fn build(n: usize) -> Vec<MeshEnd> {
    let mut ends: Vec<MeshEnd> = (0..n)
        .map(|me| MeshEnd {
            me,
            tx: (0..n).map(|_| None).collect(),
            rx: (0..n).map(|_| None).collect(),
            outbox: (0..n).map(|_| VecDeque::new()).collect(),
            to_ring: vec![false; n],
        })
        .collect();
    for from in 0..n {
        for to in 0..n {
            if from != to {
                let (p, c) = rtrb::RingBuffer::new(QUEUE_SLOTS);
                ends[from].tx[to] = Some(p);
                ends[to].rx[from] = Some(c);
            }
        }
    }
    ends
}

impl MeshEnd {
    pub fn shards(&self) -> usize {
        self.tx.len()
    }

    /// Sends `msg` to shard `to`. A refusable message (hand-over, request)
    /// comes back as `Err` when the destination is too far behind.
    pub fn send(&mut self, to: usize, msg: Msg) -> Result<(), Msg> {
        debug_assert_ne!(to, self.me);
        self.to_ring[to] = true;
        let refusable = matches!(msg, Msg::Adopt { .. } | Msg::Request { .. });
        if self.outbox[to].is_empty() {
            let tx = self.tx[to].as_mut().expect("a queue to every other shard");
            match tx.push(msg) {
                Ok(()) => return Ok(()),
                Err(rtrb::PushError::Full(m)) => {
                    self.outbox[to].push_back(m);
                    return Ok(());
                }
            }
        }
        if refusable && self.outbox[to].len() >= OUTBOX_MAX {
            return Err(msg);
        }
        self.outbox[to].push_back(msg);
        Ok(())
    }

    /// Moves waiting messages into their queues as space allows.
    pub fn flush(&mut self) {
        for to in 0..self.outbox.len() {
            while let Some(m) = self.outbox[to].pop_front() {
                let tx = self.tx[to].as_mut().expect("a queue to every other shard");
                match tx.push(m) {
                    Ok(()) => self.to_ring[to] = true,
                    Err(rtrb::PushError::Full(m)) => {
                        self.outbox[to].push_front(m);
                        break;
                    }
                }
            }
        }
    }

    /// True while messages wait for queue space (the loop must come back).
    pub fn backlogged(&self) -> bool {
        self.outbox.iter().any(|o| !o.is_empty())
    }

    /// Takes every message that arrived, from every shard.
    pub fn drain(&mut self, out: &mut Vec<Msg>) {
        for rx in self.rx.iter_mut().flatten() {
            while let Ok(m) = rx.pop() {
                out.push(m);
            }
        }
    }
}

/// What the shard threads of one server share besides the queues (see the
/// module): built once by `Server::bind`, one `Arc` of it per shard.
pub struct Shared {
    /// Each shard's ring fd, the doorbells' targets: -1 until the shard
    /// has tried to build its ring, -2 if it could not. Atomics: every
    /// shard publishes its own before the start barrier and reads the
    /// others' after it (a message needs the fd to be sent).
    ring_fds: Vec<AtomicI32>,
    /// Every shard waits here for the others' ring fds before it runs.
    start: Barrier,
    /// `--max-keys`/`--max-waiters` for the whole server: two atomic
    /// counts, taken by the shard that creates a key or a waiter (a
    /// compare-and-swap, never above the limit) and given back by the one
    /// that frees it. A message to a keeper of the count would make every
    /// new key wait a round trip.
    pub(super) budget: Budget,
    /// `--max-connections`: the open connections of every shard, per port
    /// (atomics, checked at each accept, on the accepting shard, for the
    /// same reason).
    pub(super) conns: Arc<ConnCounts>,
    /// Cluster mode: what this node's shards tell each other of their
    /// groups. Atomics (leader, serving, voter, a peer's exclusion
    /// notice per group) that a shard writes as its group changes (a
    /// notice: as it comes, on any group's link) and every shard reads
    /// on its own requests and ticks (the node serves only while every
    /// shard does); each group's applied configuration is a member list,
    /// under a `Mutex` (written at a membership change, read when a peer
    /// is told of it).
    pub(super) view: Option<Arc<NodeView>>,
    /// The metrics registry (given by `Server::bind`'s caller), also read
    /// by the metrics endpoint's thread, which has no ring to get a
    /// message: atomics, most of them one shard's own.
    pub(super) metrics: Arc<Metrics>,
    /// `--certs-dir`: read at each accept and dial, replaced whole on
    /// SIGHUP by shard 0 (a `Mutex` and a generation atomic; see
    /// [`Certs`]).
    pub(super) certs: Option<Arc<Certs>>,
    /// The generation of the next accepted peer link (one counter for the
    /// node's shards; relaxed: it only tells one link's completions from
    /// an earlier link's in the same slot).
    peer_link_gen: AtomicU32,
}

impl Shared {
    /// The state `shards` shard threads share: `limits` for the budget, a
    /// [`NodeView`] of `shards` groups for a cluster node.
    pub(super) fn new(
        shards: usize,
        limits: Limits,
        cluster: bool,
        metrics: Arc<Metrics>,
        certs: Option<Arc<Certs>>,
    ) -> Arc<Shared> {
        Arc::new(Shared {
            ring_fds: (0..shards).map(|_| AtomicI32::new(-1)).collect(),
            start: Barrier::new(shards),
            // One budget for every shard: the limits are the server's.
            budget: Budget::new(limits),
            conns: Arc::new(Default::default()),
            view: cluster.then(|| NodeView::new(shards)),
            metrics,
            certs,
            peer_link_gen: AtomicU32::new(1),
        })
    }

    /// Publishes shard `me`'s ring fd (-2: it has none), waits until every
    /// shard has, and tells whether every shard has a ring.
    pub(super) fn start(&self, me: usize, ring_fd: RawFd) -> bool {
        self.ring_fds[me].store(ring_fd, Ordering::Release);
        self.start.wait();
        !self.ring_fds.iter().any(|f| f.load(Ordering::Acquire) < 0)
    }

    /// Shard `to`'s ring fd, a doorbell's target.
    pub(super) fn ring_fd(&self, to: usize) -> RawFd {
        self.ring_fds[to].load(Ordering::Acquire)
    }

    /// A generation for an accepted peer link.
    pub(super) fn next_peer_link_gen(&self) -> u32 {
        self.peer_link_gen.fetch_add(1, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_arrive_in_order_per_pair_and_overflow_waits() {
        let mut ends = build(2);
        let (a, b) = ends.split_at_mut(1);
        let (a, b) = (&mut a[0], &mut b[0]);
        for i in 0..(QUEUE_SLOTS as u64 + 10) {
            a.send(
                1,
                Msg::Reply {
                    id: i,
                    result: RemoteResult::Done,
                },
            )
            .unwrap();
        }
        assert!(a.backlogged(), "the overflow waits in the outbox");
        let mut got = Vec::new();
        b.drain(&mut got);
        assert_eq!(got.len(), QUEUE_SLOTS);
        a.flush();
        assert!(!a.backlogged());
        b.drain(&mut got);
        let ids: Vec<u64> = got
            .iter()
            .map(|m| match m {
                Msg::Reply { id, .. } => *id,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(ids, (0..(QUEUE_SLOTS as u64 + 10)).collect::<Vec<_>>());
    }

    #[test]
    fn refusable_messages_are_refused_past_the_outbox_bound() {
        let mut ends = build(2);
        let a = &mut ends[0];
        let mut refused = 0;
        for i in 0..(QUEUE_SLOTS + OUTBOX_MAX + 5) as u64 {
            if a.send(
                1,
                Msg::Request {
                    from: 0,
                    id: i,
                    op: RemoteOp::KeysClose { stream: 0 },
                },
            )
            .is_err()
            {
                refused += 1;
            }
        }
        assert_eq!(refused, 5);
        // A reply is never refused.
        assert!(a
            .send(
                1,
                Msg::Reply {
                    id: 0,
                    result: RemoteResult::Done
                }
            )
            .is_ok());
    }
}
