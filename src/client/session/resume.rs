//! Resuming a replicated session on another connection
//! (`docs/protocol.md`, "Resuming a session (cluster mode)").
//!
//! A session whose welcome has the resumable flag is not over when its
//! connection fails: the I/O thread ([`resume`]) walks the session's
//! address list (following `not leader` hints) and sends `Resume{session
//! id, auth}` as a new connection's first frame, while the session's
//! keep-alive, counted from the last frame received from the server, has
//! not passed. The answer lists every hold the session still has (Held
//! frames), then the welcome. [`reconcile`] then settles what the client
//! believed against that list:
//! - a hold it believes in that is listed (same key and token) is kept: no
//!   loss, the lease goes on; a lease's client-side expiry is rebased on
//!   the TTL left it was listed with, counted from when the Resume was
//!   sent;
//! - one that is not listed is lost (`ConnectionLost`, "not kept across
//!   the failover"): its handlers run as for a Lost push;
//! - an Acquire in flight (written, unanswered) whose key is listed with a
//!   token the client does not know (and the Acquire's hold mode) was
//!   granted: the caller gets that grant; otherwise it is written again
//!   (queued Acquires are not kept by the server), or, if its caller gave
//!   up meanwhile (a Cancel in flight, its cancel token, its deadline),
//!   answered `cancelled` here;
//! - a Release in flight whose hold is still listed is written again; one
//!   whose hold is not listed happened (answered `ok` here);
//! - an Extend in flight is written again; a Ping in flight is answered
//!   `ok` here (the resume itself proves the session alive); a Cancel in
//!   flight is dropped (its Acquire was settled above);
//! - a listed hold that nothing above accounts for (the grant of an
//!   Acquire whose caller is gone) is released by token, nobody waiting
//!   for the answer.
//!
//! Requests made while the resume is under way wait in `pending` and are
//! written on the new connection after the re-sent ones, before any caller
//! may write there. A session that cannot be resumed (`unknown session`, a
//! refusal, or the window passed) ends as any other: every hold it still
//! has is lost.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};

use crate::client::stream::{Dial, Stream};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::io::{Answered, End, Entry, HoldId, Op, Pending, Shared, State, What, PING_RID};
use super::sys::{notify_elsewhere, poll, pollfd};
use crate::lease::{cause_msg, CancelToken, Error, LostLock, LostReason};
use crate::protocol::session::{self as wire, Answer, HoldMode, Req, Status, Welcome};

/// Longest pause between two rounds of the address list.
const ROUND_PAUSE_MAX: Duration = Duration::from_millis(500);
/// The first pause between two rounds.
const ROUND_PAUSE_MIN: Duration = Duration::from_millis(10);

/// One hold a Resume's answer listed.
#[derive(Debug, Clone)]
struct Held {
    mode: HoldMode,
    ttl_left: Option<Duration>,
}

/// Why one attempt did not resume the session.
enum Attempt {
    /// Try another address (connecting failed, the connection failed
    /// before the welcome, `not leader`), maybe the one it named.
    Retry(String, Option<(SocketAddr, String)>),
    /// The session is over (`unknown session`, a refusal, a protocol
    /// break, a close on this side).
    Over(End),
}

/// A successful attempt.
struct Resumed {
    sock: Stream,
    addr: SocketAddr,
    held: HashMap<HoldId, Held>,
    welcome: Welcome,
    /// Just before the Resume was written: a listed lease's TTL left
    /// counts from here on this side (the server measured it later).
    sent_at: Instant,
}

/// Resumes the session whose connection failed for `why`, within its
/// keep-alive counted from `last_rx` (when the last frame arrived).
/// `Ok`: resumed, with when its welcome arrived; `Err`: the session is
/// over, and why.
pub(super) fn resume(sh: &Shared, why: End, last_rx: Instant) -> Result<Instant, End> {
    let old = {
        let mut st = sh.lock();
        if let Some(end) = &st.fail {
            return Err(end.clone());
        }
        st.resuming = true;
        Arc::clone(&st.sock)
    };
    // Writers of that connection fail from now on, instead of writing
    // into it what the resume may write again.
    let _ = old.shutdown(Shutdown::Both);
    drop(old);
    let r = &sh.resumer;
    let k = sh.timing.keepalive;
    let window_end = last_rx + k;
    let id = sh.welcome.session_id;
    r.event(|| {
        format!(
            "session {id:#x}: the connection failed ({}); resuming it within {:?}",
            why.1,
            window_end.saturating_duration_since(Instant::now())
        )
    });
    let resumed = match attempts(sh, window_end) {
        Ok(resumed) => resumed,
        Err(Attempt::Over(end)) => {
            r.event(|| format!("session {id:#x}: {}", end.1));
            return Err(end);
        }
        Err(Attempt::Retry(last, _)) => {
            let end = (
                why.0,
                cause_msg(format!(
                    "the session could not be resumed within its keep-alive ({k:?}) after its \
                     connection failed ({}); last attempt: {last}",
                    why.1
                )),
            );
            r.event(|| format!("session {id:#x}: {}", end.1));
            return Err(end);
        }
    };
    let at = Instant::now();
    let addr = resumed.addr;
    let summary = reconcile(sh, resumed)?;
    // The line first: whoever sees the count (`Session::resumes`) sees
    // the line too.
    r.event(|| format!("session {id:#x}: resumed on {addr} ({summary})"));
    sh.resumes.fetch_add(1, Ordering::Relaxed);
    Ok(at)
}

/// Walks the address list (each `not leader` hint first) until one
/// resumes the session, the session is over, or `window_end` passes.
fn attempts(sh: &Shared, window_end: Instant) -> Result<Resumed, Attempt> {
    let r = &sh.resumer;
    // Hints add host names to verify: a copy of the dialer for this resume.
    let mut dial = r.dial.clone();
    let mut queue: VecDeque<SocketAddr> = r.addrs.iter().copied().collect();
    let mut tried: HashSet<SocketAddr> = HashSet::new();
    let mut pause = ROUND_PAUSE_MIN;
    let mut last = String::from("no attempt was made");
    loop {
        if let Some(end) = &sh.lock().fail {
            return Err(Attempt::Over(end.clone()));
        }
        let now = Instant::now();
        if now >= window_end {
            return Err(Attempt::Retry(last, None));
        }
        // Leases keep expiring on this side while the session has no
        // connection.
        sh.expire(now);
        let Some(addr) = queue.pop_front() else {
            // A round without success: pause (a close wakes it), then the
            // whole list again.
            let mut fds = [pollfd(sh.wake.fd())];
            if let Err(e) = poll(&mut fds, (now + pause).min(window_end)) {
                return Err(Attempt::Over((
                    LostReason::ConnectionLost,
                    cause_msg(format!("poll failed: {e}")),
                )));
            }
            if fds[0].revents != 0 {
                sh.wake.drain();
            }
            pause = (pause * 2).min(ROUND_PAUSE_MAX);
            tried.clear();
            queue.extend(r.addrs.iter().copied());
            continue;
        };
        tried.insert(addr);
        // One attempt may not outlast the window, nor a lease's
        // client-side expiry (which the loop above then reports on time).
        let mut until = (now + r.connect_timeout).min(window_end);
        if let Some(x) = next_expiry(sh, now) {
            until = until.min(x);
        }
        match attempt(sh, &dial, addr, until) {
            Ok(resumed) => return Ok(resumed),
            Err(Attempt::Retry(why, hint)) => {
                last = format!("{addr}: {why}");
                if let Some((h, host)) = hint.filter(|(h, _)| !tried.contains(h)) {
                    // A Resume carries the session id (and the auth token):
                    // it goes to a hinted address only over TLS (the
                    // certificate must name the hint's host) or when the
                    // user listed that address.
                    if dial.is_tls() || r.addrs.contains(&h) {
                        dial.name(h, &host);
                        queue.retain(|a| *a != h);
                        queue.push_front(h);
                    } else {
                        last = format!(
                            "{last}; not following the hint to {h}: it is not among the \
                             session's addresses and the connection is not TLS (the Resume \
                             would carry the session id and auth token to a server nobody \
                             verified): list it, or connect with TLS"
                        );
                        r.event(|| format!("session {:#x}: {last}", sh.welcome.session_id));
                    }
                }
            }
            Err(over) => return Err(over),
        }
    }
}

/// The earliest client-side expiry of a lease still held, if after `now`.
fn next_expiry(sh: &Shared, now: Instant) -> Option<Instant> {
    let st = sh.lock();
    st.holds
        .values()
        .filter(|e| e.ended.is_none())
        .filter_map(|e| e.expires_at)
        .filter(|x| *x > now)
        .min()
}

/// One Resume on `addr`, bounded by `until`.
fn attempt(sh: &Shared, dial: &Dial, addr: SocketAddr, until: Instant) -> Result<Resumed, Attempt> {
    let retry = |e: &dyn fmt::Display| Attempt::Retry(e.to_string(), None);
    let left = until.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(retry(&"no time left for an attempt"));
    }
    let sock = dial.connect(&addr, left).map_err(|e| retry(&e))?;
    let _ = sock.set_nodelay(true);
    let mut frame = Vec::with_capacity(wire::HEADER + 10 + sh.resumer.auth.len());
    wire::encode(
        PING_RID,
        &Req::Resume {
            version: wire::VERSION,
            session_id: sh.welcome.session_id,
            auth: &sh.resumer.auth,
        },
        &mut frame,
    );
    let left = until
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    sock.set_write_timeout(Some(left)).map_err(|e| retry(&e))?;
    let sent_at = Instant::now();
    (&sock).write_all(&frame).map_err(|e| retry(&e))?;
    read_welcome(sh, sock, addr, until, sent_at)
}

/// The end of the session: why it could not be resumed.
fn not_resumed(why: String) -> Attempt {
    Attempt::Over((
        LostReason::ConnectionLost,
        cause_msg(format!("the session could not be resumed: {why}")),
    ))
}

/// The answer to the Resume written on `sock` at `sent_at`: the holds it
/// lists, then the welcome; or why not, by `until`.
fn read_welcome(
    sh: &Shared,
    sock: Stream,
    addr: SocketAddr,
    until: Instant,
    sent_at: Instant,
) -> Result<Resumed, Attempt> {
    let retry = |e: &dyn fmt::Display| Attempt::Retry(e.to_string(), None);
    let mut held = HashMap::new();
    let mut buf: Vec<u8> = Vec::with_capacity(256);
    let mut chunk = [0u8; 4096];
    loop {
        // Each whole answer first.
        loop {
            if let Some(&first) = buf.first() {
                if first != wire::KIND_REPLY && first != wire::KIND_HELD {
                    // A server without Resume answers the Locking-Center `-`.
                    return Err(not_resumed(format!(
                        "unknown session ({addr} answered {first:#04x}: a server without \
                         Resume)"
                    )));
                }
            }
            match wire::decode_answer(&buf, Some(PING_RID)) {
                Ok(None) => break,
                Ok(Some((answer, used))) => {
                    buf.drain(..used);
                    if let Some(welcome) = resume_answer(sh, addr, answer, &mut held)? {
                        return Ok(Resumed {
                            sock,
                            addr,
                            held,
                            welcome,
                            sent_at,
                        });
                    }
                }
                Err(e) => {
                    return Err(not_resumed(format!(
                        "{addr} broke the session protocol: {e}"
                    )))
                }
            }
        }
        // Then wait for more, or a close on this side.
        let mut fds = [pollfd(sock.as_raw_fd()), pollfd(sh.wake.fd())];
        let wait_until = if sock.buffered() {
            Instant::now()
        } else {
            until
        };
        poll(&mut fds, wait_until).map_err(|e| retry(&e))?;
        if fds[1].revents != 0 {
            sh.wake.drain();
            if let Some(end) = &sh.lock().fail {
                return Err(Attempt::Over(end.clone()));
            }
        }
        if fds[0].revents == 0 && !sock.buffered() {
            if Instant::now() >= until {
                return Err(retry(&"no answer to the Resume in time"));
            }
            continue;
        }
        match (&sock).read(&mut chunk) {
            Ok(0) => return Err(retry(&"the connection closed before the welcome")),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                ) => {}
            Err(e) => return Err(retry(&e)),
        }
    }
}

/// One answer to a Resume: a hold it lists goes into `held`; the welcome
/// (`Some`) ends the answer; anything else ends the attempt.
fn resume_answer(
    sh: &Shared,
    addr: SocketAddr,
    answer: Answer,
    held: &mut HashMap<HoldId, Held>,
) -> Result<Option<Welcome>, Attempt> {
    match answer {
        Answer::Held {
            rid: PING_RID,
            key,
            token,
            hold,
            ttl_left_ms,
        } => {
            let ttl_left = ttl_left_ms.map(|ms| Duration::from_millis(ms.into()));
            held.insert(
                (key, token),
                Held {
                    mode: hold,
                    ttl_left,
                },
            );
        }
        Answer::Welcome { welcome, .. } => {
            if welcome.status != Status::Ok
                || welcome.version != wire::VERSION
                || welcome.session_id != sh.welcome.session_id
            {
                return Err(not_resumed(format!(
                    "{addr} broke the session protocol: its welcome names \
                     session {:#x}, version {}, status {}",
                    welcome.session_id,
                    welcome.version,
                    welcome.status.name()
                )));
            }
            return Ok(Some(welcome));
        }
        Answer::Refused {
            status: Status::NotLeader,
            detail,
            ..
        } => {
            let text = String::from_utf8_lossy(&detail).into_owned();
            let hint = text
                .parse::<SocketAddr>()
                .ok()
                .map(|a| (a, hint_host(&text)));
            return Err(Attempt::Retry(
                if text.is_empty() {
                    "not the leader".into()
                } else {
                    format!("not the leader (the leader is {text})")
                },
                hint,
            ));
        }
        Answer::Refused { status, .. } => {
            return Err(not_resumed(format!("{addr} refused it: {}", status.name())))
        }
        Answer::Reply {
            status: Status::UnknownSession,
            ..
        } => {
            return Err(not_resumed(format!(
                "unknown session ({addr} does not have it: it ended, was \
                 never replicated, or its resume window passed)"
            )))
        }
        Answer::Reply { status, .. } => {
            return Err(not_resumed(format!("{addr} refused it: {}", status.name())))
        }
        other => {
            return Err(not_resumed(format!(
                "{addr} broke the session protocol: {other:?} before the \
                 welcome"
            )))
        }
    }
    Ok(None)
}

/// Counts for the resume's report.
#[derive(Default)]
struct Summary {
    kept: usize,
    lost: usize,
    granted: usize,
    again: usize,
    unknown: usize,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} holds kept, {} lost, {} acquires found granted, {} requests sent again",
            self.kept, self.lost, self.granted, self.again
        )?;
        if self.unknown > 0 {
            write!(
                f,
                ", {} listed holds this client does not know released",
                self.unknown
            )?;
        }
        Ok(())
    }
}

/// Makes the new connection the session's and settles the client's view
/// against the Held list (the module docs), then writes what is to be
/// written again and what waited, and lets callers write. `Err`: the
/// session was closed meanwhile.
fn reconcile(sh: &Shared, resumed: Resumed) -> Result<Summary, End> {
    let Resumed {
        sock,
        held,
        welcome,
        sent_at,
        ..
    } = resumed;
    let mut sum = Summary::default();
    let lost_ids = {
        let mut st = sh.lock();
        if let Some(end) = &st.fail {
            return Err(end.clone());
        }
        st.sock = Arc::new(sock);
        st.conn += 1;
        st.broke = None;
        st.resumable = welcome.flags & wire::FLAG_RESUMABLE != 0;
        st.modes = welcome.flags & wire::FLAG_MODES != 0;
        st.watch = welcome.flags & wire::FLAG_WATCH != 0;
        st.proclaim = welcome.flags & wire::FLAG_PROCLAIM != 0;
        let conn = st.conn;
        let lost_ids = settle_holds(&mut st, &held, sent_at, &mut sum);
        let mut known = known_tokens(&st);
        settle_in_flight(&mut st, &held, &mut known, conn, sent_at, &mut sum);
        release_unknown(&mut st, &held, &known, &mut sum);
        lost_ids
    };
    sh.changed.notify_all();

    // 4. The losses: the verdict, letting go, the handlers (elsewhere).
    let claims: Vec<_> = lost_ids
        .into_iter()
        .filter_map(|(id, lost)| sh.server_lost(&id, lost))
        .collect();
    notify_elsewhere(claims);

    write_again(sh);
    // Acquires written again may have cancel tokens and deadlines to watch.
    sh.wake.signal();
    Ok(sum)
}

/// Step 1 of [`reconcile`], the holds the client believes in: one listed
/// is kept (a lease's expiry rebased on the TTL left it was listed with),
/// one not listed is lost (returned, for step 4).
fn settle_holds(
    st: &mut State,
    held: &HashMap<HoldId, Held>,
    sent_at: Instant,
    sum: &mut Summary,
) -> Vec<(HoldId, LostLock)> {
    let mut lost: Vec<(HoldId, LostLock)> = Vec::new();
    for (id, e) in st.holds.iter_mut() {
        if e.ended.is_some() {
            continue;
        }
        match held.get(id) {
            Some(h) => {
                sum.kept += 1;
                if let (HoldMode::Lease, Some(left)) = (h.mode, h.ttl_left) {
                    e.expires_at = Some(sent_at + left);
                }
            }
            None => {
                sum.lost += 1;
                lost.push((
                    id.clone(),
                    LostLock::new(
                        e.key_text.clone(),
                        LostReason::ConnectionLost,
                        Some(cause_msg(format!(
                            "not kept across the failover: the resumed session does not list \
                             token {} (it expired, was reset, or was released by token \
                             elsewhere)",
                            id.1
                        ))),
                    ),
                ));
            }
        }
    }
    lost
}

/// Step 2 of [`reconcile`], the tokens the client knows: a listed one it
/// does not know is the grant of an Acquire in flight.
fn known_tokens(st: &State) -> HashSet<HoldId> {
    let mut known: HashSet<HoldId> = st.holds.keys().cloned().collect();
    for p in st.pending.values() {
        if let Op::Release(id) | Op::Extend(id) | Op::Proclaim(id) = &p.op {
            known.insert(id.clone());
        }
    }
    known
}

/// Step 3 of [`reconcile`], the requests in flight on an earlier
/// connection, oldest first: an Acquire whose grant is listed gets it, one
/// whose caller gave up is cancelled, and what is to be sent again waits
/// for step 5 (`conn: None`).
fn settle_in_flight(
    st: &mut State,
    held: &HashMap<HoldId, Held>,
    known: &mut HashSet<HoldId>,
    conn: u64,
    sent_at: Instant,
    sum: &mut Summary,
) {
    let mut in_flight: Vec<u32> = st
        .pending
        .iter()
        .filter(|(_, p)| p.answer.is_none() && p.conn.is_some_and(|c| c < conn))
        .map(|(rid, _)| *rid)
        .collect();
    in_flight.sort_unstable();
    let now = Instant::now();
    let mut grants: Vec<(HoldId, Entry)> = Vec::new();
    for rid in in_flight {
        let Some(p) = st.pending.get_mut(&rid) else {
            continue;
        };
        let local = |status: Status| Answered {
            status,
            token: 0,
            rebase: false,
        };
        match (&mut p.what, &p.op) {
            (What::Acquire(a), _) => {
                let found = held
                    .iter()
                    .filter(|(id, h)| id.0 == a.key && h.mode == a.mode && !known.contains(*id))
                    .map(|(id, h)| (id.clone(), h.ttl_left))
                    .min_by_key(|(id, _)| id.1);
                if let Some((id, ttl_left)) = found {
                    known.insert(id.clone());
                    let (entry, rebase) = Entry::granted(a, ttl_left.map(|left| sent_at + left));
                    p.answer = Some(Answered {
                        status: Status::Ok,
                        token: id.1,
                        rebase,
                    });
                    grants.push((id, entry));
                    sum.granted += 1;
                } else if let Some(why) = gave_up(a, now) {
                    a.cancelled.get_or_insert(why);
                    p.answer = Some(local(Status::Cancelled));
                } else {
                    p.conn = None;
                    sum.again += 1;
                }
            }
            (_, Op::Release(id)) => {
                if held.contains_key(id) {
                    p.conn = None;
                    sum.again += 1;
                } else if matches!(p.what, What::Ignore) {
                    st.pending.remove(&rid);
                } else {
                    p.answer = Some(local(Status::Ok));
                }
            }
            (_, Op::Extend(_) | Op::Proclaim(_)) => {
                p.conn = None;
                sum.again += 1;
            }
            (What::Call, Op::Ping) => p.answer = Some(local(Status::Ok)),
            // A Watch on the failed connection: the watch has ended (its
            // caller finds why in its channel); not sent again.
            (What::Call, Op::Watch) => {
                p.answer = Some(local(Status::Ok));
                if let Some(w) = st.watches.remove(&rid) {
                    let _ = w.send(super::watched::WatchItem::Ended(
                        "the connection failed while the watch was being set up; watch again"
                            .into(),
                    ));
                }
            }
            // A Cancel (its Acquire was settled above), or an answer
            // nobody waits for.
            _ => {
                st.pending.remove(&rid);
            }
        }
    }
    for (id, entry) in grants {
        st.holds.insert(id, entry);
    }
}

/// Listed holds no belief and no request here accounts for (a grant
/// whose Acquire's caller is gone): released by token, as the Python and
/// Go clients do, so that nobody waits on them until the session ends.
/// Written in step 5 of [`reconcile`]; nobody waits for the answer.
fn release_unknown(
    st: &mut State,
    held: &HashMap<HoldId, Held>,
    known: &HashSet<HoldId>,
    sum: &mut Summary,
) {
    let unknown: Vec<HoldId> = held
        .keys()
        .filter(|id| !known.contains(*id))
        .cloned()
        .collect();
    sum.unknown = unknown.len();
    for id in unknown {
        let rid = st.alloc_rid();
        let mut frame = Vec::new();
        wire::encode(
            rid,
            &Req::Release {
                token: id.1,
                key: &id.0,
            },
            &mut frame,
        );
        st.pending.insert(
            rid,
            Pending {
                what: What::Ignore,
                answer: None,
                frame,
                conn: None,
                op: Op::Release(id),
            },
        );
    }
}

/// Step 5 of [`reconcile`]: what is written again, then what waited,
/// until nothing waits; then callers write for themselves.
fn write_again(sh: &Shared) {
    loop {
        let (sock, due) = {
            let mut st = sh.lock();
            let conn = st.conn;
            let mut due: Vec<(u32, Vec<u8>)> = st
                .pending
                .iter_mut()
                .filter(|(_, p)| p.conn.is_none() && p.answer.is_none())
                .map(|(rid, p)| {
                    p.conn = Some(conn);
                    (*rid, p.frame.clone())
                })
                .collect();
            if due.is_empty() {
                st.resuming = false;
                break;
            }
            due.sort_unstable_by_key(|(rid, _)| *rid);
            (Arc::clone(&st.sock), due)
        };
        for (_, frame) in &due {
            if sh.write_frame(&sock, frame).is_err() {
                // The new connection failed already: the I/O thread reads
                // its end and resumes again; these are in flight on it.
                let _ = sock.shutdown(Shutdown::Both);
                break;
            }
        }
    }
}

/// The caller of a queued Acquire gave up (its cancel token, its deadline,
/// or a Cancel sent before the connection failed): the error it gets.
fn gave_up(a: &super::io::AcquireReq, now: Instant) -> Option<Error> {
    if a.cancelled.is_some() {
        return Some(Error::Cancelled);
    }
    if a.cancel.as_ref().is_some_and(CancelToken::is_cancelled) {
        return Some(Error::Cancelled);
    }
    a.deadline
        .filter(|d| now >= *d)
        .map(|_| Error::DeadlineExceeded)
}

/// The host part of a `not leader` hint (`HOST:PORT`, `[V6]:PORT`): the
/// name a TLS dial to it verifies.
pub(super) fn hint_host(hint: &str) -> String {
    let host = hint.rsplit_once(':').map_or(hint, |(h, _)| h);
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_string()
}
