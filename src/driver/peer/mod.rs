//! Cluster mode: this loop's Raft links to the same shard of every other
//! node, through the same ring as its clients.
//!
//! Each node dials one outbound link per peer and shard and sends its Raft
//! frames for that peer on it; it accepts the peers' links on its own
//! listener (its `--peers` port + its shard index) and only reads those.
//! So two nodes are joined by two connections per shard, one each way,
//! and no frame waits for the other direction. The dialer speaks first: a
//! Hello naming its node, shard, shard count and voters; a link whose Hello
//! does not match is closed and logged.
//!
//! With `--certs-dir` every link is TLS 1.3 with a node certificate on
//! both sides ([`crate::tls::NodeTls`]): the dialer checks that the peer's
//! certificate names the node it dialed, the acceptor takes the link's
//! node id from the dialer's certificate and refuses a Hello that claims
//! another. The first byte of an accepted link must start a TLS handshake
//! record (0x16): a plaintext byte closes it before anything is buffered
//! or parsed. TLS is driven here, from the loop's own buffers
//! ([`super::tlsio`]); both directions therefore read and write during
//! the handshake, and the outbound link's watch is its TLS input.
//!
//! Limits on what an unknown dialer can make this loop hold: an accepted
//! link must finish its handshake and Hello within [`HELLO_DEADLINE_US`];
//! at most [`PENDING_MAX`](links::PENDING_MAX) links wait for theirs (a
//! new one evicts the oldest); a frame before the Hello is at most
//! [`wire::HELLO_FRAME_MAX`] bytes; a node has one inbound link per shard
//! (a newer one replaces it).
//! Peer links are counted apart from client connections.
//!
//! A link that fails is dialed again after [`REDIAL_US`]; frames for a
//! peer whose link is down, or whose queue holds [`QUEUE_MAX`] bytes
//! already (a peer that stopped reading), are dropped: Raft retransmits
//! what matters. Buffers lent to the kernel (a receive, a send, a connect's
//! address) are [`Lent`]/boxed and come back only with their op's final
//! completion, as on client connections.
//!
//! Files: `links.rs` holds the links' data (each link's state, the set
//! of them, the limits above and the kinds of a peer op); this file adds
//! to the loop the peer op's completion, dialing and the outbound links;
//! `inbound.rs` the accepted links.

use io_uring::{opcode, types};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use super::buf::{Lent, Slot};
use super::event_loop::Loop;
use super::tlsio;
use super::user_data::{self as ring_io, Op};
use crate::cluster::wire;
use crate::log::Level;

mod inbound;
pub(super) mod links;
use links::{
    OutState, Outbound, Peers, HELLO_DEADLINE_US, KIND_MASK, K_ACCEPT, K_CLOSE, K_CONNECT, K_ISEND,
    K_RECV, K_SEND, K_WATCH, QUEUE_MAX, REDIAL_US,
};

impl Loop {
    fn peers(&mut self) -> &mut Peers {
        self.peers.as_mut().expect("cluster mode")
    }

    pub(super) fn arm_peer_accept(&mut self) {
        let fd = self.peers().listener.as_raw_fd();
        let sqe = opcode::AcceptMulti::new(types::Fd(fd))
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(ring_io::encode(Op::Peer, 0, K_ACCEPT));
        // SAFETY: references no buffer; the listener lives as long as the
        // loop. Were it closed under the accept, no peer could link: every
        // test in tests/cluster.rs needs these accepts.
        unsafe { self.push(sqe) };
    }

    /// A completion of a peer op.
    pub(super) fn on_peer_op(&mut self, ud: u64, gen: u32, slot: u32, res: i32, flags: u32) {
        let idx = (slot & !KIND_MASK) as usize;
        match slot & KIND_MASK {
            K_ACCEPT => {
                if res >= 0 {
                    self.peer_accepted(res);
                } else if res != -libc::ECANCELED {
                    self.log_refusal(None, format!("accept failed: errno {}", -res));
                }
                if !io_uring::cqueue::more(flags) && !self.stop_requested {
                    self.arm_peer_accept();
                }
            }
            K_RECV => self.on_peer_recv(ud, gen, idx, res),
            K_ISEND => self.on_inbound_send(ud, gen, idx, res),
            K_CONNECT => self.on_peer_connect(gen, idx, res),
            K_SEND => self.on_peer_send(ud, gen, idx, res),
            K_CLOSE => {}
            K_WATCH => self.on_peer_watch(ud, gen, idx, res),
            k => panic!("peer op of unknown kind {k:#x}"),
        }
    }

    /// Logs a refused or failed accepted link, at most every 10 s.
    fn log_refusal(&mut self, node: Option<u64>, why: String) {
        let now = super::sys::now().mono_us;
        let shard = self.shard.index();
        let p = self.peers();
        if now < p.refusal_logged_us {
            return;
        }
        p.refusal_logged_us = now + 10_000_000;
        log!(
            Level::Warn,
            "peer_link_refused",
            "shard={} peer={:?} reason=\"{}\"",
            shard,
            node,
            crate::log::Escaped(&why)
        );
    }

    /// Dials every link that is due and closes links past their handshake
    /// or Hello deadline (from the tick).
    pub(super) fn peer_tick(&mut self, now_us: u64) {
        // Links stay up while stopping: a leader hands its leadership over
        // on them before it exits.
        if self.peers.is_none() {
            return;
        }
        for o in 0..self.peers().outbound.len() {
            let out = &self.peers().outbound[o];
            match out.state {
                OutState::Down { at_us } if now_us >= at_us => self.dial(o),
                OutState::Up
                    if !out.dead
                        && out.tls.as_ref().is_some_and(|t| t.is_handshaking())
                        && now_us >= out.up_since_us + HELLO_DEADLINE_US =>
                {
                    self.fail_outbound(o, libc::ETIMEDOUT);
                }
                _ => {}
            }
        }
        for k in 0..self.peers().inbound.len() {
            let late = self.peers().inbound[k]
                .as_ref()
                .is_some_and(|i| !i.dead && i.node.is_none() && now_us >= i.deadline_us);
            if late {
                self.fail_inbound(
                    k,
                    Some(format!(
                        "no TLS handshake and Hello within {} ms",
                        HELLO_DEADLINE_US / 1000
                    )),
                );
            }
        }
        let n = self.peers().inbound_links();
        self.shared
            .metrics
            .security
            .set_peer_links(self.shard.index(), n as u64);
    }

    /// When the next dial or deadline is due (for the wait).
    pub(super) fn peer_deadline_us(&self) -> Option<u64> {
        let p = self.peers.as_ref()?;
        let dials = p.outbound.iter().filter_map(|o| match o.state {
            OutState::Down { at_us } => Some(at_us),
            OutState::Up if o.tls.as_ref().is_some_and(|t| t.is_handshaking()) => {
                Some(o.up_since_us + HELLO_DEADLINE_US)
            }
            _ => None,
        });
        let hellos = p
            .inbound
            .iter()
            .flatten()
            .filter(|i| i.node.is_none() && !i.dead)
            .map(|i| i.deadline_us);
        dials.chain(hellos).min()
    }

    fn dial(&mut self, o: usize) {
        use socket2::{Domain, Socket, Type};
        let out = &self.peers().outbound[o];
        // TCP_USER_TIMEOUT: a peer that vanished without a FIN or RST (its
        // host died, a partition) fails this link's next send within a
        // second instead of TCP's minutes, so the link is dialed again
        // (Raft heartbeats keep data in flight on a healthy link).
        let sock = match Socket::new(Domain::for_address(out.shown), Type::STREAM, None)
            .and_then(|s| s.set_tcp_nodelay(true).map(|_| s))
            .and_then(|s| s.set_cloexec(true).map(|_| s))
            .and_then(|s| {
                s.set_tcp_user_timeout(Some(std::time::Duration::from_secs(1)))
                    .map(|_| s)
            }) {
            Ok(s) => s,
            Err(e) => {
                log!(Level::Warn, "peer_dial_failed", "error=\"{}\"", e);
                let at = super::sys::now().mono_us + REDIAL_US;
                self.peers().outbound[o].state = OutState::Down { at_us: at };
                return;
            }
        };
        let fd = std::os::fd::IntoRawFd::into_raw_fd(std::os::fd::OwnedFd::from(sock));
        let out = &mut self.peers().outbound[o];
        out.gen = (out.gen + 1) & crate::shard::conn::GEN_MASK;
        out.fd = fd;
        out.state = OutState::Connecting;
        let (ptr, len) = (out.addr.as_ptr(), out.addr.len());
        let ud = ring_io::encode(Op::Peer, out.gen, K_CONNECT | o as u32);
        let sqe = opcode::Connect::new(types::Fd(fd), ptr as *const _, len)
            .build()
            .user_data(ud);
        // SAFETY: the address is boxed in the link and neither moved nor
        // dropped while the connect is in flight (state Connecting; a
        // stopping server forgets it instead: leak_in_flight); freed early,
        // the kernel would dial garbage. tests/cluster.rs dials every link,
        // and redials after each kill -9.
        unsafe { self.push(sqe) };
    }

    fn on_peer_connect(&mut self, gen: u32, o: usize, res: i32) {
        let shard = self.shard.index();
        let out = &mut self.peers().outbound[o];
        assert_eq!(out.gen, gen, "a connect completion for an earlier link");
        if out.retired {
            // Retired while dialing: closed now that the connect is done.
            self.drop_outbound(o);
            return;
        }
        if res < 0 {
            if !out.quiet {
                out.quiet = true;
                log!(
                    Level::Warn,
                    "peer_link_down",
                    "shard={} peer={} addr={} errno={} action=\"redialing every {} ms\"",
                    shard,
                    out.node,
                    out.shown,
                    -res,
                    REDIAL_US / 1000
                );
            }
            self.drop_outbound(o);
            return;
        }
        if out.quiet {
            log!(
                Level::Info,
                "peer_link_up",
                "shard={} peer={} addr={}",
                shard,
                out.node,
                out.shown
            );
        }
        out.quiet = false;
        out.state = OutState::Up;
        out.dead = false;
        out.up_since_us = super::sys::now().mono_us;
        let node = out.node;
        // TLS: the peer must prove it is the node we dialed (its
        // certificate names it; `peer_dialer`'s verifier checks).
        let tls = match self.peers().certs.as_mut() {
            None => None,
            Some(c) => {
                let name = rustls::pki_types::ServerName::try_from(format!("ringlock-node-{node}"))
                    .expect("a valid DNS name");
                match rustls::ClientConnection::new(c.current().peer_dialer(node), name) {
                    Ok(t) => Some(tlsio::unlimited(t.into())),
                    Err(e) => {
                        log!(
                            Level::Warn,
                            "peer_tls_failed",
                            "shard={} peer={} error=\"{}\"",
                            shard,
                            node,
                            crate::log::Escaped(&e)
                        );
                        self.fail_outbound(o, 0);
                        return;
                    }
                }
            }
        };
        self.peers().outbound[o].tls = tls;
        self.arm_watch(o);
        // The Hello first (as the shard has it now: a joining node adopts
        // its cluster's identity); what was queued for the old link is stale.
        if let Some(h) = self.shard.peer_hello() {
            let mut b = Vec::new();
            wire::encode_hello(&h, &mut b);
            self.peers().hello = b;
        }
        let hello = self.peers().hello.clone();
        let out = &mut self.peers().outbound[o];
        out.queue.clear();
        out.queue.extend_from_slice(&hello);
        let plaintext = out.tls.is_none();
        self.kick_send(o);
        // Without TLS nothing more is learned of the peer: the link carries
        // requests now (behind the Hello). With TLS, once the handshake is
        // done (on_peer_watch).
        let out = &self.peers().outbound[o];
        if plaintext && out.state == OutState::Up && !out.dead {
            self.shard.on_peer_link_ready(node);
        }
    }

    /// A frame for `node` from the shard. `Err(Some(o))`: dropped because
    /// link `o` is up but full; `Err(None)`: no link up to take it.
    pub(super) fn send_peer(&mut self, node: u64, frame: &[u8]) -> Result<(), Option<usize>> {
        let Some(p) = self.peers.as_mut() else {
            return Err(None);
        };
        let Some(o) = p.outbound.iter().position(|o| o.node == node && !o.retired) else {
            return Err(None);
        };
        let out = &mut p.outbound[o];
        if out.state != OutState::Up || out.dead {
            return Err(None); // dropped: Raft retransmits
        }
        if out.queue.len() + frame.len() > QUEUE_MAX {
            return Err(Some(o));
        }
        out.queue.extend_from_slice(frame);
        self.kick_send(o);
        Ok(())
    }

    /// A frame that must arrive (Locking-Center forwarding): one that
    /// cannot be queued is reported to the shard, and a link too full to
    /// take it (its peer stopped reading) is closed, so that the peer
    /// learns of it too; a frame is never dropped while its link stays up.
    pub(super) fn send_peer_must(&mut self, node: u64, frame: Vec<u8>) {
        let Err(full) = self.send_peer(node, &frame) else {
            return;
        };
        // The shard first: a Forward that never left is parked again before
        // the link's failure fails the requests that did leave on it.
        self.shard.on_peer_undeliverable(node, &frame);
        if let Some(o) = full {
            self.fail_outbound(o, libc::ENOBUFS);
        }
    }

    /// Starts the next send if none is in flight: the queued frames (with
    /// TLS: encrypted, once the handshake is done) and any TLS records.
    fn kick_send(&mut self, o: usize) {
        let out = &mut self.peers().outbound[o];
        if out.state != OutState::Up || out.dead || out.send.is_lent() {
            return;
        }
        let mut buf = out.send.take_ours();
        buf.clear();
        let mut failed = None;
        match out.tls.as_mut() {
            None => std::mem::swap(&mut buf, &mut out.queue),
            Some(t) => {
                if !t.is_handshaking() && !out.queue.is_empty() {
                    if let Err(e) = tlsio::encrypt(t, &out.queue) {
                        failed = Some(e);
                    }
                    out.queue.clear();
                }
                if let Err(e) = tlsio::output(t, &mut buf) {
                    failed = Some(e);
                }
            }
        }
        out.sent = 0;
        let empty = buf.is_empty();
        out.send = Slot::Ours(buf);
        if let Some(e) = failed {
            let node = out.node;
            log!(
                Level::Warn,
                "peer_tls_failed",
                "shard={} peer={} error=\"{}\"",
                self.shard.index(),
                node,
                crate::log::Escaped(&e)
            );
            self.fail_outbound(o, 0);
            return;
        }
        if !empty {
            self.submit_peer_send(o);
        }
    }

    fn submit_peer_send(&mut self, o: usize) {
        let out = &mut self.peers().outbound[o];
        let ud = ring_io::encode(Op::Peer, out.gen, K_SEND | o as u32);
        let lent = Lent::lend(out.send.take_ours(), ud);
        // A release assert: the pointer arithmetic below rests on it.
        assert!(
            out.sent < lent.len(),
            "peer send resumed at {} of {}",
            out.sent,
            lent.len()
        );
        // SAFETY (pointer arithmetic): `sent < len` (asserted above), so the
        // pointer stays inside the buffer; a wrong offset would send bytes
        // out of frame, which the peer refuses (tests/cluster_workload.rs
        // pushes large batches through short sends).
        let ptr = unsafe { lent.ptr().add(out.sent) };
        let len = (lent.len() - out.sent) as u32;
        out.send = Slot::Kernel(lent);
        let sqe = opcode::Send::new(types::Fd(out.fd), ptr, len)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(ud);
        // SAFETY: the buffer is `Lent` to this op until its completion
        // (on_peer_send reclaims it); the link's fd is closed only after it
        // (drop_outbound runs from this completion). tests/cluster.rs
        // replicates every grant through these sends.
        unsafe { self.push(sqe) };
    }

    fn on_peer_send(&mut self, ud: u64, gen: u32, o: usize, res: i32) {
        let out = &mut self.peers().outbound[o];
        assert_eq!(out.gen, gen, "a send completion for an earlier link");
        let len = out.send.reclaim(ud).len();
        if out.dead {
            out.send.ours().clear();
            out.sent = 0;
            self.fail_outbound(o, 0);
            return;
        }
        if res > 0 {
            out.sent += res as usize;
            if out.sent < len {
                self.submit_peer_send(o);
                return;
            }
            out.send.ours().clear();
            out.sent = 0;
            self.kick_send(o);
            return;
        }
        if res < 0 && -res == libc::EINTR {
            self.submit_peer_send(o);
            return;
        }
        out.send.ours().clear();
        out.sent = 0;
        self.fail_outbound(o, -res);
    }

    fn arm_watch(&mut self, o: usize) {
        let out = &mut self.peers().outbound[o];
        let ud = ring_io::encode(Op::Peer, out.gen, K_WATCH | o as u32);
        let mut lent = Lent::lend(out.watch.take_ours(), ud);
        let (ptr, len) = (lent.mut_ptr(), lent.len() as u32);
        out.watch = Slot::Kernel(lent);
        let sqe = opcode::Recv::new(types::Fd(out.fd), ptr, len)
            .build()
            .user_data(ud);
        // SAFETY: the buffer is `Lent` to this op until its completion
        // (on_peer_watch reclaims it); the fd is closed only after it
        // (drop_outbound needs both the watch and any send back).
        // tests/cluster.rs restarts killed nodes, whose links this watch
        // finds dead.
        unsafe { self.push(sqe) };
    }

    /// The watch completed: TLS records from the peer (its handshake
    /// flight), or the peer closed or reset the link (or, on a plaintext
    /// link, sent bytes no peer sends).
    fn on_peer_watch(&mut self, ud: u64, gen: u32, o: usize, res: i32) {
        let out = &mut self.peers().outbound[o];
        assert_eq!(out.gen, gen, "a watch completion for an earlier link");
        let buf = std::mem::take(out.watch.reclaim(ud));
        if res < 0 && -res == libc::EINTR && !out.dead {
            out.watch = Slot::Ours(buf);
            self.arm_watch(o);
            return;
        }
        let mut why = None;
        let mut handshake_done = false;
        if res > 0 && !out.dead {
            match out.tls.as_mut() {
                None => why = Some("bytes on an outbound link".to_string()),
                Some(t) => {
                    let handshaking = t.is_handshaking();
                    let mut plain = Vec::new();
                    match tlsio::input(t, &buf[..res as usize], &mut plain) {
                        Err(e) => why = Some(e),
                        Ok(true) => why = Some("the peer closed its TLS session".into()),
                        Ok(false) if !plain.is_empty() => {
                            why = Some("data from the peer on an outbound link".into())
                        }
                        Ok(false) => handshake_done = handshaking && !t.is_handshaking(),
                    }
                }
            }
            if why.is_none() {
                out.watch = Slot::Ours(buf);
                // The handshake may have moved on (our Finished to send) or
                // ended (the queued Hello and frames go out now).
                self.kick_send(o);
                // Unless that send failed the link (then it is down or
                // being shut down, and its fd is not ours to read).
                let out = &self.peers().outbound[o];
                if out.state == OutState::Up && !out.dead {
                    let node = out.node;
                    self.arm_watch(o);
                    if handshake_done {
                        // The peer proved it is the node dialed: the link
                        // carries forwarded requests from now on.
                        self.shard.on_peer_link_ready(node);
                    }
                }
                return;
            }
        }
        out.watch = Slot::Ours(buf);
        if let Some(why) = why {
            let (node, shard) = (out.node, self.shard.index());
            log!(
                Level::Warn,
                "peer_link_refused",
                "shard={} peer={} direction=out reason=\"{}\"",
                shard,
                node,
                crate::log::Escaped(&why)
            );
            // An alert, if rustls has one, is not waited for.
        }
        self.fail_outbound(o, if res < 0 { -res } else { 0 });
    }

    /// [`Cmd::PeerReset`]: aborts the link to `node` if it is up (a link
    /// already failing discards its bytes as it closes).
    pub(super) fn reset_peer(&mut self, node: u64) {
        let Some(p) = self.peers.as_mut() else {
            return;
        };
        let Some(o) = p
            .outbound
            .iter()
            .position(|o| o.node == node && !o.retired && o.state == OutState::Up && !o.dead)
        else {
            return;
        };
        self.fail_outbound(o, libc::ECANCELED);
    }

    /// The link is broken: shut it down so that every op on it completes,
    /// then close it and redial (at once: the peer may be back already).
    /// Closed with a reset: bytes not yet sent (forwarded requests whose
    /// clients were told the outcome is unknown) never reach the peer.
    fn fail_outbound(&mut self, o: usize, errno: i32) {
        let shard = self.shard.index();
        let node = self.peers().outbound[o].node;
        {
            let out = &self.peers().outbound[o];
            if !out.dead && out.fd >= 0 {
                abort_on_close(out.fd);
            }
        }
        self.shard.on_peer_link_down(node);
        let out = &mut self.peers().outbound[o];
        if errno == libc::ECANCELED {
            log!(
                Level::Info,
                "peer_link_reset",
                "shard={} peer={} addr={} reason=\"forwarded requests given up\" action=\"redialing\"",
                shard,
                out.node,
                out.shown
            );
        } else if errno == 0 || errno == libc::ECONNRESET {
            // The peer closed it (a node stopping closes its links with
            // their unread bytes: a reset; a link replaced). Not quiet: if
            // the peer stays away, the redial that fails warns once.
            log!(
                Level::Info,
                "peer_link_closed",
                "shard={} peer={} addr={} errno={} action=\"redialing\"",
                shard,
                out.node,
                out.shown,
                errno
            );
        } else if !out.quiet {
            out.quiet = true;
            log!(
                Level::Warn,
                "peer_link_down",
                "shard={} peer={} addr={} errno={} action=\"redialing\"",
                shard,
                out.node,
                out.shown,
                errno
            );
        }
        out.dead = true;
        if out.send.is_lent() || out.watch.is_lent() {
            // shutdown(2) makes the ops still in flight on this fd complete;
            // their completions come back here.
            // SAFETY: a plain syscall on an fd this link owns and has not
            // closed (it is closed only once no op references it), so the
            // number cannot belong to another socket (shutting down a reused
            // number would cut a client's connection); no memory involved.
            // tests/cluster.rs kills peers whose links end here.
            unsafe { libc::shutdown(out.fd, libc::SHUT_RDWR) };
            return;
        }
        self.drop_outbound(o);
    }

    /// Closes a link no op references any more and schedules its redial.
    fn drop_outbound(&mut self, o: usize) {
        let now = super::sys::now().mono_us;
        let out = &mut self.peers().outbound[o];
        // A link that was up a while is dialed again at once (a restarted
        // peer is listening already); a dial that failed, or a link the
        // peer closed at once (it refused our Hello), waits: never a busy
        // loop of dials.
        let lasted = now.saturating_sub(out.up_since_us) >= REDIAL_US;
        let at = if out.state == OutState::Up && lasted {
            now
        } else {
            now + REDIAL_US
        };
        debug_assert!(!out.send.is_lent() && !out.watch.is_lent());
        out.dead = false;
        out.tls = None;
        let fd = std::mem::replace(&mut out.fd, -1);
        out.state = if out.retired {
            OutState::Retired
        } else {
            OutState::Down { at_us: at }
        };
        out.queue.clear();
        if fd >= 0 {
            let sqe = opcode::Close::new(types::Fd(fd))
                .build()
                .user_data(ring_io::encode(Op::Peer, 0, K_CLOSE));
            // SAFETY: references no buffer; every op that used the fd (the
            // connect, a send, the watch) has completed (asserted above),
            // so the number is not reused under one of them (which would
            // then act on another socket). tests/cluster.rs and
            // tests/cluster_ops.rs drop and redial links on every restart.
            unsafe { self.push(sqe) };
        }
    }

    /// The group's membership changed: `node`'s link goes to `addr`, or
    /// (`None`) the node left and its link is closed for good. A link to
    /// the same address is kept as it is.
    pub(super) fn set_peer_link(&mut self, node: u64, addr: Option<SocketAddr>) {
        let shard = self.shard.index();
        let Some(p) = self.peers.as_mut() else { return };
        if let Some(o) = p.outbound.iter().position(|o| o.node == node && !o.retired) {
            if Some(p.outbound[o].shown) == addr {
                return;
            }
            log!(
                Level::Info,
                "peer_link_retired",
                "shard={} peer={} addr={}",
                shard,
                node,
                p.outbound[o].shown
            );
            let out = &mut p.outbound[o];
            out.retired = true;
            match out.state {
                OutState::Down { .. } => out.state = OutState::Retired,
                // The connect's completion closes it.
                OutState::Connecting | OutState::Retired => {}
                OutState::Up => self.fail_outbound(o, 0),
            }
        }
        if let Some(a) = addr {
            log!(
                Level::Info,
                "peer_link_added",
                "shard={} peer={} addr={}",
                shard,
                node,
                a
            );
            self.peers().outbound.push(Outbound::new(node, a));
        }
    }
}

/// Makes the close of `fd` abortive (SO_LINGER on, 0 s: a TCP reset, the
/// send queue discarded). Best effort: a failure leaves an ordinary close.
fn abort_on_close(fd: i32) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `fd` is the link's own socket, not yet closed (a link closes
    // its fd only once no op references it), so the option lands on that
    // socket and no other: on a reused number it would make an unrelated
    // client connection's close a reset. `l` lives across the call and the
    // length given is its size, so the kernel reads only `l`.
    // tests/cluster_forward.rs::a_leader_killed_under_a_forwarded_waiter_closes_it_and_the_next_request_waits_out_the_election
    // runs this path (the follower's link to the killed leader fails here,
    // its client still connected and answered after); a call on a wrong
    // number that turned the client's close into a reset is not singled
    // out by any test.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}
