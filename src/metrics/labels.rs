//! The label values of the request series: every one from a fixed enum,
//! never from a key or a client.

use crate::protocol::session::{self as sp, Status};

/// A request kind, as the lock port and admin port know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Lock,
    Unlock,
    ResetByKey,
    ResetBySource,
    TryLock,
    AdminKeys,
    AdminRset,
    AdminRsbs,
}

impl Action {
    pub const ALL: [Action; 8] = [
        Action::Lock,
        Action::Unlock,
        Action::ResetByKey,
        Action::ResetBySource,
        Action::TryLock,
        Action::AdminKeys,
        Action::AdminRset,
        Action::AdminRsbs,
    ];

    /// The `protocol` label value: `lc` (the lock port's one-byte
    /// actions) or `admin` (the admin port's commands).
    pub fn protocol(self) -> &'static str {
        match self {
            Action::AdminKeys | Action::AdminRset | Action::AdminRsbs => "admin",
            _ => "lc",
        }
    }

    /// The `action` label value.
    pub fn label(self) -> &'static str {
        match self {
            Action::Lock => "lock",
            Action::Unlock => "unlock",
            Action::ResetByKey => "reset_by_key",
            Action::ResetBySource => "reset_by_source",
            Action::TryLock => "trylock",
            Action::AdminKeys => "admin_keys",
            Action::AdminRset => "admin_rset",
            Action::AdminRsbs => "admin_rsbs",
        }
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }
}

/// A session request kind: the op byte of a session frame (7..=13).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionOp {
    Hello,
    Acquire,
    Release,
    Extend,
    Cancel,
    Ping,
    Resume,
    Watch,
    Unwatch,
    Proclaim,
}

/// Every status of a session Reply, in byte order (`Status as usize` is
/// its index: the discriminants are 0..=15).
pub const SESSION_STATUSES: [Status; 16] = [
    Status::Ok,
    Status::TimedOut,
    Status::Busy,
    Status::NotOwner,
    Status::Stale,
    Status::Invalid,
    Status::Limit,
    Status::ServerError,
    Status::Cancelled,
    Status::NotQueued,
    Status::Unauthorized,
    Status::UnsupportedVersion,
    Status::NotLeader,
    Status::UnknownSession,
    Status::TlsRequired,
    Status::ModeMismatch,
];

impl SessionOp {
    pub const ALL: [SessionOp; 10] = [
        SessionOp::Hello,
        SessionOp::Acquire,
        SessionOp::Release,
        SessionOp::Extend,
        SessionOp::Cancel,
        SessionOp::Ping,
        SessionOp::Resume,
        SessionOp::Watch,
        SessionOp::Unwatch,
        SessionOp::Proclaim,
    ];

    /// The op of a session frame's first byte; `None` for a byte that is
    /// not a session op.
    pub fn from_byte(b: u8) -> Option<SessionOp> {
        Some(match b {
            sp::OP_HELLO => SessionOp::Hello,
            sp::OP_ACQUIRE => SessionOp::Acquire,
            sp::OP_RELEASE => SessionOp::Release,
            sp::OP_EXTEND => SessionOp::Extend,
            sp::OP_CANCEL => SessionOp::Cancel,
            sp::OP_PING => SessionOp::Ping,
            sp::OP_RESUME => SessionOp::Resume,
            sp::OP_WATCH => SessionOp::Watch,
            sp::OP_UNWATCH => SessionOp::Unwatch,
            sp::OP_PROCLAIM => SessionOp::Proclaim,
            _ => return None,
        })
    }

    /// The `action` label value.
    pub fn label(self) -> &'static str {
        match self {
            SessionOp::Hello => "hello",
            SessionOp::Acquire => "acquire",
            SessionOp::Release => "release",
            SessionOp::Extend => "extend",
            SessionOp::Cancel => "cancel",
            SessionOp::Ping => "ping",
            SessionOp::Resume => "resume",
            SessionOp::Watch => "watch",
            SessionOp::Unwatch => "unwatch",
            SessionOp::Proclaim => "proclaim",
        }
    }

    /// The statuses the server answers this op with: their series exist
    /// from start-up (zeros). A status outside this list is rendered once
    /// it has been counted, so nothing counted is ever hidden.
    pub fn statuses(self) -> &'static [Status] {
        use Status::*;
        match self {
            SessionOp::Hello => &[Ok, Invalid, Unauthorized, UnsupportedVersion, NotLeader],
            SessionOp::Resume => &[
                Ok,
                Invalid,
                Unauthorized,
                UnsupportedVersion,
                NotLeader,
                UnknownSession,
            ],
            SessionOp::Acquire => &[Ok, TimedOut, Busy, Invalid, Limit, Cancelled],
            SessionOp::Release | SessionOp::Extend => &[Ok, NotOwner, Stale, Invalid, Limit],
            SessionOp::Cancel => &[Ok, Invalid, Limit, NotQueued],
            SessionOp::Ping => &[Ok, Invalid],
            SessionOp::Watch => &[Ok, Invalid, Limit],
            SessionOp::Unwatch => &[Ok, Invalid, NotQueued],
            SessionOp::Proclaim => &[Ok, NotOwner, Stale, Invalid, Limit],
        }
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }
}

/// The answer a request got: `+`, `#` or `-`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Busy,
    Error,
}

impl Outcome {
    pub const ALL: [Outcome; 3] = [Outcome::Ok, Outcome::Busy, Outcome::Error];

    /// The `result` label value.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Busy => "busy",
            Outcome::Error => "error",
        }
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }
}
