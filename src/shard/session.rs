//! Session connections (lock-port actions 7..=12, `docs/protocol.md`).
//!
//! Two sides, because a session's keys may belong to any shard:
//! - **home**: the shard that accepted the connection. It decodes the
//!   frames, keeps the keep-alive deadline, writes every answer, and sends
//!   each request to the shard that owns its key (itself included).
//! - **owner**: the shard that owns a key. Its table tracks the session as
//!   an owner entry (holds and queued requests), answers requests, and
//!   pushes Lost when a lease expires or an operator resets a hold.
//!
//! A request travels home → owner and its answer owner → home over the
//! shard mesh, whose queues are FIFO per pair of shards: a session's
//! requests reach an owner in the order they were sent, and an owner's
//! answers (a grant, then a Cancel's "not queued"; a Lost, then what
//! follows) reach home in the order they were decided. When the session
//! ends, home sends End to every shard it used; an End arrives after every
//! request of the session, so nothing is granted to a session afterwards.
//!
//! Table connection tokens of session requests are
//! `SESS_BIT | owner slot << 32 | rid`: the owner slot names the session
//! in the owner's table, the rid the request.
//!
//! Durability: an owner's answers wait for its own log like a `+` (held
//! locally or, for another home, in the remote-reply queue); a log failure
//! turns a waiting answer into the end of its session (Kill), since the
//! state it reported was undone.

use std::cmp::Reverse;
use std::net::SocketAddr;

use super::cmd::Cmd;
use super::conn::State;
use super::gate::Undo;
pub use super::msg::{SessMsg, SessOp, SessOut, SESS_BIT};
use super::Shard;
use crate::core::route::owner;
use crate::core::{Checked, Effect, HoldMode, LockMode, LockOpts, Name, Reply, Source, Token};
use crate::log::Level;
use crate::metrics::SessionOp;
use crate::protocol::session::{self as sp, LostWhy, Req, Status};

/// A session whose client does not read its answers is closed beyond this.
pub const SESSION_OUT_MAX: usize = 64 << 10;

/// The home shard of a session id.
pub fn home_of(sid: u64) -> usize {
    (sid >> 56) as usize
}

/// Whether an owner's `tag` routes to a connection (not an orphan's: see
/// the `resume` module).
pub fn routable(tag: u64) -> bool {
    tag != crate::core::table::ORPHAN
}

fn table_token(owner_slot: u32, rid: u32) -> Token {
    SESS_BIT | (owner_slot as u64) << 32 | rid as u64
}

/// The table's lock mode and options for owner `o`'s Acquire at `now_us`
/// (monotonic): a try without `wait_ms`, else a wait with its deadline
/// (none for [`sp::WAIT_FOREVER`]).
fn acquire_opts(
    o: u32,
    now_us: u64,
    hold: HoldMode,
    ttl_ms: u32,
    wait_ms: u32,
) -> (LockMode, LockOpts) {
    let mode = if wait_ms == 0 {
        LockMode::Try
    } else {
        LockMode::Blocking
    };
    let opts = LockOpts {
        mode: hold,
        ttl_ms,
        owner: o,
        deadline_us: (wait_ms != 0 && wait_ms != sp::WAIT_FOREVER)
            .then(|| now_us + wait_ms as u64 * 1000),
    };
    (mode, opts)
}

/// What an accepted first frame of a session connection asks for.
#[derive(Clone, Copy)]
pub(super) enum Opening {
    Hello { keepalive_ms: u32 },
    Resume { session_id: u64 },
}

fn status_of(r: Reply) -> Status {
    match r {
        Reply::Ok => Status::Ok,
        Reply::Busy => Status::Busy,
        Reply::Limit => Status::Limit,
        Reply::TimedOut => Status::TimedOut,
        Reply::Withdrawn | Reply::Cancelled => Status::Cancelled,
        Reply::ModeMismatch => Status::ModeMismatch,
    }
}

pub(super) fn reply(rid: u32, status: Status) -> SessOut {
    SessOut::Reply {
        rid,
        status,
        token: 0,
        ttl_left_ms: sp::NO_TTL,
    }
}

impl Shard {
    // ----- home side ----------------------------------------------------------

    /// Decodes a connection's first frame, a Hello or a Resume of this
    /// version whose auth token the server accepts. `None` when more bytes
    /// are needed or the frame was refused: a session-framed answer, then
    /// close (`unsupported version`, `invalid`, `unauthorized`), or the
    /// Locking-Center `-` for broken framing.
    pub(super) fn opening(&mut self, slot: u32) -> Option<(u32, Opening, usize)> {
        // A verified client certificate stands for the token.
        let cert = self.conns[slot as usize].cert_client.is_some();
        let ok = |auth: &[u8]| match &self.cfg.auth_token {
            Some(t) => cert || crate::config::token_matches(t, auth),
            None => true,
        };
        let (rid, open, authed, len) = match sp::decode(&self.conns[slot as usize].rbuf) {
            sp::Decoded::Incomplete => return None,
            sp::Decoded::Frame {
                rid,
                req:
                    Ok(Req::Hello {
                        version: sp::VERSION,
                        keepalive_ms,
                        auth,
                    }),
                len,
                ..
            } => (rid, Opening::Hello { keepalive_ms }, ok(auth), len),
            sp::Decoded::Frame {
                rid,
                req:
                    Ok(Req::Resume {
                        version: sp::VERSION,
                        session_id,
                        auth,
                    }),
                len,
                ..
            } => (rid, Opening::Resume { session_id }, ok(auth), len),
            sp::Decoded::Frame { rid, len, req, .. } => {
                // The version is the body's first byte, whatever follows
                // (a later version's Hello may be laid out differently):
                // another version is told which ones this server speaks; a
                // version 1 Hello with a malformed body is `invalid`.
                // Either way a session-framed answer, then close, so the
                // client can tell both from "not a session server".
                let rbuf = &self.conns[slot as usize].rbuf;
                let version = (len > sp::HEADER).then(|| rbuf[sp::HEADER]);
                let why = match req {
                    Err(why) => why,
                    Ok(_) => "not a Hello or a Resume",
                };
                self.refuse_hello(slot, rid, version, why);
                return None;
            }
            sp::Decoded::Bad(why) => {
                self.reject(slot, why);
                return None;
            }
        };
        if !authed {
            // Answered, then closed: the client learns why.
            let peer = self.conns[slot as usize].peer;
            self.metrics.auth_failure();
            log!(
                Level::Warn,
                "auth_failed",
                "port=lock peer={} reason=\"session {} without the auth token\"",
                peer,
                match open {
                    Opening::Hello { .. } => "hello",
                    Opening::Resume { .. } => "resume",
                }
            );
            self.refuse_plain(slot, rid, Status::Unauthorized);
            return None;
        }
        Some((rid, open, len))
    }

    /// Answers a connection's first frame with a plain Reply of `status`,
    /// then closes.
    pub(super) fn refuse_plain(&mut self, slot: u32, rid: u32, status: Status) {
        let c = &mut self.conns[slot as usize];
        self.metrics
            .at(self.me)
            .session_request(first_op(&c.rbuf), status);
        c.rbuf.clear();
        sp::encode_reply(rid, status, 0, sp::NO_TTL, &mut c.out);
        c.close_after_send = true;
        c.state = State::Answered;
        self.mark_dirty(slot);
    }

    /// The connection's first frame is a Hello: make it a session. False
    /// when more bytes are needed.
    pub(super) fn hello(&mut self, slot: u32) -> bool {
        let Some((rid, Opening::Hello { keepalive_ms }, len)) = self.opening(slot) else {
            return false;
        };
        let cfg = &self.cfg;
        let ka = if keepalive_ms == 0 {
            cfg.keepalive_ms
        } else {
            keepalive_ms.clamp(cfg.min_keepalive_ms, cfg.max_keepalive_ms)
        };
        let now_us = self.now.mono_us;
        let token = self.token(slot);
        let replicated = self.sessions_replicated();
        let sid = if replicated {
            let sid = self.table.next_session_id(self.me);
            self.open_replicated(sid, ka, token);
            sid
        } else {
            let sid = (self.me as u64) << 56 | self.next_sid;
            self.next_sid += 1;
            sid
        };
        let c = &mut self.conns[slot as usize];
        c.rbuf.drain(..len);
        c.persistent = true;
        c.sid = sid;
        c.keepalive_us = ka as u64 * 1000;
        c.heard_us = now_us;
        c.state = State::Session;
        // Sessions follow their keep-alive, not the idle timeout.
        self.untouch(slot);
        let flags = if replicated { sp::FLAG_RESUMABLE } else { 0 };
        let welcome = self.welcome(sid, ka, flags);
        let c = &mut self.conns[slot as usize];
        sp::encode_welcome(rid, &welcome, &mut c.out);
        self.session_deadlines
            .push(Reverse((now_us + ka as u64 * 1000, token)));
        self.metrics.session_opened();
        self.count_sess(SessionOp::Hello, Status::Ok);
        log!(
            Level::Debug,
            "session_open",
            "session={:#x} conn={:#x} keepalive_ms={}",
            sid,
            token,
            ka
        );
        self.gate(slot);
        self.pump_session(slot);
        true
    }

    /// The welcome of session `sid` (a Hello's or a Resume's answer).
    pub(super) fn welcome(&self, sid: u64, keepalive_ms: u32, flags: u8) -> sp::Welcome {
        // Every server takes an Acquire's access, and watches.
        let flags = flags | sp::FLAG_MODES | sp::FLAG_WATCH | sp::FLAG_PROCLAIM;
        sp::Welcome {
            status: Status::Ok,
            version: sp::VERSION,
            keepalive_ms,
            min_ttl_ms: self.cfg.min_ttl_ms,
            max_ttl_ms: self.cfg.max_ttl_ms,
            session_id: sid,
            max_keys: self.cfg.max_keys.min(u32::MAX as usize) as u32,
            max_waiters: self.cfg.max_waiters.min(u32::MAX as usize) as u32,
            shards: self.shards.min(u16::MAX as usize) as u16,
            flags,
        }
    }

    /// Answers a Hello that opens no session and closes the connection:
    /// `unsupported version` naming [`sp::VERSIONS`] when `version` is not
    /// one of them, else `invalid` (a plain Reply).
    pub(super) fn refuse_hello(&mut self, slot: u32, rid: u32, version: Option<u8>, why: &str) {
        let c = &mut self.conns[slot as usize];
        let peer = c.peer;
        let op = first_op(&c.rbuf);
        c.rbuf.clear();
        match version {
            Some(v) if !sp::VERSIONS.contains(&v) => {
                let status = Status::UnsupportedVersion;
                self.metrics.at(self.me).session_request(op, status);
                log!(
                    Level::Info,
                    "hello_refused",
                    "peer={} reason=\"unsupported session protocol version {}\"",
                    peer,
                    v
                );
                sp::encode_refusal(rid, status, sp::VERSIONS, &mut c.out);
            }
            _ => {
                self.metrics
                    .at(self.me)
                    .session_request(op, Status::Invalid);
                log!(
                    Level::Debug,
                    "hello_refused",
                    "peer={} reason=\"{}\"",
                    peer,
                    crate::log::Escaped(why)
                );
                sp::encode_reply(rid, Status::Invalid, 0, sp::NO_TTL, &mut c.out);
            }
        }
        c.close_after_send = true;
        c.state = State::Answered;
        self.mark_dirty(slot);
    }

    /// Decodes and routes every whole frame of a session connection.
    pub(super) fn pump_session(&mut self, slot: u32) {
        loop {
            let c = &self.conns[slot as usize];
            if c.state != State::Session || c.rbuf.is_empty() || self.resuming(slot) {
                break;
            }
            let (op, rid, req, len) = match sp::decode(&c.rbuf) {
                sp::Decoded::Incomplete => break,
                sp::Decoded::Bad(why) => {
                    let why = why.to_string();
                    self.violation(slot, &why);
                    return;
                }
                sp::Decoded::Frame { op, rid, req, len } => (op, rid, req, len),
            };
            let peer = c.peer;
            let parsed = self.session_req(req, peer);
            self.conns[slot as usize].rbuf.drain(..len);
            self.answer_or_route(slot, op, rid, peer, parsed);
            if self.conns[slot as usize].state != State::Session {
                return;
            }
        }
    }

    /// A decoded request of a client at `peer` checked and made the op to
    /// route: `Ok(None)` for a Ping, `Err` why it is invalid.
    fn session_req(
        &self,
        req: Result<Req<'_>, &'static str>,
        peer: SocketAddr,
    ) -> Result<Option<SessOp>, &'static str> {
        match req {
            Err(why) => Err(why),
            Ok(Req::Hello { .. }) => Err("a session's Hello comes once, first"),
            Ok(Req::Resume { .. }) => Err("a Resume comes first, instead of a Hello"),
            Ok(Req::Ping) => Ok(None),
            Ok(Req::Acquire {
                hold,
                ttl_ms,
                wait_ms,
                key,
                source,
                access,
            }) => self.check_ttl(hold, ttl_ms).map(|()| {
                let mut source = Source::new(source).expect("decoder bounds sources");
                if source.is_empty() {
                    source = super::ip_name(&peer);
                }
                Some(SessOp::Acquire {
                    hold,
                    ttl_ms: if hold == HoldMode::Lease { ttl_ms } else { 0 },
                    wait_ms,
                    key: Name::new(key).expect("decoder bounds names"),
                    source,
                    access,
                })
            }),
            Ok(Req::Release { token, key }) => Ok(Some(SessOp::Release {
                token,
                key: Name::new(key).expect("decoder bounds names"),
            })),
            Ok(Req::Extend { token, ttl_ms, key }) => {
                self.check_ttl(HoldMode::Lease, ttl_ms).map(|()| {
                    Some(SessOp::Extend {
                        token,
                        ttl_ms,
                        key: Name::new(key).expect("decoder bounds names"),
                    })
                })
            }
            Ok(Req::Cancel { target, key }) => Ok(Some(SessOp::Cancel {
                target,
                key: Name::new(key).expect("decoder bounds names"),
            })),
            Ok(Req::Watch { key }) => Ok(Some(SessOp::Watch {
                key: Name::new(key).expect("decoder bounds names"),
            })),
            Ok(Req::Unwatch { target, key }) => Ok(Some(SessOp::Unwatch {
                target,
                key: Name::new(key).expect("decoder bounds names"),
            })),
            Ok(Req::Proclaim { token, key, source }) => {
                let mut source = Source::new(source).expect("decoder bounds sources");
                if source.is_empty() {
                    source = super::ip_name(&peer);
                }
                Ok(Some(SessOp::Proclaim {
                    token,
                    key: Name::new(key).expect("decoder bounds names"),
                    source,
                }))
            }
        }
    }

    /// Sends a checked request (`op`, `rid`) to its key's owner, or
    /// answers here a Ping or an invalid one (counted, logged).
    fn answer_or_route(
        &mut self,
        slot: u32,
        op: u8,
        rid: u32,
        peer: SocketAddr,
        parsed: Result<Option<SessOp>, &'static str>,
    ) {
        match parsed {
            Err(why) => {
                log!(
                    Level::Debug,
                    "bad_session_request",
                    "peer={} op={} reason=\"{}\"",
                    peer,
                    op,
                    crate::log::Escaped(why)
                );
                // The decoder frames session ops only.
                if let Some(op) = SessionOp::from_byte(op) {
                    self.count_sess(op, Status::Invalid);
                }
                self.session_out_local(slot, reply(rid, Status::Invalid));
            }
            Ok(None) => {
                self.count_sess(SessionOp::Ping, Status::Ok);
                self.session_out_local(slot, reply(rid, Status::Ok))
            }
            Ok(Some(op)) => self.route(slot, rid, op),
        }
    }

    fn check_ttl(&self, hold: HoldMode, ttl_ms: u32) -> Result<(), &'static str> {
        match hold {
            HoldMode::Lease if !(self.cfg.min_ttl_ms..=self.cfg.max_ttl_ms).contains(&ttl_ms) => {
                Err("lease TTL outside the server's bounds")
            }
            HoldMode::Lease => Ok(()),
            _ if ttl_ms != 0 => Err("a TTL is only for a lease"),
            _ => Ok(()),
        }
    }

    /// Sends a request to its key's owner (this shard or another).
    fn route(&mut self, slot: u32, rid: u32, op: SessOp) {
        let key = match &op {
            SessOp::Acquire { key, .. }
            | SessOp::Release { key, .. }
            | SessOp::Extend { key, .. }
            | SessOp::Cancel { key, .. }
            | SessOp::Watch { key }
            | SessOp::Unwatch { key, .. }
            | SessOp::Proclaim { key, .. } => *key,
        };
        let to = owner(key.as_bytes(), self.shards);
        let home = self.token(slot);
        let c = &mut self.conns[slot as usize];
        c.mask |= 1u64 << (to % 64);
        let (sid, peer) = (c.sid, c.peer);
        if to == self.me {
            self.run_op(sid, home, rid, peer, op);
        } else {
            self.cmds.push(Cmd::Sess {
                to,
                msg: Box::new(SessMsg::Op {
                    sid,
                    home,
                    rid,
                    peer,
                    op,
                }),
            });
        }
    }

    /// Writes an answer into a session connection's output (gated on the
    /// log like any answer).
    fn session_out_local(&mut self, slot: u32, out: SessOut) {
        let c = &mut self.conns[slot as usize];
        match out {
            SessOut::Reply {
                rid,
                status,
                token,
                ttl_left_ms,
            } => sp::encode_reply(rid, status, token, ttl_left_ms, &mut c.out),
            SessOut::Lost { key, token, why } => {
                self.metrics.lost_pushed();
                sp::encode_lost(key.as_bytes(), token, why, &mut c.out)
            }
            SessOut::Event {
                rid,
                kind,
                token,
                hold,
                access,
                key,
                source,
            } => sp::encode_event(
                rid,
                kind,
                &sp::EventHolder {
                    token,
                    hold,
                    access,
                    key: key.as_bytes(),
                    source: source.as_bytes(),
                },
                &mut c.out,
            ),
        }
        if c.out.len() > SESSION_OUT_MAX {
            self.violation(slot, "session answers not read by the client");
            return;
        }
        self.gate(slot);
    }

    /// The session on `slot` ends: every shard it used forgets it (session
    /// holds go to their next waiters, queued requests are withdrawn), and
    /// the connection closes.
    pub(super) fn end_session(&mut self, slot: u32, why: &str) {
        let c = &mut self.conns[slot as usize];
        if c.state == State::Closing || c.sid == 0 {
            return;
        }
        let (sid, mask) = (c.sid, c.mask);
        let peer = c.peer;
        c.dead = true;
        c.read_closed = true;
        log!(
            Level::Info,
            "session_end",
            "session={:#x} peer={} reason=\"{}\"",
            sid,
            peer,
            crate::log::Escaped(why)
        );
        self.metrics.session_ended();
        if sid & crate::core::REPLICATED_SESSION != 0 {
            self.close_replicated(sid);
        }
        for to in 0..self.shards {
            if self.shards <= 64 && mask & (1u64 << to) == 0 {
                continue;
            }
            if to == self.me {
                let now = self.now;
                self.table.owner_end(sid, now, &mut self.fx);
                self.unwatch_session(sid);
            } else {
                self.cmds.push(Cmd::Sess {
                    to,
                    msg: Box::new(SessMsg::End { sid }),
                });
            }
        }
        self.conns[slot as usize].out.clear();
        self.close(slot);
        self.apply_effects();
    }

    /// Ends every session whose client was silent past its deadline.
    pub(super) fn expire_sessions(&mut self) {
        let now = self.now.mono_us;
        while let Some(&Reverse((d, token))) = self.session_deadlines.peek() {
            if d > now {
                break;
            }
            self.session_deadlines.pop();
            let Some(slot) = self.conn_of(token) else {
                continue;
            };
            let c = &self.conns[slot as usize];
            if c.state != State::Session {
                continue;
            }
            let due = c.heard_us + c.keepalive_us;
            if due <= now {
                self.metrics.session_expired();
                self.end_session(slot, "keep-alive deadline passed");
            } else {
                self.session_deadlines.push(Reverse((due, token)));
            }
        }
    }

    /// Session traffic from another shard (or from this one's own driver).
    pub fn on_sess(&mut self, msg: Box<SessMsg>) {
        match *msg {
            SessMsg::Op {
                sid,
                home,
                rid,
                peer,
                op,
            } => self.run_op(sid, home, rid, peer, op),
            SessMsg::End { sid } => {
                let now = self.now;
                self.table.owner_end(sid, now, &mut self.fx);
                self.unwatch_session(sid);
            }
            SessMsg::Orphan { sid } => {
                self.unwatch_session(sid);
                self.orphaned(sid)
            }
            SessMsg::Adopt { sid, home } => {
                // A watch does not move with its session: the client
                // watches again on the new connection.
                self.unwatch_session(sid);
                self.adopt(sid, home)
            }
            SessMsg::Adopted { sid, home, held } => self.adopted(sid, home, held),
            SessMsg::Detach { sid, home } => {
                if let Some(slot) = self.session_conn(sid, home) {
                    self.detach_session(slot, "another shard's group lost its leader");
                }
            }
            SessMsg::Out { sid, home, out } => {
                if let Some(slot) = self.session_conn(sid, home) {
                    self.session_out_local(slot, out);
                }
            }
            SessMsg::Kill { sid, home } => {
                if let Some(slot) = self.session_conn(sid, home) {
                    self.end_session(slot, "another shard's log failed under what it answered");
                }
            }
        }
        self.apply_effects();
    }

    /// The live session connection `home` of session `sid`, if any.
    pub(super) fn session_conn(&self, sid: u64, home: Token) -> Option<u32> {
        if !routable(home) {
            return None;
        }
        let slot = self.conn_of(home)?;
        let c = &self.conns[slot as usize];
        (c.state == State::Session && c.sid == sid && !c.dead).then_some(slot)
    }

    // ----- owner side -----------------------------------------------------------

    /// Runs a session request on this shard's part of the table.
    fn run_op(&mut self, sid: u64, home: Token, rid: u32, peer: SocketAddr, op: SessOp) {
        if self.refused_here(sid, home, rid, &op) {
            return;
        }
        let op = match op {
            SessOp::Watch { key } => return self.watch_op(sid, home, rid, key),
            SessOp::Unwatch { target, key } => return self.unwatch_op(sid, home, rid, target, key),
            op => op,
        };
        let now = self.now;
        let Some(o) = self.table.owner_open(sid, home) else {
            self.count_sess(op.kind(), Status::Limit);
            self.send_out(sid, home, reply(rid, Status::Limit));
            return;
        };
        match op {
            SessOp::Acquire {
                hold,
                ttl_ms,
                wait_ms,
                key,
                source,
                access,
            } => {
                let (mode, opts) = acquire_opts(o, now.mono_us, hold, ttl_ms, wait_ms);
                let conn = table_token(o, rid);
                self.table.lock_access(
                    conn,
                    &key,
                    &source,
                    peer,
                    mode,
                    opts,
                    access,
                    now,
                    &mut self.fx,
                );
                self.apply_effects();
            }
            SessOp::Release { token, key } => {
                let r = self.table.release_token(o, &key, token, now, &mut self.fx);
                self.apply_effects();
                self.count_sess(SessionOp::Release, checked_status(r));
                self.send_out(sid, home, reply(rid, checked_status(r)));
            }
            SessOp::Extend { token, ttl_ms, key } => {
                let outcome = self.extend_logged(o, &key, token, ttl_ms);
                self.answer_token(sid, home, rid, SessionOp::Extend, outcome);
            }
            SessOp::Cancel { target, key } => {
                let st = self.cancel_queued(o, target, &key);
                self.count_sess(SessionOp::Cancel, st);
                self.send_out(sid, home, reply(rid, st));
            }
            SessOp::Proclaim { token, key, source } => {
                let outcome = self.proclaim_logged(o, &key, token, &source);
                self.answer_token(sid, home, rid, SessionOp::Proclaim, outcome);
            }
            SessOp::Watch { .. } | SessOp::Unwatch { .. } => unreachable!("run above"),
        }
    }

    /// Answers a request this shard must not run, true if so: its group
    /// does not serve (the session is detached), or a peer could not read
    /// the record of the request's source.
    fn refused_here(&mut self, sid: u64, home: Token, rid: u32, op: &SessOp) -> bool {
        if !self.group_serves() {
            // The home serves, this shard's group does not (it lost its
            // leader, or another node leads it): as when the group steps
            // down under a session, the session is detached, nothing run
            // (cluster simulator seed 11198: an Acquire queued in a
            // follower's table, where no release ever granted it).
            self.count_sess(op.kind(), Status::NotLeader);
            self.send_home(sid, home, SessMsg::Detach { sid, home });
            return true;
        }
        if let SessOp::Acquire { source, .. } | SessOp::Proclaim { source, .. } = op {
            if source.len() > crate::core::LOCK_PORT_SOURCE_MAX && !self.long_sources_replicated() {
                // A peer of an earlier version could not read its record
                // (answered as that version answers such a source).
                self.count_sess(op.kind(), Status::Invalid);
                self.send_out(sid, home, reply(rid, Status::Invalid));
                return true;
            }
        }
        false
    }

    /// Extends hold `token` of owner `o` on `key` to `ttl_ms` from now and
    /// logs it (undone if the log fails): the token and the time left, or
    /// why not.
    fn extend_logged(
        &mut self,
        o: u32,
        key: &Name,
        token: u64,
        ttl_ms: u32,
    ) -> Result<(u64, u32), Checked> {
        let now = self.now;
        let x = self.table.extend(o, key, token, ttl_ms, now)?;
        if let Some(log) = self.journal.records_mut() {
            let lsn = log.append_extend(&x.key, x.grant_id, x.expires_unix_ms);
            self.undo_on_failure(lsn, Undo::Extend(x));
        }
        Ok((token, ttl_ms))
    }

    /// Cancels owner `o`'s Acquire `target` if it is queued on `key`,
    /// its `cancelled` sent: the Cancel's status.
    fn cancel_queued(&mut self, o: u32, target: u32, key: &Name) -> Status {
        // Only an Acquire queued on the key the Cancel names: the
        // rule cannot depend on whether another key happens to live
        // on the same shard (the table matches rid and key).
        let conn = table_token(o, target);
        let cancelled = self.table.cancel(o, conn, key.as_bytes(), &mut self.fx);
        // The Acquire's `cancelled` goes out before the Cancel's `ok`.
        self.apply_effects();
        if cancelled {
            Status::Ok
        } else {
            Status::NotQueued
        }
    }

    /// Makes owner `o`'s hold `token` on `key` proclaim `source`, logged
    /// (undone if the log fails) and told to watchers: the token and no
    /// TTL, or why not.
    fn proclaim_logged(
        &mut self,
        o: u32,
        key: &Name,
        token: u64,
        source: &Source,
    ) -> Result<(u64, u32), Checked> {
        let p = self.table.proclaim(o, key, token, source.as_bytes())?;
        if let Some(log) = self.journal.records_mut() {
            let (now_held, _) = self.table.granted(p.key_slot, token);
            let lsn = log.append_reacquire(p.prev.as_ref(), now_held);
            self.undo_on_failure(lsn, Undo::Proclaim { prev: p.prev });
        }
        if !self.watches.is_empty() {
            self.watch_proclaimed(p.key_slot, token);
        }
        Ok((token, sp::NO_TTL))
    }

    /// The Reply of a request on a hold by token (Extend, Proclaim): `ok`
    /// with the token and the time left, or why not; counted.
    fn answer_token(
        &mut self,
        sid: u64,
        home: Token,
        rid: u32,
        op: SessionOp,
        outcome: Result<(u64, u32), Checked>,
    ) {
        let (st, out) = match outcome {
            Ok((token, ttl_left_ms)) => (
                Status::Ok,
                SessOut::Reply {
                    rid,
                    status: Status::Ok,
                    token,
                    ttl_left_ms,
                },
            ),
            Err(c) => (checked_status(c), reply(rid, checked_status(c))),
        };
        self.count_sess(op, st);
        self.send_out(sid, home, out);
    }

    /// An answer for session `sid`: written at once if its home is this
    /// shard, else sent there once this shard's log holds it durably.
    pub(super) fn send_out(&mut self, sid: u64, home: Token, out: SessOut) {
        if home_of(sid) == self.me {
            if let Some(slot) = self.session_conn(sid, home) {
                self.session_out_local(slot, out);
            }
            return;
        }
        self.send_home(sid, home, SessMsg::Out { sid, home, out });
    }

    /// A message for session `sid`'s home shard, behind this shard's log;
    /// handled at once when this shard is the home (the answers it writes
    /// are gated there).
    pub(super) fn send_home(&mut self, sid: u64, home: Token, msg: SessMsg) {
        let to = home_of(sid);
        if !routable(home) {
            return;
        }
        if to == self.me {
            self.on_sess(Box::new(msg));
            return;
        }
        self.sess_when_durable(to, Box::new(msg));
    }

    /// The session side of a table effect whose connection token has
    /// [`SESS_BIT`] (the log record, if any, is written by the caller).
    pub(super) fn session_effect(&mut self, e: &Effect) {
        let (conn, out) = match *e {
            Effect::Reply { conn, reply: r } if conn & SESS_BIT != 0 => {
                (conn, super::session::reply(conn as u32, status_of(r)))
            }
            Effect::Granted {
                conn,
                key_slot,
                grant_id,
                ..
            } if conn & SESS_BIT != 0 => {
                let (held, expires_mono_us) = self.table.granted(key_slot, grant_id);
                (
                    conn,
                    SessOut::Reply {
                        rid: conn as u32,
                        status: Status::Ok,
                        token: grant_id,
                        ttl_left_ms: if held.mode == HoldMode::Lease {
                            ((expires_mono_us.saturating_sub(self.now.mono_us)) / 1000)
                                .min(sp::NO_TTL as u64 - 1) as u32
                        } else {
                            sp::NO_TTL
                        },
                    },
                )
            }
            Effect::Released {
                released,
                grant_id,
                holder_conn,
                cause,
                ..
            } if holder_conn & SESS_BIT != 0 => {
                // A Lost push (rare): the key's name is copied into it.
                let key = crate::core::Name::new(self.table.released(released, grant_id).key)
                    .expect("keys are at most KEY_MAX");
                if !cause.forced() {
                    return;
                }
                let why = if cause == crate::core::ReleaseCause::Expired {
                    LostWhy::Expired
                } else {
                    LostWhy::Reset
                };
                (
                    holder_conn,
                    SessOut::Lost {
                        key,
                        token: grant_id,
                        why,
                    },
                )
            }
            _ => return,
        };
        let o = ((conn & !SESS_BIT) >> 32) as u32;
        if let Some((sid, home)) = self.table.owner_info(o) {
            if let SessOut::Reply { status, .. } = out {
                // Table replies and grants to sessions answer Acquires.
                self.count_sess(SessionOp::Acquire, status);
            }
            self.send_out(sid, home, out);
        }
    }

    /// Counts one session Reply this shard decided (metrics).
    pub(super) fn count_sess(&self, op: SessionOp, status: Status) {
        self.metrics.at(self.me).session_request(op, status);
    }
}

impl SessOp {
    /// The op as the metrics name it.
    fn kind(&self) -> SessionOp {
        match self {
            SessOp::Acquire { .. } => SessionOp::Acquire,
            SessOp::Release { .. } => SessionOp::Release,
            SessOp::Extend { .. } => SessionOp::Extend,
            SessOp::Cancel { .. } => SessionOp::Cancel,
            SessOp::Watch { .. } => SessionOp::Watch,
            SessOp::Unwatch { .. } => SessionOp::Unwatch,
            SessOp::Proclaim { .. } => SessionOp::Proclaim,
        }
    }
}

/// The op of a connection's first frame, at the start of `rbuf` (a Hello
/// or a Resume, the only ops that open a connection; Hello otherwise).
fn first_op(rbuf: &[u8]) -> SessionOp {
    rbuf.first()
        .copied()
        .and_then(SessionOp::from_byte)
        .unwrap_or(SessionOp::Hello)
}

fn checked_status(c: Checked) -> Status {
    match c {
        Checked::Ok => Status::Ok,
        Checked::Stale => Status::Stale,
        Checked::NotOwner => Status::NotOwner,
        Checked::NotLease => Status::Invalid,
        Checked::Limit => Status::Limit,
    }
}
