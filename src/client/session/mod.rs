//! [`Session`]: the lock API ([`crate::lease`]) over one `ringlockd`
//! session connection, with fencing tokens, session holds and leases.
//!
//! ```no_run
//! use std::time::Duration;
//! use ringlock::client::{Acquire, Hold, Session, Wait};
//! use ringlock::lease::{Error, LockOptions};
//!
//! # fn write_with_fence(_token: u64) {}
//! # fn main() -> Result<(), Error> {
//! let session = Session::builder("127.0.0.1")     // HOST means HOST:22119
//!     .source("billing-worker")
//!     .keepalive(Duration::from_secs(3))          // the server may clamp it
//!     .on_lost(|_lease, lost| eprintln!("{lost}")) // every lease of this session
//!     .connect()?;
//!
//! // A session hold (the default): freed the moment this session ends.
//! let lease = session.lock("nightly/reconcile", Duration::from_secs(10))?;
//! write_with_fence(lease.token().expect("sessions have tokens"));
//! lease.release()?;
//!
//! // A lease: freed when 30 s pass without an extend, even if the session lives.
//! let opts = LockOptions::new().on_lost(|_lease, lost| eprintln!("stop: {lost}"));
//! let lease = session.acquire(
//!     "cache/rebuild",
//!     Acquire { hold: Hold::Lease(Duration::from_secs(30)), wait: Wait::Try, ..Acquire::default() },
//!     &opts,
//! )?;
//! lease.extend()?;   // 30 s more, counted from now
//! lease.release()?;
//! # Ok(()) }
//! ```
//!
//! # One connection, one I/O thread
//! A session is one TCP connection to the lock port (one at a time: a
//! [replicated](#resuming-a-replicated-session) session may move to
//! another), opened with a Hello
//! (`docs/protocol.md`, "Sessions"). Every request carries a request id, so
//! any number of threads may wait on the same session at once, and a Ping
//! is never stuck behind a queued Acquire. One background thread reads
//! every answer and every Lost push, sends the keep-alive Pings and the
//! Cancels of waits whose caller gave up, and expires leases on the
//! client's clock. Callers write their own requests.
//!
//! # The keep-alive arithmetic
//! The Hello asks for a keep-alive deadline K ([`SessionBuilder::keepalive`];
//! the server clamps it to its bounds and answers the K it applies). The
//! server ends the session when nothing arrived from the client for K. The
//! client sends a Ping every interval I and presumes the session lost when
//! a Ping is not answered within the ping timeout T of when it was due,
//! with I = T = K/3, each capped ([`PING_INTERVAL_MAX`],
//! [`PING_TIMEOUT_MAX`]). If the last Ping the server received was due at
//! `d`, the server cannot end the session before `d + K`, while the client
//! has declared the loss by `d + I + T ≤ d + 2K/3`: the holder always
//! learns first, with K/3 to spare for its handler. A hung connection (open
//! but silent) is therefore a loss after at most I + T
//! ([`Session::detection_window`]), never a silent stall.
//!
//! # Holds and what ends them
//! | hold | freed by the server when | the client reports a loss when |
//! |---|---|---|
//! | [`Hold::Session`] (default) | the session ends: connection closed or failed, keep-alive deadline passed | the connection fails, a Ping times out, an operator reset is pushed |
//! | [`Hold::Lease`]`(ttl)` | `ttl` passes without [`Lease::extend`] | its TTL passes on the client's clock (counted from when the Acquire or Extend was *sent*, so never later than the server's; a lease granted after a wait that used up more than half of that is extended once before it is handed out), a Lost push, or the session's end |
//! | [`Hold::Persistent`] | it is released by token or reset (Locking-Center semantics) | the session's end (the client can no longer release it) |
//!
//! A lease and a persistent hold outlive the session on the server; this
//! client does not open a new session behind the caller's back, so it
//! reports them lost when its session ends (their release then says what
//! stays held).
//!
//! # Resuming a replicated session
//! A cluster's serving leader replicates a session when it can (its
//! welcome has the resumable flag: [`Session::is_resumable`]). Then a
//! failed connection (end of stream, an error, a Ping unanswered within
//! the ping timeout, a `not leader` answer) does not end the session: the
//! I/O thread takes it over on a new connection with a Resume
//! (`docs/protocol.md`, "Resuming a session (cluster mode)"), trying the
//! builder's addresses in turn and the leader a `not leader` answer
//! names first, for as long as the session's keep-alive K, counted from
//! the last frame received from the server, has not passed. The answer
//! lists the holds the session still has, and settles what the client
//! believed:
//! - a hold that is listed is kept: no loss, its [`Lease`] goes on (a
//!   lease's client-side expiry counts the TTL left it was listed with
//!   from when the Resume was sent);
//! - a hold that is not listed is lost, as for a Lost push
//!   ([`LostReason::ConnectionLost`], "not kept across the failover");
//! - an Acquire in flight whose key is listed with a new token was
//!   granted: the caller gets that grant; otherwise it is sent again (it
//!   queues at the back, and its `wait_ms` starts again), unless its
//!   caller gave up meanwhile (then it is cancelled, as a Cancel would);
//! - a Release in flight whose hold is still listed is sent again; one
//!   whose hold is not listed happened; an Extend in flight is sent again.
//!
//! Requests made during the resume wait for it (and fail as usual if the
//! session ends). A resume that is refused (`unknown session`: the new
//! leader does not have the session; `unauthorized`, ...) or that does
//! not succeed within K ends the session as any failure does: every hold
//! is lost. [`Session::resumes`] counts the successful resumes, and
//! [`SessionBuilder::on_resume`] reports each one in a line. A session
//! without the flag (a single node) ends at its first failed connection,
//! as before.
//!
//! # Shared and semaphore holds
//! [`Acquire::access`] asks for a shared hold ([`Access::Shared`]: any
//! number of holders at once, a reader lock) or for one of `n` slots
//! ([`Access::Semaphore`]`(n)`: at most `n` holders at once) instead of
//! the exclusive default; [`Session::lock_shared`],
//! [`Session::try_lock_shared`], [`Session::lock_permit`] and
//! [`Session::try_lock_permit`] take session holds of each. A key has one
//! FIFO queue across accesses: a request is granted when it is compatible
//! with the holders *and* nobody earlier waits, so a waiting exclusive
//! request is never overtaken by later shared ones. Every grant has its
//! own fencing token; [`Lease::access`] tells how a lease is held. A key's
//! slot count is fixed by its first semaphore holder or waiter for as long
//! as any holds or waits: a request naming another is
//! [`Error::ModeMismatch`]. Only a server whose welcome has the modes flag
//! takes them ([`Session::offers_modes`]: every `ringlockd` with lock
//! modes, durable and clustered ones included): to an older one, a shared
//! or semaphore request is [`Error::Unsupported`], and nothing is sent. A resumed session keeps the access of each lease
//! (the Resume's answer lists holds without it), and an Acquire in flight
//! is sent again with its own.
//!
//! # Errors (`lease::Error`)
//! Bad arguments are refused before any traffic: [`Error::InvalidKey`]
//! (1 to 127 bytes), [`Error::InvalidTimeout`] (a zero wait for
//! `lock`; use `try_lock`), [`Error::InvalidArgument`] (address, source, a
//! lease TTL outside the server's bounds, a semaphore of 0 slots), and
//! [`Error::Unsupported`] (a shared or semaphore request to a server
//! without them). Answers map as: `timed out` and
//! `busy` → [`Error::Timeout`]; `cancelled` → [`Error::Cancelled`] or
//! [`Error::DeadlineExceeded`]; `mode mismatch` → [`Error::ModeMismatch`];
//! `stale token` / `not the owner` on a
//! release or extend → [`Error::Lost`]; `limit reached`, `invalid`,
//! `server error` → [`Error::Failed`] (acquire) or [`Error::Unreleased`]
//! (release). A session that cannot be opened, or has ended, is
//! [`Error::Unavailable`].
//!
//! # Cancellation is exact
//! A cancel token or deadline in [`LockOptions`] makes the I/O thread send
//! a Cancel for the queued Acquire. The server answers the Acquire either
//! `cancelled` or with its grant, never both; a grant that raced the Cancel
//! is released at once (one token-checked Release) and the caller gets the
//! cancellation error. The lock wait itself (`wait_ms`) is decided by the
//! server too, so a grant never races the client's own timer.

mod acquire;
pub(super) mod election;
mod hello;
mod hold;
mod io;
mod resume;
mod serve;
mod sys;
mod watch;
mod watched;

use std::fmt;
use std::net::SocketAddr;

use crate::client::stream::Dial;
use std::sync::Arc;
use std::time::Duration;

use super::addr::ToServerAddrs;
use super::addr::DEFAULT_PORT;
use super::retry::{OnRetry, RetryEvent, RetryPolicy};
use crate::lease::{
    self, cause_msg, Error, Lease, LockOptions, LostHandler, LostLock, LostReason, Result,
};
use crate::protocol::session::{self as wire, Access, HoldMode};

use acquire::Asked;
pub use watch::Watch;
pub use watched::{EventKind, HeldAs, Holder, WatchEvent};

use io::{EventHandler, Handle, Resumer, Shared, Timing};

/// Longest interval between two keep-alive Pings, whatever the keep-alive.
pub const PING_INTERVAL_MAX: Duration = Duration::from_secs(10);
/// Longest a Ping may go unanswered before the session is presumed lost.
pub const PING_TIMEOUT_MAX: Duration = Duration::from_secs(10);
/// Bound on a release by default.
pub const DEFAULT_RELEASE_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on connecting and on the Hello's answer by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest key (bytes), as in the Locking-Center protocol.
pub const KEY_LEN_MAX: usize = 127;
/// Longest source name (bytes): a session's size byte of it is unsigned,
/// so up to 255 (the Locking-Center lock port's is 127,
/// [`crate::client::SOURCE_LEN_MAX`]). A ringlockd older than 255-byte
/// sources answers a longer one `invalid`, as does a cluster leader while
/// a member of such a version is in the cluster.
pub const SOURCE_LEN_MAX: usize = 255;
/// Longest auth token (bytes).
pub const AUTH_LEN_MAX: usize = 255;

/// How a granted lock is held (see the module docs' table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Hold {
    /// Freed the moment the session ends.
    #[default]
    Session,
    /// Freed when the TTL (millisecond precision, within the bounds the
    /// server published: [`Session::ttl_bounds`]) passes without an extend.
    Lease(Duration),
    /// Locking-Center semantics: held until released or reset.
    Persistent,
}

/// How long an Acquire may wait in the key's queue. The server decides:
/// the answer is a grant or "timed out", never both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Wait {
    /// Only if the key is free right now.
    Try,
    /// Up to this long (millisecond precision, rounded up).
    For(Duration),
    /// Until granted (or cancelled through [`LockOptions`]).
    #[default]
    Forever,
}

/// What [`Session::acquire`] asks for. The default is an exclusive session
/// hold that waits without a deadline; name the fields you change and take
/// the rest from the default:
///
/// ```
/// use ringlock::client::{Access, Acquire, Wait};
/// let readers = Acquire { access: Access::Shared, wait: Wait::Try, ..Acquire::default() };
/// # assert_eq!(readers.hold, ringlock::client::Hold::Session);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Acquire {
    /// How the grant is held, and what frees it.
    pub hold: Hold,
    /// How long the request may wait in the key's queue.
    pub wait: Wait,
    /// How the grant is shared: [`Access::Exclusive`] (the default),
    /// [`Access::Shared`] or [`Access::Semaphore`]`(n)` (see [shared and
    /// semaphore holds](crate::client::session#shared-and-semaphore-holds)).
    pub access: Access,
}

/// Builds a [`Session`]. Created by [`Session::builder`].
pub struct SessionBuilder {
    addrs: super::error::Result<Vec<(SocketAddr, Option<String>)>>,
    #[cfg(feature = "tls")]
    tls: Option<crate::tls::ClientTls>,
    source: Vec<u8>,
    keepalive: Option<Duration>,
    ping_timeout: Option<Duration>,
    connect_timeout: Duration,
    release_timeout: Duration,
    retry: RetryPolicy,
    on_lost: Option<LostHandler>,
    on_resume: Option<EventHandler>,
    on_retry: Option<OnRetry>,
    auth: Vec<u8>,
}

impl SessionBuilder {
    /// The source name sent with every Acquire (0..=255 bytes), shown by
    /// `ringlock keys`. Empty (the default) lets the server use the
    /// client's IP address.
    pub fn source(mut self, source: impl Into<Vec<u8>>) -> Self {
        self.source = source.into();
        self
    }

    /// The keep-alive deadline to ask for (whole milliseconds). The server
    /// clamps it to its `--min-keepalive`..`--max-keepalive` and
    /// answers the one it applies ([`Session::keepalive`]); the Pings are
    /// derived from that. Default (or zero): the server's default.
    pub fn keepalive(mut self, keepalive: Duration) -> Self {
        self.keepalive = Some(keepalive);
        self
    }

    /// A shorter ping timeout than the session's own (K/3, at most
    /// [`PING_TIMEOUT_MAX`]): a Ping unanswered this long after it was due
    /// is a loss. It can only shorten it (a longer one would let the server
    /// end the session before the client knows), so a value above the
    /// session's own changes nothing; at least 1 ms.
    pub fn ping_timeout(mut self, timeout: Duration) -> Self {
        self.ping_timeout = Some(timeout);
        self
    }

    /// Bound on connecting and on the Hello's answer (default 3 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Bound on a release (default 10 s). Past it, the release returns
    /// [`Error::Unreleased`] (the hold then ends with its session, its
    /// TTL or a reset, whichever applies).
    pub fn release_timeout(mut self, timeout: Duration) -> Self {
        self.release_timeout = timeout;
        self
    }

    /// How failures to connect are retried (default
    /// [`RetryPolicy::default`]: up to 10 s). Only connecting and the Hello
    /// are retried; nothing after the session is open.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// A handler called before each wait for another attempt to open the
    /// session, as [`ClientBuilder::on_retry`](super::ClientBuilder::on_retry):
    /// to say so (the library prints nothing), or `false` to give up now.
    /// Default: none.
    pub fn on_retry(
        mut self,
        handler: impl Fn(&RetryEvent<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.on_retry = Some(OnRetry(Arc::new(handler)));
        self
    }

    /// The server's shared secret (its `--auth-token-file`, 1..=255 bytes),
    /// sent in the Hello. A server that has one refuses a session without
    /// it; one that has none ignores it. Default: none.
    pub fn auth_token(mut self, token: impl Into<Vec<u8>>) -> Self {
        self.auth = token.into();
        self
    }

    /// Speaks TLS (a server started with `--certs-dir`): the server's
    /// certificate must chain to the CA bundle of `tls` and name the host
    /// each address was given by (a [`SocketAddr`] is verified by its IP
    /// address); `tls`'s client certificate, if it has one, is presented
    /// (a server with `--client-cert-auth` requires one; it stands for the
    /// auth token). A resume follows a `not leader` hint over TLS,
    /// verified against the hint's host; without TLS a hint is followed
    /// only to an address of this builder's list, so that the session id
    /// and the auth token never reach a server nobody verified.
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: crate::tls::ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// A lost-lock handler for every lease of this session, called before
    /// the lease's own (see [`lease`] for the promises). It lives as long
    /// as the session: a handler that owns a [`Session`] or a [`Lease`] of
    /// this session keeps it open until [`Session::close`].
    pub fn on_lost(mut self, handler: impl Fn(&Lease, &LostLock) + Send + Sync + 'static) -> Self {
        self.on_lost = Some(Arc::new(handler));
        self
    }

    /// A handler of the session's resume events (a replicated session,
    /// [resumed](Session#resuming-a-replicated-session) when its connection
    /// fails): one line each when a resume begins, succeeds (what was kept
    /// and lost) and fails. It runs on the session's I/O thread, so it must
    /// be quick (log the line and return); a panic in it is caught. Default:
    /// none (the events are only counted: [`Session::resumes`]).
    pub fn on_resume(mut self, handler: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.on_resume = Some(Arc::new(handler));
        self
    }

    /// Connects, opens the session (Hello) and starts its I/O thread.
    /// A bad address or source is [`Error::InvalidArgument`] (nothing is
    /// sent); a server that cannot be reached, or refuses the session, is
    /// [`Error::Unavailable`].
    pub fn connect(self) -> Result<Session> {
        let named = self
            .addrs
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let addrs: Vec<SocketAddr> = named.iter().map(|(a, _)| *a).collect();
        let mut dial = dialer(
            named,
            #[cfg(feature = "tls")]
            self.tls,
        );
        if self.source.len() > SOURCE_LEN_MAX {
            return Err(Error::InvalidArgument(format!(
                "a source is at most {SOURCE_LEN_MAX} bytes, got {}",
                self.source.len()
            )));
        }
        let keepalive_ms = self
            .keepalive
            .map_or(0, |k| u32::try_from(k.as_millis()).unwrap_or(u32::MAX));
        let connect_timeout = super::conn::nonzero(self.connect_timeout);
        let (sock, welcome) = hello::open(
            &mut dial,
            &addrs,
            keepalive_ms,
            &self.auth,
            connect_timeout,
            self.retry,
            self.on_retry.as_ref(),
        )?;
        let timing = Timing::from_keepalive(
            Duration::from_millis(u64::from(welcome.keepalive_ms)),
            PING_INTERVAL_MAX,
            self.ping_timeout
                .map_or(PING_TIMEOUT_MAX, |t| t.min(PING_TIMEOUT_MAX)),
        );
        let unavailable = |e: std::io::Error| Error::Unavailable(Arc::new(e));
        sock.set_read_timeout(None).map_err(unavailable)?;
        // A write blocks only when the server stopped reading; past the
        // ping timeout that is a hung connection.
        sock.set_write_timeout(Some(timing.ping_timeout))
            .map_err(unavailable)?;
        let resumer = Resumer {
            addrs,
            dial,
            auth: self.auth,
            connect_timeout,
            on_event: self.on_resume,
        };
        let shared = Shared::new(
            sock,
            welcome,
            timing,
            super::conn::nonzero(self.release_timeout),
            self.source,
            self.on_lost,
            resumer,
        )
        .map_err(unavailable)?;
        shared.spawn().map_err(unavailable)?;
        Ok(Session {
            h: Arc::new(Handle { shared }),
        })
    }
}

impl fmt::Debug for SessionBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionBuilder")
            .field("addrs", &self.addrs)
            .field("source", &String::from_utf8_lossy(&self.source))
            .field("keepalive", &self.keepalive)
            .field("ping_timeout", &self.ping_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("release_timeout", &self.release_timeout)
            .field("retry", &self.retry)
            .field("on_lost", &self.on_lost.is_some())
            .field("on_resume", &self.on_resume.is_some())
            .field("on_retry", &self.on_retry.is_some())
            .field("auth", &(!self.auth.is_empty()).then_some("<secret>"))
            .finish()
    }
}

/// A `ringlockd` session: one connection, one I/O thread, any number of
/// locks. Cheap to clone (clones share the session). The connection stays
/// open while a clone or a lease of it exists; [`close`](Self::close) ends
/// it at once.
#[derive(Clone)]
pub struct Session {
    h: Arc<Handle>,
}

impl Session {
    /// Starts building a session with the lock server at `addr`: `"HOST"`
    /// (port 22119), `"HOST:PORT"`, `"[IPV6]:PORT"`, a [`SocketAddr`] or
    /// anything else that is [`ToServerAddrs`], as for
    /// [`Client::builder`](super::Client::builder).
    pub fn builder(addr: impl ToServerAddrs) -> SessionBuilder {
        SessionBuilder {
            addrs: addr.to_named_server_addrs(DEFAULT_PORT),
            #[cfg(feature = "tls")]
            tls: None,
            source: Vec::new(),
            keepalive: None,
            ping_timeout: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            release_timeout: DEFAULT_RELEASE_TIMEOUT,
            retry: RetryPolicy::default(),
            on_lost: None,
            on_resume: None,
            on_retry: None,
            auth: Vec::new(),
        }
    }

    /// A session with `addr` with the default options.
    pub fn connect(addr: impl ToServerAddrs) -> Result<Session> {
        Session::builder(addr).connect()
    }

    fn shared(&self) -> &Shared {
        &self.h.shared
    }

    /// The keep-alive deadline K the server applies to this session.
    pub fn keepalive(&self) -> Duration {
        self.shared().timing.keepalive
    }

    /// How often the I/O thread pings (I = K/3, at most
    /// [`PING_INTERVAL_MAX`]).
    pub fn ping_interval(&self) -> Duration {
        self.shared().timing.interval
    }

    /// How long a Ping may go unanswered (T = K/3, at most
    /// [`PING_TIMEOUT_MAX`]).
    pub fn ping_timeout(&self) -> Duration {
        self.shared().timing.ping_timeout
    }

    /// The longest a hung connection goes unnoticed: I + T, always less
    /// than [`keepalive`](Self::keepalive).
    pub fn detection_window(&self) -> Duration {
        self.ping_interval() + self.ping_timeout()
    }

    /// The bounds of a lease's TTL the server published.
    pub fn ttl_bounds(&self) -> (Duration, Duration) {
        let w = &self.shared().welcome;
        (
            Duration::from_millis(u64::from(w.min_ttl_ms)),
            Duration::from_millis(u64::from(w.max_ttl_ms)),
        )
    }

    /// The server's id for this session (in its logs, and in
    /// [`Lease::session_id`]).
    pub fn session_id(&self) -> u64 {
        self.shared().welcome.session_id
    }

    /// This end of the connection (what `ringlock keys` lists as ENDPOINT).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.shared().local_addr()
    }

    /// Whether the server replicates this session (its welcome's resumable
    /// flag): then a failed connection is
    /// [resumed](Session#resuming-a-replicated-session) instead of ending
    /// the session.
    pub fn is_resumable(&self) -> bool {
        self.shared().lock().resumable
    }

    /// Whether the server takes shared and semaphore holds (its welcome's
    /// modes flag; after a resume, the new server's). Without it a
    /// non-exclusive [`acquire`](Self::acquire) is refused here with
    /// [`Error::Unsupported`], before anything is sent. Every `ringlockd`
    /// with lock modes offers them; an older one does not.
    pub fn offers_modes(&self) -> bool {
        self.shared().lock().modes
    }

    /// Whether the server takes key watches (its welcome's watches flag;
    /// after a resume, the new server's).
    pub fn offers_watches(&self) -> bool {
        self.shared().lock().watch
    }

    /// Watches `key`: [`Watch::holders`] are its holders now, and
    /// [`Watch::next`] gives every change after, in order, as the server
    /// decided them. A watch holds nothing and blocks nobody. It lives on
    /// the session's connection: when that fails (a replicated session is
    /// resumed on a new one) or the session ends, the watch ends with the
    /// reason, and watching again reads the holders anew (changes in
    /// between are not replayed). Errors: a bad key
    /// ([`Error::InvalidKey`]); a server without watches
    /// ([`Error::Unsupported`], nothing sent); the server's refusal
    /// (`limit reached`), the connection failing before the answer, or
    /// the session's end ([`Error::Failed`]).
    pub fn watch(&self, key: impl AsRef<[u8]>) -> Result<Watch> {
        let key = key.as_ref();
        check_key(key)?;
        watch::open(&self.h, key)
    }

    /// How many times this session was resumed on a new connection (0 for
    /// a session that is not replicated).
    pub fn resumes(&self) -> u64 {
        self.shared().resumes()
    }

    /// Why the session ended, once it did (`None` while it is open).
    pub fn ended(&self) -> Option<(LostReason, lease::Cause)> {
        self.shared().end()
    }

    /// Ends the session now: closes the connection, so the server frees
    /// every session hold at once and grants the next waiters. Each lease
    /// of it that is not being released is lost (its handlers run, with
    /// [`LostReason::ConnectionLost`]); later requests fail with
    /// [`Error::Unavailable`]. Returns once the loss is recorded (the
    /// handlers may still be running).
    pub fn close(&self) {
        self.shared().close((
            LostReason::ConnectionLost,
            cause_msg("Session::close ended the session"),
        ));
    }

    /// Acquires `key` (1..=127 bytes; need not be UTF-8, but
    /// [`Lease::key`] shows it as text) as `what` says: the hold mode, how
    /// long to wait, and the access. `Err(Error::Timeout)` when the wait
    /// ends without a grant (for [`Wait::Try`]: the key is held, or a
    /// shared or semaphore request would overtake a waiter). The options
    /// add a per-lease lost-lock handler (after the session's) and the
    /// caller's cancellation.
    ///
    /// A semaphore of 0 slots is [`Error::InvalidArgument`]; a shared or
    /// semaphore request to a server that does not
    /// [offer them](Self::offers_modes) is [`Error::Unsupported`] (neither
    /// is sent); one naming another slot count than the key's is
    /// [`Error::ModeMismatch`].
    pub fn acquire(
        &self,
        key: impl AsRef<[u8]>,
        what: Acquire,
        opts: &LockOptions,
    ) -> Result<Lease> {
        self.acquire_as(key.as_ref(), what, opts, None)
    }

    /// [`acquire`](Self::acquire) under `source` instead of the session's
    /// (an election's campaign: the value is the holder's source).
    pub(super) fn acquire_as(
        &self,
        key: &[u8],
        what: Acquire,
        opts: &LockOptions,
        source: Option<&[u8]>,
    ) -> Result<Lease> {
        check_key(key)?;
        let key_text = String::from_utf8_lossy(key).into_owned();
        if let Some(s) = source.filter(|s| s.len() > SOURCE_LEN_MAX) {
            return Err(Error::InvalidArgument(format!(
                "a source is at most {SOURCE_LEN_MAX} bytes, got {} (key {key_text:?})",
                s.len()
            )));
        }
        let access = what.access;
        if access == Access::Semaphore(0) {
            return Err(Error::InvalidArgument(format!(
                "a semaphore has at least 1 slot, got 0 (key {key_text:?})"
            )));
        }
        if access != Access::Exclusive && !self.offers_modes() {
            return Err(acquire::no_modes(&key_text, access, false));
        }
        let (mode, ttl) = self.hold_mode(what.hold)?;
        let wait_ms = wait_ms(what.wait)?;
        opts.check()?;
        let asked = Asked {
            key,
            key_text,
            mode,
            ttl,
            wait_ms,
            access,
        };
        let shared = self.shared();
        let (rid, sent_at) = acquire::send(shared, &asked, source, opts)?;
        let (answer, cancelled) = acquire::answer(shared, rid, &asked)?;
        acquire::hand_out(&self.h, asked, answer, cancelled, sent_at, opts)
    }

    /// How `hold` is asked for: its mode, and a lease's TTL as sent, in
    /// whole milliseconds (rounded down: the client's view of the expiry
    /// is computed from what was sent, so it can only end earlier than the
    /// server's) within the server's bounds.
    fn hold_mode(&self, hold: Hold) -> Result<(HoldMode, Option<Duration>)> {
        Ok(match hold {
            Hold::Session => (HoldMode::Session, None),
            Hold::Persistent => (HoldMode::Persistent, None),
            Hold::Lease(ttl) => {
                let (min, max) = self.ttl_bounds();
                let sent = Duration::from_millis(ttl.as_millis().min(u128::from(u32::MAX)) as u64);
                if sent < min || sent > max || sent.is_zero() {
                    return Err(Error::InvalidArgument(format!(
                        "a lease TTL must be within {min:?}..={max:?} (this server's bounds), got {ttl:?}"
                    )));
                }
                (HoldMode::Lease, Some(sent))
            }
        })
    }

    /// A session hold of `key`, waiting up to `timeout` (decided by the
    /// server).
    pub fn lock(&self, key: impl AsRef<[u8]>, timeout: Duration) -> Result<Lease> {
        self.lock_with(key, timeout, &LockOptions::default())
    }

    /// [`lock`](Self::lock) with a handler and the caller's cancellation.
    pub fn lock_with(
        &self,
        key: impl AsRef<[u8]>,
        timeout: Duration,
        opts: &LockOptions,
    ) -> Result<Lease> {
        self.lock_as(key.as_ref(), Access::Exclusive, timeout, opts)
    }

    /// A shared session hold of `key` (a reader lock), waiting up to
    /// `timeout`: held together with any other shared holders, granted
    /// neither while the key is held otherwise (exclusive, semaphore) nor
    /// ahead of an earlier waiter (a waiting writer is not overtaken).
    /// [`Error::Unsupported`]
    /// from a server that does not [offer it](Self::offers_modes).
    pub fn lock_shared(&self, key: impl AsRef<[u8]>, timeout: Duration) -> Result<Lease> {
        self.lock_as(key.as_ref(), Access::Shared, timeout, &LockOptions::new())
    }

    /// A session hold of one of `slots` slots of `key` (a semaphore: at
    /// most `slots` holders at once), waiting up to `timeout`. Every holder
    /// and waiter of the key must name the same `slots`
    /// ([`Error::ModeMismatch`] otherwise); 0 is
    /// [`Error::InvalidArgument`]. [`Error::Unsupported`] from a server
    /// that does not [offer it](Self::offers_modes).
    pub fn lock_permit(
        &self,
        key: impl AsRef<[u8]>,
        slots: u32,
        timeout: Duration,
    ) -> Result<Lease> {
        let access = Access::Semaphore(slots);
        self.lock_as(key.as_ref(), access, timeout, &LockOptions::new())
    }

    fn lock_as(
        &self,
        key: &[u8],
        access: Access,
        timeout: Duration,
        opts: &LockOptions,
    ) -> Result<Lease> {
        if timeout.is_zero() {
            return Err(Error::InvalidTimeout);
        }
        let what = Acquire {
            hold: Hold::Session,
            wait: Wait::For(timeout),
            access,
        };
        self.acquire(key, what, opts)
    }

    /// A session hold of `key` only if it is free now: `Ok(None)` when it
    /// is held.
    pub fn try_lock(&self, key: impl AsRef<[u8]>) -> Result<Option<Lease>> {
        self.try_lock_with(key, &LockOptions::default())
    }

    /// [`try_lock`](Self::try_lock) with a handler.
    pub fn try_lock_with(
        &self,
        key: impl AsRef<[u8]>,
        opts: &LockOptions,
    ) -> Result<Option<Lease>> {
        self.try_lock_as(key.as_ref(), Access::Exclusive, opts)
    }

    /// [`lock_shared`](Self::lock_shared) only if it can be granted now:
    /// `Ok(None)` while the key is held exclusively or anyone waits on it.
    pub fn try_lock_shared(&self, key: impl AsRef<[u8]>) -> Result<Option<Lease>> {
        self.try_lock_as(key.as_ref(), Access::Shared, &LockOptions::new())
    }

    /// [`lock_permit`](Self::lock_permit) only if a slot is free now:
    /// `Ok(None)` while `slots` holders have it, it is held otherwise, or
    /// anyone waits on it.
    pub fn try_lock_permit(&self, key: impl AsRef<[u8]>, slots: u32) -> Result<Option<Lease>> {
        let access = Access::Semaphore(slots);
        self.try_lock_as(key.as_ref(), access, &LockOptions::new())
    }

    fn try_lock_as(&self, key: &[u8], access: Access, opts: &LockOptions) -> Result<Option<Lease>> {
        let what = Acquire {
            hold: Hold::Session,
            wait: Wait::Try,
            access,
        };
        match self.acquire(key, what, opts) {
            Ok(lease) => Ok(Some(lease)),
            Err(Error::Timeout) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The dialer of the builder's addresses (`named`: each with the host it
/// was given by): over TLS when the builder has it, each address verified
/// against that host; else plaintext.
fn dialer(
    named: Vec<(SocketAddr, Option<String>)>,
    #[cfg(feature = "tls")] tls: Option<crate::tls::ClientTls>,
) -> Dial {
    #[cfg(feature = "tls")]
    if let Some(tls) = tls {
        let names = named
            .into_iter()
            .filter_map(|(a, host)| host.map(|h| (a, h)));
        return Dial::tls(tls, names);
    }
    drop(named);
    Dial::plain()
}

/// A key of 1 to [`KEY_LEN_MAX`] bytes, or [`Error::InvalidKey`] (before
/// any traffic).
fn check_key(key: &[u8]) -> Result<()> {
    if key.is_empty() || key.len() > KEY_LEN_MAX {
        return Err(Error::InvalidKey(format!(
            "a key is 1 to {KEY_LEN_MAX} bytes, got {}",
            key.len()
        )));
    }
    Ok(())
}

/// An Acquire's `wait_ms` for `wait`: 0 for a try, whole milliseconds
/// rounded up (1 up to one below forever), or [`wire::WAIT_FOREVER`].
fn wait_ms(wait: Wait) -> Result<u32> {
    Ok(match wait {
        Wait::Try => 0,
        Wait::For(d) if d.is_zero() => return Err(Error::InvalidTimeout),
        Wait::For(d) => d
            .as_micros()
            .div_ceil(1000)
            .clamp(1, u128::from(wire::WAIT_FOREVER - 1)) as u32,
        Wait::Forever => wire::WAIT_FOREVER,
    })
}

impl lease::Locker for Session {
    fn lock_with(&self, key: &str, timeout: Duration, opts: &LockOptions) -> Result<Lease> {
        Session::lock_with(self, key, timeout, opts)
    }

    fn try_lock_with(&self, key: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        Session::try_lock_with(self, key, opts)
    }
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sh = self.shared();
        f.debug_struct("Session")
            .field("session_id", &sh.welcome.session_id)
            .field("local_addr", &sh.local_addr())
            .field("timing", &sh.timing)
            .field("resumes", &sh.resumes())
            .field("ended", &sh.end().map(|(r, _)| r))
            .finish()
    }
}
