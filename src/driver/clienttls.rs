//! TLS on the lock and admin ports (`--certs-dir`), in the loop itself.
//!
//! A connection's first byte decides: 0x16 (a TLS handshake record) makes
//! it a TLS connection; anything else stays plaintext (a Locking-Center
//! action 1–6, a session frame 7–13, an admin command), and the shard's
//! policy refuses what needs TLS (`Config::client_tls_required`). The
//! values do not overlap, so one port serves all three.
//!
//! For a TLS connection the driver sits between the socket and the
//! shard: ciphertext a receive brought goes through rustls
//! ([`tlsio::input`]) and the shard gets the plaintext, as it would from
//! a plaintext socket; the shard's answers are encrypted before they are
//! lent to a send. The shard learns of the handshake's end first
//! ([`crate::shard::Shard::on_tls`], with the client certificate's name),
//! before any plaintext.
//!
//! Sends: one send op per connection at a time. The driver sends on its
//! own (handshake flights) and for the shard (`Cmd::Send`); records the
//! shard asks for while a driver send is in flight wait in rustls, in
//! order, and leave with the next send. The shard is told its send is
//! done (`on_send_done`) only once a send that carried its records
//! completed — a `+` counts as delivered when the kernel took its record.
//!
//! Pacing: a handshake's crypto (key exchange, signature, a client
//! certificate's verification) costs a few hundred microseconds, which
//! would stall every other connection of the loop during a storm of new
//! connections. At most [`HANDSHAKE_STEPS_PER_TICK`] handshake steps run
//! per loop tick; a connection over the budget keeps its bytes and waits
//! (its receive not re-armed) for a later tick, oldest first. A handshake
//! not finished within `--frame-timeout-ms` of its first byte is closed.

use super::clienttls_state::{ConnTls, HANDSHAKE_STEPS_PER_TICK};
use super::event_loop::Loop;
use super::tlsio;
use crate::core::Token;
use crate::log::Level;
use crate::metrics::Handshake;

/// The first byte of a TLS handshake record (ContentType handshake).
pub(super) const TLS_HANDSHAKE: u8 = 0x16;

impl Loop {
    /// The first bytes of a client connection arrived: a TLS ClientHello
    /// starts TLS (with the certificates current now).
    pub(super) fn tls_sniff(&mut self, slot: usize, first: u8) {
        let Some(ct) = self.client_tls.as_mut() else {
            return;
        };
        let c = &mut self.conns[slot];
        c.sniffed = true;
        if first != TLS_HANDSHAKE {
            return;
        }
        let config = ct.certs.current().client_acceptor(ct.require_client_cert);
        match rustls::ServerConnection::new(config) {
            Ok(conn) => {
                c.tls = Some(Box::new(ConnTls {
                    conn: conn.into(),
                    established: false,
                    deferred: Vec::new(),
                    shard_waiting: false,
                    shard_in_flight: false,
                }));
                let now = super::sys::now().mono_us;
                ct.deadlines.push_back((now + ct.timeout_us, c.token));
            }
            // rustls refuses only a configuration it cannot use, which
            // `NodeTls` never builds: the connection stays plaintext and
            // the shard's policy refuses it.
            Err(e) => log!(
                Level::Error,
                "tls_error",
                "error=\"{}\"",
                crate::log::Escaped(&e)
            ),
        }
    }

    /// Bytes a receive brought on a TLS connection: decrypted for the
    /// shard, or kept for a later tick when this one's handshake budget is
    /// spent. Returns false when the receive must not be re-armed now.
    pub(super) fn tls_received(&mut self, slot: usize, n: usize) -> bool {
        let ct = self
            .client_tls
            .as_mut()
            .expect("a TLS connection has certs");
        let c = &mut self.conns[slot];
        let t = c.tls.as_mut().expect("a TLS connection");
        let data = &c.recv.ours()[..n];
        if !t.established && ct.budget == 0 {
            if t.deferred.is_empty() {
                ct.backlog.push_back(c.token);
            }
            t.deferred.extend_from_slice(data);
            return false;
        }
        let mut cipher = std::mem::take(&mut ct.cipher);
        cipher.clear();
        cipher.extend_from_slice(data);
        self.tls_process(slot, &cipher);
        if let Some(ct) = self.client_tls.as_mut() {
            ct.cipher = cipher;
        }
        true
    }

    /// Runs `cipher` through the connection's rustls and hands the shard
    /// what it yields: the handshake's end, plaintext, the TLS session's
    /// end, or a failure (the shard then closes the connection).
    fn tls_process(&mut self, slot: usize, cipher: &[u8]) {
        let ct = self
            .client_tls
            .as_mut()
            .expect("a TLS connection has certs");
        let c = &mut self.conns[slot];
        let token = c.token;
        let t = c.tls.as_mut().expect("a TLS connection");
        let mut plain = std::mem::take(&mut ct.plain);
        plain.clear();
        let handshaking = !t.established;
        let t0 = handshaking.then(|| super::sys::now().mono_us);
        let result = tlsio::input(&mut t.conn, cipher, &mut plain);
        if let Some(t0) = t0 {
            ct.budget = ct.budget.saturating_sub(1);
            self.shared
                .metrics
                .security
                .tls_handshake_time(super::sys::now().mono_us.saturating_sub(t0));
        }
        let mut established_now = None;
        let outcome = match result {
            Err(e) => {
                let now = super::sys::now().mono_us;
                if handshaking {
                    self.shared
                        .metrics
                        .security
                        .tls_handshake(Handshake::Failed);
                }
                if now >= ct.log_after_us {
                    ct.log_after_us = now + 1_000_000;
                    log!(
                        Level::Warn,
                        "tls_failed",
                        "conn={:#x} during={} error=\"{}\"",
                        token,
                        if handshaking { "handshake" } else { "session" },
                        crate::log::Escaped(&e)
                    );
                }
                // rustls has an alert for the peer: best effort, the
                // connection ends either way.
                if !c.send.is_lent() {
                    send_now(c.fd, &mut t.conn, &mut ct.cipher);
                }
                Err(())
            }
            Ok(closed) => {
                if handshaking && !t.conn.is_handshaking() {
                    t.established = true;
                    self.shared.metrics.security.tls_handshake(Handshake::Ok);
                    established_now = Some(match crate::tls::peer_identity(&t.conn) {
                        Some(crate::tls::Identity::Client(name)) => Some(name),
                        _ => None,
                    });
                }
                Ok(closed)
            }
        };
        match outcome {
            Err(()) => {
                ct.plain = plain;
                self.shard.on_peer_closed(token, Some(libc::EPROTO));
            }
            Ok(closed) => {
                if let Some(client) = established_now {
                    self.shard.on_tls(token, client.as_deref());
                }
                self.tls_flush(slot);
                if !plain.is_empty() {
                    self.shard.on_recv(token, &plain);
                }
                if closed {
                    self.shard.on_peer_closed(token, None);
                }
                if let Some(ct) = self.client_tls.as_mut() {
                    ct.plain = plain;
                }
            }
        }
    }

    /// Lends what rustls has to send (handshake flights, the shard's
    /// records) to one send, unless a send is in flight (its completion
    /// calls this again).
    pub(super) fn tls_flush(&mut self, slot: usize) {
        let c = &mut self.conns[slot];
        if c.closing || c.send.is_lent() {
            return;
        }
        let Some(t) = c.tls.as_mut() else {
            return;
        };
        if !t.conn.wants_write() {
            return;
        }
        let out = c.send.ours();
        debug_assert!(out.is_empty());
        // Writing records into a Vec cannot fail.
        let _ = tlsio::output(&mut t.conn, out);
        if out.is_empty() {
            return;
        }
        t.shard_in_flight = std::mem::take(&mut t.shard_waiting);
        c.sent = 0;
        self.submit_send(slot);
    }

    /// `Cmd::Send` on a TLS connection: the shard's answers are encrypted
    /// and sent (now, or after the driver's send in flight).
    pub(super) fn tls_send_answers(&mut self, slot: usize, token: Token) {
        let ct = self
            .client_tls
            .as_mut()
            .expect("a TLS connection has certs");
        let mut plain = std::mem::take(&mut ct.plain);
        plain.clear();
        self.shard.take_output(token, &mut plain);
        let t = self.conns[slot].tls.as_mut().expect("a TLS connection");
        t.shard_waiting = true;
        if let Err(e) = tlsio::encrypt(&mut t.conn, &plain) {
            // Only before the handshake's end, when the shard has nothing
            // to say: a bug, not the peer's doing.
            log!(
                Level::Error,
                "tls_error",
                "conn={:#x} error=\"{}\"",
                token,
                crate::log::Escaped(&e)
            );
        }
        plain.clear();
        if let Some(ct) = self.client_tls.as_mut() {
            ct.plain = plain;
        }
        self.tls_flush(slot);
    }

    /// A send of a TLS connection completed with `res` (the buffer is
    /// back, `len` bytes long).
    pub(super) fn tls_sent(&mut self, slot: usize, token: Token, res: i32, len: usize) {
        let c = &mut self.conns[slot];
        let t = c.tls.as_mut().expect("a TLS connection");
        let result = if res >= 0 {
            c.sent += res as usize;
            if c.sent < len && !c.closing {
                self.submit_send(slot);
                return;
            }
            if c.sent >= len {
                Ok(())
            } else {
                Err(libc::ECANCELED)
            }
        } else if matches!(-res, libc::EINTR | libc::EAGAIN) && !c.closing {
            self.submit_send(slot);
            return;
        } else {
            Err(-res)
        };
        c.send.ours().clear();
        c.sent = 0;
        let carried = std::mem::take(&mut t.shard_in_flight);
        // Records the shard asked for that will not leave now: its send
        // is over too.
        let stranded = (result.is_err() || c.closing) && std::mem::take(&mut t.shard_waiting);
        let closing = c.closing;
        if carried || stranded {
            self.shard.on_send_done(
                token,
                if carried {
                    result
                } else {
                    Err(libc::ECANCELED)
                },
            );
        } else if let Err(e) = result {
            if !closing {
                self.shard.on_peer_closed(token, Some(e));
            }
        }
        if self.conns[slot].migrate_to.is_some() {
            self.finish_migrate(slot);
        } else if result.is_ok() {
            self.tls_flush(slot);
        }
    }

    /// At each tick's start: a fresh handshake budget, the handshakes
    /// that waited (oldest first), and the deadlines.
    pub(super) fn tls_tick(&mut self, now_us: u64) {
        let Some(ct) = self.client_tls.as_mut() else {
            return;
        };
        ct.budget = HANDSHAKE_STEPS_PER_TICK;
        while let Some(&(deadline, token)) = ct.deadlines.front() {
            if deadline > now_us {
                break;
            }
            ct.deadlines.pop_front();
            let slot = token as u32 as usize;
            let Some(c) = self.conns.get(slot) else {
                continue;
            };
            let waiting =
                c.token == token && !c.closing && c.tls.as_ref().is_some_and(|t| !t.established);
            if waiting {
                self.shared
                    .metrics
                    .security
                    .tls_handshake(Handshake::TimedOut);
                log!(
                    Level::Debug,
                    "tls_timeout",
                    "conn={:#x} action=close",
                    token
                );
                self.shard.on_peer_closed(token, Some(libc::ETIMEDOUT));
            }
        }
        loop {
            let Some(ct) = self.client_tls.as_mut() else {
                return;
            };
            if ct.budget == 0 {
                return;
            }
            let Some(token) = ct.backlog.pop_front() else {
                return;
            };
            let slot = token as u32 as usize;
            let live = self.conns.get(slot).is_some_and(|c| {
                c.token == token && !c.closing && c.migrate_to.is_none() && c.tls.is_some()
            });
            if !live {
                continue;
            }
            let t = self.conns[slot].tls.as_mut().expect("checked");
            let cipher = std::mem::take(&mut t.deferred);
            self.tls_process(slot, &cipher);
            let c = &mut self.conns[slot];
            if !c.closing && c.migrate_to.is_none() && !c.recv.is_lent() {
                if let Some(t) = c.tls.as_mut() {
                    // Keep the allocation for a next deferral.
                    let mut cipher = cipher;
                    cipher.clear();
                    if t.deferred.is_empty() {
                        t.deferred = cipher;
                    }
                }
                self.arm_recv(slot);
            }
        }
    }

    /// Best effort at a close: the TLS session's close_notify, so the
    /// client can tell the end from a cut.
    pub(super) fn tls_goodbye(&mut self, slot: usize) {
        let Some(ct) = self.client_tls.as_mut() else {
            return;
        };
        let c = &mut self.conns[slot];
        if c.send.is_lent() {
            return;
        }
        if let Some(t) = c.tls.as_mut() {
            t.conn.send_close_notify();
            send_now(c.fd, &mut t.conn, &mut ct.cipher);
        }
    }

    /// `Cmd::Farewell` on a TLS connection: `-`, encrypted, best effort.
    pub(super) fn tls_farewell(&mut self, slot: usize) {
        let Some(ct) = self.client_tls.as_mut() else {
            return;
        };
        let c = &mut self.conns[slot];
        if c.send.is_lent() {
            return;
        }
        if let Some(t) = c.tls.as_mut() {
            if tlsio::encrypt(&mut t.conn, b"-").is_ok() {
                send_now(c.fd, &mut t.conn, &mut ct.cipher);
            }
        }
    }

    /// Queues a TLS connection that moved here from another shard.
    pub(super) fn tls_adopted(&mut self, slot: usize) {
        self.tls_flush(slot);
    }
}

/// Sends what `conn` has to send with one non-blocking `send(2)`, outside
/// the ring (an alert, a close_notify, a farewell): only when no send op
/// is in flight on the socket, so nothing interleaves with lent records.
fn send_now(fd: std::os::fd::RawFd, conn: &mut rustls::Connection, scratch: &mut Vec<u8>) {
    scratch.clear();
    if tlsio::output(conn, scratch).is_err() || scratch.is_empty() {
        return;
    }
    // SAFETY: `scratch` is a live buffer of `len` bytes for the call's
    // duration (the kernel copies it before returning), and no send op is
    // in flight on `fd` (callers check `send.is_lent()`), so these records
    // never interleave with lent ones. `fd` is the open socket of a live
    // connection: its close waits for `maybe_close`, which runs after
    // this. Were the fd already closed and its number reused, the alert or
    // close_notify would land in another client's TLS stream and break it:
    // tests/client_tls.rs sees that (the deadline test reads exactly one
    // close_notify, the storm and reload tests fail any session that gets
    // foreign records).
    unsafe {
        libc::send(
            fd,
            scratch.as_ptr() as *const libc::c_void,
            scratch.len(),
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        );
    }
    scratch.clear();
}
