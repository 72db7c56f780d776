//! The record format's unit and property tests: encode, decode, scan.

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
        session: 0,
        access: crate::core::Access::Exclusive,
    }
}

fn image(n: usize) -> (Vec<u8>, Vec<usize>) {
    let mut out = MAGIC.to_vec();
    let mut starts = Vec::new();
    for i in 0..n {
        starts.push(out.len());
        if i % 3 == 2 {
            encode_release(format!("k{}", i - 1).as_bytes(), i as u64, &mut out);
        } else {
            encode_acquire(held(&format!("k{i}"), i as u64).as_ref(), &mut out);
        }
    }
    (out, starts)
}

#[test]
fn grant_mark_roundtrip() {
    let mut img = MAGIC.to_vec();
    encode_grant_mark(42, &mut img);
    encode_acquire(held("k", 43).as_ref(), &mut img);
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

/// A log whose last append, from record `first` on, was cut by a power
/// loss while it overwrote preallocated zeros: the sectors in `lost`
/// (indices into the file) kept their old contents — the durable bytes
/// before the append, zeros after — and the rest arrived.
fn torn_in_place(img: &[u8], append_at: usize, lost: &[usize]) -> Vec<u8> {
    let mut disk = img.to_vec();
    disk.extend_from_slice(&[0u8; 4096]); // preallocated, zero-filled
    for &sector in lost {
        let from = (sector * SECTOR_BYTES).max(append_at);
        let to = ((sector + 1) * SECTOR_BYTES).min(disk.len());
        if from < to {
            disk[from..to].iter_mut().for_each(|b| *b = 0);
        }
    }
    disk
}

#[test]
fn lost_sectors_of_the_last_in_place_write_are_a_torn_tail() {
    let (img, starts) = image(300);
    let ends: Vec<usize> = starts[1..].iter().copied().chain([img.len()]).collect();
    assert!(img.len() > 8 * SECTOR_BYTES, "spans many sectors");
    let sectors = img.len().div_ceil(SECTOR_BYTES);
    // Appends starting at several record boundaries, and every choice of
    // one or two lost sectors among those the append touched.
    for &append_at in &[starts[1], starts[100], starts[177], starts[299]] {
        let first_sector = append_at / SECTOR_BYTES;
        for a in first_sector..sectors {
            for b in a..sectors {
                let disk = torn_in_place(&img, append_at, &[a, b]);
                // The first record that lost a byte, and what survives.
                let damaged = starts
                    .iter()
                    .zip(&ends)
                    .position(|(&s, &e)| disk[s..e] != img[s..e]);
                let Some(d) = damaged else { continue };
                match scan(&disk) {
                    Scan::Ok {
                        records, valid_len, ..
                    } => {
                        assert_eq!(records.len(), d, "append at {append_at}, lost {a},{b}");
                        assert_eq!(valid_len as usize, starts[d]);
                    }
                    s => panic!("append at {append_at}, lost sectors {a},{b}: {s:?}"),
                }
            }
        }
    }
}

#[test]
fn a_flipped_byte_near_the_end_of_a_long_log_is_still_corruption() {
    // Within a torn write's window of the end, across many sectors: a
    // flipped bit leaves no lost-sector trace, and zeros that do not
    // reach a sector boundary are not one either.
    let (img, starts) = image(300);
    for r in [150, 200, 297] {
        for at in [starts[r], starts[r] + 5, starts[r + 1] - 1] {
            let mut bad = img.clone();
            bad[at] ^= 0x10;
            bad.extend_from_slice(&[0u8; 2048]);
            match scan(&bad) {
                Scan::Corrupt { offset, .. } => assert_eq!(offset as usize, starts[r]),
                s => panic!("flip at {at} (record {r}): {s:?}"),
            }
        }
    }
    let mut bad = img.clone();
    let r = 150;
    bad[starts[r]..starts[r] + 12]
        .iter_mut()
        .for_each(|b| *b = 0);
    if (starts[r] + 12) % SECTOR_BYTES != 0 {
        assert!(matches!(scan(&bad), Scan::Corrupt { offset, .. } if offset as usize == starts[r]));
    }
}

/// The pieces the driver writes an append of `len` bytes at `offset`
/// in, as `[start, end)` file ranges (each written and fdatasynced
/// before the next starts).
fn pieces(offset: usize, len: usize) -> Vec<(usize, usize)> {
    let (mut at, end, mut out) = (offset as u64, (offset + len) as u64, Vec::new());
    while at < end {
        let to = append_piece_end(at, end);
        out.push((at as usize, to as usize));
        at = to;
    }
    out
}

#[test]
fn pieces_leave_at_most_a_piece_unsynced_and_later_ones_start_on_a_sector() {
    for offset in [8, 511, 512, 1000, 4093, 70_000] {
        for len in [1, 500, APPEND_PIECE_BYTES, APPEND_PIECE_BYTES + 1, 300_000] {
            let p = pieces(offset, len);
            assert_eq!(p[0].0, offset);
            assert_eq!(p.last().expect("a piece").1, offset + len);
            for (i, &(from, to)) in p.iter().enumerate() {
                assert!(
                    from < to && to - from <= APPEND_PIECE_BYTES,
                    "{offset}+{len}"
                );
                if i > 0 {
                    assert_eq!(from % SECTOR_BYTES, 0, "{offset}+{len}: piece {i}");
                    assert_eq!(from, p[i - 1].1);
                }
            }
        }
    }
}

#[test]
fn a_power_cut_in_any_piece_of_a_large_append_is_a_torn_tail() {
    // One append of more than two pieces. While piece k is in flight,
    // everything before it is synced, nothing after it is written, and
    // of its own sectors any may be lost: the first, one in the middle
    // or the last (the one the write ends in).
    let (img, starts) = image(5000);
    let ends: Vec<usize> = starts[1..].iter().copied().chain([img.len()]).collect();
    for first in [1, 7, 33] {
        let append_at = starts[first];
        if SECTOR_BYTES - append_at % SECTOR_BYTES < 4 {
            // The append's first sector holds fewer than 4 of its bytes:
            // losing it leaves no trace the scan trusts (docs/wal.md).
            continue;
        }
        let p = pieces(append_at, img.len() - append_at);
        assert!(p.len() > 2, "the append spans several pieces");
        for &(from, to) in &p {
            let first_sector = from / SECTOR_BYTES;
            let last_sector = (to - 1) / SECTOR_BYTES;
            let mid = (first_sector + last_sector) / 2;
            let lost_sectors = [first_sector, first_sector + 1, mid, last_sector];
            for lost in lost_sectors.into_iter().filter(|&l| l <= last_sector) {
                let mut disk = img[..to].to_vec();
                disk.resize(img.len() + 4096, 0); // zeros never overwritten
                let zero_from = (lost * SECTOR_BYTES).max(from);
                let zero_to = ((lost + 1) * SECTOR_BYTES).min(to);
                disk[zero_from..zero_to].iter_mut().for_each(|b| *b = 0);
                let Some(d) = starts
                    .iter()
                    .zip(&ends)
                    .position(|(&s, &e)| disk[s..e] != img[s..e])
                else {
                    continue;
                };
                match scan(&disk) {
                    Scan::Ok {
                        records, valid_len, ..
                    } => {
                        assert_eq!(records.len(), d, "piece [{from}, {to}), lost {lost}");
                        assert_eq!(valid_len as usize, starts[d]);
                    }
                    s => panic!(
                        "append at {append_at}, piece [{from}, {to}), lost sector {lost}: {s:?}"
                    ),
                }
            }
        }
    }
}

#[test]
fn a_lost_sector_far_from_the_end_is_corruption() {
    // More than a torn write's window written after it: the sector was
    // durable, so its loss is damage, not a torn append.
    let n = (TORN_WINDOW_BYTES + 8 * SECTOR_BYTES) / 20;
    let (img, starts) = image(n);
    assert!(img.len() > TORN_WINDOW_BYTES + 4 * SECTOR_BYTES);
    let disk = torn_in_place(&img, 0, &[2]);
    let first = starts
        .iter()
        .position(|&s| s + 8 > 2 * SECTOR_BYTES)
        .expect("a record in sector 2")
        - 1;
    match scan(&disk) {
        Scan::Corrupt { offset, .. } => assert_eq!(offset as usize, starts[first]),
        s => panic!("{s:?}"),
    }
    // The same loss within the window of the end is a torn write.
    let tail_at = starts[n - 40];
    let sector = tail_at / SECTOR_BYTES + 2;
    let disk = torn_in_place(&img, tail_at, &[sector]);
    assert!(matches!(scan(&disk), Scan::Ok { .. }));
}

#[test]
fn version_1_records_still_replay_beside_version_2() {
    // An old log (text endpoints) appended to by a newer server.
    let lease = HeldKey {
        mode: crate::core::HoldMode::Lease,
        expires_unix_ms: 1_700_000_060_000,
        session: 0,
        ..held("lease", 7)
    };
    let v6 = HeldKey {
        endpoint: "[fe80::1%3]:65535".parse().unwrap(),
        ..held("v6", 8)
    };
    let mut img = MAGIC.to_vec();
    let mut want = Vec::new();
    for h in [held("a", 1), lease, v6] {
        encode_acquire_v1(h.as_ref(), &mut img);
        encode_acquire(h.as_ref(), &mut img);
        want.extend([Record::Acquire(h), Record::Acquire(h)]);
    }
    let Scan::Ok { records, .. } = scan(&img) else {
        panic!()
    };
    assert_eq!(records, want);
    assert_eq!(img[HEADER + 8], ACQUIRE_V1);
}

#[test]
fn binary_endpoints_have_a_known_length_and_ipv4_is_shorter() {
    for ep in ["10.1.2.3:4567", "[::1]:80", "[fe80::1%3]:1"] {
        let h = HeldKey {
            endpoint: ep.parse().unwrap(),
            ..held("k", 1)
        };
        let (mut v1, mut v2) = (Vec::new(), Vec::new());
        encode_acquire_v1(h.as_ref(), &mut v1);
        encode_acquire(h.as_ref(), &mut v2);
        assert_eq!(v2.len(), acquire_len(h.as_ref()), "{ep}");
        // IPv4 (7 bytes) always beats its text (at least 10); IPv6 is a
        // fixed 23, where its text takes up to 48.
        if h.endpoint.is_ipv4() {
            assert!(v2.len() < v1.len(), "{ep}: {} >= {}", v2.len(), v1.len());
        }
    }
}

#[test]
fn the_caller_can_stop_a_scan() {
    let (img, starts) = image(6);
    let mut seen = 0;
    let got = scan_each(&img, |_| {
        seen += 1;
        if seen == 3 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    assert_eq!(
        got,
        Scanned::Stopped {
            offset: starts[2] as u64
        }
    );
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

/// Holders of shared and semaphore keys are Share records (11), every
/// field read back; an exclusive hold stays the record it always was.
#[test]
fn share_records_roundtrip() {
    use crate::core::{Access, HoldMode, REPLICATED_SESSION};
    let shared = HeldKey {
        access: Access::Shared,
        ..held("doc", 7)
    };
    let lease = HeldKey {
        access: Access::Semaphore(3),
        mode: HoldMode::Lease,
        expires_unix_ms: 1_700_000_009_000,
        endpoint: "[fe80::1%2]:99".parse().unwrap(),
        ..held("pool", 8)
    };
    let session = HeldKey {
        access: Access::Semaphore(1),
        mode: HoldMode::Session,
        session: REPLICATED_SESSION | 5,
        ..held("pool", 9)
    };
    let mut img = MAGIC.to_vec();
    for h in [&shared, &lease, &session] {
        let at = img.len();
        encode_acquire(h.as_ref(), &mut img);
        assert_eq!(img[at + HEADER], SHARE);
        assert_eq!(img.len() - at, acquire_len(h.as_ref()));
    }
    let at = img.len();
    encode_acquire(held("x", 10).as_ref(), &mut img);
    assert_eq!(img[at + HEADER], ACQUIRE);
    let Scan::Ok { records, .. } = scan(&img) else {
        panic!("scan failed")
    };
    assert_eq!(
        records,
        vec![
            Record::Acquire(shared),
            Record::Acquire(lease),
            Record::Acquire(session),
            Record::Acquire(held("x", 10)),
        ]
    );
}

/// A Share record whose access does not parse (slots on a shared hold, a
/// semaphore of 0, an unknown access, a session id that is not a
/// replicated session's) is corruption, never a guess.
#[test]
fn malformed_share_records_are_corrupt() {
    use crate::core::Access;
    let h = HeldKey {
        access: Access::Semaphore(2),
        ..held("pool", 8)
    };
    let mut good = MAGIC.to_vec();
    encode_acquire(h.as_ref(), &mut good);
    // type 1 · grant 8 · acquired 8 · mode 1 · expires 8 · session 8: the
    // access byte, then slots.
    let access_at = MAGIC.len() + HEADER + 1 + 8 + 8 + 1 + 8 + 8;
    let session_at = access_at - 8;
    let cases: [(usize, &[u8]); 4] = [
        (access_at, &[1, 2, 0, 0, 0]),
        (access_at, &[2, 0, 0, 0, 0]),
        (access_at, &[3, 2, 0, 0, 0]),
        (session_at, &[5, 0, 0, 0, 0, 0, 0, 0]),
    ];
    for (at, bytes) in cases {
        let mut bad = good.clone();
        bad[at..at + bytes.len()].copy_from_slice(bytes);
        // Sealed again: only the body is wrong.
        let start = MAGIC.len();
        let body = bad[start + HEADER..].to_vec();
        bad.truncate(start);
        bad.extend_from_slice(&[0u8; HEADER]);
        bad.extend_from_slice(&body);
        seal(&mut bad, start);
        bad.push(1); // not the last thing in the file: not a torn tail
        assert!(
            matches!(scan(&bad), Scan::Corrupt { .. }),
            "{bytes:?} at {at} accepted"
        );
    }
}

/// A hold of every record shape (Acquire, Hold, SessionHold, Share) with
/// the longest key and a 255-byte source (a session's: an election's
/// value), IPv6 endpoint.
fn longest(mode: HoldMode, session: u64, access: Access) -> HeldKey {
    HeldKey {
        key: Name::new(&[b'k'; KEY_MAX]).unwrap(),
        source: crate::core::Source::new(&[0xfe; SOURCE_MAX]).unwrap(),
        endpoint: "[2001:db8::1%7]:65535".parse().unwrap(),
        acquired_unix_ms: 1_700_000_000_123,
        grant_id: 77,
        mode,
        expires_unix_ms: if mode == HoldMode::Lease {
            1_800_000_000_000
        } else {
            0
        },
        session,
        access,
    }
}

#[test]
fn a_255_byte_source_roundtrips_in_every_hold_record_and_the_share_is_the_longest() {
    let replicated = crate::core::REPLICATED_SESSION | 5;
    let holds = [
        longest(HoldMode::Persistent, 0, Access::Exclusive),
        longest(HoldMode::Lease, 0, Access::Exclusive),
        longest(HoldMode::Session, replicated, Access::Exclusive),
        longest(HoldMode::Lease, replicated, Access::Semaphore(3)),
        longest(HoldMode::Session, 0, Access::Shared),
    ];
    let mut img = MAGIC.to_vec();
    let mut batch = Vec::new();
    for h in &holds {
        let at = img.len();
        encode_acquire(h.as_ref(), &mut img);
        let len = img.len() - at;
        assert_eq!(len, acquire_len(h.as_ref()));
        assert!(len <= RECORD_MAX, "{len} > {RECORD_MAX}");
        if h.access != Access::Exclusive {
            assert_eq!(
                len, RECORD_MAX,
                "a Share of the longest names is the longest record"
            );
        }
        encode_acquire(h.as_ref(), &mut batch);
    }
    let Scan::Ok {
        records,
        valid_len,
        torn_bytes,
    } = scan(&img)
    else {
        panic!("{:?}", scan(&img))
    };
    assert_eq!((valid_len as usize, torn_bytes), (img.len(), 0));
    let want: Vec<Record> = holds.iter().map(|h| Record::Acquire(*h)).collect();
    assert_eq!(records, want);
    // A replicated entry's batch reads the same.
    let mut got = Vec::new();
    assert_eq!(
        each_in_batch(&batch, |r| got.push(r.to_owned().unwrap())),
        Ok(holds.len())
    );
    assert_eq!(got, want);
    // Every cut of the last one is a torn tail, as for any record.
    let last = img.len() - RECORD_MAX;
    for cut in last..img.len() {
        assert!(
            matches!(scan(&img[..cut]), Scan::Ok { records, .. } if records.len() == holds.len() - 1),
            "cut {cut}"
        );
    }
}

/// A sealed record of type `ty` whose body (after the type) is `body`.
fn raw(ty: u8, body: &[u8]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&[0u8; HEADER]);
    out.push(ty);
    out.extend_from_slice(body);
    seal(&mut out, MAGIC.len());
    out
}

/// An Acquire (type 6, or the version-1 text endpoint) body with a key and
/// source of the given sizes.
fn acquire_body(key: usize, source: usize, v1: bool) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&9u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(key as u8);
    b.extend(std::iter::repeat_n(b'k', key));
    b.push(source as u8);
    b.extend(std::iter::repeat_n(b's', source));
    if v1 {
        b.push(9);
        b.extend_from_slice(b"1.2.3.4:5");
    } else {
        b.extend_from_slice(&[4, 1, 2, 3, 4, 5, 0]);
    }
    b
}

#[test]
fn keys_stay_bounded_to_127_and_version_1_names_too() {
    let ok = |img: &[u8]| matches!(scan(img), Scan::Ok { records, .. } if records.len() == 1);
    let bad = |img: &[u8]| {
        matches!(
            scan(img),
            Scan::Corrupt {
                reason: "record checksum is valid but its contents are not",
                ..
            }
        )
    };
    assert!(ok(&raw(ACQUIRE, &acquire_body(127, 255, false))));
    assert!(ok(&raw(ACQUIRE, &acquire_body(1, 128, false))));
    // A key is at most 127 bytes, whatever its record.
    assert!(bad(&raw(ACQUIRE, &acquire_body(128, 0, false))));
    let mut release = 3u64.to_le_bytes().to_vec();
    release.push(128);
    release.extend_from_slice(&[b'k'; 128]);
    assert!(bad(&raw(RELEASE, &release)));
    // Servers that wrote version 1 bounded every name to 127 bytes.
    assert!(ok(&raw(ACQUIRE_V1, &acquire_body(127, 127, true))));
    assert!(bad(&raw(ACQUIRE_V1, &acquire_body(1, 128, true))));
}
