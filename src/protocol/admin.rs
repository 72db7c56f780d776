//! The admin port's commands.

use super::*;

/// Which listing an answer is (re-exported from the lock core, which
/// encodes the entries).
pub use crate::core::ListForm;

/// Most names one RSET/RSBS may carry.
pub const NAMES_MAX: u32 = 65_536;
/// Largest admin request accepted: 4 + 4 + NAMES_MAX × 256.
pub const FRAME_MAX: usize = 8 + NAMES_MAX as usize * 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Keys,
    /// KEYS with token, hold mode and lease time left (extension).
    Keyx,
    /// Every holder, KEYX with access (extension).
    Keyh,
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

impl Command {
    /// The listing a `KEYS`, `KEYX` or `KEYH` asks for; `None` for the
    /// other commands.
    pub fn list_form(self) -> Option<ListForm> {
        match self {
            Command::Keys => Some(ListForm::Keys),
            Command::Keyx => Some(ListForm::Keyx),
            Command::Keyh => Some(ListForm::Keyh),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadAdmin {
    UnknownCommand([u8; 4]),
    TooMany(u32),
    EmptyKey,
    /// A key (RSET, RSTK) over 127 bytes. An RSBS source may be up to 255
    /// (a session's source), all a size byte can say.
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
            BadAdmin::NameTooLong(n) => write!(f, "key of {n} bytes exceeds 127"),
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
        b"KEYS" | b"KEYX" | b"KEYH" => {
            return Decoded::Frame {
                cmd: match buf[3] {
                    b'S' => Command::Keys,
                    b'X' => Command::Keyx,
                    _ => Command::Keyh,
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
    decode_names(buf, cmd)
}

/// The rest of a reset command (`RSET`, `RSBS`, `RSTK`): its count and
/// that many names (and, for `RSTK`, tokens), each validated.
fn decode_names(buf: &[u8], cmd: Command) -> Decoded {
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
        if cmd != Command::Rsbs && len as usize > crate::core::KEY_MAX {
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

/// Encodes the KEYH answer (`held`: every holder, sorted by key and
/// token): the KEYX entry of each holder followed by `[u8 access][u32
/// slots]`.
pub fn encode_keyh(held: &[HeldKey], now_unix_ms: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(&(held.len() as u32).to_le_bytes());
    for h in held {
        let mut one = Vec::with_capacity(80);
        encode_keyx(std::slice::from_ref(h), now_unix_ms, &mut one);
        out.extend_from_slice(&one[4..]);
        let (a, slots) = h.access.to_bytes();
        out.push(a);
        out.extend_from_slice(&slots.to_le_bytes());
    }
}

/// Upper bound on a whole `KEYS` answer a reader keeps in memory
/// ([`decode_keys`], and the count [`check_count`] accepts for a list
/// collected whole). A server holding this many bytes of keys is either
/// broken or hostile. A reader that takes the answer one entry at a
/// time ([`KeysDecoder`]) needs no such bound.
pub const KEYS_ANSWER_BYTES_MAX: usize = 256 << 20;

/// One held key as reported by the admin port's `KEYS` command (or one
/// holder of it, from `KEYH`).
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
    /// KEYH only (`None` from KEYS and KEYX): how the key is held.
    pub access: Option<crate::core::Access>,
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

/// Most bytes one `KEYH` entry can take on the wire (three names of up
/// to 255 bytes with their sizes, the time, token, mode, lease, access
/// and slots); `KEYS` and `KEYX` entries are smaller. A reader's buffer
/// at least this big always holds a whole entry.
pub const KEYS_ENTRY_BYTES_MAX: usize = 3 * (1 + 255) + 8 + ListForm::Keyh.tail_len();

/// Parses a complete `KEYS` answer from the front of `buf`:
/// `Ok(None)` while it is incomplete (read more and call again),
/// `Ok(Some((keys, consumed)))` once whole, `Err` for an implausible count
/// (more entries than [`KEYS_ANSWER_BYTES_MAX`] could hold) or bad data.
/// Built on [`KeysDecoder`], which reads an answer of any size one entry
/// at a time instead.
pub fn decode_keys(buf: &[u8]) -> Result<Option<(Vec<KeyInfo>, usize)>, String> {
    decode_listing(buf, ListForm::Keys)
}

/// [`decode_keys`] for a `KEYX` answer.
pub fn decode_keyx(buf: &[u8]) -> Result<Option<(Vec<KeyInfo>, usize)>, String> {
    decode_listing(buf, ListForm::Keyx)
}

/// [`decode_keys`] for an answer of any form.
pub fn decode_listing(buf: &[u8], form: ListForm) -> Result<Option<(Vec<KeyInfo>, usize)>, String> {
    let mut dec = KeysDecoder::of(form);
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
    form: ListForm,
    /// Entries still to come; `None` before the count.
    left: Option<u32>,
}

impl KeysDecoder {
    /// A decoder of a `KEYX` answer (`extended`) or a `KEYS` one.
    pub fn new(extended: bool) -> KeysDecoder {
        KeysDecoder::of(if extended {
            ListForm::Keyx
        } else {
            ListForm::Keys
        })
    }

    /// A decoder of an answer of `form`.
    pub fn of(form: ListForm) -> KeysDecoder {
        KeysDecoder { form, left: None }
    }

    /// A decoder of a `KEYS` answer.
    pub fn keys() -> KeysDecoder {
        KeysDecoder::of(ListForm::Keys)
    }

    /// A decoder of a `KEYX` answer.
    pub fn keyx() -> KeysDecoder {
        KeysDecoder::of(ListForm::Keyx)
    }

    /// A decoder of a `KEYH` answer.
    pub fn keyh() -> KeysDecoder {
        KeysDecoder::of(ListForm::Keyh)
    }

    /// Whether its entries have the `KEYX` fields (token, mode, lease
    /// time left): a `KEYX` or `KEYH` answer.
    pub fn extended(&self) -> bool {
        self.form != ListForm::Keys
    }

    /// The form it decodes.
    pub fn form(&self) -> ListForm {
        self.form
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
        match decode_entry(buf, self.form)? {
            None => Ok((KeysStep::Incomplete, 0)),
            Some((entry, used)) => {
                self.left = Some(left - 1);
                Ok((KeysStep::Entry(entry), used))
            }
        }
    }
}

/// One entry from the front of `buf`: `Ok(None)` while incomplete.
fn decode_entry(buf: &[u8], form: ListForm) -> Result<Option<(KeyInfo, usize)>, String> {
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
    if form != ListForm::Keys {
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
    let mut access = None;
    if form == ListForm::Keyh {
        let (Some(a), Some(n)) = (take(buf, &mut at, 1), take(buf, &mut at, 4)) else {
            return Ok(None);
        };
        let n = u32::from_le_bytes(n.try_into().expect("took 4 bytes"));
        access = Some(
            crate::core::Access::from_bytes(a[0], n)
                .ok_or_else(|| format!("KEYH: unknown access {} of {n} slots", a[0]))?,
        );
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
            access,
        },
        at,
    )))
}
