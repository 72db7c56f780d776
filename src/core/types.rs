//! The lock core's contract types: what callers pass in and get back.

/// How a granted lock is held, chosen per Acquire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum HoldMode {
    /// Locking-Center semantics: held until released or reset, whatever
    /// happens to the connection.
    #[default]
    Persistent = 0,
    /// Released the moment the session ends (its connection closes or its
    /// keep-alive deadline passes).
    Session = 1,
    /// Released when its TTL passes without an Extend (survives the
    /// session, and a restart in durable mode).
    Lease = 2,
}

impl HoldMode {
    pub fn from_byte(b: u8) -> Option<HoldMode> {
        Some(match b {
            0 => HoldMode::Persistent,
            1 => HoldMode::Session,
            2 => HoldMode::Lease,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            HoldMode::Persistent => "persistent",
            HoldMode::Session => "session",
            HoldMode::Lease => "lease",
        }
    }
}

/// Capacity of the table.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_keys: usize,
    pub max_waiters: usize,
}
