//! The connection state machine of the shard: pumping buffered frames,
//! the end of input, bad input and protocol violations, dying and closing,
//! the idle list. Every path that ends a connection comes through here.

use super::cmd::Cmd;
use super::conn::Port;
use super::conn::State;
use super::Shard;
use crate::log::Level;

impl Shard {
    /// Decodes and executes buffered frames while the connection is idle.
    pub(super) fn pump(&mut self, slot: u32) {
        if self.conns[slot as usize].state == State::Session {
            self.pump_session(slot);
        }
        loop {
            let c = &self.conns[slot as usize];
            if c.state != State::Idle || c.close_after_send || c.rbuf.is_empty() {
                break;
            }
            // A one-shot connection serves one request only.
            if !c.persistent && c.action.is_some() {
                break;
            }
            let progressed = match c.port {
                Port::Lock => self.pump_lock(slot),
                Port::Admin => self.pump_admin(slot),
            };
            if !progressed {
                break;
            }
        }
        // Frame read timeout bookkeeping: a partial frame starts the clock.
        let c = &self.conns[slot as usize];
        let partial = matches!(c.state, State::Idle | State::Session)
            && !c.rbuf.is_empty()
            && !c.close_after_send;
        let linked = c.partial_link.linked;
        if partial && !linked {
            self.conns[slot as usize].partial_since_us = self.now.mono_us;
            self.partial.push_back(&mut self.conns, slot, 0);
        } else if !partial && linked {
            self.partial.unlink(&mut self.conns, slot, 0);
        }
    }

    /// An idle connection whose input ended has nothing more coming: a
    /// partial frame is bad input; otherwise close.
    pub(super) fn settle_idle(&mut self, slot: u32) {
        let c = &self.conns[slot as usize];
        if c.state != State::Idle || !c.read_closed {
            return;
        }
        if c.rbuf.is_empty() {
            self.close(slot);
        } else {
            self.reject(slot, "input ended inside a frame");
        }
    }

    /// A Lock withdrawn because the input ended: answered `-` where later
    /// answers need their places (persistent), else the connection closes.
    pub(super) fn withdrawn(&mut self, slot: u32) {
        let c = &mut self.conns[slot as usize];
        c.state = State::Idle;
        if c.persistent && !c.dead {
            self.answer(slot, b'-', None);
        } else {
            self.close(slot);
        }
    }

    /// Bad input: answer `-`, then close. Nothing reached the lock table.
    pub(super) fn reject(&mut self, slot: u32, why: &str) {
        if self.conns[slot as usize].state == State::Session {
            // A session cannot answer out of band: it ends.
            let why = format!("bad input: {why}");
            self.end_session(slot, &why);
            return;
        }
        let c = &mut self.conns[slot as usize];
        log!(
            Level::Debug,
            "bad_frame",
            "peer={} reason=\"{}\"",
            c.peer,
            crate::log::Escaped(why)
        );
        c.rbuf.clear();
        c.out.push(b'-');
        c.close_after_send = true;
        c.state = State::Answered;
        if c.partial_link.linked {
            self.partial.unlink(&mut self.conns, slot, 0);
        }
        self.mark_dirty(slot);
    }

    /// A protocol violation on a connection that may have a waiter queued.
    pub(super) fn violation(&mut self, slot: u32, why: &str) {
        log!(
            Level::Warn,
            "protocol_violation",
            "peer={} reason=\"{}\"",
            self.conns[slot as usize].peer,
            crate::log::Escaped(why)
        );
        self.die(slot);
        self.apply_effects();
    }

    /// The connection is gone or broken: withdraw its waiter, give back a
    /// grant it was never told about, close.
    pub(super) fn die(&mut self, slot: u32) {
        let c = &mut self.conns[slot as usize];
        if c.state == State::Closing {
            return;
        }
        if c.state == State::Session {
            self.end_session(slot, "connection broken");
            return;
        }
        c.dead = true;
        c.read_closed = true;
        match c.state {
            State::Queued { waiter } => {
                self.table.withdraw(waiter);
                self.metrics.hangup_withdrawal();
            }
            State::Forwarded { id } => {
                self.forward_abandoned(id);
                self.metrics.hangup_withdrawal();
            }
            _ => {}
        }
        let c = &mut self.conns[slot as usize];
        if !c.grant_in_flight {
            self.give_back_grant(slot);
        }
        self.conns[slot as usize].out.clear();
        self.close(slot);
    }

    pub(super) fn give_back_grant(&mut self, slot: u32) {
        if let Some((node, grant)) = self.conns[slot as usize].fwd_grant.take() {
            // The leader's grant, relayed: given back there.
            self.give_back_remote(node, grant);
        }
        if let Some((key_slot, grant_id)) = self.conns[slot as usize].grant.take() {
            self.metrics.undelivered_grant();
            let now = self.now;
            self.table
                .release_grant(key_slot, grant_id, now, &mut self.fx);
        }
    }

    pub(super) fn close(&mut self, slot: u32) {
        let c = &mut self.conns[slot as usize];
        if c.state == State::Closing {
            return;
        }
        if c.fwd.is_some() {
            // A follower's request (no socket): it hears what became of it
            // unless it gave it up or its link failed.
            let answer = self.forwarded_closing_answer(slot);
            self.free_forwarded(slot, answer);
            return;
        }
        if let State::Forwarded { id } = c.state {
            self.forward_abandoned(id);
        }
        let c = &mut self.conns[slot as usize];
        c.state = State::Closing;
        if c.partial_link.linked {
            self.partial.unlink(&mut self.conns, slot, 0);
        }
        self.untouch(slot);
        self.keys_gone(slot);
        let token = self.token(slot);
        self.cmds.push(Cmd::Close(token));
    }

    /// Traffic on a connection: it moves to the back of the idle list.
    pub(super) fn touch(&mut self, slot: u32) {
        let c = &mut self.conns[slot as usize];
        if self.cfg.idle_timeout_ms == 0
            || c.sid != 0
            || c.state == State::Closing
            || c.fwd.is_some()
        {
            return;
        }
        c.active_us = self.now.mono_us;
        if c.idle_link.linked {
            self.idle.unlink(&mut self.conns, slot, 1);
        }
        self.idle.push_back(&mut self.conns, slot, 1);
    }

    /// Off the idle list (closing, moving away, or a session now).
    pub(super) fn untouch(&mut self, slot: u32) {
        if self.conns[slot as usize].idle_link.linked {
            self.idle.unlink(&mut self.conns, slot, 1);
        }
    }

    pub(super) fn mark_dirty(&mut self, slot: u32) {
        let c = &mut self.conns[slot as usize];
        if !c.dirty {
            c.dirty = true;
            self.dirty.push(slot);
        }
    }
}
