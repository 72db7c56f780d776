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
//!
//! # Files
//! This file only names the parts: [`Metrics`] and the per-loop [`Hot`]
//! figures are `registry.rs` (rendered by `registry/render.rs`), the label
//! values `labels.rs`, [`Histogram`] `histogram.rs`, the text format's
//! lines `text.rs`, the cluster's series `raft.rs`, the TLS ones
//! `security.rs`, and the scrape's HTTP thread `http.rs`.

mod histogram;
mod http;
mod labels;
mod raft;
mod registry;
mod security;
mod text;
pub use histogram::{Histogram, BATCH_BOUNDS, LATENCY_BOUNDS_US};
pub use labels::{Action, Outcome, SessionOp, SESSION_STATUSES};
pub use raft::{ForwardOutcome, RaftGauges, RaftMetrics};
pub use registry::{monotonic_ms, Hot, Liveness, Metrics};
pub use security::{Handshake, Security};

pub use http::{
    serve, serve_with, Options, CONNECTIONS_MAX, REQUEST_HEAD_BYTES_MAX, REQUEST_TIMEOUT,
    WRITE_TIMEOUT,
};

#[cfg(test)]
mod tests;
