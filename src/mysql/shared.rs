//! What every lease of a [`Locker`](super::Locker) shares: its options and
//! the keep-alive and connection-watch threads.
//!
//! The lease type is a parameter (the locker uses `Shared<Held>`), so that
//! this file, `held.rs` (a lease, which reads the options) and `locker.rs`
//! (which builds both) import in one direction only.

use std::sync::Arc;
use std::time::Duration;

use ::mysql::Pool;

use super::keeper::{Due, Keeper};
use super::watcher::{Watched, Watcher};
use crate::lease::{Lease, LostHandler, LostLock};

/// Keep-alive interval by default: the first ping one interval after the
/// grant, then one per interval.
pub const DEFAULT_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// Bound on each keep-alive ping by default.
pub const DEFAULT_KEEP_ALIVE_PING_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on a release (`RELEASE_LOCK` included) by default.
pub const DEFAULT_RELEASE_TIMEOUT: Duration = Duration::from_secs(10);
/// The clean-up after a cancelled acquire is bounded by min(release
/// timeout, this), so that a cancelled caller returns promptly.
pub const CLEANUP_TIMEOUT_MAX: Duration = Duration::from_secs(2);
/// Locker-wide options. A zero duration keeps the default (the Go
/// original's "non-positive keeps the default"; a `Duration` cannot be
/// negative).
#[derive(Clone)]
pub struct Options {
    keep_alive_interval: Duration,
    keep_alive_ping_timeout: Duration,
    release_timeout: Duration,
    // Read by the locker when it makes a lease.
    pub(super) on_lost: Option<LostHandler>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            keep_alive_interval: DEFAULT_KEEP_ALIVE_INTERVAL,
            keep_alive_ping_timeout: DEFAULT_KEEP_ALIVE_PING_TIMEOUT,
            release_timeout: DEFAULT_RELEASE_TIMEOUT,
            on_lost: None,
        }
    }
}

impl Options {
    /// The defaults (30 s, 10 s, 10 s, no handler).
    pub fn new() -> Self {
        Self::default()
    }

    /// How often each held lock's session is pinged (`DO 1`).
    pub fn keep_alive_interval(mut self, d: Duration) -> Self {
        if !d.is_zero() {
            self.keep_alive_interval = d;
        }
        self
    }

    /// How long one ping may take before the lock is presumed lost. Also
    /// bounds the checkout of `try_lock` and the wait for any answer that
    /// should be immediate.
    pub fn keep_alive_ping_timeout(mut self, d: Duration) -> Self {
        if !d.is_zero() {
            self.keep_alive_ping_timeout = d;
        }
        self
    }

    /// How long a release may take, `RELEASE_LOCK` included.
    pub fn release_timeout(mut self, d: Duration) -> Self {
        if !d.is_zero() {
            self.release_timeout = d;
        }
        self
    }

    /// A handler for every lease of this locker, called before the lease's
    /// own (the Go original's keep-alive error handler).
    pub fn on_lost(mut self, handler: impl Fn(&Lease, &LostLock) + Send + Sync + 'static) -> Self {
        self.on_lost = Some(Arc::new(handler));
        self
    }

    /// The keep-alive interval in effect.
    pub fn interval(&self) -> Duration {
        self.keep_alive_interval
    }

    /// The ping timeout in effect.
    pub fn ping_timeout(&self) -> Duration {
        self.keep_alive_ping_timeout
    }

    /// The release timeout in effect.
    pub fn release_timeout_value(&self) -> Duration {
        self.release_timeout
    }

    /// The cleanup bound after a cancelled acquire: min(release timeout, 2 s).
    pub fn cleanup_timeout(&self) -> Duration {
        self.release_timeout.min(CLEANUP_TIMEOUT_MAX)
    }

    /// The longest a dead session can go unnoticed when the path to the
    /// server goes silent: interval + ping timeout (40 s at the defaults).
    /// A session the server ends (`KILL`, restart, a closed or reset
    /// connection) is noticed within milliseconds by the connection watch.
    pub fn detection_window(&self) -> Duration {
        self.keep_alive_interval + self.keep_alive_ping_timeout
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("keep_alive_interval", &self.keep_alive_interval)
            .field("keep_alive_ping_timeout", &self.keep_alive_ping_timeout)
            .field("release_timeout", &self.release_timeout)
            .field("on_lost", &self.on_lost.is_some())
            .finish()
    }
}

/// What every lease of a locker shares.
pub(crate) struct Shared<H: Due + Watched> {
    pub(crate) pool: Pool,
    pub(crate) opts: Options,
    pub(crate) keeper: Arc<Keeper<H>>,
    pub(crate) watcher: Arc<Watcher<H>>,
}

impl<H: Due + Watched> Drop for Shared<H> {
    fn drop(&mut self) {
        // Runs when the locker and all its leases are gone.
        self.keeper.shutdown();
        self.watcher.shutdown();
    }
}
