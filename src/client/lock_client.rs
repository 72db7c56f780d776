//! [`Client`]: a handle on one lock server (or cluster), its builder, and
//! the requests of the lock and admin ports other than taking a lock
//! (`guard.rs`), listing keys (`listing.rs`) and finding the cluster
//! (`routing.rs`), which are `Client` methods too.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::addr::{ToServerAddrs, DEFAULT_PORT};
use super::conn::{self};
use super::error::{Error, Result};
use super::locate;
use super::retry::{OnRetry, RetryEvent, RetryPolicy, Streak};
use super::stream::{Dial, Stream};
use super::wire::{self, Action, Reply};
use crate::cancel::CancelToken;
use crate::protocol::status::ShardStatus;

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
pub(super) struct Config {
    pub(super) addrs: Vec<SocketAddr>,
    /// The admin addresses: given to the builder, or found (`locate`).
    pub(super) admin: Mutex<Option<locate::AdminCache>>,
    /// The index of the lock address that served last (tried first).
    pub(super) prefer: AtomicUsize,
    /// Plaintext, or TLS with the names to verify.
    pub(super) dial: Dial,
    pub(super) source: Vec<u8>,
    pub(super) connect_timeout: Duration,
    pub(super) io_timeout: Duration,
    pub(super) retry: RetryPolicy,
    pub(super) keepalive: Option<Duration>,
    pub(super) admin_auth: Option<Vec<u8>>,
    on_retry: Option<OnRetry>,
}

/// A handle to one lock server. Cheap to clone; clones share configuration.
/// Holds no connection of its own, so it is `Send + Sync` and can be shared
/// between threads freely.
#[derive(Debug, Clone)]
pub struct Client {
    pub(super) cfg: Arc<Config>,
}

/// How a request/answer exchange failed.
pub(super) enum UnaryFail {
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

    /// Releases `key`, whoever holds it (the protocol has no owner check).
    /// Unlocking a free key succeeds. Prefer
    /// [`Guard::release`](super::Guard::release).
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
    /// queued Locks. An empty source means "my own IP address". A source
    /// of up to 127 bytes is reset on the lock port (ResetBySource, as on
    /// any Locking-Center server); a longer one, up to 255 bytes (a
    /// session's source: an election's value), by the admin port's `RSBS`
    /// (a ringlockd that takes such sources; an older one refuses it:
    /// [`Error::Refused`]). Over 255 bytes: [`Error::InvalidSource`],
    /// nothing sent.
    pub fn reset_by_source(&self, source: impl AsRef<[u8]>) -> Result<()> {
        let source = source.as_ref();
        if source.len() > wire::SOURCE_LEN_MAX && source.len() <= wire::SESSION_SOURCE_LEN_MAX {
            return self.reset_by_long_source(source);
        }
        wire::validate_source(source)?;
        self.simple(
            &wire::encode(Action::ResetBySource, source, None),
            "reset by source",
        )
    }

    /// `RSBS` of one source (128..=255 bytes): answered `+` for it and a
    /// final `+`. Not retried once sent (a holder that took the source
    /// since could be reset twice).
    fn reset_by_long_source(&self, source: &[u8]) -> Result<()> {
        let mut req = b"RSBS".to_vec();
        req.extend_from_slice(&1u32.to_le_bytes());
        req.push(source.len() as u8);
        req.extend_from_slice(source);
        let mut streak = Streak::new(self.cfg.retry);
        let (mut conn, _) = self.connect_admin(&mut streak)?;
        let unknown = |e: &io::Error| Error::io_context(e, "reset by source outcome unknown");
        self.send_admin(&mut conn, &req).map_err(|e| unknown(&e))?;
        let mut out = [0u8; 2];
        match self.read_admin(&mut conn, &mut out) {
            Ok(()) if out == *b"++" => Ok(()),
            Ok(()) if out[0] == b'-' => Err(Error::Refused),
            Ok(()) => Err(Error::Protocol(format!(
                "RSBS answered {:?}",
                String::from_utf8_lossy(&out)
            ))),
            // A server that refuses (not the leader, or too old to take
            // such a source) answers `-` or closes.
            Err(Error::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => Err(Error::Refused),
            Err(Error::Io(e)) => Err(unknown(&e)),
            Err(other) => Err(other),
        }
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
    pub(super) fn send_admin(&self, conn: &mut Stream, cmd: &[u8]) -> io::Result<()> {
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
    pub(super) fn unary(&self, frame: &[u8]) -> Result<(Reply, Stream), UnaryFail> {
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
    pub(super) fn send(&self, conn: &mut Stream, frame: &[u8]) -> io::Result<()> {
        conn.set_write_timeout(Some(self.cfg.io_timeout))?;
        conn.write_all(frame)
    }

    /// Connects to the first address that answers, retrying per the policy
    /// (each retry of the streak starts one address further, so that an
    /// address that accepts but fails the command does not take every
    /// attempt). Returns the connection and the address it reached (for
    /// errors).
    pub(super) fn connect_with(
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
    pub(super) fn backoff(
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
    pub(super) fn release_key(
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
