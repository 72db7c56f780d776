//! The driver's side of a connection slot ([`DConn`]): the socket, the
//! receive and send buffers and their owner states, the close and
//! hand-over flags, a TLS connection's session. Its I/O is in `conn.rs`.

use std::os::fd::RawFd;

use super::buf::Slot;
use super::clienttls_state::ConnTls;
use crate::config::LOCK_RECV_BUF;
use crate::core::Token;

/// The driver's side of one connection slot (same index as the shard's).
pub(super) struct DConn {
    /// The shard's token for the occupant; 0 when unused.
    pub(super) token: Token,
    pub(super) fd: RawFd,
    pub(super) recv: Slot,
    pub(super) send: Slot,
    pub(super) sent: usize,
    pub(super) closing: bool,
    pub(super) cancel_submitted: bool,
    /// A cancel of the send in flight was submitted (at a close).
    pub(super) send_cancel_submitted: bool,
    /// The shard hands this connection to that shard once its receive is
    /// back (cancelled or completed).
    pub(super) migrate_to: Option<usize>,
    /// The first byte was looked at (with certificates: TLS or not).
    pub(super) sniffed: bool,
    /// A TLS connection's state (see `clienttls`).
    pub(super) tls: Option<Box<ConnTls>>,
}

impl DConn {
    pub(super) fn new() -> DConn {
        DConn {
            token: 0,
            fd: -1,
            recv: Slot::Ours(vec![0u8; LOCK_RECV_BUF]),
            send: Slot::Ours(Vec::with_capacity(16)),
            sent: 0,
            closing: false,
            cancel_submitted: false,
            send_cancel_submitted: false,
            migrate_to: None,
            sniffed: false,
            tls: None,
        }
    }
}
