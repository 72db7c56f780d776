//! What a key watch reports ([`Session::watch`](super::Session::watch)):
//! the holders a key has, and each change of them. Types only; the watch
//! itself is [`super::watch`].

use crate::protocol::session::{Access, HoldMode};

pub use crate::protocol::session::EventKind;

/// One holder of a watched key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its fencing token.
    pub token: u64,
    /// How it holds the key. A lease's TTL is not reported: `Lease(ZERO)`.
    pub hold: HeldAs,
    /// Exclusive, shared, or one of a semaphore's slots.
    pub access: Access,
    /// Its source: a Locking-Center client's source, or a session's.
    pub source: Vec<u8>,
}

/// How a watched key's holder holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeldAs {
    /// Until its session ends.
    Session,
    /// Until its TTL passes without an extend.
    Lease,
    /// Until released or reset (Locking-Center semantics).
    Persistent,
}

impl From<HoldMode> for HeldAs {
    fn from(h: HoldMode) -> HeldAs {
        match h {
            HoldMode::Session => HeldAs::Session,
            HoldMode::Lease => HeldAs::Lease,
            HoldMode::Persistent => HeldAs::Persistent,
        }
    }
}

/// One change of a watched key's holders, in the order the server decided
/// them: `kind` is [`EventKind::Granted`] for a new holder,
/// [`EventKind::Proclaimed`] for a holder whose source changed (same
/// token), and for a holder that is gone why ([`EventKind::Released`],
/// `Expired`, `Reset`, `SessionEnded`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    pub kind: EventKind,
    pub holder: Holder,
}

/// What the I/O thread hands a watch.
#[derive(Debug)]
pub(crate) enum WatchItem {
    Event(WatchEvent),
    /// The watch ended (the connection failed or the session ended): why.
    Ended(String),
}
