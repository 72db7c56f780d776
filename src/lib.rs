//! ringlock: a distributed lock server (Locking-Center compatible) and its
//! blocking client.
//!
//! # Using the client
//! [`client::Client`] talks to `ringlockd` (or any Locking-Center server) on
//! its lock port, 22119 by default. It is std-only and blocking: no async
//! runtime. A granted lock is a [`client::Guard`] that releases the key when
//! dropped.
//!
//! ```no_run
//! use std::time::Duration;
//! use ringlock::client::{Client, Error};
//!
//! # fn reconcile() {}
//! # fn main() -> Result<(), Error> {
//! // "HOST" alone means HOST:22119, as in the `ringlock` CLI.
//! let client = Client::builder("127.0.0.1")
//!     .source("billing-worker") // shown by `ringlock keys`; default: your IP
//!     .build()?;
//! match client.lock_timeout("nightly/reconcile", Duration::from_secs(10)) {
//!     Ok(mut guard) => {
//!         reconcile();      // the critical section
//!         guard.release()?; // or let `guard` drop
//!     }
//!     Err(Error::Timeout) => {} // someone else holds it
//!     Err(e) => return Err(e),
//! }
//! # Ok(()) }
//! ```
//!
//! [`client::Session`] is the client of ringlockd's session protocol: locks
//! that the server frees when their holder's session ends, leases, fencing
//! tokens, and a lost-lock handler ([`lease`] is its API, shared with the
//! MySQL backend).
//!
//! To depend on the client alone, without the server's io_uring and
//! log dependencies (it then builds on any Unix):
//!
//! ```toml
//! ringlock = { version = "0.1", default-features = false }
//! ```
//!
//! Features: `server` (default) builds `ringlockd` and the server modules;
//! `cli` (default) builds the `ringlock` command-line tool; `tls` (enabled
//! by both) builds [`tls`], the certificates and TLS configurations of
//! every port.
//!
//! # Architecture of the server
//!
//! ## Layers (one folder per concern, pure at the bottom, I/O at the edge)
//! Low to high; a module imports only from its own layer or lower ones,
//! and no two files import each other, directly or around a longer cycle
//! (`tests/layering.rs` checks that, and that no file of `src/` is over
//! 1000 lines).
//! 0. Leaves, which import nothing above them: [`config`] (every limit and
//!    default), [`mod@log`] (the structured log), [`metrics`]
//!    (atomics-only registry and its HTTP thread; it names the session
//!    protocol's statuses and the peer checks' refusal reasons as label
//!    values, nothing else above it), [`fence`] (the protected
//!    resource's side of fencing tokens), [`tls`] (the certificates of
//!    `ringlock cert` checked and turned into rustls configurations, cargo
//!    feature `tls`) and the cancel token that [`lease`] and [`client`]
//!    re-export.
//! 1. [`core`]: the lock table — keys, holders, intrusive FIFO wait lists in
//!    slabs, a per-source index — with its contract types
//!    ([`core::HoldMode`], [`core::HeldKey`], ...) and the key → shard
//!    routing ([`core::route::owner`]). `operation(now) → effects`, no
//!    syscalls, no clock reads.
//! 2. [`protocol`]: wire codecs of the lock port, the session protocol and
//!    the admin port (pure), over core's types.
//! 3. [`wal`]: the write-ahead log — record format and group-commit /
//!    compaction bookkeeping (pure), the write planner that decides every
//!    write, sync, rename and growth step from the completions it is told
//!    ([`wal::plan`], pure; the driver and the simulator both run it),
//!    recovery replay over bytes (pure), and the one start-up function that
//!    syncs, maps and replays the file ([`wal::STARTUP`]).
//!    [`cluster`] beside it: a shard's replica of its Raft group (raft-rs
//!    driven by hand, pure), the cluster log's records and replay, and the
//!    frames of the links between nodes.
//! 4. [`shard`]: everything one event loop decides, composed from the
//!    above: connection protocol states, the lock table, the durability
//!    gate (held replies, durable watermark, undo list) and its journal —
//!    memory, the local log, or the Raft group (`shard::raft`: each batch
//!    one proposal, the gate opening on commit+apply); the gate waits on
//!    the journal's lsn either way. Fed events, returns commands;
//!    no syscall, no clock read, no `unsafe`. The simulators (`tests/sim`,
//!    `tests/sim_cluster.rs`) drive it too.
//! 5. [`driver`]: the io_uring event loop — the only place with `unsafe`
//!    I/O; owns every fd and every buffer lent to the kernel. One file per
//!    concern: syscall wrappers, the ring and its tick, connection I/O, the
//!    log's I/O (thin: it submits what [`wal::plan`] says), start-up and
//!    threads, the mesh between shards, the Raft links to other nodes, and
//!    the `user_data` codec ([`driver::user_data`]).
//! 6. The client side, beside the server's layers (it uses only
//!    [`protocol`]'s codecs and the leaves): [`lease`] (the lock API every
//!    backend shares: `Locker`, `Lease`, the lost-lock handler), below its
//!    backends [`client`] (blocking, std-only client library and session
//!    client) and [`mysql`] (that API over MySQL/MariaDB `GET_LOCK`, cargo
//!    feature `mysql`), below [`backend`] (a `Locker` picked by address).
//! 7. The binaries (`ringlockd`, `ringlock`) on top.
//!
//! ## The tick (see [`driver`] and [`shard`])
//! `submit_and_wait` (at most a heartbeat interval) → drain all CQEs into a
//! local array → dispatch each as a shard event (accept, bytes received,
//! send done, hang-up, log chain landed) — the shard decodes, runs the
//! table and applies its effects in order (grants and releases become log
//! records; answers go to connection outputs, gated on the log) →
//! `end_tick`: expire partial frames, close the log batch (the next
//! write+fdatasync chain if none is in flight), hand every answer whose
//! records are durable to the driver, publish gauges → the driver submits
//! the commands.
//!
//! ## The durability rule (see `wal`)
//! With `--data-path`, every reply produced while log records are pending
//! is held until those records are durable (write + fdatasync completed):
//! a `+` for a grant never leaves before its record, an unlock's `+` and the
//! next holder's `+` never before the release record. One batch is in
//! flight at a time; records arriving meanwhile form the next batch, which
//! is submitted the moment the flight lands (group commit, no timer). A
//! failed write or fdatasync voids every non-durable record: their requests
//! get `-`, their effects are undone, and the log is rewritten into a fresh
//! file before any further `+`. The design may leave a key held by nobody
//! (cleared by a reset), never one key with two owners. The log file is
//! kept zero-filled and synced ahead of its records (preallocation, grown
//! beside the appends as the planner decides), so an append's fdatasync commits
//! only data; at most 64 KiB of an append is unsynced at a time, which is
//! what lets recovery tell a write torn in place from damage.

// Without the server modules, the architecture section's links dangle.
#![cfg_attr(not(feature = "server"), allow(rustdoc::broken_intra_doc_links))]

pub mod backend;
mod cancel;
pub mod client;
pub mod config;
pub mod core;
pub mod fence;
pub mod lease;
#[cfg(feature = "server")]
pub mod metrics;
pub mod mysql;
pub mod protocol;
#[macro_use]
pub mod log;
#[cfg(feature = "server")]
pub mod cluster;
#[cfg(feature = "server")]
pub mod driver;
#[cfg(feature = "server")]
pub mod shard;
#[cfg(feature = "tls")]
pub mod tls;
#[cfg(feature = "server")]
pub mod wal;
