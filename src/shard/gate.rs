//! The durability gate: nothing leaves the shard that the log could still
//! take back.
//!
//! Three things wait for the shard's log, each keyed by the log sequence
//! number (lsn) of the newest record it depends on:
//! - **held answers**: a connection whose answer is queued but may not be
//!   sent before its record is durable (its `gate_lsn`);
//! - **parked messages**: a scatter/gather part's reply or a session answer
//!   for another shard, which that shard would send at once;
//! - **the undo list**: how to take back the in-memory effect of each
//!   record not yet durable, should the log fail (or, in cluster mode, the
//!   proposal be lost).
//!
//! [`Gate`] owns all three. Its invariant, asserted on every push (one
//! compare) and whole by [`Gate::check`]: each queue's lsns never decrease
//! (records are appended in order, so durability frees a prefix), and every
//! parked message is referenced by exactly one held entry. Durability frees
//! a prefix ([`Gate::pop_durable`]); a failure voids everything
//! ([`Gate::pop_any`], then [`Gate::pop_undo_newest`]).
//!
//! The shard drives it from `durable.rs`.

use std::collections::VecDeque;

use crate::core::{Extended, HeldKey, Name, Token};

use super::msg::{RemoteResult, SessMsg};

/// A message for another shard that waits for this shard's log.
pub(super) enum Parked {
    /// A scatter/gather part's reply.
    Gather {
        to: usize,
        id: u64,
        result: RemoteResult,
    },
    /// A session answer or Lost push for the session's home shard.
    Sess { to: usize, msg: Box<SessMsg> },
}

/// How to take back the in-memory effect of a log record that never became
/// durable.
#[derive(Clone, Copy, Debug)]
pub(super) enum Undo {
    Acquire {
        key: Name,
        grant_id: u64,
    },
    Release {
        prev: HeldKey,
    },
    Extend(Extended),
    /// A proclaim: the holder as it was (its old source).
    Proclaim {
        prev: HeldKey,
    },
    /// A replicated session opened (its SessionOpen record).
    SessionOpen {
        sid: u64,
    },
    /// A replicated session ended (its SessionEnd record).
    SessionEnd {
        sid: u64,
        keepalive_ms: u32,
    },
}

/// Why the records past the durable point were voided (what
/// `Shard::fail_pending` is told; the journal's events).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Voided {
    /// The local log could not write them (or is being rewritten after
    /// an I/O error): they are gone, and a session whose answer waited for
    /// them ends (its holds left as the end of the session leaves them).
    LogFailed,
    /// This node lost its group's leadership before they were committed
    /// (stepped down, its proposal overwritten by a newer leader's, or its
    /// log replaced by a leader's snapshot): the group's other replicas
    /// keep what was committed, and a replicated session lives on,
    /// detached — its client resumes it on the next leader.
    LeadershipLost,
}

/// One held entry: a connection's answer, or a parked message (its index).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waiting {
    Conn(Token),
    Parked(u32),
}

/// What the gate lets through.
pub(super) enum Ready {
    /// The connection's answer may be sent (if it is still there).
    Conn(Token),
    /// A parked message, to be sent (or failed).
    Parked(Parked),
}

/// Held answers, parked messages and the undo list, each in lsn order.
#[derive(Default)]
pub(super) struct Gate {
    held: VecDeque<(u64, Waiting)>,
    /// Slab of parked messages (entries are small; messages are not).
    parked: Vec<Option<Parked>>,
    undo: VecDeque<(u64, Undo)>,
}

impl Gate {
    /// A gate with room for `held` answers and `undo` journal entries
    /// before it allocates (the hot path does not).
    pub(super) fn with_capacity(held: usize, undo: usize) -> Self {
        Gate {
            held: VecDeque::with_capacity(held),
            parked: Vec::new(),
            undo: VecDeque::with_capacity(undo),
        }
    }

    /// Answers and messages waiting for the log.
    pub(super) fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether an undo list entry is still pending.
    #[cfg(test)]
    fn undo_is_empty(&self) -> bool {
        self.undo.is_empty()
    }

    fn push_held(&mut self, lsn: u64, w: Waiting) {
        if let Some(&(last, _)) = self.held.back() {
            assert!(
                lsn >= last,
                "held answer for lsn {lsn} after one for {last}"
            );
        }
        self.held.push_back((lsn, w));
    }

    /// The answer of connection `token` waits for record `lsn`.
    pub(super) fn hold(&mut self, lsn: u64, token: Token) {
        self.push_held(lsn, Waiting::Conn(token));
    }

    /// A message for another shard waits for record `lsn`.
    pub(super) fn park(&mut self, lsn: u64, p: Parked) {
        let i = match self.parked.iter().position(Option::is_none) {
            Some(i) => {
                self.parked[i] = Some(p);
                i
            }
            None => {
                self.parked.push(Some(p));
                self.parked.len() - 1
            }
        };
        self.push_held(lsn, Waiting::Parked(i as u32));
    }

    /// How to undo record `lsn`, kept until it is durable.
    pub(super) fn undo_on_failure(&mut self, lsn: u64, u: Undo) {
        if let Some(&(last, _)) = self.undo.back() {
            assert!(lsn >= last, "undo entry for lsn {lsn} after one for {last}");
        }
        self.undo.push_back((lsn, u));
    }

    fn take(&mut self, w: Waiting) -> Ready {
        match w {
            Waiting::Conn(t) => Ready::Conn(t),
            Waiting::Parked(i) => Ready::Parked(
                self.parked[i as usize]
                    .take()
                    .expect("a held entry's parked message"),
            ),
        }
    }

    /// The next entry whose records are all durable (`lsn ≤ durable`);
    /// forgets the undo entries of durable records first.
    pub(super) fn pop_durable(&mut self, durable: u64) -> Option<Ready> {
        while self.undo.front().is_some_and(|&(lsn, _)| lsn <= durable) {
            self.undo.pop_front();
        }
        match self.held.front() {
            Some(&(lsn, w)) if lsn <= durable => {
                self.held.pop_front();
                Some(self.take(w))
            }
            _ => None,
        }
    }

    /// The next held entry, durable or not (the log failed), oldest first.
    pub(super) fn pop_any(&mut self) -> Option<Ready> {
        let (_, w) = self.held.pop_front()?;
        Some(self.take(w))
    }

    /// The newest undo entry (undone in reverse log order).
    pub(super) fn pop_undo_newest(&mut self) -> Option<Undo> {
        self.undo.pop_back().map(|(_, u)| u)
    }

    /// The undo list, newest first, left in place.
    pub(super) fn undo_newest_first(&self) -> impl Iterator<Item = &Undo> {
        self.undo.iter().rev().map(|(_, u)| u)
    }

    /// The whole invariant (tests and the simulator).
    pub(super) fn check(&self) {
        fn sorted(mut v: impl Iterator<Item = u64>) -> bool {
            let mut last = 0;
            v.all(|l| {
                let ok = l >= last;
                last = l;
                ok
            })
        }
        assert!(
            sorted(self.held.iter().map(|&(l, _)| l)),
            "held answers out of lsn order"
        );
        assert!(
            sorted(self.undo.iter().map(|&(l, _)| l)),
            "undo list out of lsn order"
        );
        let mut refs = vec![0u32; self.parked.len()];
        for &(_, w) in &self.held {
            if let Waiting::Parked(i) = w {
                refs[i as usize] += 1;
            }
        }
        for (i, (p, n)) in self.parked.iter().zip(refs).enumerate() {
            assert_eq!(
                u32::from(p.is_some()),
                n,
                "parked message {i} is referenced {n} times"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(r: Option<Ready>) -> Option<Token> {
        match r {
            Some(Ready::Conn(t)) => Some(t),
            Some(Ready::Parked(_)) => panic!("a parked message"),
            None => None,
        }
    }

    #[test]
    fn durability_frees_a_prefix_in_order() {
        let mut g = Gate::default();
        g.hold(3, 30);
        g.park(
            3,
            Parked::Gather {
                to: 1,
                id: 7,
                result: RemoteResult::Failed,
            },
        );
        g.hold(5, 50);
        g.check();
        assert_eq!(conn(g.pop_durable(2)), None);
        assert_eq!(conn(g.pop_durable(4)), Some(30));
        assert!(matches!(
            g.pop_durable(4),
            Some(Ready::Parked(Parked::Gather { id: 7, .. }))
        ));
        assert_eq!(conn(g.pop_durable(4)), None);
        g.check();
        assert_eq!(g.len(), 1);
        assert_eq!(conn(g.pop_any()), Some(50));
        assert_eq!(g.len(), 0);
    }

    #[test]
    fn a_parked_slot_is_reused_and_referenced_once() {
        let mut g = Gate::default();
        let p = || Parked::Gather {
            to: 0,
            id: 1,
            result: RemoteResult::Failed,
        };
        g.park(1, p());
        assert!(g.pop_durable(1).is_some());
        g.park(2, p());
        assert_eq!(g.parked.len(), 1, "the freed slot is reused");
        g.check();
    }

    #[test]
    fn undo_entries_of_durable_records_are_forgotten() {
        let mut g = Gate::default();
        g.undo_on_failure(1, Undo::SessionOpen { sid: 1 });
        g.undo_on_failure(4, Undo::SessionOpen { sid: 4 });
        assert!(g.pop_durable(2).is_none());
        let left: Vec<_> = g.undo_newest_first().collect();
        assert!(matches!(left[..], [Undo::SessionOpen { sid: 4 }]));
        assert!(matches!(
            g.pop_undo_newest(),
            Some(Undo::SessionOpen { sid: 4 })
        ));
        assert!(g.undo_is_empty());
    }

    #[test]
    #[should_panic(expected = "after one for")]
    fn an_answer_for_an_older_record_after_a_newer_one_is_refused() {
        let mut g = Gate::default();
        g.hold(5, 1);
        g.hold(4, 2);
    }
}
