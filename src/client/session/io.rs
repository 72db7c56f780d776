//! The one connection of a [`Session`](super::Session) and its one I/O
//! thread.
//!
//! Who owns what:
//! - **The socket** is shared. Callers write their own request frames
//!   (under `write`, so frames never interleave; each write is bounded by
//!   `SO_SNDTIMEO` = the ping timeout). Only the I/O thread reads.
//! - **The I/O thread** reads every answer and push, sends the Pings, sends
//!   the Cancels of acquires whose caller gave up, and keeps the client-side
//!   expiry of leases. It never waits for an answer itself, so nothing a
//!   handler or a caller does can stall it behind its own reply.
//! - **`State`** (one mutex) holds the outstanding requests by request id,
//!   the held locks by (key, token), and the session's end once it ended.
//!
//! Invariants:
//! - A request id is in `pending` from before its frame is written until
//!   its caller took the answer (or gave up: then it turns into `Ignore`
//!   and its late answer is dropped), so an answer can never be matched to
//!   the wrong request. Ids 0 (Lost pushes) and [`PING_RID`] are never
//!   handed out.
//! - A granted lock enters `holds` when the I/O thread reads its grant,
//!   before any later push can be read, so a Lost push that follows its
//!   grant at once is never missed.
//! - `dead` is set once, by the I/O thread, together with draining
//!   `holds`; nothing is sent after it.
//! - Losses follow `lease`'s order: the verdict (`claim_loss`), then letting
//!   go (the hold is marked ended so no request is sent for it; on a dead
//!   connection the socket is shut down and every waiter woken), then the
//!   handlers, with no lock held. Handlers of a Lost push or a client-side
//!   expiry run on a short-lived thread of their own, so a slow handler
//!   never delays the Pings that keep the session's other locks alive;
//!   handlers of the session's end run on the I/O thread, which has nothing
//!   left to do.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crate::lease::{
    cause_msg, CancelToken, Cause, Error, LeaseWatch, LostHandler, LostLock, LostReason,
    PendingLoss,
};
use crate::protocol::session::{self as wire, Answer, LostWhy, Req, Status, Welcome};

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

struct Pending {
    what: What,
    answer: Option<Answered>,
}

/// A held lock, as the session sees it.
pub(super) type HoldId = (Vec<u8>, u64);

struct Entry {
    key_text: String,
    /// Set when the caller wrapped the grant in a lease.
    watch: Option<LeaseWatch>,
    ended: Option<Ended>,
    /// The client-side expiry of a lease.
    expires_at: Option<Instant>,
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

struct State {
    next_rid: u32,
    pending: HashMap<u32, Pending>,
    holds: HashMap<HoldId, Entry>,
    /// A writer's failure, or a close, waiting for the I/O thread to act on.
    fail: Option<End>,
    dead: Option<End>,
}

impl State {
    fn alloc_rid(&mut self) -> u32 {
        loop {
            let rid = self.next_rid;
            self.next_rid = self.next_rid.wrapping_add(1);
            if rid > PING_RID && !self.pending.contains_key(&rid) {
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

pub(super) struct Shared {
    sock: TcpStream,
    write: Mutex<()>,
    state: Mutex<State>,
    changed: Condvar,
    wake: EventFd,
    io_thread: OnceLock<ThreadId>,
    pub timing: Timing,
    pub welcome: Welcome,
    pub release_timeout: Duration,
    pub source: Vec<u8>,
    pub on_lost: Option<LostHandler>,
}

impl Shared {
    pub(super) fn new(
        sock: TcpStream,
        welcome: Welcome,
        timing: Timing,
        release_timeout: Duration,
        source: Vec<u8>,
        on_lost: Option<LostHandler>,
    ) -> io::Result<Arc<Shared>> {
        Ok(Arc::new(Shared {
            sock,
            write: Mutex::new(()),
            state: Mutex::new(State {
                next_rid: PING_RID + 1,
                pending: HashMap::new(),
                holds: HashMap::new(),
                fail: None,
                dead: None,
            }),
            changed: Condvar::new(),
            wake: EventFd::new()?,
            io_thread: OnceLock::new(),
            timing,
            welcome,
            release_timeout,
            source,
            on_lost,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
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

    pub(super) fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.sock.local_addr().ok()
    }

    /// How the session ended, once it did.
    pub(super) fn end(&self) -> Option<End> {
        self.lock().dead.clone()
    }

    fn write_frame(&self, frame: &[u8]) -> io::Result<()> {
        let _g = self.write.lock().unwrap_or_else(|p| p.into_inner());
        (&self.sock).write_all(frame)
    }

    /// Registers a request and writes its frame. `Err`: the session has
    /// ended (or this write ended it); nothing was sent.
    pub(super) fn send(
        &self,
        what: What,
        encode: impl FnOnce(u32, &mut Vec<u8>),
    ) -> Result<u32, End> {
        let wakes_io =
            matches!(&what, What::Acquire(a) if a.cancel.is_some() || a.deadline.is_some());
        let rid = {
            let mut st = self.lock();
            if let Some(end) = st.dead.as_ref().or(st.fail.as_ref()) {
                return Err(end.clone());
            }
            let rid = st.alloc_rid();
            st.pending.insert(rid, Pending { what, answer: None });
            rid
        };
        let mut frame = Vec::with_capacity(wire::HEADER + 64);
        encode(rid, &mut frame);
        if let Err(e) = self.write_frame(&frame) {
            self.lock().pending.remove(&rid);
            let end = (
                LostReason::ConnectionLost,
                cause_msg(format!("sending a request failed: {e}")),
            );
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
        }
        let _ = self.sock.shutdown(Shutdown::Both);
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
        let pending = watch.and_then(|w| w.claim_loss(lost.clone()));
        if let Some(e) = self.lock().holds.get_mut(id) {
            e.ended.get_or_insert(Ended::Server(lost));
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

    /// The I/O loop; returns why the session ended.
    fn serve(&self) -> End {
        let t = self.timing;
        let mut buf: Vec<u8> = Vec::with_capacity(4096);
        let mut chunk = vec![0u8; 16 * 1024];
        let mut frame = Vec::with_capacity(wire::FRAME_MAX);
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(4);
        let mut next_ping = Instant::now() + t.interval;
        let mut ping_deadline: Option<Instant> = None;
        loop {
            // 1. What to wait for: the socket, a wake-up, the callers'
            //    cancel tokens, and the earliest timer.
            let mut wake_at = ping_deadline.unwrap_or(next_ping);
            fds.clear();
            fds.push(pollfd(self.sock.as_raw_fd()));
            fds.push(pollfd(self.wake.fd()));
            {
                let st = self.lock();
                if let Some(end) = &st.fail {
                    return end.clone();
                }
                for p in st.pending.values() {
                    if let (What::Acquire(a), None) = (&p.what, &p.answer) {
                        if a.cancelled.is_none() {
                            if let Some(tok) = &a.cancel {
                                fds.push(pollfd(tok.as_raw_fd()));
                            }
                            if let Some(d) = a.deadline {
                                wake_at = wake_at.min(d);
                            }
                        }
                    }
                }
                for e in st.holds.values() {
                    if let (None, Some(x)) = (&e.ended, e.expires_at) {
                        wake_at = wake_at.min(x);
                    }
                }
            }

            // 2. Wait.
            if let Err(e) = poll(&mut fds, wake_at) {
                return (
                    LostReason::ConnectionLost,
                    cause_msg(format!("poll failed: {e}")),
                );
            }
            if fds[1].revents != 0 {
                self.wake.drain();
            }

            // 3. Read what arrived, answer by answer.
            if fds[0].revents != 0 {
                match (&self.sock).read(&mut chunk) {
                    Ok(0) => return self.end_of_stream(None),
                    Ok(n) => {
                        buf.extend_from_slice(&chunk[..n]);
                        let mut at = 0;
                        loop {
                            match wire::decode_answer(&buf[at..], None) {
                                Ok(Some((answer, used))) => {
                                    at += used;
                                    if let Some(end) = self.dispatch(answer, &mut ping_deadline) {
                                        return end;
                                    }
                                }
                                Ok(None) => break,
                                Err(e) => {
                                    return (
                                        LostReason::ConnectionLost,
                                        cause_msg(format!(
                                            "the server broke the session protocol: {e}"
                                        )),
                                    )
                                }
                            }
                        }
                        buf.drain(..at);
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                        ) => {}
                    Err(e) => return self.end_of_stream(Some(e)),
                }
            }

            // 4. The keep-alive. Its deadline counts from when the Ping was
            //    due, not from when it was written, so a slow write or a
            //    late wake-up shortens the wait and never stretches it.
            let now = Instant::now();
            match ping_deadline {
                Some(deadline) if now >= deadline => {
                    return (
                        LostReason::KeepAliveTimedOut,
                        cause_msg(format!(
                            "no answer to a ping within {:?} (ping every {:?}, server keep-alive {:?}): \
                             the connection hangs",
                            t.ping_timeout, t.interval, t.keepalive
                        )),
                    )
                }
                Some(_) => {}
                None if now >= next_ping => {
                    ping_deadline = Some(next_ping + t.ping_timeout);
                    next_ping = (next_ping + t.interval).max(now);
                    frame.clear();
                    wire::encode(PING_RID, &Req::Ping, &mut frame);
                    if let Err(e) = self.write_frame(&frame) {
                        return (
                            LostReason::ConnectionLost,
                            cause_msg(format!("sending a ping failed: {e}")),
                        );
                    }
                }
                None => {}
            }

            // 5. Cancels for callers that gave up waiting.
            if let Err(end) = self.send_cancels(now, &mut frame) {
                return end;
            }

            // 6. Leases whose TTL passed on this side.
            self.expire(now);
        }
    }

    fn end_of_stream(&self, err: Option<io::Error>) -> End {
        if let Some(end) = self.lock().fail.clone() {
            return end;
        }
        match err {
            None => (
                LostReason::ConnectionLost,
                cause_msg("the server closed the connection"),
            ),
            Some(e) => (
                LostReason::ConnectionLost,
                cause_msg(format!("the connection failed: {e}")),
            ),
        }
    }

    fn dispatch(&self, answer: Answer, ping_deadline: &mut Option<Instant>) -> Option<End> {
        match answer {
            Answer::Reply {
                rid: PING_RID,
                status,
                ..
            } => {
                if ping_deadline.take().is_some() && status != Status::Ok {
                    return Some((
                        LostReason::KeepAliveFailed,
                        cause_msg(format!("the server answered a ping with {}", status.name())),
                    ));
                }
            }
            Answer::Reply {
                rid, status, token, ..
            } => {
                let mut st = self.lock();
                let Some(p) = st.pending.get_mut(&rid) else {
                    return None; // an answer nobody waits for
                };
                let mut rebase = false;
                let grant = match &p.what {
                    What::Ignore => {
                        st.pending.remove(&rid);
                        return None;
                    }
                    What::Acquire(a) if status == Status::Ok => {
                        // The server's TTL started at the grant, which the
                        // client cannot see; `sent_at + ttl` is safe, but after
                        // a wait in the queue it may be (nearly) over. Then the
                        // caller extends first, and this side's expiry counts
                        // from that Extend.
                        let expires_at = a.ttl.and_then(|ttl| {
                            let x = a.sent_at + ttl;
                            (x >= Instant::now() + ttl / 2).then_some(x)
                        });
                        rebase = a.ttl.is_some() && expires_at.is_none();
                        Some((
                            (a.key.clone(), token),
                            Entry {
                                key_text: a.key_text.clone(),
                                watch: None,
                                ended: None,
                                expires_at,
                            },
                        ))
                    }
                    _ => None,
                };
                p.answer = Some(Answered {
                    status,
                    token,
                    rebase,
                });
                if let Some((id, entry)) = grant {
                    st.holds.insert(id, entry);
                }
                drop(st);
                self.changed.notify_all();
            }
            Answer::Held { .. } => {
                return Some((
                    LostReason::ConnectionLost,
                    cause_msg("the server sent a Held frame outside a Resume"),
                ));
            }
            Answer::Lost { key, token, why } => {
                let reason = match why {
                    LostWhy::Expired => LostReason::Expired,
                    LostWhy::Reset => LostReason::Reset,
                };
                let lost = LostLock::new(
                    String::from_utf8_lossy(&key),
                    reason,
                    Some(cause_msg(format!(
                        "the server pushed Lost ({}) for token {token}",
                        why.name()
                    ))),
                );
                if let Some(p) = self.server_lost(&(key, token), lost) {
                    notify_elsewhere(vec![p]);
                }
            }
            Answer::Welcome { .. } => {
                return Some((
                    LostReason::ConnectionLost,
                    cause_msg("the server broke the session protocol: a second hello reply"),
                ))
            }
            // `not leader` (reserved) on an open session: the server gives
            // the session up; nothing of it can be trusted any more.
            Answer::Refused { status, detail, .. } => {
                return Some((
                    LostReason::ConnectionLost,
                    cause_msg(format!(
                        "the server refused the session: {} {}",
                        status.name(),
                        String::from_utf8_lossy(&detail)
                    )),
                ))
            }
        }
        None
    }

    fn send_cancels(&self, now: Instant, frame: &mut Vec<u8>) -> Result<(), End> {
        let mut due: Vec<Vec<u8>> = Vec::new();
        {
            let mut st = self.lock();
            let mut targets = Vec::new();
            for (rid, p) in st.pending.iter_mut() {
                let (What::Acquire(a), None) = (&mut p.what, &p.answer) else {
                    continue;
                };
                if a.cancelled.is_some() {
                    continue;
                }
                let why = if a.cancel.as_ref().is_some_and(CancelToken::is_cancelled) {
                    Error::Cancelled
                } else if a.deadline.is_some_and(|d| now >= d) {
                    Error::DeadlineExceeded
                } else {
                    continue;
                };
                a.cancelled = Some(why);
                targets.push((*rid, a.key.clone()));
            }
            for (target, key) in targets {
                let rid = st.alloc_rid();
                st.pending.insert(
                    rid,
                    Pending {
                        what: What::Ignore,
                        answer: None,
                    },
                );
                frame.clear();
                wire::encode(rid, &Req::Cancel { target, key: &key }, frame);
                due.push(std::mem::take(frame));
            }
        }
        for bytes in due {
            if let Err(e) = self.write_frame(&bytes) {
                return Err((
                    LostReason::ConnectionLost,
                    cause_msg(format!("sending a cancel failed: {e}")),
                ));
            }
        }
        Ok(())
    }

    /// Client-side expiry: a lease whose TTL passed (counted from when its
    /// Acquire or last Extend was sent) is lost here, at or before the
    /// moment the server expires it.
    fn expire(&self, now: Instant) {
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
        {
            let mut st = self.lock();
            for (id, _, lost) in due {
                if let Some(e) = st.holds.get_mut(&id) {
                    e.ended.get_or_insert(Ended::Local(lost));
                }
            }
        }
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
        let _ = self.sock.shutdown(Shutdown::Both);
        self.changed.notify_all();
        for p in claims {
            p.notify();
        }
    }
}

/// Runs the handlers of `claims` on a thread of their own (inline if no
/// thread can be started).
fn notify_elsewhere(claims: Vec<PendingLoss>) {
    if claims.is_empty() {
        return;
    }
    let slot = Arc::new(Mutex::new(Some(claims)));
    let theirs = Arc::clone(&slot);
    let spawned = std::thread::Builder::new()
        .name("ringlock-session-lost".into())
        .spawn(move || run_claims(&theirs));
    if spawned.is_err() {
        run_claims(&slot);
    }
}

fn run_claims(slot: &Mutex<Option<Vec<PendingLoss>>>) {
    let claims = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
    for p in claims.into_iter().flatten() {
        p.notify();
    }
}

fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// `poll(2)` until `until` (rounded up to whole milliseconds, so it never
/// wakes early and spins); EINTR is a normal return.
fn poll(fds: &mut [libc::pollfd], until: Instant) -> io::Result<()> {
    let left = until.saturating_duration_since(Instant::now());
    let ms = left
        .as_micros()
        .div_ceil(1000)
        .min(libc::c_int::MAX as u128) as libc::c_int;
    // SAFETY: `fds` is a live, exclusively borrowed slice of pollfds and its
    // length is passed with it; a longer length would let the kernel write
    // `revents` past the slice. Every test of tests/session_fake.rs and
    // tests/session_client.rs runs the I/O thread through this poll.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
        for f in fds.iter_mut() {
            f.revents = 0;
        }
    }
    Ok(())
}

/// A counter `eventfd` that wakes the I/O thread's poll.
struct EventFd(OwnedFd);

impl EventFd {
    fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd has no memory arguments; we own the returned fd
        // (checked below: a failure is an error, never a descriptor). Every
        // Session of tests/session_fake.rs creates one.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns; owning
        // one that something else also closes would close a reused number
        // under it. Dropping a Session closes it once
        // (session_client::dropping_the_last_handle_ends_the_session).
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to our own eventfd; a
        // full counter (EAGAIN) already means "wake up". A wrong size would
        // be EINVAL and the wake-up lost: a release or cancel would then wait
        // for the next ping (tests/session_fake.rs bounds those waits).
        unsafe {
            libc::write(self.fd(), (&one as *const u64).cast(), 8);
        }
    }

    fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live local from our own
        // non-blocking eventfd; a shorter buffer is EINVAL and the counter
        // would stay set, so poll would spin (the I/O thread's waits in
        // tests/session_fake.rs would then never sleep, not fail).
        unsafe {
            libc::read(self.fd(), (&mut v as *mut u64).cast(), 8);
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
        let mut st = State {
            next_rid: u32::MAX,
            pending: HashMap::new(),
            holds: HashMap::new(),
            fail: None,
            dead: None,
        };
        st.pending.insert(
            2,
            Pending {
                what: What::Call,
                answer: None,
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
