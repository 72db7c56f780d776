//! ringlock: a Locking-Center compatible lock server on a single-threaded
//! io_uring event loop, with a write-ahead log, a blocking client and a CLI.
//!
//! # Layout (one folder per concern)
//! - [`protocol`]: wire codecs of the lock port and the admin port (pure).
//! - [`core`]: the lock table — keys, holders, intrusive FIFO wait lists in
//!   slabs, a per-source index. Pure state machine: `operation(now) →
//!   effects`, no syscalls, no clock reads.
//! - [`wal`]: the write-ahead log — record format, recovery scan, group
//!   commit bookkeeping, rewrite (compaction) planning.
//! - [`io`]: io_uring plumbing (`user_data` = op | generation | slot).
//! - [`server`]: the event loop that turns completions into table
//!   operations and effects into submissions.
//! - [`client`]: blocking std-only client library (used by the `ringlock` CLI).
//! - [`lease`]: the lock API every backend shares (`Locker`, `Lease`, the
//!   lost-lock handler); [`mysql`]: that API over MySQL/MariaDB `GET_LOCK`
//!   (cargo feature `mysql`; its address parsing is always built).
//! - [`metrics`]: atomics-only Prometheus registry and its HTTP thread.
//! - [`config`]: every limit and default in one place; [`log`]: key=value logs.
//!
//! # The tick (see [`server`])
//! `submit_and_wait` → drain all CQEs into a local array → dispatch each
//! (accept, recv → decode → table, send, log write/fsync) → apply the
//! table's effects in order (grants and releases become log records; replies
//! go to connection outputs, gated on the log) → expire partial frames →
//! close the log batch and submit write+fdatasync if none is in flight →
//! one send per connection whose answer is not gated → publish gauges.
//!
//! # The durability rule (see [`wal`])
//! With `--data-path`, every reply produced while log records are pending
//! is held until those records are durable (write + fdatasync completed):
//! a `+` for a grant never leaves before its record, an unlock's `+` and the
//! next holder's `+` never before the release record. One batch is in
//! flight at a time; records arriving meanwhile form the next batch, which
//! is submitted the moment the flight lands (group commit, no timer). A
//! failed write or fdatasync voids every non-durable record: their requests
//! get `-`, their effects are undone, and the log is rewritten into a fresh
//! file before any further `+`. The design may leave a key held by nobody
//! (cleared by a reset), never one key with two owners.

pub mod client;
pub mod config;
pub mod core;
pub mod lease;
pub mod metrics;
pub mod mysql;
pub mod protocol;
#[macro_use]
pub mod log;
pub mod io;
pub mod server;
pub mod wal;
