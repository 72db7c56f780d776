//! Log record format and recovery scan.
//!
//! File layout: an 8-byte magic `RLWAL\0\0\x01`, then records:
//!
//! ```text
//! offset size field
//! 0      4    crc32c, little-endian, over bytes 4..8+len (length fields,
//!             type and payload: the checksum protects the length too)
//! 4      2    len: u16 LE, number of bytes after the 8-byte header
//! 6      2    !len: bitwise complement of len, so a damaged length field is
//!             recognised on its own, even when the record it claims to
//!             describe would run past the end of the file
//! 8      1    type: 1 = Acquire, 2 = Release, 3 = GrantMark, 4 = Hold,
//!             5 = Extend, 6 = Acquire (binary endpoint), 7 = Hold (binary
//!             endpoint); cluster entries only: 8 = SessionOpen, 9 =
//!             SessionEnd, 10 = SessionHold; 11 = Share
//! 9      ..   payload
//! ```
//!
//! Integers are little-endian. Names are `len u8 · bytes`: keys 1..=127
//! bytes, sources 0..=255 (a session's source, an election's value, may be
//! up to 255 bytes; the lock port's are at most 127). A record with a
//! source over 127 bytes is refused by servers that predate such sources
//! (their scan bounds every name to 127 bytes, and their longest record
//! was shorter): a log holding one is not readable by them (docs/wal.md).
//!
//! - **Acquire** (6; a persistent hold): `grant_id u64 · acquired_unix_ms
//!   u64 · key · source · endpoint`.
//! - **Hold** (7; a session or lease hold): `grant_id u64 ·
//!   acquired_unix_ms u64 · mode u8 (1 session, 2 lease) · expires_unix_ms
//!   u64 (0 for a session) · key · source · endpoint`. A session hold is
//!   recorded for its grant id (the fencing token must never go back) but
//!   not restored: its session did not survive the restart. A lease is
//!   restored with the time it had left.
//! - The binary endpoint: `family u8` then, for 4, `ip 4 bytes · port u16`
//!   (7 bytes in all); for 6, `ip 16 bytes · port u16 · scope_id u32` (23).
//! - **Extend** (5): `grant_id u64 · expires_unix_ms u64 · key`.
//! - **SessionOpen** (8): `session_id u64 · keepalive_ms u32`, and
//!   **SessionEnd** (9): `session_id u64` — a replicated session
//!   ([`crate::core::REPLICATED_SESSION`]) opened or ended, in its home
//!   shard's group.
//! - **SessionHold** (10; a hold, of any mode, taken by a replicated
//!   session): `grant_id u64 · acquired_unix_ms u64 · mode u8 ·
//!   expires_unix_ms u64 (0 unless a lease) · session_id u64 · key · source
//!   · endpoint`. A follower keeps it as that session's, so a new leader
//!   can hand it back to the session's client (a Resume).
//!
//! - **Share** (11; a hold of a key held shared or as a semaphore, any
//!   hold mode): `grant_id u64 · acquired_unix_ms u64 · mode u8 ·
//!   expires_unix_ms u64 (0 unless a lease) · session_id u64 (0: none, else
//!   a replicated session's) · access u8 (1 shared, 2 semaphore) · slots
//!   u32 (the semaphore's n, else 0) · key · source · endpoint`. An
//!   exclusive hold is written as before (6, 7, 10), so a log of exclusive
//!   holds only is read by servers that predate shares. Like every hold
//!   record it sets its key absolutely: holders that could not hold the key
//!   beside it are gone.
//!
//! Records 8–10 appear only in a cluster's replicated entries and
//! snapshots, and only once every member can read them (a single node's
//! log never holds them).
//! - **Release** (2): `grant_id u64 · key`.
//! - **GrantMark** (3): `next_grant_id u64` — written first in every
//!   rewritten log, so grant ids keep increasing across compaction and
//!   restart even though a compacted log holds only the live holders'
//!   Acquires.
//!
//! Version 1 of Acquire (1) and Hold (4) has the same fields but the
//! endpoint as text (`len u8 · "ip:port"`, UTF-8). Logs written before
//! version 2 hold only those; they are still read (and a log may mix both:
//! an old log appended to by a newer server), never written. Parsing a text
//! endpoint was most of the cost of replaying a large log.
//!
//! Recovery (see [`scan_each`]) is one pass over the mapped file: every
//! record is checked, parsed into a [`RecordRef`] whose names borrow the
//! image, and handed to the caller, which applies it; nothing is allocated
//! per record. A record whose header is incomplete or whose body runs past
//! the end of the file is a torn tail (a crash during an append): dropped
//! and truncated. A whole record whose checksum fails is corruption, unless
//! it is the last thing in the file (then it is the torn tail of a write
//! whose data never reached the disk), as is a header whose length check
//! fails while non-zero bytes follow it — with one more exception, for a
//! log that is overwritten in place:
//!
//! **Preallocated logs.** The server keeps zero-filled space ahead of the
//! write position (see docs/wal.md), so past the last record the file reads
//! as zeros, which the scan already takes for the unwritten tail (no record
//! starts with a zero length). An append into that space has no file size
//! to order it behind, so a power cut during its write may leave *any*
//! subset of its sectors on the disk: zeros where a sector was lost, with
//! written bytes after them. Such a write was never acknowledged, and the
//! driver bounds it: no more than [`APPEND_PIECE_BYTES`] of an append are
//! ever unsynced (a larger batch is written and fdatasynced piece by
//! piece, pieces ending on sector boundaries: [`append_piece_end`]). So a
//! damaged record is a torn in-place write, dropped like any
//! torn tail, when (a) everything written after its start fits in
//! [`TORN_WINDOW_BYTES`] and (b) the bytes from it on show the trace of a
//! lost sector: a run of zeros ending on a [`SECTOR_BYTES`] boundary that
//! is either a whole sector (no stretch of records has one: every record is
//! shorter than a sector and starts with a non-zero length) or the rest of
//! the sector from the record's own start, at least 4 bytes (a real
//! checksum is all zeros once in 2^32). A flipped bit is never such a
//! trace, so damage inside the log stays corruption; what this gives up is
//! telling a lost sector among the last [`TORN_WINDOW_BYTES`] of a log from
//! a torn write, which no per-record checksum can.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::ops::ControlFlow;

use crate::core::{Access, HeldKey, HeldRef, HoldMode, Name, KEY_MAX, SOURCE_MAX};

pub const MAGIC: &[u8; 8] = b"RLWAL\0\0\x01";
pub const HEADER: usize = 8;
/// The longest record (a Share of the longest key and source, IPv6
/// endpoint): header, type, 38 bytes of fields, a key of [`KEY_MAX`] and a
/// source of [`SOURCE_MAX`] bytes with their sizes, a 23-byte endpoint.
pub const RECORD_MAX: usize = HEADER + 1 + 38 + (1 + KEY_MAX) + (1 + SOURCE_MAX) + 23;
/// The longest name of a version-1 record: servers that wrote them bounded
/// every name (the text endpoint too) to 127 bytes.
const V1_NAME_MAX: usize = 127;
// A version-1 Hold (header, type, three u64, a mode byte, three names)
// fits too.
const _: () = assert!(HEADER + 1 + 25 + 3 * (1 + V1_NAME_MAX) <= RECORD_MAX);

/// The unit a disk writes atomically, at least: a torn write loses whole
/// sectors (4 KiB devices lose eight of these at a time).
pub const SECTOR_BYTES: usize = 512;
// A whole zero sector cannot be record data (see the module docs).
const _: () = assert!(RECORD_MAX < SECTOR_BYTES);
/// The most bytes of one append the driver leaves unsynced: a batch larger
/// than this is written and fdatasynced in pieces of this size, so a torn
/// write spans at most this much.
pub const APPEND_PIECE_BYTES: usize = 64 * 1024;
/// How far from the end of the written bytes a damaged record may start and
/// still be a torn write: a piece, plus the record it cut into.
pub const TORN_WINDOW_BYTES: usize = APPEND_PIECE_BYTES + RECORD_MAX;

/// Where the driver ends the piece of an append (which ends at file offset
/// `end`) whose unsynced bytes start at `synced_to`: at most
/// [`APPEND_PIECE_BYTES`] later, so no more than that is ever unsynced
/// (also when a short write made the piece take several writes), and on a
/// [`SECTOR_BYTES`] boundary unless the append ends first. So every piece
/// but an append's first starts on a sector boundary: a sector such a
/// piece loses to a power cut holds nothing older than zeros and reads as
/// a whole zero sector, the trace the scan looks for. (A piece boundary
/// inside a sector would leave the synced start of that sector and zeros
/// after it: neither a whole sector nor the rest of a record's own sector,
/// so the scan would call that torn write damage.)
pub fn append_piece_end(synced_to: u64, end: u64) -> u64 {
    let sector = SECTOR_BYTES as u64;
    let cap = (synced_to + APPEND_PIECE_BYTES as u64) / sector * sector;
    debug_assert!(cap > synced_to, "a piece is many sectors long");
    end.min(cap)
}

pub const ACQUIRE_V1: u8 = 1;
pub const RELEASE: u8 = 2;
pub const GRANT_MARK: u8 = 3;
pub const HOLD_V1: u8 = 4;
pub const EXTEND: u8 = 5;
pub const ACQUIRE: u8 = 6;
pub const HOLD: u8 = 7;
pub const SESSION_OPEN: u8 = 8;
pub const SESSION_END: u8 = 9;
pub const SESSION_HOLD: u8 = 10;
pub const SHARE: u8 = 11;

/// The access byte of a Share record.
const SHARE_SHARED: u8 = 1;
const SHARE_SEMAPHORE: u8 = 2;

/// An owned record, as [`scan`] collects them (tests and tools; recovery
/// uses [`scan_each`] and borrows instead, so an Acquire's inline names,
/// a 255-byte source's included, cost nothing on the hot path).
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Acquire(HeldKey),
    Release {
        key: Name,
        grant_id: u64,
    },
    /// The next grant id to hand out is at least this.
    GrantMark {
        next_grant_id: u64,
    },
    /// A lease's new deadline.
    Extend {
        key: Name,
        grant_id: u64,
        expires_unix_ms: u64,
    },
    SessionOpen {
        session: u64,
        keepalive_ms: u32,
    },
    SessionEnd {
        session: u64,
    },
}

/// One record as the scan found it; names borrow the log image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordRef<'a> {
    Acquire(HeldRef<'a>),
    Release {
        key: &'a [u8],
        grant_id: u64,
    },
    GrantMark {
        next_grant_id: u64,
    },
    Extend {
        key: &'a [u8],
        grant_id: u64,
        expires_unix_ms: u64,
    },
    SessionOpen {
        session: u64,
        keepalive_ms: u32,
    },
    SessionEnd {
        session: u64,
    },
}

impl RecordRef<'_> {
    fn to_owned(self) -> Option<Record> {
        Some(match self {
            RecordRef::Acquire(h) => Record::Acquire(h.to_owned()?),
            RecordRef::Release { key, grant_id } => Record::Release {
                key: Name::new(key)?,
                grant_id,
            },
            RecordRef::GrantMark { next_grant_id } => Record::GrantMark { next_grant_id },
            RecordRef::Extend {
                key,
                grant_id,
                expires_unix_ms,
            } => Record::Extend {
                key: Name::new(key)?,
                grant_id,
                expires_unix_ms,
            },
            RecordRef::SessionOpen {
                session,
                keepalive_ms,
            } => Record::SessionOpen {
                session,
                keepalive_ms,
            },
            RecordRef::SessionEnd { session } => Record::SessionEnd { session },
        })
    }
}

/// Bytes the binary endpoint takes in a record.
pub fn endpoint_len(ep: &SocketAddr) -> usize {
    match ep {
        SocketAddr::V4(_) => 1 + 4 + 2,
        SocketAddr::V6(_) => 1 + 16 + 2 + 4,
    }
}

/// The whole size of the Acquire or Hold record of `h`, header included.
pub fn acquire_len(h: HeldRef<'_>) -> usize {
    let hold = if h.access != Access::Exclusive {
        17 + 5
    } else if h.session != 0 {
        17
    } else if h.mode == HoldMode::Persistent {
        0
    } else {
        9
    };
    HEADER + 1 + 16 + hold + 1 + h.key.len() + 1 + h.source.len() + endpoint_len(&h.endpoint)
}

/// Appends a name of at most `max` bytes ([`KEY_MAX`] for a key,
/// [`SOURCE_MAX`] for a source).
fn put_name(out: &mut Vec<u8>, n: &[u8], max: usize) {
    debug_assert!(n.len() <= max, "a name of {} bytes, over {max}", n.len());
    out.push(n.len() as u8);
    out.extend_from_slice(n);
}

fn put_endpoint(out: &mut Vec<u8>, ep: &SocketAddr) {
    match ep {
        SocketAddr::V4(a) => {
            out.push(4);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.port().to_le_bytes());
        }
        SocketAddr::V6(a) => {
            out.push(6);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.port().to_le_bytes());
            out.extend_from_slice(&a.scope_id().to_le_bytes());
        }
    }
}

/// Appends one Acquire (or, for a session or lease, Hold) record to `out`
/// without allocating (beyond `out`'s own growth).
/// A hold of a replicated session (`h.session` set) is a SessionHold.
pub fn encode_acquire(h: HeldRef<'_>, out: &mut Vec<u8>) {
    if h.access != Access::Exclusive {
        return encode_share(h, out);
    }
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER]);
    let persistent = h.mode == HoldMode::Persistent;
    out.push(if h.session != 0 {
        SESSION_HOLD
    } else if persistent {
        ACQUIRE
    } else {
        HOLD
    });
    out.extend_from_slice(&h.grant_id.to_le_bytes());
    out.extend_from_slice(&h.acquired_unix_ms.to_le_bytes());
    if h.session != 0 {
        out.push(h.mode as u8);
        out.extend_from_slice(&h.expires_unix_ms.to_le_bytes());
        out.extend_from_slice(&h.session.to_le_bytes());
    } else if !persistent {
        out.push(h.mode as u8);
        out.extend_from_slice(&h.expires_unix_ms.to_le_bytes());
    }
    put_name(out, h.key, KEY_MAX);
    put_name(out, h.source, SOURCE_MAX);
    put_endpoint(out, &h.endpoint);
    seal(out, start);
    debug_assert_eq!(out.len() - start, acquire_len(h));
}

/// The Share record of a holder of a shared or semaphore key.
fn encode_share(h: HeldRef<'_>, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER]);
    out.push(SHARE);
    out.extend_from_slice(&h.grant_id.to_le_bytes());
    out.extend_from_slice(&h.acquired_unix_ms.to_le_bytes());
    out.push(h.mode as u8);
    out.extend_from_slice(&h.expires_unix_ms.to_le_bytes());
    out.extend_from_slice(&h.session.to_le_bytes());
    let (a, n) = match h.access {
        Access::Shared => (SHARE_SHARED, 0),
        Access::Semaphore(n) => (SHARE_SEMAPHORE, n),
        Access::Exclusive => unreachable!("an exclusive hold is an Acquire, Hold or SessionHold"),
    };
    out.push(a);
    out.extend_from_slice(&n.to_le_bytes());
    put_name(out, h.key, KEY_MAX);
    put_name(out, h.source, SOURCE_MAX);
    put_endpoint(out, &h.endpoint);
    seal(out, start);
    debug_assert_eq!(out.len() - start, acquire_len(h));
}

/// The version-1 Acquire or Hold (text endpoint), as servers before
/// version 2 wrote it: for tests that prove old logs still replay.
pub fn encode_acquire_v1(h: HeldRef<'_>, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER]);
    let persistent = h.mode == HoldMode::Persistent;
    out.push(if persistent { ACQUIRE_V1 } else { HOLD_V1 });
    out.extend_from_slice(&h.grant_id.to_le_bytes());
    out.extend_from_slice(&h.acquired_unix_ms.to_le_bytes());
    if !persistent {
        out.push(h.mode as u8);
        out.extend_from_slice(&h.expires_unix_ms.to_le_bytes());
    }
    put_name(out, h.key, V1_NAME_MAX);
    put_name(out, h.source, V1_NAME_MAX);
    put_name(out, h.endpoint.to_string().as_bytes(), V1_NAME_MAX);
    seal(out, start);
}

pub fn encode_session_open(session: u64, keepalive_ms: u32, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER]);
    out.push(SESSION_OPEN);
    out.extend_from_slice(&session.to_le_bytes());
    out.extend_from_slice(&keepalive_ms.to_le_bytes());
    seal(out, start);
}

pub fn encode_session_end(session: u64, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER]);
    out.push(SESSION_END);
    out.extend_from_slice(&session.to_le_bytes());
    seal(out, start);
}

pub fn encode_grant_mark(next_grant_id: u64, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER]);
    out.push(GRANT_MARK);
    out.extend_from_slice(&next_grant_id.to_le_bytes());
    seal(out, start);
}

pub fn encode_extend(key: &[u8], grant_id: u64, expires_unix_ms: u64, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER]);
    out.push(EXTEND);
    out.extend_from_slice(&grant_id.to_le_bytes());
    out.extend_from_slice(&expires_unix_ms.to_le_bytes());
    put_name(out, key, KEY_MAX);
    seal(out, start);
}

pub fn encode_release(key: &[u8], grant_id: u64, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER]);
    out.push(RELEASE);
    out.extend_from_slice(&grant_id.to_le_bytes());
    put_name(out, key, KEY_MAX);
    seal(out, start);
}

/// Fills in the header of the record that starts at `start`.
fn seal(out: &mut [u8], start: usize) {
    let len = (out.len() - start - HEADER) as u16;
    out[start + 4..start + 6].copy_from_slice(&len.to_le_bytes());
    out[start + 6..start + 8].copy_from_slice(&(!len).to_le_bytes());
    let crc = crc32c::crc32c(&out[start + 4..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
}

/// A cursor over a record body; every read is bounds-checked.
struct Body<'a>(&'a [u8]);

impl<'a> Body<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (v, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(v)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    /// A sized name of at most `max` bytes: a key's [`KEY_MAX`], a
    /// source's [`SOURCE_MAX`] (as on the session protocol), every name
    /// of a version-1 record [`V1_NAME_MAX`].
    fn name(&mut self, max: usize) -> Option<&'a [u8]> {
        let len = self.u8()? as usize;
        if len > max {
            return None;
        }
        self.take(len)
    }
    /// A key: 1..=[`KEY_MAX`] bytes.
    fn key(&mut self) -> Option<&'a [u8]> {
        self.name(KEY_MAX).filter(|k| !k.is_empty())
    }
    fn endpoint(&mut self) -> Option<SocketAddr> {
        match self.u8()? {
            4 => {
                let ip: [u8; 4] = self.take(4)?.try_into().ok()?;
                Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), self.u16()?))
            }
            6 => {
                let ip: [u8; 16] = self.take(16)?.try_into().ok()?;
                let port = self.u16()?;
                let scope = self.u32()?;
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(ip),
                    port,
                    0,
                    scope,
                )))
            }
            _ => None,
        }
    }
    fn text_endpoint(&mut self) -> Option<SocketAddr> {
        std::str::from_utf8(self.name(V1_NAME_MAX)?)
            .ok()?
            .parse()
            .ok()
    }
    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

fn parse_body(body: &[u8]) -> Option<RecordRef<'_>> {
    let mut b = Body(body);
    let ty = b.u8()?;
    let grant_id = b.u64()?;
    let r = match ty {
        SESSION_OPEN => RecordRef::SessionOpen {
            session: grant_id,
            keepalive_ms: b.u32()?,
        },
        SESSION_END => RecordRef::SessionEnd { session: grant_id },
        SHARE => {
            let acquired_unix_ms = b.u64()?;
            let mode = HoldMode::from_byte(b.u8()?)?;
            let expires_unix_ms = b.u64()?;
            let session = b.u64()?;
            if session != 0 && session & crate::core::REPLICATED_SESSION == 0 {
                return None;
            }
            let access = match (b.u8()?, b.u32()?) {
                (SHARE_SHARED, 0) => Access::Shared,
                (SHARE_SEMAPHORE, n) if n >= 1 => Access::Semaphore(n),
                _ => return None,
            };
            let key = b.key()?;
            let source = b.name(SOURCE_MAX)?;
            let endpoint = b.endpoint()?;
            RecordRef::Acquire(HeldRef {
                key,
                source,
                endpoint,
                acquired_unix_ms,
                grant_id,
                mode,
                expires_unix_ms,
                session,
                access,
            })
        }
        ACQUIRE | HOLD | ACQUIRE_V1 | HOLD_V1 | SESSION_HOLD => {
            let acquired_unix_ms = b.u64()?;
            let (mode, expires_unix_ms) = if ty == HOLD || ty == HOLD_V1 {
                let mode = HoldMode::from_byte(b.u8()?).filter(|&m| m != HoldMode::Persistent)?;
                (mode, b.u64()?)
            } else if ty == SESSION_HOLD {
                (HoldMode::from_byte(b.u8()?)?, b.u64()?)
            } else {
                (HoldMode::Persistent, 0)
            };
            let session = if ty == SESSION_HOLD {
                Some(b.u64()?).filter(|s| s & crate::core::REPLICATED_SESSION != 0)?
            } else {
                0
            };
            let v1 = ty == ACQUIRE_V1 || ty == HOLD_V1;
            let key = b.key()?;
            let source = b.name(if v1 { V1_NAME_MAX } else { SOURCE_MAX })?;
            let endpoint = if v1 {
                b.text_endpoint()?
            } else {
                b.endpoint()?
            };
            RecordRef::Acquire(HeldRef {
                key,
                source,
                endpoint,
                acquired_unix_ms,
                grant_id,
                mode,
                expires_unix_ms,
                session,
                access: Access::Exclusive,
            })
        }
        EXTEND => {
            let expires_unix_ms = b.u64()?;
            let key = b.key()?;
            RecordRef::Extend {
                key,
                grant_id,
                expires_unix_ms,
            }
        }
        RELEASE => RecordRef::Release {
            key: b.key()?,
            grant_id,
        },
        GRANT_MARK => RecordRef::GrantMark {
            next_grant_id: grant_id,
        },
        _ => return None,
    };
    b.done().then_some(r)
}

/// What a scan of a log file found ([`scan`]: the records collected).
#[derive(Debug, PartialEq, Eq)]
pub enum Scan {
    /// Every record up to `valid_len` is whole and checked; the bytes after
    /// it (`torn_bytes`) are a torn tail to truncate.
    Ok {
        records: Vec<Record>,
        valid_len: u64,
        torn_bytes: u64,
    },
    /// A damaged record at `offset`; nothing after it can be trusted.
    Corrupt {
        offset: u64,
        reason: &'static str,
        /// Records before the corruption (for `wal check` output).
        records_before: usize,
    },
    /// Not a ringlock log at all.
    BadMagic,
}

/// How a [`scan_each`] ended: [`Scan`] without the records, which went to
/// the caller one by one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scanned {
    /// Every record up to `valid_len` is whole, checked and was handed
    /// over; the `torn_bytes` after it are a torn tail to truncate.
    Ok {
        records: usize,
        valid_len: u64,
        torn_bytes: u64,
    },
    /// A damaged record at `offset`; the `records_before` it were handed
    /// over, nothing after it can be trusted.
    Corrupt {
        offset: u64,
        reason: &'static str,
        records_before: usize,
    },
    /// Not a ringlock log at all; nothing was handed over.
    BadMagic,
    /// The caller stopped the scan at the record that starts at `offset`.
    Stopped { offset: u64 },
}

/// Scans a whole log image, collecting its records (tests and tools). A
/// file shorter than the magic is treated as a log torn during creation
/// (empty).
pub fn scan(data: &[u8]) -> Scan {
    let mut records = Vec::new();
    match scan_each(data, |r| {
        records.push(
            r.to_owned()
                .expect("the scan bounds keys and sources as names are"),
        );
        ControlFlow::Continue(())
    }) {
        Scanned::Ok {
            valid_len,
            torn_bytes,
            ..
        } => Scan::Ok {
            records,
            valid_len,
            torn_bytes,
        },
        Scanned::Corrupt {
            offset,
            reason,
            records_before,
        } => Scan::Corrupt {
            offset,
            reason,
            records_before,
        },
        Scanned::BadMagic => Scan::BadMagic,
        Scanned::Stopped { .. } => unreachable!("the collector never stops"),
    }
}

/// Whether the damaged record at `at` is a torn in-place write: the bytes
/// written after it fit in one unsynced append piece, and a lost sector
/// left its trace of zeros (module docs). Runs only at a damaged record, so
/// a clean scan never pays for it.
fn torn_in_place(data: &[u8], at: usize, written_end: usize) -> bool {
    if written_end.saturating_sub(at) > TORN_WINDOW_BYTES {
        return false;
    }
    let mut boundary = (at / SECTOR_BYTES + 1) * SECTOR_BYTES;
    while boundary < written_end {
        let from = boundary.saturating_sub(SECTOR_BYTES).max(at);
        let whole = from + SECTOR_BYTES == boundary;
        if (whole || boundary - from >= 4) && data[from..boundary].iter().all(|&b| b == 0) {
            return true;
        }
        boundary += SECTOR_BYTES;
    }
    false
}

/// Scans a whole log image in one pass, handing every whole, checked
/// record to `apply` in file order as soon as it is parsed; `apply` may
/// stop the scan. No allocation. A file shorter than the magic is treated
/// as a log torn during creation (empty).
pub fn scan_each<'a>(
    data: &'a [u8],
    mut apply: impl FnMut(RecordRef<'a>) -> ControlFlow<()>,
) -> Scanned {
    if data.len() < HEADER {
        if MAGIC.starts_with(data) {
            return Scanned::Ok {
                records: 0,
                valid_len: 0,
                torn_bytes: data.len() as u64,
            };
        }
        return Scanned::BadMagic;
    }
    if &data[..HEADER] != MAGIC {
        return Scanned::BadMagic;
    }
    // Past its last non-zero byte the file holds only zeros, which no
    // record ends with (every record has a non-zero length field): the
    // unwritten part of an append whose file size reached the disk before
    // its data did. Found once, from the end (not per record).
    let written_end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let mut records = 0;
    let mut at = HEADER;
    let torn = |at: usize, records: usize| Scanned::Ok {
        records,
        valid_len: at as u64,
        torn_bytes: (data.len() - at) as u64,
    };
    while at < data.len() {
        let rest = &data[at..];
        if rest.len() < HEADER {
            return torn(at, records);
        }
        let len = u16::from_le_bytes([rest[4], rest[5]]);
        let check = u16::from_le_bytes([rest[6], rest[7]]);
        // Bytes of `rest` up to the file's last non-zero byte.
        let written = written_end.saturating_sub(at);
        if len != !check || len as usize > RECORD_MAX - HEADER || len == 0 {
            // A damaged length, or the zero-filled tail of a write that was
            // cut short (the file grew but the data never arrived): torn if
            // nothing but this header (or part of it) was written.
            if written <= HEADER || torn_in_place(data, at, written_end) {
                return torn(at, records);
            }
            return Scanned::Corrupt {
                offset: at as u64,
                reason: "record length field is damaged",
                records_before: records,
            };
        }
        let end = HEADER + len as usize;
        if rest.len() < end {
            return torn(at, records);
        }
        let crc = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes"));
        if crc32c::crc32c(&rest[4..end]) != crc {
            if written <= end || torn_in_place(data, at, written_end) {
                // The very last record (possibly followed by zeros only):
                // the torn tail of the final write; or a torn in-place write.
                return torn(at, records);
            }
            return Scanned::Corrupt {
                offset: at as u64,
                reason: "record checksum mismatch",
                records_before: records,
            };
        }
        let Some(r) = parse_body(&rest[HEADER..end]) else {
            return Scanned::Corrupt {
                offset: at as u64,
                reason: "record checksum is valid but its contents are not",
                records_before: records,
            };
        };
        if apply(r).is_break() {
            return Scanned::Stopped { offset: at as u64 };
        }
        records += 1;
        at += end;
    }
    Scanned::Ok {
        records,
        valid_len: at as u64,
        torn_bytes: 0,
    }
}

/// Hands every record of a batch (records without the file's magic: a
/// replicated entry's) to `apply`, in order. A batch is checked as a
/// whole before it is committed, so any damage is an error, never a torn
/// tail. The number of records.
pub fn each_in_batch<'a>(
    data: &'a [u8],
    mut apply: impl FnMut(RecordRef<'a>),
) -> Result<usize, &'static str> {
    let mut at = 0;
    let mut n = 0;
    while at < data.len() {
        let rest = &data[at..];
        if rest.len() < HEADER {
            return Err("batch ends inside a record header");
        }
        let len = u16::from_le_bytes([rest[4], rest[5]]);
        let check = u16::from_le_bytes([rest[6], rest[7]]);
        if len != !check || len == 0 || len as usize > RECORD_MAX - HEADER {
            return Err("record length field is damaged");
        }
        let end = HEADER + len as usize;
        if rest.len() < end {
            return Err("batch ends inside a record");
        }
        let crc = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes"));
        if crc32c::crc32c(&rest[4..end]) != crc {
            return Err("record checksum mismatch");
        }
        apply(parse_body(&rest[HEADER..end]).ok_or("record contents are not valid")?);
        n += 1;
        at += end;
    }
    Ok(n)
}

#[cfg(test)]
mod tests;
