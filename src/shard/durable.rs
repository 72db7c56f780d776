//! The shard's side of the durability gate ([`super::gate::Gate`]):
//! `on_log_landed` is told what the log did, [`Shard::gate`] and the other
//! `*_when_durable` helpers put things behind the log, `release_durable`
//! lets through what became durable, `fail_pending` answers `-` and undoes.

use crate::core::{HoldMode, Name};
use crate::log::Level;
use crate::wal::log::{Chain, Landed, Next};

use super::cmd::Cmd;
use super::conn::State;
use super::gate::{Parked, Ready, Undo, Voided};
use super::msg::{RemoteResult, SessMsg};
use super::Shard;

impl Shard {
    /// A log chain landed; its buffer comes back.
    pub fn on_log_landed(&mut self, chain: Chain, result: Result<(), i32>, buf: Vec<u8>) {
        if self.journal.is_replicated() {
            self.replica_log_landed(chain, result, buf);
        } else {
            self.local_log_landed(chain, result, buf);
        }
        self.apply_effects();
    }

    /// A chain of the local log landed: what became durable is let
    /// through, a failure voids what was pending, compaction goes on.
    fn local_log_landed(&mut self, chain: Chain, result: Result<(), i32>, buf: Vec<u8>) {
        let now = self.now;
        let log = self
            .journal
            .records_mut()
            .expect("log completion without a log");
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
                self.fail_pending(Voided::LogFailed, "log write or fdatasync failed", -err);
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
                    self.fail_pending(
                        Voided::LogFailed,
                        "compaction's finishing step failed",
                        -err,
                    );
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
    }

    /// The lsn an answer produced now must wait for: `None` when nothing
    /// the log holds is pending (no log, or everything durable).
    pub(super) fn pending_lsn(&self) -> Option<u64> {
        self.journal
            .records()
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
    pub(super) fn undo_on_failure(&mut self, lsn: u64, u: Undo) {
        self.durability.undo_on_failure(lsn, u);
    }

    /// Closes the log batch: the next chain(s) when nothing is in flight.
    /// No timer: a lone record goes out in the same tick that produced it.
    pub(super) fn wal_tick(&mut self) {
        let now_us = self.now.mono_us;
        loop {
            let Some(log) = self.journal.records_mut() else {
                return;
            };
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
                    self.fail_pending(
                        Voided::LogFailed,
                        "log is being rewritten after an I/O error",
                        0,
                    );
                    return;
                }
            }
        }
    }

    /// Lets through every held answer and parked message whose records are
    /// now durable.
    pub(super) fn release_durable(&mut self) {
        let durable = self.journal.durable_lsn();
        while let Some(r) = self.durability.pop_durable(durable) {
            match r {
                Ready::Parked(p) => self.send_parked(p, None),
                Ready::Conn(token) => {
                    if let Some(slot) = self.conn_of(token) {
                        self.mark_dirty(slot);
                    }
                }
            }
        }
    }

    /// Sends a parked message: as it is once durable, or (`voided`: what
    /// it reported was undone) a gather part as Failed and a session
    /// answer as the end of its session (`Kill`) — or, when leadership was
    /// lost, as its detaching (`Detach`: the session lives on).
    fn send_parked(&mut self, p: Parked, voided: Option<Voided>) {
        match p {
            Parked::Gather { to, id, result } => self.cmds.push(Cmd::Reply {
                to,
                id,
                result: if voided.is_some() {
                    RemoteResult::Failed
                } else {
                    result
                },
            }),
            Parked::Sess { to, msg } => {
                let msg = match (*msg, voided) {
                    (SessMsg::Out { sid, home, .. }, Some(Voided::LogFailed)) => {
                        Box::new(SessMsg::Kill { sid, home })
                    }
                    (SessMsg::Out { sid, home, .. }, Some(Voided::LeadershipLost)) => {
                        Box::new(SessMsg::Detach { sid, home })
                    }
                    (msg, _) => Box::new(msg),
                };
                self.cmds.push(Cmd::Sess { to, msg });
            }
        }
    }

    /// Every record past the durable point is void. Requests waiting for
    /// them are answered `-`, their effects undone in reverse log order, and
    /// the log is rewritten into a fresh file before any further `+` (an
    /// fsync error leaves the page cache untrustworthy).
    pub(super) fn fail_pending(&mut self, cause: Voided, why: &str, errno: i32) {
        let now = self.now;
        let Some(log) = self.journal.records_mut() else {
            return;
        };
        log.void_for_broken(now.mono_us);
        // A background compaction's snapshot may contain the voided
        // records' effects: abandon it (now, or when its chain lands).
        if log.abort_compaction(&mut self.table) {
            self.cmds.push(Cmd::DiscardTemp);
        }
        let (answered, sessions) = self.answer_voided(cause);
        let touched = self.undo_voided(cause);
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
        if let Some(log) = self.journal.records_mut() {
            log.recount_live(&self.table);
        }
        // New grants from settling are new records for the rewritten log.
        self.apply_effects();
        if cause == Voided::LeadershipLost {
            // What was undone (an end of a session, a release) left session
            // holds and sessions without a window: armed when the node
            // serves again.
            self.rearm_when_serving();
        }
        for slot in sessions {
            match cause {
                // What was undone was never committed, and a replicated
                // session itself is in the log: its client resumes it (on
                // this node once it serves again, or on the next leader)
                // and learns from the Held list what it has.
                Voided::LeadershipLost => {
                    self.detach_session(slot, "its answers were not committed")
                }
                Voided::LogFailed => {
                    self.end_session(slot, "the log failed under one of its answers")
                }
            }
        }
    }

    /// The voided records' waiters: connections answered `-` (counted),
    /// parked messages sent as failed, and the sessions whose answers
    /// waited (dealt with once the undo is complete).
    fn answer_voided(&mut self, cause: Voided) -> (u64, Vec<u32>) {
        let mut answered = 0u64;
        let mut sessions: Vec<u32> = Vec::new();
        while let Some(r) = self.durability.pop_any() {
            let token = match r {
                Ready::Parked(p) => {
                    self.send_parked(p, Some(cause));
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
        (answered, sessions)
    }

    /// Undoes the voided records' effects on the table, newest first;
    /// returns the keys to settle.
    fn undo_voided(&mut self, cause: Voided) -> Vec<Name> {
        let now = self.now;
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
                // (When leadership was lost the other replicas still hold
                // it: it is restored below like any hold, owned by nobody.)
                Undo::Release { prev }
                    if prev.mode == HoldMode::Session && cause == Voided::LogFailed =>
                {
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
        touched
    }
}
