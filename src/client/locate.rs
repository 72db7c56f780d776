//! Finding the cluster from the addresses a client was given: the node
//! directory ([`crate::protocol::locate`]: Locate on the lock port, `CADR`
//! on the admin port), the admin addresses it yields, and the walk of the
//! lock addresses that passes over a node answering `-` because it does
//! not serve (a cluster's follower).
//!
//! - **Admin addresses.** Unless the builder was given
//!   [`admin_addr`](super::ClientBuilder::admin_addr), the first admin
//!   command asks each lock address for its directory, whose first entry
//!   is that node's own admin address. A server without Locate (a
//!   Locking-Center server, an older ringlockd) leaves the old rule: the
//!   lock port + 1. The answer is kept; one made while an address did not
//!   answer at all is asked again after [`PARTIAL_KEEP`].
//! - **The walk.** A Locking-Center request goes first to the address
//!   that last served. A node that answers `-` is asked for its
//!   directory: if it serves, `-` is the answer; if not (a follower, a
//!   candidate), the request goes on to the leader it names (also when
//!   that address was not given) or the next address, and a round that
//!   ends without an answer (an election) is tried again after a pause
//!   under the retry policy. A server without Locate passes a `-` on to
//!   the next address while there is one (an older cluster's follower).

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::protocol::locate::{Directory, NodeAddrs};
use crate::protocol::session::{self as sp, Located};

use super::retry::Streak;
use super::stream::{Dial, Stream};
use super::{conn, CancelToken, Client, Error, Result, DEFAULT_PORT};

/// How long admin addresses found while some lock address did not answer
/// are used before they are looked for again.
pub const PARTIAL_KEEP: Duration = Duration::from_secs(10);

/// Where the admin commands go, and how they are dialled (the names a
/// TLS dial verifies, discovered ones included).
#[derive(Debug)]
pub(super) struct Admin {
    pub addrs: Vec<SocketAddr>,
    pub dial: Dial,
}

/// The admin addresses as last found: given, discovered, or the guess.
#[derive(Debug)]
pub(super) struct AdminCache {
    pub admin: Arc<Admin>,
    /// Final (given, or every lock address answered); otherwise found at.
    pub until: Option<Instant>,
}

/// Why a Locate gave no directory.
#[derive(Debug)]
pub(super) enum LocateFail {
    /// The server answered, but not with a directory: a server without
    /// Locate (`-`, or a close), or a refusal (`tls_required`, ...).
    NoDirectory,
    /// It could not be reached or did not answer in time.
    Unreachable(io::Error),
}

/// One Locate on `addr` (its own connection), bounded by the timeouts.
pub(super) fn locate_at(
    dial: &Dial,
    addr: &SocketAddr,
    connect_timeout: Duration,
    io_timeout: Duration,
) -> std::result::Result<Directory, LocateFail> {
    let mut sock = dial
        .connect(addr, connect_timeout)
        .map_err(LocateFail::Unreachable)?;
    let _ = sock.set_nodelay(true);
    let mut frame = Vec::with_capacity(sp::HEADER + 1);
    sp::encode_locate(1, &mut frame);
    sock.set_write_timeout(Some(io_timeout))
        .and_then(|()| sock.write_all(&frame))
        .map_err(LocateFail::Unreachable)?;
    let deadline = Instant::now() + io_timeout;
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 1024];
    loop {
        match sp::decode_located(&buf) {
            Ok(Some(Located::Directory(d))) => return Ok(d),
            // Refused (`tls_required`, ...), or a server without Locate.
            Ok(Some(Located::Refused(..))) | Err(_) => return Err(LocateFail::NoDirectory),
            Ok(None) => {}
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(LocateFail::Unreachable(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no directory from {addr} within {io_timeout:?}"),
            )));
        }
        sock.set_read_timeout(Some(conn::nonzero(left)))
            .map_err(LocateFail::Unreachable)?;
        match sock.read(&mut chunk) {
            // A server without Locate closes (after `-`, or at once).
            Ok(0) => return Err(LocateFail::NoDirectory),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(LocateFail::Unreachable(e)),
        }
    }
}

/// An address a directory gives (`HOST:PORT`) as socket addresses: an
/// unspecified host is the one `reached` was dialled at; a host name is
/// resolved, and remembered in `dial` for TLS verification. `None` for
/// an empty or unusable address.
pub(super) fn resolve_advertised(text: &str, reached: IpAddr, dial: &mut Dial) -> Vec<SocketAddr> {
    let Ok((host, port)) = super::addr::split_host_port(text, DEFAULT_PORT) else {
        return Vec::new();
    };
    if let Ok(ip) = host.parse::<IpAddr>() {
        let ip = if ip.is_unspecified() { reached } else { ip };
        return vec![SocketAddr::new(ip, port)];
    }
    let found: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map(|a| a.collect())
        .unwrap_or_default();
    for a in &found {
        dial.name(*a, host);
    }
    found
}

/// Which lock-port address a Locking-Center request tries next (see the
/// module docs).
#[derive(Default)]
pub(super) struct Walk {
    /// The addresses that answered `-` in this round.
    refused: Vec<SocketAddr>,
    /// Lock addresses of members the directories named (a leader not in
    /// the client's list).
    extra: Vec<SocketAddr>,
    /// Names of the extra addresses, for a TLS dial.
    dial: Option<Dial>,
    /// A node that refused said it does not serve: a round that ends
    /// without an answer is an election, waited out.
    election: bool,
    /// The address to try first in the next round (a named leader).
    first: Option<SocketAddr>,
}

impl Client {
    /// The node directory of the first lock address that answers
    /// (Locate, a ringlockd extension; [`crate::protocol::locate`]): the
    /// node's id, whether it serves, the leader it knows of, and every
    /// member's lock address and its own admin address. `Ok(None)`: the
    /// server has no Locate (a Locking-Center server, an older ringlockd)
    /// or refused it. One attempt per address, no retries.
    pub fn locate(&self) -> Result<Option<Directory>> {
        let mut answered = false;
        let mut last = None;
        for addr in &self.cfg.addrs {
            match locate_at(
                &self.cfg.dial,
                addr,
                self.cfg.connect_timeout,
                self.cfg.io_timeout,
            ) {
                Ok(d) => return Ok(Some(d)),
                Err(LocateFail::NoDirectory) => answered = true,
                Err(LocateFail::Unreachable(e)) => last = Some((*addr, e)),
            }
        }
        match last {
            Some((addr, e)) if !answered => Err(Error::Unavailable {
                addr,
                attempts: 1,
                last: Arc::new(e),
            }),
            _ => Ok(None),
        }
    }

    /// The node directory as the node behind the admin address sees it
    /// (`CADR`, a ringlockd extension): as [`locate`](Self::locate), asked
    /// on the admin port (after `AUTH` where one is set). A server
    /// without `CADR` closes the connection: an [`Error::Io`] of kind
    /// `UnexpectedEof`. Read-only: retried per the retry policy.
    pub fn cluster_directory(&self) -> Result<Directory> {
        let mut streak = Streak::new(self.cfg.retry);
        loop {
            let (mut conn, peer) = self.connect_admin(&mut streak)?;
            let err = match self.send_admin(&mut conn, b"CADR") {
                Ok(()) => match self.read_answer(
                    &mut conn,
                    "a server without CADR",
                    Directory::decode_admin,
                ) {
                    Ok(d) => return Ok(d),
                    Err(Error::Io(err)) if err.kind() == io::ErrorKind::UnexpectedEof => {
                        return Err(Error::Io(err))
                    }
                    Err(Error::Io(err)) => io::Error::new(err.kind(), err.to_string()),
                    Err(other) => return Err(other),
                },
                Err(err) => err,
            };
            self.backoff(&mut streak, err, peer, None, None)?;
        }
    }

    /// Where admin commands go: the builder's admin addresses, else those
    /// the lock addresses' directories give (found once, see the module
    /// docs).
    pub(super) fn admin(&self) -> Arc<Admin> {
        let mut cache = self.cfg.admin.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = cache.as_ref() {
            if c.until.is_none_or(|u| Instant::now() < u) {
                return c.admin.clone();
            }
        }
        let (admin, complete) = self.discover_admin();
        let admin = Arc::new(admin);
        *cache = Some(AdminCache {
            admin: admin.clone(),
            until: (!complete).then(|| Instant::now() + PARTIAL_KEEP),
        });
        admin
    }

    /// The admin addresses as known now, without asking anyone: given,
    /// found, or the lock addresses' port + 1.
    pub(super) fn admin_known(&self) -> Vec<SocketAddr> {
        let cache = self.cfg.admin.lock().unwrap_or_else(|p| p.into_inner());
        match cache.as_ref() {
            Some(c) => c.admin.addrs.clone(),
            None => self.port_plus_one(),
        }
    }

    fn port_plus_one(&self) -> Vec<SocketAddr> {
        self.cfg
            .addrs
            .iter()
            .map(|a| SocketAddr::new(a.ip(), a.port().wrapping_add(1)))
            .collect()
    }

    /// Asks every lock address (at once) for its directory: each node's
    /// own admin address, in the order of the lock addresses. Also says
    /// whether every address answered.
    fn discover_admin(&self) -> (Admin, bool) {
        let cfg = &self.cfg;
        let answers: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = cfg
                .addrs
                .iter()
                .map(|a| {
                    s.spawn(move || locate_at(&cfg.dial, a, cfg.connect_timeout, cfg.io_timeout))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(LocateFail::Unreachable(io::Error::other(
                            "a Locate panicked",
                        )))
                    })
                })
                .collect()
        });
        let mut dial = cfg.dial.clone();
        let mut addrs = Vec::new();
        let mut directories = 0;
        let mut complete = true;
        for (lock, answer) in cfg.addrs.iter().zip(answers) {
            match answer {
                Ok(d) => {
                    directories += 1;
                    if let Some(me) = d.me() {
                        for a in resolve_advertised(&me.admin, lock.ip(), &mut dial) {
                            if !addrs.contains(&a) {
                                addrs.push(a);
                            }
                        }
                    }
                }
                Err(LocateFail::NoDirectory) => {}
                Err(LocateFail::Unreachable(_)) => complete = false,
            }
        }
        if directories == 0 || addrs.is_empty() {
            // Nobody speaks Locate: the old rule.
            addrs = self.port_plus_one();
        }
        (Admin { addrs, dial }, complete)
    }

    /// Connects to an admin address (the first that accepts, starting one
    /// further at each retry of the streak), retrying per the policy.
    pub(super) fn connect_admin(&self, streak: &mut Streak) -> Result<(Stream, SocketAddr)> {
        let admin = self.admin();
        self.connect_with(&admin.dial, &admin.addrs, streak, None, None)
    }

    /// The lock addresses of this round, the one that served last (or the
    /// one a directory named) first, less those that refused.
    fn candidates(&self, walk: &Walk) -> Vec<SocketAddr> {
        let addrs = &self.cfg.addrs;
        let start = self.cfg.prefer.load(Ordering::Relaxed) % addrs.len();
        let mut seen = HashSet::new();
        walk.first
            .iter()
            .chain(addrs[start..].iter())
            .chain(addrs[..start].iter())
            .chain(walk.extra.iter())
            .filter(|a| !walk.refused.contains(a) && seen.insert(**a))
            .copied()
            .collect()
    }

    /// `addr` served a request: later requests try it first.
    pub(super) fn served_by(&self, addr: SocketAddr) {
        if let Some(i) = self.cfg.addrs.iter().position(|a| *a == addr) {
            self.cfg.prefer.store(i, Ordering::Relaxed);
        }
    }

    /// Connects to the next lock address of the walk; retries per the
    /// policy when none can be reached (see the module docs for a round
    /// whose every answer was `-`).
    pub(super) fn connect_lock(
        &self,
        walk: &mut Walk,
        streak: &mut Streak,
        deadline: Option<Instant>,
        cancel: Option<&CancelToken>,
    ) -> Result<(Stream, SocketAddr)> {
        loop {
            let mut last = None;
            for addr in self.candidates(walk) {
                if cancel.is_some_and(CancelToken::is_cancelled) {
                    return Err(Error::Cancelled);
                }
                let timeout = match deadline {
                    Some(d) => conn::nonzero(
                        d.saturating_duration_since(Instant::now())
                            .min(self.cfg.connect_timeout),
                    ),
                    None => self.cfg.connect_timeout,
                };
                let dial = walk.dial.as_ref().unwrap_or(&self.cfg.dial);
                match dial.connect(&addr, timeout) {
                    Ok(conn) => {
                        let _ = conn.set_nodelay(true);
                        streak.connected = true;
                        return Ok((conn, addr));
                    }
                    Err(err) if dial.is_tls() && err.kind() == io::ErrorKind::InvalidData => {
                        return Err(Error::Unavailable {
                            addr,
                            attempts: streak.attempts + 1,
                            last: Arc::new(err),
                        })
                    }
                    Err(err) => last = Some((addr, err)),
                }
            }
            if !walk.refused.is_empty() {
                // The others of this round cannot be reached.
                self.round_over(walk, streak, deadline, cancel)?;
                continue;
            }
            let (addr, err) = last.expect("a round has an address unless some refused");
            self.backoff(streak, err, addr, deadline, cancel)?;
        }
    }

    /// `peer` answered `-`. Its directory says whether that is the
    /// answer (it serves) or not its to give (a follower: the next
    /// address, the leader it names first). A server that cannot say (no
    /// Locate) passes it on to the next address while there is one. `Ok`:
    /// send the request again; `Err`: the request's answer.
    pub(super) fn refused_by(
        &self,
        walk: &mut Walk,
        peer: SocketAddr,
        streak: &mut Streak,
        deadline: Option<Instant>,
        cancel: Option<&CancelToken>,
    ) -> Result<()> {
        let dial = walk.dial.as_ref().unwrap_or(&self.cfg.dial);
        let quick = self.cfg.connect_timeout.min(Duration::from_secs(1));
        let answer = self.cfg.io_timeout.min(Duration::from_secs(2));
        match locate_at(dial, &peer, quick, answer) {
            // The serving node refused it: that is the answer.
            Ok(d) if d.serving => return Err(Error::Refused),
            Ok(d) => {
                walk.election = true;
                walk.first = self.leader_addr(walk, &d, peer);
            }
            Err(_) if self.cfg.addrs.len() + walk.extra.len() <= 1 => return Err(Error::Refused),
            Err(_) => {}
        }
        walk.refused.push(peer);
        if walk.first == Some(peer) {
            walk.first = None;
        }
        if !self.candidates(walk).is_empty() {
            return Ok(());
        }
        self.round_over(walk, streak, deadline, cancel)
    }

    /// The lock address of the leader a directory names, if known (added
    /// to the walk when the client was not given it).
    fn leader_addr(
        &self,
        walk: &mut Walk,
        d: &Directory,
        reached: SocketAddr,
    ) -> Option<SocketAddr> {
        if d.leader == 0 || d.leader == d.node {
            return None;
        }
        let text = &d.nodes.iter().find(|n| n.node == d.leader)?.lock;
        let mut dial = walk.dial.clone().unwrap_or_else(|| self.cfg.dial.clone());
        let a = *resolve_advertised(text, reached.ip(), &mut dial).first()?;
        if !self.cfg.addrs.contains(&a) && !walk.extra.contains(&a) {
            walk.extra.push(a);
            walk.dial = Some(dial);
        }
        Some(a)
    }

    /// A round ended without an answer, some addresses having refused:
    /// an election when a refusing node said it does not serve (the next
    /// round after a pause, under the retry policy), else the answer `-`.
    fn round_over(
        &self,
        walk: &mut Walk,
        streak: &mut Streak,
        deadline: Option<Instant>,
        cancel: Option<&CancelToken>,
    ) -> Result<()> {
        let refused = std::mem::take(&mut walk.refused);
        if !std::mem::take(&mut walk.election) {
            return Err(Error::Refused);
        }
        let err = io::Error::other("no node serves now: it refused the request (an election?)");
        self.backoff(streak, err, refused[0], deadline, cancel)
    }
}
