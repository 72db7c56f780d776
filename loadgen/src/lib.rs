//! ringlock-loadgen: a load generator for lock services that cannot hide a
//! stall (no coordinated omission).
//!
//! Layout:
//! - [`config`]: command line and target URLs.
//! - [`dist`]: deterministic RNG and key distributions (uniform, Zipf, hot, private).
//! - [`proto`]: one small, unit-tested codec per target protocol
//!   (Locking-Center, ringlockd sessions, RESP, PostgreSQL simple query, MySQL/MariaDB, etcd's
//!   HTTP/JSON gateway). Codecs do no I/O: bytes in, replies out.
//! - [`engine`]: an epoll loop per thread that drives its clients as
//!   state machines (connect → TLS handshake, for ringlock targets with
//!   `--tls-certs-dir` → protocol handshake → lock → hold → unlock), schedules
//!   open-loop arrivals and records latencies from the *intended* start time;
//!   the threads' histograms are merged at the end.
//! - [`fifo`]: a mixed run's (`--writers`) per-writer FIFO evidence, worked
//!   out after the run from every Acquire's send, grant and Release times.
//! - [`report`]: histogram summaries, the text report and the `--json` line.
//!
//! By default one thread drives all connections: the benchmark pins the load
//! generator to one CPU, where one epoll thread beats N blocked threads that
//! the scheduler would have to switch between (that switching would show up
//! as latency of the system under test). `--threads N` runs N such loops,
//! each owning a disjoint set of clients, for a machine where one CPU of
//! load cannot saturate a server with several shards.

pub mod config;
pub mod dist;
pub mod engine;
pub mod fifo;
pub mod proto;
pub mod report;
pub mod sha1;
