//! The connection of a [`Session`](super::Session) and its one I/O
//! thread.
//!
//! Who owns what:
//! - **The socket** is shared. Callers write their own request frames
//!   (under `write`, so frames never interleave; each write is bounded by
//!   `SO_SNDTIMEO` = the ping timeout). Only the I/O thread reads. The
//!   current socket lives in `State` with its connection number: a
//!   replicated session (the welcome's resumable flag) gets a new one when
//!   the I/O thread resumes it ([`super::resume`]).
//! - **The I/O thread** reads every answer and push, sends the Pings, sends
//!   the Cancels of acquires whose caller gave up, keeps the client-side
//!   expiry of leases, and resumes a replicated session whose connection
//!   failed. It never waits for an answer itself, so nothing a handler or
//!   a caller does can stall it behind its own reply.
//! - **`State`** (one mutex) holds the outstanding requests by request id
//!   (each with its frame, so a resume can send it again), the held locks
//!   by (key, token), the current socket, and the session's end once it
//!   ended.
//!
//! Invariants:
//! - A request id is in `pending` from before its frame is written until
//!   its caller took the answer (or gave up: then it turns into `Ignore`
//!   and its late answer is dropped), so an answer can never be matched to
//!   the wrong request. Ids 0 (Lost pushes) and [`PING_RID`] are never
//!   handed out.
//! - A request is written on the socket it was registered with (`conn`),
//!   or, while a resume is under way, not at all: it waits in `pending`
//!   with `conn: None` and the I/O thread writes it on the new connection
//!   before any caller may write there. The Resume is therefore always the
//!   new connection's first frame, and an answer is only ever read on the
//!   connection its request was written on.
//! - A granted lock enters `holds` when the I/O thread reads its grant
//!   (or when a resume finds it granted), before any later push can be
//!   read, so a Lost push that follows its grant at once is never missed.
//! - `dead` is set once, by the I/O thread, together with draining
//!   `holds`; nothing is sent after it.
//! - Losses follow `lease`'s order: the verdict (`claim_loss`), then letting
//!   go (the hold is marked ended so no request is sent for it; on a dead
//!   connection the socket is shut down and every waiter woken), then the
//!   handlers, with no lock held. Handlers of a Lost push, a client-side
//!   expiry or a resume run on a short-lived thread of their own, so a slow
//!   handler never delays the Pings that keep the session's other locks
//!   alive; handlers of the session's end run on the I/O thread, which has
//!   nothing left to do.

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr};

use crate::client::stream::{Dial, Stream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crate::lease::{
    cause_msg, CancelToken, Cause, Error, LeaseWatch, LostHandler, LostLock, LostReason,
    PendingLoss,
};
use crate::protocol::session::{self as wire, HoldMode, Status, Welcome};

use super::sys::{notify_elsewhere, EventFd};
use super::watched::WatchItem;

/// The request id of every keep-alive Ping (one is outstanding at a time)
/// and of the Hello before it.
pub(super) const PING_RID: u32 = 1;

/// The keep-alive schedule derived from the server's deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Timing {
    /// K: the server ends the session when nothing arrived from the client
    /// for this long.
    pub keepalive: Duration,
    /// I: a Ping is due this long after the previous one was due.
    pub interval: Duration,
    /// T: a Ping not answered this long after it was due is a loss.
    pub ping_timeout: Duration,
}

impl Timing {
    /// I = T = K/3, each at most its maximum and at least 1 ms.
    ///
    /// Why that is safe: the server's deadline is "last frame received +
    /// K". Say the last Ping the server received was due at `d` (it was
    /// sent at `d` or later, so the server's deadline is at least `d + K`).
    /// The next Ping is due at `d + I`; if it or its answer is lost, the
    /// client declares the session lost at `d + I + T = d + 2K/3`, a third
    /// of K before the server may end it. The caps only make I and T
    /// smaller, which keeps that order and bounds how long a hung
    /// connection can go unnoticed under a long keep-alive.
    pub(super) fn from_keepalive(
        k: Duration,
        interval_max: Duration,
        timeout_max: Duration,
    ) -> Timing {
        let third = k / 3;
        let floor = Duration::from_millis(1);
        Timing {
            keepalive: k,
            interval: third.min(interval_max).max(floor),
            ping_timeout: third.min(timeout_max).max(floor),
        }
    }
}

/// A decoded Reply (every reply but Hello's).
#[derive(Debug, Clone, Copy)]
pub(super) struct Answered {
    pub status: Status,
    pub token: u64,
    /// A lease granted so late that more than half of `sent_at + ttl` was
    /// gone: its client-side expiry waits for an Extend (the caller sends
    /// it before handing the lease out).
    pub rebase: bool,
}

/// What an outstanding request is.
pub(super) enum What {
    Acquire(Box<AcquireReq>),
    /// Its caller waits for the answer.
    Call,
    /// Nobody waits (a Cancel, or a call that gave up): the answer is dropped.
    Ignore,
}

/// An outstanding Acquire: what its grant becomes, and its caller's
/// cancellation, which the I/O thread turns into a Cancel.
pub(super) struct AcquireReq {
    pub key: Vec<u8>,
    pub key_text: String,
    /// The hold mode asked for: a resume matches a listed hold by key and
    /// mode.
    pub mode: HoldMode,
    /// The TTL as sent (whole milliseconds), for a lease.
    pub ttl: Option<Duration>,
    /// Just before the frame was written: a lease's client-side expiry
    /// counts from here, so it never outlives the server's.
    pub sent_at: Instant,
    pub cancel: Option<CancelToken>,
    pub deadline: Option<Instant>,
    /// Set when the I/O thread sent a Cancel for it, with the caller's error.
    pub cancelled: Option<Error>,
}

/// What an outstanding request asks the server, for a resume to settle
/// it when the connection it was written on failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Op {
    Acquire,
    Release(HoldId),
    Extend(HoldId),
    /// A Proclaim of that hold (sent again after a resume, as an Extend:
    /// setting the same source twice is setting it once).
    Proclaim(HoldId),
    Cancel,
    Ping,
    Watch,
}

pub(super) struct Pending {
    pub(super) what: What,
    pub(super) answer: Option<Answered>,
    /// The request as written, kept until it is answered: a resume writes
    /// it again when its outcome is unknown.
    pub(super) frame: Vec<u8>,
    /// The connection it was written on; `None` while it waits for a
    /// resume to end (the I/O thread writes it then).
    pub(super) conn: Option<u64>,
    pub(super) op: Op,
}

/// A held lock, as the session sees it.
pub(super) type HoldId = (Vec<u8>, u64);

pub(super) struct Entry {
    pub(super) key_text: String,
    /// Set when the caller wrapped the grant in a lease.
    pub(super) watch: Option<LeaseWatch>,
    pub(super) ended: Option<Ended>,
    /// The client-side expiry of a lease.
    pub(super) expires_at: Option<Instant>,
}

impl Entry {
    /// The hold an Acquire's grant of `token` becomes, and whether the
    /// caller must extend it before handing it out. `expires_at` is the
    /// server-safe expiry of a lease (`None` for other holds): when more
    /// than half of the lease's TTL is already gone by it, the client-side
    /// expiry waits for that Extend instead.
    pub(super) fn granted(a: &AcquireReq, expires_at: Option<Instant>) -> (Entry, bool) {
        let expires_at = a.ttl.and_then(|ttl| {
            let x = expires_at?;
            (x >= Instant::now() + ttl / 2).then_some(x)
        });
        let rebase = a.ttl.is_some() && expires_at.is_none();
        let entry = Entry {
            key_text: a.key_text.clone(),
            watch: None,
            ended: None,
            expires_at,
        };
        (entry, rebase)
    }
}

/// Why a hold ended while its session lives on.
#[derive(Clone, Debug)]
pub(super) enum Ended {
    /// The server no longer holds it (a Lost push, a stale-token answer):
    /// a Release would change nothing.
    Server(LostLock),
    /// The lease's TTL passed on the client's clock, which runs ahead of the
    /// server's: the release still sends a Release (token-checked, so it is
    /// harmless when the server expired it too).
    Local(LostLock),
}

impl Ended {
    pub(super) fn lost(&self) -> &LostLock {
        match self {
            Ended::Server(l) | Ended::Local(l) => l,
        }
    }
}

/// How a session ended: the reason every hold's loss gets, and why.
pub(super) type End = (LostReason, Cause);

pub(super) struct State {
    next_rid: u32,
    pub(super) pending: HashMap<u32, Pending>,
    pub(super) holds: HashMap<HoldId, Entry>,
    /// A writer's failure (of a session that cannot be resumed), or a
    /// close, waiting for the I/O thread to act on: the session ends.
    pub(super) fail: Option<End>,
    /// A writer's failure on connection `.0` of a resumable session: the
    /// I/O thread resumes (the cause is for its report).
    pub(super) broke: Option<(u64, End)>,
    pub(super) dead: Option<End>,
    /// The current connection.
    pub(super) sock: Arc<Stream>,
    /// Its number: 0 for the Hello's, one more per resume.
    pub(super) conn: u64,
    /// A resume is under way: requests wait in `pending` (`conn: None`).
    pub(super) resuming: bool,
    /// The last welcome had the resumable flag.
    pub(super) resumable: bool,
    /// The last welcome had the modes flag: the server takes shared and
    /// semaphore Acquires (a resume may land on a server without it).
    pub(super) modes: bool,
    /// The last welcome had the watches flag.
    pub(super) watch: bool,
    /// The last welcome had the proclaim flag.
    pub(super) proclaim: bool,
    /// Open key watches by the Watch's rid: where the I/O thread puts
    /// their Events. A watch lives on one connection: a resume or the
    /// session's end ends every one ([`Shared::end_watches`]).
    pub(super) watches: HashMap<u32, mpsc::Sender<WatchItem>>,
}

impl State {
    pub(super) fn alloc_rid(&mut self) -> u32 {
        loop {
            let rid = self.next_rid;
            self.next_rid = self.next_rid.wrapping_add(1);
            if rid > PING_RID
                && !self.pending.contains_key(&rid)
                && !self.watches.contains_key(&rid)
            {
                return rid;
            }
        }
    }
}

/// The result of waiting for an answer.
pub(super) enum Waited {
    Answer(Answered, What),
    Dead(End),
    /// The caller's bound passed first.
    NoAnswer,
}

/// Where a hold stands, for a release or an extend.
pub(super) enum HoldNow {
    Alive,
    Ended(Ended),
    Dead(End),
    /// Not (or no longer) known: released already.
    Gone,
}

/// A handler of the session's resume events: one line each (the
/// connection failed and a resume began, it succeeded, it failed).
pub(crate) type EventHandler = Arc<dyn Fn(&str) + Send + Sync + 'static>;

/// What a resume needs besides the session: where, and how.
pub(crate) struct Resumer {
    /// The session's address list, as given to the builder.
    pub addrs: Vec<SocketAddr>,
    /// Plaintext or TLS (with the host names the addresses were given by).
    pub dial: Dial,
    pub auth: Vec<u8>,
    /// Bound on one attempt (connecting, the Resume's answer).
    pub connect_timeout: Duration,
    pub on_event: Option<EventHandler>,
}

impl Resumer {
    pub(super) fn event(&self, line: impl FnOnce() -> String) {
        if let Some(h) = &self.on_event {
            let line = line();
            // A panicking handler must not take the I/O thread with it.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h(&line)));
        }
    }
}

pub(super) struct Shared {
    write: Mutex<()>,
    state: Mutex<State>,
    pub(super) changed: Condvar,
    pub(super) wake: EventFd,
    io_thread: OnceLock<ThreadId>,
    pub timing: Timing,
    pub welcome: Welcome,
    pub release_timeout: Duration,
    pub source: Vec<u8>,
    pub on_lost: Option<LostHandler>,
    /// How to take the session over on another connection (its addresses,
    /// auth token, connect timeout): used while the welcome says the
    /// session is resumable.
    pub(super) resumer: Resumer,
    /// Successful resumes so far.
    pub(super) resumes: AtomicU64,
}

impl Shared {
    pub(super) fn new(
        sock: Stream,
        welcome: Welcome,
        timing: Timing,
        release_timeout: Duration,
        source: Vec<u8>,
        on_lost: Option<LostHandler>,
        resumer: Resumer,
    ) -> io::Result<Arc<Shared>> {
        Ok(Arc::new(Shared {
            write: Mutex::new(()),
            state: Mutex::new(State {
                next_rid: PING_RID + 1,
                pending: HashMap::new(),
                holds: HashMap::new(),
                fail: None,
                broke: None,
                dead: None,
                sock: Arc::new(sock),
                conn: 0,
                resuming: false,
                resumable: welcome.flags & wire::FLAG_RESUMABLE != 0,
                modes: welcome.flags & wire::FLAG_MODES != 0,
                watch: welcome.flags & wire::FLAG_WATCH != 0,
                proclaim: welcome.flags & wire::FLAG_PROCLAIM != 0,
                watches: HashMap::new(),
            }),
            changed: Condvar::new(),
            wake: EventFd::new()?,
            io_thread: OnceLock::new(),
            timing,
            welcome,
            release_timeout,
            source,
            on_lost,
            resumer,
            resumes: AtomicU64::new(0),
        }))
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is an insert, a remove or an assignment: a panic
        // cannot leave the state half-changed, so poisoning is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the I/O thread.
    pub(super) fn spawn(self: &Arc<Self>) -> io::Result<()> {
        let me = Arc::clone(self);
        std::thread::Builder::new()
            .name("ringlock-session".into())
            .spawn(move || me.run())
            .map(drop)
    }

    /// The current connection's descriptor, while the session is open.
    pub(super) fn connection_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        let st = self.lock();
        (st.dead.is_none() && st.fail.is_none()).then(|| st.sock.as_raw_fd())
    }

    pub(super) fn local_addr(&self) -> Option<SocketAddr> {
        self.lock().sock.local_addr().ok()
    }

    /// How the session ended, once it did.
    pub(super) fn end(&self) -> Option<End> {
        self.lock().dead.clone()
    }

    /// Successful resumes so far.
    pub(super) fn resumes(&self) -> u64 {
        self.resumes.load(Ordering::Relaxed)
    }

    pub(super) fn write_frame(&self, sock: &Stream, frame: &[u8]) -> io::Result<()> {
        let _g = self.write.lock().unwrap_or_else(|p| p.into_inner());
        (&*sock).write_all(frame)
    }

    /// Registers a request and writes its frame (or, while a resume is
    /// under way, leaves it for the I/O thread to write on the new
    /// connection). `Err`: the session has ended (or this write ended it);
    /// nothing was sent. A failed write on a resumable session is not an
    /// error: the request is in flight, and the resume settles it.
    pub(super) fn send(
        &self,
        what: What,
        op: Op,
        encode: impl FnOnce(u32, &mut Vec<u8>),
    ) -> Result<u32, End> {
        self.send_registered(what, op, |_, _| {}, encode)
    }

    /// [`send`](Self::send), with `register(state, rid)` run under the
    /// same lock as the request's registration, before its frame is
    /// written (a watch's channel: its Events may come back at once).
    pub(super) fn send_registered(
        &self,
        what: What,
        op: Op,
        register: impl FnOnce(&mut State, u32),
        encode: impl FnOnce(u32, &mut Vec<u8>),
    ) -> Result<u32, End> {
        let wakes_io =
            matches!(&what, What::Acquire(a) if a.cancel.is_some() || a.deadline.is_some());
        let mut frame = Vec::with_capacity(wire::HEADER + 64);
        let (rid, now) = {
            let mut st = self.lock();
            if let Some(end) = st.dead.as_ref().or(st.fail.as_ref()) {
                return Err(end.clone());
            }
            let rid = st.alloc_rid();
            encode(rid, &mut frame);
            register(&mut st, rid);
            let now = (!st.resuming).then(|| (Arc::clone(&st.sock), st.conn, st.resumable));
            st.pending.insert(
                rid,
                Pending {
                    what,
                    answer: None,
                    frame: frame.clone(),
                    conn: now.as_ref().map(|n| n.1),
                    op,
                },
            );
            (rid, now)
        };
        let Some((sock, conn, resumable)) = now else {
            // Written by the I/O thread when the resume ends.
            return Ok(rid);
        };
        if let Err(e) = self.write_frame(&sock, &frame) {
            let end = (
                LostReason::ConnectionLost,
                cause_msg(format!("sending a request failed: {e}")),
            );
            if resumable {
                self.broke(conn, end);
                return Ok(rid);
            }
            self.lock().pending.remove(&rid);
            self.fail(end.clone());
            return Err(end);
        }
        if wakes_io {
            // The I/O thread watches the caller's cancel token and deadline
            // from its next turn on.
            self.wake.signal();
        }
        Ok(rid)
    }

    /// A write on connection `conn` of a resumable session failed: unless
    /// that connection is gone already, shuts it down, which wakes the I/O
    /// thread to resume.
    fn broke(&self, conn: u64, end: End) {
        {
            let mut st = self.lock();
            if st.conn != conn || st.resuming || st.broke.as_ref().is_some_and(|b| b.0 == conn) {
                return;
            }
            st.broke = Some((conn, end));
            let _ = st.sock.shutdown(Shutdown::Both);
        }
        self.wake.signal();
    }

    /// Waits for the answer to `rid`, the session's end, or `until`.
    pub(super) fn wait(&self, rid: u32, until: Option<Instant>) -> Waited {
        let mut st = self.lock();
        loop {
            if st.pending.get(&rid).is_some_and(|p| p.answer.is_some()) {
                let p = st.pending.remove(&rid).expect("checked above");
                return Waited::Answer(p.answer.expect("checked above"), p.what);
            }
            if let Some(end) = &st.dead {
                let end = end.clone();
                st.pending.remove(&rid);
                return Waited::Dead(end);
            }
            st = match until {
                None => self.changed.wait(st).unwrap_or_else(|p| p.into_inner()),
                Some(until) => {
                    let now = Instant::now();
                    if now >= until {
                        if let Some(p) = st.pending.get_mut(&rid) {
                            p.what = What::Ignore;
                        }
                        return Waited::NoAnswer;
                    }
                    self.changed
                        .wait_timeout(st, until - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
    }

    /// Ends the session from outside the I/O thread (a failed write, a
    /// close, the last handle dropped): records why, then shuts the socket
    /// down, which wakes the I/O thread to do the rest.
    pub(super) fn fail(&self, end: End) {
        {
            let mut st = self.lock();
            if st.dead.is_none() && st.fail.is_none() {
                st.fail = Some(end);
            }
            // During a resume this is the failed connection: the wake-up
            // below interrupts the attempt under way.
            let _ = st.sock.shutdown(Shutdown::Both);
        }
        self.wake.signal();
    }

    /// [`fail`](Self::fail), then waits (bounded) until the I/O thread has
    /// recorded the end, unless called on the I/O thread itself.
    pub(super) fn close(&self, end: End) {
        self.fail(end);
        if self.io_thread.get() == Some(&std::thread::current().id()) {
            return;
        }
        let until = Instant::now() + self.release_timeout;
        let mut st = self.lock();
        while st.dead.is_none() {
            let now = Instant::now();
            if now >= until {
                return;
            }
            st = self
                .changed
                .wait_timeout(st, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Links a granted hold to its lease. `Err`: it was lost before the
    /// caller could wrap it (a push right behind the grant, the session's
    /// end).
    pub(super) fn attach(&self, id: &HoldId, watch: LeaseWatch) -> Result<(), LostLock> {
        let mut st = self.lock();
        let key_text = || String::from_utf8_lossy(&id.0).into_owned();
        if let Some((reason, cause)) = &st.dead {
            return Err(LostLock::new(key_text(), *reason, Some(cause.clone())));
        }
        match st.holds.get_mut(id) {
            Some(e) => match &e.ended {
                Some(ended) => Err(ended.lost().clone()),
                None => {
                    e.watch = Some(watch);
                    Ok(())
                }
            },
            None => Err(LostLock::new(
                key_text(),
                LostReason::NotHeld,
                Some(cause_msg("the grant was not recorded (internal error)")),
            )),
        }
    }

    /// Takes a hold out of the table for its release: from now on no push
    /// or expiry acts on it.
    pub(super) fn take_hold(&self, id: &HoldId) -> HoldNow {
        let mut st = self.lock();
        if let Some(end) = &st.dead {
            return HoldNow::Dead(end.clone());
        }
        match st.holds.remove(id) {
            Some(Entry {
                ended: Some(ended), ..
            }) => HoldNow::Ended(ended),
            Some(_) => HoldNow::Alive,
            None => HoldNow::Gone,
        }
    }

    pub(super) fn hold_now(&self, id: &HoldId) -> HoldNow {
        let st = self.lock();
        if let Some(end) = &st.dead {
            return HoldNow::Dead(end.clone());
        }
        match st.holds.get(id) {
            Some(Entry {
                ended: Some(ended), ..
            }) => HoldNow::Ended(ended.clone()),
            Some(_) => HoldNow::Alive,
            None => HoldNow::Gone,
        }
    }

    /// Records a lease's new client-side expiry after an Extend was
    /// answered `ok`; `Err` if it ended meanwhile.
    pub(super) fn extended(&self, id: &HoldId, expires_at: Instant) -> Result<(), LostLock> {
        let mut st = self.lock();
        if let Some((reason, cause)) = &st.dead {
            return Err(LostLock::new(
                String::from_utf8_lossy(&id.0),
                *reason,
                Some(cause.clone()),
            ));
        }
        match st.holds.get_mut(id) {
            Some(Entry {
                ended: Some(ended), ..
            }) => Err(ended.lost().clone()),
            Some(e) => {
                e.expires_at = Some(expires_at);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// The server no longer holds `id` (a push, a stale answer): the
    /// verdict, then marking it ended. The caller notifies.
    pub(super) fn server_lost(&self, id: &HoldId, lost: LostLock) -> Option<PendingLoss> {
        let watch = {
            let st = self.lock();
            let e = st.holds.get(id)?;
            if e.ended.is_some() {
                return None;
            }
            e.watch.clone()
        };
        let mut pending = watch.as_ref().and_then(|w| w.claim_loss(lost.clone()));
        // A caller may have attached its lease between the two locks (it
        // saw no end yet): that lease is told too, or it would hold a lock
        // the server took away without ever hearing of it.
        let late = match self.lock().holds.get_mut(id) {
            Some(e) => {
                e.ended.get_or_insert(Ended::Server(lost.clone()));
                if watch.is_none() {
                    e.watch.clone()
                } else {
                    None
                }
            }
            None => None,
        };
        if pending.is_none() {
            pending = late.and_then(|w| w.claim_loss(lost));
        }
        pending
    }

    fn run(self: Arc<Self>) {
        let _ = self.io_thread.set(std::thread::current().id());
        let end = catch_unwind(AssertUnwindSafe(|| self.serve())).unwrap_or_else(|_| {
            (
                LostReason::ConnectionLost,
                cause_msg("internal error: the session's I/O thread panicked"),
            )
        });
        self.die(end);
    }

    /// Client-side expiry: a lease whose TTL passed (counted from when its
    /// Acquire or last Extend was sent) is lost here, at or before the
    /// moment the server expires it.
    pub(super) fn expire(&self, now: Instant) {
        let due: Vec<(HoldId, Option<LeaseWatch>, LostLock)> = {
            let st = self.lock();
            st.holds
                .iter()
                .filter(|(_, e)| e.ended.is_none() && e.expires_at.is_some_and(|x| now >= x))
                .map(|(id, e)| {
                    let lost = LostLock::new(
                        e.key_text.clone(),
                        LostReason::Expired,
                        Some(cause_msg(format!(
                            "its TTL passed without an extend (token {}, counted on this side from \
                             when the acquire or the last extend was sent)",
                            id.1
                        ))),
                    );
                    (id.clone(), e.watch.clone(), lost)
                })
                .collect()
        };
        if due.is_empty() {
            return;
        }
        let mut claims = Vec::new();
        for (_, watch, lost) in &due {
            if let Some(p) = watch.as_ref().and_then(|w| w.claim_loss(lost.clone())) {
                claims.push(p);
            }
        }
        let mut late = Vec::new();
        {
            let mut st = self.lock();
            for (id, watch, lost) in due {
                if let Some(e) = st.holds.get_mut(&id) {
                    e.ended.get_or_insert(Ended::Local(lost.clone()));
                    // Attached between the two locks: told as well (see
                    // `server_lost`).
                    if watch.is_none() {
                        if let Some(w) = e.watch.clone() {
                            late.push((w, lost));
                        }
                    }
                }
            }
        }
        claims.extend(late.into_iter().filter_map(|(w, lost)| w.claim_loss(lost)));
        notify_elsewhere(claims);
    }

    /// The session's end: every hold is lost (unless its release began),
    /// the connection is let go, waiters are woken, then the handlers run.
    fn die(&self, (reason, cause): End) {
        let entries: Vec<Entry> = {
            let mut st = self.lock();
            if st.dead.is_some() {
                return;
            }
            st.dead = Some((reason, cause.clone()));
            let _ = st.sock.shutdown(Shutdown::Both);
            for (_, w) in st.watches.drain() {
                let _ = w.send(WatchItem::Ended(format!("the session ended: {cause}")));
            }
            st.holds.drain().map(|(_, e)| e).collect()
        };
        let claims: Vec<PendingLoss> = entries
            .into_iter()
            .filter(|e| e.ended.is_none())
            .filter_map(|e| {
                let lost = LostLock::new(e.key_text, reason, Some(cause.clone()));
                e.watch.and_then(|w| w.claim_loss(lost))
            })
            .collect();
        self.changed.notify_all();
        for p in claims {
            p.notify();
        }
    }
}

/// Keeps the connection open: held by every `Session` clone and every
/// lease of it. The last one gone closes the connection (which ends every
/// session hold on the server at once).
pub(super) struct Handle {
    pub(super) shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.fail((
            LostReason::ConnectionLost,
            cause_msg("the session was dropped"),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_gives_up_a_third_of_the_keepalive_before_the_server() {
        let max = Duration::from_secs(10);
        for k_ms in [3u64, 100, 1000, 3000, 10_000, 30_000, 60_000, 3_600_000] {
            let k = Duration::from_millis(k_ms);
            let t = Timing::from_keepalive(k, max, max);
            assert!(
                t.interval + t.ping_timeout < k,
                "K {k:?}: I {:?} + T {:?} must be < K",
                t.interval,
                t.ping_timeout
            );
            assert!(t.interval <= max && t.ping_timeout <= max);
            assert!(!t.interval.is_zero() && !t.ping_timeout.is_zero());
        }
        let t = Timing::from_keepalive(Duration::from_secs(3), max, max);
        assert_eq!(t.interval, Duration::from_secs(1));
        assert_eq!(t.ping_timeout, Duration::from_secs(1));
        let t = Timing::from_keepalive(Duration::from_secs(600), max, Duration::from_secs(5));
        assert_eq!(t.interval, max);
        assert_eq!(t.ping_timeout, Duration::from_secs(5));
    }

    #[test]
    fn request_ids_skip_the_reserved_ones_and_those_in_flight() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let sock = Stream::plain(std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap());
        let mut st = State {
            next_rid: u32::MAX,
            pending: HashMap::new(),
            holds: HashMap::new(),
            fail: None,
            broke: None,
            dead: None,
            sock: Arc::new(sock),
            conn: 0,
            resuming: false,
            resumable: false,
            modes: false,
            watch: false,
            proclaim: false,
            watches: HashMap::new(),
        };
        st.pending.insert(
            2,
            Pending {
                what: What::Call,
                answer: None,
                frame: Vec::new(),
                conn: Some(0),
                op: Op::Ping,
            },
        );
        assert_eq!(st.alloc_rid(), u32::MAX);
        assert_eq!(
            st.alloc_rid(),
            3,
            "0, the ping's 1 and 2 (in flight) skipped"
        );
    }
}
