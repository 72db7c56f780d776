//! Accepted peer links (a peer's outbound): the first-byte check, the TLS
//! handshake as acceptor, the Hello and its certificate, the frames, the
//! handshake flights sent back, and the close once no op references the
//! socket. The limits and the link's data are in `links.rs`.

use std::os::fd::RawFd;

use io_uring::{opcode, types};

use super::super::buf::{Lent, Slot};
use super::super::event_loop::Loop;
use super::super::tlsio;
use super::super::user_data::{self as ring_io, Op};
use super::links::{
    Inbound, HELLO_DEADLINE_US, K_CLOSE, K_ISEND, K_RECV, PENDING_MAX, PENDING_RECV_BUF, RECV_BUF,
    TLS_HANDSHAKE,
};
use crate::cluster::wire;

impl Loop {
    pub(super) fn peer_accepted(&mut self, fd: RawFd) {
        let now = super::super::sys::now().mono_us;
        // A new link evicts the oldest one still waiting for its Hello.
        let p = self.peers();
        let pending: Vec<(u64, usize)> = p
            .inbound
            .iter()
            .enumerate()
            .filter_map(|(k, i)| {
                i.as_ref()
                    .filter(|i| i.node.is_none() && !i.dead)
                    .map(|i| (i.deadline_us, k))
            })
            .collect();
        if pending.len() >= PENDING_MAX {
            let (_, oldest) = pending.into_iter().min().expect("PENDING_MAX > 0");
            self.fail_inbound(
                oldest,
                Some(format!(
                    "evicted: {PENDING_MAX} links were waiting for their Hello"
                )),
            );
        }
        let tls = match self.peers().certs.as_mut() {
            None => None,
            Some(c) => match rustls::ServerConnection::new(c.current().peer_acceptor()) {
                Ok(t) => Some(tlsio::unlimited(t.into())),
                Err(e) => {
                    // SAFETY: a plain close of the socket just accepted,
                    // which no op references yet (closed under an op, the
                    // number could be reused and the op act on another
                    // socket). Reached only if rustls refuses its own
                    // configuration; no test can provoke that.
                    unsafe { libc::close(fd) };
                    self.log_refusal(None, format!("TLS setup failed: {e}"));
                    return;
                }
            },
        };
        let gen = self.shared.next_peer_link_gen() & crate::shard::conn::GEN_MASK;
        let p = self.peers();
        let idx = match p.inbound.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                p.inbound.push(None);
                p.inbound.len() - 1
            }
        };
        p.inbound[idx] = Some(Inbound {
            fd,
            recv: Slot::Ours(vec![0u8; PENDING_RECV_BUF]),
            rbuf: Vec::new(),
            node: None,
            gen,
            tls,
            fresh: true,
            cert_node: None,
            send: Slot::Ours(Vec::new()),
            sent: 0,
            deadline_us: now + HELLO_DEADLINE_US,
            dead: false,
        });
        self.shared.metrics.security.peer_link_accepted();
        self.arm_peer_recv(idx);
    }

    fn arm_peer_recv(&mut self, idx: usize) {
        let i = self.peers().inbound[idx]
            .as_mut()
            .expect("a live inbound link");
        let ud = ring_io::encode(Op::Peer, i.gen, K_RECV | idx as u32);
        let mut lent = Lent::lend(i.recv.take_ours(), ud);
        let (ptr, len) = (lent.mut_ptr(), lent.len() as u32);
        i.recv = Slot::Kernel(lent);
        let sqe = opcode::Recv::new(types::Fd(i.fd), ptr, len)
            .build()
            .user_data(ud);
        // SAFETY: the buffer is `Lent` to this op until its completion
        // (on_peer_recv reclaims it; `reclaim` panics for another op), and
        // the link is not freed while it is lent (closing waits for this
        // completion). tests/cluster.rs replicates every grant through
        // these receives and checks each node's table.
        unsafe { self.push(sqe) };
    }

    pub(super) fn on_peer_recv(&mut self, ud: u64, gen: u32, idx: usize, res: i32) {
        let p = self.peers();
        let i = p.inbound[idx]
            .as_mut()
            .expect("a completion for a live inbound link");
        assert_eq!(
            i.gen, gen,
            "a peer receive for an earlier link in this slot"
        );
        let buf = std::mem::take(i.recv.reclaim(ud));
        if i.dead {
            i.recv = Slot::Ours(buf);
            self.finish_inbound(idx);
            return;
        }
        if res <= 0 {
            i.recv = Slot::Ours(buf);
            if res < 0 && -res == libc::EINTR {
                self.arm_peer_recv(idx);
                return;
            }
            self.fail_inbound(idx, None);
            return;
        }
        let data = &buf[..res as usize];
        let mut bad = None;
        if i.fresh {
            i.fresh = false;
            if i.tls.is_some() && data[0] != TLS_HANDSHAKE {
                bad = Some(format!(
                    "a plaintext peer (first byte {:#04x}) on a TLS peer port: every node of \
                     a cluster with certificates needs --certs-dir",
                    data[0]
                ));
            } else if i.tls.is_none() && data[0] == TLS_HANDSHAKE {
                bad = Some(
                    "a TLS peer on a plaintext peer port: this node runs --insecure, the peer \
                     has certificates"
                        .into(),
                );
            }
        }
        if bad.is_none() {
            match i.tls.as_mut() {
                None => i.rbuf.extend_from_slice(data),
                Some(t) => {
                    let was_handshaking = t.is_handshaking();
                    match tlsio::input(t, data, &mut i.rbuf) {
                        Err(e) => bad = Some(e),
                        Ok(true) => bad = Some("the peer closed its TLS session".into()),
                        Ok(false) => {}
                    }
                    if bad.is_none() && was_handshaking && !t.is_handshaking() {
                        // The certificate chained to our CA (the acceptor's
                        // verifier) and names a node: which one is the
                        // link's identity from now on.
                        match crate::tls::peer_identity(t) {
                            Some(crate::tls::Identity::Node(n)) => i.cert_node = Some(n),
                            other => {
                                bad = Some(format!(
                                    "a peer link whose certificate names {} (a node certificate \
                                     is needed)",
                                    other.map_or("nobody".to_string(), |o| o.to_string())
                                ))
                            }
                        }
                    }
                }
            }
        }
        i.recv = Slot::Ours(buf);
        if bad.is_none() {
            bad = self.parse_inbound(idx);
        }
        // A TLS flight or alert to send (an alert also when refusing).
        self.flush_inbound(idx);
        if let Some(why) = bad {
            self.fail_inbound(idx, Some(why));
            return;
        }
        self.arm_peer_recv(idx);
    }

    /// Takes every whole frame out of the link's plaintext.
    fn parse_inbound(&mut self, idx: usize) -> Option<String> {
        let i = self.peers().inbound[idx].as_mut().expect("live");
        let mut rbuf = std::mem::take(&mut i.rbuf);
        let mut node = i.node;
        let cert_node = i.cert_node;
        let tls = i.tls.is_some();
        let mut used = 0;
        let mut bad = None;
        let mut replaced = None;
        loop {
            // Before the Hello a frame is a Hello: a few hundred bytes.
            let max = if node.is_none() {
                wire::HELLO_FRAME_MAX
            } else {
                wire::FRAME_MAX
            };
            match wire::next_frame(&rbuf[used..], max) {
                Ok(None) => break,
                Err(e) => {
                    bad = Some(e);
                    break;
                }
                Ok(Some((kind, payload, n))) => {
                    match (kind, node) {
                        (wire::KIND_HELLO, None) => match wire::decode_hello(payload) {
                            None => bad = Some("a malformed Hello".into()),
                            Some(h) if tls && cert_node != Some(h.node) => {
                                bad = Some(format!(
                                    "a Hello claiming node {} over the certificate of node {}",
                                    h.node,
                                    cert_node.map_or("?".to_string(), |c| c.to_string())
                                ))
                            }
                            Some(h) => match self.shard.on_peer_hello(&h) {
                                Ok(()) => {
                                    node = Some(h.node);
                                    replaced = Some(h.node);
                                }
                                Err(e) => bad = Some(e),
                            },
                        },
                        (wire::KIND_RAFT, Some(link)) => self.shard.on_raft_message(link, payload),
                        (k, Some(link)) if wire::is_forwarding(k) => {
                            if let Err(e) = self.shard.on_forwarding(link, k, payload) {
                                bad = Some(e);
                            }
                        }
                        (k, n) => {
                            bad = Some(format!(
                                "frame kind {k} {}",
                                if n.is_none() {
                                    "before the Hello"
                                } else {
                                    "after the Hello"
                                }
                            ))
                        }
                    }
                    used += n;
                    if bad.is_some() {
                        break;
                    }
                }
            }
        }
        rbuf.drain(..used);
        let i = self.peers().inbound[idx].as_mut().expect("live");
        i.rbuf = rbuf;
        i.node = node;
        if replaced.is_some() {
            // A member now: Raft batches come in 64 KiB receives.
            i.recv.ours().resize(RECV_BUF, 0);
        }
        if let Some(n) = replaced {
            // The peer dialed again: its older link to this shard is stale
            // (half-open, or on its way out); one link per node.
            let p = self.peers();
            let old: Vec<usize> = p
                .inbound
                .iter()
                .enumerate()
                .filter(|(k, i)| {
                    *k != idx && i.as_ref().is_some_and(|i| i.node == Some(n) && !i.dead)
                })
                .map(|(k, _)| k)
                .collect();
            for k in old {
                self.fail_inbound(k, None);
            }
        }
        bad
    }

    /// Sends what the accepted link's TLS has to send, if no send is in
    /// flight (its completion calls this again).
    fn flush_inbound(&mut self, idx: usize) {
        let Some(i) = self.peers().inbound[idx].as_mut() else {
            return;
        };
        if i.send.is_lent() {
            return;
        }
        let Some(t) = i.tls.as_mut() else { return };
        let buf = i.send.ours();
        buf.clear();
        if tlsio::output(t, buf).is_err() || buf.is_empty() {
            return;
        }
        i.sent = 0;
        self.submit_inbound_send(idx);
    }

    fn submit_inbound_send(&mut self, idx: usize) {
        let i = self.peers().inbound[idx].as_mut().expect("live");
        let ud = ring_io::encode(Op::Peer, i.gen, K_ISEND | idx as u32);
        let lent = Lent::lend(i.send.take_ours(), ud);
        assert!(i.sent < lent.len(), "inbound send resumed past its end");
        // SAFETY (pointer arithmetic): `sent < len` (asserted above), so the
        // pointer stays in the buffer; a wrong offset would send TLS records
        // out of order and the dialer's handshake would fail: every test of
        // tests/peer_tls.rs and the cluster suites link through it.
        let ptr = unsafe { lent.ptr().add(i.sent) };
        let len = (lent.len() - i.sent) as u32;
        i.send = Slot::Kernel(lent);
        let sqe = opcode::Send::new(types::Fd(i.fd), ptr, len)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(ud);
        // SAFETY: the buffer is `Lent` to this op until its completion
        // (on_inbound_send reclaims it); the fd is closed only after both
        // this send and the receive completed (finish_inbound). Freed early,
        // the kernel would send freed memory as the handshake; reused fd, to
        // another socket. tests/peer_tls.rs links every node over TLS
        // through these sends, and refuses links with one in flight.
        unsafe { self.push(sqe) };
    }

    pub(super) fn on_inbound_send(&mut self, ud: u64, gen: u32, idx: usize, res: i32) {
        let i = self.peers().inbound[idx]
            .as_mut()
            .expect("a send completion for a live inbound link");
        assert_eq!(i.gen, gen, "an inbound send for an earlier link");
        let len = i.send.reclaim(ud).len();
        if i.dead {
            self.finish_inbound(idx);
            return;
        }
        if res > 0 {
            i.sent += res as usize;
            if i.sent < len {
                self.submit_inbound_send(idx);
            } else {
                self.flush_inbound(idx);
            }
            return;
        }
        if res < 0 && -res == libc::EINTR {
            self.submit_inbound_send(idx);
            return;
        }
        self.fail_inbound(idx, None);
    }

    /// The accepted link is refused or broken: ops still in flight are cut
    /// short, and the link is closed once none references it.
    pub(super) fn fail_inbound(&mut self, idx: usize, why: Option<String>) {
        let Some(i) = self.peers().inbound[idx].as_mut() else {
            return;
        };
        if i.dead {
            return;
        }
        i.dead = true;
        let linked = i.node;
        let node = i.node.or(i.cert_node);
        let lent = i.recv.is_lent() || i.send.is_lent();
        let fd = i.fd;
        if let Some(why) = why {
            self.shared.metrics.security.peer_link_refused();
            self.log_refusal(node, why);
        }
        if let Some(n) = linked {
            // Its Hello was accepted: answers it carried may be lost.
            self.shard.on_peer_inbound_down(n);
        }
        if lent {
            // SAFETY: a plain syscall on an fd this link owns and has not
            // closed (closed only once no op references it), so the number
            // cannot belong to another socket; it makes the ops in flight
            // complete. tests/peer_tls.rs refuses links with a receive armed.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
            return;
        }
        self.finish_inbound(idx);
    }

    /// Closes a failed accepted link once no op references it.
    fn finish_inbound(&mut self, idx: usize) {
        let i = self.peers().inbound[idx].as_ref().expect("live");
        debug_assert!(i.dead);
        if i.recv.is_lent() || i.send.is_lent() {
            return;
        }
        let i = self.peers().inbound[idx].take().expect("live");
        let sqe = opcode::Close::new(types::Fd(i.fd))
            .build()
            .user_data(ring_io::encode(Op::Peer, 0, K_CLOSE));
        // SAFETY: references no buffer; the receive and any send completed,
        // no op uses the fd any more (a close under a live receive could
        // let the number be reused and the receive read another socket).
        // Restarts in tests/cluster.rs and tests/cluster_ops.rs close
        // inbound links.
        unsafe { self.push(sqe) };
    }
}
