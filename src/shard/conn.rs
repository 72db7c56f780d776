//! Per-connection protocol state, as the shard sees it. The shard never
//! sees a socket or a kernel buffer: received bytes are copied in by the
//! driver, answers are handed over by swapping `out` with the driver's
//! empty send buffer.
//!
//! Slots live in a `Vec<Conn>` with a free list and are reused with their
//! buffers, so a connection-per-request client causes no allocation once
//! the pool has reached its high-water mark.

use std::net::SocketAddr;

use crate::config::LOCK_RECV_BUF;
use crate::core::list::{Link, Linked};
use crate::core::Source;
use crate::protocol::Action;

/// A slot's generations wrap within 28 bits: the driver packs one into
/// each io_uring `user_data` beside a 4-bit op and the 32-bit slot, so that
/// a completion aimed at a slot's previous occupant is told apart.
pub const GEN_MASK: u32 = 0x0FFF_FFFF;

/// Next generation for a slot: never 0, wraps within [`GEN_MASK`].
pub fn next_gen(gen: u32) -> u32 {
    let g = (gen + 1) & GEN_MASK;
    if g == 0 {
        1
    } else {
        g
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    Lock,
    Admin,
}

/// Where a connection is in its request/answer cycle. Exactly one request
/// is being served at a time; the next buffered frame is decoded only once
/// the previous answer was handed to the kernel completely.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Slot unused.
    Free,
    /// No request outstanding: the next frame is decoded when it is whole.
    Idle,
    /// A decoded request is being executed (within one event; an effect
    /// answers it or it queues).
    Executing,
    /// A Lock waits in the table's queue (waiter node `waiter`).
    Queued { waiter: u32 },
    /// The answer is in `out`; it leaves once the log is durable up to
    /// `gate_lsn` (durable mode) — at the latest at the end of this tick.
    Answered,
    /// The answer is the driver's: the send is in flight.
    Sending,
    /// The next request's key belongs to another shard: the driver stops
    /// reading, then hands the connection over ([`crate::shard::Cmd::Migrate`]).
    Migrating,
    /// Waiting for every shard's part of a scatter/gather request.
    Gathering,
    /// Cluster mode, on a node that does not serve: the request was
    /// forwarded to the leader as number `id` and waits for its answer
    /// (see `shard::forward`).
    Forwarded { id: u64 },
    /// A session connection (its first frame was a Hello): frames are
    /// decoded as they arrive, any number outstanding, answered in the
    /// order they are decided (see [`crate::shard::session`]).
    Session,
    /// The shard asked the driver to close; the slot is freed when the
    /// driver reports the close (no op references the socket any more).
    Closing,
}

pub struct Conn {
    /// Bumped each time the slot is reused; 0 only before first use.
    pub gen: u32,
    pub state: State,
    pub port: Port,
    pub peer: SocketAddr,
    /// The peer's IP as a source name (an empty wire source), formatted on
    /// first use.
    pub peer_ip: Option<Source>,
    /// Opted in (action Persist) to several requests on this connection.
    /// Without it the connection is closed after its first answer.
    pub persistent: bool,
    /// The peer closed its sending side (EOF) or the connection failed:
    /// what was received is still served, nothing more will arrive.
    pub read_closed: bool,
    /// The connection is broken (reset, send error, protocol violation):
    /// nothing more is sent either.
    pub dead: bool,
    /// Close once the answer now in `out` has been sent (bad input).
    pub close_after_send: bool,
    /// Received, not yet decoded bytes.
    pub rbuf: Vec<u8>,
    /// Answer bytes not yet handed to the driver.
    pub out: Vec<u8>,
    pub action: Option<Action>,
    /// A grant `(key slot, grant id)` whose `+` has not been handed to the
    /// kernel: given back if the connection dies first.
    pub grant: Option<(u32, u64)>,
    /// The `+` of `grant` is in the send now in flight.
    pub grant_in_flight: bool,
    /// On the shard's dirty list (output to hand over at the end of tick).
    pub dirty: bool,
    /// The output may leave once the log is durable up to this LSN.
    pub gate_lsn: u64,
    /// On the shard's partial-frame list (frame read timeout).
    pub partial_link: Link,
    pub partial_since_us: u64,
    /// Session id (after a Hello), 0 otherwise.
    pub sid: u64,
    /// The session's keep-alive deadline, and when its client was last heard.
    pub keepalive_us: u64,
    pub heard_us: u64,
    /// Shards that may hold state of this session, one bit each (all of
    /// them beyond 64 shards).
    pub mask: u64,
    /// A session's output is being sent (more may gather in `out`).
    pub sending: bool,
    /// Last traffic either way (the idle timeout).
    pub active_us: u64,
    /// On the shard's idle list (ordered by `active_us`).
    pub idle_link: Link,
    /// An admin connection that presented the auth token or a client
    /// certificate.
    pub authed: bool,
    /// The connection speaks TLS (the driver decrypts and encrypts; the
    /// shard sees plaintext). Set before any of its bytes arrive.
    pub tls: bool,
    /// The client name of the verified client certificate it presented.
    pub cert_client: Option<Box<str>>,
    /// On the leader: this slot serves a request forwarded by node `.0`
    /// as its number `.1`. It has no socket: its answer goes back over
    /// the peer link, and the slot is freed with it.
    pub fwd: Option<(u64, u64)>,
    /// On a follower: the `+` in `out` is a grant of node `.0`'s table;
    /// given back there if it is not delivered.
    pub fwd_grant: Option<(u64, crate::cluster::wire::Grant)>,
}

/// Link slot 0: the partial-frame list; 1: the idle list.
impl Linked for Conn {
    fn link(&self, which: usize) -> &Link {
        if which == 1 {
            &self.idle_link
        } else {
            &self.partial_link
        }
    }
    fn link_mut(&mut self, which: usize) -> &mut Link {
        if which == 1 {
            &mut self.idle_link
        } else {
            &mut self.partial_link
        }
    }
}

impl Default for Conn {
    fn default() -> Conn {
        Conn::new()
    }
}

impl Conn {
    pub fn new() -> Conn {
        Conn {
            gen: 0,
            state: State::Free,
            port: Port::Lock,
            peer: SocketAddr::from(([0, 0, 0, 0], 0)),
            peer_ip: None,
            persistent: false,
            read_closed: false,
            dead: false,
            close_after_send: false,
            // Room for a full pipeline plus one more receive: no realloc.
            rbuf: Vec::with_capacity(2 * LOCK_RECV_BUF),
            out: Vec::with_capacity(16),
            action: None,
            grant: None,
            grant_in_flight: false,
            dirty: false,
            gate_lsn: 0,
            partial_link: Link::default(),
            partial_since_us: 0,
            sid: 0,
            keepalive_us: 0,
            heard_us: 0,
            mask: 0,
            sending: false,
            active_us: 0,
            idle_link: Link::default(),
            authed: false,
            tls: false,
            cert_client: None,
            fwd: None,
            fwd_grant: None,
        }
    }

    pub fn open(&mut self, port: Port, peer: SocketAddr) {
        assert_eq!(self.state, State::Free, "opening a live slot");
        self.gen = next_gen(self.gen);
        self.state = State::Idle;
        self.port = port;
        self.peer = peer;
        if port == Port::Lock && self.rbuf.capacity() > 4 * LOCK_RECV_BUF {
            // A slot that served a large admin command goes back to size.
            self.rbuf = Vec::with_capacity(2 * LOCK_RECV_BUF);
        }
    }

    /// Forgets the connection; buffers are kept for the next occupant.
    pub fn release(&mut self) {
        assert_eq!(self.state, State::Closing, "recycling a slot not closed");
        assert!(
            !self.partial_link.linked,
            "recycling a slot still on the partial list"
        );
        assert!(
            !self.idle_link.linked,
            "recycling a slot still on the idle list"
        );
        self.state = State::Free;
        self.peer_ip = None;
        self.persistent = false;
        self.read_closed = false;
        self.dead = false;
        self.close_after_send = false;
        self.rbuf.clear();
        self.out.clear();
        self.action = None;
        self.grant = None;
        self.grant_in_flight = false;
        self.dirty = false;
        self.gate_lsn = 0;
        self.partial_since_us = 0;
        self.sid = 0;
        self.mask = 0;
        self.authed = false;
        self.tls = false;
        self.cert_client = None;
        self.sending = false;
        self.fwd = None;
        self.fwd_grant = None;
    }

    pub fn live(&self) -> bool {
        !matches!(self.state, State::Free | State::Closing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_wrap_within_28_bits_and_skip_0() {
        assert_eq!(next_gen(0), 1);
        assert_eq!(next_gen(41), 42);
        assert_eq!(next_gen(GEN_MASK), 1);
    }
}
