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
//!             5 = Extend
//! 9      ..   payload
//! ```
//!
//! Acquire payload (a persistent hold): `grant_id u64 · acquired_unix_ms u64
//! · keyLen u8 · key · srcLen u8 · source · epLen u8 · endpoint ("ip:port",
//! UTF-8)`.
//! Hold payload (a session or lease hold): `grant_id u64 · acquired_unix_ms
//! u64 · mode u8 (1 session, 2 lease) · expires_unix_ms u64 (0 for a
//! session) · keyLen u8 · key · srcLen u8 · source · epLen u8 · endpoint`.
//! A session hold is recorded for its grant id (the fencing token must
//! never go back) but not restored: its session did not survive the
//! restart. A lease is restored with the time it had left.
//! Extend payload: `grant_id u64 · expires_unix_ms u64 · keyLen u8 · key`.
//! Release payload: `grant_id u64 · keyLen u8 · key`.
//! GrantMark payload: `next_grant_id u64` — written first in every rewritten
//! log, so grant ids keep increasing across compaction and restart even
//! though a compacted log holds only the live holders' Acquires.
//!
//! Recovery (see [`scan`]): a record whose header is incomplete or whose
//! body runs past the end of the file is a torn tail (a crash during an
//! append): dropped and truncated. A whole record whose checksum fails is
//! corruption, unless it is the last thing in the file (then it is the torn
//! tail of a write whose data never reached the disk), as is a header whose
//! length check fails while non-zero bytes follow it.

use std::net::SocketAddr;

use crate::core::{HeldKey, Name};

pub const MAGIC: &[u8; 8] = b"RLWAL\0\0\x01";
pub const HEADER: usize = 8;
/// The longest record (a Hold): header, type, three u64, a mode byte,
/// three sized strings.
pub const RECORD_MAX: usize = HEADER + 1 + 25 + 3 * (1 + 127);

pub const ACQUIRE: u8 = 1;
pub const RELEASE: u8 = 2;
pub const GRANT_MARK: u8 = 3;
pub const HOLD: u8 = 4;
pub const EXTEND: u8 = 5;

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
}

use crate::core::HoldMode;

/// Record bytes an Acquire or Hold of `h` takes beyond its three strings.
pub fn acquire_fixed_len(h: &HeldKey) -> usize {
    HEADER + 1 + 16 + 3 + if h.mode == HoldMode::Persistent { 0 } else { 9 }
}

fn put_name(out: &mut Vec<u8>, n: &[u8]) {
    debug_assert!(n.len() <= 127);
    out.push(n.len() as u8);
    out.extend_from_slice(n);
}

/// Appends one Acquire record to `out` without allocating (beyond `out`'s
/// own growth).
pub fn encode_acquire(h: &HeldKey, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER]);
    let persistent = h.mode == HoldMode::Persistent;
    out.push(if persistent { ACQUIRE } else { HOLD });
    out.extend_from_slice(&h.grant_id.to_le_bytes());
    out.extend_from_slice(&h.acquired_unix_ms.to_le_bytes());
    if !persistent {
        out.push(h.mode as u8);
        out.extend_from_slice(&h.expires_unix_ms.to_le_bytes());
    }
    put_name(out, h.key.as_bytes());
    put_name(out, h.source.as_bytes());
    // The endpoint is formatted into a stack buffer: no allocation.
    let mut ep = [0u8; 64];
    let n = {
        use std::io::Write;
        let mut cur = std::io::Cursor::new(&mut ep[..]);
        write!(cur, "{}", h.endpoint).expect("a socket address fits in 64 bytes");
        cur.position() as usize
    };
    put_name(out, &ep[..n]);
    seal(out, start);
}

pub fn encode_grant_mark(next_grant_id: u64, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER]);
    out.push(GRANT_MARK);
    out.extend_from_slice(&next_grant_id.to_le_bytes());
    seal(out, start);
}

pub fn encode_extend(key: &Name, grant_id: u64, expires_unix_ms: u64, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER]);
    out.push(EXTEND);
    out.extend_from_slice(&grant_id.to_le_bytes());
    out.extend_from_slice(&expires_unix_ms.to_le_bytes());
    put_name(out, key.as_bytes());
    seal(out, start);
}

pub fn encode_release(key: &Name, grant_id: u64, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER]);
    out.push(RELEASE);
    out.extend_from_slice(&grant_id.to_le_bytes());
    put_name(out, key.as_bytes());
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

fn parse_body(body: &[u8]) -> Option<Record> {
    let (&ty, mut rest) = body.split_first()?;
    fn u64_(rest: &mut &[u8]) -> Option<u64> {
        let v = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
        *rest = &rest[8..];
        Some(v)
    }
    fn name<'a>(rest: &mut &'a [u8]) -> Option<&'a [u8]> {
        let len = *rest.first()? as usize;
        let v = rest.get(1..1 + len)?;
        *rest = &rest[1 + len..];
        Some(v)
    }
    let grant_id = u64_(&mut rest)?;
    match ty {
        ACQUIRE | HOLD => {
            let acquired_unix_ms = u64_(&mut rest)?;
            let (mode, expires_unix_ms) = if ty == HOLD {
                let (&m, r) = rest.split_first()?;
                rest = r;
                let mode = HoldMode::from_byte(m).filter(|&m| m != HoldMode::Persistent)?;
                (mode, u64_(&mut rest)?)
            } else {
                (HoldMode::Persistent, 0)
            };
            let key = Name::new(name(&mut rest)?)?;
            let source = Name::new(name(&mut rest)?)?;
            let ep = std::str::from_utf8(name(&mut rest)?).ok()?;
            let endpoint: SocketAddr = ep.parse().ok()?;
            if !rest.is_empty() || key.is_empty() {
                return None;
            }
            Some(Record::Acquire(HeldKey {
                key,
                source,
                endpoint,
                acquired_unix_ms,
                grant_id,
                mode,
                expires_unix_ms,
            }))
        }
        EXTEND => {
            let expires_unix_ms = u64_(&mut rest)?;
            let key = Name::new(name(&mut rest)?)?;
            if !rest.is_empty() || key.is_empty() {
                return None;
            }
            Some(Record::Extend {
                key,
                grant_id,
                expires_unix_ms,
            })
        }
        RELEASE => {
            let key = Name::new(name(&mut rest)?)?;
            if !rest.is_empty() || key.is_empty() {
                return None;
            }
            Some(Record::Release { key, grant_id })
        }
        GRANT_MARK => rest.is_empty().then_some(Record::GrantMark {
            next_grant_id: grant_id,
        }),
        _ => None,
    }
}

/// What a scan of a log file found.
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

/// Scans a whole log image. A file shorter than the magic is treated as a
/// log torn during creation (empty).
pub fn scan(data: &[u8]) -> Scan {
    if data.len() < HEADER {
        if MAGIC.starts_with(data) {
            return Scan::Ok {
                records: Vec::new(),
                valid_len: 0,
                torn_bytes: data.len() as u64,
            };
        }
        return Scan::BadMagic;
    }
    if &data[..HEADER] != MAGIC {
        return Scan::BadMagic;
    }
    let mut records = Vec::new();
    let mut at = HEADER;
    let torn = |at: usize, records: Vec<Record>| Scan::Ok {
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
        // Bytes of `rest` up to its last non-zero byte: past it the file
        // holds only zeros, which no record ends with (every record has a
        // non-zero length field) — the unwritten part of an append whose
        // file size reached the disk before its data did.
        let written = rest.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        if len != !check || len as usize > RECORD_MAX - HEADER || len == 0 {
            // A damaged length, or the zero-filled tail of a write that was
            // cut short (the file grew but the data never arrived): torn if
            // nothing but this header (or part of it) was written.
            if written <= HEADER {
                return torn(at, records);
            }
            return Scan::Corrupt {
                offset: at as u64,
                reason: "record length field is damaged",
                records_before: records.len(),
            };
        }
        let end = HEADER + len as usize;
        if rest.len() < end {
            return torn(at, records);
        }
        let crc = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes"));
        if crc32c::crc32c(&rest[4..end]) != crc {
            if written <= end {
                // The very last record (possibly followed by zeros only):
                // the torn tail of the final write.
                return torn(at, records);
            }
            return Scan::Corrupt {
                offset: at as u64,
                reason: "record checksum mismatch",
                records_before: records.len(),
            };
        }
        match parse_body(&rest[HEADER..end]) {
            Some(r) => records.push(r),
            None => {
                return Scan::Corrupt {
                    offset: at as u64,
                    reason: "record checksum is valid but its contents are not",
                    records_before: records.len(),
                }
            }
        }
        at += end;
    }
    Scan::Ok {
        records,
        valid_len: at as u64,
        torn_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn held(k: &str, id: u64) -> HeldKey {
        HeldKey {
            key: Name::new(k.as_bytes()).unwrap(),
            source: Name::new(b"src").unwrap(),
            endpoint: "10.1.2.3:4567".parse().unwrap(),
            acquired_unix_ms: 1_700_000_000_123,
            grant_id: id,
            mode: crate::core::HoldMode::Persistent,
            expires_unix_ms: 0,
        }
    }

    fn image(n: usize) -> (Vec<u8>, Vec<usize>) {
        let mut out = MAGIC.to_vec();
        let mut starts = Vec::new();
        for i in 0..n {
            starts.push(out.len());
            if i % 3 == 2 {
                encode_release(
                    &Name::new(format!("k{}", i - 1).as_bytes()).unwrap(),
                    i as u64,
                    &mut out,
                );
            } else {
                encode_acquire(&held(&format!("k{i}"), i as u64), &mut out);
            }
        }
        (out, starts)
    }

    #[test]
    fn grant_mark_roundtrip() {
        let mut img = MAGIC.to_vec();
        encode_grant_mark(42, &mut img);
        encode_acquire(&held("k", 43), &mut img);
        let Scan::Ok { records, .. } = scan(&img) else {
            panic!()
        };
        assert_eq!(records[0], Record::GrantMark { next_grant_id: 42 });
        assert_eq!(records.len(), 2);
    }

    #[test]
    fn roundtrip() {
        let (img, _) = image(7);
        let Scan::Ok {
            records,
            valid_len,
            torn_bytes,
        } = scan(&img)
        else {
            panic!()
        };
        assert_eq!(records.len(), 7);
        assert_eq!(valid_len as usize, img.len());
        assert_eq!(torn_bytes, 0);
        assert_eq!(records[0], Record::Acquire(held("k0", 0)));
        assert!(matches!(records[2], Record::Release { grant_id: 2, .. }));
    }

    #[test]
    fn every_cut_in_the_last_record_is_a_torn_tail() {
        let (img, starts) = image(5);
        let last = *starts.last().unwrap();
        for cut in last..img.len() {
            match scan(&img[..cut]) {
                Scan::Ok {
                    records,
                    valid_len,
                    torn_bytes,
                } => {
                    assert_eq!(records.len(), 4, "cut {cut}");
                    assert_eq!(valid_len as usize, last);
                    assert_eq!(torn_bytes as usize, cut - last);
                }
                s => panic!("cut {cut}: {s:?}"),
            }
        }
    }

    #[test]
    fn a_flipped_byte_in_a_middle_record_is_corruption_at_its_offset() {
        let (img, starts) = image(6);
        for r in 0..starts.len() - 1 {
            for at in starts[r]..starts[r + 1] {
                for bit in [0x01u8, 0x80] {
                    let mut bad = img.clone();
                    bad[at] ^= bit;
                    match scan(&bad) {
                        Scan::Corrupt {
                            offset,
                            records_before,
                            ..
                        } => {
                            assert_eq!(offset as usize, starts[r], "byte {at}");
                            assert_eq!(records_before, r);
                        }
                        s => panic!("flip at {at} (record {r}) not detected: {s:?}"),
                    }
                }
            }
        }
    }

    #[test]
    fn zero_filled_tail_is_torn_and_magic_is_checked() {
        let (mut img, _) = image(3);
        let n = img.len();
        img.extend_from_slice(&[0u8; 300]);
        assert!(
            matches!(scan(&img), Scan::Ok { valid_len, torn_bytes: 300, .. } if valid_len as usize == n)
        );
        assert_eq!(scan(b"garbage!garbage"), Scan::BadMagic);
        assert!(matches!(scan(&MAGIC[..3]), Scan::Ok { torn_bytes: 3, .. }));
    }

    #[test]
    fn a_record_whose_end_never_reached_the_disk_is_torn() {
        // The file size covers the last batch, but its later sectors read
        // as zeros: the last record's tail, and any records after it.
        let (img, starts) = image(6);
        let ends: Vec<usize> = starts[1..].iter().copied().chain([img.len()]).collect();
        // Every record ends with a non-zero byte (a key or an endpoint), so
        // zeroing from any offset inside a record damages it.
        for zero_from in starts[starts.len() - 2]..img.len() {
            let mut cut = img.clone();
            cut[zero_from..].iter_mut().for_each(|b| *b = 0);
            cut.extend_from_slice(&[0u8; 100]);
            let whole = ends.iter().filter(|&&e| e <= zero_from).count();
            match scan(&cut) {
                Scan::Ok {
                    records,
                    valid_len,
                    torn_bytes,
                } => {
                    assert_eq!(records.len(), whole, "zeros from {zero_from}");
                    assert_eq!(valid_len as usize, ends[whole - 1]);
                    assert_eq!((valid_len + torn_bytes) as usize, cut.len());
                }
                s => panic!("zeros from {zero_from}: {s:?}"),
            }
        }
        // Non-zero bytes after a damaged record are still corruption.
        let mut bad = img.clone();
        let mid = starts[3] + 12;
        bad[mid] ^= 1;
        bad[starts[4]..].iter_mut().for_each(|b| *b = 0);
        *bad.last_mut().unwrap() = 1;
        assert!(matches!(scan(&bad), Scan::Corrupt { offset, .. } if offset as usize == starts[3]));
    }

    proptest! {
        #[test]
        fn scan_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let mut img = MAGIC.to_vec();
            img.extend_from_slice(&bytes);
            let _ = scan(&img);
            let _ = scan(&bytes);
        }
    }
}
