//! Per-connection state. Slots live in a `Vec<Conn>` with a free list and
//! are reused with their buffers, so a connection-per-request client causes
//! no allocation once the pool has grown to its high-water mark.

use std::net::SocketAddr;
use std::os::fd::RawFd;

use crate::config::LOCK_RECV_BUF;
use crate::core::list::{Link, Linked};
use crate::protocol::Action;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    Lock,
    Admin,
}

pub struct Conn {
    /// Bumped each time the slot is reused; 0 only before first use.
    pub gen: u32,
    pub live: bool,
    pub port: Port,
    pub fd: RawFd,
    /// The peer's address, looked up (one getpeername) only when a request
    /// needs it: Lock/TryLock record the endpoint, an empty source means the
    /// peer IP. Unlock and resets never pay for it.
    pub peer: Option<SocketAddr>,
    /// The peer's IP as a source name (an empty wire source), formatted on
    /// first use.
    pub peer_ip: Option<crate::core::Name>,
    /// Received, not yet decoded bytes. Never lent to the kernel: each recv
    /// lands in `recv_buf` and its bytes are copied here on completion, so
    /// decoding and draining frames can never race a recv in flight.
    pub rbuf: Vec<u8>,
    /// The landing buffer of the armed recv. It belongs to the kernel while
    /// `recv_inflight` and is only read after the recv's final completion.
    pub recv_buf: Box<[u8]>,
    /// Answer bytes waiting to be sent.
    pub out: Vec<u8>,
    /// Bytes handed to the kernel (immutable while `send_inflight`).
    pub sending: Vec<u8>,
    pub sent: usize,
    pub recv_inflight: bool,
    pub send_inflight: bool,
    pub cancel_submitted: bool,
    /// No more requests: hung up, broke the protocol, or is being closed.
    pub closing: bool,
    /// Close once `out` (a `-` for bad input) has been written.
    pub close_after_send: bool,
    /// A request is being served; the next frame waits.
    pub outstanding: bool,
    /// The outstanding request ends when the current send completes.
    pub reply_done_after_send: bool,
    pub action: Option<Action>,
    /// The queued waiter of the outstanding Lock, if any.
    pub waiter: Option<u32>,
    /// A grant `(key slot, grant id)` whose `+` has not been delivered.
    pub grant: Option<(u32, u64)>,
    /// The grant's `+` is in the send now in flight.
    pub grant_in_flight: bool,
    pub dirty: bool,
    /// The output may leave once the log is durable up to this LSN.
    pub gate_lsn: u64,
    /// On the server's partial-frame list (frame read timeout).
    pub partial_link: Link,
    pub partial_since_us: u64,
}

impl Linked for Conn {
    fn link(&self, _: usize) -> &Link {
        &self.partial_link
    }
    fn link_mut(&mut self, _: usize) -> &mut Link {
        &mut self.partial_link
    }
}

impl Conn {
    pub fn new() -> Conn {
        Conn {
            gen: 0,
            live: false,
            port: Port::Lock,
            fd: -1,
            peer: None,
            peer_ip: None,
            // Room for a full buffer plus one more recv: no reallocation.
            rbuf: Vec::with_capacity(2 * LOCK_RECV_BUF),
            recv_buf: vec![0u8; LOCK_RECV_BUF].into_boxed_slice(),
            out: Vec::with_capacity(16),
            sending: Vec::with_capacity(16),
            sent: 0,
            recv_inflight: false,
            send_inflight: false,
            cancel_submitted: false,
            closing: false,
            close_after_send: false,
            outstanding: false,
            reply_done_after_send: false,
            action: None,
            waiter: None,
            grant: None,
            grant_in_flight: false,
            dirty: false,
            gate_lsn: 0,
            partial_link: Link::default(),
            partial_since_us: 0,
        }
    }

    pub fn open(&mut self, fd: RawFd, port: Port) {
        assert!(!self.live, "opening a live slot");
        self.gen = crate::io::next_gen(self.gen);
        self.live = true;
        self.port = port;
        self.fd = fd;
        self.peer = None;
        self.peer_ip = None;
        if port == Port::Lock && self.rbuf.capacity() > 4 * LOCK_RECV_BUF {
            // A slot that served a large admin command goes back to size.
            self.rbuf = Vec::with_capacity(2 * LOCK_RECV_BUF);
        }
    }

    /// Forgets the connection; buffers are kept for the next occupant.
    pub fn release(&mut self) {
        assert!(
            !self.recv_inflight && !self.send_inflight,
            "recycling a slot with ops in flight"
        );
        assert!(
            !self.partial_link.linked,
            "recycling a slot still on the partial list"
        );
        self.live = false;
        self.fd = -1;
        self.rbuf.clear();
        self.out.clear();
        self.sending.clear();
        self.sent = 0;
        self.cancel_submitted = false;
        self.closing = false;
        self.close_after_send = false;
        self.outstanding = false;
        self.reply_done_after_send = false;
        self.action = None;
        self.waiter = None;
        self.grant = None;
        self.grant_in_flight = false;
        self.dirty = false;
        self.gate_lsn = 0;
        self.partial_since_us = 0;
    }
}
