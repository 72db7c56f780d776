//! Replicated sessions and their resumption (cluster mode;
//! `docs/protocol.md`, "Resuming a session").
//!
//! A session opened by a serving leader whose every peer can read session
//! records is *replicated*: its id has [`REPLICATED_SESSION`] set, its
//! opening and end are records of its home shard's group (SessionOpen,
//! SessionEnd: the table's `sessions_homed`), and every hold it takes is a
//! SessionHold record naming it, in the key's group. A follower therefore
//! holds each such hold for the session (an owner entry tagged
//! [`ORPHAN`](crate::core::table::ORPHAN)), and a new leader can give the holds back to the session's
//! client when it sends a Resume.
//!
//! Rules this file keeps:
//! - **A failover keeps the session, a close ends it.** Only a leader that
//!   steps down (or whose owner shard stepped down) lets a session go
//!   without ending it (`detach`); a connection that closes, fails or
//!   times out on a serving leader ends its session as on a single node.
//! - **The resume window is never shorter than the client's.** When a
//!   shard starts serving, and again when its node serves after a spell in
//!   which it did not (another group of the node lost its leader and won it
//!   back, while this shard's group led throughout: `rearm`), every session
//!   homed here that no connection has is kept for its keep-alive plus an
//!   election timeout, and every orphan owner entry for the longest
//!   keep-alive plus an election timeout (the owner does not know the
//!   session's own); both count from after the old leader's last answer. A
//!   session detached or orphaned while its node serves gets its window
//!   then; one detached while it does not, when it serves again. After that
//!   the session ends as on a keep-alive expiry (a proposed SessionEnd and
//!   releases). Every session left without a connection gets a window:
//!   none is kept for ever.
//! - **A resume answers what is durable.** Each shard answers the home's
//!   Adopt with the session's holds through its own durability gate, like
//!   any answer; the home writes the Held frames and the welcome once every
//!   shard has answered.
//! - **One connection per session.** A Resume of a session another
//!   connection still has takes it over: that connection is closed without
//!   ending the session, and its queued requests are dropped unanswered
//!   (the client sends them again).

pub(super) mod registry;

use std::cmp::Reverse;

use super::cmd::Cmd;
use super::conn::State;
use super::gate::Undo;
use super::msg::HeldOut;
use super::session::{home_of, Opening, SessMsg};
use super::Shard;
use crate::core::{HoldMode, Name, Token, REPLICATED_SESSION};
use crate::log::Level;
use crate::protocol::session::{self as sp, Status};
use registry::Pending;

impl Shard {
    /// Whether a session opened now is replicated: a cluster node whose
    /// every peer announced that it reads session records.
    pub(super) fn sessions_replicated(&self) -> bool {
        self.journal.sessions_replicated()
    }

    /// A Hello opened replicated session `sid` on `slot`: its SessionOpen
    /// record (the welcome waits for it like any answer).
    pub(super) fn open_replicated(&mut self, sid: u64, keepalive_ms: u32, token: Token) {
        self.table.session_opened(sid, keepalive_ms);
        if let Some(log) = self.journal.records_mut() {
            let lsn = log.append_session_open(sid, keepalive_ms);
            self.undo_on_failure(lsn, Undo::SessionOpen { sid });
        }
        self.resumes.attached.insert(sid, token);
    }

    /// Replicated session `sid` ends (its client closed, its keep-alive
    /// passed, its resume window passed): its SessionEnd record.
    pub(super) fn close_replicated(&mut self, sid: u64) {
        self.resumes.attached.remove(&sid);
        if let Some(ka) = self.table.session_closed(sid) {
            if let Some(log) = self.journal.records_mut() {
                let lsn = log.append_session_end(sid);
                self.undo_on_failure(
                    lsn,
                    Undo::SessionEnd {
                        sid,
                        keepalive_ms: ka,
                    },
                );
            }
        }
    }

    /// A connection's first frame is a Resume. False when more bytes are
    /// needed or nothing more is to be read (refused, moved, gathering).
    pub(super) fn resume_first(&mut self, slot: u32) -> bool {
        let Some((rid, Opening::Resume { session_id: sid }, len)) = self.opening(slot) else {
            return false;
        };
        let home = home_of(sid);
        if sid & REPLICATED_SESSION != 0 && home != self.me && home < self.shards {
            // The frame stays in the buffer: the home shard decodes it.
            let token = self.token(slot);
            self.conns[slot as usize].state = State::Migrating;
            self.cmds.push(Cmd::Migrate { token, to: home });
            return false;
        }
        let known = sid & REPLICATED_SESSION != 0 && home == self.me;
        let Some(ka) = self
            .table
            .session_keepalive(sid)
            .filter(|_| known && self.journal.is_replicated())
        else {
            log!(
                Level::Info,
                "resume_refused",
                "session={:#x} peer={} reason=\"unknown session\"",
                sid,
                self.conns[slot as usize].peer
            );
            self.refuse_plain(slot, rid, Status::UnknownSession);
            return false;
        };
        // Another connection still has it: it is taken over.
        if let Some(old) = self
            .resumes
            .attached
            .get(&sid)
            .and_then(|&t| self.session_conn(sid, t))
        {
            let c = &mut self.conns[old as usize];
            c.sid = 0;
            c.dead = true;
            c.read_closed = true;
            c.out.clear();
            self.close(old);
        }
        let token = self.token(slot);
        let now_us = self.now.mono_us;
        let c = &mut self.conns[slot as usize];
        c.rbuf.drain(..len);
        c.persistent = true;
        c.sid = sid;
        c.mask = u64::MAX;
        c.keepalive_us = ka as u64 * 1000;
        c.heard_us = now_us;
        c.state = State::Session;
        let peer = c.peer;
        self.untouch(slot);
        self.resumes.attached.insert(sid, token);
        self.resumes.window_at.remove(&sid);
        self.session_deadlines
            .push(Reverse((now_us + ka as u64 * 1000, token)));
        self.resumes.pending.insert(
            token,
            Pending {
                sid,
                rid,
                left: self.shards,
                held: Vec::new(),
            },
        );
        log!(
            Level::Info,
            "session_resume",
            "session={:#x} conn={:#x} peer={}",
            sid,
            token,
            peer
        );
        for to in 0..self.shards {
            if to == self.me {
                self.adopt(sid, token);
            } else {
                self.cmds.push(Cmd::Sess {
                    to,
                    msg: Box::new(SessMsg::Adopt { sid, home: token }),
                });
            }
        }
        false
    }

    /// True while `slot` waits for its Resume's answer: its later frames
    /// wait too.
    pub(super) fn resuming(&self, slot: u32) -> bool {
        !self.resumes.pending.is_empty() && self.resumes.pending.contains_key(&self.token(slot))
    }

    /// Owner side of a Resume: session `sid` is `home`'s now; its holds on
    /// this shard go back to the home, behind this shard's log.
    pub(super) fn adopt(&mut self, sid: u64, home: Token) {
        self.resumes.orphan_at.remove(&sid);
        let now_us = self.now.mono_us;
        let mut held = Vec::new();
        self.table.adopt(sid, home, |h, expires_mono_us| {
            let ttl = if h.mode == HoldMode::Lease {
                (expires_mono_us.saturating_sub(now_us) / 1000).min(sp::NO_TTL as u64 - 1) as u32
            } else {
                sp::NO_TTL
            };
            held.push((
                Name::new(h.key).expect("keys are at most KEY_MAX"),
                h.grant_id,
                h.mode,
                ttl,
            ));
        });
        self.send_home(sid, home, SessMsg::Adopted { sid, home, held });
    }

    /// Home side: one shard's list of the resumed session's holds; the
    /// answer goes out once every shard's is in.
    pub(super) fn adopted(&mut self, sid: u64, home: Token, held: Vec<HeldOut>) {
        let Some(p) = self.resumes.pending.get_mut(&home).filter(|p| p.sid == sid) else {
            return;
        };
        p.held.extend(held);
        p.left -= 1;
        if p.left > 0 {
            return;
        }
        let p = self.resumes.pending.remove(&home).expect("pending");
        let Some(slot) = self.session_conn(sid, home) else {
            return;
        };
        let ka = (self.conns[slot as usize].keepalive_us / 1000) as u32;
        let welcome = self.welcome(sid, ka, sp::FLAG_RESUMABLE);
        let c = &mut self.conns[slot as usize];
        for (key, token, mode, ttl) in &p.held {
            sp::encode_held(p.rid, key.as_bytes(), *token, *mode, *ttl, &mut c.out);
        }
        sp::encode_welcome(p.rid, &welcome, &mut c.out);
        self.metrics.session_resumed();
        self.count_sess(crate::metrics::SessionOp::Resume, Status::Ok);
        log!(
            Level::Info,
            "session_resumed",
            "session={:#x} conn={:#x} holds={}",
            sid,
            home,
            p.held.len()
        );
        self.gate(slot);
        self.pump_session(slot);
    }

    /// Step-down on an owner shard: the session homed elsewhere loses its
    /// connection there. A replicated one is detached (its client resumes
    /// it on the next leader), any other ends.
    pub(super) fn detach_session(&mut self, slot: u32, why: &str) {
        let c = &self.conns[slot as usize];
        let (sid, mask) = (c.sid, c.mask);
        if sid & REPLICATED_SESSION == 0 {
            self.end_session(slot, why);
            return;
        }
        log!(
            Level::Info,
            "session_detached",
            "session={:#x} peer={} reason=\"{}\"",
            sid,
            c.peer,
            crate::log::Escaped(why)
        );
        let c = &mut self.conns[slot as usize];
        c.sid = 0;
        c.dead = true;
        c.read_closed = true;
        c.out.clear();
        self.close(slot);
        self.resumes.attached.remove(&sid);
        let (now, keep_us) = (self.now, self.orphan_keep_us());
        for to in 0..self.shards {
            if self.shards <= 64 && mask & (1u64 << to) == 0 {
                continue;
            }
            if to == self.me {
                self.table.orphan_owner(sid, keep_us, now);
            } else {
                self.cmds.push(Cmd::Sess {
                    to,
                    msg: Box::new(SessMsg::Orphan { sid }),
                });
            }
        }
        if self.may_serve() {
            let ka = self.table.session_keepalive(sid).unwrap_or(0);
            let at = self.now.mono_us + ka as u64 * 1000 + self.election_us();
            self.resumes.arm_window(sid, at);
        } else {
            // From when the node serves again.
            self.rearm_when_serving();
        }
    }

    /// Owner side: a session homed elsewhere lost its connection there; a
    /// replicated one's entry here is an orphan now, with a window.
    pub(super) fn orphaned(&mut self, sid: u64) {
        let (now, keep_us) = (self.now, self.orphan_keep_us());
        self.table.orphan_owner(sid, keep_us, now);
        if sid & REPLICATED_SESSION == 0 {
            return;
        }
        if self.may_serve() {
            let at = self.now.mono_us + keep_us;
            self.resumes.arm_orphan(sid, at);
        } else {
            self.rearm_when_serving();
        }
    }

    /// Something was left without a window while the node did not serve
    /// (a session detached, an owner entry orphaned, records undone): every
    /// window is armed when it serves again, even if this shard's own group
    /// never stopped serving.
    pub(super) fn rearm_when_serving(&mut self) {
        self.resumes.rearm = true;
    }

    /// This shard starts serving: every replicated session homed here that
    /// no connection has, and every orphan owner entry, gets its window
    /// (from now: after the old leader's last answer).
    pub(super) fn arm_resume_windows(&mut self) {
        let now_us = self.now.mono_us;
        let election_us = self.election_us();
        let detached: Vec<(u64, u32)> = self
            .table
            .sessions_homed()
            .filter(|&(sid, _)| {
                self.resumes
                    .attached
                    .get(&sid)
                    .and_then(|&t| self.session_conn(sid, t))
                    .is_none()
            })
            .collect();
        for (sid, ka) in detached {
            self.resumes
                .arm_window(sid, now_us + ka as u64 * 1000 + election_us);
        }
        let keep_us = self.orphan_keep_us();
        for sid in self.table.orphans() {
            self.resumes.arm_orphan(sid, now_us + keep_us);
        }
    }

    /// Ends the replicated sessions and orphan entries whose window passed
    /// (a serving node only: while it does not serve, each is looked at
    /// again an election timeout later, and every window is armed anew
    /// when the node serves again).
    pub(super) fn expire_detached(&mut self) {
        let now_us = self.now.mono_us;
        let serving = self.may_serve();
        if self.journal.is_replicated() && !serving {
            self.resumes.rearm = true;
        } else if serving && std::mem::take(&mut self.resumes.rearm) {
            self.node_serves_again();
        }
        while let Some(&Reverse((at, sid))) = self.resumes.windows.peek() {
            if at > now_us {
                break;
            }
            self.resumes.windows.pop();
            if self.resumes.window_at.get(&sid) != Some(&at) {
                continue; // stale: armed again later, or resumed
            }
            let attached = self
                .resumes
                .attached
                .get(&sid)
                .and_then(|&t| self.session_conn(sid, t))
                .is_some();
            if attached || self.table.session_keepalive(sid).is_none() {
                self.resumes.window_at.remove(&sid);
                continue;
            }
            if !serving {
                // Not now (another shard of this node does not serve): an
                // election timeout from now, or when this shard starts
                // serving again, whichever is later.
                let at = now_us + self.election_us().max(1);
                self.resumes.arm_window(sid, at);
                continue;
            }
            self.resumes.window_at.remove(&sid);
            log!(
                Level::Info,
                "session_end",
                "session={:#x} reason=\"not resumed within its keep-alive after a failover\"",
                sid
            );
            self.metrics.session_expired();
            self.close_replicated(sid);
            for to in 0..self.shards {
                if to == self.me {
                    let now = self.now;
                    self.table.owner_end(sid, now, &mut self.fx);
                } else {
                    self.cmds.push(Cmd::Sess {
                        to,
                        msg: Box::new(SessMsg::End { sid }),
                    });
                }
            }
            self.apply_effects();
        }
        while let Some(&Reverse((at, sid))) = self.resumes.orphans.peek() {
            if at > now_us {
                break;
            }
            self.resumes.orphans.pop();
            if self.resumes.orphan_at.get(&sid) != Some(&at) {
                continue;
            }
            if !serving {
                let at = now_us + self.election_us().max(1);
                self.resumes.arm_orphan(sid, at);
                continue;
            }
            self.resumes.orphan_at.remove(&sid);
            let now = self.now;
            if self.table.end_orphan(sid, now, &mut self.fx) {
                log!(
                    Level::Info,
                    "orphan_end",
                    "session={:#x} reason=\"its holds were not resumed in time\"",
                    sid
                );
            }
            self.apply_effects();
        }
    }

    /// The node serves again after a spell in which it did not (seen by
    /// every shard, whether or not its own group stopped serving): as when
    /// this shard's group starts serving (`note_serving`), session holds
    /// owned by nobody (releases undone while the node did not serve)
    /// become leases, and every session homed here that no connection has
    /// and every orphan owner entry gets its window from now. A window only
    /// moves later.
    fn node_serves_again(&mut self) {
        let (keep_us, now) = (self.orphan_keep_us(), self.now);
        self.table.expire_orphans(keep_us, now);
        self.arm_resume_windows();
    }

    /// The election timeout (0 without replication).
    fn election_us(&self) -> u64 {
        self.journal.election_us()
    }
}
