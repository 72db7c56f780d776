//! Connection I/O: a connection slot's driver side ([`DConn`], its data in
//! `conn_slot.rs`), accepting (or refusing over the limit), the receive
//! and send ops with their lent buffers, the close once no op references
//! the socket, the shard's connection commands (send, close, farewell,
//! migrate), and the hand-over of a connection between shards (adopt,
//! finish_migrate).

use std::os::fd::{AsRawFd, RawFd};

use io_uring::{opcode, types};

use super::buf::{Lent, Slot};
use super::clienttls_state::ConnTls;
use super::conn_slot::DConn;
use super::event_loop::Loop;
use super::mesh::Msg;
use super::sys::{peer_of, refuse_fd, REFUSED};
use super::user_data::{self as ring_io, Op};
use crate::core::Token;
use crate::log::Level;
use crate::shard::conn::Port;

impl Loop {
    pub(super) fn arm_accept(&mut self, port: Port) {
        let (fd, op) = match port {
            Port::Lock => (self.lock_listener.as_raw_fd(), Op::AcceptLock),
            Port::Admin => (self.admin_listener.as_raw_fd(), Op::AcceptAdmin),
        };
        let sqe = opcode::AcceptMulti::new(types::Fd(fd))
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(ring_io::encode(op, 0, 0));
        // SAFETY: references no buffer.
        unsafe { self.push(sqe) };
    }

    pub(super) fn accepted(&mut self, port: Port, fd: RawFd) {
        let peer = peer_of(fd);
        let Some(token) = self.shard.on_accept(port, peer) else {
            // Answer `-`, then close once the send has completed, whatever
            // its result. Not an IO_LINK: a send that fails (the client
            // reset first) cancels a linked close, and the descriptor
            // leaked (tests/refuse_leak.rs). The send's user_data carries
            // the fd so that its completion can close it.
            let fd_slot = u32::try_from(fd).expect("accept returns a non-negative fd");
            let send = opcode::Send::new(types::Fd(fd), REFUSED.as_ptr(), 1)
                .flags(libc::MSG_NOSIGNAL)
                .build()
                .user_data(ring_io::encode(Op::Refuse, 0, fd_slot));
            // SAFETY: REFUSED is static, so the buffer outlives the op (a
            // buffer freed before the completion would send freed memory).
            // The fd stays open until this send's completion closes it, so
            // the number cannot be reused under the send; tests/refuse_leak.rs
            // refuses 600 connections that reset first and counts the
            // server's descriptors.
            unsafe { self.push(send) };
            return;
        };
        let slot = token as u32 as usize;
        while self.conns.len() <= slot {
            self.conns.push(DConn::new());
        }
        let c = &mut self.conns[slot];
        assert_eq!(c.token, 0, "the shard reused a slot the driver still holds");
        c.token = token;
        c.fd = fd;
        c.sent = 0;
        c.closing = false;
        c.cancel_submitted = false;
        c.send_cancel_submitted = false;
        c.sniffed = false;
        c.tls = None;
        self.arm_recv(slot);
    }

    fn conn_checked(&self, op: &str, gen: u32, slot: u32) {
        let Some(c) = self.conns.get(slot as usize) else {
            panic!("{op} completion for slot {slot} that never existed");
        };
        if (c.token >> 32) as u32 & 0x0FFF_FFFF != gen || c.token == 0 {
            panic!(
                "{op} completion for slot {slot} gen {gen}, slot holds {:#x}",
                c.token
            );
        }
    }

    pub(super) fn arm_recv(&mut self, slot: usize) {
        let c = &mut self.conns[slot];
        debug_assert!(!c.closing && !c.recv.is_lent());
        let ud = ring_io::encode(Op::Recv, (c.token >> 32) as u32, slot as u32);
        let mut lent = Lent::lend(c.recv.take_ours(), ud);
        let (ptr, len) = (lent.mut_ptr(), lent.len() as u32);
        c.recv = Slot::Kernel(lent);
        let sqe = opcode::Recv::new(types::Fd(c.fd), ptr, len)
            .build()
            .user_data(ud);
        // SAFETY: the receive buffer is `Lent` to this op and comes back
        // only through `reclaim` with this op's completion (on_recv); the
        // slot is not recycled while it is lent (maybe_close). Touching it
        // meanwhile panics (buf.rs tests); the pipelining tests in
        // tests/pipelining.rs fail if received bytes are ever taken from a
        // buffer the kernel still writes.
        unsafe { self.push(sqe) };
    }

    pub(super) fn on_recv(&mut self, ud: u64, gen: u32, slot: u32, res: i32) {
        self.conn_checked("recv", gen, slot);
        let s = slot as usize;
        let token = self.conns[s].token;
        let closing = self.conns[s].closing;
        let migrating = self.conns[s].migrate_to.is_some();
        let first = self.conns[s].recv.reclaim(ud).first().copied();
        if closing {
            self.maybe_close(s);
            return;
        }
        if res > 0 && !self.conns[s].sniffed && self.client_tls.is_some() {
            self.tls_sniff(s, first.expect("a receive buffer is never empty"));
        }
        if self.conns[s].tls.is_some() {
            self.on_tls_recv(s, token, migrating, res);
            return;
        }
        let buf = self.conns[s].recv.ours();
        if migrating {
            // The last receive before the hand-over: keep what it brought.
            match res {
                r if r > 0 => self.shard.on_recv(token, &buf[..r as usize]),
                0 => self.shard.on_peer_closed(token, None),
                r if r == -libc::ECANCELED => {}
                r => self.shard.on_peer_closed(token, Some(-r)),
            }
            self.finish_migrate(s);
            return;
        }
        if res > 0 {
            self.shard.on_recv(token, &buf[..res as usize]);
            // A one-shot answer already decided needs no further receive:
            // saves the re-armed receive, its cancel and their completions.
            if !self.conns[s].closing
                && self.conns[s].migrate_to.is_none()
                && self.shard.wants_input(token)
            {
                self.arm_recv(s);
            }
            return;
        }
        match -res {
            0 => self.shard.on_peer_closed(token, None),
            libc::EINTR | libc::EAGAIN => self.arm_recv(s),
            libc::ECANCELED => {}
            e => {
                if !matches!(
                    e,
                    libc::ECONNRESET | libc::EPIPE | libc::ETIMEDOUT | libc::EHOSTUNREACH
                ) {
                    log!(Level::Warn, "recv_error", "errno={} conn={:#x}", e, token);
                }
                self.shard.on_peer_closed(token, Some(e));
            }
        }
    }

    /// `on_recv` of a TLS connection: as for plaintext, the shard getting
    /// what rustls made of the bytes.
    fn on_tls_recv(&mut self, s: usize, token: Token, migrating: bool, res: i32) {
        if res > 0 {
            let rearm = self.tls_received(s, res as usize);
            if migrating {
                self.finish_migrate(s);
                return;
            }
            let c = &self.conns[s];
            let established = c.tls.as_ref().is_some_and(|t| t.established());
            if rearm
                && !c.closing
                && c.migrate_to.is_none()
                && !c.recv.is_lent()
                && (!established || self.shard.wants_input(token))
            {
                self.arm_recv(s);
            }
            return;
        }
        match -res {
            0 => self.shard.on_peer_closed(token, None),
            libc::EINTR | libc::EAGAIN if !migrating => self.arm_recv(s),
            libc::ECANCELED | libc::EINTR | libc::EAGAIN => {}
            e => self.shard.on_peer_closed(token, Some(e)),
        }
        if migrating {
            self.finish_migrate(s);
        }
    }

    pub(super) fn submit_send(&mut self, slot: usize) {
        let c = &mut self.conns[slot];
        let ud = ring_io::encode(Op::Send, (c.token >> 32) as u32, slot as u32);
        let lent = Lent::lend(c.send.take_ours(), ud);
        // A release assert: the pointer arithmetic below rests on it.
        assert!(
            c.sent < lent.len(),
            "send resumed at {} of {} bytes",
            c.sent,
            lent.len()
        );
        // SAFETY (pointer arithmetic): `sent < len` (asserted above), so the
        // pointer stays within the allocation. Short sends resume here;
        // tests/pipelining.rs checks every answer byte of large answers.
        let ptr = unsafe { lent.ptr().add(c.sent) };
        let len = (lent.len() - c.sent) as u32;
        c.send = Slot::Kernel(lent);
        let sqe = opcode::Send::new(types::Fd(c.fd), ptr, len)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(ud);
        // SAFETY: the send buffer is `Lent` to this op until its completion
        // (on_send reclaims it, and `reclaim` panics for any other op); the
        // slot is not recycled meanwhile (maybe_close waits for it). Were it
        // reused early, the answers of pipelined requests would be sent from
        // overwritten bytes: tests/pipelining.rs checks every answer byte.
        unsafe { self.push(sqe) };
    }

    pub(super) fn on_send(&mut self, ud: u64, gen: u32, slot: u32, res: i32) {
        self.conn_checked("send", gen, slot);
        let s = slot as usize;
        let token = self.conns[s].token;
        let len = self.conns[s].send.reclaim(ud).len();
        if self.conns[s].tls.is_some() {
            self.tls_sent(s, token, res, len);
            self.maybe_close(s);
            return;
        }
        if res >= 0 {
            let c = &mut self.conns[s];
            c.sent += res as usize;
            if c.sent < len && !c.closing {
                // Short write: send the rest.
                self.submit_send(s);
                return;
            }
            let done = c.sent >= len;
            c.send.ours().clear();
            c.sent = 0;
            self.shard
                .on_send_done(token, if done { Ok(()) } else { Err(libc::ECANCELED) });
        } else if matches!(-res, libc::EINTR | libc::EAGAIN) && !self.conns[s].closing {
            self.submit_send(s);
            return;
        } else {
            let c = &mut self.conns[s];
            c.send.ours().clear();
            c.sent = 0;
            self.shard.on_send_done(token, Err(-res));
        }
        self.maybe_close(s);
    }

    /// Closes the socket once no op references it, then tells the shard.
    fn maybe_close(&mut self, slot: usize) {
        let c = &mut self.conns[slot];
        if !c.closing || c.recv.is_lent() || c.send.is_lent() || c.token == 0 {
            return;
        }
        let sqe = opcode::Close::new(types::Fd(c.fd))
            .build()
            .user_data(ring_io::encode(Op::Close, 0, slot as u32));
        let token = c.token;
        c.token = 0;
        c.fd = -1;
        c.migrate_to = None;
        c.tls = None;
        c.sniffed = false;
        // SAFETY: references no buffer; no other op uses this fd any more.
        unsafe { self.push(sqe) };
        self.closed.push(token);
    }

    /// `Cmd::Send`: the shard's answers for `token` go out.
    pub(super) fn send_answers(&mut self, token: Token) {
        let s = token as u32 as usize;
        debug_assert_eq!(self.conns[s].token, token);
        if self.conns[s].tls.is_some() {
            self.tls_send_answers(s, token);
            return;
        }
        let mut out = self.conns[s].send.take_ours();
        self.shard.take_output(token, &mut out);
        self.conns[s].send = Slot::Ours(out);
        self.conns[s].sent = 0;
        self.submit_send(s);
    }

    /// `Cmd::Close`: cancels the receive and the send in flight, closes
    /// once no op references the socket.
    ///
    /// The shard asks for a close while a send is in flight only when it
    /// ends the connection (a session ended, a protocol violation, a
    /// step-down): an answer it wants delivered is closed after its send
    /// completed. A send still in flight by then is one the kernel could
    /// not take, because the peer stopped reading and its window is full;
    /// left alone it never completes and the descriptor stays open for as
    /// long as the peer keeps the connection (tests/refuse_leak.rs,
    /// `a_session_that_does_not_read_its_answers_is_closed`). What the
    /// kernel already took is still delivered before the FIN. The buffer
    /// stays lent until the send's own completion (`ECANCELED`, or its
    /// result if it won the race); a Locking-Center answer is one byte, so
    /// a cancelled send carried none of it, and a grant in it is given back.
    pub(super) fn close_conn(&mut self, token: Token) {
        let s = token as u32 as usize;
        if self.conns[s].tls.is_some() && !self.conns[s].closing {
            self.tls_goodbye(s);
        }
        let c = &mut self.conns[s];
        debug_assert_eq!(c.token, token);
        c.closing = true;
        let gen = (c.token >> 32) as u32;
        let mut targets = [None, None];
        if c.recv.is_lent() && !c.cancel_submitted {
            c.cancel_submitted = true;
            targets[0] = Some(ring_io::encode(Op::Recv, gen, s as u32));
        }
        if c.send.is_lent() && !c.send_cancel_submitted {
            c.send_cancel_submitted = true;
            targets[1] = Some(ring_io::encode(Op::Send, gen, s as u32));
        }
        for target in targets.into_iter().flatten() {
            let sqe = opcode::AsyncCancel::new(target)
                .build()
                .user_data(ring_io::encode(Op::Cancel, 0, s as u32));
            // SAFETY: references no buffer.
            unsafe { self.push(sqe) };
        }
        self.maybe_close(s);
    }

    /// `Cmd::Farewell`: at shutdown, `-` to a queued Lock, best effort.
    pub(super) fn farewell(&mut self, token: Token) {
        let s = token as u32 as usize;
        if self.conns[s].tls.is_some() {
            self.tls_farewell(s);
            return;
        }
        let c = &self.conns[s];
        // SAFETY: a live connection's fd is open; one static byte.
        unsafe {
            libc::send(
                c.fd,
                REFUSED.as_ptr() as *const libc::c_void,
                1,
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            );
        }
    }

    /// `Cmd::Migrate`: the connection goes to shard `to` once its receive
    /// is back (cancelled or completed).
    pub(super) fn migrate(&mut self, token: Token, to: usize) {
        let s = token as u32 as usize;
        let c = &mut self.conns[s];
        debug_assert_eq!(c.token, token);
        c.migrate_to = Some(to);
        if c.recv.is_lent() {
            if !c.cancel_submitted {
                c.cancel_submitted = true;
                let target = ring_io::encode(Op::Recv, (c.token >> 32) as u32, s as u32);
                let sqe = opcode::AsyncCancel::new(target)
                    .build()
                    .user_data(ring_io::encode(Op::Cancel, 0, s as u32));
                // SAFETY: references no buffer.
                unsafe { self.push(sqe) };
            }
        } else {
            self.finish_migrate(s);
        }
    }

    /// Hands a connection over from another shard.
    pub(super) fn adopt(
        &mut self,
        fd: RawFd,
        conn: crate::shard::Detached,
        tls: Option<Box<ConnTls>>,
    ) {
        let Some(token) = self.shard.on_adopt(&conn) else {
            refuse_fd(fd);
            return;
        };
        let slot = token as u32 as usize;
        while self.conns.len() <= slot {
            self.conns.push(DConn::new());
        }
        let c = &mut self.conns[slot];
        assert_eq!(c.token, 0, "the shard reused a slot the driver still holds");
        c.token = token;
        c.fd = fd;
        c.sent = 0;
        c.closing = false;
        c.cancel_submitted = false;
        c.send_cancel_submitted = false;
        c.migrate_to = None;
        c.sniffed = true;
        let is_tls = tls.is_some();
        c.tls = tls;
        if !conn.read_closed {
            self.arm_recv(slot);
        }
        if is_tls {
            self.tls_adopted(slot);
        }
        self.shard.resume(token);
    }

    /// A Migrating connection's receive is back: send it to its new shard.
    pub(super) fn finish_migrate(&mut self, slot: usize) {
        let c = &mut self.conns[slot];
        if c.migrate_to.is_none() || c.send.is_lent() || c.recv.is_lent() {
            // A TLS connection's own send (or the receive) still holds a
            // buffer: its completion comes back here.
            return;
        }
        let Some(to) = c.migrate_to.take() else {
            return;
        };
        let token = c.token;
        match self.shard.detach(token) {
            Some(d) => {
                let c = &mut self.conns[slot];
                let fd = c.fd;
                c.token = 0;
                c.fd = -1;
                c.closing = false;
                c.cancel_submitted = false;
                c.send_cancel_submitted = false;
                c.sniffed = false;
                let tls = c.tls.take();
                let mesh = self.mesh.as_mut().expect("a migration needs a mesh");
                if let Err(Msg::Adopt { fd, .. }) = mesh.send(to, Msg::Adopt { fd, conn: d, tls }) {
                    log!(Level::Warn, "limit_reached", "limit=shard_queue to={}", to);
                    refuse_fd(fd);
                }
            }
            // It died meanwhile: the shard asked for a close.
            None => {
                self.conns[slot].closing = true;
                self.maybe_close(slot);
            }
        }
    }
}
