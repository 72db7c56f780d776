//! One lock API for every backend: a [`Locker`] hands out [`Lease`]s.
//!
//! A program written against this module switches backends by changing an
//! address, not its code: `ringlock::mysql::Locker` (MySQL/MariaDB
//! `GET_LOCK`, cargo feature `mysql`) and `ringlock::client::Session` (a
//! `ringlockd` session, with fencing tokens and leases) both implement
//! [`Locker`] and hand out the same [`Lease`] type; `ringlock::backend::connect`
//! picks one by address. This module is below both backends and imports
//! neither.
//!
//! ```no_run
//! use std::time::Duration;
//! use ringlock::lease::{Error, Locker, LockOptions};
//!
//! fn nightly(locker: &dyn Locker) -> Result<(), Error> {
//!     let opts = LockOptions::new().on_lost(|lease, lost| {
//!         // The lock is gone: stop the critical section (a flag, a channel).
//!         eprintln!("{lost}");
//!         let _ = lease.release(); // allowed from inside the handler
//!     });
//!     let lease = match locker.lock_with("nightly/reconcile", Duration::from_secs(10), &opts) {
//!         Ok(lease) => lease,
//!         Err(Error::Timeout) => return Ok(()), // someone else is on it
//!         Err(e) => return Err(e),
//!     };
//!     // ... the critical section; `lease.token()` fences writes where the
//!     // backend has tokens (MySQL has none) ...
//!     lease.release()
//! }
//! ```
//!
//! # What a [`Lease`] promises, whatever the backend
//! - **Release exactly once.** [`Lease::release`] may be called from any
//!   number of threads (a lease is `Clone + Send + Sync`); the backend's
//!   release runs once, every caller blocks until it finished and gets its
//!   result. Dropping the last clone of an unreleased lease releases it (the
//!   drop blocks for at most the backend's release timeout). A lease that is
//!   leaked (`mem::forget`, a cycle, a `static`) is never released by this
//!   process; a backend whose locks live in a session (MySQL) frees it when
//!   the process exits and its connections close.
//! - **Loss is reported once, in order, panic-safe.** When the backend
//!   presumes the lock lost (a keep-alive failed, a lease expired, an
//!   operator reset it), the handlers run once each, the locker-wide one
//!   first, then the per-lease one; a panic in one is caught (under
//!   `panic = "unwind"`) and the other still runs. After a loss,
//!   [`release`](Lease::release) returns [`Error::Lost`].
//! - **A handler may call [`release`](Lease::release)** (it is handed the
//!   lease): the backend lets go of its connection *before* it notifies, so
//!   the release does not wait for the thread that runs the handler.
//! - **A loss that races a release is not a loss**: once a release has
//!   begun, a failing keep-alive is the release's business and no handler
//!   runs.
//!
//! # Plugging in a backend
//! A backend implements [`Hold`] for one granted lock and [`Locker`] for
//! acquisition; it builds the guard with [`Lease::new`] and keeps the
//! [`LeaseWatch`] from [`Lease::watch`] in its keep-alive. When the
//! keep-alive finds the lock gone, it must, in this order:
//! 1. call [`LeaseWatch::claim_loss`] (the verdict: `None` means a release
//!    has begun, so this is not a loss);
//! 2. stop using its connection, and wake any release waiting for it;
//! 3. call [`PendingLoss::notify`] on the claimed loss.
//!
//! [`Hold::release`] is called exactly once, never concurrently with
//! itself, possibly from inside a handler (on the keep-alive's own thread)
//! or from the drop of the last clone; it must therefore never wait for
//! the keep-alive thread to *exit*, only for it to let go of the
//! connection, and it must be bounded by the backend's release timeout.
//!
//! # Cancellation
//! Rust has no `context.Context`. A lock wait is cut short by a
//! [`CancelToken`] (an `eventfd`; [`CancelToken::cancel_fd`] is
//! async-signal-safe, so a signal handler can cancel) or by a deadline,
//! both in [`LockOptions`]. They surface as [`Error::Cancelled`] and
//! [`Error::DeadlineExceeded`], never as [`Error::Timeout`], which means
//! only "the backend's own wait ended: someone else holds the lock".
//!
//! This module is std only (the token is the crate's own, shared with the
//! Locking-Center client `ringlock::client`); it builds without any
//! optional feature.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

pub use crate::cancel::CancelToken;
/// How a lock is shared with other holders ([`Lease::access`]).
pub use crate::protocol::session::Access;

/// The underlying error of a failure, shared so that [`Error`] is `Clone`.
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// A lost-lock handler: called once with the lease (so that it can
/// [`release`](Lease::release) it) and the reason.
pub type LostHandler = Arc<dyn Fn(&Lease, &LostLock) + Send + Sync + 'static>;

/// Makes a [`Cause`] from a message.
pub fn cause_msg(msg: impl Into<String>) -> Cause {
    Arc::new(Message(msg.into()))
}

#[derive(Debug)]
struct Message(String);

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Message {}

/// Why a lock was presumed lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The connection (the session that owned the lock) failed: reset,
    /// closed, or killed by the server.
    ConnectionLost,
    /// A keep-alive was answered with an error.
    KeepAliveFailed,
    /// A keep-alive got no answer within its ping timeout: the connection
    /// hangs while looking open.
    KeepAliveTimedOut,
    /// The lease's TTL passed without an extend.
    Expired,
    /// An operator reset the lock.
    Reset,
    /// The server said it is going away (shutting down).
    ServerGone,
    /// The session is alive but the server no longer holds the lock for it.
    NotHeld,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::ConnectionLost => "the connection holding it was lost",
            LostReason::KeepAliveFailed => "the keep-alive failed",
            LostReason::KeepAliveTimedOut => "the keep-alive got no answer within its ping timeout",
            LostReason::Expired => "its lease expired",
            LostReason::Reset => "an operator reset it",
            LostReason::ServerGone => "the server went away",
            LostReason::NotHeld => "the server no longer holds it for this session",
        })
    }
}

/// "Lock lost": which key, why, and the error that revealed it.
#[derive(Debug, Clone)]
pub struct LostLock {
    key: String,
    reason: LostReason,
    cause: Option<Cause>,
}

impl LostLock {
    /// A loss of `key` for `reason`, revealed by `cause` (the failed ping's
    /// error, for example).
    pub fn new(key: impl Into<String>, reason: LostReason, cause: Option<Cause>) -> Self {
        LostLock {
            key: key.into(),
            reason,
            cause,
        }
    }

    /// The lost key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Why it was presumed lost.
    pub fn reason(&self) -> LostReason {
        self.reason
    }

    /// The error that revealed the loss, if any.
    pub fn cause(&self) -> Option<&Cause> {
        self.cause.as_ref()
    }
}

impl fmt::Display for LostLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lock lost: key {:?}: {}", self.key, self.reason)?;
        if let Some(cause) = &self.cause {
            write!(f, ": {cause}")?;
        }
        Ok(())
    }
}

impl std::error::Error for LostLock {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_ref()
            .map(|c| c.as_ref() as &(dyn std::error::Error + 'static))
    }
}

/// Everything locking can fail with, whatever the backend.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// The key breaks the backend's rule (the message says which). Raised
    /// before any traffic.
    InvalidKey(String),
    /// The lock timeout is zero. Raised before any traffic.
    InvalidTimeout,
    /// Another argument or setting breaks a rule the message names (a
    /// server address, a source name, a lease TTL outside the server's
    /// bounds). Raised before any traffic.
    InvalidArgument(String),
    /// The backend's own wait ended without a grant: someone else holds
    /// the lock. Nothing is held on the caller's behalf.
    Timeout,
    /// The caller's [`CancelToken`] was cancelled. Nothing is held on the
    /// caller's behalf (a grant that raced it was released).
    Cancelled,
    /// The caller's deadline ([`LockOptions::deadline`]) passed. Nothing is
    /// held on the caller's behalf (a grant that raced it was released).
    DeadlineExceeded,
    /// No connection or session could be had: the request never reached the
    /// lock server.
    Unavailable(Cause),
    /// Acquiring failed for another reason (a query error, an unexpected
    /// answer). Nothing is held on the caller's behalf.
    Failed {
        /// The key that was being acquired.
        key: String,
        /// What went wrong.
        cause: Cause,
    },
    /// The lock was lost (see [`LostLock`]).
    Lost(LostLock),
    /// Releasing failed: no confirmation arrived within the release timeout,
    /// or the release query failed. The backend ended the session where it
    /// could (see its documentation for whether the lock may outlive it).
    Unreleased {
        /// The key that was being released.
        key: String,
        /// What went wrong.
        cause: Cause,
    },
    /// The lease was already released (an [`extend`](Lease::extend) after
    /// [`release`](Lease::release)).
    Released,
    /// The backend or server does not offer what was asked; the message
    /// says what (shared and semaphore holds from a `ringlockd` whose
    /// welcome lacks the modes flag). Raised before the request is sent:
    /// nothing was asked of the server, nothing is held.
    Unsupported(String),
    /// A semaphore request named another number of slots than the key's:
    /// a key's slot count is fixed by its first semaphore holder or waiter
    /// for as long as any semaphore request holds or waits on it. The
    /// server changed nothing; nothing is held.
    ModeMismatch {
        /// The key that was being acquired.
        key: String,
        /// The slot count this request named.
        slots: u32,
    },
}

impl Error {
    /// True for the caller's own cancellation ([`Error::Cancelled`],
    /// [`Error::DeadlineExceeded`]).
    pub fn is_cancellation(&self) -> bool {
        matches!(self, Error::Cancelled | Error::DeadlineExceeded)
    }

    /// True for errors raised before any traffic (bad arguments).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Error::InvalidKey(_) | Error::InvalidTimeout | Error::InvalidArgument(_)
        )
    }

    /// The loss, for [`Error::Lost`].
    pub fn lost(&self) -> Option<&LostLock> {
        match self {
            Error::Lost(lost) => Some(lost),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidKey(rule) => write!(f, "invalid lock key: {rule}"),
            Error::InvalidTimeout => f.write_str("non-positive timeout"),
            Error::InvalidArgument(rule) => write!(f, "invalid argument: {rule}"),
            Error::Timeout => f.write_str("timeout: the lock is held by someone else"),
            Error::Cancelled => f.write_str("lock wait cancelled"),
            Error::DeadlineExceeded => f.write_str("deadline exceeded while waiting for the lock"),
            Error::Unavailable(cause) => write!(f, "lock server unavailable: {cause}"),
            Error::Failed { key, cause } => write!(f, "failed to acquire lock {key:?}: {cause}"),
            Error::Lost(lost) => lost.fmt(f),
            Error::Unreleased { key, cause } => {
                write!(f, "unable to release lock {key:?}: {cause}")
            }
            Error::Released => f.write_str("the lease was already released"),
            Error::Unsupported(what) => write!(f, "not supported: {what}"),
            Error::ModeMismatch { key, slots } => write!(
                f,
                "failed to acquire lock {key:?}: mode mismatch: this request asked for one of \
                 {slots} slots, but {key:?} is a semaphore of another size (fixed by its first \
                 semaphore holder or waiter while any holds or waits); nothing is held"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Unavailable(cause)
            | Error::Failed { cause, .. }
            | Error::Unreleased { cause, .. } => Some(cause.as_ref()),
            Error::Lost(lost) => Some(lost),
            _ => None,
        }
    }
}

/// Shorthand for `Result<T, ringlock::lease::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Per-acquisition options: a lost-lock handler and the caller's
/// cancellation (the Go original's `context.Context` and
/// `WithLostLockHandler`).
#[derive(Clone, Default)]
pub struct LockOptions {
    on_lost: Option<LostHandler>,
    cancel: Option<CancelToken>,
    deadline: Option<Instant>,
}

impl LockOptions {
    /// No handler, no cancellation.
    pub fn new() -> Self {
        Self::default()
    }

    /// Calls `handler` once if this lease is lost (after the locker-wide
    /// handler). It may call [`Lease::release`].
    pub fn on_lost(mut self, handler: impl Fn(&Lease, &LostLock) + Send + Sync + 'static) -> Self {
        self.on_lost = Some(Arc::new(handler));
        self
    }

    /// Stops waiting when `token` is cancelled: [`Error::Cancelled`].
    pub fn cancel(mut self, token: CancelToken) -> Self {
        self.cancel = Some(token);
        self
    }

    /// Stops waiting at `deadline`: [`Error::DeadlineExceeded`]. Unlike the
    /// lock timeout, this is the caller's own limit (a request deadline),
    /// and the lease outlives it once granted.
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// The per-lease lost-lock handler.
    pub fn lost_handler(&self) -> Option<&LostHandler> {
        self.on_lost.as_ref()
    }

    /// The cancel token.
    pub fn cancel_token(&self) -> Option<&CancelToken> {
        self.cancel.as_ref()
    }

    /// The deadline.
    pub fn deadline_at(&self) -> Option<Instant> {
        self.deadline
    }

    /// For backends: `Err` if the wait is already cancelled or past its
    /// deadline (checked before any traffic).
    pub fn check(&self) -> Result<()> {
        if self.cancel.as_ref().is_some_and(|t| t.is_cancelled()) {
            return Err(Error::Cancelled);
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Error::DeadlineExceeded);
        }
        Ok(())
    }
}

impl fmt::Debug for LockOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockOptions")
            .field("on_lost", &self.on_lost.is_some())
            .field("cancel", &self.cancel)
            .field("deadline", &self.deadline)
            .finish()
    }
}

/// Acquires locks. Implemented by every backend; object safe, so a program
/// can hold a `Box<dyn Locker>` chosen from its configuration.
pub trait Locker: Send + Sync {
    /// Waits up to `timeout` (the backend's own wait; zero is refused with
    /// [`Error::InvalidTimeout`]) for `key`, also stopping at the options'
    /// cancellation or deadline.
    fn lock_with(&self, key: &str, timeout: Duration, opts: &LockOptions) -> Result<Lease>;

    /// Takes `key` only if it is free right now: `Ok(None)` means someone
    /// else holds it.
    fn try_lock_with(&self, key: &str, opts: &LockOptions) -> Result<Option<Lease>>;

    /// [`lock_with`](Self::lock_with) without handler or cancellation.
    fn lock(&self, key: &str, timeout: Duration) -> Result<Lease> {
        self.lock_with(key, timeout, &LockOptions::default())
    }

    /// [`try_lock_with`](Self::try_lock_with) without handler or
    /// cancellation.
    fn try_lock(&self, key: &str) -> Result<Option<Lease>> {
        self.try_lock_with(key, &LockOptions::default())
    }
}

/// What a backend implements for one granted lock (see the module docs).
pub trait Hold: Send + Sync + 'static {
    /// Ends the hold, bounded by the backend's release timeout. Called
    /// exactly once, never concurrently with itself; possibly from a
    /// lost-lock handler on the keep-alive's thread.
    fn release(&self) -> Result<()>;

    /// Proves the hold is alive now and renews its TTL if it has one;
    /// returns the new expiry (`None`: no TTL). If this finds the lock
    /// gone, the backend reports the loss (verdict, let go, notify) and
    /// returns [`Error::Lost`].
    fn extend(&self) -> Result<Option<Instant>>;

    /// The server's id for the session that holds the lock (MySQL's
    /// `CONNECTION_ID()`), if the backend has one.
    fn session_id(&self) -> Option<u64> {
        None
    }

    /// The descriptor of the connection whose end frees the lock (a
    /// session's socket, MySQL's pinned connection), while the hold has
    /// one. For a program that runs a child under the lock: a child that
    /// inherits it keeps the connection open (the server ends a session
    /// when the *last* copy of its socket is closed), so a parent that dies
    /// cannot free the lock before the child is gone too. `None` where the
    /// backend has no such connection, or after a loss or release.
    fn connection_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// How the lock is shared with other holders: exclusive unless the
    /// backend granted a shared or semaphore hold.
    fn access(&self) -> Access {
        Access::Exclusive
    }
}

/// A granted lock. Clones share it; see the module docs for the promises.
#[derive(Clone)]
pub struct Lease {
    core: Arc<Core>,
}

struct Core {
    key: String,
    token: Option<u64>,
    hold: Arc<dyn Hold>,
    /// Locker-wide first, then per-lease.
    handlers: Vec<LostHandler>,
    state: Mutex<State>,
    released: Condvar,
}

struct State {
    expires_at: Option<Instant>,
    /// The verdict, set at most once, and only before a release began.
    lost: Option<LostLock>,
    release: Release,
}

enum Release {
    NotStarted,
    Running,
    Done(Result<()>),
}

impl Lease {
    /// For backends: wraps a granted lock. `handlers` run in the given
    /// order on a loss (pass the locker-wide one first).
    pub fn new(
        key: impl Into<String>,
        token: Option<u64>,
        expires_at: Option<Instant>,
        hold: Arc<dyn Hold>,
        handlers: impl IntoIterator<Item = LostHandler>,
    ) -> Lease {
        Lease {
            core: Arc::new(Core {
                key: key.into(),
                token,
                hold,
                handlers: handlers.into_iter().collect(),
                state: Mutex::new(State {
                    expires_at,
                    lost: None,
                    release: Release::NotStarted,
                }),
                released: Condvar::new(),
            }),
        }
    }

    /// For backends: a handle for the keep-alive that does not keep the
    /// lease alive (dropping the last [`Lease`] still releases it).
    pub fn watch(&self) -> LeaseWatch {
        LeaseWatch {
            core: Arc::downgrade(&self.core),
        }
    }

    /// The locked key.
    pub fn key(&self) -> &str {
        &self.core.key
    }

    /// The fencing token of this grant, where the backend has one. Always
    /// `None` on MySQL: `GET_LOCK` numbers nothing, so a stale holder cannot
    /// be told from a current one by the protected resource.
    pub fn token(&self) -> Option<u64> {
        self.core.token
    }

    /// When the lease expires unless extended; `None` if it has no TTL (a
    /// MySQL lock lives as long as its session).
    pub fn expires_at(&self) -> Option<Instant> {
        self.core.lock_state().expires_at
    }

    /// The server's id for the session that holds the lock, where the
    /// backend has one (MySQL: the `CONNECTION_ID()` an operator sees in
    /// `SHOW PROCESSLIST` and `IS_USED_LOCK`).
    pub fn session_id(&self) -> Option<u64> {
        self.core.hold.session_id()
    }

    /// The descriptor of the connection whose end frees this lock, where
    /// the backend has one ([`Hold::connection_fd`]). It stays owned by
    /// the backend: only read it (or let a child process inherit it).
    pub fn connection_fd(&self) -> Option<std::os::fd::RawFd> {
        self.core.hold.connection_fd()
    }

    /// How the lock is shared: [`Access::Exclusive`] (the only access of
    /// the MySQL backend), [`Access::Shared`] (a reader among any number)
    /// or [`Access::Semaphore`]`(n)` (one of at most `n` holders).
    pub fn access(&self) -> Access {
        self.core.hold.access()
    }

    /// The loss, once the backend presumed the lock lost.
    pub fn lost(&self) -> Option<LostLock> {
        self.core.lock_state().lost.clone()
    }

    /// True once a release has begun (by a call or a drop).
    pub fn is_released(&self) -> bool {
        !matches!(self.core.lock_state().release, Release::NotStarted)
    }

    /// Proves the lock is still held now and renews its TTL if it has one;
    /// returns the new expiry. [`Error::Lost`] after a loss,
    /// [`Error::Released`] after a release.
    pub fn extend(&self) -> Result<Option<Instant>> {
        {
            let st = self.core.lock_state();
            if let Some(lost) = &st.lost {
                return Err(Error::Lost(lost.clone()));
            }
            if !matches!(st.release, Release::NotStarted) {
                return Err(Error::Released);
            }
        }
        let expires_at = self.core.hold.extend()?;
        self.core.lock_state().expires_at = expires_at;
        Ok(expires_at)
    }

    /// Releases the lock: the first call runs the backend's release, every
    /// call (concurrent or later) returns its result. After a loss the
    /// result is [`Error::Lost`].
    pub fn release(&self) -> Result<()> {
        self.core.release()
    }
}

impl Core {
    fn lock_state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave State inconsistent
        // (every update is a single assignment), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn release(&self) -> Result<()> {
        let mut st = self.lock_state();
        loop {
            match &st.release {
                Release::Done(result) => return result.clone(),
                Release::Running => {
                    st = self.released.wait(st).unwrap_or_else(|p| p.into_inner());
                }
                Release::NotStarted => break,
            }
        }
        st.release = Release::Running;
        drop(st);
        let backend = catch_unwind(AssertUnwindSafe(|| self.hold.release())).unwrap_or_else(|_| {
            Err(Error::Unreleased {
                key: self.key.clone(),
                cause: cause_msg("the backend's release panicked"),
            })
        });
        let mut st = self.lock_state();
        // No verdict can be reached once Running, so `lost` is final here.
        let result = match &st.lost {
            Some(lost) => Err(Error::Lost(lost.clone())),
            None => backend,
        };
        st.release = Release::Done(result.clone());
        drop(st);
        self.released.notify_all();
        result
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // The last clone is gone: release if nobody did (errors have no one
        // to go to; `release()` exposes them).
        let _ = self.release();
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.core.lock_state();
        f.debug_struct("Lease")
            .field("key", &self.core.key)
            .field("token", &self.core.token)
            .field("session_id", &self.core.hold.session_id())
            .field("access", &self.core.hold.access())
            .field("expires_at", &st.expires_at)
            .field("lost", &st.lost.as_ref().map(|l| l.reason))
            .field("released", &!matches!(st.release, Release::NotStarted))
            .finish()
    }
}

/// For backends: the keep-alive's weak handle on its lease.
#[derive(Clone)]
pub struct LeaseWatch {
    core: Weak<Core>,
}

impl LeaseWatch {
    /// Step 1 of a loss, the verdict: records `lost` unless a release has
    /// begun (or the lease is gone, which means the same), and returns the
    /// pending notification. `None`: not a loss, notify nobody.
    pub fn claim_loss(&self, lost: LostLock) -> Option<PendingLoss> {
        let core = self.core.upgrade()?;
        {
            let mut st = core.lock_state();
            if st.lost.is_some() || !matches!(st.release, Release::NotStarted) {
                return None;
            }
            st.lost = Some(lost.clone());
        }
        Some(PendingLoss {
            lease: Lease { core },
            lost,
        })
    }
}

impl fmt::Debug for LeaseWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LeaseWatch")
    }
}

/// A loss whose verdict is recorded; [`notify`](Self::notify) it once the
/// backend has let go of its connection.
#[must_use = "a claimed loss must be notified"]
pub struct PendingLoss {
    lease: Lease,
    lost: LostLock,
}

impl PendingLoss {
    /// Step 3 of a loss: runs each handler once, in order, each inside
    /// `catch_unwind` so that a panicking handler neither stops the next one
    /// nor the backend's thread.
    pub fn notify(self) {
        for handler in &self.lease.core.handlers {
            let _ = catch_unwind(AssertUnwindSafe(|| handler(&self.lease, &self.lost)));
        }
    }

    /// The recorded loss.
    pub fn lost(&self) -> &LostLock {
        &self.lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;

    /// A backend that counts calls, for the lease's own bookkeeping (the
    /// real backends are tested against real servers).
    #[derive(Default)]
    struct Counting {
        releases: AtomicUsize,
        extends: AtomicUsize,
    }

    impl Hold for Counting {
        fn release(&self) -> Result<()> {
            self.releases.fetch_add(1, Ordering::SeqCst);
            // Give concurrent callers time to pile up behind the first one.
            std::thread::yield_now();
            Ok(())
        }

        fn extend(&self) -> Result<Option<Instant>> {
            self.extends.fetch_add(1, Ordering::SeqCst);
            Ok(None)
        }
    }

    fn lease_with(hold: Arc<Counting>, handlers: Vec<LostHandler>) -> Lease {
        Lease::new("k", None, None, hold, handlers)
    }

    #[test]
    fn eight_concurrent_releases_run_the_backend_once_and_share_its_result() {
        let hold = Arc::new(Counting::default());
        let lease = lease_with(hold.clone(), vec![]);
        let barrier = Arc::new(Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (lease, barrier) = (lease.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    lease.release()
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap().unwrap();
        }
        drop(lease);
        assert_eq!(hold.releases.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn dropping_the_last_clone_releases_once() {
        let hold = Arc::new(Counting::default());
        let lease = lease_with(hold.clone(), vec![]);
        let other = lease.clone();
        drop(lease);
        assert_eq!(
            hold.releases.load(Ordering::SeqCst),
            0,
            "a clone still holds it"
        );
        drop(other);
        assert_eq!(hold.releases.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_loss_notifies_in_order_survives_a_panic_and_release_then_says_lost() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let o1 = order.clone();
        let o2 = order.clone();
        let first: LostHandler = Arc::new(move |_, _| {
            o1.lock().unwrap().push("locker");
            panic!("a faulty locker-wide handler");
        });
        let second: LostHandler = Arc::new(move |lease: &Lease, lost: &LostLock| {
            o2.lock().unwrap().push("lease");
            // Release from inside the handler returns (no deadlock) and
            // reports the loss.
            assert!(matches!(lease.release(), Err(Error::Lost(_))));
            assert_eq!(lost.key(), "k");
        });
        let hold = Arc::new(Counting::default());
        let lease = lease_with(hold.clone(), vec![first, second]);
        let pending = lease
            .watch()
            .claim_loss(LostLock::new("k", LostReason::KeepAliveTimedOut, None))
            .expect("no release began: this is a loss");
        assert!(
            lease
                .watch()
                .claim_loss(LostLock::new("k", LostReason::ConnectionLost, None))
                .is_none(),
            "the first failure is final"
        );
        pending.notify();
        assert_eq!(*order.lock().unwrap(), ["locker", "lease"]);
        assert_eq!(hold.releases.load(Ordering::SeqCst), 1);
        let err = lease.release().unwrap_err();
        assert_eq!(err.lost().unwrap().reason(), LostReason::KeepAliveTimedOut);
        assert!(err.to_string().contains("\"k\""), "{err}");
        assert!(matches!(lease.extend(), Err(Error::Lost(_))));
    }

    #[test]
    fn a_failure_after_release_began_is_not_a_loss() {
        let hold = Arc::new(Counting::default());
        let lease = lease_with(hold.clone(), vec![]);
        let watch = lease.watch();
        lease.release().unwrap();
        assert!(watch
            .claim_loss(LostLock::new("k", LostReason::ConnectionLost, None))
            .is_none());
        assert!(lease.lost().is_none());
        assert!(matches!(lease.extend(), Err(Error::Released)));
        assert_eq!(hold.extends.load(Ordering::SeqCst), 0);
        drop(lease);
        assert!(
            watch
                .claim_loss(LostLock::new("k", LostReason::ConnectionLost, None))
                .is_none(),
            "a dropped lease is not lost either"
        );
    }

    #[test]
    fn options_check_reports_the_callers_own_cancellation() {
        assert!(LockOptions::new().check().is_ok());
        let token = CancelToken::new().unwrap();
        let opts = LockOptions::new().cancel(token.clone());
        assert!(opts.check().is_ok());
        token.cancel();
        assert!(matches!(opts.check(), Err(Error::Cancelled)));
        let past = LockOptions::new().deadline(Instant::now());
        assert!(matches!(past.check(), Err(Error::DeadlineExceeded)));
        assert!(Error::DeadlineExceeded.is_cancellation());
        assert!(!Error::Timeout.is_cancellation());
    }

    #[test]
    fn lost_lock_display_names_the_key_the_reason_and_the_cause() {
        let lost = LostLock::new(
            "jobs/nightly",
            LostReason::KeepAliveTimedOut,
            Some(cause_msg("no answer within 10s")),
        );
        assert_eq!(
            lost.to_string(),
            "lock lost: key \"jobs/nightly\": the keep-alive got no answer within its ping timeout: no answer within 10s"
        );
        assert_eq!(
            Error::InvalidKey("must be 1..64 characters".into()).to_string(),
            "invalid lock key: must be 1..64 characters"
        );
        assert_eq!(Error::InvalidTimeout.to_string(), "non-positive timeout");
    }
}
