//! One granted lock of a session: what [`lease::Hold`] asks of a backend.
//!
//! `lease` guarantees that `release` runs once, never concurrently with
//! itself; this file makes it send at most one Release and return within
//! the session's release timeout. Neither method ever waits for the I/O
//! thread to do anything but read, so both may be called from a lost-lock
//! handler, on any thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::io::{Ended, Handle, HoldId, HoldNow, Op, Waited, What};
use crate::lease::{self, cause_msg, Error, LostLock, LostReason, Result};
use crate::protocol::session::{self as wire, Access, HoldMode, Req, Status};

pub(super) struct SessionHold {
    pub(super) session: Arc<Handle>,
    pub(super) id: HoldId,
    pub(super) key_text: String,
    pub(super) mode: HoldMode,
    /// A lease's TTL as sent (whole milliseconds).
    pub(super) ttl: Option<Duration>,
    /// As granted: the Acquire's own (a resume lists holds without it,
    /// and keeps the access they were granted with).
    pub(super) access: Access,
}

/// What becomes of a hold whose session ended before it was released.
pub(super) fn after_the_session(mode: HoldMode) -> &'static str {
    match mode {
        HoldMode::Session => {
            "the server frees a session hold when it ends the session (at once when it sees the \
             connection close, at its keep-alive deadline otherwise)"
        }
        HoldMode::Lease => "the lease stays held until its TTL passes",
        HoldMode::Persistent => {
            "a persistent hold stays held until it is released by token or reset"
        }
    }
}

impl SessionHold {
    fn token(&self) -> u64 {
        self.id.1
    }

    fn unreleased(&self, why: String) -> Error {
        Error::Unreleased {
            key: self.key_text.clone(),
            cause: cause_msg(why),
        }
    }

    fn lost_by_end(&self, (reason, cause): super::io::End) -> Error {
        Error::Lost(LostLock::new(self.key_text.clone(), reason, Some(cause)))
    }

    /// The server says the token is not (or no longer) the key's: the
    /// verdict, letting go, the handlers (here, on the caller's thread).
    fn found_gone(&self, status: Status, what: &str) -> Error {
        let lost = LostLock::new(
            self.key_text.clone(),
            LostReason::NotHeld,
            Some(cause_msg(format!(
                "{what} answered {}: token {} is not the key's current one (it expired, was reset \
                 or released)",
                status.name(),
                self.token()
            ))),
        );
        if let Some(p) = self.session.shared.server_lost(&self.id, lost.clone()) {
            p.notify();
        }
        Error::Lost(lost)
    }

    /// One request whose answer proves the hold alive: a Ping for session
    /// and persistent holds, an Extend for a lease.
    fn prove(&self) -> Result<Option<Instant>> {
        let sh = &self.session.shared;
        let key = &self.id.0[..];
        let sent_at = Instant::now();
        let rid = match (self.mode, self.ttl) {
            (HoldMode::Lease, Some(ttl)) => {
                sh.send(What::Call, Op::Extend(self.id.clone()), |rid, out| {
                    let ttl_ms = u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX - 1);
                    wire::encode(
                        rid,
                        &Req::Extend {
                            token: self.token(),
                            ttl_ms,
                            key,
                        },
                        out,
                    )
                })
            }
            _ => sh.send(What::Call, Op::Ping, |rid, out| {
                wire::encode(rid, &Req::Ping, out)
            }),
        }
        .map_err(|end| self.lost_by_end(end))?;
        // No bound of its own: a connection that hangs ends the session
        // within ping interval + ping timeout, which answers this too.
        let answer = match sh.wait(rid, None) {
            Waited::Answer(a, _) => a,
            Waited::Dead(end) => return Err(self.lost_by_end(end)),
            Waited::NoAnswer => {
                return Err(Error::Failed {
                    key: self.key_text.clone(),
                    cause: cause_msg("no answer (internal error: an unbounded wait gave up)"),
                })
            }
        };
        match (answer.status, self.ttl) {
            (Status::Ok, Some(ttl)) if self.mode == HoldMode::Lease => {
                let expires_at = sent_at + ttl;
                sh.extended(&self.id, expires_at).map_err(Error::Lost)?;
                Ok(Some(expires_at))
            }
            (Status::Ok, _) => match sh.hold_now(&self.id) {
                HoldNow::Ended(ended) => Err(Error::Lost(ended.lost().clone())),
                HoldNow::Dead(end) => Err(self.lost_by_end(end)),
                HoldNow::Alive | HoldNow::Gone => Ok(None),
            },
            (s @ (Status::Stale | Status::NotOwner), _) => Err(self.found_gone(s, "extend")),
            (s, _) => Err(Error::Failed {
                key: self.key_text.clone(),
                cause: cause_msg(format!("the server answered {}", s.name())),
            }),
        }
    }
}

impl lease::Hold for SessionHold {
    fn release(&self) -> Result<()> {
        let sh = &self.session.shared;
        let deadline = Instant::now() + sh.release_timeout;
        match sh.take_hold(&self.id) {
            HoldNow::Dead((reason, cause)) => {
                return Err(self.unreleased(format!(
                    "the session ended before the release could be sent ({reason}: {cause}); {}",
                    after_the_session(self.mode)
                )))
            }
            // The server freed it already: a Release would change nothing.
            HoldNow::Ended(Ended::Server(_)) | HoldNow::Gone => return Ok(()),
            HoldNow::Ended(Ended::Local(_)) | HoldNow::Alive => {}
        }
        let key = &self.id.0[..];
        let token = self.token();
        let rid = sh
            .send(What::Call, Op::Release(self.id.clone()), |rid, out| {
                wire::encode(rid, &Req::Release { token, key }, out)
            })
            .map_err(|(reason, cause)| {
                self.unreleased(format!(
                    "the session ended before the release could be sent ({reason}: {cause}); {}",
                    after_the_session(self.mode)
                ))
            })?;
        match sh.wait(rid, Some(deadline)) {
            Waited::Answer(a, _) => match a.status {
                Status::Ok => Ok(()),
                s @ (Status::Stale | Status::NotOwner) => Err(Error::Lost(LostLock::new(
                    self.key_text.clone(),
                    LostReason::NotHeld,
                    Some(cause_msg(format!(
                        "release answered {}: token {token} is not the key's current one (it \
                         expired, was reset or released)",
                        s.name()
                    ))),
                ))),
                s => Err(self.unreleased(format!("the server answered {}", s.name()))),
            },
            Waited::Dead((reason, cause)) => Err(self.unreleased(format!(
                "the session ended before the release was answered ({reason}: {cause}); {}",
                after_the_session(self.mode)
            ))),
            Waited::NoAnswer => Err(self.unreleased(format!(
                "no answer within the release timeout ({:?})",
                sh.release_timeout
            ))),
        }
    }

    fn extend(&self) -> Result<Option<Instant>> {
        match self.session.shared.hold_now(&self.id) {
            HoldNow::Alive => self.prove(),
            HoldNow::Ended(ended) => Err(Error::Lost(ended.lost().clone())),
            HoldNow::Dead(end) => Err(self.lost_by_end(end)),
            HoldNow::Gone => Err(Error::Released),
        }
    }

    fn session_id(&self) -> Option<u64> {
        Some(self.session.shared.welcome.session_id)
    }

    /// The session's current connection (a resume replaces it).
    fn connection_fd(&self) -> Option<std::os::fd::RawFd> {
        self.session.shared.connection_fd()
    }

    fn access(&self) -> Access {
        self.access
    }
}
