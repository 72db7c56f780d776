//! The I/O thread's loop over one connection: what it waits for, the
//! answers and pushes it reads, the keep-alive Pings, the Cancels of
//! callers that gave up ([`super::io`] has who owns what). When a
//! connection of a resumable session fails, [`Shared::serve`] resumes the
//! session on a new one ([`super::resume`]) and serves that.

use crate::client::stream::Stream;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Instant;

use super::io::{Answered, End, Entry, Op, Pending, Shared, What, PING_RID};
use super::resume;
use super::sys::{notify_elsewhere, poll, pollfd};
use super::watched::{Holder, WatchEvent};
use crate::lease::{cause_msg, CancelToken, Error, LostLock, LostReason};
use crate::protocol::session::{self as wire, Answer, LostWhy, Req, Status};

/// Why the I/O loop left a connection.
pub(super) enum Stop {
    /// The session is over: closed by this side, a protocol break, a Ping
    /// answered with an error.
    End(End),
    /// The connection failed (end of stream, an error, a hung connection,
    /// `not leader`): a resumable session is resumed, another one is over.
    Failed(End),
}

impl Shared {
    /// The I/O loop; returns why the session ended. A connection that
    /// fails under a resumable session is resumed ([`resume::resume`]) and
    /// served again.
    pub(super) fn serve(&self) -> End {
        // The welcome was just read.
        let mut last_rx = Instant::now();
        loop {
            let (sock, conn) = {
                let st = self.lock();
                (Arc::clone(&st.sock), st.conn)
            };
            let why = match self.serve_conn(&sock, conn, &mut last_rx) {
                Stop::End(end) => return end,
                Stop::Failed(why) => why,
            };
            // Watches live on one connection: a resume does not carry them.
            self.end_watches(&format!(
                "the connection failed ({}): watches are not carried over to a new connection; \
                 watch again to read the holders anew",
                why.1
            ));
            {
                let st = self.lock();
                if let Some(end) = &st.fail {
                    return end.clone();
                }
                if !st.resumable {
                    return why;
                }
            }
            match resume::resume(self, why, last_rx) {
                Ok(at) => last_rx = at,
                Err(end) => return end,
            }
        }
    }

    /// Serves connection `conn` until it fails or the session ends;
    /// `last_rx` is when the last whole frame arrived from the server.
    fn serve_conn(&self, sock: &Stream, conn: u64, last_rx: &mut Instant) -> Stop {
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
            let timer = ping_deadline.unwrap_or(next_ping);
            let mut wake_at = match self.what_to_wait_for(sock, conn, &mut fds, timer) {
                Ok(at) => at,
                Err(stop) => return stop,
            };

            // 2. Wait (not at all while TLS has plaintext already
            //    decrypted: the socket may have nothing more to say).
            if sock.buffered() {
                wake_at = Instant::now();
            }
            if let Err(e) = poll(&mut fds, wake_at) {
                return Stop::End((
                    LostReason::ConnectionLost,
                    cause_msg(format!("poll failed: {e}")),
                ));
            }
            if fds[1].revents != 0 {
                self.wake.drain();
            }

            // 3. Read what arrived, answer by answer.
            if fds[0].revents != 0 || sock.buffered() {
                if let Some(stop) = self.read_answers(
                    sock,
                    conn,
                    &mut chunk,
                    &mut buf,
                    last_rx,
                    &mut ping_deadline,
                ) {
                    return stop;
                }
            }

            // 4. The keep-alive: a Ping when one is due, or the failure of
            //    one unanswered.
            let now = Instant::now();
            if let Err(stop) =
                self.keep_alive(sock, now, &mut next_ping, &mut ping_deadline, &mut frame)
            {
                return stop;
            }

            // 5. Cancels for callers that gave up waiting.
            if let Err(why) = self.send_cancels(sock, now, &mut frame) {
                return Stop::Failed(why);
            }

            // 6. Leases whose TTL passed on this side.
            self.expire(now);
        }
    }

    /// Fills `fds` with what the loop waits for (the socket, a wake-up,
    /// the cancel tokens of queued Acquires) and returns when it must wake
    /// at the latest: the keep-alive's `timer`, a queued Acquire's
    /// deadline, a lease's expiry. `Err`: the session's end or the
    /// connection's failure, recorded by another thread.
    fn what_to_wait_for(
        &self,
        sock: &Stream,
        conn: u64,
        fds: &mut Vec<libc::pollfd>,
        timer: Instant,
    ) -> Result<Instant, Stop> {
        let mut wake_at = timer;
        fds.clear();
        fds.push(pollfd(sock.as_raw_fd()));
        fds.push(pollfd(self.wake.fd()));
        let mut st = self.lock();
        if let Some(end) = &st.fail {
            return Err(Stop::End(end.clone()));
        }
        if let Some((_, why)) = st.broke.take_if(|(c, _)| *c == conn) {
            return Err(Stop::Failed(why));
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
        Ok(wake_at)
    }

    /// Reads what the socket has (through `chunk`) into `buf` and handles
    /// each whole answer in it ([`dispatch`](Self::dispatch)), keeping a
    /// partial one for the next read; `Some` when the connection or the
    /// session is over.
    fn read_answers(
        &self,
        sock: &Stream,
        conn: u64,
        chunk: &mut [u8],
        buf: &mut Vec<u8>,
        last_rx: &mut Instant,
        ping_deadline: &mut Option<Instant>,
    ) -> Option<Stop> {
        match (&*sock).read(chunk) {
            Ok(0) => return Some(self.end_of_stream(conn, None)),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                let mut at = 0;
                loop {
                    match wire::decode_answer(&buf[at..], None) {
                        Ok(Some((answer, used))) => {
                            at += used;
                            *last_rx = Instant::now();
                            if let Some(stop) = self.dispatch(answer, ping_deadline) {
                                return Some(stop);
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            return Some(Stop::End((
                                LostReason::ConnectionLost,
                                cause_msg(format!("the server broke the session protocol: {e}")),
                            )))
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
            Err(e) => return Some(self.end_of_stream(conn, Some(e))),
        }
        None
    }

    /// The keep-alive: a Ping when one is due (the next one scheduled), or
    /// the connection's failure when the last one went unanswered past the
    /// ping timeout. Its deadline counts from when the Ping was due, not
    /// from when it was written, so a slow write or a late wake-up shortens
    /// the wait and never stretches it.
    fn keep_alive(
        &self,
        sock: &Stream,
        now: Instant,
        next_ping: &mut Instant,
        ping_deadline: &mut Option<Instant>,
        frame: &mut Vec<u8>,
    ) -> Result<(), Stop> {
        let t = self.timing;
        match *ping_deadline {
            Some(deadline) if now >= deadline => {
                return Err(Stop::Failed((
                    LostReason::KeepAliveTimedOut,
                    cause_msg(format!(
                        "no answer to a ping within {:?} (ping every {:?}, server \
                         keep-alive {:?}): the connection hangs",
                        t.ping_timeout, t.interval, t.keepalive
                    )),
                )))
            }
            Some(_) => {}
            None if now >= *next_ping => {
                *ping_deadline = Some(*next_ping + t.ping_timeout);
                *next_ping = (*next_ping + t.interval).max(now);
                frame.clear();
                wire::encode(PING_RID, &Req::Ping, frame);
                if let Err(e) = self.write_frame(sock, frame) {
                    return Err(Stop::Failed((
                        LostReason::ConnectionLost,
                        cause_msg(format!("sending a ping failed: {e}")),
                    )));
                }
            }
            None => {}
        }
        Ok(())
    }

    fn end_of_stream(&self, conn: u64, err: Option<io::Error>) -> Stop {
        let mut st = self.lock();
        if let Some(end) = st.fail.clone() {
            return Stop::End(end);
        }
        // A writer saw it fail first (and shut it down).
        if let Some((_, why)) = st.broke.take_if(|(c, _)| *c == conn) {
            return Stop::Failed(why);
        }
        Stop::Failed(match err {
            None => (
                LostReason::ConnectionLost,
                cause_msg("the server closed the connection"),
            ),
            Some(e) => (
                LostReason::ConnectionLost,
                cause_msg(format!("the connection failed: {e}")),
            ),
        })
    }

    fn dispatch(&self, answer: Answer, ping_deadline: &mut Option<Instant>) -> Option<Stop> {
        match answer {
            Answer::Reply {
                rid: PING_RID,
                status,
                ..
            } => {
                if ping_deadline.take().is_some() && status != Status::Ok {
                    return Some(Stop::End((
                        LostReason::KeepAliveFailed,
                        cause_msg(format!("the server answered a ping with {}", status.name())),
                    )));
                }
            }
            Answer::Reply {
                rid, status, token, ..
            } => self.answered(rid, status, token),
            Answer::Event {
                rid,
                kind,
                token,
                hold,
                access,
                key: _,
                source,
            } => self.watch_event(
                rid,
                WatchEvent {
                    kind,
                    holder: Holder {
                        token,
                        hold: hold.into(),
                        access,
                        source,
                    },
                },
            ),
            // A kind of Event of a later server: skipped (docs/protocol.md).
            Answer::OtherEvent { .. } => {}
            Answer::Held { .. } => {
                return Some(Stop::End((
                    LostReason::ConnectionLost,
                    cause_msg("the server sent a Held frame outside a Resume"),
                )));
            }
            Answer::Lost { key, token, why } => self.pushed_lost(key, token, why),
            Answer::Welcome { .. } => {
                return Some(Stop::End((
                    LostReason::ConnectionLost,
                    cause_msg("the server broke the session protocol: a second hello reply"),
                )))
            }
            Answer::Refused { status, detail, .. } => return Some(refused(status, &detail)),
        }
        None
    }

    /// The answer `status` (and `token`) to request `rid`, handed to its
    /// caller; a grant becomes a hold at once.
    fn answered(&self, rid: u32, status: Status, token: u64) {
        let mut st = self.lock();
        let Some(p) = st.pending.get_mut(&rid) else {
            return; // an answer nobody waits for
        };
        let mut rebase = false;
        let grant = match &p.what {
            What::Ignore => {
                st.pending.remove(&rid);
                return;
            }
            What::Acquire(a) if status == Status::Ok => {
                // The server's TTL started at the grant, which the
                // client cannot see; `sent_at + ttl` is safe, but after
                // a wait in the queue it may be (nearly) over. Then the
                // caller extends first, and this side's expiry counts
                // from that Extend.
                let (entry, late) = Entry::granted(a, a.ttl.map(|ttl| a.sent_at + ttl));
                rebase = late;
                Some(((a.key.clone(), token), entry))
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

    /// A Lost push: the server took hold `token` of `key` away.
    fn pushed_lost(&self, key: Vec<u8>, token: u64, why: LostWhy) {
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

    fn send_cancels(&self, sock: &Stream, now: Instant, frame: &mut Vec<u8>) -> Result<(), End> {
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
                frame.clear();
                wire::encode(rid, &Req::Cancel { target, key: &key }, frame);
                let conn = Some(st.conn);
                st.pending.insert(
                    rid,
                    Pending {
                        what: What::Ignore,
                        answer: None,
                        frame: frame.clone(),
                        conn,
                        op: Op::Cancel,
                    },
                );
                due.push(std::mem::take(frame));
            }
        }
        for bytes in due {
            if let Err(e) = self.write_frame(sock, &bytes) {
                return Err((
                    LostReason::ConnectionLost,
                    cause_msg(format!("sending a cancel failed: {e}")),
                ));
            }
        }
        Ok(())
    }
}

/// What a Reply of a status with detail means on an open session. `not
/// leader`: this server gives the session's connection up (it closes it);
/// a replicated session lives on at the new leader (resumed), another one
/// is over. Any other: the session is over.
fn refused(status: Status, detail: &[u8]) -> Stop {
    if status == Status::NotLeader {
        return Stop::Failed((
            LostReason::ConnectionLost,
            cause_msg(format!(
                "the server answered not leader{}",
                if detail.is_empty() {
                    String::new()
                } else {
                    format!(" (the leader is {})", String::from_utf8_lossy(detail))
                }
            )),
        ));
    }
    Stop::End((
        LostReason::ConnectionLost,
        cause_msg(format!(
            "the server refused the session: {} {}",
            status.name(),
            String::from_utf8_lossy(detail)
        )),
    ))
}
