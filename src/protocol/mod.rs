//! Wire codecs: the Locking-Center lock port and admin port.
//!
//! Decoders are incremental and allocation-free: they look at the bytes
//! received so far and answer "need more", "one whole frame of N bytes", or
//! "bad input" (the connection is answered `-` and closed). They never
//! panic on any byte sequence (property-tested).
//!
//! Lock port frames (sizes are one *signed* byte):
//!
//! | action | byte | after the action byte |
//! |---|---|---|
//! | Lock | 1 | `[keyLen][key][srcLen][src]` |
//! | Unlock | 2 | `[keyLen][key]` |
//! | ResetByKey | 3 | `[keyLen][key]` |
//! | ResetBySource | 4 | `[srcLen][src]` |
//! | TryLock | 5 | `[keyLen][key][srcLen][src]` |
//! | Persist (extension) | 6 | nothing: the connection carries several requests |
//!
//! Without Persist a connection carries one request and the server closes
//! it after the answer, as Locking-Center does.

use crate::core::HeldKey;

pub mod admin;
#[cfg(test)]
mod listing_tests;
pub mod locate;
pub mod members;
pub mod session;
pub mod status;

/// Longest possible lock-port frame: action + 2 × (size + 127 bytes).
pub const LOCK_FRAME_MAX: usize = 1 + 2 * (1 + 127);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Lock,
    Unlock,
    ResetByKey,
    ResetBySource,
    TryLock,
    /// Extension: opt in to several requests on this connection, answered
    /// in order, pipelined or not. Answered `+`.
    Persist,
}

impl Action {
    pub fn from_byte(b: u8) -> Option<Action> {
        Some(match b {
            1 => Action::Lock,
            2 => Action::Unlock,
            3 => Action::ResetByKey,
            4 => Action::ResetBySource,
            5 => Action::TryLock,
            6 => Action::Persist,
            _ => return None,
        })
    }

    pub fn byte(self) -> u8 {
        match self {
            Action::Lock => 1,
            Action::Unlock => 2,
            Action::ResetByKey => 3,
            Action::ResetBySource => 4,
            Action::TryLock => 5,
            Action::Persist => 6,
        }
    }
}

/// One decoded lock-port request, borrowing the receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    pub action: Action,
    /// Empty for ResetBySource.
    pub key: &'a [u8],
    /// Empty for Unlock and ResetByKey; may be empty (= peer IP) otherwise.
    pub source: &'a [u8],
}

/// Why a frame was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadFrame {
    UnknownAction(u8),
    KeySize(i8),
    SourceSize(i8),
}

impl std::fmt::Display for BadFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadFrame::UnknownAction(b) => write!(f, "unknown action byte {b}"),
            BadFrame::KeySize(s) => write!(f, "key size {s} out of range 1..=127"),
            BadFrame::SourceSize(s) => write!(f, "source size {s} out of range 0..=127"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// Not a whole frame yet.
    Incomplete,
    /// A whole frame of `len` bytes.
    Frame {
        req: Request<'a>,
        len: usize,
    },
    Bad(BadFrame),
}

/// Reads a sized field at `at`. `min` is the smallest allowed size.
fn field(buf: &[u8], at: usize, min: i8) -> Result<Option<(&[u8], usize)>, i8> {
    let Some(&raw) = buf.get(at) else {
        return Ok(None);
    };
    let size = raw as i8;
    if size < min {
        return Err(size);
    }
    let end = at + 1 + size as usize;
    if buf.len() < end {
        return Ok(None);
    }
    Ok(Some((&buf[at + 1..end], end)))
}

/// Decodes the first lock-port frame in `buf`.
pub fn decode(buf: &[u8]) -> Decoded<'_> {
    let Some(&a) = buf.first() else {
        return Decoded::Incomplete;
    };
    let Some(action) = Action::from_byte(a) else {
        return Decoded::Bad(BadFrame::UnknownAction(a));
    };
    let (key, source, len) = match action {
        Action::Lock | Action::TryLock => {
            let (key, at) = match field(buf, 1, 1) {
                Ok(Some(v)) => v,
                Ok(None) => return Decoded::Incomplete,
                Err(s) => return Decoded::Bad(BadFrame::KeySize(s)),
            };
            match field(buf, at, 0) {
                Ok(Some((src, end))) => (key, src, end),
                Ok(None) => return Decoded::Incomplete,
                Err(s) => return Decoded::Bad(BadFrame::SourceSize(s)),
            }
        }
        Action::Unlock | Action::ResetByKey => match field(buf, 1, 1) {
            Ok(Some((key, end))) => (key, &[][..], end),
            Ok(None) => return Decoded::Incomplete,
            Err(s) => return Decoded::Bad(BadFrame::KeySize(s)),
        },
        Action::ResetBySource => match field(buf, 1, 0) {
            Ok(Some((src, end))) => (&[][..], src, end),
            Ok(None) => return Decoded::Incomplete,
            Err(s) => return Decoded::Bad(BadFrame::SourceSize(s)),
        },
        Action::Persist => (&[][..], &[][..], 1),
    };
    Decoded::Frame {
        req: Request {
            action,
            key,
            source,
        },
        len,
    }
}

/// Encodes a lock-port frame (clients, tests, load generator).
/// Panics if a size is out of range: callers validate first.
pub fn encode(action: Action, key: &[u8], source: &[u8], out: &mut Vec<u8>) {
    assert!(key.len() <= 127 && source.len() <= 127, "name too long");
    out.push(action.byte());
    match action {
        Action::Lock | Action::TryLock => {
            out.push(key.len() as u8);
            out.extend_from_slice(key);
            out.push(source.len() as u8);
            out.extend_from_slice(source);
        }
        Action::Unlock | Action::ResetByKey => {
            out.push(key.len() as u8);
            out.extend_from_slice(key);
        }
        Action::ResetBySource => {
            out.push(source.len() as u8);
            out.extend_from_slice(source);
        }
        Action::Persist => {}
    }
}

#[cfg(test)]
mod tests;
