//! [`Locker`]: options, acquisition, and the watcher that turns the
//! caller's cancellation into a `KILL QUERY`.
//!
//! Who owns what during an acquire: the calling thread owns the checked-out
//! connection and runs `GET_LOCK` on it. A watcher thread exists only when
//! the caller gave a cancel token or a deadline; it may send `KILL QUERY`
//! for the connection's session (from another pooled connection) and may cut
//! the connection's descriptor, but only while the `Watch` mutex says the
//! query is in flight or the watcher's work is not yet settled; the calling
//! thread does not touch the connection again until it has settled (see
//! `Watch::finish`). So a `KILL QUERY` never lands on a later statement, and
//! a cut never lands on a reused descriptor.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ::mysql::prelude::Queryable;
use ::mysql::{OptsBuilder, Pool, PoolConstraints, PoolOpts, PooledConn};

use super::addr::{AddrError, MysqlAddr};
use super::held::{self, Held};
use super::keeper::Keeper;
use super::shared::{Options, Shared};
use super::sock::{self, Saved};
use super::sql::{self, Grant, LOCK_TIMEOUT_MAX};
use super::watcher::Watcher;
use crate::lease::{self, cause_msg, CancelToken, Error, Lease, LockOptions, LostHandler, Result};

/// TCP connect timeout of the pools [`Locker::from_url`] builds (the
/// system's own is minutes).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections a pool built by [`Locker::from_url`] opens: one per
/// held lock, plus one for a `KILL QUERY`.
pub const URL_POOL_MAX: usize = 100;

/// Acquires MySQL/MariaDB named locks through a connection pool. Cheap to
/// clone (clones share the pool, the options and the keep-alive timer).
/// Building one never fails and opens no connection.
#[derive(Clone)]
pub struct Locker {
    shared: Arc<Shared<Held>>,
}

impl std::fmt::Debug for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locker")
            .field("pool", &self.shared.pool)
            .field("opts", &self.shared.opts)
            .finish()
    }
}

impl Locker {
    /// A locker on `pool` with the default [`Options`].
    pub fn new(pool: Pool) -> Locker {
        Locker::with_options(pool, Options::default())
    }

    /// A locker on `pool` with `opts`.
    pub fn with_options(pool: Pool, opts: Options) -> Locker {
        let keeper = Keeper::new(opts.interval());
        Locker {
            shared: Arc::new(Shared {
                pool,
                opts,
                keeper,
                watcher: Watcher::new(),
            }),
        }
    }

    /// A locker for `mysql://USER[:PASSWORD]@HOST[:PORT][/DB]`, the
    /// password possibly from `$RINGLOCK_MYSQL_PASSWORD_FILE` or
    /// `$RINGLOCK_MYSQL_PASSWORD` (see [`MysqlAddr::with_password_from_env`]),
    /// with the default [`Options`] and the pool of [`pool_opts`](Self::pool_opts).
    /// Connects to nothing yet: a wrong password or an unreachable server
    /// shows up as [`Error::Unavailable`] at the first lock.
    pub fn from_url(url: &str) -> std::result::Result<Locker, AddrError> {
        let addr = MysqlAddr::parse(url)?.with_password_from_env(|k| std::env::var_os(k))?;
        Locker::from_addr(&addr, Options::default())
    }

    /// A locker for a parsed address (password already resolved).
    pub fn from_addr(addr: &MysqlAddr, opts: Options) -> std::result::Result<Locker, AddrError> {
        let pool =
            Pool::new(Locker::pool_opts(addr)).map_err(|e| AddrError::Pool(e.to_string()))?;
        Ok(Locker::with_options(pool, opts))
    }

    /// The driver options [`from_addr`](Self::from_addr) uses: TCP to the
    /// named host even when it is local (the driver would otherwise switch to
    /// the server's Unix socket behind the caller's back), a pool of
    /// 0..=[`URL_POOL_MAX`] connections opened on demand, [`CONNECT_TIMEOUT`]
    /// for connecting and as the connections' default read/write timeout
    /// (the driver opens a connection while holding the pool's lock, so an
    /// unbounded handshake with a server that accepts but never greets would
    /// stall every checkout; this library sets its own bound around each of
    /// its statements and restores this one), and the driver's defaults
    /// otherwise (a health check on checkout; a session reset when other
    /// users return a connection, which also frees any named lock it still
    /// held).
    pub fn pool_opts(addr: &MysqlAddr) -> OptsBuilder {
        let constraints = PoolConstraints::new(0, URL_POOL_MAX).unwrap_or(PoolConstraints::DEFAULT);
        OptsBuilder::new()
            .ip_or_hostname(Some(addr.host.clone()))
            .tcp_port(addr.port)
            .user(Some(addr.user.clone()))
            .pass(addr.password.clone())
            .db_name(addr.db.clone())
            .prefer_socket(false)
            .tcp_connect_timeout(Some(CONNECT_TIMEOUT))
            .read_timeout(Some(CONNECT_TIMEOUT))
            .write_timeout(Some(CONNECT_TIMEOUT))
            .pool_opts(PoolOpts::default().with_constraints(constraints))
    }

    /// The pool this locker checks connections out of.
    pub fn pool(&self) -> &Pool {
        &self.shared.pool
    }

    /// The options in effect.
    pub fn options(&self) -> &Options {
        &self.shared.opts
    }

    /// Waits up to `timeout` for `key`.
    pub fn lock(&self, key: &str, timeout: Duration) -> Result<Lease> {
        self.lock_with(key, timeout, &LockOptions::default())
    }

    /// Waits up to `timeout` for `key` (`GET_LOCK`'s own wait), stopping
    /// early at the options' cancel token or deadline.
    pub fn lock_with(&self, key: &str, timeout: Duration, opts: &LockOptions) -> Result<Lease> {
        match self.acquire(key, Some(timeout), opts)? {
            Some(lease) => Ok(lease),
            None => Err(Error::Timeout),
        }
    }

    /// Takes `key` only if it is free now (`GET_LOCK(key, 0)`): `Ok(None)`
    /// if another session holds it.
    pub fn try_lock(&self, key: &str) -> Result<Option<Lease>> {
        self.try_lock_with(key, &LockOptions::default())
    }

    /// [`try_lock`](Self::try_lock) with a per-lease handler (a cancel
    /// token or deadline is checked before any traffic only: the attempt
    /// itself does not wait).
    pub fn try_lock_with(&self, key: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        self.acquire(key, None, opts)
    }

    /// `wait`: `Some(timeout)` for lock, `None` for try-lock.
    fn acquire(
        &self,
        key: &str,
        wait: Option<Duration>,
        lo: &LockOptions,
    ) -> Result<Option<Lease>> {
        sql::validate_key(key)?;
        if wait.is_some_and(|t| t.is_zero()) {
            return Err(Error::InvalidTimeout);
        }
        lo.check()?;
        let opts = &self.shared.opts;
        let lock_wait = wait.unwrap_or(Duration::ZERO).min(LOCK_TIMEOUT_MAX);
        let (mut conn, fd, saved) = self.checkout(key, wait, lo)?;
        // The answer must come by the end of GET_LOCK's own wait plus one
        // ping timeout of slack: a connection that hangs is a failure, not
        // an endless wait.
        let answer_bound = lock_wait + opts.ping_timeout();
        if let Err(e) = sock::bound_reads(fd, answer_bound) {
            held::discard(conn);
            return Err(Error::Failed {
                key: key.to_string(),
                cause: Arc::new(e),
            });
        }
        let watched = wait.is_some() && (lo.cancel_token().is_some() || lo.deadline_at().is_some());
        let watch = if watched {
            match Watch::start(&self.shared, conn.connection_id(), fd, lo) {
                Ok(w) => Some(w),
                Err(e) => {
                    held::give_back(conn, &saved);
                    return Err(Error::Failed {
                        key: key.to_string(),
                        cause: Arc::new(e),
                    });
                }
            }
        } else {
            None
        };

        let stmt = sql::get_lock(key, lock_wait, conn.no_backslash_escape());
        let answer = conn.query_first::<i64, _>(&stmt);

        if let Some(watch) = watch {
            if let Some((stop, cleanup_deadline)) = watch.finish(lo) {
                cleanup(&mut conn, key, cleanup_deadline);
                held::discard(conn);
                return Err(stop);
            }
        }
        let grant = answer.map(sql::grant);
        self.granted(key, conn, saved, grant, answer_bound, lo)
    }

    /// A pooled connection for an acquire of `key`, its socket (`fd`) and
    /// the settings saved from it. Checking out is part of the caller's
    /// wait: bounded by the lock timeout (the ping timeout for a try) and
    /// the caller's deadline. Cancelled meanwhile: the connection goes
    /// back to the pool, and nothing was sent.
    fn checkout(
        &self,
        key: &str,
        wait: Option<Duration>,
        lo: &LockOptions,
    ) -> Result<(PooledConn, RawFd, Saved)> {
        let opts = &self.shared.opts;
        let mut checkout = wait.unwrap_or(opts.ping_timeout()).min(LOCK_TIMEOUT_MAX);
        if let Some(d) = lo.deadline_at() {
            checkout = checkout.min(d.saturating_duration_since(Instant::now()));
        }
        let conn = self
            .shared
            .pool
            .try_get_conn(checkout.max(Duration::from_millis(1)))
            .map_err(|e| Error::Unavailable(checkout_cause(e, checkout)))?;
        let fd = conn.as_raw_fd();
        let saved = match Saved::take(fd) {
            Ok(saved) => saved,
            Err(e) => {
                held::discard(conn);
                return Err(Error::Failed {
                    key: key.to_string(),
                    cause: Arc::new(e),
                });
            }
        };
        if let Err(e) = lo.check() {
            // Cancelled while waiting for a connection: nothing was sent.
            held::give_back(conn, &saved);
            return Err(e);
        }
        Ok((conn, fd, saved))
    }

    /// What GET_LOCK's `grant` (its answer on `conn`, bounded by
    /// `answer_bound`) makes of the acquire: a lease, `None` when it timed
    /// out (the connection goes back to the pool), or the failure (the
    /// connection is discarded).
    fn granted(
        &self,
        key: &str,
        conn: PooledConn,
        saved: Saved,
        grant: std::result::Result<Grant, ::mysql::Error>,
        answer_bound: Duration,
        lo: &LockOptions,
    ) -> Result<Option<Lease>> {
        match grant {
            Ok(Grant::Acquired) => self.lease(key, conn, saved, lo).map(Some),
            Ok(Grant::TimedOut) => {
                held::give_back(conn, &saved);
                Ok(None)
            }
            Ok(Grant::Failed(v)) => {
                held::discard(conn);
                let what = match v {
                    Some(-1) => {
                        "GET_LOCK returned NULL (an error, such as a killed query)".to_string()
                    }
                    Some(n) => format!("GET_LOCK returned {n}"),
                    None => "GET_LOCK returned no row".to_string(),
                };
                Err(Error::Failed {
                    key: key.to_string(),
                    cause: cause_msg(what),
                })
            }
            Err(e) => {
                held::discard(conn);
                Err(Error::Failed {
                    key: key.to_string(),
                    cause: held::describe(e, answer_bound),
                })
            }
        }
    }

    fn lease(&self, key: &str, conn: PooledConn, saved: Saved, lo: &LockOptions) -> Result<Lease> {
        let held = Held::new(key, conn, saved, Arc::clone(&self.shared));
        let handlers: Vec<LostHandler> = self
            .shared
            .opts
            .on_lost
            .iter()
            .chain(lo.lost_handler())
            .cloned()
            .collect();
        let lease = Lease::new(key, None, None, held.clone(), handlers);
        held.attach(lease.watch());
        match self.shared.keeper.schedule(Arc::downgrade(&held)) {
            Ok(slot) => held.scheduled(slot),
            Err(e) => {
                // No keep-alive could be started: do not hand out a lock
                // whose loss would go unnoticed.
                let _ = lease.release();
                return Err(Error::Failed {
                    key: key.to_string(),
                    cause: cause_msg(format!("cannot start the keep-alive timer: {e}")),
                });
            }
        }
        // The watch notices a session the server ended within milliseconds;
        // without it a KILL would go unnoticed until the next ping.
        match self.shared.watcher.watch(Arc::downgrade(&held)) {
            Ok(id) => held.watched(id),
            Err(e) => {
                let _ = lease.release();
                return Err(Error::Failed {
                    key: key.to_string(),
                    cause: cause_msg(format!("cannot start the connection watch: {e}")),
                });
            }
        }
        Ok(lease)
    }
}

impl lease::Locker for Locker {
    fn lock_with(&self, key: &str, timeout: Duration, opts: &LockOptions) -> Result<Lease> {
        Locker::lock_with(self, key, timeout, opts)
    }

    fn try_lock_with(&self, key: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        Locker::try_lock_with(self, key, opts)
    }
}

fn checkout_cause(e: ::mysql::Error, bound: Duration) -> lease::Cause {
    match e {
        ::mysql::Error::DriverError(::mysql::DriverError::Timeout) => {
            cause_msg(format!("no pooled connection became free within {bound:?}"))
        }
        e => Arc::new(e),
    }
}

/// The best-effort `RELEASE_LOCK` after a cancelled acquire: the server may
/// have granted the lock just before the cancellation reached it. The
/// outcome is ignored; the connection is closed afterwards anyway, which
/// frees a grant this could not.
fn cleanup(conn: &mut PooledConn, key: &str, deadline: Instant) {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() || sock::bound_reads(conn.as_raw_fd(), left).is_err() {
        return;
    }
    let _ = conn.query_drop(sql::release_lock(key, conn.no_backslash_escape()));
}

/// The cancellation watcher of one acquire (module docs).
struct Watch {
    shared: Arc<WatchShared>,
}

struct WatchShared {
    state: Mutex<WatchState>,
    changed: Condvar,
    /// Wakes the watcher thread when the query returned on its own.
    done: CancelToken,
    cleanup_timeout: Duration,
}

struct WatchState {
    /// GET_LOCK has not returned yet.
    in_flight: bool,
    /// The caller's cancellation, and the deadline of the whole clean-up.
    fired: Option<(Error, Instant)>,
    /// The watcher has finished with the connection.
    settled: bool,
}

impl WatchShared {
    fn lock(&self) -> MutexGuard<'_, WatchState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Watch {
    fn start(
        shared: &Arc<Shared<Held>>,
        conn_id: u32,
        fd: RawFd,
        lo: &LockOptions,
    ) -> std::io::Result<Watch> {
        let ws = Arc::new(WatchShared {
            state: Mutex::new(WatchState {
                in_flight: true,
                fired: None,
                settled: false,
            }),
            changed: Condvar::new(),
            done: CancelToken::new()?,
            cleanup_timeout: shared.opts.cleanup_timeout(),
        });
        let me = Arc::clone(&ws);
        let pool = shared.pool.clone();
        let token = lo.cancel_token().cloned();
        let deadline = lo.deadline_at();
        sock::spawn_quiet("ringlock-mysql-cancel", move || {
            me.watch(&pool, conn_id, fd, token, deadline)
        })?;
        Ok(Watch { shared: ws })
    }

    /// Called by the acquiring thread once GET_LOCK returned. `Some` if the
    /// caller's cancellation decides the outcome: then the watcher is done
    /// with the connection and the caller must clean up.
    fn finish(self, lo: &LockOptions) -> Option<(Error, Instant)> {
        let ws = &self.shared;
        let mut st = ws.lock();
        st.in_flight = false;
        ws.changed.notify_all();
        if st.fired.is_some() {
            while !st.settled {
                st = ws.changed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            return st.fired.clone();
        }
        // The watcher has not acted (yet): the caller's cancellation still
        // wins if it is in effect now, so a caller who cancelled never gets
        // a lease.
        if let Err(stop) = lo.check() {
            st.fired = Some((stop, Instant::now() + ws.cleanup_timeout));
            st.settled = true;
        }
        let fired = st.fired.clone();
        drop(st);
        ws.done.cancel();
        fired
    }
}

impl WatchShared {
    fn watch(
        &self,
        pool: &Pool,
        conn_id: u32,
        fd: RawFd,
        token: Option<CancelToken>,
        deadline: Option<Instant>,
    ) {
        let first = token.as_ref().map_or(-1, |t| t.as_raw_fd());
        let stop = match sock::wait(first, self.done.as_raw_fd(), deadline) {
            Ok(sock::Wake::First) => Error::Cancelled,
            Ok(sock::Wake::Deadline) => Error::DeadlineExceeded,
            // Done, or poll failed (then the query's own bound still holds).
            Ok(sock::Wake::Second) | Err(_) => return,
        };
        let cleanup_deadline = Instant::now() + self.cleanup_timeout;
        {
            let mut st = self.lock();
            if !st.in_flight {
                return; // the acquiring thread decides (finish)
            }
            st.fired = Some((stop, cleanup_deadline));
        }
        let killed = kill_query(pool, conn_id, cleanup_deadline);
        let mut st = self.lock();
        let mut cut = false;
        if killed.is_err() && st.in_flight {
            // Could not interrupt GET_LOCK on the server: cut the
            // connection so the caller returns now (its session ends too).
            sock::cut(fd);
            cut = true;
        }
        // The killed GET_LOCK answers at once on a healthy connection; one
        // that hangs is cut at the clean-up deadline.
        while st.in_flight {
            let now = Instant::now();
            if !cut && now >= cleanup_deadline {
                sock::cut(fd);
                cut = true;
            }
            st = if cut {
                self.changed.wait(st).unwrap_or_else(|p| p.into_inner())
            } else {
                self.changed
                    .wait_timeout(st, cleanup_deadline - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            };
        }
        st.settled = true;
        self.changed.notify_all();
    }
}

/// `KILL QUERY` for session `conn_id`, over another pooled connection,
/// bounded by `deadline`.
fn kill_query(pool: &Pool, conn_id: u32, deadline: Instant) -> std::result::Result<(), ()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(());
    }
    let mut k = pool.try_get_conn(left).map_err(|_| ())?;
    let fd = k.as_raw_fd();
    let Ok(saved) = Saved::take(fd) else {
        held::discard(k);
        return Err(());
    };
    let left = deadline.saturating_duration_since(Instant::now());
    let sent = sock::bound_reads(fd, left.max(Duration::from_millis(1)))
        .map_err(::mysql::Error::from)
        .and_then(|()| k.query_drop(format!("KILL QUERY {conn_id}")));
    match sent {
        Ok(()) => {
            held::give_back(k, &saved);
            Ok(())
        }
        Err(_) => {
            held::discard(k);
            Err(())
        }
    }
}
