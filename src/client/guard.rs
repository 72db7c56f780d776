//! Taking a lock: [`Client::lock`] and its variants, with their
//! [`LockOptions`], and the lock guard they return.
//!
//! The guard owns a granted key until it is released, exactly once.
//! Invariant: `released` is `None` while the key is held on the caller's
//! behalf and `Some(result)` forever after the one Unlock attempt; the
//! connection is consumed by that attempt, so no code path can send a second
//! Unlock for the same grant.

use std::fmt;
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::time::{Duration, Instant};

use super::conn::{self, Wake};
use super::error::{Error, Result};
use super::locate;
use super::lock_client::{Client, UnaryFail};
use super::retry::Streak;
use super::stream::Stream;
use super::wire::{self, Action, Reply};
use crate::cancel::CancelToken;

/// What to do with a grant that raced a lock wait's deadline or cancellation:
/// the server sent `+` before it saw the client's half-close.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LateGrant {
    /// Return the guard: the caller holds the lock after all.
    #[default]
    Keep,
    /// Release the lock at once and report the timeout/cancellation.
    Release,
}

/// Options for [`Client::lock_with`].
#[derive(Debug, Clone, Default)]
pub struct LockOptions {
    deadline: Option<Instant>,
    late_grant: LateGrant,
    cancel: Option<CancelToken>,
}

impl LockOptions {
    /// Wait without a deadline, keep late grants, no cancel token.
    pub fn new() -> Self {
        Self::default()
    }

    /// Give up (exactly, see [`LateGrant`]) at `deadline`.
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Give up `timeout` from now.
    pub fn timeout(self, timeout: Duration) -> Self {
        self.deadline(Instant::now() + timeout)
    }

    /// What to do with a grant that races the deadline or cancellation.
    pub fn late_grant(mut self, late_grant: LateGrant) -> Self {
        self.late_grant = late_grant;
        self
    }

    /// Stop waiting when `token` is cancelled.
    pub fn cancel(mut self, token: CancelToken) -> Self {
        self.cancel = Some(token);
        self
    }
}

impl Client {
    /// Blocks until `key` is granted. Connection failures are retried per
    /// the retry policy (a wait that lost its connection re-queues at the
    /// back of the line).
    pub fn lock(&self, key: impl AsRef<[u8]>) -> Result<Guard> {
        self.lock_with(key, &LockOptions::new())
    }

    /// Like [`lock`](Self::lock) but gives up after `timeout` with
    /// [`Error::Timeout`], cancelling exactly. A grant that races the
    /// deadline is kept ([`LateGrant::Keep`]).
    pub fn lock_timeout(&self, key: impl AsRef<[u8]>, timeout: Duration) -> Result<Guard> {
        self.lock_with(key, &LockOptions::new().timeout(timeout))
    }

    /// Lock with explicit [`LockOptions`]: deadline, late-grant policy and
    /// cancel token.
    pub fn lock_with(&self, key: impl AsRef<[u8]>, opts: &LockOptions) -> Result<Guard> {
        let key = key.as_ref();
        wire::validate_key(key)?;
        let frame = wire::encode(Action::Lock, key, Some(&self.cfg.source));
        let cancel = opts.cancel.as_ref();
        let mut streak = Streak::new(self.cfg.retry);
        let mut walk = locate::Walk::default();
        loop {
            if cancel.is_some_and(CancelToken::is_cancelled) {
                return Err(Error::Cancelled);
            }
            if opts.deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::Timeout);
            }
            let (mut conn, peer) =
                self.connect_lock(&mut walk, &mut streak, opts.deadline, cancel)?;
            let endpoint = conn.local_addr().ok();
            if let Some(idle) = self.cfg.keepalive {
                // Best effort: a wait without keepalive still works.
                let _ = conn::set_keepalive(conn.tcp(), idle);
            }
            if let Err(err) = self.send(&mut conn, &frame) {
                // An incomplete frame has no effect; closing withdraws a
                // complete one that was queued.
                drop(conn);
                self.backoff(&mut streak, err, peer, opts.deadline, cancel)?;
                continue;
            }
            let sent_at = Instant::now();
            let wake = conn::wait_readable(&conn, opts.deadline, cancel).map_err(Error::io)?;
            let reason = match wake {
                Wake::Readable => match conn::read_byte(&mut conn, self.cfg.io_timeout) {
                    Ok(Some(byte)) => {
                        return match wire::decode_reply(byte)? {
                            Reply::Ok => {
                                self.served_by(peer);
                                Ok(Guard::new(self.clone(), key, Some(conn), endpoint))
                            }
                            Reply::Refused => {
                                // A cluster's follower refuses: the next
                                // address (or the answer).
                                drop(conn);
                                self.refused_by(
                                    &mut walk,
                                    peer,
                                    &mut streak,
                                    opts.deadline,
                                    cancel,
                                )?;
                                continue;
                            }
                            Reply::Held => Err(Error::Protocol("`#` answered to Lock".into())),
                        };
                    }
                    Ok(None) => {
                        // EOF without `+`: the server dropped us while we were
                        // queued (a `+` would have arrived before the FIN).
                        // Re-queue under the retry policy.
                        self.requeue(&mut streak, sent_at, None, peer, opts, cancel)?;
                        continue;
                    }
                    Err(err) => {
                        // A reset can discard a `+` in flight: ask before
                        // re-queueing.
                        if let Ok(true) = self.held_by(key, endpoint) {
                            return Ok(Guard::new(self.clone(), key, None, endpoint));
                        }
                        self.requeue(&mut streak, sent_at, Some(err), peer, opts, cancel)?;
                        continue;
                    }
                },
                Wake::Deadline => Error::Timeout,
                Wake::Cancelled => Error::Cancelled,
            };
            return self.cancel_exact(conn, key, endpoint, reason, opts.late_grant);
        }
    }

    fn requeue(
        &self,
        streak: &mut Streak,
        sent_at: Instant,
        err: Option<io::Error>,
        peer: SocketAddr,
        opts: &LockOptions,
        cancel: Option<&CancelToken>,
    ) -> Result<()> {
        // A connection that waited a while proved the server healthy; a
        // server that drops us at once must not reset the budget.
        if sent_at.elapsed() >= self.cfg.retry.max_backoff {
            streak.reset();
        }
        let err = err.unwrap_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "server closed the connection while the lock was queued",
            )
        });
        self.backoff(streak, err, peer, opts.deadline, cancel)
    }

    /// The exact-cancellation protocol: half-close, then read until EOF.
    fn cancel_exact(
        &self,
        mut conn: Stream,
        key: &[u8],
        endpoint: Option<SocketAddr>,
        reason: Error,
        late_grant: LateGrant,
    ) -> Result<Guard> {
        // The EOF tells the server to withdraw the waiter. If shutdown fails
        // the connection is already broken, which withdraws it just the same.
        let _ = conn.shutdown(Shutdown::Write);
        let granted = match conn::read_byte(&mut conn, self.cfg.io_timeout) {
            Ok(None) => false,
            Ok(Some(byte)) => match wire::decode_reply(byte)? {
                Reply::Ok => true,
                Reply::Refused => return Err(Error::Refused),
                Reply::Held => return Err(Error::Protocol("`#` answered to Lock".into())),
            },
            Err(err) => {
                // No clean EOF in time: a `+` may have been sent and lost.
                // Only the server's table can tell.
                drop(conn);
                match self.held_by(key, endpoint) {
                    Ok(held) => held,
                    Err(_) => {
                        return Err(Error::io_context(
                            &err,
                            "lock cancellation outcome unknown (the key may be held)",
                        ))
                    }
                }
            }
        };
        if !granted {
            return Err(reason);
        }
        // The write half is closed: the guard unlocks on a new connection.
        let mut guard = Guard::new(self.clone(), key, None, endpoint);
        match late_grant {
            LateGrant::Keep => Ok(guard),
            LateGrant::Release => guard.release().and(Err(reason)),
        }
    }

    /// Takes `key` only if it is free right now. `Ok(None)` means someone
    /// else holds it (or is queued ahead), which is not an error.
    pub fn try_lock(&self, key: impl AsRef<[u8]>) -> Result<Option<Guard>> {
        let key = key.as_ref();
        wire::validate_key(key)?;
        let frame = wire::encode(Action::TryLock, key, Some(&self.cfg.source));
        match self.unary(&frame) {
            Ok((Reply::Ok, conn)) => {
                let endpoint = conn.local_addr().ok();
                Ok(Some(Guard::new(self.clone(), key, Some(conn), endpoint)))
            }
            Ok((Reply::Held, _)) => Ok(None),
            Ok((Reply::Refused, _)) => Err(Error::Refused),
            Err(UnaryFail::Final(err)) => Err(err),
            Err(UnaryFail::Ambiguous { err, endpoint }) => match self.held_by(key, endpoint) {
                Ok(true) => Ok(Some(Guard::new(self.clone(), key, None, endpoint))),
                Ok(false) => Err(Error::io(err)),
                Err(_) => Err(Error::io_context(
                    &err,
                    "try-lock outcome unknown (the key may be held)",
                )),
            },
        }
    }
}

/// A held lock. Dropping it releases the key (errors are then ignored; call
/// [`release`](Guard::release) to see them).
///
/// The guard keeps the connection the lock was granted on and sends Unlock
/// on it. If that connection broke meanwhile, release reconnects (see the
/// module docs for how an ambiguous outcome is settled).
#[must_use = "dropping the guard releases the lock at once"]
pub struct Guard {
    client: Client,
    key: Vec<u8>,
    conn: Option<Stream>,
    endpoint: Option<SocketAddr>,
    released: Option<Result<()>>,
}

impl Guard {
    pub(crate) fn new(
        client: Client,
        key: &[u8],
        conn: Option<Stream>,
        endpoint: Option<SocketAddr>,
    ) -> Guard {
        Guard {
            client,
            key: key.to_vec(),
            conn,
            endpoint,
            released: None,
        }
    }

    /// The locked key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The local address of the connection the lock was granted on: the
    /// `endpoint` the admin port's `KEYS` lists for this holder.
    pub fn endpoint(&self) -> Option<SocketAddr> {
        self.endpoint
    }

    /// True until [`release`](Self::release) has run.
    pub fn is_released(&self) -> bool {
        self.released.is_some()
    }

    /// Asks the admin port whether the server still lists this key as held
    /// by this guard's connection. `false` means the lock was lost (a reset,
    /// or a server restart without a log) and the critical section is no
    /// longer protected.
    pub fn is_held(&self) -> Result<bool> {
        if self.released.is_some() {
            return Ok(false);
        }
        self.client.held_by(&self.key, self.endpoint)
    }

    /// Releases the key. Only the first call sends Unlock; every later call
    /// returns the first call's result without network traffic.
    pub fn release(&mut self) -> Result<()> {
        if let Some(result) = &self.released {
            return result.clone();
        }
        let result = self
            .client
            .release_key(&self.key, self.conn.take(), self.endpoint);
        self.released = Some(result.clone());
        result
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; `release()` exposes them.
        let _ = self.release();
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("endpoint", &self.endpoint)
            .field("released", &self.released)
            .finish()
    }
}
