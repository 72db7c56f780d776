//! Prometheus metrics, and the liveness and readiness the probes report.
//!
//! Ownership and invariants:
//! - The lock loop owns nothing here but a shared `Arc<Metrics>`; every update
//!   is one or a few `Relaxed` atomic operations on fixed fields. No locks, no
//!   allocation, no syscalls on the update path, so instrumentation can never
//!   stall or reorder the loop's work. What every request touches (request
//!   counts, grants, handoffs, the hold and queue-wait histograms, the
//!   gauges) is kept per loop ([`Hot`], one cache-line-aligned set each,
//!   written through [`Metrics::at`]) and summed at scrape time, so loops
//!   on different cores never write one line.
//! - The scrape side ([`serve`], in `http.rs`) runs on its own std thread and
//!   only *reads* atomics in [`Metrics::render`]. Because updates are
//!   `Relaxed`, one scrape may see a counter bumped and its sibling not yet;
//!   every figure is individually monotonic, which is all Prometheus needs.
//! - Histograms store per-bucket (non-cumulative) counts plus an overflow
//!   slot; `render` accumulates them, and `_count` is derived from the buckets,
//!   so `_count == bucket{le="+Inf"}` holds in every scrape by construction.
//! - Durations are kept as integer microseconds (names carry units) and
//!   rendered as exact decimal seconds, so output is deterministic and
//!   testable byte for byte.
//!
//! Semantics the loop follows (the end-to-end test checks them):
//! - `request` once per answered Locking-Center or admin request, with the
//!   answer byte's outcome (`+` Ok, `#` Busy, `-` Error). A Lock is counted
//!   when its answer is queued (it may have waited a long time); a queued
//!   Lock withdrawn by hang-up is counted by `hangup_withdrawal` only. A
//!   lock-port frame that does not decode counts as Lock/Error. Admin
//!   commands count as Ok.
//! - `session_request` once per session Reply, with the op it answers and
//!   its status, by the shard that decides it: the key's owner for Acquire,
//!   Release, Extend and Cancel (an Acquire when it is granted, refused,
//!   times out or is cancelled), the home shard for Ping, for a frame
//!   answered `invalid`, and for the first frame (Hello, Resume: welcomed
//!   or refused; a refusal as `not leader` included). Counted when decided,
//!   whether or not the connection is still there to read it. Bytes that do
//!   not frame as the session protocol get no Reply (the connection is
//!   closed) and are not counted.
//!   All three kinds render as one `ringlock_requests_total` with a
//!   `protocol` label (`lc`, `admin`, `session`); every label value comes
//!   from a fixed enum, never from a key or a client.
//! - `grant` for every grant; `handoff` additionally when the grantee had been
//!   queued, together with `observe_queue_wait_us` (enqueue to grant);
//!   immediate grants observe no queue wait.
//! - `observe_hold_us` once per release of a held key, whatever the cause
//!   (Unlock, reset, an undeliverable grant given back).
//! - `reset(false)` once per ResetByKey request and per key named in RSET;
//!   `reset(true)` once per ResetBySource request and per source in RSBS
//!   (an RSBS with count 0 resets the caller's IP: one). Counted whether or
//!   not anything was held: it counts operator actions, not keys.
//! - Gauges (`set_*`) are published by the loop once per tick.
//!
//! # Liveness and readiness
//! - Every event loop owns one heartbeat slot (`Metrics::new_loops(n)`; the
//!   server has one loop today) and calls `loop_heartbeat(i, now_ms)` once
//!   per tick with the CLOCK_MONOTONIC time of the tick ([`monotonic_ms`]).
//! - The contract: a loop wakes at least every
//!   [`HEARTBEAT_INTERVAL_MS`](crate::config::HEARTBEAT_INTERVAL_MS), idle or
//!   not (the server caps its io_uring wait at that interval), so an old
//!   heartbeat means a loop that is stuck, not one that is merely idle.
//! - `liveness` fails once any loop's last heartbeat is older than the
//!   liveness timeout (`--liveness-timeout`, default 10 s). Before
//!   `set_ready` nothing is judged (recovery runs before the loop starts);
//!   a loop that has not beaten yet is judged from the moment of `set_ready`.
//! - Ready means recovery is done (`set_ready`); `/readyz` and `/healthz`
//!   additionally require liveness, `/livez` is liveness alone.
//! - Cluster mode (`enable_raft`, once, before the loops run): ready also
//!   requires every shard to serve (this node leads every group and holds
//!   its lease), so a load balancer sends clients to the leader only. The
//!   `ringlock_raft_*` series exist only then; a single-node server's
//!   output is unchanged.

mod http;
mod raft;
mod render;
mod security;
pub use raft::{ForwardOutcome, RaftGauges, RaftMetrics};
pub use security::{Handshake, Security};

pub use http::{
    serve, serve_with, Options, CONNECTIONS_MAX, REQUEST_HEAD_BYTES_MAX, REQUEST_TIMEOUT,
    WRITE_TIMEOUT,
};

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

use crate::cluster::check::Reason;
use crate::protocol::session::{self as sp, Status};

/// CLOCK_MONOTONIC in milliseconds: the clock of heartbeats (the server's
/// `mono_us` reads the same clock). Never 0 on a running system.
pub fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid pointer to a stack timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000).max(1)
}

/// What liveness says at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Recovery is not done yet; loops are not judged (the startup probe's job).
    Starting,
    /// Every loop made progress within the bound.
    Live,
    /// Loop `loop_index` (the stalest one) made no progress for `age_ms`.
    Stalled { loop_index: usize, age_ms: u64 },
}

/// A request kind, as the lock port and admin port know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Lock,
    Unlock,
    ResetByKey,
    ResetBySource,
    TryLock,
    AdminKeys,
    AdminRset,
    AdminRsbs,
}

impl Action {
    pub const ALL: [Action; 8] = [
        Action::Lock,
        Action::Unlock,
        Action::ResetByKey,
        Action::ResetBySource,
        Action::TryLock,
        Action::AdminKeys,
        Action::AdminRset,
        Action::AdminRsbs,
    ];

    /// The `protocol` label value: `lc` (the lock port's one-byte
    /// actions) or `admin` (the admin port's commands).
    pub fn protocol(self) -> &'static str {
        match self {
            Action::AdminKeys | Action::AdminRset | Action::AdminRsbs => "admin",
            _ => "lc",
        }
    }

    /// The `action` label value.
    pub fn label(self) -> &'static str {
        match self {
            Action::Lock => "lock",
            Action::Unlock => "unlock",
            Action::ResetByKey => "reset_by_key",
            Action::ResetBySource => "reset_by_source",
            Action::TryLock => "trylock",
            Action::AdminKeys => "admin_keys",
            Action::AdminRset => "admin_rset",
            Action::AdminRsbs => "admin_rsbs",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A session request kind: the op byte of a session frame (7..=13).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionOp {
    Hello,
    Acquire,
    Release,
    Extend,
    Cancel,
    Ping,
    Resume,
}

/// Every status of a session Reply, in byte order (`Status as usize` is
/// its index: the discriminants are 0..=14).
pub const SESSION_STATUSES: [Status; 15] = [
    Status::Ok,
    Status::TimedOut,
    Status::Busy,
    Status::NotOwner,
    Status::Stale,
    Status::Invalid,
    Status::Limit,
    Status::ServerError,
    Status::Cancelled,
    Status::NotQueued,
    Status::Unauthorized,
    Status::UnsupportedVersion,
    Status::NotLeader,
    Status::UnknownSession,
    Status::TlsRequired,
];

impl SessionOp {
    pub const ALL: [SessionOp; 7] = [
        SessionOp::Hello,
        SessionOp::Acquire,
        SessionOp::Release,
        SessionOp::Extend,
        SessionOp::Cancel,
        SessionOp::Ping,
        SessionOp::Resume,
    ];

    /// The op of a session frame's first byte; `None` for a byte that is
    /// not a session op.
    pub fn from_byte(b: u8) -> Option<SessionOp> {
        Some(match b {
            sp::OP_HELLO => SessionOp::Hello,
            sp::OP_ACQUIRE => SessionOp::Acquire,
            sp::OP_RELEASE => SessionOp::Release,
            sp::OP_EXTEND => SessionOp::Extend,
            sp::OP_CANCEL => SessionOp::Cancel,
            sp::OP_PING => SessionOp::Ping,
            sp::OP_RESUME => SessionOp::Resume,
            _ => return None,
        })
    }

    /// The `action` label value.
    pub fn label(self) -> &'static str {
        match self {
            SessionOp::Hello => "hello",
            SessionOp::Acquire => "acquire",
            SessionOp::Release => "release",
            SessionOp::Extend => "extend",
            SessionOp::Cancel => "cancel",
            SessionOp::Ping => "ping",
            SessionOp::Resume => "resume",
        }
    }

    /// The statuses the server answers this op with: their series exist
    /// from start-up (zeros). A status outside this list is rendered once
    /// it has been counted, so nothing counted is ever hidden.
    pub fn statuses(self) -> &'static [Status] {
        use Status::*;
        match self {
            SessionOp::Hello => &[Ok, Invalid, Unauthorized, UnsupportedVersion, NotLeader],
            SessionOp::Resume => &[
                Ok,
                Invalid,
                Unauthorized,
                UnsupportedVersion,
                NotLeader,
                UnknownSession,
            ],
            SessionOp::Acquire => &[Ok, TimedOut, Busy, Invalid, Limit, Cancelled],
            SessionOp::Release | SessionOp::Extend => &[Ok, NotOwner, Stale, Invalid, Limit],
            SessionOp::Cancel => &[Ok, Invalid, Limit, NotQueued],
            SessionOp::Ping => &[Ok, Invalid],
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The answer a request got: `+`, `#` or `-`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Busy,
    Error,
}

impl Outcome {
    pub const ALL: [Outcome; 3] = [Outcome::Ok, Outcome::Busy, Outcome::Error];

    /// The `result` label value.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Busy => "busy",
            Outcome::Error => "error",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Upper bounds (inclusive, microseconds) of the latency buckets:
/// 10 µs … 10 s in 1-2.5-5 steps.
pub const LATENCY_BOUNDS_US: [u64; 19] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
    500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// Upper bounds (inclusive) of the records-per-WAL-batch buckets: 1 … 1024.
pub const BATCH_BOUNDS: [u64; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

/// A fixed-bucket histogram: `N` bounded buckets plus one overflow slot
/// (`M == N + 1`), all plain counters, and a running sum in the observed unit.
pub struct Histogram<const N: usize, const M: usize> {
    bounds: &'static [u64; N],
    buckets: [AtomicU64; M],
    sum: AtomicU64,
}

impl<const N: usize, const M: usize> Histogram<N, M> {
    const fn new(bounds: &'static [u64; N]) -> Self {
        assert!(M == N + 1, "one overflow bucket after the bounded ones");
        Histogram {
            bounds,
            buckets: [const { AtomicU64::new(0) }; M],
            sum: AtomicU64::new(0),
        }
    }

    /// Records one observation: two relaxed `fetch_add`s, no allocation.
    pub fn observe(&self, value: u64) {
        // Linear scan: at most 19 compares on data that sits in one or two
        // cache lines; cheaper than a branchy binary search at this size.
        let mut slot = N;
        for (i, &bound) in self.bounds.iter().enumerate() {
            if value <= bound {
                slot = i;
                break;
            }
        }
        self.buckets[slot].fetch_add(1, Relaxed);
        self.sum.fetch_add(value, Relaxed);
    }

    /// Total observations (the `+Inf` bucket).
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Relaxed)).sum()
    }

    /// Sum of observed values, in the observed unit.
    pub fn sum(&self) -> u64 {
        self.sum.load(Relaxed)
    }
}

type LatencyHistogram = Histogram<19, 20>;
type BatchHistogram = Histogram<11, 12>;

/// The figures every request touches, one set per event loop (shard), so
/// that no two loops write one cache line: aligned to 128 bytes (a line and
/// the adjacent line the prefetcher pairs with it), summed at scrape time.
/// A loop writes only its own set ([`Metrics::at`]).
#[repr(align(128))]
pub struct Hot {
    requests: [[AtomicU64; 3]; 8],
    /// Session Replies, by op and status.
    session_requests: [[AtomicU64; SESSION_STATUSES.len()]; SessionOp::ALL.len()],
    grants: AtomicU64,
    handoffs: AtomicU64,
    queue_wait_us: LatencyHistogram,
    hold_us: LatencyHistogram,
    /// Gauges, exported as totals, plus per-shard series when there is
    /// more than one shard.
    held_keys: AtomicU64,
    queued_waiters: AtomicU64,
    open_connections: AtomicU64,
    oldest_acquired_unix_ms: AtomicU64,
}

impl Hot {
    fn new() -> Hot {
        Hot {
            requests: [const { [const { AtomicU64::new(0) }; 3] }; 8],
            session_requests: [const { [const { AtomicU64::new(0) }; SESSION_STATUSES.len()] };
                SessionOp::ALL.len()],
            grants: AtomicU64::new(0),
            handoffs: AtomicU64::new(0),
            queue_wait_us: Histogram::new(&LATENCY_BOUNDS_US),
            hold_us: Histogram::new(&LATENCY_BOUNDS_US),
            held_keys: AtomicU64::new(0),
            queued_waiters: AtomicU64::new(0),
            open_connections: AtomicU64::new(0),
            oldest_acquired_unix_ms: AtomicU64::new(0),
        }
    }

    /// One answered request (see the module's semantics).
    pub fn request(&self, action: Action, outcome: Outcome) {
        self.requests[action.index()][outcome.index()].fetch_add(1, Relaxed);
    }

    /// One session Reply (see the module's semantics).
    pub fn session_request(&self, op: SessionOp, status: Status) {
        self.session_requests[op.index()][status as usize].fetch_add(1, Relaxed);
    }

    /// Every grant, immediate or after waiting.
    pub fn grant(&self) {
        self.grants.fetch_add(1, Relaxed);
    }

    /// A grant to a waiter that was queued (also counted by `grant`).
    pub fn handoff(&self) {
        self.handoffs.fetch_add(1, Relaxed);
    }

    /// Enqueue to grant of a waiter.
    pub fn observe_queue_wait_us(&self, us: u64) {
        self.queue_wait_us.observe(us);
    }

    /// Grant to release of a held key.
    pub fn observe_hold_us(&self, us: u64) {
        self.hold_us.observe(us);
    }
}

/// Every figure the server exports. Share it as `Arc<Metrics>`.
pub struct Metrics {
    /// Per event loop: what requests touch ([`Hot`]).
    hot: Box<[Hot]>,
    hangup_withdrawals: AtomicU64,
    undelivered_grants: AtomicU64,
    sessions_opened: AtomicU64,
    sessions_resumed: AtomicU64,
    sessions_ended: AtomicU64,
    sessions_expired: AtomicU64,
    lost_pushed: AtomicU64,
    idle_timeouts: AtomicU64,
    auth_failures: AtomicU64,
    lc_actions_refused: AtomicU64,
    resets_by_key: AtomicU64,
    resets_by_source: AtomicU64,
    connections_refused: AtomicU64,
    frame_timeouts: AtomicU64,
    fdatasync_us: LatencyHistogram,
    wal_batch_records: BatchHistogram,
    wal_bytes_written: AtomicU64,
    wal_compactions: AtomicU64,
    wal_io_errors: AtomicU64,
    recovery_us: AtomicU64,
    /// CLOCK_MONOTONIC ms of `set_ready`; 0 while recovering.
    ready_at_ms: AtomicU64,
    /// CLOCK_MONOTONIC ms of each loop's last tick; 0 = not beaten yet.
    heartbeats_ms: Box<[AtomicU64]>,
    /// Cluster mode only: the replication series.
    raft: OnceLock<RaftMetrics>,
    /// Peer links and certificates (cluster or `--certs-dir` only).
    pub security: Security,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry for a server with one event loop.
    pub fn new() -> Metrics {
        Metrics::new_loops(1)
    }

    /// A registry for a server with `loops` event loops (heartbeat slots
    /// `0..loops`).
    pub fn new_loops(loops: usize) -> Metrics {
        assert!(loops >= 1, "a server has at least one event loop");
        Metrics {
            hot: (0..loops).map(|_| Hot::new()).collect(),
            hangup_withdrawals: AtomicU64::new(0),
            undelivered_grants: AtomicU64::new(0),
            sessions_opened: AtomicU64::new(0),
            sessions_resumed: AtomicU64::new(0),
            sessions_ended: AtomicU64::new(0),
            sessions_expired: AtomicU64::new(0),
            lost_pushed: AtomicU64::new(0),
            idle_timeouts: AtomicU64::new(0),
            auth_failures: AtomicU64::new(0),
            lc_actions_refused: AtomicU64::new(0),
            resets_by_key: AtomicU64::new(0),
            resets_by_source: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            frame_timeouts: AtomicU64::new(0),
            fdatasync_us: Histogram::new(&LATENCY_BOUNDS_US),
            wal_batch_records: Histogram::new(&BATCH_BOUNDS),
            wal_bytes_written: AtomicU64::new(0),
            wal_compactions: AtomicU64::new(0),
            wal_io_errors: AtomicU64::new(0),
            recovery_us: AtomicU64::new(0),
            ready_at_ms: AtomicU64::new(0),
            heartbeats_ms: (0..loops).map(|_| AtomicU64::new(0)).collect(),
            raft: OnceLock::new(),
            security: Security::new(loops),
        }
    }

    /// Cluster mode: this registry gets the `ringlock_raft_*` series of
    /// node `node` with `shards` shards (at most its loop slots), whose
    /// groups also have the nodes `voters` (this one may be among them).
    /// Readiness then requires every shard to serve. The first call counts.
    pub fn enable_raft(&self, node: u64, voters: &[u64], shards: usize) {
        let shards = shards.clamp(1, self.loops());
        self.raft
            .get_or_init(|| RaftMetrics::new(node, voters, shards));
    }

    /// The replication series (cluster mode only).
    pub fn raft(&self) -> Option<&RaftMetrics> {
        self.raft.get()
    }

    /// Cluster mode: the node is not the serving leader of every group
    /// (why, for `/readyz`); `None` when it serves, or is no cluster member.
    pub fn not_serving(&self) -> Option<String> {
        let r = self.raft.get()?;
        if r.shards.iter().all(|s| s.serving.load(Relaxed) == 1) {
            return None;
        }
        let leader = r.shards[0].leader_id.load(Relaxed);
        let known = if leader == 0 {
            "no leader known".to_string()
        } else {
            format!("the leader is node {leader}")
        };
        Some(format!(
            "not serving: node {} is not the serving leader of every shard ({known})\n",
            r.node
        ))
    }

    /// Event loop `shard`'s own counters (the loop's hot path writes only
    /// these).
    pub fn at(&self, shard: usize) -> &Hot {
        &self.hot[shard]
    }

    /// One answered request, counted for loop 0 (a loop uses
    /// [`Metrics::at`]).
    pub fn request(&self, action: Action, outcome: Outcome) {
        self.hot[0].request(action, outcome);
    }

    /// Count of requests answered so far with this action and outcome.
    pub fn requests(&self, action: Action, outcome: Outcome) -> u64 {
        self.hot
            .iter()
            .map(|h| h.requests[action.index()][outcome.index()].load(Relaxed))
            .sum()
    }

    /// One session Reply, counted for loop 0 (a loop uses [`Metrics::at`]).
    pub fn session_request(&self, op: SessionOp, status: Status) {
        self.hot[0].session_request(op, status);
    }

    /// Count of session Replies so far to this op with this status.
    pub fn session_requests(&self, op: SessionOp, status: Status) -> u64 {
        self.hot
            .iter()
            .map(|h| h.session_requests[op.index()][status as usize].load(Relaxed))
            .sum()
    }

    pub fn set_held_keys(&self, n: u64) {
        self.hot[0].held_keys.store(n, Relaxed);
    }

    pub fn set_queued_waiters(&self, n: u64) {
        self.hot[0].queued_waiters.store(n, Relaxed);
    }

    pub fn set_open_connections(&self, n: u64) {
        self.hot[0].open_connections.store(n, Relaxed);
    }

    /// Number of event loops (shards) this registry was built for.
    pub fn shards(&self) -> usize {
        self.heartbeats_ms.len()
    }

    /// One shard's gauges: held keys, queued waiters, open connections, and
    /// the acquire time of its oldest held key (0: none).
    pub fn set_shard_gauges(
        &self,
        shard: usize,
        held: u64,
        queued: u64,
        open: u64,
        oldest_ms: u64,
    ) {
        let h = &self.hot[shard];
        h.held_keys.store(held, Relaxed);
        h.queued_waiters.store(queued, Relaxed);
        h.open_connections.store(open, Relaxed);
        h.oldest_acquired_unix_ms.store(oldest_ms, Relaxed);
    }

    /// A per-loop figure summed over every loop.
    fn sum(&self, f: impl Fn(&Hot) -> &AtomicU64) -> u64 {
        self.hot.iter().map(|h| f(h).load(Relaxed)).sum()
    }

    /// Total held keys over every shard.
    pub fn held_keys_total(&self) -> u64 {
        self.sum(|h| &h.held_keys)
    }

    /// Every grant, counted for loop 0 (a loop uses [`Metrics::at`]).
    pub fn grant(&self) {
        self.hot[0].grant();
    }

    /// A handoff, counted for loop 0 (a loop uses [`Metrics::at`]).
    pub fn handoff(&self) {
        self.hot[0].handoff();
    }

    /// A queued waiter withdrawn because its client hung up.
    pub fn hangup_withdrawal(&self) {
        self.hangup_withdrawals.fetch_add(1, Relaxed);
    }

    /// A session connection opened (Hello).
    pub fn session_opened(&self) {
        self.sessions_opened.fetch_add(1, Relaxed);
    }

    /// A replicated session taken over by a connection (Resume).
    pub fn session_resumed(&self) {
        self.sessions_resumed.fetch_add(1, Relaxed);
    }

    /// A session ended (closed, failed, or its keep-alive passed).
    pub fn session_ended(&self) {
        self.sessions_ended.fetch_add(1, Relaxed);
    }

    /// A session ended because its keep-alive deadline passed.
    pub fn session_expired(&self) {
        self.sessions_expired.fetch_add(1, Relaxed);
    }

    /// A Lost message pushed to a session (lease expired, hold reset).
    pub fn lost_pushed(&self) {
        self.lost_pushed.fetch_add(1, Relaxed);
    }

    /// A session Hello or admin connection without the right auth token.
    pub fn auth_failure(&self) {
        self.auth_failures.fetch_add(1, Relaxed);
    }

    /// A lock-port Unlock/ResetByKey/ResetBySource refused by policy.
    pub fn lc_action_refused(&self) {
        self.lc_actions_refused.fetch_add(1, Relaxed);
    }

    /// A connection closed by the idle timeout.
    pub fn idle_timeout(&self) {
        self.idle_timeouts.fetch_add(1, Relaxed);
    }

    /// A grant released again because its `+` could not be delivered.
    pub fn undelivered_grant(&self) {
        self.undelivered_grants.fetch_add(1, Relaxed);
    }

    /// One operator reset: a key named by ResetByKey/RSET (`false`) or a
    /// source named by ResetBySource/RSBS (`true`).
    pub fn reset(&self, by_source: bool) {
        if by_source {
            self.resets_by_source.fetch_add(1, Relaxed);
        } else {
            self.resets_by_key.fetch_add(1, Relaxed);
        }
    }

    /// A connection refused because the connection limit was reached.
    pub fn connection_refused(&self) {
        self.connections_refused.fetch_add(1, Relaxed);
    }

    /// A connection closed because its frame never completed in time.
    pub fn frame_timeout(&self) {
        self.frame_timeouts.fetch_add(1, Relaxed);
    }

    pub fn observe_queue_wait_us(&self, us: u64) {
        self.hot[0].observe_queue_wait_us(us);
    }

    pub fn observe_hold_us(&self, us: u64) {
        self.hot[0].observe_hold_us(us);
    }

    /// Acquire time of the oldest held key, unix milliseconds; 0 = none held.
    /// The age is computed at scrape time so it keeps growing while the loop
    /// is idle (which is exactly when a stuck lock sits unnoticed).
    pub fn set_oldest_acquired_unix_ms(&self, ms: u64) {
        self.hot[0].oldest_acquired_unix_ms.store(ms, Relaxed);
    }

    pub fn observe_fdatasync_us(&self, us: u64) {
        self.fdatasync_us.observe(us);
    }

    /// One WAL batch made durable (or attempted): its record count and size.
    pub fn observe_wal_batch(&self, records: u64, bytes: u64) {
        self.wal_batch_records.observe(records);
        self.wal_bytes_written.fetch_add(bytes, Relaxed);
    }

    pub fn wal_compaction(&self) {
        self.wal_compactions.fetch_add(1, Relaxed);
    }

    pub fn wal_io_error(&self) {
        self.wal_io_errors.fetch_add(1, Relaxed);
    }

    pub fn set_recovery_us(&self, us: u64) {
        self.recovery_us.store(us, Relaxed);
    }

    /// Recovery is done: from now on `/readyz` and `/healthz` answer 200
    /// while every loop is live. Reads the clock once (the first call counts).
    pub fn set_ready(&self) {
        if self.ready_at_ms.load(Relaxed) == 0 {
            let _ = self
                .ready_at_ms
                .compare_exchange(0, monotonic_ms(), Relaxed, Relaxed);
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready_at_ms.load(Relaxed) != 0
    }

    /// Number of event loops (heartbeat slots).
    pub fn loops(&self) -> usize {
        self.heartbeats_ms.len()
    }

    /// Loop `loop_index` made progress at `now_ms` ([`monotonic_ms`] clock).
    /// One relaxed store; called once per tick. Panics on an index the
    /// registry was not built for (a start-up bug, seen at the first tick).
    pub fn loop_heartbeat(&self, loop_index: usize, now_ms: u64) {
        self.heartbeats_ms[loop_index].store(now_ms, Relaxed);
    }

    /// Liveness at `now_ms`: stalled when some loop's last heartbeat (or
    /// `set_ready`, for a loop that has not beaten yet) is more than
    /// `bound_ms` old. Reports the stalest loop.
    pub fn liveness(&self, now_ms: u64, bound_ms: u64) -> Liveness {
        let ready_at = self.ready_at_ms.load(Relaxed);
        if ready_at == 0 {
            return Liveness::Starting;
        }
        let mut worst: Option<(usize, u64)> = None;
        for (i, hb) in self.heartbeats_ms.iter().enumerate() {
            let last = match hb.load(Relaxed) {
                0 => ready_at,
                beat => beat,
            };
            // A heartbeat newer than `now_ms` (stored after it was read) is fresh.
            let age_ms = now_ms.saturating_sub(last);
            if age_ms > bound_ms && worst.is_none_or(|(_, a)| age_ms > a) {
                worst = Some((i, age_ms));
            }
        }
        match worst {
            None => Liveness::Live,
            Some((loop_index, age_ms)) => Liveness::Stalled { loop_index, age_ms },
        }
    }
}

fn header(w: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(w, "# HELP ringlock_{name} {help}");
    let _ = writeln!(w, "# TYPE ringlock_{name} {kind}");
}

fn gauge(w: &mut String, name: &str, help: &str, value: u64) {
    header(w, name, help, "gauge");
    let _ = writeln!(w, "ringlock_{name} {value}");
}

fn counter(w: &mut String, name: &str, help: &str, value: u64) {
    header(w, name, help, "counter");
    let _ = writeln!(w, "ringlock_{name} {value}");
}

/// One histogram in seconds: the sum of `hs` (one per event loop).
fn seconds_histogram<'a>(
    w: &mut String,
    name: &str,
    help: &str,
    hs: impl Iterator<Item = &'a LatencyHistogram> + Clone,
) {
    header(w, name, help, "histogram");
    let bucket = |i: usize| -> u64 { hs.clone().map(|h| h.buckets[i].load(Relaxed)).sum() };
    let mut cumulative = 0;
    for (i, &bound_us) in LATENCY_BOUNDS_US.iter().enumerate() {
        cumulative += bucket(i);
        let _ = write!(w, "ringlock_{name}_bucket{{le=\"");
        push_seconds(w, bound_us);
        let _ = writeln!(w, "\"}} {cumulative}");
    }
    cumulative += bucket(LATENCY_BOUNDS_US.len());
    let _ = writeln!(w, "ringlock_{name}_bucket{{le=\"+Inf\"}} {cumulative}");
    let _ = write!(w, "ringlock_{name}_sum ");
    push_seconds(w, hs.map(|h| h.sum()).sum());
    w.push('\n');
    let _ = writeln!(w, "ringlock_{name}_count {cumulative}");
}

/// Writes `us` microseconds as exact decimal seconds: 0, 0.00001, 2.5, 10.
fn push_seconds(w: &mut String, us: u64) {
    let whole = us / 1_000_000;
    let _ = write!(w, "{whole}");
    let mut frac = us % 1_000_000;
    if frac != 0 {
        let mut digits = 6;
        while frac.is_multiple_of(10) {
            frac /= 10;
            digits -= 1;
        }
        let _ = write!(w, ".{frac:0digits$}");
    }
}

#[cfg(test)]
mod tests;
