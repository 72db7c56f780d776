//! The lock port's requests (Locking-Center's one-byte actions): one frame
//! decoded at a time, executed on the table or handed to the key's owner
//! shard, answered `+`/`-` in order.

use super::effects::metrics_action;
use super::*;

impl Shard {
    /// The first frame of a plaintext connection to a server that has
    /// certificates: a session frame is answered `tls_required` and
    /// closed; a Locking-Center request is refused (`-`, closed) unless
    /// `--lc-plaintext`. `None`: served as usual; `Some(more)`: refused
    /// (or more bytes needed), what `pump_lock` returns.
    fn plaintext_first_frame(&mut self, slot: u32) -> Option<bool> {
        let c = &self.conns[slot as usize];
        let first = *c.rbuf.first()?;
        if first == crate::protocol::session::OP_LOCATE {
            // The directory follows the sessions' rule.
            use crate::protocol::session::LocateFrame;
            return match crate::protocol::session::decode_locate(&c.rbuf) {
                LocateFrame::Incomplete => Some(false),
                LocateFrame::Frame { rid, .. } => {
                    self.metrics.security.plaintext_refused(true);
                    self.locate_answer(
                        slot,
                        rid,
                        Err(crate::protocol::session::Status::TlsRequired),
                    );
                    Some(false)
                }
                LocateFrame::Bad(why) => {
                    self.reject(slot, why);
                    Some(false)
                }
            };
        }
        let session = crate::protocol::session::is_session_op(first);
        if !session && !self.cfg.lc_tls_required() {
            return None;
        }
        let peer = c.peer;
        let rid = if session {
            match crate::protocol::session::decode(&c.rbuf) {
                crate::protocol::session::Decoded::Incomplete => return Some(false),
                crate::protocol::session::Decoded::Frame { rid, .. } => Some(rid),
                crate::protocol::session::Decoded::Bad(_) => None,
            }
        } else {
            None
        };
        self.metrics.security.plaintext_refused(session);
        if self.now.mono_us >= self.policy_log_after_us {
            self.policy_log_after_us = self.now.mono_us + 1_000_000;
            log!(
                Level::Warn,
                "plaintext_refused",
                "port=lock peer={} protocol={} reason=\"this server takes {} over TLS only\"",
                peer,
                if session { "session" } else { "lc" },
                if session {
                    "sessions"
                } else {
                    "Locking-Center requests (--lc-plaintext re-opens them)"
                }
            );
        }
        match rid {
            Some(rid) => {
                self.refuse_plain(slot, rid, crate::protocol::session::Status::TlsRequired)
            }
            None => self.reject(slot, "plaintext request to a TLS-only port"),
        }
        Some(false)
    }

    /// A Locate, the connection's first frame: the node directory
    /// ([`crate::protocol::locate`]), then close. False: nothing more to
    /// execute on this connection.
    fn locate(&mut self, slot: u32) -> bool {
        use crate::protocol::locate::VERSION;
        use crate::protocol::session::{decode_locate, LocateFrame, Status};
        match decode_locate(&self.conns[slot as usize].rbuf) {
            LocateFrame::Incomplete => {}
            LocateFrame::Bad(why) => self.reject(slot, why),
            LocateFrame::Frame {
                rid,
                version,
                body_len,
                ..
            } => {
                let answer = match version {
                    Some(VERSION) if body_len == 1 => Ok(()),
                    Some(v) if v != VERSION => Err(Status::UnsupportedVersion),
                    _ => Err(Status::Invalid),
                };
                self.locate_answer(slot, rid, answer);
            }
        }
        false
    }

    /// Answers a Locate: the directory (`Ok`) or a refusal, then close.
    fn locate_answer(
        &mut self,
        slot: u32,
        rid: u32,
        answer: Result<(), crate::protocol::session::Status>,
    ) {
        use crate::protocol::session::{self as sp, Status};
        let dir = answer.is_ok().then(|| self.directory());
        let c = &mut self.conns[slot as usize];
        c.rbuf.clear();
        match (dir, answer) {
            (Some(dir), _) => sp::encode_located(rid, &dir, &mut c.out),
            (None, Err(Status::UnsupportedVersion)) => sp::encode_refusal(
                rid,
                Status::UnsupportedVersion,
                &[crate::protocol::locate::VERSION],
                &mut c.out,
            ),
            (None, Err(status)) => sp::encode_reply(rid, status, 0, sp::NO_TTL, &mut c.out),
            (None, Ok(())) => unreachable!("a directory for every Ok"),
        }
        c.close_after_send = true;
        c.state = State::Answered;
        self.mark_dirty(slot);
    }

    /// Executes one lock-port frame; false when more bytes are needed.
    pub(super) fn pump_lock(&mut self, slot: u32) -> bool {
        let c = &self.conns[slot as usize];
        if !c.tls && c.action.is_none() && c.sid == 0 && self.cfg.client_tls_required() {
            if let Some(more) = self.plaintext_first_frame(slot) {
                return more;
            }
        }
        let c = &self.conns[slot as usize];
        if c.action.is_none()
            && c.sid == 0
            && c.rbuf.first() == Some(&crate::protocol::session::OP_LOCATE)
        {
            // Answered by every node, serving or not.
            return self.locate(slot);
        }
        // A node that does not serve passes a Locking-Center request to
        // the leader (see `forward`); everything else is refused there.
        let forward = !self.may_serve();
        if forward && !self.forwards_requests(slot) {
            return self.not_leader(slot);
        }
        let c = &self.conns[slot as usize];
        if c.action.is_none() && c.sid == 0 {
            // Only a connection's first frame may open or resume a session.
            match c.rbuf.first() {
                Some(&crate::protocol::session::OP_HELLO) => return self.hello(slot),
                Some(&crate::protocol::session::OP_RESUME) => return self.resume_first(slot),
                _ => {}
            }
        }
        let (action, key, mut source, len) = match protocol::decode(&self.conns[slot as usize].rbuf)
        {
            Decoded::Incomplete => return false,
            Decoded::Bad(why) => {
                self.metrics
                    .request(metrics::Action::Lock, metrics::Outcome::Error);
                let why = why.to_string();
                self.reject(slot, &why);
                return false;
            }
            // Sizes were validated by the decoder (1..=127 / 0..=127).
            Decoded::Frame { req, len } => (
                req.action,
                <Name>::new(req.key).expect("decoder bounds keys to 127 bytes"),
                Source::new(req.source).expect("decoder bounds sources to 127 bytes"),
                len,
            ),
        };
        let peer = self.conns[slot as usize].peer;
        if matches!(
            action,
            Action::Unlock | Action::ResetByKey | Action::ResetBySource
        ) && !self.cfg.lc_admin_actions.allows(&peer)
        {
            self.lc_action_refused(slot, action, len);
            return true;
        }
        if let Some(more) = self.route_to_owner(slot, action, &key) {
            return more;
        }
        if forward && action != Action::Persist {
            // The frame goes as it came: the leader fills an empty source
            // from the client's address, as for its own clients.
            self.forward(slot, len, action);
            return true;
        }
        let c = &mut self.conns[slot as usize];
        let peer = c.peer;
        if source.is_empty() {
            // Formatted once per connection, not per request.
            source = *c.peer_ip.get_or_insert_with(|| ip_name(&peer));
        }
        c.rbuf.drain(..len);
        c.action = Some(action);
        if self.shards > 1 && action == Action::ResetBySource {
            self.metrics.reset(true);
            log!(
                Level::Info,
                "reset",
                "by=source source={:?} peer={}",
                source,
                peer
            );
            self.scatter(slot, RemoteOp::ResetSources(vec![source]), true);
            return true;
        }
        self.execute_lc(slot, action, &key, &source);
        true
    }

    /// A Locking-Center Unlock or reset the `--lc-admin-actions` policy
    /// does not allow from this peer: `-` (there is no owner check in
    /// this protocol), counted, logged at most once a second.
    fn lc_action_refused(&mut self, slot: u32, action: Action, len: usize) {
        let peer = self.conns[slot as usize].peer;
        // No owner check in this protocol: refused by policy, `-`.
        let c = &mut self.conns[slot as usize];
        c.rbuf.drain(..len);
        c.action = Some(action);
        self.metrics.lc_action_refused();
        if self.now.mono_us >= self.policy_log_after_us {
            self.policy_log_after_us = self.now.mono_us + 1_000_000;
            log!(
                Level::Warn,
                "lc_action_refused",
                "action={:?} peer={} policy={:?}",
                action,
                peer,
                self.cfg.lc_admin_actions
            );
        }
        if let Some(a) = metrics_action(action) {
            self.metrics.at(self.me).request(a, metrics::Outcome::Error);
        }
        self.answer(slot, b'-', None);
    }

    /// With several shards, a request for a key another shard owns moves
    /// there with its connection (`Some(false)`: migrating, or refused when
    /// it was forwarded here by a node with as many shards); `None`: this
    /// shard's.
    fn route_to_owner(&mut self, slot: u32, action: Action, key: &Name) -> Option<bool> {
        if self.shards == 1
            || !matches!(
                action,
                Action::Lock | Action::TryLock | Action::Unlock | Action::ResetByKey
            )
        {
            return None;
        }
        let to = owner(key.as_bytes(), self.shards);
        if to == self.me {
            return None;
        }
        if self.conns[slot as usize].fwd.is_some() {
            // Forwarded by the key's own shard of a node with as many.
            self.reject(slot, "a forwarded request for another shard's key");
            return Some(false);
        }
        // The frame stays in the buffer: the owner decodes it.
        let token = self.token(slot);
        self.conns[slot as usize].state = State::Migrating;
        self.cmds.push(Cmd::Migrate { token, to });
        Some(false)
    }

    /// Runs a decoded Locking-Center request on this shard's table.
    fn execute_lc(&mut self, slot: u32, action: Action, key: &Name, source: &Source) {
        let token = self.token(slot);
        let peer = self.conns[slot as usize].peer;
        let now = self.now;
        let fx = &mut self.fx;
        match action {
            Action::Persist => {
                // Reveals no lock state: never waits for the log (nor can a
                // log failure turn it into `-`).
                let c = &mut self.conns[slot as usize];
                c.persistent = true;
                c.state = State::Answered;
                c.out.push(b'+');
                self.mark_dirty(slot);
            }
            Action::Lock | Action::TryLock => {
                let mode = if action == Action::Lock {
                    LockMode::Blocking
                } else {
                    LockMode::Try
                };
                // Until an effect answers it, the request waits.
                self.conns[slot as usize].state = State::Executing;
                let w = self.table.lock(token, &key, &source, peer, mode, now, fx);
                self.apply_effects();
                let c = &mut self.conns[slot as usize];
                match w {
                    Some(waiter) if c.read_closed => {
                        // Nobody will wait for it: withdraw at once.
                        self.table.withdraw(waiter);
                        self.metrics.hangup_withdrawal();
                        self.withdrawn(slot);
                    }
                    Some(waiter) => c.state = State::Queued { waiter },
                    None => debug_assert_ne!(
                        c.state,
                        State::Executing,
                        "a lock neither queued nor answered"
                    ),
                }
                return;
            }
            Action::Unlock => {
                self.conns[slot as usize].state = State::Executing;
                self.table.unlock(token, &key, now, fx)
            }
            Action::ResetByKey => {
                self.metrics.reset(false);
                log!(Level::Info, "reset", "by=key key={:?} peer={}", key, peer);
                self.conns[slot as usize].state = State::Executing;
                self.table.reset_by_key(Some(token), &key, now, fx)
            }
            Action::ResetBySource => {
                self.metrics.reset(true);
                log!(
                    Level::Info,
                    "reset",
                    "by=source source={:?} peer={}",
                    source,
                    peer
                );
                self.conns[slot as usize].state = State::Executing;
                self.table.reset_by_source(Some(token), &source, now, fx)
            }
        }
        self.apply_effects();
    }
}
