//! The lock API ([`crate::lease`]) over MySQL/MariaDB named locks
//! (`GET_LOCK`), for teams that already run MySQL and want no new
//! infrastructure. `Locker` needs the cargo feature `mysql`; the address
//! parsing in [`addr`] is always built.
//!
//! ```no_run
//! # #[cfg(feature = "mysql")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use ringlock::lease::{Error, LockOptions};
//! use ringlock::mysql::Locker;
//!
//! // Password from $RINGLOCK_MYSQL_PASSWORD or $RINGLOCK_MYSQL_PASSWORD_FILE.
//! let locker = Locker::from_url("mysql://app@db.internal:3306")?;
//! let opts = LockOptions::new().on_lost(|_lease, lost| eprintln!("{lost}: stop the work"));
//! match locker.lock_with("daily-reconciliation", Duration::from_secs(10), &opts) {
//!     Ok(lease) => {
//!         // ... the critical section ...
//!         lease.release()?;
//!     }
//!     Err(Error::Timeout) => {} // another instance holds it
//!     Err(e) => return Err(e.into()),
//! }
//! # Ok(()) }
//! # #[cfg(not(feature = "mysql"))]
//! # fn main() {}
//! ```
//!
//! # The contract (what this backend does, in order)
//! - **Validation before traffic**: a key of 1..=64 *characters* (not
//!   bytes), then a non-zero timeout; only then is a connection checked out.
//!   (The original's "nil database handle" cannot happen: a `Locker` owns
//!   its pool.)
//! - **A pinned connection**: each lock checks one connection out of the
//!   pool and keeps it for the lock's whole life; that connection's session
//!   owns the lock. Two leases never share a session, so a second lock on a
//!   key this process already holds waits like any other contender.
//! - **The SQL**: `SELECT COALESCE(GET_LOCK(key, seconds), -1)`: 1 granted,
//!   0 → [`Error::Timeout`](crate::lease::Error::Timeout) (someone else holds
//!   it), anything else → [`Error::Failed`](crate::lease::Error::Failed).
//!   `SELECT COALESCE(RELEASE_LOCK(key), -1)`: 1 released, anything else →
//!   [`Error::Lost`](crate::lease::Error::Lost). Keep-alive: `DO 1`.
//! - **Cancellation** ([`LockOptions`](crate::lease::LockOptions) `cancel`
//!   or `deadline`): `GET_LOCK` is interrupted with `KILL QUERY` from
//!   another pooled connection (the connection is cut if that cannot be done
//!   in time). If the caller's cancellation is in effect when `GET_LOCK`
//!   returns, a best-effort `RELEASE_LOCK` goes out on the same connection,
//!   bounded by min(release timeout, 2 s), its outcome ignored, and the
//!   connection is closed; the caller gets `Cancelled`/`DeadlineExceeded`,
//!   never `Timeout`. Any other failure returns its error without that
//!   cleanup (and closes the connection).
//! - **Connection watch**: one thread per locker polls every idle pinned
//!   connection; an end of stream, an error or unasked bytes from the server
//!   (a `KILL`, a server restart, a dropped connection) are a loss within
//!   milliseconds. The lease peeks at the socket under the lock every user
//!   of the connection takes, so the watch never races the driver.
//! - **Keep-alive**: one interval after the grant and every interval after
//!   that, `DO 1` on the pinned connection, each bounded by the ping timeout
//!   (for a path that goes silent without closing). The first failure of
//!   either is final: verdict (lost, unless a release began) →
//!   the connection is closed and let go → the handlers run (locker-wide,
//!   then per lease; panics caught). Closing the connection makes the
//!   presumption true: the session ends as soon as the server sees it, so
//!   the lock is not left in doubt.
//! - **Release** ([`Lease::release`](crate::lease::Lease::release), or the
//!   drop of its last clone): once. It stops the keep-alive and waits for it
//!   to let go of the connection (a ping in flight no longer counts and
//!   cannot outlive the release timeout), then `RELEASE_LOCK` bounded by
//!   what is left of the release timeout; a timeout or query error is
//!   [`Error::Unreleased`](crate::lease::Error::Unreleased) and the
//!   connection is closed, ending the session and with it the lock. A clean
//!   answer returns the connection to the pool.
//! - **Defaults**: keep-alive interval 30 s, ping timeout 10 s, release
//!   timeout 10 s (`Options`; a zero duration keeps the default).
//!
//! # Go names → Rust names
//! | mysqllock (Go) | ringlock |
//! |---|---|
//! | `mysqllock.New(db, opts...)` | `Locker::new(pool)`, `Locker::with_options`, `Locker::from_url` |
//! | `Acquire(ctx, key, timeout, opts...)` | `Locker::lock_with(key, timeout, &LockOptions)`, `Locker::lock` |
//! | `ctx` cancellation / deadline | `LockOptions::cancel(CancelToken)` / `LockOptions::deadline(Instant)` |
//! | `ReleaseFunc` | [`Lease::release`](crate::lease::Lease::release) (and drop) |
//! | `WithKeepAliveInterval` | `Options::keep_alive_interval` |
//! | `WithKeepAlivePingTimeout` | `Options::keep_alive_ping_timeout` |
//! | `WithReleaseTimeout` | `Options::release_timeout` |
//! | `WithKeepAliveErrorHandler` | `Options::on_lost` (locker-wide) |
//! | `WithLostLockHandler` | `LockOptions::on_lost` (per lease) |
//! | `ErrInvalidKey` / `ErrInvalidTimeout` | `Error::InvalidKey` / `Error::InvalidTimeout` |
//! | `ErrTimeout` | `Error::Timeout` |
//! | `context.Canceled` / `DeadlineExceeded` | `Error::Cancelled` / `Error::DeadlineExceeded` |
//! | `ErrLockLost` | `Error::Lost(LostLock)` |
//! | "failed to acquire" / "unable to release" | `Error::Failed` / `Error::Unreleased` |
//!
//! # What it cannot promise
//! - **No fencing token**: [`Lease::token`](crate::lease::Lease::token) is
//!   `None`. The protected resource cannot tell a stale holder from the
//!   current one.
//! - **The lock dies with its session**, and the server may grant it to
//!   someone else the moment it does. Between that and the handler:
//!   milliseconds when the server ended the session (the connection watch),
//!   up to interval + ping timeout (40 s at the defaults) when the path went
//!   silent (the ping): two critical sections can overlap in that window. The handler is a notification,
//!   not a brake.
//! - **A cut path keeps the lock on the server** until the server notices
//!   the dead session (`wait_timeout`, TCP keepalive): the handler fires
//!   here, but nobody else gets the key until then.
//! - **One server**: replicas and other primaries do not share the lock
//!   namespace.
//! - **A lease never released or dropped** (leaked) keeps its lock until
//!   the process exits.

pub mod addr;

pub use addr::{is_mysql_addr, AddrError, MysqlAddr, PASSWORD_ENV, PASSWORD_FILE_ENV};

/// True when this build has the MySQL backend (cargo feature `mysql`). A
/// CLI built without it should refuse a `mysql://` address with a message
/// that says so.
pub const ENABLED: bool = cfg!(feature = "mysql");

#[cfg(feature = "mysql")]
mod held;
#[cfg(feature = "mysql")]
mod keeper;
#[cfg(feature = "mysql")]
mod locker;
#[cfg(feature = "mysql")]
mod shared;
#[cfg(feature = "mysql")]
mod sock;
#[cfg(feature = "mysql")]
mod sql;
#[cfg(feature = "mysql")]
mod watcher;

#[cfg(feature = "mysql")]
pub use locker::{Locker, CONNECT_TIMEOUT, URL_POOL_MAX};
#[cfg(feature = "mysql")]
pub use shared::{
    Options, CLEANUP_TIMEOUT_MAX, DEFAULT_KEEP_ALIVE_INTERVAL, DEFAULT_KEEP_ALIVE_PING_TIMEOUT,
    DEFAULT_RELEASE_TIMEOUT,
};
#[cfg(feature = "mysql")]
pub use sql::{KEY_CHARS_MAX, LOCK_TIMEOUT_MAX};
