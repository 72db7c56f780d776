//! The admin port's text commands (`KEYS`, `KEYX`, `RSTK`, `RSTS`,
//! `CLST`, `CMEM`, `CADR`, `CCHG`, …): decoded one line at a time, answered in
//! order, scattered to every shard where the command is the server's.

use super::*;

impl Shard {
    /// Executes one admin command; false when more bytes are needed.
    pub(super) fn pump_admin(&mut self, slot: u32) -> bool {
        let peer = self.conns[slot as usize].peer;
        if self.admin_plaintext_refused(slot) {
            return false;
        }
        let (cmd, count, len) = match admin::decode(&self.conns[slot as usize].rbuf) {
            admin::Decoded::Incomplete => {
                if self.conns[slot as usize].rbuf.len() >= admin::FRAME_MAX {
                    self.reject(slot, "admin command too long");
                }
                return false;
            }
            admin::Decoded::Bad(why) => {
                log!(
                    Level::Warn,
                    "bad_admin_command",
                    "peer={} reason=\"{}\"",
                    peer,
                    crate::log::Escaped(why)
                );
                self.reject(slot, "bad admin command");
                return false;
            }
            admin::Decoded::Frame { cmd, count, len } => (cmd, count, len),
        };
        if let Some(done) = self.admin_auth(slot, cmd, len) {
            return done;
        }
        match cmd {
            admin::Command::Cadr => {
                // Every node answers, a single node too: where the others are.
                let dir = self.directory();
                let c = self.take_admin_frame(slot, len);
                dir.encode_admin(&mut c.out);
                c.state = State::Answered;
                c.gate_lsn = 0;
                self.mark_dirty(slot);
                return true;
            }
            admin::Command::Clst | admin::Command::Cmem => {
                // Every node answers: the operator asks followers too.
                self.take_admin_frame(slot, len);
                if cmd == admin::Command::Clst {
                    self.cluster_status_start(slot);
                } else {
                    self.cluster_members_start(slot);
                }
                return true;
            }
            _ => {}
        }
        // AUTH and CLST aside, the admin port reads or changes the lock
        // table: only the serving node may change it; a follower answers
        // KEYS/KEYX/KEYH after a read barrier (linearizable, see shard::raft).
        let read = cmd.list_form().is_some();
        if !(self.may_serve() || read && self.journal.is_replicated()) {
            self.reject(slot, "not the leader");
            return false;
        }
        if let Some(form) = cmd.list_form() {
            self.metrics
                .request(metrics::Action::AdminKeys, metrics::Outcome::Ok);
            self.take_admin_frame(slot, len);
            self.keys_start(slot, form);
            return true;
        }
        // Every other admin command is a scatter/gather, also with one
        // shard (the driver then runs the one part itself): one path, and
        // each part's answer waits for its own log.
        let op = match self.admin_op(slot, cmd, count, len) {
            Ok(op) => op,
            Err(why) => {
                let c = self.take_admin_frame(slot, len);
                protocol::members::encode_answer(&Err(why), &mut c.out);
                c.state = State::Answered;
                c.gate_lsn = 0;
                self.mark_dirty(slot);
                return true;
            }
        };
        self.take_admin_frame(slot, len);
        self.scatter(slot, op, false);
        let g = self.gathers.last_mut().expect("just pushed");
        if let RemoteOp::ResetIf(e) = &g.op {
            g.reset = vec![false; e.len()];
        }
        true
    }

    /// A plaintext connection on an admin port that takes TLS only: refused
    /// (counted, logged at most once a second).
    fn admin_plaintext_refused(&mut self, slot: u32) -> bool {
        let c = &self.conns[slot as usize];
        if c.tls || !self.cfg.client_tls_required() {
            return false;
        }
        let peer = c.peer;
        self.metrics.security.plaintext_refused(false);
        if self.now.mono_us >= self.policy_log_after_us {
            self.policy_log_after_us = self.now.mono_us + 1_000_000;
            log!(
                Level::Warn,
                "plaintext_refused",
                "port=admin peer={} reason=\"this server's admin port takes TLS only\"",
                peer
            );
        }
        self.reject(slot, "plaintext on a TLS-only admin port");
        true
    }

    /// The shared secret (or a client certificate): checked when
    /// presented, required before any command when any authentication is
    /// configured, on loopback too. `Some(done)`: the command was `AUTH`
    /// (answered `+`, or refused), or came before a required `AUTH`
    /// (refused); `None`: go on with it.
    fn admin_auth(&mut self, slot: u32, cmd: admin::Command, len: usize) -> Option<bool> {
        let required = self.cfg.admin_auth_required();
        let c = &self.conns[slot as usize];
        let peer = c.peer;
        let why = if cmd == admin::Command::Auth {
            let ok = match &self.cfg.auth_token {
                Some(t) => crate::config::token_matches(t, &c.rbuf[5..len]),
                // No token to match: AUTH is a no-op where nothing is
                // required, and never a way in where something is.
                None => !required,
            };
            if ok {
                let c = self.take_admin_frame(slot, len);
                c.authed = true;
                c.state = State::Answered;
                c.out.push(b'+');
                self.mark_dirty(slot);
                return Some(true);
            }
            ("wrong auth token", "wrong auth token")
        } else if required && !c.authed {
            ("command before AUTH", "admin command before AUTH")
        } else {
            return None;
        };
        self.metrics.auth_failure();
        log!(
            Level::Warn,
            "auth_failed",
            "port=admin peer={} reason=\"{}\"",
            peer,
            why.0
        );
        self.reject(slot, why.1);
        Some(false)
    }

    /// Takes the command's `len` bytes off the connection, which stays
    /// open for the next (an admin connection is persistent).
    fn take_admin_frame(&mut self, slot: u32, len: usize) -> &mut Conn {
        let c = &mut self.conns[slot as usize];
        c.rbuf.drain(..len);
        c.persistent = true;
        c.action = Some(Action::Persist);
        c
    }

    /// The remote operation a table-changing admin command runs on every
    /// shard (counted and logged as the operator's); `Err`: a `CCHG` that
    /// does not decode, answered with why.
    fn admin_op(
        &mut self,
        slot: u32,
        cmd: admin::Command,
        count: u32,
        len: usize,
    ) -> Result<RemoteOp, String> {
        let peer = self.conns[slot as usize].peer;
        // KEYS is 4 bytes; RSET/RSBS/RSTK carry a count and names after 8.
        let body = &self.conns[slot as usize].rbuf[len.min(8)..len];
        Ok(match cmd {
            admin::Command::Rset => self.reset_keys_op(body, peer),
            admin::Command::Rsbs => self.reset_sources_op(body, count, peer),
            admin::Command::Rstk => self.reset_if_op(body, peer),
            admin::Command::Cchg => {
                let raw = &self.conns[slot as usize].rbuf[..len];
                let change = protocol::members::Change::decode(raw)?;
                log!(
                    Level::Info,
                    "operator_membership_change",
                    "change={:?} peer={}",
                    change,
                    peer
                );
                RemoteOp::ChangeMembers(change)
            }
            admin::Command::Xfer => {
                log!(
                    Level::Info,
                    "operator_transfer_leader",
                    "to={} peer={}",
                    count,
                    peer
                );
                RemoteOp::TransferLeader { to: count as u64 }
            }
            admin::Command::Auth
            | admin::Command::Clst
            | admin::Command::Cmem
            | admin::Command::Cadr
            | admin::Command::Keys
            | admin::Command::Keyx
            | admin::Command::Keyh => unreachable!("answered by pump_admin"),
        })
    }

    /// `RSET` from `peer`: the keys its `body` names, to reset; counted
    /// and logged.
    fn reset_keys_op(&self, body: &[u8], peer: SocketAddr) -> RemoteOp {
        // RSET names keys (1..=127 bytes).
        let names: Vec<Name> = admin::names(body)
            .map(|n| Name::new(n).expect("admin decoder bounds keys to 127 bytes"))
            .collect();
        self.metrics
            .request(metrics::Action::AdminRset, metrics::Outcome::Ok);
        for key in &names {
            self.metrics.reset(false);
            log!(
                Level::Info,
                "operator_reset",
                "by=key key={:?} peer={}",
                key,
                peer
            );
        }
        RemoteOp::ResetKeys(names)
    }

    /// `RSBS` from `peer`: the sources its `body` names (`count` of them),
    /// to reset; counted and logged.
    fn reset_sources_op(&self, body: &[u8], count: u32, peer: SocketAddr) -> RemoteOp {
        // RSBS names sources (0..=255 bytes); none: the asker's IP.
        let mut sources: Vec<Source> = admin::names(body)
            .map(|n| Source::new(n).expect("a size byte says at most 255"))
            .collect();
        self.metrics
            .request(metrics::Action::AdminRsbs, metrics::Outcome::Ok);
        if count == 0 {
            sources.push(ip_name(&peer));
        }
        for s in &sources {
            self.metrics.reset(true);
            log!(
                Level::Info,
                "operator_reset",
                "by=source source={:?} peer={}",
                s,
                peer
            );
        }
        RemoteOp::ResetSources(sources)
    }

    /// `RSTK` from `peer`: the keys its `body` names, each with the token
    /// it is reset only if held under, counted and logged.
    fn reset_if_op(&self, body: &[u8], peer: SocketAddr) -> RemoteOp {
        let entries: Vec<(Name, u64)> = admin::keyed_tokens(body)
            .map(|(n, t)| (Name::new(n).expect("admin decoder bounds names"), t))
            .collect();
        self.metrics
            .request(metrics::Action::AdminRset, metrics::Outcome::Ok);
        for (key, token) in &entries {
            self.metrics.reset(false);
            log!(
                Level::Info,
                "operator_reset",
                "by=key_if_token key={:?} token={} peer={}",
                key,
                token,
                peer
            );
        }
        RemoteOp::ResetIf(entries)
    }
}
