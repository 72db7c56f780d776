//! Messages between shards: one bounded single-producer single-consumer
//! queue per ordered pair of shards (`rtrb`, wait-free, no lock), and an
//! `IORING_OP_MSG_RING` doorbell that posts a completion on the receiver's
//! ring so a shard asleep in `io_uring_enter` wakes up. Every request,
//! answer, connection and session a shard hands another goes this way.
//!
//! Besides these queues, shard threads share only counters and flags, none
//! of them a lock table's state: the key and waiter [`Budget`]
//! (`--max-keys`/`--max-waiters` for the whole server: two atomic counts),
//! the connection count of `--max-connections` (`ConnCounts`), each shard's
//! ring fd (this doorbell's target) and the start barrier, the metrics
//! registry (each shard writes its own atomics, the metrics thread reads),
//! the node's certificates (read-only), and in cluster mode the
//! `NodeView` (which node leads each group, which shards serve, each
//! group's applied configuration: atomics, and a `Mutex` per group's
//! configuration). Moving those behind this module is issue #32's.
//!
//! [`Budget`]: crate::core::Budget
//!
//! Backpressure: a message that does not fit in its queue waits in a
//! per-destination outbox, flushed every tick. The outbox is bounded for
//! the messages that can be refused (a connection hand-over is answered
//! `-`, a scatter request fails with `-`); replies always wait (there are
//! at most as many as requests in flight, which connections bound).

use std::collections::VecDeque;
use std::os::fd::RawFd;

use crate::shard::session::SessMsg;
use crate::shard::{Detached, RemoteOp, RemoteResult};

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
