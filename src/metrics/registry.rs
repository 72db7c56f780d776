//! [`Metrics`], the registry every loop updates and every scrape reads
//! (its rendering: `registry/render.rs`), the per-loop [`Hot`] figures, and
//! liveness.

mod render;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

use crate::protocol::session::Status;

use super::histogram::{
    BatchHistogram, Histogram, LatencyHistogram, BATCH_BOUNDS, LATENCY_BOUNDS_US,
};
use super::labels::{Action, Outcome, SessionOp, SESSION_STATUSES};
use super::raft::RaftMetrics;
use super::security::Security;

/// CLOCK_MONOTONIC in milliseconds: the clock of heartbeats (the server's
/// `mono_us` reads the same clock). Never 0 on a running system.
pub fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live, writable timespec on this stack for the whole
    // call, and CLOCK_MONOTONIC always exists, so the kernel writes only
    // `ts`. Were the pointer wrong the write would corrupt the stack; were
    // the clock another, heartbeats would not compare with `mono_us` and
    // /healthz would misjudge a loop's age:
    // tests/metrics.rs::readiness_waits_for_recovery_and_liveness_for_every_loop
    // (a loop 61 s stale by this clock must answer 503).
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
    /// Of them, shared and semaphore grants (exclusive: the rest).
    shared_grants: AtomicU64,
    semaphore_grants: AtomicU64,
    handoffs: AtomicU64,
    queue_wait_us: LatencyHistogram,
    hold_us: LatencyHistogram,
    /// Gauges, exported as totals, plus per-shard series when there is
    /// more than one shard.
    held_keys: AtomicU64,
    /// Holders by access: exclusive, shared, semaphore (totals only).
    holders: [AtomicU64; 3],
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
            shared_grants: AtomicU64::new(0),
            semaphore_grants: AtomicU64::new(0),
            handoffs: AtomicU64::new(0),
            queue_wait_us: Histogram::new(&LATENCY_BOUNDS_US),
            hold_us: Histogram::new(&LATENCY_BOUNDS_US),
            held_keys: AtomicU64::new(0),
            holders: [const { AtomicU64::new(0) }; 3],
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

    /// A grant, and how it holds its key (`grants_by_access_total`).
    pub fn grant_access(&self, access: crate::core::Access) {
        self.grants.fetch_add(1, Relaxed);
        match access {
            crate::core::Access::Exclusive => {}
            crate::core::Access::Shared => {
                self.shared_grants.fetch_add(1, Relaxed);
            }
            crate::core::Access::Semaphore(_) => {
                self.semaphore_grants.fetch_add(1, Relaxed);
            }
        }
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
    /// Watches open now (every shard's), and Events pushed to them.
    watches: std::sync::atomic::AtomicI64,
    watch_events: AtomicU64,
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
            watches: std::sync::atomic::AtomicI64::new(0),
            watch_events: AtomicU64::new(0),
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

    /// One shard's holders by access: exclusive, shared, semaphore.
    pub fn set_shard_holders(&self, shard: usize, by_access: [u64; 3]) {
        for (g, n) in self.hot[shard].holders.iter().zip(by_access) {
            g.store(n, Relaxed);
        }
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

    /// Watches began (`n` > 0) or ended (`n` < 0).
    pub fn watches_changed(&self, n: i64) {
        if n != 0 {
            self.watches.fetch_add(n, Relaxed);
        }
    }

    /// An Event pushed to a watch (a grant or a release of its key).
    pub fn watch_event(&self) {
        self.watch_events.fetch_add(1, Relaxed);
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
