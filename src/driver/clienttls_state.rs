//! Client TLS's data (`--certs-dir` on the lock and admin ports): one
//! connection's TLS session ([`ConnTls`], which moves with its connection
//! to another shard) and a loop's handshake budget, backlog and deadlines
//! ([`ClientTls`]). The loop drives them in `clienttls.rs`.

use std::collections::VecDeque;

use super::certs::CertsView;
use crate::core::Token;

/// Handshake steps (one pass of received bytes through rustls before the
/// handshake finished) each loop runs per tick at most.
pub(super) const HANDSHAKE_STEPS_PER_TICK: u32 = 4;

/// One TLS connection's state (boxed in its [`super::conn_slot::DConn`]; it
/// travels with a connection that moves to another shard).
#[derive(Debug)]
pub struct ConnTls {
    pub(super) conn: rustls::Connection,
    /// The handshake finished and the shard was told.
    pub(super) established: bool,
    /// Ciphertext received while over the tick's handshake budget.
    pub(super) deferred: Vec<u8>,
    /// Shard output encrypted into `conn` not yet lent to a send.
    pub(super) shard_waiting: bool,
    /// The send in flight carries shard output.
    pub(super) shard_in_flight: bool,
}

impl ConnTls {
    pub(super) fn established(&self) -> bool {
        self.established
    }
}

/// A loop's state for its client ports' TLS.
pub(super) struct ClientTls {
    pub(super) certs: CertsView,
    pub(super) require_client_cert: bool,
    /// Handshake steps left in this tick.
    pub(super) budget: u32,
    /// Connections whose handshake bytes wait for a later tick (oldest
    /// first).
    pub(super) backlog: VecDeque<Token>,
    /// Handshake deadlines, in start order (a constant timeout keeps them
    /// sorted).
    pub(super) deadlines: VecDeque<(u64, Token)>,
    pub(super) timeout_us: u64,
    /// Scratch buffers: ciphertext in, plaintext either way.
    pub(super) cipher: Vec<u8>,
    pub(super) plain: Vec<u8>,
    /// When the next handshake failure may be logged (one a second).
    pub(super) log_after_us: u64,
}

impl ClientTls {
    pub(super) fn new(certs: CertsView, require_client_cert: bool, timeout_ms: u64) -> ClientTls {
        ClientTls {
            certs,
            require_client_cert,
            budget: HANDSHAKE_STEPS_PER_TICK,
            backlog: VecDeque::new(),
            deadlines: VecDeque::new(),
            timeout_us: timeout_ms.max(1) * 1000,
            cipher: Vec::new(),
            plain: Vec::new(),
            log_after_us: 0,
        }
    }

    /// Work waits for the next tick (the loop must not sleep).
    pub(super) fn pending(&self) -> bool {
        !self.backlog.is_empty()
    }
}
