//! One Acquire of a [`Session`](super::Session), once its arguments are
//! checked: the request written, its answer read, and the lease a grant
//! becomes (released at once if the caller gave up while it was on its
//! way, extended once first if it came late).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::hold::{self, SessionHold};
use super::io::{AcquireReq, Answered, Handle, Op, Shared, Waited, What};
use crate::lease::{cause_msg, Error, Lease, LockOptions, LostHandler, Result};
use crate::protocol::session::{self as wire, Access, HoldMode, Req, Status};

/// An Acquire as checked: what goes on the wire, and what its lease keeps.
pub(super) struct Asked<'a> {
    pub(super) key: &'a [u8],
    /// `key` as text, for the lease and the errors.
    pub(super) key_text: String,
    pub(super) mode: HoldMode,
    /// A lease's TTL as sent (whole milliseconds).
    pub(super) ttl: Option<Duration>,
    /// How long it may wait in the key's queue (0: a try).
    pub(super) wait_ms: u32,
    pub(super) access: Access,
}

/// Writes Acquire `a` under `source` (the session's when `None`), with
/// the caller's cancel token and deadline for the I/O thread to watch: its
/// request id, and the instant it was sent.
pub(super) fn send(
    shared: &Shared,
    a: &Asked<'_>,
    source: Option<&[u8]>,
    opts: &LockOptions,
) -> Result<(u32, Instant)> {
    let ttl_ms = a.ttl.map_or(0, |t| t.as_millis() as u32);
    let source = source.unwrap_or(&shared.source[..]);
    let sent_at = Instant::now();
    let req = AcquireReq {
        key: a.key.to_vec(),
        key_text: a.key_text.clone(),
        mode: a.mode,
        ttl: a.ttl,
        sent_at,
        // A try never queues, so there is nothing to cancel.
        cancel: (a.wait_ms != 0)
            .then(|| opts.cancel_token().cloned())
            .flatten(),
        deadline: (a.wait_ms != 0).then(|| opts.deadline_at()).flatten(),
        cancelled: None,
    };
    let rid = shared
        .send(What::Acquire(Box::new(req)), Op::Acquire, |rid, out| {
            wire::encode(
                rid,
                &Req::Acquire {
                    hold: a.mode,
                    ttl_ms,
                    wait_ms: a.wait_ms,
                    key: a.key,
                    source,
                    access: a.access,
                },
                out,
            )
        })
        .map_err(|(reason, cause)| {
            Error::Unavailable(cause_msg(format!(
                "the session has ended ({reason}): {cause}"
            )))
        })?;
    Ok((rid, sent_at))
}

/// Waits for the answer to Acquire `a` (request `rid`): its grant, with
/// the caller's error when the I/O thread sent a Cancel for it; any other
/// answer, or none, as the caller's error.
pub(super) fn answer(
    shared: &Shared,
    rid: u32,
    a: &Asked<'_>,
) -> Result<(Answered, Option<Error>)> {
    let failed = |why: String| Error::Failed {
        key: a.key_text.clone(),
        cause: cause_msg(why),
    };
    let (answer, cancelled) = match shared.wait(rid, None) {
        Waited::Answer(answer, What::Acquire(req)) => (answer, req.cancelled),
        Waited::Answer(answer, _) => (answer, None),
        Waited::Dead((reason, cause)) => {
            return Err(failed(format!(
                "the session ended before the answer ({reason}: {cause}); {}",
                hold::after_the_session(a.mode)
            )))
        }
        Waited::NoAnswer => return Err(failed("no answer (internal error)".into())),
    };
    match answer.status {
        Status::Ok => Ok((answer, cancelled)),
        Status::TimedOut | Status::Busy => Err(Error::Timeout),
        Status::Cancelled => Err(cancelled.unwrap_or(Error::Cancelled)),
        Status::Limit => Err(failed(
            "the server's limit (--max-keys or --max-waiters) refused it".into(),
        )),
        Status::ModeMismatch => Err(Error::ModeMismatch {
            key: a.key_text.clone(),
            slots: a.access.slots(),
        }),
        // Sent while the server offered modes, answered by one that
        // does not (the session was resumed there).
        Status::Invalid if a.access != Access::Exclusive && !shared.lock().modes => {
            Err(no_modes(&a.key_text, a.access, true))
        }
        s => Err(failed(format!("the server answered {}", s.name()))),
    }
}

/// The lease granted to Acquire `a` (`answer`; sent at `sent_at`), with
/// the session's and the options' lost-lock handlers, attached to the
/// session `h`. A grant that raced the caller's cancellation (`cancelled`,
/// or `opts` says so now) is released instead; a late one is extended
/// once before it is handed out.
pub(super) fn hand_out(
    h: &Arc<Handle>,
    a: Asked<'_>,
    answer: Answered,
    cancelled: Option<Error>,
    sent_at: Instant,
    opts: &LockOptions,
) -> Result<Lease> {
    let shared = &h.shared;
    let handlers: Vec<LostHandler> = match &cancelled {
        // Released right below: no handler is owed for it.
        Some(_) => Vec::new(),
        None => shared
            .on_lost
            .iter()
            .chain(opts.lost_handler())
            .cloned()
            .collect(),
    };
    let id = (a.key.to_vec(), answer.token);
    let hold = Arc::new(SessionHold {
        session: Arc::clone(h),
        id: id.clone(),
        key_text: a.key_text.clone(),
        mode: a.mode,
        ttl: a.ttl,
        access: a.access,
    });
    // The same instant the I/O thread counts from.
    let expires_at = a.ttl.map(|t| sent_at + t);
    let lease = Lease::new(a.key_text, Some(answer.token), expires_at, hold, handlers);
    shared.attach(&id, lease.watch()).map_err(Error::Lost)?;
    // The caller gave up while the grant was on its way (the Cancel
    // found nothing queued): release it, so a cancelled caller never
    // holds the key.
    let stop = cancelled.or_else(|| opts.check().err());
    if let Some(stop) = stop {
        return match lease.release() {
            Ok(()) => Err(stop),
            Err(e) => Err(e),
        };
    }
    if answer.rebase {
        // Granted after a wait that used up most of `sent + ttl`: one
        // Extend gives this side an expiry it can count from.
        if let Err(e) = lease.extend() {
            let _ = lease.release();
            return Err(e);
        }
    }
    Ok(lease)
}

/// The refusal of a shared or semaphore request by a server without the
/// modes flag: found before sending, or (`sent`) in the `invalid` answer of
/// a request that a resume carried to such a server.
pub(super) fn no_modes(key: &str, access: Access, sent: bool) -> Error {
    let asked = match access {
        Access::Semaphore(n) => format!("a semaphore hold (one of {n} slots)"),
        _ => "a shared hold".into(),
    };
    let outcome = if sent {
        "the session was resumed on it while the request was in flight, and it answered \
         invalid; nothing is held"
    } else {
        "nothing was sent"
    };
    Error::Unsupported(format!(
        "{asked} of {key:?}: this server does not offer shared or semaphore holds (its welcome \
         lacks the modes flag: a ringlockd older than lock modes holds keys exclusively \
         only); {outcome}"
    ))
}
