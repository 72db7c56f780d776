//! The admin port's text commands (`KEYS`, `KEYX`, `RSTK`, `RSTS`,
//! `CLST`, `CMEM`, `CADR`, `CCHG`, …): decoded one line at a time, answered in
//! order, scattered to every shard where the command is the server's.

use super::*;

impl Shard {
    /// Executes one admin command; false when more bytes are needed.
    pub(super) fn pump_admin(&mut self, slot: u32) -> bool {
        let c = &self.conns[slot as usize];
        let peer = c.peer;
        if !c.tls && self.cfg.client_tls_required() {
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
            return false;
        }
        let (cmd, count, len) = match admin::decode(&c.rbuf) {
            admin::Decoded::Incomplete => {
                if c.rbuf.len() >= admin::FRAME_MAX {
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
        // The shared secret (or a client certificate): checked when
        // presented, required before any command when any authentication
        // is configured, on loopback too.
        let required = self.cfg.admin_auth_required();
        if cmd == admin::Command::Auth {
            let c = &self.conns[slot as usize];
            let ok = match &self.cfg.auth_token {
                Some(t) => crate::config::token_matches(t, &c.rbuf[5..len]),
                // No token to match: AUTH is a no-op where nothing is
                // required, and never a way in where something is.
                None => !required,
            };
            if !ok {
                self.metrics.auth_failure();
                log!(
                    Level::Warn,
                    "auth_failed",
                    "port=admin peer={} reason=\"wrong auth token\"",
                    peer
                );
                self.reject(slot, "wrong auth token");
                return false;
            }
            let c = &mut self.conns[slot as usize];
            c.rbuf.drain(..len);
            c.authed = true;
            c.persistent = true;
            c.action = Some(Action::Persist);
            c.state = State::Answered;
            c.out.push(b'+');
            self.mark_dirty(slot);
            return true;
        }
        if required && !self.conns[slot as usize].authed {
            self.metrics.auth_failure();
            log!(
                Level::Warn,
                "auth_failed",
                "port=admin peer={} reason=\"command before AUTH\"",
                peer
            );
            self.reject(slot, "admin command before AUTH");
            return false;
        }
        if cmd == admin::Command::Cadr {
            // Every node answers, a single node too: where the others are.
            let dir = self.directory();
            let c = &mut self.conns[slot as usize];
            c.rbuf.drain(..len);
            c.persistent = true;
            c.action = Some(Action::Persist);
            dir.encode_admin(&mut c.out);
            c.state = State::Answered;
            c.gate_lsn = 0;
            self.mark_dirty(slot);
            return true;
        }
        if cmd == admin::Command::Clst || cmd == admin::Command::Cmem {
            // Every node answers: the operator asks followers too.
            let c = &mut self.conns[slot as usize];
            c.rbuf.drain(..len);
            c.persistent = true;
            c.action = Some(Action::Persist);
            if cmd == admin::Command::Clst {
                self.cluster_status_start(slot);
            } else {
                self.cluster_members_start(slot);
            }
            return true;
        }
        // AUTH and CLST aside, the admin port reads or changes the lock
        // table: only the serving node may change it; a follower answers
        // KEYS/KEYX/KEYH after a read barrier (linearizable, see shard::raft).
        let read = cmd.list_form().is_some();
        if !(self.may_serve() || read && self.journal.is_replicated()) {
            self.reject(slot, "not the leader");
            return false;
        }
        // Every admin command is a scatter/gather, also with one shard (the
        // driver then runs the one part itself): one path, and each part's
        // answer waits for its own log.
        // KEYS is 4 bytes; RSET/RSBS carry a count and names after 8.
        let body = &self.conns[slot as usize].rbuf[len.min(8)..len];
        let entries: Vec<(Name, u64)> = if cmd == admin::Command::Rstk {
            admin::keyed_tokens(body)
                .map(|(n, t)| (Name::new(n).expect("admin decoder bounds names"), t))
                .collect()
        } else {
            Vec::new()
        };
        // RSET names keys (1..=127 bytes), RSBS sources (0..=255).
        let names: Vec<Name> = if cmd == admin::Command::Rset {
            admin::names(body)
                .map(|n| Name::new(n).expect("admin decoder bounds keys to 127 bytes"))
                .collect()
        } else {
            Vec::new()
        };
        let sources: Vec<Source> = if cmd == admin::Command::Rsbs {
            admin::names(body)
                .map(|n| Source::new(n).expect("a size byte says at most 255"))
                .collect()
        } else {
            Vec::new()
        };
        let op = match cmd {
            admin::Command::Keys | admin::Command::Keyx | admin::Command::Keyh => {
                self.metrics
                    .request(metrics::Action::AdminKeys, metrics::Outcome::Ok);
                let c = &mut self.conns[slot as usize];
                c.rbuf.drain(..len);
                c.persistent = true;
                c.action = Some(Action::Persist);
                self.keys_start(slot, cmd.list_form().expect("a listing"));
                return true;
            }
            admin::Command::Rset => {
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
            admin::Command::Rsbs => {
                self.metrics
                    .request(metrics::Action::AdminRsbs, metrics::Outcome::Ok);
                let mut sources = sources;
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
            admin::Command::Auth
            | admin::Command::Clst
            | admin::Command::Cmem
            | admin::Command::Cadr => {
                unreachable!("answered above")
            }
            admin::Command::Cchg => {
                let raw = &self.conns[slot as usize].rbuf[..len];
                match protocol::members::Change::decode(raw) {
                    Ok(change) => {
                        log!(
                            Level::Info,
                            "operator_membership_change",
                            "change={:?} peer={}",
                            change,
                            peer
                        );
                        RemoteOp::ChangeMembers(change)
                    }
                    Err(why) => {
                        let c = &mut self.conns[slot as usize];
                        c.rbuf.drain(..len);
                        c.persistent = true;
                        c.action = Some(Action::Persist);
                        protocol::members::encode_answer(&Err(why), &mut c.out);
                        c.state = State::Answered;
                        c.gate_lsn = 0;
                        self.mark_dirty(slot);
                        return true;
                    }
                }
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
            admin::Command::Rstk => {
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
        };
        let c = &mut self.conns[slot as usize];
        c.rbuf.drain(..len);
        c.persistent = true;
        c.action = Some(Action::Persist);
        self.scatter(slot, op, false);
        let g = self.gathers.last_mut().expect("just pushed");
        if let RemoteOp::ResetIf(e) = &g.op {
            g.reset = vec![false; e.len()];
        }
        true
    }
}
