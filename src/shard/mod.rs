//! The shard: everything one event loop decides, as a pure state machine.
//!
//! It owns the connection protocol states ([`conn::State`]), the lock table,
//! the durability gate (`gate.rs`: held replies, parked messages for other
//! shards, the undo list) and its journal (`journal.rs`): where records
//! become durable (nowhere, the local log, or the Raft group), each kept
//! as batches of records ([`crate::wal::log::Log`]). It is
//! fed events — a connection accepted, bytes received, a send completed, a
//! hang-up, a log chain landed, the time — through its `on_*` methods, and
//! answers with [`Cmd`]s for its driver: send a connection's answer, close
//! it, run a log chain. It makes no syscall, reads no clock and holds no
//! `unsafe`: the io_uring driver (`ringlock::driver`) and the deterministic
//! simulator (`tests/sim`) drive the same code.
//!
//! # Tick
//! [`Shard::begin_tick`] (the time) → events → [`Shard::end_tick`]: expire
//! partial frames, close the log batch (the next chain if none is in flight),
//! hand over every answer whose records are durable, publish gauges. The
//! driver then executes the commands and waits.
//!
//! # Files
//! `mod.rs` (state, events), `cmd.rs` (what the shard asks its driver),
//! `lifecycle.rs` (the connection state machine: pumping frames, bad input,
//! dying, closing, the idle list), `lockport.rs` and `adminport.rs`
//! (decoding and executing requests), `effects.rs` (the table's effects
//! turned into records, metrics and answers — the one place), `gate.rs`
//! (the durability gate's data) and `durable.rs` (the shard's side of it:
//! the log's completions, answers let through, failures undone),
//! `gather.rs` (requests spanning shards), `msg.rs` (messages between
//! shards), `session.rs` and `resume.rs` (the session protocol), `keys.rs`
//! (streamed listings), `watch.rs` (watchers), `forward.rs` and `raft.rs`
//! (cluster mode: the Raft journal's replica; no file outside `raft/`
//! touches it, the others ask `journal.rs`). A folder beside a file holds the data its file works
//! on (`keys/stream.rs`, `resume/registry.rs`, `forward/state.rs`,
//! `raft/group.rs`), so that `mod.rs` names the shard's parts without
//! depending on the code that drives them: no two files depend on each
//! other (`tests/layering.rs`).
//!
//! # Connection rules
//! - One-shot by default: a connection carries one request and is closed by
//!   the server after its answer (the FIN follows the answer), as
//!   Locking-Center does. Bytes after the first frame are refused with one
//!   `-` after the first answer.
//! - A connection that opts in (action Persist) carries any number of
//!   requests, answered in order, pipelined or not; the next frame is
//!   decoded once the previous answer was handed to the kernel.
//! - End of input (the peer half-closed, or closed): every whole frame
//!   received before it is still executed and answered; a Lock that would
//!   have to wait is withdrawn instead (answered `-` on a persistent
//!   connection, so later answers keep their places; a one-shot connection
//!   is just closed, its client sees EOF). A queued waiter is withdrawn the
//!   moment the input ends.
//! - A grant whose `+` was not handed to the kernel when the connection
//!   died is given back at once (never a ghost holder).
//! - Bad input answers `-` and closes; it never reaches the lock table.

mod adminport;
mod cmd;
pub mod conn;
mod durable;
mod effects;
mod forward;
mod gate;
mod gather;
mod journal;
mod keys;
mod lifecycle;
mod lockport;
pub mod msg;
pub mod raft;
mod resume;
pub mod session;
mod watch;
mod watchset;

use std::net::SocketAddr;
use std::sync::Arc;

use crate::config::{Config, LOCK_RECV_BUF};
use crate::core::{Effect, Effects, LockMode, Name, Now, Reply, Source, Table, Token};
use crate::log::Level;
use crate::metrics::{self, Metrics};
use crate::protocol::{self, admin, Action, Decoded};
use crate::wal::log::Log;
use conn::{Conn, Port, State};
use gate::Undo;
use msg::SESS_BIT;

pub use cmd::Cmd;
pub use msg::{Detached, RemoteOp, RemoteResult};

/// Undecoded bytes a lock-port connection may hold: one frame plus the
/// requests pipelined behind it. More while a request is outstanding is a
/// protocol violation (the connection is closed, its waiter withdrawn).
pub const LOCK_PIPELINE_BYTES_MAX: usize = LOCK_RECV_BUF;

/// Open connections of every shard, per port (`[lock, admin]`): the admin
/// port has its own small budget, so a flood of lock-port connections
/// cannot lock the operator out. One per server, built by the driver's
/// `mesh::Shared` and given to each shard by [`Shard::place`].
pub type ConnCounts = [std::sync::atomic::AtomicUsize; 2];

fn port_index(p: Port) -> usize {
    match p {
        Port::Lock => 0,
        Port::Admin => 1,
    }
}

pub use crate::core::route::owner;

/// A scatter/gather in progress for a connection of this shard.
struct Gather {
    id: u64,
    token: Token,
    op: RemoteOp,
    pending: usize,
    failed: bool,
    /// Lock-port ResetBySource (one `+`) rather than an admin command.
    lock_port: bool,
    /// RSTK: which keys were reset.
    reset: Vec<bool>,
    /// A round of the KEYS stream with this id (0: none).
    stream: u64,
    /// CLST: the shards' records so far.
    status: Vec<protocol::status::ShardStatus>,
    /// CMEM: the shards' records so far.
    members: Vec<protocol::members::MemberStatus>,
    /// CCHG: why shards refused.
    refused: Vec<String>,
}

pub struct Shard {
    cfg: Config,
    conns: Vec<Conn>,
    free_slots: Vec<u32>,
    open_conns: usize,
    table: Table,
    fx: Effects,
    fx_spare: Effects,
    /// Nesting of `apply_effects` (an applied effect may run a table
    /// operation whose effects are applied within it).
    fx_depth: u32,
    dirty: Vec<u32>,
    partial: crate::core::list::List,
    metrics: Arc<Metrics>,
    cmds: Vec<Cmd>,
    stopping: bool,
    now: Now,
    last_oldest_ms: u64,
    /// Where records become durable: memory, the local log, or the Raft
    /// group ([`journal::Journal`]).
    journal: journal::Journal,
    /// Limit refusals are logged at most once per second.
    limit_log_after_us: u64,
    /// So are lock-port actions refused by policy.
    policy_log_after_us: u64,
    /// Held answers, parked messages and the undo list.
    durability: gate::Gate,
    /// This shard's index and the number of shards.
    me: usize,
    shards: usize,
    gathers: Vec<Gather>,
    next_gather_id: u64,
    /// KEYS answers being streamed from this shard's connections.
    streams: Vec<keys::stream::Stream>,
    /// Listings this shard keeps for streams (its own and other shards').
    served: Vec<keys::stream::Served>,
    /// Session ids handed out by this shard (its index in the top byte).
    next_sid: u64,
    /// Keep-alive deadlines `(mono µs, connection)`; an entry whose
    /// session was heard from since is pushed again with its new deadline.
    session_deadlines: std::collections::BinaryHeap<std::cmp::Reverse<(u64, Token)>>,
    /// Replicated sessions: who has them, resumes in progress, windows.
    resumes: resume::registry::Resumes,
    /// Open connections (not sessions) by last traffic, oldest first (link
    /// slot 1 of [`Conn`]): the idle timeout looks at the front only.
    idle: crate::core::list::List,
    /// Open connections of every shard (`--max-connections` is the
    /// server's): counted at accept and close, not when a connection moves.
    all_conns: Option<Arc<ConnCounts>>,
    /// Cluster mode: Locking-Center requests forwarded to the leader, or
    /// served for a follower.
    forwards: forward::state::Forwards,
    /// Sessions watching this shard's keys ([`watch`]).
    watches: watchset::Watches,
    watch_scratch: Vec<watchset::Watcher>,
    /// This node's client (lock) and admin addresses as it tells clients
    /// (Locate, `CADR`; see [`Shard::advertise`]).
    advertised: (String, String),
}

impl Shard {
    /// A shard over a (recovered) table; `log` is `Some` in durable mode.
    pub fn new(
        cfg: Config,
        table: Table,
        log: Option<Log>,
        metrics: Arc<Metrics>,
        now: Now,
    ) -> Shard {
        let cap = cfg.max_connections.min(65_536);
        let mut table = table;
        // Fencing tokens: in memory mode nothing survives a restart, so each
        // run starts its grant ids at its start time in Unix µs, above
        // every id of an earlier run (docs/protocol.md, "Fencing tokens").
        // A recovered log's ids are kept if higher.
        table.raise_next_grant_id(now.unix_ms.saturating_mul(1000));
        Shard {
            conns: Vec::with_capacity(cap),
            free_slots: Vec::with_capacity(cap),
            open_conns: 0,
            table,
            fx: Vec::with_capacity(1024),
            fx_spare: Vec::with_capacity(1024),
            fx_depth: 0,
            dirty: Vec::with_capacity(1024),
            partial: crate::core::list::List::new(),
            metrics,
            cmds: Vec::with_capacity(1024),
            stopping: false,
            now,
            last_oldest_ms: 0,
            journal: log.map_or(journal::Journal::Memory, journal::Journal::Local),
            limit_log_after_us: 0,
            policy_log_after_us: 0,
            durability: gate::Gate::with_capacity(cap, 4096),
            me: 0,
            shards: 1,
            gathers: Vec::new(),
            next_gather_id: 1,
            streams: Vec::new(),
            served: Vec::new(),
            next_sid: 1,
            session_deadlines: std::collections::BinaryHeap::new(),
            resumes: resume::registry::Resumes::default(),
            idle: crate::core::list::List::new(),
            all_conns: None,
            forwards: {
                let mut f = forward::state::Forwards::default();
                f.start(now.unix_ms);
                f
            },
            watches: watchset::Watches::default(),
            watch_scratch: Vec::new(),
            advertised: (cfg.bind.to_string(), cfg.admin_bind.to_string()),
            cfg,
        }
    }

    /// The lock and admin addresses this node gives clients in its
    /// directory (Locate, `CADR`): the bound ones (not port 0), with a
    /// cluster node's `--peers` host for a wildcard bind.
    pub fn advertise(&mut self, lock: String, admin: String) {
        self.advertised = (lock, admin);
    }

    /// Places this shard as number `me` of `shards` (default 0 of 1);
    /// `all_conns` counts the open connections of every shard.
    pub fn place(&mut self, me: usize, shards: usize, all_conns: Arc<ConnCounts>) {
        assert!(me < shards);
        self.me = me;
        self.shards = shards;
        self.all_conns = Some(all_conns);
    }

    pub fn index(&self) -> usize {
        self.me
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }
    pub fn table(&self) -> &Table {
        &self.table
    }
    pub fn open_connections(&self) -> usize {
        self.open_conns
    }
    /// Connection slots ever allocated (the pool's high-water mark).
    pub fn slots(&self) -> usize {
        self.conns.len()
    }
    pub fn log(&self) -> Option<&Log> {
        self.journal.records()
    }
    pub fn stopping(&self) -> bool {
        self.stopping
    }
    /// Replies held for the log (for invariant checks).
    pub fn held_replies(&self) -> usize {
        self.durability.len()
    }

    /// Moves the pending commands into `out` (which must be empty).
    pub fn take_cmds(&mut self, out: &mut Vec<Cmd>) {
        debug_assert!(out.is_empty());
        std::mem::swap(&mut self.cmds, out);
    }

    /// True while the shard has work for its next tick even without an
    /// event (a background snapshot being encoded a chunk per tick): the
    /// loop polls instead of waiting.
    pub fn busy_between_events(&self) -> bool {
        self.journal.records().is_some_and(|l| l.encoding())
    }

    /// The earliest time (monotonic µs) at which the shard needs a tick
    /// with no event: a partial frame's read timeout or a log retry.
    pub fn next_deadline_us(&self) -> Option<u64> {
        let frame = self.partial.front().map(|slot| {
            self.conns[slot as usize].partial_since_us + self.cfg.frame_timeout_ms * 1000
        });
        let retry = self.journal.records().and_then(|l| l.retry_at_us());
        let expiry = self.table.next_expiry_us();
        let session = self.session_deadlines.peek().map(|r| r.0 .0);
        let idle = self
            .idle
            .front()
            .map(|slot| self.conns[slot as usize].active_us + self.cfg.idle_timeout_ms * 1000);
        let raft = self.journal_deadline_us();
        let resume = self.resumes.next_deadline_us();
        [frame, retry, expiry, session, idle, raft, resume]
            .into_iter()
            .flatten()
            .min()
    }

    pub fn begin_tick(&mut self, now: Now) {
        self.now = now;
        // One chunk of a background snapshot per tick, before its events:
        // the requests of every tick land between two chunks.
        if let Some(log) = self.journal.records_mut() {
            log.encode_step(&mut self.table);
        }
        self.journal_tick();
    }

    /// The end of a tick: expire frames, close the log batch, hand over
    /// durable answers, publish gauges.
    pub fn end_tick(&mut self) {
        self.apply_effects();
        self.expire_frames();
        let now = self.now;
        // Only a serving leader expires (a replica applies the releases).
        if self.may_serve() {
            self.table.expire(now, &mut self.fx);
        }
        self.apply_effects();
        self.expire_sessions();
        self.expire_detached();
        self.expire_idle();
        self.wal_tick();
        self.journal_pump();
        self.flush();
        self.publish_gauges();
        self.publish_raft();
    }

    fn token(&self, slot: u32) -> Token {
        ((self.conns[slot as usize].gen as u64) << 32) | slot as u64
    }

    /// The live connection a token names, if it still exists.
    fn conn_of(&self, token: Token) -> Option<u32> {
        let slot = token as u32;
        let c = self.conns.get(slot as usize)?;
        (c.live() && c.gen == (token >> 32) as u32).then_some(slot)
    }

    /// The slot a driver event names; a stale token is the driver's bug.
    fn slot_of(&self, token: Token, what: &str) -> u32 {
        let slot = token as u32;
        let c = self.conns.get(slot as usize);
        match c {
            Some(c) if c.gen == (token >> 32) as u32 && c.state != State::Free => slot,
            _ => panic!("{what} for stale connection token {token:#x}"),
        }
    }

    // ----- events ---------------------------------------------------------

    /// A connection was accepted. `None`: refuse it (the driver answers `-`
    /// and closes): over `--max-connections`, or shutting down.
    pub fn on_accept(&mut self, port: Port, peer: SocketAddr) -> Option<Token> {
        use std::sync::atomic::Ordering::Relaxed;
        let (limit, name) = match port {
            Port::Lock => (self.cfg.max_connections, "max_connections"),
            Port::Admin => (self.cfg.admin_connections, "admin_connections"),
        };
        let over_all = self.all_conns.as_ref().is_some_and(|all| {
            let n = &all[port_index(port)];
            if n.fetch_add(1, Relaxed) >= limit {
                n.fetch_sub(1, Relaxed);
                true
            } else {
                false
            }
        });
        let over_here = self.open_conns >= self.cfg.max_connections + self.cfg.admin_connections;
        if over_all || over_here || self.stopping {
            if !over_all {
                if let Some(all) = &self.all_conns {
                    all[port_index(port)].fetch_sub(1, Relaxed);
                }
            }
            self.metrics.connection_refused();
            if !self.stopping && self.now.mono_us >= self.limit_log_after_us {
                self.limit_log_after_us = self.now.mono_us + 1_000_000;
                log!(
                    Level::Warn,
                    "limit_reached",
                    "limit={} value={}",
                    name,
                    limit
                );
            }
            return None;
        }
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                self.conns.push(Conn::new());
                (self.conns.len() - 1) as u32
            }
        };
        self.conns[slot as usize].open(port, peer);
        self.touch(slot);
        self.open_conns += 1;
        let token = self.token(slot);
        log!(
            Level::Debug,
            "accept",
            "conn={:#x} port={:?} peer={}",
            token,
            port,
            peer
        );
        Some(token)
    }

    /// The connection's TLS handshake finished (before any of its
    /// plaintext arrives): `client` is the name of the verified client
    /// certificate it presented, if any. Such a certificate stands for the
    /// auth token on both ports.
    pub fn on_tls(&mut self, token: Token, client: Option<&str>) {
        let slot = self.slot_of(token, "tls");
        let c = &mut self.conns[slot as usize];
        c.tls = true;
        c.cert_client = client.map(Into::into);
        c.authed = c.port == Port::Admin && client.is_some();
        log!(
            Level::Debug,
            "tls",
            "conn={:#x} peer={} client={}",
            token,
            c.peer,
            client.unwrap_or("-")
        );
    }

    /// Bytes arrived on a connection (copied out of the driver's buffer).
    pub fn on_recv(&mut self, token: Token, bytes: &[u8]) {
        let slot = self.slot_of(token, "recv");
        let c = &mut self.conns[slot as usize];
        log!(
            Level::Debug,
            "recv",
            "conn={:#x} bytes={}",
            token,
            bytes.len()
        );
        if c.state == State::Closing || c.read_closed {
            return;
        }
        let cap = match c.port {
            Port::Lock if c.sid != 0 => crate::protocol::session::FRAME_MAX,
            Port::Lock => LOCK_PIPELINE_BYTES_MAX,
            Port::Admin => admin::FRAME_MAX,
        };
        // Anything from a session's client renews its keep-alive.
        c.heard_us = self.now.mono_us;
        self.touch(slot);
        let c = &mut self.conns[slot as usize];
        // At most `cap` bytes stay buffered between receives, and a receive
        // brings at most LOCK_RECV_BUF: the buffer's capacity covers both.
        c.rbuf.extend_from_slice(bytes);
        if c.state == State::Migrating {
            // The bytes travel with the connection.
            return;
        }
        self.pump(slot);
        if self.conns[slot as usize].rbuf.len() > cap {
            self.violation(slot, "receive buffer full while a request is outstanding");
            return;
        }
        self.apply_effects();
    }

    /// The peer ended its input: `errno` `None` for EOF (it may still read),
    /// `Some` for a reset or error (it is gone).
    pub fn on_peer_closed(&mut self, token: Token, errno: Option<i32>) {
        let slot = self.slot_of(token, "hang-up");
        log!(
            Level::Debug,
            "hang_up",
            "conn={:#x} errno={:?}",
            token,
            errno
        );
        let durable = self.journal.durable_lsn();
        let c = &mut self.conns[slot as usize];
        if c.state == State::Closing {
            return;
        }
        if c.state == State::Session {
            self.end_session(
                slot,
                if errno.is_some() {
                    "connection failed"
                } else {
                    "client closed the connection"
                },
            );
            return;
        }
        c.read_closed = true;
        if errno.is_some() {
            self.die(slot);
            // Giving back a grant may grant the next waiter: every event
            // leaves no effect unapplied (another event of this tick may
            // act on that waiter's connection).
            self.apply_effects();
            return;
        }
        match c.state {
            State::Queued { waiter } => {
                self.table.withdraw(waiter);
                self.metrics.hangup_withdrawal();
                self.withdrawn(slot);
            }
            State::Forwarded { id } => {
                // Withdrawn at the leader; an answer `+` that crosses it
                // is given back when it arrives.
                self.forward_abandoned(id);
                self.metrics.hangup_withdrawal();
                self.withdrawn(slot);
            }
            State::Idle => {
                self.pump(slot);
                self.settle_idle(slot);
            }
            // A grant whose `+` still waits for the log counts as not
            // delivered: the waiter left before it could be told, so the
            // key is given back and the Lock withdrawn (never a ghost
            // holder if the peer closed rather than half-closed). A grant
            // whose `+` only waits for this tick's send is delivered: the
            // frame came before the EOF, and a half-closed peer still reads
            // (tests/half_close.rs); if the send fails, on_send_done gives
            // it back.
            State::Answered if c.grant.is_some() && c.gate_lsn > durable => {
                c.out.clear();
                self.give_back_grant(slot);
                self.withdrawn(slot);
            }
            // The answer goes out first; on_send_done decides what follows.
            State::Answered | State::Sending => {}
            // The end of input travels with the connection; a gather's
            // answer is sent when it completes.
            State::Migrating | State::Gathering => {}
            State::Executing | State::Free | State::Closing | State::Session => {}
        }
        self.apply_effects();
    }

    /// The driver sent the whole answer (`Ok`) or the send failed.
    pub fn on_send_done(&mut self, token: Token, result: Result<(), i32>) {
        let slot = self.slot_of(token, "send completion");
        log!(
            Level::Debug,
            "send",
            "conn={:#x} errno={}",
            token,
            result.err().unwrap_or(0)
        );
        self.touch(slot);
        let c = &mut self.conns[slot as usize];
        let was_grant = c.grant_in_flight;
        c.grant_in_flight = false;
        if result.is_ok() && was_grant {
            // The `+` is in the kernel's hands: the grant is delivered.
            c.grant = None;
            c.fwd_grant = None;
        }
        if c.state == State::Closing {
            if result.is_err() {
                self.give_back_grant(slot);
            }
            self.apply_effects();
            return;
        }
        if c.state == State::Session {
            c.sending = false;
            match result {
                Err(_) => self.end_session(slot, "send failed"),
                // Answers that gathered during the send go next.
                Ok(()) if !c.out.is_empty() => self.mark_dirty(slot),
                Ok(()) => {}
            }
            return;
        }
        debug_assert_eq!(c.state, State::Sending);
        if let Err(errno) = result {
            if !matches!(errno, libc::EPIPE | libc::ECONNRESET | libc::ECANCELED) {
                log!(Level::Warn, "send_error", "errno={} peer={}", errno, c.peer);
            }
            // The peer is gone: a `+` in this send was not delivered.
            self.die(slot);
            self.apply_effects();
            return;
        }
        if self.keys_sent(slot) {
            self.apply_effects();
            return;
        }
        let c = &mut self.conns[slot as usize];
        c.state = State::Idle;
        if c.close_after_send {
            self.close(slot);
        } else if !c.persistent && c.action.is_some() {
            // One-shot: the answer is out; the FIN follows it. Bytes sent
            // after the one request were not served: say so.
            if c.rbuf.is_empty() {
                self.close(slot);
            } else {
                c.rbuf.clear();
                self.reject(slot, "more than one request on a one-shot connection");
            }
        } else {
            self.pump(slot);
            self.settle_idle(slot);
        }
        self.apply_effects();
    }

    /// The driver closed the socket; no op references it: free the slot.
    pub fn on_closed(&mut self, token: Token) {
        let slot = self.slot_of(token, "close");
        log!(Level::Debug, "close", "conn={:#x}", token);
        let port = self.conns[slot as usize].port;
        self.conns[slot as usize].release();
        self.free_slots.push(slot);
        self.open_conns -= 1;
        if let Some(all) = &self.all_conns {
            all[port_index(port)].fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// SIGINT/SIGTERM: no more accepts; every queued waiter is withdrawn and
    /// answered `-` (best effort, by the driver).
    pub fn stop(&mut self) {
        self.stopping = true;
        self.hand_over_on_stop();
        let mut answered = 0;
        for slot in 0..self.conns.len() {
            match self.conns[slot].state {
                State::Queued { waiter } if self.conns[slot].fwd.is_some() => {
                    // A follower's request: `-` goes back over the link.
                    self.table.withdraw(waiter);
                    self.free_forwarded(slot as u32, Some(b'-'));
                    answered += 1;
                }
                State::Queued { waiter } => {
                    self.table.withdraw(waiter);
                    self.conns[slot].state = State::Answered;
                    let token = self.token(slot as u32);
                    self.cmds.push(Cmd::Farewell(token));
                    answered += 1;
                }
                State::Forwarded { id } if self.forward_sent(id) => {
                    // Its outcome is the leader's: closed unanswered, as a
                    // direct connection to that leader would be.
                    self.conns[slot].dead = true;
                    self.close(slot as u32);
                }
                State::Forwarded { id } => {
                    // Parked, never sent: nothing was done.
                    self.forward_abandoned(id);
                    self.conns[slot].state = State::Answered;
                    let token = self.token(slot as u32);
                    self.cmds.push(Cmd::Farewell(token));
                    answered += 1;
                }
                _ => {}
            }
        }
        log!(
            Level::Info,
            "stopped",
            "shard={} of={} answered_waiters={} held_keys={}",
            self.me,
            self.shards,
            answered,
            self.table.held_keys()
        );
    }

    // ----- several shards ---------------------------------------------------

    /// The driver stopped reading a Migrating connection (its receive
    /// completed for the last time): take its state and free the slot. `None`
    /// when the connection died meanwhile (the driver closes it instead).
    pub fn detach(&mut self, token: Token) -> Option<Detached> {
        let slot = self.slot_of(token, "detach");
        let c = &mut self.conns[slot as usize];
        if c.state != State::Migrating {
            return None;
        }
        let d = Detached {
            port: c.port,
            peer: c.peer,
            persistent: c.persistent,
            served: c.action.is_some() && !c.persistent,
            read_closed: c.read_closed,
            tls: c.tls,
            cert_client: c.cert_client.take(),
            rbuf: c.rbuf.clone(),
        };
        if c.partial_link.linked {
            self.partial.unlink(&mut self.conns, slot, 0);
        }
        self.untouch(slot);
        let c = &mut self.conns[slot as usize];
        c.state = State::Closing;
        c.release();
        self.free_slots.push(slot);
        self.open_conns -= 1;
        // The owner counts it again when it adopts it.
        if let Some(all) = &self.all_conns {
            all[0].fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
        Some(d)
    }

    /// A connection handed over by another shard. `None`: over the limit
    /// (the driver answers `-` and closes). Call [`Shard::resume`] once the
    /// driver has set up its side.
    pub fn on_adopt(&mut self, d: &Detached) -> Option<Token> {
        let token = self.on_accept(d.port, d.peer)?;
        let slot = token as u32 as usize;
        let c = &mut self.conns[slot];
        c.persistent = d.persistent;
        c.read_closed = d.read_closed;
        c.tls = d.tls;
        c.cert_client = d.cert_client.clone();
        c.authed = c.port == Port::Admin && c.cert_client.is_some();
        if d.served {
            c.action = Some(Action::Persist);
        }
        c.rbuf.clear();
        c.rbuf.extend_from_slice(&d.rbuf);
        Some(token)
    }

    /// Serves what an adopted connection brought along.
    pub fn resume(&mut self, token: Token) {
        let slot = self.slot_of(token, "resume");
        self.pump(slot);
        self.settle_idle(slot);
        self.apply_effects();
    }

    /// The answer of a connection that has a `Send` command: swapped with
    /// the driver's empty buffer (no copy, no allocation).
    pub fn take_output(&mut self, token: Token, into: &mut Vec<u8>) {
        let slot = self.slot_of(token, "take_output");
        debug_assert!(into.is_empty());
        std::mem::swap(&mut self.conns[slot as usize].out, into);
    }

    // ----- effects ------------------------------------------------------------

    /// Closes connections that had no request in flight, no bytes pending
    /// and no traffic for `--idle-timeout-ms` (a queued waiter, a gather or
    /// an answer being sent is not idle; sessions have their keep-alive).
    fn expire_idle(&mut self) {
        let limit_us = self.cfg.idle_timeout_ms * 1000;
        let now = self.now.mono_us;
        while let Some(slot) = self.idle.front() {
            let c = &self.conns[slot as usize];
            if c.active_us + limit_us > now {
                break;
            }
            let idle = c.state == State::Idle && c.rbuf.is_empty() && !c.close_after_send;
            if !idle {
                // Busy (queued, gathering, sending): looked at again later.
                self.touch(slot);
                continue;
            }
            self.metrics.idle_timeout();
            log!(
                Level::Debug,
                "idle_timeout",
                "conn={:#x} peer={} idle_ms={}",
                self.token(slot),
                c.peer,
                (now - c.active_us) / 1000
            );
            self.close(slot);
        }
    }

    fn expire_frames(&mut self) {
        let limit_us = self.cfg.frame_timeout_ms * 1000;
        while let Some(slot) = self.partial.front() {
            let c = &self.conns[slot as usize];
            if c.partial_since_us + limit_us > self.now.mono_us {
                break;
            }
            self.metrics.frame_timeout();
            self.reject(slot, "frame read timeout");
        }
    }

    fn publish_gauges(&mut self) {
        let oldest = self.table.oldest_acquired_unix_ms().unwrap_or(0);
        self.last_oldest_ms = oldest;
        self.metrics.set_shard_gauges(
            self.me,
            self.table.held_keys() as u64,
            self.table.queued_waiters() as u64,
            self.open_conns as u64,
            oldest,
        );
        let (x, s, m) = self.table.holders_by_access();
        self.metrics
            .set_shard_holders(self.me, [x as u64, s as u64, m as u64]);
    }

    /// Whether the driver should receive again on this connection after
    /// the bytes it just passed in. False only for a one-shot lock-port
    /// connection whose one answer is decided and not held for the log: it
    /// leaves at the end of this tick and the connection closes after it,
    /// so nothing the peer could still send or do would change it (a
    /// hang-up now fails the send, which gives a grant back as before). A
    /// queued Lock, an answer waiting for the log, a persistent connection
    /// or a session keep receiving: their hang-up must be seen.
    pub fn wants_input(&self, token: Token) -> bool {
        let Some(slot) = self.conn_of(token) else {
            return false;
        };
        let c = &self.conns[slot as usize];
        let durable = self.journal.durable_lsn();
        let one_shot_decided = c.port == Port::Lock
            && c.sid == 0
            && !c.persistent
            && c.action.is_some()
            && c.state == State::Answered
            && c.gate_lsn <= durable;
        !one_shot_decided
    }

    /// True while the connection is open and its input has not ended
    /// (inspection: a waiter of such a connection must not be skipped).
    pub fn conn_open(&self, token: Token) -> bool {
        self.conn_of(token)
            .is_some_and(|s| !self.conns[s as usize].dead && !self.conns[s as usize].read_closed)
    }

    /// One connection's state, for traces.
    pub fn describe(&self, token: Token) -> String {
        match self.conns.get(token as u32 as usize) {
            Some(c) => format!(
                "gen={} state={:?} persistent={} read_closed={} dead={} rbuf={} out={:?} grant={:?}",
                c.gen, c.state, c.persistent, c.read_closed, c.dead, c.rbuf.len(), c.out, c.grant
            ),
            None => "none".into(),
        }
    }

    /// Cheap consistency checks for tests and the simulator.
    pub fn check_invariants(&self) {
        self.table.check_invariants();
        self.durability.check();
        self.forwards.check(&self.conns);
        self.watches.check();
        let live = self.conns.iter().filter(|c| c.state != State::Free).count();
        assert_eq!(live, self.open_conns, "open connection count drifted");
        assert_eq!(
            live + self.free_slots.len(),
            self.conns.len(),
            "a slot is neither live nor free"
        );
        let queued = self
            .conns
            .iter()
            .filter(|c| matches!(c.state, State::Queued { .. }))
            .count();
        for (slot, c) in self.conns.iter().enumerate() {
            if let State::Queued { waiter } = c.state {
                let token = ((c.gen as u64) << 32) | slot as u64;
                assert_eq!(
                    self.table.waiter_conn(waiter),
                    Some(token),
                    "connection {token:#x} queued as waiter {waiter}, which is not its own (read_closed={} dead={} persistent={})",
                    c.read_closed,
                    c.dead,
                    c.persistent
                );
            }
        }
        let mut session_waiters = 0;
        self.table.for_each_waiter(|token| {
            if token & SESS_BIT != 0 {
                session_waiters += 1;
                return;
            }
            let c = self.conn_of(token).map(|s| &self.conns[s as usize]);
            assert!(
                matches!(c.map(|c| c.state), Some(State::Queued { .. })),
                "waiter of connection {token:#x} in state {:?}",
                c.map(|c| (c.state, c.read_closed, c.dead, c.persistent))
            );
        });
        assert_eq!(
            queued + session_waiters,
            self.table.queued_waiters(),
            "queued connections without a waiter"
        );
    }
}

/// The peer's IP address as a source name (an empty wire source).
pub fn ip_name(peer: &SocketAddr) -> Source {
    use std::io::Write;
    let mut buf = [0u8; 64];
    let mut cur = std::io::Cursor::new(&mut buf[..]);
    write!(cur, "{}", peer.ip()).expect("an IP address fits in 64 bytes");
    let n = cur.position() as usize;
    Source::new(&buf[..n]).expect("an IP address is shorter than 255 bytes")
}
