//! Blocking client library for ringlock (and any Locking-Center server).
//!
//! std only: no async runtime, no io_uring. Each operation opens its own TCP
//! connection (docs/protocol.md); a granted lock keeps the connection it
//! was granted on so that its [`Guard`] can send Unlock on it later.
//!
//! ```no_run
//! use std::time::Duration;
//! use ringlock::client::{Client, RetryPolicy};
//!
//! # fn main() -> Result<(), ringlock::client::Error> {
//! let client = Client::builder("127.0.0.1:22119")
//!     .source("billing-worker")
//!     .io_timeout(Duration::from_secs(5))
//!     .retry(RetryPolicy::default())
//!     .build()?;
//! let mut guard = client.lock_timeout("nightly/reconcile", Duration::from_secs(10))?;
//! // ... critical section ...
//! guard.release()?; // or let it drop
//! # Ok(()) }
//! ```
//!
//! # Invariants (what the client promises)
//! - **A bad key never reaches the network**: empty keys, keys over 127
//!   bytes and sources over 127 bytes fail with [`Error::InvalidKey`] /
//!   [`Error::InvalidSource`] before any connection is opened.
//! - **Exact cancellation**: when a lock wait ends by deadline or
//!   [`CancelToken`], the client half-closes the connection
//!   (`shutdown(Write)`) and reads until EOF. The server withdraws a queued
//!   waiter when it sees the EOF and answers nothing. If a `+` was sent
//!   before that, the client reads it and honours it according to
//!   [`LateGrant`]: the grant is never leaked and never reported as failure.
//! - **Release exactly once**: [`Guard::release`] sends Unlock once and
//!   returns that result to every later call; dropping an unreleased guard
//!   releases it.
//! - **No silent infinite retry**: connection failures are retried with
//!   capped exponential backoff and jitter until [`RetryPolicy::max_elapsed`]
//!   (or the caller's deadline), then fail with [`Error::Unavailable`]. Only
//!   failures that provably had no effect are retried.
//!
//! # What the protocol cannot promise (the session's betrayals)
//! - The server does **not** release a held key when its holder
//!   disconnects. If the guard's connection broke, release reconnects and
//!   sends Unlock on a new connection. If the Unlock was sent and its answer
//!   lost, the outcome is ambiguous: the client asks the admin port (`KEYS`)
//!   whether the key is still held by its own connection endpoint and only
//!   then sends Unlock again. If that cannot be checked, release reports an
//!   error saying the key may still be held, instead of guessing: an Unlock
//!   sent blindly could free a lock that someone else was granted since.
//! - Unlock has no owner check (Locking-Center semantics). If an operator
//!   reset the key and someone else took it, a guard's release frees *their*
//!   lock. [`Guard::is_held`] lets a long critical section check that it still
//!   owns the key; fencing on the protected resource is the real defence.
//! - A server restart without a write-ahead log forgets every key, and the
//!   holders are not told. [`Guard::is_held`] detects that too.
//! - A process killed with SIGKILL (or a `panic = "abort"` build that panics)
//!   never runs the guard's drop: the key stays held until a reset.
//! - A lock wait is a long read on an idle connection. TCP keepalive (on by
//!   default, see [`ClientBuilder::tcp_keepalive`]) turns a silently dead
//!   path into an error instead of a wait that never ends.

mod addr;
mod conn;
mod error;
mod guard;
mod listing;
pub mod locate;
pub mod members;
mod retry;
pub mod session;
pub mod stream;
mod wire;

pub use crate::cancel::CancelToken;
/// One shard's replication state, as [`Client::cluster_status`] returns it.
pub use crate::protocol::status::{Follower as FollowerStatus, Role, ShardStatus};
pub use addr::ToServerAddrs;
pub use error::{Error, Result};
pub use guard::Guard;
pub use listing::KeyStream;
pub use retry::{RetryEvent, RetryPolicy};
pub use session::{Acquire, Hold, Session, SessionBuilder, Wait};
pub use wire::{KeyInfo, KEY_LEN_MAX, SOURCE_LEN_MAX};

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conn::Wake;
use listing::Listing;
use retry::{OnRetry, Streak};
use stream::{Dial, Stream};
use wire::{Action, Reply};

/// The default lock port (Locking-Center's).
pub const DEFAULT_PORT: u16 = 22119;

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

/// An address with the host name it was given by (TLS verifies it).
type Named = (SocketAddr, Option<String>);

/// Builds a [`Client`]. Created by [`Client::builder`].
#[derive(Debug)]
pub struct ClientBuilder {
    addrs: Result<Vec<Named>>,
    admin_addr: Option<Result<Vec<Named>>>,
    #[cfg(feature = "tls")]
    tls: Option<crate::tls::ClientTls>,
    source: Vec<u8>,
    connect_timeout: Duration,
    io_timeout: Duration,
    retry: RetryPolicy,
    keepalive: Option<Duration>,
    admin_auth: Option<Vec<u8>>,
    on_retry: Option<OnRetry>,
}

impl ClientBuilder {
    /// The source name sent with every Lock and TryLock (0..=127 bytes).
    /// Empty (the default) lets the server use the client's IP address.
    pub fn source(mut self, source: impl Into<Vec<u8>>) -> Self {
        self.source = source.into();
        self
    }

    /// The admin port's address, used by [`Client::keys`] and to resolve
    /// ambiguous outcomes. Default: each lock address's own, as its node
    /// tells (Locate, [`locate`]; a server without Locate: the lock port
    /// + 1). A host without a port gets port [`DEFAULT_PORT`] + 1.
    pub fn admin_addr(mut self, addr: impl ToServerAddrs) -> Self {
        self.admin_addr = Some(addr.to_named_server_addrs(DEFAULT_PORT + 1));
        self
    }

    /// Bound on establishing one TCP connection (default 3 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Bound on every read and write that should be answered at once:
    /// replies to everything but Lock, the EOF after a half-close, and the
    /// guard's Unlock (default 5 s). A Lock wait itself is bounded only by
    /// the caller's deadline.
    pub fn io_timeout(mut self, timeout: Duration) -> Self {
        self.io_timeout = timeout;
        self
    }

    /// How connection failures are retried (default [`RetryPolicy::default`]).
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// A handler called before each wait for another connection attempt
    /// (not for the last failure, which is returned as
    /// [`Error::Unavailable`]): to say that the client is retrying (the
    /// library prints nothing), or to give up early by returning `false`
    /// (e.g. on `ConnectionRefused` when nothing listens). It runs on the
    /// calling thread; keep it quick. Default: none (retry silently).
    pub fn on_retry(
        mut self,
        handler: impl Fn(&RetryEvent<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.on_retry = Some(OnRetry(Arc::new(handler)));
        self
    }

    /// The server's `--auth-token-file` secret: every admin command is
    /// preceded by `AUTH` (required when the server's admin port is not on
    /// loopback, accepted otherwise).
    pub fn admin_auth_token(mut self, token: impl Into<Vec<u8>>) -> Self {
        self.admin_auth = Some(token.into());
        self
    }

    /// Speaks TLS to the lock and admin ports (a server started with
    /// `--certs-dir`): the server's certificate must chain to the CA
    /// bundle of `tls` and name the host each address was given by (a
    /// [`SocketAddr`] is verified by its IP address); `tls`'s client
    /// certificate, if any, is presented (it stands for the admin auth
    /// token on a server that verifies it).
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: crate::tls::ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// TCP keepalive idle time on lock connections (default 15 s; `None`
    /// turns it off). A dead peer is detected about twice this long later.
    pub fn tcp_keepalive(mut self, idle: Option<Duration>) -> Self {
        self.keepalive = idle;
        self
    }

    /// Validates the source and the addresses (resolved when the builder
    /// was created). Opens no connection. A bad address is
    /// [`Error::InvalidAddress`].
    pub fn build(self) -> Result<Client> {
        wire::validate_source(&self.source)?;
        let named = self.addrs?;
        // Given, or found at the first admin command (`locate`).
        let admin_named = match self.admin_addr {
            Some(admin) => Some(admin?),
            None => None,
        };
        let addrs: Vec<SocketAddr> = named.iter().map(|(a, _)| *a).collect();
        let admin_addrs: Option<Vec<SocketAddr>> = admin_named
            .as_ref()
            .map(|n| n.iter().map(|(a, _)| *a).collect());
        let admin_named = admin_named.unwrap_or_default();
        #[cfg(feature = "tls")]
        let dial = match self.tls {
            Some(tls) => Dial::tls(
                tls,
                named
                    .into_iter()
                    .chain(admin_named)
                    .filter_map(|(a, host)| host.map(|h| (a, h))),
            ),
            None => Dial::plain(),
        };
        #[cfg(not(feature = "tls"))]
        let dial = {
            drop((named, admin_named));
            Dial::plain()
        };
        let admin = admin_addrs.map(|addrs| locate::AdminCache {
            admin: Arc::new(locate::Admin {
                addrs,
                dial: dial.clone(),
            }),
            until: None,
        });
        Ok(Client {
            cfg: Arc::new(Config {
                addrs,
                admin: Mutex::new(admin),
                prefer: AtomicUsize::new(0),
                dial,
                source: self.source,
                connect_timeout: conn::nonzero(self.connect_timeout),
                io_timeout: conn::nonzero(self.io_timeout),
                retry: self.retry,
                keepalive: self.keepalive,
                admin_auth: self.admin_auth,
                on_retry: self.on_retry,
            }),
        })
    }
}

#[derive(Debug)]
struct Config {
    addrs: Vec<SocketAddr>,
    /// The admin addresses: given to the builder, or found (`locate`).
    admin: Mutex<Option<locate::AdminCache>>,
    /// The index of the lock address that served last (tried first).
    prefer: AtomicUsize,
    /// Plaintext, or TLS with the names to verify.
    dial: Dial,
    source: Vec<u8>,
    connect_timeout: Duration,
    io_timeout: Duration,
    retry: RetryPolicy,
    keepalive: Option<Duration>,
    admin_auth: Option<Vec<u8>>,
    on_retry: Option<OnRetry>,
}

/// A handle to one lock server. Cheap to clone; clones share configuration.
/// Holds no connection of its own, so it is `Send + Sync` and can be shared
/// between threads freely.
#[derive(Debug, Clone)]
pub struct Client {
    cfg: Arc<Config>,
}

/// How a request/answer exchange failed.
enum UnaryFail {
    /// Nothing ambiguous: the request had no effect or the error is final.
    Final(Error),
    /// The request was sent but its answer was lost: it may have been applied.
    Ambiguous {
        err: io::Error,
        endpoint: Option<SocketAddr>,
    },
}

impl Client {
    /// Starts building a client for the lock server at `addr`: `"HOST"`
    /// (port [`DEFAULT_PORT`]), `"HOST:PORT"`, `"[IPV6]:PORT"`, a
    /// [`SocketAddr`] or anything else that is [`ToServerAddrs`]. A host
    /// name is resolved here, once; [`build`](ClientBuilder::build) reports a
    /// bad address as [`Error::InvalidAddress`].
    pub fn builder(addr: impl ToServerAddrs) -> ClientBuilder {
        ClientBuilder {
            addrs: addr.to_named_server_addrs(DEFAULT_PORT),
            admin_addr: None,
            #[cfg(feature = "tls")]
            tls: None,
            source: Vec::new(),
            connect_timeout: Duration::from_secs(3),
            io_timeout: Duration::from_secs(5),
            retry: RetryPolicy::default(),
            keepalive: Some(Duration::from_secs(15)),
            admin_auth: None,
            on_retry: None,
        }
    }

    /// A client for `addr` with default options.
    pub fn new(addr: impl ToServerAddrs) -> Result<Client> {
        Self::builder(addr).build()
    }

    /// The lock port address(es).
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.cfg.addrs
    }

    /// The admin port address(es): those given to the builder, else
    /// those found from the lock addresses once an admin command ran
    /// (before that, and from a server without Locate, each lock port + 1).
    /// Asks no server.
    pub fn admin_addrs(&self) -> Vec<SocketAddr> {
        self.admin_known()
    }

    /// The source name sent with Lock and TryLock.
    pub fn source(&self) -> &[u8] {
        &self.cfg.source
    }

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

    /// Releases `key`, whoever holds it (the protocol has no owner check).
    /// Unlocking a free key succeeds. Prefer [`Guard::release`].
    pub fn unlock(&self, key: impl AsRef<[u8]>) -> Result<()> {
        let key = key.as_ref();
        wire::validate_key(key)?;
        self.simple(&wire::encode(Action::Unlock, key, None), "unlock")
    }

    /// Waits until `key` is free, by locking and unlocking it.
    pub fn wait(&self, key: impl AsRef<[u8]>) -> Result<()> {
        self.lock(key)?.release()
    }

    /// Operator tool: releases `key`'s holder; waiters keep their places.
    pub fn reset_by_key(&self, key: impl AsRef<[u8]>) -> Result<()> {
        let key = key.as_ref();
        wire::validate_key(key)?;
        self.simple(&wire::encode(Action::ResetByKey, key, None), "reset")
    }

    /// Operator tool: releases every key held by `source` and refuses its
    /// queued Locks. An empty source means "my own IP address".
    pub fn reset_by_source(&self, source: impl AsRef<[u8]>) -> Result<()> {
        let source = source.as_ref();
        wire::validate_source(source)?;
        self.simple(
            &wire::encode(Action::ResetBySource, source, None),
            "reset by source",
        )
    }

    /// The replication state of every shard of the node behind the admin
    /// address (`CLST`, a ringlockd extension), as that node sees it: a
    /// follower answers too. `Ok(None)`: the server is not a cluster
    /// member (it runs without `--peers`). A server that does not know
    /// `CLST` closes the connection: an [`Error::Io`] of kind
    /// `UnexpectedEof`, not retried. Read-only, so other failures are
    /// retried per the retry policy.
    pub fn cluster_status(&self) -> Result<Option<Vec<ShardStatus>>> {
        self.admin_records(b"CLST", "a server without CLST?", |b| {
            Ok(crate::protocol::status::decode(b)?.map(|(r, _)| r))
        })
    }

    /// Asks the serving leader behind the admin address to hand every
    /// shard's leadership to node `to` (0: its most caught-up follower),
    /// `XFER` (a ringlockd extension). `Ok` once every shard started the
    /// transfer (watch [`cluster_status`](Self::cluster_status) for the new
    /// leader); [`Error::Refused`] from a node that does not serve, or when
    /// `to` is not a peer. Not retried: it changes the cluster.
    pub fn transfer_leader(&self, to: u32) -> Result<()> {
        let mut streak = Streak::new(RetryPolicy::none());
        let (mut conn, _) = self.connect_admin(&mut streak)?;
        let mut cmd = b"XFER".to_vec();
        cmd.extend_from_slice(&to.to_le_bytes());
        self.send_admin(&mut conn, &cmd).map_err(Error::io)?;
        conn.set_read_timeout(Some(self.cfg.io_timeout))
            .map_err(Error::io)?;
        let mut b = [0u8; 1];
        if self.cfg.admin_auth.is_some() {
            conn.read_exact(&mut b).map_err(Error::io)?;
            if b[0] != b'+' {
                return Err(Error::Refused);
            }
        }
        match conn.read_exact(&mut b) {
            Ok(()) if b[0] == b'+' => Ok(()),
            Ok(()) => Err(Error::Refused),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(Error::Refused),
            Err(e) => Err(Error::io(e)),
        }
    }

    /// Compare-and-reset (`RSTK`, a ringlockd extension): resets each key
    /// only if its holder still has the given token (as listed by
    /// [`keyx`](Self::keyx)), so a reset can never hit a holder that took
    /// the key after the listing. Returns, per entry, whether it was reset.
    /// Safe to retry: a token is reset at most once.
    pub fn reset_if(&self, entries: &[(&[u8], u64)]) -> Result<Vec<bool>> {
        for (k, _) in entries {
            wire::validate_key(k)?;
        }
        let mut req = Vec::new();
        crate::protocol::admin::encode_rstk(entries, &mut req);
        let mut streak = Streak::new(self.cfg.retry);
        loop {
            let (mut conn, peer) = self.connect_admin(&mut streak)?;
            let err = match self.send_admin(&mut conn, &req) {
                Ok(()) => {
                    let mut out = vec![0u8; entries.len() + 1];
                    match self.read_admin(&mut conn, &mut out) {
                        Ok(()) => {
                            if out.last() != Some(&b'+')
                                || out.iter().any(|b| !matches!(b, b'+' | b'#'))
                            {
                                return Err(Error::Protocol(format!(
                                    "RSTK answered {:?}",
                                    String::from_utf8_lossy(&out)
                                )));
                            }
                            return Ok(out[..entries.len()].iter().map(|&b| b == b'+').collect());
                        }
                        Err(Error::Io(e)) => io::Error::new(e.kind(), e.to_string()),
                        Err(other) => return Err(other),
                    }
                }
                Err(e) => e,
            };
            self.backoff(&mut streak, err, peer, None, None)?;
        }
    }

    /// Sends an admin command, preceded by `AUTH` when a token is set.
    fn send_admin(&self, conn: &mut Stream, cmd: &[u8]) -> io::Result<()> {
        match &self.cfg.admin_auth {
            Some(t) => {
                let mut b = Vec::with_capacity(5 + t.len() + cmd.len());
                b.extend_from_slice(b"AUTH");
                b.push(t.len() as u8);
                b.extend_from_slice(t);
                b.extend_from_slice(cmd);
                self.send(conn, &b)
            }
            None => self.send(conn, cmd),
        }
    }

    /// Reads exactly `out.len()` answer bytes (after AUTH's `+`).
    fn read_admin(&self, conn: &mut Stream, out: &mut [u8]) -> Result<()> {
        conn.set_read_timeout(Some(self.cfg.io_timeout))
            .map_err(Error::io)?;
        if self.cfg.admin_auth.is_some() {
            let mut b = [0u8; 1];
            conn.read_exact(&mut b).map_err(Error::io)?;
            if b[0] != b'+' {
                return Err(Error::Refused);
            }
        }
        conn.read_exact(out).map_err(Error::io)
    }

    /// Whether the server's table shows `key` held by the connection whose
    /// local address was `endpoint`. One attempt, no retries: used to settle
    /// ambiguous outcomes.
    fn held_by(&self, key: &[u8], endpoint: Option<SocketAddr>) -> Result<bool> {
        let endpoint = endpoint
            .ok_or_else(|| Error::Protocol("no local endpoint to compare".into()))?
            .to_string();
        let (keys, _) = self.open_listing(&mut Streak::new(RetryPolicy::none()), Listing::Keys)?;
        for k in keys {
            let k = k?;
            if k.key == key && k.endpoint == endpoint {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// A request answered by `+` or `-` whose outcome is not settled by a
    /// retry when the answer is lost.
    fn simple(&self, frame: &[u8], what: &str) -> Result<()> {
        match self.unary(frame) {
            Ok((Reply::Ok, _)) => Ok(()),
            Ok((Reply::Refused, _)) => Err(Error::Refused),
            Ok((Reply::Held, _)) => Err(Error::Protocol(format!("`#` answered to {what}"))),
            Err(UnaryFail::Final(err)) => Err(err),
            Err(UnaryFail::Ambiguous { err, .. }) => {
                Err(Error::io_context(&err, &format!("{what} outcome unknown")))
            }
        }
    }

    /// One request, one answer byte, on a fresh connection. Retries only
    /// what provably had no effect (connecting, an incomplete frame).
    fn unary(&self, frame: &[u8]) -> Result<(Reply, Stream), UnaryFail> {
        let mut streak = Streak::new(self.cfg.retry);
        let mut walk = locate::Walk::default();
        loop {
            let (mut conn, peer) = self
                .connect_lock(&mut walk, &mut streak, None, None)
                .map_err(UnaryFail::Final)?;
            if let Err(err) = self.send(&mut conn, frame) {
                drop(conn);
                self.backoff(&mut streak, err, peer, None, None)
                    .map_err(UnaryFail::Final)?;
                continue;
            }
            let endpoint = conn.local_addr().ok();
            return match conn::read_byte(&mut conn, self.cfg.io_timeout) {
                Ok(Some(byte)) => match wire::decode_reply(byte) {
                    Ok(Reply::Refused) => {
                        // A cluster's follower refuses: the next address
                        // (or the answer, `-`).
                        match self.refused_by(&mut walk, peer, &mut streak, None, None) {
                            Ok(()) => continue,
                            Err(Error::Refused) => Ok((Reply::Refused, conn)),
                            Err(e) => Err(UnaryFail::Final(e)),
                        }
                    }
                    Ok(reply) => {
                        self.served_by(peer);
                        Ok((reply, conn))
                    }
                    Err(e) => Err(UnaryFail::Final(e)),
                },
                Ok(None) => Err(UnaryFail::Ambiguous {
                    err: io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed before the answer",
                    ),
                    endpoint,
                }),
                Err(err) => Err(UnaryFail::Ambiguous { err, endpoint }),
            };
        }
    }

    /// Writes a whole frame within the I/O timeout.
    fn send(&self, conn: &mut Stream, frame: &[u8]) -> io::Result<()> {
        conn.set_write_timeout(Some(self.cfg.io_timeout))?;
        conn.write_all(frame)
    }

    /// Connects to the first address that answers, retrying per the policy
    /// (each retry of the streak starts one address further, so that an
    /// address that accepts but fails the command does not take every
    /// attempt). Returns the connection and the address it reached (for
    /// errors).
    fn connect_with(
        &self,
        dial: &Dial,
        addrs: &[SocketAddr],
        streak: &mut Streak,
        deadline: Option<Instant>,
        cancel: Option<&CancelToken>,
    ) -> Result<(Stream, SocketAddr)> {
        loop {
            let mut last = None;
            let start = streak.attempts as usize % addrs.len().max(1);
            for addr in addrs[start..].iter().chain(&addrs[..start]) {
                let timeout = match deadline {
                    Some(d) => conn::nonzero(
                        d.saturating_duration_since(Instant::now())
                            .min(self.cfg.connect_timeout),
                    ),
                    None => self.cfg.connect_timeout,
                };
                match dial.connect(addr, timeout) {
                    Ok(conn) => {
                        // Requests are tiny and latency-bound.
                        let _ = conn.set_nodelay(true);
                        streak.connected = true;
                        return Ok((conn, *addr));
                    }
                    // A certificate that fails verification fails the
                    // next attempt the same way: said at once.
                    Err(err) if dial.is_tls() && err.kind() == io::ErrorKind::InvalidData => {
                        return Err(Error::Unavailable {
                            addr: *addr,
                            attempts: streak.attempts + 1,
                            last: Arc::new(err),
                        })
                    }
                    Err(err) => last = Some((*addr, err)),
                }
            }
            let (addr, err) = last.expect("a resolved client has at least one address");
            self.backoff(streak, err, addr, deadline, cancel)?;
        }
    }

    /// Records a failure; sleeps before the next attempt or gives up.
    fn backoff(
        &self,
        streak: &mut Streak,
        err: io::Error,
        addr: SocketAddr,
        deadline: Option<Instant>,
        cancel: Option<&CancelToken>,
    ) -> Result<()> {
        let now = Instant::now();
        match streak.failed_and_asked(now, deadline, addr, &err, self.cfg.on_retry.as_ref()) {
            Some(delay) => {
                if conn::pause(delay, cancel) {
                    Ok(())
                } else {
                    Err(Error::Cancelled)
                }
            }
            None => Err(Error::Unavailable {
                addr,
                attempts: streak.attempts,
                last: Arc::new(err),
            }),
        }
    }

    /// Sends Unlock for a guard: on its own connection when that is still
    /// usable, otherwise (or when the answer is lost) as described in the
    /// module docs.
    fn release_key(
        &self,
        key: &[u8],
        conn: Option<Stream>,
        endpoint: Option<SocketAddr>,
    ) -> Result<()> {
        let frame = wire::encode(Action::Unlock, key, None);
        let mut ambiguous: Option<io::Error> = None;
        if let Some(mut conn) = conn {
            if conn::looks_alive(conn.tcp()) && self.send(&mut conn, &frame).is_ok() {
                match conn::read_byte(&mut conn, self.cfg.io_timeout) {
                    Ok(Some(byte)) => return unit_reply(byte, "unlock"),
                    Ok(None) => {
                        ambiguous = Some(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "connection closed before the unlock answer",
                        ))
                    }
                    Err(err) => ambiguous = Some(err),
                }
            }
            // Otherwise the frame never (completely) left: no effect, so a
            // new connection may send it.
        }
        // At most two more sends, each only after the table said "ours".
        for _ in 0..2 {
            if let Some(err) = ambiguous.take() {
                match self.held_by(key, endpoint) {
                    Ok(false) => return Ok(()),
                    Ok(true) => {}
                    Err(_) => {
                        return Err(Error::io_context(
                            &err,
                            "unlock outcome unknown (the key may still be held)",
                        ))
                    }
                }
            }
            match self.unary(&frame) {
                Ok((reply, _)) => {
                    return match reply {
                        Reply::Ok => Ok(()),
                        Reply::Refused => Err(Error::Refused),
                        Reply::Held => Err(Error::Protocol("`#` answered to unlock".into())),
                    }
                }
                Err(UnaryFail::Final(err)) => return Err(err),
                Err(UnaryFail::Ambiguous { err, .. }) => ambiguous = Some(err),
            }
        }
        let err = ambiguous.expect("loop exits early unless the answer was lost");
        Err(Error::io_context(
            &err,
            "unlock outcome unknown (the key may still be held)",
        ))
    }
}

fn unit_reply(byte: u8, what: &str) -> Result<()> {
    match wire::decode_reply(byte)? {
        Reply::Ok => Ok(()),
        Reply::Refused => Err(Error::Refused),
        Reply::Held => Err(Error::Protocol(format!("`#` answered to {what}"))),
    }
}
