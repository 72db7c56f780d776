//! Blocking client library for ringlock (and any Locking-Center server).
//!
//! std only: no async runtime, no io_uring. Each operation opens its own TCP
//! connection (docs/protocol.md); a granted lock keeps the connection it
//! was granted on so that its [`Guard`] can send Unlock on it later.
//!
//! ```no_run
//! use std::time::Duration;
//! use ringlock::client::{Client, RetryPolicy};
//!
//! # fn main() -> Result<(), ringlock::client::Error> {
//! let client = Client::builder("127.0.0.1:22119")
//!     .source("billing-worker")
//!     .io_timeout(Duration::from_secs(5))
//!     .retry(RetryPolicy::default())
//!     .build()?;
//! let mut guard = client.lock_timeout("nightly/reconcile", Duration::from_secs(10))?;
//! // ... critical section ...
//! guard.release()?; // or let it drop
//! # Ok(()) }
//! ```
//!
//! # Invariants (what the client promises)
//! - **A bad key never reaches the network**: empty keys, keys over 127
//!   bytes and sources over 127 bytes (255 for a reset by source) fail
//!   with [`Error::InvalidKey`] /
//!   [`Error::InvalidSource`] before any connection is opened.
//! - **Exact cancellation**: when a lock wait ends by deadline or
//!   [`CancelToken`], the client half-closes the connection
//!   (`shutdown(Write)`) and reads until EOF. The server withdraws a queued
//!   waiter when it sees the EOF and answers nothing. If a `+` was sent
//!   before that, the client reads it and honours it according to
//!   [`LateGrant`]: the grant is never leaked and never reported as failure.
//! - **Release exactly once**: [`Guard::release`] sends Unlock once and
//!   returns that result to every later call; dropping an unreleased guard
//!   releases it.
//! - **No silent infinite retry**: connection failures are retried with
//!   capped exponential backoff and jitter until [`RetryPolicy::max_elapsed`]
//!   (or the caller's deadline), then fail with [`Error::Unavailable`]. Only
//!   failures that provably had no effect are retried.
//!
//! # What the protocol cannot promise (the session's betrayals)
//! - The server does **not** release a held key when its holder
//!   disconnects. If the guard's connection broke, release reconnects and
//!   sends Unlock on a new connection. If the Unlock was sent and its answer
//!   lost, the outcome is ambiguous: the client asks the admin port (`KEYS`)
//!   whether the key is still held by its own connection endpoint and only
//!   then sends Unlock again. If that cannot be checked, release reports an
//!   error saying the key may still be held, instead of guessing: an Unlock
//!   sent blindly could free a lock that someone else was granted since.
//! - Unlock has no owner check (Locking-Center semantics). If an operator
//!   reset the key and someone else took it, a guard's release frees *their*
//!   lock. [`Guard::is_held`] lets a long critical section check that it still
//!   owns the key; fencing on the protected resource is the real defence.
//! - A server restart without a write-ahead log forgets every key, and the
//!   holders are not told. [`Guard::is_held`] detects that too.
//! - A process killed with SIGKILL (or a `panic = "abort"` build that panics)
//!   never runs the guard's drop: the key stays held until a reset.
//! - A lock wait is a long read on an idle connection. TCP keepalive (on by
//!   default, see [`ClientBuilder::tcp_keepalive`]) turns a silently dead
//!   path into an error instead of a wait that never ends.

mod addr;
mod conn;
mod error;
mod guard;
mod listing;
pub mod locate;
mod lock_client;
pub mod members;
mod retry;
mod routing;
pub mod session;
pub mod stream;
mod wire;

pub use crate::cancel::CancelToken;
/// How a lock is shared with other holders ([`Acquire::access`], [`crate::lease::Lease::access`]).
pub use crate::protocol::session::Access;
/// One shard's replication state, as [`Client::cluster_status`] returns it.
pub use crate::protocol::status::{Follower as FollowerStatus, Role, ShardStatus};
pub use addr::{ToServerAddrs, DEFAULT_PORT};
pub use error::{Error, Result};
pub use guard::{Guard, LateGrant, LockOptions};
pub use listing::KeyStream;
pub use lock_client::{Client, ClientBuilder};
pub use retry::{RetryEvent, RetryPolicy};
pub use session::election::{Election, Leader, Leadership, Observer};
pub use session::{
    Acquire, EventKind, HeldAs, Hold, Holder, Session, SessionBuilder, Wait, Watch, WatchEvent,
};
pub use wire::{KeyInfo, KEY_LEN_MAX, SOURCE_LEN_MAX};
