//! The [`Client`] methods that find the cluster and walk its lock
//! addresses: the node directory, the admin addresses, and which address a
//! request tries next (the rules: the `locate` module's docs).

use std::collections::HashSet;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::conn;
use super::error::{Error, Result};
use super::locate::{
    locate_at, resolve_advertised, Admin, AdminCache, Directory, LocateFail, Walk, PARTIAL_KEEP,
};
use super::lock_client::Client;
use super::retry::Streak;
use super::stream::Stream;
use crate::cancel::CancelToken;

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
