//! ringlock: a Locking-Center compatible lock server on a single-threaded io_uring loop.
//!
//! (Architecture docs are filled in as the modules land.)

pub mod client;
pub mod core;
pub mod metrics;
pub mod protocol;
pub mod config;
#[macro_use]
pub mod log;
pub mod io;
pub mod server;
pub mod wal;
