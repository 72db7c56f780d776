//! One held MySQL lock: its pinned connection, its keep-alive, its release.
//!
//! Invariants (all under `Held::slot`):
//! - The connection is either in `slot.conn` (nobody is using it), or out
//!   with exactly one user, whose descriptor is in `slot.busy`: the
//!   keep-alive, an `extend`, or the release. Nobody else touches it, so a
//!   ping and `RELEASE_LOCK` never run on it concurrently.
//! - `slot.stopping` is set once, by the release, and never cleared: no ping
//!   starts after it, and a ping in flight no longer counts (its failure is
//!   not a loss: the lease's verdict refuses once a release began).
//! - `slot.ended` is set when a ping found the lock gone: no ping runs after
//!   it either. On a connection failure the connection is closed before the
//!   keep-alive lets go of it; the handlers run only after it let go.
//! - `sock::cut` on `slot.busy` is done only with `slot` locked: the user of
//!   the connection clears `busy` under that lock before it can close it.
//! - The connection watcher (`watcher`) looks at the connection only while
//!   it is idle in `slot.conn`, with `slot` locked (a non-blocking peek), and
//!   takes it out (marking it busy) before closing it, exactly as a failed
//!   ping does. A ping that hands the connection back rings the watcher so
//!   that it is watched again.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use ::mysql::prelude::Queryable;
use ::mysql::PooledConn;

use super::keeper::{self, Due};
use super::shared::Shared;
use super::sock::{self, Peek, Saved};
use super::sql;
use super::watcher::Watched;
use crate::lease::{
    cause_msg, Cause, Error, Hold, LeaseWatch, LostLock, LostReason, PendingLoss, Result,
};

const ER_SERVER_SHUTDOWN: u16 = 1053;
const ER_CONNECTION_KILLED: u16 = 1927;

pub(crate) struct Held {
    key: String,
    conn_id: u32,
    no_backslash_escapes: bool,
    shared: Arc<Shared<Held>>,
    slot: Mutex<Slot>,
    changed: Condvar,
    watch: OnceLock<LeaseWatch>,
    sched: OnceLock<keeper::Slot>,
    /// The id under which the connection watcher knows this lease.
    watched: OnceLock<u64>,
}

struct Slot {
    conn: Option<PooledConn>,
    busy: Option<std::os::fd::RawFd>,
    stopping: bool,
    /// Set when a ping found the lock gone (the keep-alive's view of the
    /// loss; reported only if it won the verdict).
    ended: Option<LostLock>,
    /// A keep-alive thread exists and may be waiting on `changed`.
    thread: bool,
    saved: Saved,
}

enum Ping {
    Alive,
    /// The release began (or the lock was already found gone and this ping
    /// did not run).
    Stopped,
    Lost(LostLock),
}

#[derive(Clone, Copy)]
enum PingKind {
    KeepAlive,
    Extend,
}

/// Closes `conn` instead of returning it to the pool: cuts the socket (the
/// server ends the session, and with it any lock it holds, as soon as it
/// reads the end of the stream) and makes the pool count it as gone.
pub(crate) fn discard(mut conn: PooledConn) {
    sock::cut(conn.as_raw_fd());
    // With the socket cut, the pool's reset-on-return fails, which is the
    // driver's only path that drops a connection *and* forgets it from the
    // pool's count (`PooledConn::unwrap` would leak a pool slot).
    conn.reset_connection(true);
    drop(conn);
}

/// Returns a healthy `conn` to the pool with its original timeouts. It ran
/// only `GET_LOCK`, `DO 1`, `IS_USED_LOCK` and a `RELEASE_LOCK` whose answer
/// says it holds nothing, so there is no session state to reset: skipping
/// the pool's reset saves a round trip and cannot hang the caller.
pub(crate) fn give_back(mut conn: PooledConn, saved: &Saved) {
    if saved.restore(conn.as_raw_fd()).is_err() {
        discard(conn);
        return;
    }
    conn.reset_connection(false);
    drop(conn);
}

fn io_kind(e: &::mysql::Error) -> Option<std::io::ErrorKind> {
    match e {
        ::mysql::Error::IoError(io) => Some(io.kind()),
        // The driver does not re-export its codec error type, but the type
        // exposes its I/O error as its source (a read timeout arrives so).
        ::mysql::Error::CodecError(c) => std::error::Error::source(c)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .map(|io| io.kind()),
        _ => None,
    }
}

fn timed_out(e: &::mysql::Error) -> bool {
    matches!(
        io_kind(e),
        Some(std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
    )
}

/// A query error as a cause; a read that hit its bound says so.
pub(crate) fn describe(e: ::mysql::Error, bound: Duration) -> Cause {
    if timed_out(&e) {
        cause_msg(format!("no answer within {bound:?}"))
    } else {
        Arc::new(e)
    }
}

fn loss_reason(e: &::mysql::Error) -> LostReason {
    if timed_out(e) {
        return LostReason::KeepAliveTimedOut;
    }
    match e {
        ::mysql::Error::MySqlError(me) if me.code == ER_SERVER_SHUTDOWN => LostReason::ServerGone,
        ::mysql::Error::MySqlError(me) if me.code == ER_CONNECTION_KILLED => LostReason::Reset,
        ::mysql::Error::MySqlError(_) => LostReason::KeepAliveFailed,
        _ if io_kind(e).is_some() || e.is_connectivity_error() => LostReason::ConnectionLost,
        _ => LostReason::KeepAliveFailed,
    }
}

impl Held {
    pub(crate) fn new(
        key: &str,
        conn: PooledConn,
        saved: Saved,
        shared: Arc<Shared<Held>>,
    ) -> Arc<Held> {
        Arc::new(Held {
            key: key.to_string(),
            conn_id: conn.connection_id(),
            no_backslash_escapes: conn.no_backslash_escape(),
            shared,
            slot: Mutex::new(Slot {
                conn: Some(conn),
                busy: None,
                stopping: false,
                ended: None,
                thread: false,
                saved,
            }),
            changed: Condvar::new(),
            watch: OnceLock::new(),
            sched: OnceLock::new(),
            watched: OnceLock::new(),
        })
    }

    /// Links the lease (before the keep-alive can start).
    pub(crate) fn attach(&self, watch: LeaseWatch) {
        let _ = self.watch.set(watch);
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        // Updates are plain assignments and `Option::take`s; a poisoned
        // lock still holds consistent state.
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, g: MutexGuard<'a, Slot>) -> MutexGuard<'a, Slot> {
        self.changed.wait(g).unwrap_or_else(|p| p.into_inner())
    }

    fn wait_for<'a>(&self, g: MutexGuard<'a, Slot>, d: Duration) -> MutexGuard<'a, Slot> {
        self.changed
            .wait_timeout(g, d)
            .unwrap_or_else(|p| p.into_inner())
            .0
    }

    /// The keep-alive thread: pings at `due`, then every interval, until
    /// the release begins or a ping finds the lock gone.
    fn keep_alive(self: Arc<Self>, mut due: Instant) {
        let interval = self.shared.opts.interval();
        loop {
            {
                let mut slot = self.lock();
                loop {
                    if slot.stopping || slot.ended.is_some() {
                        slot.thread = false;
                        return;
                    }
                    let now = Instant::now();
                    if now >= due {
                        break;
                    }
                    slot = self.wait_for(slot, due - now);
                }
            }
            match self.ping(PingKind::KeepAlive) {
                Ping::Alive => {
                    // A ticker: the next ping one interval after this one
                    // was due, or now if this one ran that late.
                    due = (due + interval).max(Instant::now());
                }
                Ping::Stopped | Ping::Lost(_) => {
                    self.lock().thread = false;
                    return;
                }
            }
        }
    }

    /// One ping on the pinned connection, bounded by the ping timeout. On a
    /// failure: verdict, then let go (closing the connection), then notify.
    fn ping(&self, kind: PingKind) -> Ping {
        let timeout = self.shared.opts.ping_timeout();
        let mut slot = self.lock();
        while slot.busy.is_some() && !slot.stopping {
            slot = self.wait(slot);
        }
        if slot.stopping {
            return Ping::Stopped;
        }
        if let Some(lost) = &slot.ended {
            return Ping::Lost(lost.clone());
        }
        let Some(mut conn) = slot.conn.take() else {
            return Ping::Stopped; // unreachable: no user, not ended, yet no connection
        };
        let fd = conn.as_raw_fd();
        slot.busy = Some(fd);
        drop(slot);

        let answer = sock::bound_reads(fd, timeout)
            .map_err(::mysql::Error::from)
            .and_then(|()| match kind {
                PingKind::KeepAlive => conn.query_drop(sql::KEEP_ALIVE).map(|()| true),
                PingKind::Extend => conn
                    .query_first::<i64, _>(sql::held_here(&self.key, self.no_backslash_escapes))
                    .map(|v| v == Some(1)),
            });
        let (lost, healthy) = match answer {
            Ok(true) => {
                let mut slot = self.lock();
                slot.busy = None;
                slot.conn = Some(conn);
                drop(slot);
                self.changed.notify_all();
                // Idle again: back into the watcher's set.
                self.shared.watcher.wake();
                return Ping::Alive;
            }
            // The session answers but no longer holds the lock: it cannot
            // get it back, and the connection is still usable.
            Ok(false) => (
                LostLock::new(
                    self.key.clone(),
                    LostReason::NotHeld,
                    Some(cause_msg(
                        "IS_USED_LOCK does not name this session (RELEASE_ALL_LOCKS or a reset ran on it)",
                    )),
                ),
                true,
            ),
            Err(e) => {
                let reason = loss_reason(&e);
                let cause = match describe(e, timeout) {
                    c if reason == LostReason::KeepAliveTimedOut => {
                        cause_msg(format!("keep-alive ping: {c}"))
                    }
                    c => cause_msg(format!("keep-alive ping failed: {c}")),
                };
                (LostLock::new(self.key.clone(), reason, Some(cause)), false)
            }
        };
        match self.give_up(conn, lost.clone(), healthy) {
            // 3. Notify, with nothing held: a handler may call release().
            Some(pending) => {
                pending.notify();
                Ping::Lost(lost)
            }
            None => Ping::Stopped,
        }
    }

    /// The lock is gone: `conn` is out of the slot and `slot.busy` names
    /// it. The verdict, then let go; the loss to notify, or `None` if a
    /// release had begun (then it is not a loss, and nobody is notified).
    fn give_up(&self, conn: PooledConn, lost: LostLock, healthy: bool) -> Option<PendingLoss> {
        // 1. The verdict: a loss unless the release has begun.
        let pending = self.watch.get().and_then(|w| w.claim_loss(lost.clone()));
        // 2. Let go. A failed connection is closed first (still marked busy,
        //    so a waiting release cannot take it meanwhile): ending the
        //    session makes the presumed loss real instead of leaving the lock
        //    in doubt. Then the slot is handed back and a waiting release
        //    woken.
        let keep = if healthy {
            Some(conn)
        } else {
            discard(conn);
            None
        };
        let mut slot = self.lock();
        slot.conn = keep;
        slot.busy = None;
        slot.ended = Some(lost);
        drop(slot);
        self.changed.notify_all();
        pending
    }
}

/// What the server's unasked bytes say: an error packet (`0xFF`, code,
/// `#SQLSTATE`, message) names why it ends the session.
fn unasked(bytes: &[u8]) -> (LostReason, String) {
    if bytes.len() >= 7 && bytes[4] == 0xFF {
        let code = u16::from_le_bytes([bytes[5], bytes[6]]);
        let len = usize::from(bytes[0]) | usize::from(bytes[1]) << 8 | usize::from(bytes[2]) << 16;
        let end = (4 + len).min(bytes.len());
        let mut msg = &bytes[7..end.max(7)];
        if msg.first() == Some(&b'#') && msg.len() >= 6 {
            msg = &msg[6..];
        }
        let reason = match code {
            ER_SERVER_SHUTDOWN => LostReason::ServerGone,
            ER_CONNECTION_KILLED => LostReason::Reset,
            _ => LostReason::ConnectionLost,
        };
        let text = String::from_utf8_lossy(msg);
        return (
            reason,
            format!("the server ended the session unasked: ERROR {code}: {text}"),
        );
    }
    (
        LostReason::ConnectionLost,
        format!(
            "the server sent {} bytes unasked while the connection was idle",
            bytes.len()
        ),
    )
}

/// Runs a loss's handlers on a thread of their own, so that a slow handler
/// does not hold up the connection watch of every other lease (the watch
/// thread calls this); on this thread if none can be started.
fn notify_elsewhere(pending: PendingLoss) {
    let cell = Arc::new(Mutex::new(Some(pending)));
    let theirs = Arc::clone(&cell);
    let take = |c: &Mutex<Option<PendingLoss>>| c.lock().unwrap_or_else(|p| p.into_inner()).take();
    let spawned = sock::spawn_quiet("ringlock-mysql-lost", move || {
        if let Some(p) = take(&theirs) {
            p.notify();
        }
    });
    if spawned.is_err() {
        if let Some(p) = take(&cell) {
            p.notify();
        }
    }
}

impl Watched for Held {
    fn idle_fd(&self) -> Option<std::os::fd::RawFd> {
        let slot = self.lock();
        if slot.stopping || slot.ended.is_some() || slot.busy.is_some() {
            return None;
        }
        slot.conn.as_ref().map(|c| c.as_raw_fd())
    }

    fn check(&self, fd: std::os::fd::RawFd) {
        let mut slot = self.lock();
        if slot.stopping || slot.ended.is_some() || slot.busy.is_some() {
            return;
        }
        if slot.conn.as_ref().map(|c| c.as_raw_fd()) != Some(fd) {
            return;
        }
        // Idle and ours while `slot` is locked: nobody else reads it now.
        let (reason, why) = match sock::peek(fd) {
            Peek::Quiet => return,
            Peek::Closed => (
                LostReason::ConnectionLost,
                "the server closed the connection (its session was killed, the server \
                 restarted, or the connection was dropped)"
                    .to_string(),
            ),
            Peek::Data(bytes) => unasked(&bytes),
            Peek::Failed(e) => (
                LostReason::ConnectionLost,
                format!("the connection failed: {e}"),
            ),
        };
        let Some(conn) = slot.conn.take() else {
            return;
        };
        slot.busy = Some(fd);
        drop(slot);
        let lost = LostLock::new(
            self.key.clone(),
            reason,
            Some(cause_msg(format!("connection watch: {why}"))),
        );
        if let Some(pending) = self.give_up(conn, lost, false) {
            notify_elsewhere(pending);
        }
    }
}

impl Due for Held {
    fn start(self: Arc<Self>, due: Instant) {
        {
            let mut slot = self.lock();
            if slot.stopping {
                return;
            }
            slot.thread = true;
        }
        let me = Arc::clone(&self);
        let spawned = sock::spawn_quiet("ringlock-mysql-keepalive", move || me.keep_alive(due));
        if let Err(e) = spawned {
            // Without a keep-alive the loss would go unnoticed: give the
            // lock up now and say so.
            self.lock().thread = false;
            let lost = LostLock::new(
                self.key.clone(),
                LostReason::KeepAliveFailed,
                Some(cause_msg(format!(
                    "cannot start the keep-alive thread: {e}"
                ))),
            );
            let pending = self.watch.get().and_then(|w| w.claim_loss(lost.clone()));
            let mut slot = self.lock();
            if slot.busy.is_none() {
                if let Some(conn) = slot.conn.take() {
                    discard(conn);
                }
            }
            slot.ended = Some(lost);
            drop(slot);
            self.changed.notify_all();
            if let Some(pending) = pending {
                pending.notify();
            }
        }
    }
}

impl Hold for Held {
    fn release(&self) -> Result<()> {
        let timeout = self.shared.opts.release_timeout_value();
        let deadline = Instant::now() + timeout;
        if let Some(&s) = self.sched.get() {
            self.shared.keeper.cancel(s);
        }
        if let Some(&id) = self.watched.get() {
            self.shared.watcher.unwatch(id);
        }
        let mut slot = self.lock();
        slot.stopping = true;
        if slot.thread {
            self.changed.notify_all();
        }
        // Wait for a ping in flight to let go; past the deadline, cut it so
        // that it does (its failure is not a loss: stopping is set).
        let mut cut = false;
        while let Some(fd) = slot.busy {
            let now = Instant::now();
            if !cut && now >= deadline {
                sock::cut(fd);
                cut = true;
            }
            slot = if cut {
                self.wait(slot)
            } else {
                self.wait_for(slot, deadline - now)
            };
        }
        let conn = slot.conn.take();
        let ended = slot.ended.clone();
        let saved = slot.saved;
        drop(slot);

        let unreleased = |cause: Cause| Error::Unreleased {
            key: self.key.clone(),
            cause,
        };
        let Some(mut conn) = conn else {
            return Err(unreleased(if cut {
                cause_msg(format!(
                    "a keep-alive ping still had the connection at the release timeout ({timeout:?}); \
                     the connection was closed"
                ))
            } else {
                match ended {
                    Some(lost) => cause_msg(format!("the connection was closed: {lost}")),
                    None => cause_msg("the connection was already closed"),
                }
            }));
        };
        let fd = conn.as_raw_fd();
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            discard(conn);
            return Err(unreleased(cause_msg(format!(
                "the release timeout ({timeout:?}) passed before RELEASE_LOCK could be sent"
            ))));
        }
        let answer = sock::bound_reads(fd, left)
            .map_err(::mysql::Error::from)
            .and_then(|()| {
                conn.query_first::<i64, _>(sql::release_lock(&self.key, self.no_backslash_escapes))
            });
        match answer {
            Ok(v) => {
                give_back(conn, &saved);
                match sql::release_problem(v) {
                    None => Ok(()),
                    Some(why) => Err(Error::Lost(LostLock::new(
                        self.key.clone(),
                        LostReason::NotHeld,
                        Some(cause_msg(why)),
                    ))),
                }
            }
            Err(e) => {
                // Closing the connection ends the session, which frees the
                // lock wherever the server can still see the end of it.
                discard(conn);
                Err(unreleased(cause_msg(format!(
                    "RELEASE_LOCK: {} (the connection was closed)",
                    describe(e, timeout)
                ))))
            }
        }
    }

    fn extend(&self) -> Result<Option<Instant>> {
        match self.ping(PingKind::Extend) {
            Ping::Alive => Ok(None),
            Ping::Lost(lost) => Err(Error::Lost(lost)),
            Ping::Stopped => Err(Error::Released),
        }
    }

    fn session_id(&self) -> Option<u64> {
        Some(u64::from(self.conn_id))
    }

    /// The pinned connection, idle in the slot or out with its one user.
    fn connection_fd(&self) -> Option<std::os::fd::RawFd> {
        let slot = self.lock();
        if slot.stopping || slot.ended.is_some() {
            return None;
        }
        slot.busy
            .or_else(|| slot.conn.as_ref().map(|c| c.as_raw_fd()))
    }
}

impl Held {
    /// Records the keeper slot (so that release can cancel it).
    pub(crate) fn scheduled(&self, slot: keeper::Slot) {
        let _ = self.sched.set(slot);
    }

    /// Records the connection watcher's id (so that release can forget it).
    pub(crate) fn watched(&self, id: u64) {
        let _ = self.watched.set(id);
    }
}
