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

    /// Upper bound on a `KEYS` answer a client buffers. A server holding
    /// this many bytes of keys is either broken or hostile.
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

    /// Parses a complete `KEYS` answer from the front of `buf`:
    /// `Ok(None)` while it is incomplete (read more and call again),
    /// `Ok(Some((keys, consumed)))` once whole, `Err` for an implausible count.
    pub fn decode_keys(buf: &[u8]) -> Result<Option<(Vec<KeyInfo>, usize)>, String> {
        decode_keys_as(buf, false)
    }

    /// [`decode_keys`] for a `KEYX` answer.
    pub fn decode_keyx(buf: &[u8]) -> Result<Option<(Vec<KeyInfo>, usize)>, String> {
        decode_keys_as(buf, true)
    }

    fn decode_keys_as(buf: &[u8], x: bool) -> Result<Option<(Vec<KeyInfo>, usize)>, String> {
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
        let Some(count) = take(buf, &mut at, 4) else {
            return Ok(None);
        };
        let count = u32::from_le_bytes(count.try_into().expect("took 4 bytes"));
        // Each entry is at least 3 size bytes + 8 time bytes; a count that
        // cannot fit in the bound is corruption, not a reason to preallocate.
        if count as usize > KEYS_ANSWER_BYTES_MAX / 11 {
            return Err(format!("KEYS count {count} is implausible"));
        }
        let mut keys = Vec::with_capacity((count as usize).min(4096));
        for _ in 0..count {
            let (Some(key), Some(source), Some(endpoint), Some(acquired)) = (
                take_sized(buf, &mut at),
                take_sized(buf, &mut at),
                take_sized(buf, &mut at),
                take(buf, &mut at, 8),
            ) else {
                return Ok(None);
            };
            let (mut token, mut mode, mut lease_left_ms) =
                (0, crate::core::HoldMode::Persistent, None);
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
            keys.push(KeyInfo {
                key: key.to_vec(),
                source: source.to_vec(),
                endpoint: String::from_utf8_lossy(endpoint).into_owned(),
                acquired_unix_s: i64::from_le_bytes(acquired.try_into().expect("took 8 bytes")),
                token,
                mode,
                lease_left_ms,
            });
        }
        Ok(Some((keys, at)))
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
