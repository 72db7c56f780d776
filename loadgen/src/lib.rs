//! ringlock-loadgen: a load generator for lock services that cannot hide a
//! stall (no coordinated omission).
//!
//! Layout:
//! - [`config`]: command line and target URLs.
//! - [`dist`]: deterministic RNG and key distributions (uniform, Zipf, hot, private).
//! - [`proto`]: one small, unit-tested codec per target protocol
//!   (Locking-Center, RESP, PostgreSQL simple query, MySQL/MariaDB, etcd's
//!   HTTP/JSON gateway). Codecs do no I/O: bytes in, replies out.
//! - [`engine`]: a single-threaded epoll loop that drives every client as a
//!   state machine (connect → handshake → lock → hold → unlock), schedules
//!   open-loop arrivals and records latencies from the *intended* start time.
//! - [`report`]: histogram summaries, the text report and the `--json` line.
//!
//! One thread drives all connections: the benchmark pins the load generator
//! to one CPU, where one epoll thread beats N blocked threads that the
//! scheduler would have to switch between (that switching would show up as
//! latency of the system under test).

pub mod config;
pub mod dist;
pub mod engine;
pub mod proto;
pub mod report;
pub mod sha1;
