//! The shard: everything one event loop decides, as a pure state machine.
//!
//! It owns the connection protocol states ([`conn::State`]), the lock table,
//! the durability gate (held replies, the durable watermark, the undo
//! journal) and the log's record batching ([`crate::wal::log::Log`]). It is
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

pub mod conn;
mod keys;
pub mod msg;
pub mod raft;
mod resume;
pub mod session;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::config::{Config, LOCK_RECV_BUF};
use crate::core::{
    Effect, Effects, Extended, HeldKey, HoldMode, LockMode, Name, Now, Reply, Table, Token,
};
use crate::log::Level;
use crate::metrics::{self, Metrics};
use crate::protocol::{self, admin, Action, Decoded};
use crate::wal::log::{Chain, Landed, Log, Next};
use conn::{Conn, Port, State};
use msg::{SessMsg, SESS_BIT};

pub use msg::{Detached, RemoteOp, RemoteResult};

/// Undecoded bytes a lock-port connection may hold: one frame plus the
/// requests pipelined behind it. More while a request is outstanding is a
/// protocol violation (the connection is closed, its waiter withdrawn).
pub const LOCK_PIPELINE_BYTES_MAX: usize = LOCK_RECV_BUF;

/// What the shard asks its driver to do, in order.
#[derive(Debug)]
pub enum Cmd {
    /// Take the connection's answer with [`Shard::take_output`] and send
    /// all of it; report [`Shard::on_send_done`].
    Send(Token),
    /// Stop reading, close once no op references the socket, then report
    /// [`Shard::on_closed`].
    Close(Token),
    /// Run a log chain with this buffer (the driver's until it reports
    /// [`Shard::on_log_landed`] and gives it back).
    Log { chain: Chain, buf: Vec<u8> },
    /// Close and remove the compaction temp file (unless renamed).
    DiscardTemp,
    /// Shutdown: answer `-` to this connection's queued Lock, best effort.
    Farewell(Token),
    /// The connection's next request names a key another shard owns: stop
    /// reading it, then hand it (socket and [`Shard::detach`]ed state) to
    /// shard `to`, which continues with [`Shard::on_adopt`].
    Migrate { token: Token, to: usize },
    /// Run `op` on every shard (this one included) and report each result
    /// with [`Shard::on_reply`].
    Scatter { id: u64, op: RemoteOp },
    /// The result of a remote request, for shard `to`.
    Reply {
        to: usize,
        id: u64,
        result: RemoteResult,
    },
    /// Session traffic for shard `to` (never this one): report it there
    /// with [`Shard::on_sess`]. Never refused or dropped.
    Sess { to: usize, msg: Box<SessMsg> },
    /// Cluster mode: send this frame on the link to `node`'s same shard
    /// (dropped if the link is down: Raft retransmits).
    Peer { node: u64, frame: Vec<u8> },
    /// Cluster mode: the group's membership changed; `node`'s link for
    /// this shard goes to `addr`, or (`None`) is closed for good.
    PeerLink {
        node: u64,
        addr: Option<std::net::SocketAddr>,
    },
}

/// Open connections of every shard, per port (`[lock, admin]`): the admin
/// port has its own small budget, so a flood of lock-port connections
/// cannot lock the operator out.
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
    /// KEYX rather than KEYS.
    extended: bool,
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

/// A message for another shard that waits for this shard's log.
enum Parked {
    /// A scatter/gather part's reply.
    Gather {
        to: usize,
        id: u64,
        result: RemoteResult,
    },
    /// A session answer or Lost push for the session's home shard.
    Sess { to: usize, msg: Box<SessMsg> },
}

/// Marks a `held` entry as a remote reply (index into `remotes`).
const REMOTE_BIT: u64 = 1 << 63;

/// How to take back the in-memory effect of a log record that never became
/// durable.
#[derive(Clone, Copy, Debug)]
enum Undo {
    Acquire {
        key: Name,
        grant_id: u64,
    },
    Release {
        prev: HeldKey,
    },
    Extend(Extended),
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
    log: Option<Log>,
    /// Limit refusals are logged at most once per second.
    limit_log_after_us: u64,
    /// So are lock-port actions refused by policy.
    policy_log_after_us: u64,
    /// Connections whose answer waits for the log: `(lsn, token)`, FIFO.
    held: VecDeque<(u64, Token)>,
    /// Undo journal of records not yet durable: `(lsn, undo)`, FIFO.
    undo: VecDeque<(u64, Undo)>,
    /// This shard's index and the number of shards.
    me: usize,
    shards: usize,
    gathers: Vec<Gather>,
    next_gather_id: u64,
    /// KEYS answers being streamed from this shard's connections.
    streams: Vec<keys::Stream>,
    /// Listings this shard keeps for streams (its own and other shards').
    served: Vec<keys::Served>,
    remotes: Vec<Option<Parked>>,
    /// Session ids handed out by this shard (its index in the top byte).
    next_sid: u64,
    /// Keep-alive deadlines `(mono µs, connection)`; an entry whose
    /// session was heard from since is pushed again with its new deadline.
    session_deadlines: std::collections::BinaryHeap<std::cmp::Reverse<(u64, Token)>>,
    /// Replicated sessions: who has them, resumes in progress, windows.
    resumes: resume::Resumes,
    /// Open connections (not sessions) by last traffic, oldest first (link
    /// slot 1 of [`Conn`]): the idle timeout looks at the front only.
    idle: crate::core::list::List,
    /// Open connections of every shard (`--max-connections` is the
    /// server's): counted at accept and close, not when a connection moves.
    all_conns: Option<Arc<ConnCounts>>,
    /// Cluster mode: this shard's replica of its Raft group.
    raft: Option<Box<raft::Part>>,
    /// Cluster mode: what the replication metrics are computed from.
    raft_stats: raft::Stats,
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
            log,
            limit_log_after_us: 0,
            policy_log_after_us: 0,
            held: VecDeque::with_capacity(cap),
            undo: VecDeque::with_capacity(4096),
            me: 0,
            shards: 1,
            gathers: Vec::new(),
            next_gather_id: 1,
            streams: Vec::new(),
            served: Vec::new(),
            remotes: Vec::new(),
            next_sid: 1,
            session_deadlines: std::collections::BinaryHeap::new(),
            resumes: resume::Resumes::default(),
            idle: crate::core::list::List::new(),
            all_conns: None,
            raft: None,
            raft_stats: raft::Stats::default(),
            cfg,
        }
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
        self.log.as_ref()
    }
    pub fn stopping(&self) -> bool {
        self.stopping
    }
    /// Replies held for the log (for invariant checks).
    pub fn held_replies(&self) -> usize {
        self.held.len()
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
        self.log.as_ref().is_some_and(|l| l.encoding())
    }

    /// The earliest time (monotonic µs) at which the shard needs a tick
    /// with no event: a partial frame's read timeout or a log retry.
    pub fn next_deadline_us(&self) -> Option<u64> {
        let frame = self.partial.front().map(|slot| {
            self.conns[slot as usize].partial_since_us + self.cfg.frame_timeout_ms * 1000
        });
        let retry = self.log.as_ref().and_then(|l| l.retry_at_us());
        let expiry = self.table.next_expiry_us();
        let session = self.session_deadlines.peek().map(|r| r.0 .0);
        let idle = self
            .idle
            .front()
            .map(|slot| self.conns[slot as usize].active_us + self.cfg.idle_timeout_ms * 1000);
        let raft = self.raft_deadline_us();
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
        if let Some(log) = self.log.as_mut() {
            log.encode_step(&mut self.table);
        }
        self.raft_ticks();
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
        self.raft_pump();
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
        let durable = self.log.as_ref().map_or(u64::MAX, |l| l.durable_lsn());
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

    /// SIGINT/SIGTERM: no more accepts; every queued waiter is withdrawn and
    /// answered `-` (best effort, by the driver).
    pub fn stop(&mut self) {
        self.stopping = true;
        self.raft_hand_over();
        let mut answered = 0;
        for slot in 0..self.conns.len() {
            if let State::Queued { waiter } = self.conns[slot].state {
                self.table.withdraw(waiter);
                self.conns[slot].state = State::Answered;
                let token = self.token(slot as u32);
                self.cmds.push(Cmd::Farewell(token));
                answered += 1;
            }
        }
        log!(
            Level::Info,
            "stopped",
            "answered_waiters={} held_keys={}",
            answered,
            self.table.held_keys()
        );
    }

    // ----- several shards ---------------------------------------------------

    /// Starts a scatter/gather for the connection in `slot`.
    fn scatter(&mut self, slot: u32, op: RemoteOp, lock_port: bool) {
        let id = self.next_gather_id;
        self.next_gather_id += 1;
        let token = self.token(slot);
        self.conns[slot as usize].state = State::Gathering;
        self.gathers.push(Gather {
            id,
            token,
            op: op.clone(),
            pending: self.shards,
            failed: false,
            lock_port,
            extended: false,
            reset: Vec::new(),
            stream: 0,
            status: Vec::new(),
            members: Vec::new(),
            refused: Vec::new(),
        });
        self.cmds.push(Cmd::Scatter { id, op });
    }

    /// Another shard (or this one) asks for `op` on this shard's keys. The
    /// reply waits for this shard's log like any answer.
    pub fn on_remote(&mut self, from: usize, id: u64, op: RemoteOp) {
        let now = self.now;
        if self.park_read(from, id, &op) {
            return;
        }
        if let Some(result) = self.keys_remote(from, &op) {
            // A listing's first chunk waits for the log like any answer;
            // later chunks are holders as they were then: no wait.
            if !matches!(op, RemoteOp::KeysOpen { .. }) {
                self.cmds.push(Cmd::Reply {
                    to: from,
                    id,
                    result,
                });
                return;
            }
            return self.reply_when_durable(from, id, result);
        }
        let result = match op {
            RemoteOp::KeysOpen { .. } | RemoteOp::KeysMore { .. } | RemoteOp::KeysClose { .. } => {
                unreachable!("answered above")
            }
            RemoteOp::ClusterStatus => {
                // A read of the replica, no table effect: nothing to wait for.
                let result = match self.shard_status() {
                    Some(s) => RemoteResult::Status(Box::new(s)),
                    None => RemoteResult::Failed,
                };
                self.cmds.push(Cmd::Reply {
                    to: from,
                    id,
                    result,
                });
                return;
            }
            RemoteOp::Members | RemoteOp::ChangeMembers(_) => {
                // No table effect: answered at once.
                let result = self.members_op(&op);
                self.cmds.push(Cmd::Reply {
                    to: from,
                    id,
                    result,
                });
                return;
            }
            RemoteOp::TransferLeader { to } => {
                // No table effect: answered at once.
                let result = if self.raft_transfer(to) {
                    RemoteResult::Done
                } else {
                    RemoteResult::Failed
                };
                self.cmds.push(Cmd::Reply {
                    to: from,
                    id,
                    result,
                });
                return;
            }
            RemoteOp::ResetKeys(keys) => {
                let (me, shards) = (self.me, self.shards);
                for key in keys.iter().filter(|k| owner(k.as_bytes(), shards) == me) {
                    self.table.reset_by_key(None, key, now, &mut self.fx);
                    self.apply_effects();
                }
                RemoteResult::Done
            }
            RemoteOp::ResetSources(sources) => {
                for s in &sources {
                    self.table.reset_by_source(None, s, now, &mut self.fx);
                    self.apply_effects();
                }
                RemoteResult::Done
            }
            RemoteOp::ResetIf(entries) => {
                let (me, shards) = (self.me, self.shards);
                let mut done = Vec::new();
                for (i, (key, token)) in entries.iter().enumerate() {
                    if owner(key.as_bytes(), shards) == me
                        && self.table.reset_if(key, *token, now, &mut self.fx)
                    {
                        done.push(i as u32);
                    }
                    self.apply_effects();
                }
                RemoteResult::Reset(done)
            }
        };
        self.reply_when_durable(from, id, result);
    }

    /// Replies to shard `from` once this shard's log is durable.
    fn reply_when_durable(&mut self, from: usize, id: u64, result: RemoteResult) {
        match self.log.as_ref().filter(|l| l.pending()) {
            Some(l) => {
                let lsn = l.tail_lsn();
                let idx = self.park_remote(Parked::Gather {
                    to: from,
                    id,
                    result,
                });
                self.held.push_back((lsn, REMOTE_BIT | idx as u64));
            }
            None => self.cmds.push(Cmd::Reply {
                to: from,
                id,
                result,
            }),
        }
    }

    /// Keeps a message for another shard until the log is durable; returns
    /// its index for the `held` queue.
    fn park_remote(&mut self, p: Parked) -> usize {
        match self.remotes.iter().position(Option::is_none) {
            Some(i) => {
                self.remotes[i] = Some(p);
                i
            }
            None => {
                self.remotes.push(Some(p));
                self.remotes.len() - 1
            }
        }
    }

    /// One shard's part of a scatter/gather arrived.
    pub fn on_reply(&mut self, id: u64, result: RemoteResult) {
        let Some(i) = self.gathers.iter().position(|g| g.id == id) else {
            panic!("a reply for unknown gather {id}");
        };
        let g = &mut self.gathers[i];
        g.pending -= 1;
        if g.stream != 0 {
            let (stream, done) = (g.stream, g.pending == 0);
            if done {
                self.gathers.swap_remove(i);
            }
            self.keys_part(stream, result);
            if done {
                self.keys_round_done(stream);
            }
            return;
        }
        match result {
            RemoteResult::KeysPart { .. } => unreachable!("stream replies are handled above"),
            RemoteResult::Done => {}
            RemoteResult::Reset(done) => {
                for i in done {
                    g.reset[i as usize] = true;
                }
            }
            RemoteResult::Failed => g.failed = true,
            RemoteResult::Status(s) => g.status.push(*s),
            RemoteResult::Members(m) => g.members.push(*m),
            RemoteResult::Refused(why) => g.refused.push(why),
        }
        if g.pending > 0 {
            return;
        }
        let g = self.gathers.swap_remove(i);
        let Some(slot) = self.conn_of(g.token) else {
            return; // the requester left; the resets happened regardless
        };
        let c = &mut self.conns[slot as usize];
        c.out.clear();
        if matches!(g.op, RemoteOp::ChangeMembers(_)) {
            let mut why = g.refused;
            why.sort();
            why.dedup();
            let result = if why.is_empty() && !g.failed {
                Ok(())
            } else {
                Err(why.join("; "))
            };
            protocol::members::encode_answer(&result, &mut c.out);
        } else if g.failed {
            c.out.push(b'-');
        } else if g.lock_port {
            c.out.push(b'+');
        } else {
            match &g.op {
                RemoteOp::KeysOpen { .. }
                | RemoteOp::KeysMore { .. }
                | RemoteOp::KeysClose { .. } => unreachable!("stream rounds are handled above"),
                RemoteOp::ResetKeys(names) | RemoteOp::ResetSources(names) => {
                    for _ in 0..names.len() {
                        c.out.push(b'+');
                    }
                    c.out.push(b'+');
                }
                RemoteOp::ResetIf(_) => {
                    for &done in &g.reset {
                        c.out.push(if done { b'+' } else { b'#' });
                    }
                    c.out.push(b'+');
                }
                RemoteOp::ClusterStatus => {
                    let mut recs = g.status;
                    recs.sort_by_key(|r| r.shard);
                    protocol::status::encode(&recs, &mut c.out);
                }
                RemoteOp::TransferLeader { .. } => c.out.push(b'+'),
                RemoteOp::Members => {
                    let mut recs = g.members;
                    recs.sort_by_key(|r| r.shard);
                    protocol::members::encode(&recs, &mut c.out);
                }
                RemoteOp::ChangeMembers(_) => unreachable!("answered above"),
            }
        }
        if g.lock_port {
            let outcome = if g.failed {
                metrics::Outcome::Error
            } else {
                metrics::Outcome::Ok
            };
            self.metrics
                .request(metrics::Action::ResetBySource, outcome);
        }
        // Every part was durable before it replied.
        c.state = State::Answered;
        c.gate_lsn = 0;
        self.mark_dirty(slot);
    }

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

    // ----- connection state machine -----------------------------------------

    /// Decodes and executes buffered frames while the connection is idle.
    fn pump(&mut self, slot: u32) {
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
    fn settle_idle(&mut self, slot: u32) {
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
    fn withdrawn(&mut self, slot: u32) {
        let c = &mut self.conns[slot as usize];
        c.state = State::Idle;
        if c.persistent && !c.dead {
            self.answer(slot, b'-', None);
        } else {
            self.close(slot);
        }
    }

    /// Executes one lock-port frame; false when more bytes are needed.
    fn pump_lock(&mut self, slot: u32) -> bool {
        if !self.may_serve() {
            return self.not_leader(slot);
        }
        let token = self.token(slot);
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
                Name::new(req.key).expect("decoder bounds keys to 127 bytes"),
                Name::new(req.source).expect("decoder bounds sources to 127 bytes"),
                len,
            ),
        };
        let peer = self.conns[slot as usize].peer;
        if matches!(
            action,
            Action::Unlock | Action::ResetByKey | Action::ResetBySource
        ) && !self.cfg.lc_admin_actions.allows(&peer)
        {
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
                self.metrics.request(a, metrics::Outcome::Error);
            }
            self.answer(slot, b'-', None);
            return true;
        }
        if self.shards > 1
            && matches!(
                action,
                Action::Lock | Action::TryLock | Action::Unlock | Action::ResetByKey
            )
        {
            let to = owner(key.as_bytes(), self.shards);
            if to != self.me {
                // The frame stays in the buffer: the owner decodes it.
                self.conns[slot as usize].state = State::Migrating;
                self.cmds.push(Cmd::Migrate { token, to });
                return false;
            }
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
                return true;
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
        true
    }

    /// Executes one admin command; false when more bytes are needed.
    fn pump_admin(&mut self, slot: u32) -> bool {
        let c = &self.conns[slot as usize];
        let peer = c.peer;
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
        // The shared secret: checked when presented, required before any
        // command when the admin port is reachable from other hosts.
        let required = self.cfg.auth_token.is_some() && !self.cfg.admin_bind.ip().is_loopback();
        if cmd == admin::Command::Auth {
            let c = &self.conns[slot as usize];
            let ok = match &self.cfg.auth_token {
                Some(t) => crate::config::token_matches(t, &c.rbuf[5..len]),
                None => true,
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
        // KEYS/KEYX after a read barrier (linearizable, see shard::raft).
        let read = matches!(cmd, admin::Command::Keys | admin::Command::Keyx);
        if !(self.may_serve() || read && self.raft.is_some()) {
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
        let names: Vec<Name> = if cmd == admin::Command::Rstk {
            Vec::new()
        } else {
            admin::names(body)
                .map(|n| Name::new(n).expect("admin decoder bounds names to 127 bytes"))
                .collect()
        };
        let op = match cmd {
            admin::Command::Keys | admin::Command::Keyx => {
                self.metrics
                    .request(metrics::Action::AdminKeys, metrics::Outcome::Ok);
                let c = &mut self.conns[slot as usize];
                c.rbuf.drain(..len);
                c.persistent = true;
                c.action = Some(Action::Persist);
                self.keys_start(slot, cmd == admin::Command::Keyx);
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
                let mut sources = names;
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
            admin::Command::Auth | admin::Command::Clst | admin::Command::Cmem => {
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
        g.extended = cmd == admin::Command::Keyx;
        if let RemoteOp::ResetIf(e) = &g.op {
            g.reset = vec![false; e.len()];
        }
        true
    }

    /// Bad input: answer `-`, then close. Nothing reached the lock table.
    fn reject(&mut self, slot: u32, why: &str) {
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
    fn violation(&mut self, slot: u32, why: &str) {
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
    fn die(&mut self, slot: u32) {
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
        if let State::Queued { waiter } = c.state {
            self.table.withdraw(waiter);
            self.metrics.hangup_withdrawal();
        }
        let c = &mut self.conns[slot as usize];
        if !c.grant_in_flight {
            self.give_back_grant(slot);
        }
        self.conns[slot as usize].out.clear();
        self.close(slot);
    }

    fn give_back_grant(&mut self, slot: u32) {
        if let Some((key_slot, grant_id)) = self.conns[slot as usize].grant.take() {
            self.metrics.undelivered_grant();
            let now = self.now;
            self.table
                .release_grant(key_slot, grant_id, now, &mut self.fx);
        }
    }

    fn close(&mut self, slot: u32) {
        let c = &mut self.conns[slot as usize];
        if c.state == State::Closing {
            return;
        }
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
    fn touch(&mut self, slot: u32) {
        let c = &mut self.conns[slot as usize];
        if self.cfg.idle_timeout_ms == 0 || c.sid != 0 || c.state == State::Closing {
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

    fn mark_dirty(&mut self, slot: u32) {
        let c = &mut self.conns[slot as usize];
        if !c.dirty {
            c.dirty = true;
            self.dirty.push(slot);
        }
    }

    // ----- effects ------------------------------------------------------------

    /// Applies the table's effects in order (they may cascade: releasing an
    /// undeliverable grant can grant the next waiter).
    fn apply_effects(&mut self) {
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

    fn apply(&mut self, e: &Effect) {
        match *e {
            Effect::LimitReached { limit } => {
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
            Effect::Reply { conn, .. } if conn & SESS_BIT != 0 => self.session_effect(e),
            Effect::Reply { conn, reply } => {
                let outcome = match reply {
                    Reply::Ok => metrics::Outcome::Ok,
                    Reply::Busy => metrics::Outcome::Busy,
                    _ => metrics::Outcome::Error,
                };
                if let Some(slot) = self.conn_of(conn) {
                    if let Some(a) = self.conns[slot as usize].action.and_then(metrics_action) {
                        self.metrics.request(a, outcome);
                    }
                    self.answer(slot, reply.byte(), None);
                }
            }
            Effect::Granted {
                conn,
                key_slot,
                grant_id,
                waited_us,
            } => {
                if let Some(log) = self.log.as_mut() {
                    // Durable mode only: the record, and the key's name
                    // for the undo journal (it outlives this round).
                    let (held, _) = self.table.granted(key_slot, grant_id);
                    let lsn = log.append_acquire(held);
                    let key = Name::new(held.key).expect("names are at most NAME_MAX");
                    self.undo.push_back((lsn, Undo::Acquire { key, grant_id }));
                }
                self.metrics.grant();
                if let Some(us) = waited_us {
                    self.metrics.handoff();
                    self.metrics.observe_queue_wait_us(us);
                }
                if conn & SESS_BIT != 0 {
                    self.session_effect(e);
                    return;
                }
                match self.conn_of(conn).filter(|&s| !self.conns[s as usize].dead) {
                    Some(slot) => {
                        if let Some(a) = self.conns[slot as usize].action.and_then(metrics_action) {
                            self.metrics.request(a, metrics::Outcome::Ok);
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
            Effect::Released {
                released,
                grant_id,
                held_us,
                holder_conn,
                ..
            } => {
                if let Some(log) = self.log.as_mut() {
                    // Durable mode only: the record, and the holder as it
                    // was for the undo journal (it outlives this round).
                    let prev = self.table.released(released, grant_id);
                    let lsn = log.append_release(prev);
                    let prev = prev.to_owned().expect("names are at most NAME_MAX");
                    self.undo.push_back((lsn, Undo::Release { prev }));
                }
                self.metrics.observe_hold_us(held_us);
                if holder_conn & SESS_BIT != 0 {
                    // A Lost push, before the next holder's grant.
                    self.session_effect(e);
                }
            }
        }
    }

    /// Queues the one-byte answer to the connection's outstanding request.
    fn answer(&mut self, slot: u32, byte: u8, grant: Option<(u32, u64)>) {
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

    /// Holds the connection's output until everything the log holds now is
    /// durable; a reply never reveals state that a crash could take back.
    fn gate(&mut self, slot: u32) {
        match self.log.as_ref().filter(|l| l.pending()) {
            Some(l) => {
                let lsn = l.tail_lsn();
                let token = self.token(slot);
                self.conns[slot as usize].gate_lsn = lsn;
                self.held.push_back((lsn, token));
            }
            None => self.mark_dirty(slot),
        }
    }

    /// Hands every answer that may leave to the driver (one send each).
    fn flush(&mut self) {
        let durable = self.log.as_ref().map_or(u64::MAX, |l| l.durable_lsn());
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
            c.state = State::Sending;
            c.grant_in_flight = c.grant.is_some();
            let token = ((c.gen as u64) << 32) | slot as u64;
            self.cmds.push(Cmd::Send(token));
        }
        dirty.clear();
        self.dirty = dirty;
    }

    // ----- durability -----------------------------------------------------------

    /// Closes the log batch: the next chain(s) when nothing is in flight.
    /// No timer: a lone record goes out in the same tick that produced it.
    fn wal_tick(&mut self) {
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

    /// Marks every held answer whose records are now durable.
    fn release_durable(&mut self) {
        let durable = self.log.as_ref().map_or(0, |l| l.durable_lsn());
        while let Some(&(lsn, _)) = self.undo.front() {
            if lsn > durable {
                break;
            }
            self.undo.pop_front();
        }
        while let Some(&(lsn, token)) = self.held.front() {
            if lsn > durable {
                break;
            }
            self.held.pop_front();
            if token & REMOTE_BIT != 0 {
                self.send_held_remote(token, false);
            } else if let Some(slot) = self.conn_of(token) {
                self.mark_dirty(slot);
            }
        }
    }

    /// Sends the message a `held` entry stood for: as it is once durable,
    /// or (`failed`, a log failure voided what it reported) a gather part
    /// as Failed and a session answer as the end of its session.
    fn send_held_remote(&mut self, token: Token, failed: bool) {
        let p = self.remotes[(token & !REMOTE_BIT) as usize]
            .take()
            .expect("a held remote reply");
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
    fn fail_pending(&mut self, why: &str, errno: i32) {
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
        while let Some((_, token)) = self.held.pop_front() {
            if token & REMOTE_BIT != 0 {
                self.send_held_remote(token, true);
                continue;
            }
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
        while let Some((_, u)) = self.undo.pop_back() {
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
                Undo::SessionOpen { sid } => {
                    self.table.session_closed(sid);
                }
                Undo::SessionEnd { sid, keepalive_ms } => {
                    self.table.session_opened(sid, keepalive_ms);
                }
                Undo::Release { prev } => {
                    // The key is free again here: later records were undone.
                    if !self.table.restore_holder(&prev, now) {
                        log!(
                            Level::Error,
                            "undo_failed",
                            "key={:?} reason=key_limit",
                            prev.key
                        );
                    }
                }
            }
        }
        log!(
            Level::Warn,
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

fn metrics_action(a: Action) -> Option<metrics::Action> {
    Some(match a {
        Action::Lock => metrics::Action::Lock,
        Action::Unlock => metrics::Action::Unlock,
        Action::ResetByKey => metrics::Action::ResetByKey,
        Action::ResetBySource => metrics::Action::ResetBySource,
        Action::TryLock => metrics::Action::TryLock,
        Action::Persist => return None,
    })
}

/// The peer's IP address as a source name (an empty wire source).
pub fn ip_name(peer: &SocketAddr) -> Name {
    use std::io::Write;
    let mut buf = [0u8; 64];
    let mut cur = std::io::Cursor::new(&mut buf[..]);
    write!(cur, "{}", peer.ip()).expect("an IP address fits in 64 bytes");
    let n = cur.position() as usize;
    Name::new(&buf[..n]).expect("an IP address is shorter than 127 bytes")
}
