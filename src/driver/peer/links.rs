//! The peer links' data: their limits ([`PENDING_MAX`],
//! [`HELLO_DEADLINE_US`], ...), the kinds of a peer op's `user_data`, one
//! link each way ([`Outbound`], [`Inbound`]) and a loop's set of them
//! ([`Peers`]). Their I/O is the loop's: `super` (dialing, the outbound
//! links, a peer op's completion) and `inbound.rs` (accepted links).

use std::net::{SocketAddr, TcpListener};
use std::os::fd::RawFd;

use super::super::buf::Slot;
use super::super::certs::CertsView;
use crate::cluster::wire;

/// How long a failed link waits before it is dialed again.
pub const REDIAL_US: u64 = 100_000;
/// The most bytes queued for one peer.
pub const QUEUE_MAX: usize = 8 << 20;
/// An accepted link finishes its TLS handshake and its Hello within this
/// (and a dialed link its handshake), or it is closed.
pub const HELLO_DEADLINE_US: u64 = 5_000_000;
/// Accepted links still waiting for their Hello, per shard; a new one
/// evicts the oldest (a dialer that keeps connections open without
/// speaking cannot lock the real peers out).
pub const PENDING_MAX: usize = 16;
pub(super) const RECV_BUF: usize = 64 * 1024;
/// A link's receive buffer until its Hello is accepted: a TLS ClientHello
/// or a Hello fits, and a flood of dialers that never get that far costs
/// little memory and no 64 KiB clearing each.
pub(super) const PENDING_RECV_BUF: usize = 4 * 1024;
/// An outbound link's input: TLS handshake records (a few KiB) and alerts.
pub(super) const WATCH_BUF: usize = 8 * 1024;
/// A TLS handshake record starts with this content type.
pub(super) const TLS_HANDSHAKE: u8 = 0x16;

// The `slot` field of a peer op's user_data: kind in the top byte, the
// link's index below.
pub(super) const K_ACCEPT: u32 = 1 << 24;
pub(super) const K_RECV: u32 = 2 << 24;
pub(super) const K_CONNECT: u32 = 3 << 24;
pub(super) const K_SEND: u32 = 4 << 24;
pub(super) const K_CLOSE: u32 = 5 << 24;
/// The watch on an outbound link: its input, which is TLS handshake
/// records only (the peer never sends data on our outbound link); with
/// `--insecure`, a receive that completes only when the peer closes or
/// resets it.
pub(super) const K_WATCH: u32 = 6 << 24;
/// A send on an accepted link (TLS handshake flights and alerts).
pub(super) const K_ISEND: u32 = 7 << 24;
pub(super) const KIND_MASK: u32 = 0xFF << 24;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OutState {
    /// Dial again at this time.
    Down {
        at_us: u64,
    },
    Connecting,
    Up,
    /// The peer left the group: never dialed again.
    Retired,
}

/// This node's link to one peer: write only.
pub(super) struct Outbound {
    pub(super) node: u64,
    pub(super) addr: Box<socket2::SockAddr>,
    pub(super) shown: SocketAddr,
    pub(super) fd: RawFd,
    pub(super) state: OutState,
    /// Plaintext frames waiting for the send slot (and, with TLS, for the
    /// handshake to finish).
    pub(super) queue: Vec<u8>,
    pub(super) send: Slot,
    pub(super) sent: usize,
    pub(super) gen: u32,
    /// Logged the current outage already.
    pub(super) quiet: bool,
    /// The watch receive's buffer.
    pub(super) watch: Slot,
    /// The link failed: close it once no op references it.
    pub(super) dead: bool,
    /// When it last came up (mono µs).
    pub(super) up_since_us: u64,
    /// The peer left the group: close the link and never dial it again.
    pub(super) retired: bool,
    pub(super) tls: Option<rustls::Connection>,
}

impl Outbound {
    pub(super) fn new(node: u64, a: SocketAddr) -> Outbound {
        Outbound {
            node,
            addr: Box::new(socket2::SockAddr::from(a)),
            shown: a,
            fd: -1,
            state: OutState::Down { at_us: 0 },
            queue: Vec::new(),
            send: Slot::Ours(Vec::new()),
            sent: 0,
            gen: 0,
            quiet: false,
            watch: Slot::Ours(vec![0u8; WATCH_BUF]),
            dead: false,
            up_since_us: 0,
            retired: false,
            tls: None,
        }
    }
}

/// An accepted link (a peer's outbound): its data is read only; with TLS
/// its handshake flights are sent.
pub(super) struct Inbound {
    pub(super) fd: RawFd,
    pub(super) recv: Slot,
    /// Plaintext received and not yet parsed into frames.
    pub(super) rbuf: Vec<u8>,
    /// The peer, once its Hello was accepted.
    pub(super) node: Option<u64>,
    pub(super) gen: u32,
    pub(super) tls: Option<rustls::Connection>,
    /// Nothing received yet (the first byte is checked).
    pub(super) fresh: bool,
    /// The node id the peer's certificate names (after the handshake).
    pub(super) cert_node: Option<u64>,
    pub(super) send: Slot,
    pub(super) sent: usize,
    /// Handshake and Hello due by then (mono µs).
    pub(super) deadline_us: u64,
    /// Failed: closed once no op references it.
    pub(super) dead: bool,
}

pub(in crate::driver) struct Peers {
    /// Refused links are logged at most every 10 s (a misconfigured peer
    /// dials again every [`REDIAL_US`]).
    pub(super) refusal_logged_us: u64,
    pub(super) listener: TcpListener,
    pub(super) inbound: Vec<Option<Inbound>>,
    pub(super) outbound: Vec<Outbound>,
    pub(super) hello: Vec<u8>,
    /// `--certs-dir`: every link is mutual TLS; `None` with `--insecure`.
    pub(super) certs: Option<CertsView>,
}

impl Peers {
    /// `peers`: every other node's id and the address of its link for this
    /// shard; `hello`: this link's Hello; `certs`: the node's certificates
    /// (`None`: plaintext links, `--insecure`).
    pub(in crate::driver) fn new(
        listener: TcpListener,
        peers: Vec<(u64, SocketAddr)>,
        hello: &wire::Hello,
        certs: Option<CertsView>,
    ) -> Peers {
        let mut h = Vec::new();
        wire::encode_hello(hello, &mut h);
        Peers {
            refusal_logged_us: 0,
            listener,
            inbound: Vec::new(),
            outbound: peers
                .into_iter()
                .map(|(node, a)| Outbound::new(node, a))
                .collect(),
            hello: h,
            certs,
        }
    }

    /// Gives up the buffers still lent (the server stops): leaked, never
    /// freed under the kernel.
    pub(in crate::driver) fn leak_in_flight(&mut self) {
        for i in self.inbound.iter_mut().flatten() {
            for slot in [&mut i.recv, &mut i.send] {
                if let Slot::Kernel(l) = std::mem::replace(slot, Slot::Moving) {
                    l.leak();
                }
            }
        }
        for o in &mut self.outbound {
            if let Slot::Kernel(l) = std::mem::replace(&mut o.send, Slot::Moving) {
                l.leak();
            }
            if let Slot::Kernel(l) = std::mem::replace(&mut o.watch, Slot::Moving) {
                l.leak();
            }
            if o.state == OutState::Connecting {
                // The connect's address may still be read by the kernel.
                std::mem::forget(std::mem::replace(
                    &mut o.addr,
                    Box::new(socket2::SockAddr::from(o.shown)),
                ));
            }
        }
    }

    /// Live accepted links (for the metrics and tests).
    pub(in crate::driver) fn inbound_links(&self) -> usize {
        self.inbound.iter().flatten().filter(|i| !i.dead).count()
    }
}
