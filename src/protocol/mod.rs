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

/// The admin port's commands.
pub mod admin {
    use super::*;

    /// Most names one RSET/RSBS may carry.
    pub const NAMES_MAX: u32 = 65_536;
    /// Largest admin request accepted: 4 + 4 + NAMES_MAX × 256.
    pub const FRAME_MAX: usize = 8 + NAMES_MAX as usize * 256;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Command {
        Keys,
        /// KEYS with token, hold mode and lease time left (extension).
        Keyx,
        Rset,
        Rsbs,
        /// Compare-and-reset (extension): reset each named key only if its
        /// holder still has the named token.
        Rstk,
        /// `AUTH [u8 len][token]` (extension): presents the shared secret.
        Auth,
        /// Each shard's replication state (extension, [`super::status`]):
        /// answered by every node, leader or not.
        Clst,
        /// `XFER [u32 node]` (extension): the serving leader hands every
        /// shard's leadership to `node` (0: its most caught-up follower).
        Xfer,
        /// Each shard's membership (extension, [`super::members`]):
        /// answered by every node.
        Cmem,
        /// A membership change (extension, [`super::members::Change`]),
        /// made by the serving leader in every shard's group.
        Cchg,
        /// The node directory (extension, [`super::locate`]): each
        /// member's lock and admin addresses, answered by every node.
        Cadr,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum BadAdmin {
        UnknownCommand([u8; 4]),
        TooMany(u32),
        EmptyKey,
        NameTooLong(u8),
    }

    impl std::fmt::Display for BadAdmin {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                BadAdmin::UnknownCommand(c) => {
                    write!(f, "unknown admin command {}", crate::log::Quoted(c))
                }
                BadAdmin::TooMany(n) => write!(f, "{n} names exceed the limit of {NAMES_MAX}"),
                BadAdmin::EmptyKey => write!(f, "empty key in RSET"),
                BadAdmin::NameTooLong(n) => write!(f, "name of {n} bytes exceeds 127"),
            }
        }
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Decoded {
        Incomplete,
        /// A whole command of `len` bytes; names (for RSET/RSBS) are read
        /// with [`names`] from `buf[8..len]`.
        Frame {
            cmd: Command,
            count: u32,
            len: usize,
        },
        Bad(BadAdmin),
    }

    /// Decodes the first admin command in `buf`, validating every name.
    pub fn decode(buf: &[u8]) -> Decoded {
        if buf.len() < 4 {
            return Decoded::Incomplete;
        }
        let cmd = match &buf[..4] {
            b"KEYS" | b"KEYX" => {
                return Decoded::Frame {
                    cmd: if &buf[..4] == b"KEYS" {
                        Command::Keys
                    } else {
                        Command::Keyx
                    },
                    count: 0,
                    len: 4,
                }
            }
            b"CLST" => {
                return Decoded::Frame {
                    cmd: Command::Clst,
                    count: 0,
                    len: 4,
                }
            }
            b"CMEM" => {
                return Decoded::Frame {
                    cmd: Command::Cmem,
                    count: 0,
                    len: 4,
                }
            }
            b"CADR" => {
                return Decoded::Frame {
                    cmd: Command::Cadr,
                    count: 0,
                    len: 4,
                }
            }
            b"CCHG" => {
                return match super::members::Change::frame_len(buf) {
                    None => Decoded::Incomplete,
                    Some(len) => Decoded::Frame {
                        cmd: Command::Cchg,
                        count: 0,
                        len,
                    },
                }
            }
            b"XFER" => {
                if buf.len() < 8 {
                    return Decoded::Incomplete;
                }
                return Decoded::Frame {
                    cmd: Command::Xfer,
                    // The target node, carried where other commands count.
                    count: u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes")),
                    len: 8,
                };
            }
            b"RSET" => Command::Rset,
            b"RSBS" => Command::Rsbs,
            b"RSTK" => Command::Rstk,
            b"AUTH" => {
                let Some(&n) = buf.get(4) else {
                    return Decoded::Incomplete;
                };
                if n == 0 {
                    return Decoded::Bad(BadAdmin::EmptyKey);
                }
                if buf.len() < 5 + n as usize {
                    return Decoded::Incomplete;
                }
                return Decoded::Frame {
                    cmd: Command::Auth,
                    count: 0,
                    len: 5 + n as usize,
                };
            }
            other => {
                let mut c = [0u8; 4];
                c.copy_from_slice(other);
                return Decoded::Bad(BadAdmin::UnknownCommand(c));
            }
        };
        if buf.len() < 8 {
            return Decoded::Incomplete;
        }
        let count = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
        if count > NAMES_MAX {
            return Decoded::Bad(BadAdmin::TooMany(count));
        }
        let mut at = 8;
        for _ in 0..count {
            let Some(&len) = buf.get(at) else {
                return Decoded::Incomplete;
            };
            if matches!(cmd, Command::Rset | Command::Rstk) && len == 0 {
                return Decoded::Bad(BadAdmin::EmptyKey);
            }
            if len > 127 {
                return Decoded::Bad(BadAdmin::NameTooLong(len));
            }
            at += 1 + len as usize;
            if cmd == Command::Rstk {
                at += 8; // the expected token
            }
            if buf.len() < at {
                return Decoded::Incomplete;
            }
        }
        Decoded::Frame {
            cmd,
            count,
            len: at,
        }
    }

    /// Iterates the `(key, token)` entries of a decoded RSTK body.
    pub fn keyed_tokens(body: &[u8]) -> impl Iterator<Item = (&[u8], u64)> {
        let mut at = 0;
        std::iter::from_fn(move || {
            let len = *body.get(at)? as usize;
            let name = body.get(at + 1..at + 1 + len)?;
            let t = body.get(at + 1 + len..at + 9 + len)?;
            at += 9 + len;
            Some((name, u64::from_le_bytes(t.try_into().ok()?)))
        })
    }

    /// Encodes an RSTK request (clients and tests).
    pub fn encode_rstk(entries: &[(&[u8], u64)], out: &mut Vec<u8>) {
        out.extend_from_slice(b"RSTK");
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for (k, t) in entries {
            assert!(!k.is_empty() && k.len() <= 127, "key size out of range");
            out.push(k.len() as u8);
            out.extend_from_slice(k);
            out.extend_from_slice(&t.to_le_bytes());
        }
    }

    /// Iterates the names of a decoded RSET/RSBS body (`buf[8..len]`).
    pub fn names(body: &[u8]) -> impl Iterator<Item = &[u8]> {
        let mut at = 0;
        std::iter::from_fn(move || {
            let len = *body.get(at)? as usize;
            let name = body.get(at + 1..at + 1 + len)?;
            at += 1 + len;
            Some(name)
        })
    }

    /// Encodes the KEYS answer: `u32` count, then per key
    /// `[u8 keyLen][key][u8 srcLen][src][u8 epLen][endpoint][i64 secs]`.
    pub fn encode_keys(held: &[HeldKey], out: &mut Vec<u8>) {
        out.extend_from_slice(&(held.len() as u32).to_le_bytes());
        let mut ep = String::new();
        for h in held {
            out.push(h.key.len() as u8);
            out.extend_from_slice(h.key.as_bytes());
            out.push(h.source.len() as u8);
            out.extend_from_slice(h.source.as_bytes());
            ep.clear();
            use std::fmt::Write;
            write!(ep, "{}", h.endpoint).expect("writing to a String");
            out.push(ep.len() as u8);
            out.extend_from_slice(ep.as_bytes());
            out.extend_from_slice(&((h.acquired_unix_ms / 1000) as i64).to_le_bytes());
        }
    }

    /// Encodes the KEYX answer: the KEYS entry of each key followed by
    /// `[u64 token][u8 mode][u32 lease ms left, u32::MAX = none]`; `now_unix_ms`
    /// is the server's clock for the time left.
    pub fn encode_keyx(held: &[HeldKey], now_unix_ms: u64, out: &mut Vec<u8>) {
        out.extend_from_slice(&(held.len() as u32).to_le_bytes());
        for h in held {
            let mut one = Vec::with_capacity(64);
            encode_keys(std::slice::from_ref(h), &mut one);
            out.extend_from_slice(&one[4..]);
            out.extend_from_slice(&h.grant_id.to_le_bytes());
            out.push(h.mode as u8);
            let left = if h.mode == crate::core::HoldMode::Lease {
                h.expires_unix_ms
                    .saturating_sub(now_unix_ms)
                    .min(u32::MAX as u64 - 1) as u32
            } else {
                u32::MAX
            };
            out.extend_from_slice(&left.to_le_bytes());
        }
    }

    /// Upper bound on a whole `KEYS` answer a reader keeps in memory
    /// ([`decode_keys`], and the count [`check_count`] accepts for a list
    /// collected whole). A server holding this many bytes of keys is either
    /// broken or hostile. A reader that takes the answer one entry at a
    /// time ([`KeysDecoder`]) needs no such bound.
    pub const KEYS_ANSWER_BYTES_MAX: usize = 256 << 20;

    /// One held key as reported by the admin port's `KEYS` command.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct KeyInfo {
        /// The key, as raw bytes (keys need not be UTF-8).
        pub key: Vec<u8>,
        /// The holder's source name (its IP address if it sent none).
        pub source: Vec<u8>,
        /// The holder's connection as the server saw it, `ip:port`.
        pub endpoint: String,
        /// When the key was granted, in Unix seconds.
        pub acquired_unix_s: i64,
        /// KEYX only (0 from KEYS): the grant's fencing token.
        pub token: u64,
        /// KEYX only (persistent from KEYS): how the key is held.
        pub mode: crate::core::HoldMode,
        /// KEYX only: a lease's time left when the server answered.
        pub lease_left_ms: Option<u32>,
    }

    impl KeyInfo {
        /// The key as text, with invalid UTF-8 replaced.
        pub fn key_lossy(&self) -> String {
            String::from_utf8_lossy(&self.key).into_owned()
        }

        /// The source as text, with invalid UTF-8 replaced.
        pub fn source_lossy(&self) -> String {
            String::from_utf8_lossy(&self.source).into_owned()
        }

        /// When the key was granted.
        pub fn acquired(&self) -> std::time::SystemTime {
            use std::time::{Duration, UNIX_EPOCH};
            if self.acquired_unix_s >= 0 {
                UNIX_EPOCH + Duration::from_secs(self.acquired_unix_s as u64)
            } else {
                UNIX_EPOCH - Duration::from_secs(self.acquired_unix_s.unsigned_abs())
            }
        }

        /// How long the key has been held at `now` (zero if the clocks
        /// disagree).
        pub fn held_for(&self, now: std::time::SystemTime) -> std::time::Duration {
            now.duration_since(self.acquired()).unwrap_or_default()
        }
    }

    /// Most bytes one `KEYX` entry can take on the wire (three names of up
    /// to 255 bytes with their sizes, the time, token, mode and lease);
    /// a `KEYS` entry is smaller. A reader's buffer at least this big
    /// always holds a whole entry.
    pub const KEYS_ENTRY_BYTES_MAX: usize = 3 * (1 + 255) + 8 + 8 + 1 + 4;

    /// Parses a complete `KEYS` answer from the front of `buf`:
    /// `Ok(None)` while it is incomplete (read more and call again),
    /// `Ok(Some((keys, consumed)))` once whole, `Err` for an implausible count
    /// (more entries than [`KEYS_ANSWER_BYTES_MAX`] could hold) or bad data.
    /// Built on [`KeysDecoder`], which reads an answer of any size one entry
    /// at a time instead.
    pub fn decode_keys(buf: &[u8]) -> Result<Option<(Vec<KeyInfo>, usize)>, String> {
        decode_keys_as(buf, false)
    }

    /// [`decode_keys`] for a `KEYX` answer.
    pub fn decode_keyx(buf: &[u8]) -> Result<Option<(Vec<KeyInfo>, usize)>, String> {
        decode_keys_as(buf, true)
    }

    fn decode_keys_as(buf: &[u8], x: bool) -> Result<Option<(Vec<KeyInfo>, usize)>, String> {
        let mut dec = KeysDecoder::new(x);
        let mut keys = Vec::new();
        let mut at = 0;
        loop {
            let (step, used) = dec.decode_next(&buf[at..])?;
            at += used;
            match step {
                KeysStep::Incomplete => return Ok(None),
                KeysStep::Count(count) => {
                    check_count(count)?;
                    keys.reserve((count as usize).min(4096));
                }
                KeysStep::Entry(k) => keys.push(k),
                KeysStep::End => return Ok(Some((keys, at))),
            }
        }
    }

    /// Rejects a count of entries that a whole answer of at most
    /// [`KEYS_ANSWER_BYTES_MAX`] bytes cannot hold (each entry is at least
    /// 3 size bytes and 8 time bytes): corruption, not a reason to
    /// preallocate. For readers that keep the whole list.
    pub fn check_count(count: u32) -> Result<(), String> {
        if count as usize > KEYS_ANSWER_BYTES_MAX / 11 {
            return Err(format!("KEYS count {count} is implausible"));
        }
        Ok(())
    }

    /// One step of a [`KeysDecoder`].
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum KeysStep {
        /// Not enough bytes for the next part: nothing was consumed; read
        /// more and call again with them appended.
        Incomplete,
        /// The answer's first part: how many entries follow.
        Count(u32),
        /// The next entry (in key order).
        Entry(KeyInfo),
        /// Every entry was decoded: the answer ends here (nothing consumed;
        /// any byte after it is not part of the answer).
        End,
    }

    /// Decodes a `KEYS` or `KEYX` answer one part at a time, from the front
    /// of whatever prefix of it has arrived: first its count, then each
    /// entry as soon as all of its bytes are there, then the end. It keeps
    /// no bytes of its own (only how many entries are left), so a reader
    /// needs no more than a buffer of [`KEYS_ENTRY_BYTES_MAX`] bytes and
    /// memory for one entry at a time, whatever the size of the answer.
    ///
    /// ```
    /// use ringlock::protocol::admin::{KeysDecoder, KeysStep};
    /// let mut answer = 1u32.to_le_bytes().to_vec();
    /// for field in [&b"k"[..], b"svc", b"10.0.0.1:5000"] {
    ///     answer.push(field.len() as u8);
    ///     answer.extend_from_slice(field);
    /// }
    /// answer.extend_from_slice(&1_700_000_000i64.to_le_bytes());
    ///
    /// let mut dec = KeysDecoder::keys();
    /// let mut at = 0;
    /// let (step, used) = dec.decode_next(&answer[at..]).unwrap();
    /// assert_eq!((step, used), (KeysStep::Count(1), 4));
    /// at += used;
    /// // The entry is not whole yet: nothing is consumed.
    /// let (step, used) = dec.decode_next(&answer[at..answer.len() - 1]).unwrap();
    /// assert_eq!((step, used), (KeysStep::Incomplete, 0));
    /// let (step, used) = dec.decode_next(&answer[at..]).unwrap();
    /// assert!(matches!(step, KeysStep::Entry(ref k) if k.key == b"k"));
    /// at += used;
    /// assert_eq!(dec.decode_next(&answer[at..]).unwrap(), (KeysStep::End, 0));
    /// assert!(dec.is_done());
    /// ```
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct KeysDecoder {
        extended: bool,
        /// Entries still to come; `None` before the count.
        left: Option<u32>,
    }

    impl KeysDecoder {
        /// A decoder of a `KEYX` answer (`extended`) or a `KEYS` one.
        pub fn new(extended: bool) -> KeysDecoder {
            KeysDecoder {
                extended,
                left: None,
            }
        }

        /// A decoder of a `KEYS` answer.
        pub fn keys() -> KeysDecoder {
            KeysDecoder::new(false)
        }

        /// A decoder of a `KEYX` answer.
        pub fn keyx() -> KeysDecoder {
            KeysDecoder::new(true)
        }

        /// Whether it decodes `KEYX` entries.
        pub fn extended(&self) -> bool {
            self.extended
        }

        /// Entries not decoded yet; `None` until the count was.
        pub fn remaining(&self) -> Option<u32> {
            self.left
        }

        /// The count and every entry were decoded: the answer is whole.
        pub fn is_done(&self) -> bool {
            self.left == Some(0)
        }

        /// Decodes the next part from the front of `buf`, which holds the
        /// answer's bytes after those earlier calls consumed: the step and
        /// how many bytes of `buf` it consumed. `Err` for bad data (an
        /// unknown hold mode in a `KEYX` entry); the answer cannot be read
        /// on after it.
        pub fn decode_next(&mut self, buf: &[u8]) -> Result<(KeysStep, usize), String> {
            let Some(left) = self.left else {
                let Some(count) = buf.get(..4) else {
                    return Ok((KeysStep::Incomplete, 0));
                };
                let count = u32::from_le_bytes(count.try_into().expect("4 bytes"));
                self.left = Some(count);
                return Ok((KeysStep::Count(count), 4));
            };
            if left == 0 {
                return Ok((KeysStep::End, 0));
            }
            match decode_entry(buf, self.extended)? {
                None => Ok((KeysStep::Incomplete, 0)),
                Some((entry, used)) => {
                    self.left = Some(left - 1);
                    Ok((KeysStep::Entry(entry), used))
                }
            }
        }
    }

    /// One entry from the front of `buf`: `Ok(None)` while incomplete.
    fn decode_entry(buf: &[u8], x: bool) -> Result<Option<(KeyInfo, usize)>, String> {
        fn take<'a>(buf: &'a [u8], at: &mut usize, len: usize) -> Option<&'a [u8]> {
            let slice = buf.get(*at..*at + len)?;
            *at += len;
            Some(slice)
        }
        fn take_sized<'a>(buf: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
            let len = *take(buf, at, 1)?.first().expect("took 1 byte") as usize;
            take(buf, at, len)
        }
        let mut at = 0usize;
        let (Some(key), Some(source), Some(endpoint), Some(acquired)) = (
            take_sized(buf, &mut at),
            take_sized(buf, &mut at),
            take_sized(buf, &mut at),
            take(buf, &mut at, 8),
        ) else {
            return Ok(None);
        };
        let (mut token, mut mode, mut lease_left_ms) = (0, crate::core::HoldMode::Persistent, None);
        if x {
            let (Some(t), Some(m), Some(l)) = (
                take(buf, &mut at, 8),
                take(buf, &mut at, 1),
                take(buf, &mut at, 4),
            ) else {
                return Ok(None);
            };
            token = u64::from_le_bytes(t.try_into().expect("took 8 bytes"));
            mode = crate::core::HoldMode::from_byte(m[0])
                .ok_or_else(|| format!("KEYX: unknown hold mode {}", m[0]))?;
            let l = u32::from_le_bytes(l.try_into().expect("took 4 bytes"));
            lease_left_ms = (l != u32::MAX).then_some(l);
        }
        Ok(Some((
            KeyInfo {
                key: key.to_vec(),
                source: source.to_vec(),
                endpoint: String::from_utf8_lossy(endpoint).into_owned(),
                acquired_unix_s: i64::from_le_bytes(acquired.try_into().expect("took 8 bytes")),
                token,
                mode,
                lease_left_ms,
            },
            at,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn decodes_every_action() {
        let mut b = Vec::new();
        encode(Action::Lock, b"key", b"src", &mut b);
        assert_eq!(b, b"\x01\x03key\x03src");
        match decode(&b) {
            Decoded::Frame { req, len } => {
                assert_eq!(len, b.len());
                assert_eq!(req.key, b"key");
                assert_eq!(req.source, b"src");
            }
            d => panic!("{d:?}"),
        }
        assert!(matches!(
            decode(b"\x02\x01k"),
            Decoded::Frame {
                req: Request {
                    action: Action::Unlock,
                    key: b"k",
                    ..
                },
                len: 3
            }
        ));
        assert!(matches!(
            decode(b"\x04\x00"),
            Decoded::Frame {
                req: Request {
                    action: Action::ResetBySource,
                    source: b"",
                    ..
                },
                len: 2
            }
        ));
        assert!(matches!(
            decode(b"\x05\x01k\x00"),
            Decoded::Frame {
                req: Request {
                    action: Action::TryLock,
                    ..
                },
                len: 4
            }
        ));
    }

    #[test]
    fn rejects_bad_sizes_and_actions() {
        assert_eq!(decode(b"\x00"), Decoded::Bad(BadFrame::UnknownAction(0)));
        assert_eq!(decode(b"\x07"), Decoded::Bad(BadFrame::UnknownAction(7)));
        // Persist is one byte; what follows it is the next frame.
        assert!(matches!(
            decode(b"\x06\x02"),
            Decoded::Frame {
                req: Request {
                    action: Action::Persist,
                    ..
                },
                len: 1
            }
        ));
        assert_eq!(decode(b"\x01\x00"), Decoded::Bad(BadFrame::KeySize(0)));
        assert_eq!(decode(b"\x01\x80"), Decoded::Bad(BadFrame::KeySize(-128)));
        assert_eq!(
            decode(b"\x01\x01k\xff"),
            Decoded::Bad(BadFrame::SourceSize(-1))
        );
        assert_eq!(decode(b"\x04\xff"), Decoded::Bad(BadFrame::SourceSize(-1)));
        assert_eq!(decode(b"\x02\x00"), Decoded::Bad(BadFrame::KeySize(0)));
    }

    #[test]
    fn incomplete_until_the_last_byte() {
        let mut b = Vec::new();
        encode(Action::Lock, &[b'k'; 127], &[b's'; 127], &mut b);
        assert_eq!(b.len(), LOCK_FRAME_MAX);
        for cut in 0..b.len() {
            assert_eq!(decode(&b[..cut]), Decoded::Incomplete, "cut at {cut}");
        }
        assert!(matches!(
            decode(&b),
            Decoded::Frame {
                len: LOCK_FRAME_MAX,
                ..
            }
        ));
    }

    #[test]
    fn admin_frames() {
        assert_eq!(
            admin::decode(b"KEYS"),
            admin::Decoded::Frame {
                cmd: admin::Command::Keys,
                count: 0,
                len: 4
            }
        );
        let mut b = b"RSET".to_vec();
        b.extend_from_slice(&2u32.to_le_bytes());
        b.extend_from_slice(b"\x01a\x02bc");
        assert_eq!(
            admin::decode(&b),
            admin::Decoded::Frame {
                cmd: admin::Command::Rset,
                count: 2,
                len: b.len()
            }
        );
        let names: Vec<&[u8]> = admin::names(&b[8..]).collect();
        assert_eq!(names, vec![&b"a"[..], &b"bc"[..]]);
        assert_eq!(admin::decode(&b[..b.len() - 1]), admin::Decoded::Incomplete);
        assert!(matches!(admin::decode(b"NOPE"), admin::Decoded::Bad(_)));
        assert_eq!(
            admin::decode(b"CLSTKEYS"),
            admin::Decoded::Frame {
                cmd: admin::Command::Clst,
                count: 0,
                len: 4
            }
        );
        let mut z = b"RSET".to_vec();
        z.extend_from_slice(&1u32.to_le_bytes());
        z.push(0);
        assert_eq!(
            admin::decode(&z),
            admin::Decoded::Bad(admin::BadAdmin::EmptyKey)
        );
    }

    #[test]
    fn keys_answer_roundtrip() {
        use crate::core::Name;
        let held = vec![HeldKey {
            key: Name::new(b"k").unwrap(),
            source: Name::new(b"svc").unwrap(),
            endpoint: "127.0.0.1:4000".parse().unwrap(),
            acquired_unix_ms: 1_700_000_000_999,
            grant_id: 1,
            mode: crate::core::HoldMode::Persistent,
            expires_unix_ms: 0,
            session: 0,
        }];
        let mut out = Vec::new();
        admin::encode_keys(&held, &mut out);
        assert_eq!(&out[..4], &1u32.to_le_bytes());
        let (list, used) = admin::decode_keys(&out).unwrap().unwrap();
        assert_eq!(used, out.len());
        assert_eq!(list[0].endpoint, "127.0.0.1:4000");
        assert_eq!(list[0].acquired_unix_s, 1_700_000_000);
        assert_eq!(admin::decode_keys(&out[..out.len() - 1]).unwrap(), None);
    }

    fn held(key: &str, source: &str, mode: crate::core::HoldMode, grant: u64) -> HeldKey {
        use crate::core::Name;
        HeldKey {
            key: Name::new(key.as_bytes()).unwrap(),
            source: Name::new(source.as_bytes()).unwrap(),
            endpoint: "[2001:db8::7]:65000".parse().unwrap(),
            acquired_unix_ms: 1_700_000_000_000 + grant,
            grant_id: grant,
            mode,
            expires_unix_ms: 1_700_000_060_000,
            session: 0,
        }
    }

    /// A KEYX answer of a few entries, long names and every mode among them.
    fn keyx_answer() -> Vec<u8> {
        use crate::core::HoldMode;
        let long = "k".repeat(127);
        let held = vec![
            held("a", "", HoldMode::Persistent, 1),
            held(&long, &"s".repeat(127), HoldMode::Lease, 2),
            held("b/c", "svc", HoldMode::Session, 3),
        ];
        let mut out = Vec::new();
        admin::encode_keyx(&held, 1_700_000_050_000, &mut out);
        out
    }

    /// Fed one byte at a time, the decoder hands out the count once its
    /// 4 bytes are there, each entry exactly when its last byte arrives,
    /// and the end only then; it consumes nothing it did not decode and
    /// nothing after the answer.
    #[test]
    fn keys_decoder_fed_byte_by_byte() {
        use admin::{KeysDecoder, KeysStep};
        let answer = keyx_answer();
        let (whole, len) = admin::decode_keyx(&answer).unwrap().unwrap();
        assert_eq!(len, answer.len());
        let mut dec = KeysDecoder::keyx();
        let mut buf = Vec::new(); // received and not consumed yet
        let (mut count, mut entries, mut ends) = (None, Vec::new(), Vec::new());
        // The answer, then bytes of whatever comes after it.
        for (i, &b) in answer.iter().chain(b"KEYS").enumerate() {
            buf.push(b);
            loop {
                let (step, used) = dec.decode_next(&buf).unwrap();
                assert!(used <= buf.len());
                buf.drain(..used);
                match step {
                    KeysStep::Incomplete => {
                        assert_eq!(used, 0);
                        break;
                    }
                    KeysStep::Count(n) => {
                        assert_eq!((i, count), (3, None), "the count at its 4th byte");
                        count = Some(n);
                    }
                    KeysStep::Entry(k) => {
                        assert!(buf.is_empty(), "an entry at its last byte, not later");
                        entries.push(k);
                    }
                    KeysStep::End => {
                        assert_eq!(used, 0);
                        ends.push(i);
                        break;
                    }
                }
            }
            assert_eq!(dec.is_done(), i + 1 >= answer.len(), "byte {i}");
        }
        assert_eq!(count, Some(3));
        assert_eq!(entries, whole);
        assert_eq!(entries[1].key, "k".repeat(127).as_bytes());
        assert_eq!(entries[1].mode, crate::core::HoldMode::Lease);
        assert_eq!(entries[1].lease_left_ms, Some(10_000));
        assert_eq!(entries[2].mode, crate::core::HoldMode::Session);
        assert_eq!(entries[2].endpoint, "[2001:db8::7]:65000");
        // The end from the answer's last byte on, the bytes after it untouched.
        assert_eq!(ends.first(), Some(&(answer.len() - 1)));
        assert_eq!(buf, b"KEYS");
        assert_eq!(dec.remaining(), Some(0));
    }

    #[test]
    fn keys_decoder_empty_answer_bad_mode_and_largest_entry() {
        use admin::{KeysDecoder, KeysStep};
        let mut dec = KeysDecoder::keys();
        assert_eq!(
            dec.decode_next(&[0, 0, 0]).unwrap(),
            (KeysStep::Incomplete, 0)
        );
        assert_eq!(dec.remaining(), None);
        assert_eq!(dec.decode_next(&[0; 4]).unwrap(), (KeysStep::Count(0), 4));
        assert!(dec.is_done());
        assert_eq!(dec.decode_next(b"").unwrap(), (KeysStep::End, 0));

        // A KEYX entry with hold mode 9.
        let mut answer = keyx_answer();
        let mut one = 1u32.to_le_bytes().to_vec();
        let first = 4 + 2 + 1 + 1 + "[2001:db8::7]:65000".len() + 8;
        one.extend_from_slice(&answer[4..first]);
        one.extend_from_slice(&[7; 8]);
        one.push(9);
        one.extend_from_slice(&[0; 4]);
        let mut dec = KeysDecoder::keyx();
        assert_eq!(dec.decode_next(&one).unwrap().0, KeysStep::Count(1));
        let err = dec.decode_next(&one[4..]).unwrap_err();
        assert!(err.contains("unknown hold mode 9"), "{err}");
        // A KEYS decoder reads a KEYX answer's first entry as a KEYS one
        // and consumes only its bytes.
        answer[..4].copy_from_slice(&1u32.to_le_bytes());
        let (list, used) = admin::decode_keys(&answer).unwrap().unwrap();
        assert_eq!((list.len(), used), (1, first));

        // The largest entry there can be fits KEYS_ENTRY_BYTES_MAX exactly.
        let mut big = Vec::new();
        for _ in 0..3 {
            big.push(255);
            big.extend_from_slice(&[b'x'; 255]);
        }
        big.extend_from_slice(&[0; 8 + 8]);
        big.push(2);
        big.extend_from_slice(&[0; 4]);
        assert_eq!(big.len(), admin::KEYS_ENTRY_BYTES_MAX);
        let mut dec = KeysDecoder::keyx();
        dec.decode_next(&1u32.to_le_bytes()).unwrap();
        assert_eq!(
            dec.decode_next(&big[..big.len() - 1]).unwrap(),
            (KeysStep::Incomplete, 0)
        );
        assert_eq!(dec.decode_next(&big).unwrap().1, big.len());
    }

    proptest! {
        #[test]
        fn never_panics_and_frames_fit(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            match decode(&bytes) {
                Decoded::Frame { len, req } => {
                    prop_assert!(len <= bytes.len() && len <= LOCK_FRAME_MAX);
                    prop_assert!(
                        matches!(req.action, Action::ResetBySource | Action::Persist)
                            || !req.key.is_empty()
                    );
                }
                Decoded::Incomplete => prop_assert!(bytes.len() < LOCK_FRAME_MAX),
                Decoded::Bad(_) => {}
            }
            let _ = admin::decode(&bytes);
            let _ = admin::decode_keys(&bytes);
        }

        /// Whatever the bytes and however they are cut into arrivals, the
        /// incremental decoder agrees with the whole-buffer one.
        #[test]
        fn keys_decoder_agrees_with_whole_decode(
            bytes in proptest::collection::vec(any::<u8>(), 0..400),
            cuts in proptest::collection::vec(1usize..40, 1..40),
            x in any::<bool>(),
        ) {
            use admin::{KeysDecoder, KeysStep};
            let whole = if x { admin::decode_keyx(&bytes) } else { admin::decode_keys(&bytes) };
            let mut dec = KeysDecoder::new(x);
            let (mut got, mut at, mut avail, mut cut) = (Vec::new(), 0usize, 0usize, 0usize);
            let streamed = loop {
                match dec.decode_next(&bytes[at..avail]) {
                    Err(e) => break Err(e),
                    Ok((KeysStep::Count(_), used)) => at += used,
                    Ok((KeysStep::Entry(k), used)) => { at += used; got.push(k) }
                    Ok((KeysStep::End, used)) => { prop_assert_eq!(used, 0); break Ok(Some(at)) }
                    Ok((KeysStep::Incomplete, used)) => {
                        prop_assert_eq!(used, 0);
                        if avail == bytes.len() { break Ok(None) }
                        avail = (avail + cuts[cut % cuts.len()]).min(bytes.len());
                        cut += 1;
                    }
                }
                prop_assert!(at <= avail);
            };
            match (whole, streamed) {
                (Ok(Some((keys, len))), Ok(Some(end))) => {
                    prop_assert_eq!(len, end);
                    prop_assert_eq!(keys, got);
                }
                (Ok(None), Ok(None)) => {}
                // The whole decoder also rejects an implausible count.
                (Err(e), _) if e.contains("implausible") => {}
                (Err(a), Err(b)) => prop_assert_eq!(a, b),
                (w, st) => prop_assert!(false, "whole {:?}, streamed {:?}", w, st),
            }
        }

        #[test]
        fn encode_decode_roundtrip(a in 1u8..=5, key in proptest::collection::vec(any::<u8>(), 1..=127), src in proptest::collection::vec(any::<u8>(), 0..=127)) {
            let action = Action::from_byte(a).unwrap();
            let mut b = Vec::new();
            encode(action, &key, &src, &mut b);
            match decode(&b) {
                Decoded::Frame { req, len } => {
                    prop_assert_eq!(len, b.len());
                    prop_assert_eq!(req.action, action);
                    if action != Action::ResetBySource { prop_assert_eq!(req.key, &key[..]); }
                    if matches!(action, Action::Lock | Action::TryLock | Action::ResetBySource) { prop_assert_eq!(req.source, &src[..]); }
                }
                d => prop_assert!(false, "{:?}", d),
            }
        }
    }
}
