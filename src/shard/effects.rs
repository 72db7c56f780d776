//! The table's effects turned into actions: the one place where a grant,
//! a release, a reply or a limit becomes a log record, an undo entry, a
//! metric and an answer behind the durability gate.
//!
//! Rule: every table operation writes its effects into `Shard::fx`, and
//! every event handler leaves none unapplied ([`Shard::apply_effects`]
//! before it returns; an effect may cascade — giving back an undeliverable
//! grant grants the next waiter — and is applied in the same round).
//! [`Shard::flush`] then hands each answer that may leave to the driver.

use super::*;

pub(super) fn metrics_action(a: Action) -> Option<metrics::Action> {
    Some(match a {
        Action::Lock => metrics::Action::Lock,
        Action::Unlock => metrics::Action::Unlock,
        Action::ResetByKey => metrics::Action::ResetByKey,
        Action::ResetBySource => metrics::Action::ResetBySource,
        Action::TryLock => metrics::Action::TryLock,
        Action::Persist => return None,
    })
}

impl Shard {
    /// Applies the table's effects in order (they may cascade: releasing an
    /// undeliverable grant can grant the next waiter).
    pub(super) fn apply_effects(&mut self) {
        // Effects refer to released holders by index until the table is
        // told they were applied: only the outermost round tells it.
        self.fx_depth += 1;
        while !self.fx.is_empty() {
            let batch = std::mem::replace(&mut self.fx, std::mem::take(&mut self.fx_spare));
            for e in &batch {
                self.apply(e);
            }
            let mut batch = batch;
            batch.clear();
            self.fx_spare = batch;
        }
        self.fx_depth -= 1;
        if self.fx_depth == 0 {
            self.table.effects_applied();
        }
    }

    pub(super) fn apply(&mut self, e: &Effect) {
        match *e {
            Effect::LimitReached { limit } => self.log_limit_reached(limit),
            Effect::Reply { conn, .. } if conn & SESS_BIT != 0 => self.session_effect(e),
            Effect::Reply { conn, reply } => self.apply_reply(conn, reply),
            Effect::Granted {
                conn,
                key_slot,
                grant_id,
                waited_us,
            } => self.apply_granted(e, conn, key_slot, grant_id, waited_us),
            Effect::Released {
                released,
                grant_id,
                held_us,
                holder_conn,
                ..
            } => self.apply_released(e, released, grant_id, held_us, holder_conn),
        }
    }

    /// A request refused at a capacity limit: logged, at most one line per
    /// second.
    fn log_limit_reached(&mut self, limit: crate::core::Limit) {
        // At most one line per second: a flood of refusals must not
        // turn into a flood of log lines.
        if self.now.mono_us >= self.limit_log_after_us {
            self.limit_log_after_us = self.now.mono_us + 1_000_000;
            log!(
                Level::Warn,
                "limit_reached",
                "limit={} max_keys={} max_waiters={} held_keys={} queued={}",
                limit.name(),
                self.cfg.max_keys,
                self.cfg.max_waiters,
                self.table.held_keys(),
                self.table.queued_waiters()
            );
        }
    }

    /// A reply to a lock-port connection's request: counted and answered
    /// (if the connection is still there).
    fn apply_reply(&mut self, conn: Token, reply: Reply) {
        let outcome = match reply {
            Reply::Ok => metrics::Outcome::Ok,
            Reply::Busy => metrics::Outcome::Busy,
            _ => metrics::Outcome::Error,
        };
        if let Some(slot) = self.conn_of(conn) {
            if let Some(a) = self.conns[slot as usize].action.and_then(metrics_action) {
                self.metrics.at(self.me).request(a, outcome);
            }
            self.answer(slot, reply.byte(), None);
        }
    }

    /// A grant (effect `e`): logged with its undo (durable mode), counted,
    /// told to watchers, then answered `+` — or, with nobody left to tell,
    /// given back at once.
    fn apply_granted(
        &mut self,
        e: &Effect,
        conn: Token,
        key_slot: u32,
        grant_id: u64,
        waited_us: Option<u64>,
    ) {
        if let Some(log) = self.journal.records_mut() {
            // Durable mode only: the record, and the key's name
            // for the undo list (it outlives this round).
            let (held, _) = self.table.granted(key_slot, grant_id);
            let lsn = log.append_acquire(held);
            let key = Name::new(held.key).expect("keys are at most KEY_MAX");
            self.durability
                .undo_on_failure(lsn, Undo::Acquire { key, grant_id });
        }
        let access = self.table.granted_access(key_slot, grant_id);
        self.metrics.at(self.me).grant_access(access);
        if !self.watches.is_empty() {
            self.watch_effect(e);
        }
        if let Some(us) = waited_us {
            self.metrics.at(self.me).handoff();
            self.metrics.at(self.me).observe_queue_wait_us(us);
        }
        if conn & SESS_BIT != 0 {
            self.session_effect(e);
            return;
        }
        match self.conn_of(conn).filter(|&s| !self.conns[s as usize].dead) {
            Some(slot) => {
                if let Some(a) = self.conns[slot as usize].action.and_then(metrics_action) {
                    self.metrics.at(self.me).request(a, metrics::Outcome::Ok);
                }
                self.answer(slot, b'+', Some((key_slot, grant_id)));
            }
            None => {
                // Nobody left to tell: give the key back at once.
                self.metrics.undelivered_grant();
                let now = self.now;
                self.table
                    .release_grant(key_slot, grant_id, now, &mut self.fx);
            }
        }
    }

    /// A release (effect `e`): logged with its undo (durable mode),
    /// counted, pushed as a Lost to a session holder, told to watchers.
    fn apply_released(
        &mut self,
        e: &Effect,
        released: u32,
        grant_id: u64,
        held_us: u64,
        holder_conn: Token,
    ) {
        if let Some(log) = self.journal.records_mut() {
            // Durable mode only: the record, and the holder as it
            // was for the undo list (it outlives this round).
            let prev = self.table.released(released, grant_id);
            let lsn = log.append_release(prev);
            let prev = prev
                .to_owned()
                .expect("keys are at most KEY_MAX, sources at most SOURCE_MAX");
            self.durability.undo_on_failure(lsn, Undo::Release { prev });
        }
        self.metrics.at(self.me).observe_hold_us(held_us);
        if holder_conn & SESS_BIT != 0 {
            // A Lost push, before the next holder's grant.
            self.session_effect(e);
        }
        if !self.watches.is_empty() {
            self.watch_effect(e);
        }
    }

    /// Queues the one-byte answer to the connection's outstanding request.
    pub(super) fn answer(&mut self, slot: u32, byte: u8, grant: Option<(u32, u64)>) {
        let c = &mut self.conns[slot as usize];
        c.state = State::Answered;
        c.out.push(byte);
        if grant.is_some() {
            debug_assert!(
                c.grant.is_none(),
                "two grants outstanding on one connection"
            );
            c.grant = grant;
        }
        self.gate(slot);
    }

    /// Hands every answer that may leave to the driver (one send each).
    pub(super) fn flush(&mut self) {
        let durable = self.journal.durable_lsn();
        let mut dirty = std::mem::take(&mut self.dirty);
        for &slot in &dirty {
            let c = &mut self.conns[slot as usize];
            c.dirty = false;
            if c.state == State::Session {
                if c.sending || c.out.is_empty() || c.gate_lsn > durable {
                    continue;
                }
                c.sending = true;
                let token = ((c.gen as u64) << 32) | slot as u64;
                self.cmds.push(Cmd::Send(token));
                continue;
            }
            if c.state != State::Answered || c.out.is_empty() || c.gate_lsn > durable {
                continue;
            }
            if c.fwd.is_some() {
                // A follower's request: the answer goes back on the link.
                self.send_forwarded(slot);
                continue;
            }
            c.state = State::Sending;
            c.grant_in_flight = c.grant.is_some() || c.fwd_grant.is_some();
            let token = ((c.gen as u64) << 32) | slot as u64;
            self.cmds.push(Cmd::Send(token));
        }
        dirty.clear();
        self.dirty = dirty;
    }
}
