//! The durability gate: nothing leaves the shard that the log could still
//! take back.
//!
//! Three things wait for the shard's log, each keyed by the log sequence
//! number (lsn) of the newest record it depends on:
//! - **held answers**: a connection whose answer is queued but may not be
//!   sent before its record is durable (its `gate_lsn`);
//! - **parked messages**: a scatter/gather part's reply or a session answer
//!   for another shard, which that shard would send at once;
//! - **the undo journal**: how to take back the in-memory effect of each
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
//! The [`Shard`] methods below drive it: `on_log_landed` is told what the
//! log did, [`Shard::gate`] and the other
//! `*_when_durable` helpers put things behind the log, `release_durable`
//! lets through what became durable, `fail_pending` answers `-` and undoes.

use std::collections::VecDeque;

use crate::core::{Extended, HeldKey, HoldMode, Name, Token};
use crate::log::Level;
use crate::wal::log::{Chain, Landed, Next};

use super::conn::State;
use super::msg::SessMsg;
use super::{Cmd, RemoteResult, Shard};

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

/// Held answers, parked messages and the undo journal, each in lsn order.
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

    /// Whether an undo journal entry is still pending.
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
    pub(super) fn journal(&mut self, lsn: u64, u: Undo) {
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

    /// The undo journal, newest first, left in place.
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
            "undo journal out of lsn order"
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

impl Shard {
    /// A log chain landed; its buffer comes back.
    pub fn on_log_landed(&mut self, chain: Chain, result: Result<(), i32>, buf: Vec<u8>) {
        if self.raft.is_some() {
            self.raft_file_landed(chain, result, buf);
            self.apply_effects();
            return;
        }
        let now = self.now;
        let log = self.log.as_mut().expect("log completion without a log");
        match log.landed(chain, result, buf, now.mono_us) {
            Landed::Append {
                records,
                bytes,
                took_us,
            } => {
                self.metrics.observe_fdatasync_us(took_us);
                self.metrics.observe_wal_batch(records, bytes);
                self.release_durable();
            }
            Landed::Rewrite {
                records,
                bytes,
                took_us,
            } => {
                self.metrics.observe_fdatasync_us(took_us);
                self.metrics.observe_wal_batch(records, bytes);
                self.metrics.wal_compaction();
                log!(
                    Level::Info,
                    "compaction_done",
                    "mode=blocking bytes={} held_keys={} duration_us={}",
                    bytes,
                    records,
                    took_us
                );
                self.release_durable();
            }
            Landed::SnapshotDone => {}
            Landed::Compacted {
                bytes,
                snapshot_records,
                carried_records,
                took_us,
            } => {
                self.metrics.wal_compaction();
                log!(
                    Level::Info,
                    "compaction_done",
                    "mode=background bytes={} held_keys={} carried_records={} duration_us={}",
                    bytes,
                    snapshot_records,
                    carried_records,
                    took_us
                );
                self.release_durable();
            }
            Landed::AbandonedDone => self.cmds.push(Cmd::DiscardTemp),
            Landed::Failed { rewrite } => {
                let err = result.err().unwrap_or(0);
                log!(
                    Level::Error,
                    "wal_io_error",
                    "op={} errno={} error=\"{}\" action=\"answering '-' to requests waiting for the log, rewriting it into a new file\"",
                    if rewrite { "rewrite" } else { "append" },
                    -err,
                    crate::log::Escaped(std::io::Error::from_raw_os_error(-err))
                );
                self.metrics.wal_io_error();
                self.fail_pending("log write or fdatasync failed", -err);
            }
            Landed::CompactionFailed { voided } => {
                let err = result.err().unwrap_or(0);
                self.metrics.wal_io_error();
                if voided {
                    // The finishing step held records no other file has.
                    log!(
                        Level::Error,
                        "wal_io_error",
                        "op=compaction step=finish errno={} error=\"{}\" action=\"answering '-' to requests whose records it carried, rewriting the log\"",
                        -err,
                        crate::log::Escaped(std::io::Error::from_raw_os_error(-err))
                    );
                    self.fail_pending("compaction's finishing step failed", -err);
                } else {
                    log!(
                        Level::Warn,
                        "compaction_failed",
                        "step=snapshot errno={} error=\"{}\" action=\"retrying in 1 s; the log itself is unaffected\"",
                        -err,
                        crate::log::Escaped(std::io::Error::from_raw_os_error(-err))
                    );
                }
            }
        }
        self.apply_effects();
    }

    /// The lsn an answer produced now must wait for: `None` when nothing
    /// the log holds is pending (no log, or everything durable).
    pub(super) fn pending_lsn(&self) -> Option<u64> {
        self.log
            .as_ref()
            .filter(|l| l.pending())
            .map(|l| l.tail_lsn())
    }

    /// Holds the connection's output until everything the log holds now is
    /// durable; a reply never reveals state that a crash could take back.
    pub(super) fn gate(&mut self, slot: u32) {
        match self.pending_lsn() {
            Some(lsn) => {
                let token = self.token(slot);
                self.conns[slot as usize].gate_lsn = lsn;
                self.durability.hold(lsn, token);
            }
            None => self.mark_dirty(slot),
        }
    }

    /// Replies to shard `from` once this shard's log is durable.
    pub(super) fn reply_when_durable(&mut self, from: usize, id: u64, result: RemoteResult) {
        match self.pending_lsn() {
            Some(lsn) => self.durability.park(
                lsn,
                Parked::Gather {
                    to: from,
                    id,
                    result,
                },
            ),
            None => self.cmds.push(Cmd::Reply {
                to: from,
                id,
                result,
            }),
        }
    }

    /// Sends a session message to shard `to` once this shard's log is
    /// durable.
    pub(super) fn sess_when_durable(&mut self, to: usize, msg: Box<SessMsg>) {
        match self.pending_lsn() {
            Some(lsn) => self.durability.park(lsn, Parked::Sess { to, msg }),
            None => self.cmds.push(Cmd::Sess { to, msg }),
        }
    }

    /// Records how to undo record `lsn` (durable mode and cluster mode).
    pub(super) fn journal(&mut self, lsn: u64, u: Undo) {
        self.durability.journal(lsn, u);
    }

    /// Closes the log batch: the next chain(s) when nothing is in flight.
    /// No timer: a lone record goes out in the same tick that produced it.
    pub(super) fn wal_tick(&mut self) {
        let now_us = self.now.mono_us;
        loop {
            let Some(log) = self.log.as_mut() else { return };
            match log.next_chain(&mut self.table, now_us) {
                Next::Chain(chain, buf) => {
                    if matches!(chain, Chain::Rewrite | Chain::Snapshot) {
                        log!(
                            Level::Info,
                            "compaction_start",
                            "mode={} log_bytes={} live_bytes={} broken={}",
                            if chain == Chain::Rewrite {
                                "blocking"
                            } else {
                                "background"
                            },
                            log.file_len(),
                            log.live_bytes(),
                            log.broken()
                        );
                    }
                    self.cmds.push(Cmd::Log { chain, buf });
                }
                Next::Propose(buf) => {
                    self.propose(buf);
                    return;
                }
                Next::Idle => return,
                Next::FailPending => {
                    self.fail_pending("log is being rewritten after an I/O error", 0);
                    return;
                }
            }
        }
    }

    /// Lets through every held answer and parked message whose records are
    /// now durable.
    pub(super) fn release_durable(&mut self) {
        let durable = self.log.as_ref().map_or(0, |l| l.durable_lsn());
        while let Some(r) = self.durability.pop_durable(durable) {
            match r {
                Ready::Parked(p) => self.send_parked(p, false),
                Ready::Conn(token) => {
                    if let Some(slot) = self.conn_of(token) {
                        self.mark_dirty(slot);
                    }
                }
            }
        }
    }

    /// Sends a parked message: as it is once durable, or (`failed`, a log
    /// failure voided what it reported) a gather part as Failed and a
    /// session answer as the end of its session.
    fn send_parked(&mut self, p: Parked, failed: bool) {
        match p {
            Parked::Gather { to, id, result } => self.cmds.push(Cmd::Reply {
                to,
                id,
                result: if failed { RemoteResult::Failed } else { result },
            }),
            Parked::Sess { to, msg } => {
                let msg = match *msg {
                    SessMsg::Out { sid, home, .. } if failed => {
                        Box::new(SessMsg::Kill { sid, home })
                    }
                    _ => msg,
                };
                self.cmds.push(Cmd::Sess { to, msg });
            }
        }
    }

    /// Every record past the durable point is void. Requests waiting for
    /// them are answered `-`, their effects undone in reverse log order, and
    /// the log is rewritten into a fresh file before any further `+` (an
    /// fsync error leaves the page cache untrustworthy).
    pub(super) fn fail_pending(&mut self, why: &str, errno: i32) {
        let now = self.now;
        let Some(log) = self.log.as_mut() else { return };
        log.void_for_broken(now.mono_us);
        // A background compaction's snapshot may contain the voided
        // records' effects: abandon it (now, or when its chain lands).
        if log.abort_compaction(&mut self.table) {
            self.cmds.push(Cmd::DiscardTemp);
        }
        let mut answered = 0u64;
        // Sessions whose answers waited: ended once the undo is complete.
        let mut sessions: Vec<u32> = Vec::new();
        while let Some(r) = self.durability.pop_any() {
            let token = match r {
                Ready::Parked(p) => {
                    self.send_parked(p, true);
                    continue;
                }
                Ready::Conn(token) => token,
            };
            if let Some(slot) = self.conn_of(token) {
                let c = &mut self.conns[slot as usize];
                if c.state == State::Session {
                    if !sessions.contains(&slot) {
                        sessions.push(slot);
                    }
                } else if c.state == State::Answered {
                    c.out.clear();
                    c.out.push(b'-');
                    c.grant = None;
                    c.gate_lsn = 0;
                    answered += 1;
                    self.mark_dirty(slot);
                }
            }
        }
        let mut touched: Vec<Name> = Vec::new();
        while let Some(u) = self.durability.pop_undo_newest() {
            match u {
                Undo::Acquire { key, grant_id } => {
                    self.table.undo_grant(&key, grant_id, now);
                    touched.push(key);
                }
                // A session hold's session is ended below (its answer
                // waited for this log) or by its home (Kill): the key stays
                // free, as the end of the session would leave it.
                // (In cluster mode the other replicas still hold it, and a
                // failed proposal only means this node stopped leading: it
                // is restored below like any hold, owned by nobody.)
                Undo::Release { prev } if prev.mode == HoldMode::Session && self.raft.is_none() => {
                    touched.push(prev.key);
                }
                Undo::Extend(x) => {
                    self.table
                        .set_expiry(&x.key, x.grant_id, x.prev_unix_ms, x.prev_mono_us);
                }
                Undo::Proclaim { prev } => {
                    self.table
                        .set_source(&prev.key, prev.grant_id, prev.source.as_bytes());
                }
                Undo::SessionOpen { sid } => {
                    self.table.session_closed(sid);
                }
                Undo::SessionEnd { sid, keepalive_ms } => {
                    self.table.session_opened(sid, keepalive_ms);
                }
                Undo::Release { prev } => {
                    // The key is free again here: later records were undone.
                    if !self.table.restore_holder(&prev, now) {
                        // A limit of the table, or a semaphore whose n a
                        // request queued since fixed otherwise.
                        log!(
                            Level::Error,
                            "undo_failed",
                            "key={:?} token={} reason=\"the released holder could not be put back: a table limit, or a semaphore n fixed otherwise by a request queued since\"",
                            prev.key,
                            prev.grant_id
                        );
                    }
                }
            }
        }
        log!(
            // Nothing was voided and no I/O failed (a proposal failed with
            // nothing in it, as when a stopping leader hands over): no
            // news. A storage failure is always said (tests/wal_faults.rs
            // waits for it).
            if errno == 0 && answered == 0 && touched.is_empty() {
                Level::Debug
            } else {
                Level::Warn
            },
            "wal_records_voided",
            "reason=\"{}\" errno={} answered_minus={} undone_records={}",
            crate::log::Escaped(why),
            errno,
            answered,
            touched.len()
        );
        for key in &touched {
            self.table.settle(key, now, &mut self.fx);
        }
        if let Some(log) = self.log.as_mut() {
            log.recount_live(&self.table);
        }
        // New grants from settling are new records for the rewritten log.
        self.apply_effects();
        if self.raft.is_some() {
            // What was undone (an end of a session, a release) left session
            // holds and sessions without a window: armed when the node
            // serves again.
            self.rearm_when_serving();
        }
        for slot in sessions {
            if self.raft.is_some() {
                // Cluster mode: what was undone was never committed, and a
                // replicated session itself is in the log: its client
                // resumes it (on this node once it serves again, or on the
                // next leader) and learns from the Held list what it has.
                self.detach_session(slot, "its answers were not committed");
            } else {
                self.end_session(slot, "the log failed under one of its answers");
            }
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
        g.journal(1, Undo::SessionOpen { sid: 1 });
        g.journal(4, Undo::SessionOpen { sid: 4 });
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
