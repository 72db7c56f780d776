//! Tests of the lock port's frames and of the admin port's commands and
//! KEYS/KEYX answers.

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
        access: crate::core::Access::Exclusive,
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
        access: crate::core::Access::Exclusive,
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

    // A KEYH entry with access 3, and one of a semaphore of 0 slots.
    let mut keyh = one.clone();
    keyh[4 + first - 4 + 8] = 2;
    for (access, slots) in [(3u8, 0u32), (2, 0), (0, 1)] {
        let mut e = keyh.clone();
        e.push(access);
        e.extend_from_slice(&slots.to_le_bytes());
        let mut dec = KeysDecoder::keyh();
        assert_eq!(dec.decode_next(&e).unwrap().0, KeysStep::Count(1));
        let err = dec.decode_next(&e[4..]).unwrap_err();
        assert!(
            err.contains(&format!("unknown access {access} of {slots} slots")),
            "{err}"
        );
    }

    // The largest entry there can be fits KEYS_ENTRY_BYTES_MAX exactly.
    let mut big = Vec::new();
    for _ in 0..3 {
        big.push(255);
        big.extend_from_slice(&[b'x'; 255]);
    }
    big.extend_from_slice(&[0; 8 + 8]);
    big.push(2);
    big.extend_from_slice(&[0; 4]);
    big.push(2);
    big.extend_from_slice(&7u32.to_le_bytes());
    assert_eq!(big.len(), admin::KEYS_ENTRY_BYTES_MAX);
    let mut dec = KeysDecoder::keyh();
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
        x in 0usize..3,
    ) {
        use admin::{KeysDecoder, KeysStep, ListForm};
        let form = [ListForm::Keys, ListForm::Keyx, ListForm::Keyh][x];
        let whole = admin::decode_listing(&bytes, form);
        let mut dec = KeysDecoder::of(form);
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

/// The Locking-Center lock port keeps its signed sizes: a 128-byte source
/// (size byte 0x80, -128) is bad input, whatever the session protocol
/// takes.
#[test]
fn a_lock_port_source_of_128_bytes_is_still_bad_input() {
    let mut b = vec![Action::Lock.byte(), 1, b'k', 128];
    b.extend_from_slice(&[b's'; 128]);
    assert_eq!(decode(&b), Decoded::Bad(BadFrame::SourceSize(-128)));
    let mut b = vec![Action::TryLock.byte(), 1, b'k', 127];
    b.extend_from_slice(&[b's'; 127]);
    assert!(matches!(decode(&b), Decoded::Frame { req, .. } if req.source.len() == 127));
    let mut b = vec![Action::ResetBySource.byte(), 128];
    b.extend_from_slice(&[b's'; 128]);
    assert_eq!(decode(&b), Decoded::Bad(BadFrame::SourceSize(-128)));
}

/// RSBS names a source of up to 255 bytes (a session's), so such a holder
/// can be reset; RSET and RSTK keys stay 1..=127.
#[test]
fn rsbs_names_a_255_byte_source_and_rset_keys_stay_127() {
    let frame = |cmd: &[u8], name: &[u8], token: bool| {
        let mut b = cmd.to_vec();
        b.extend_from_slice(&1u32.to_le_bytes());
        b.push(name.len() as u8);
        b.extend_from_slice(name);
        if token {
            b.extend_from_slice(&5u64.to_le_bytes());
        }
        b
    };
    let long = [0xeeu8; 255];
    let b = frame(b"RSBS", &long, false);
    assert_eq!(
        admin::decode(&b),
        admin::Decoded::Frame {
            cmd: admin::Command::Rsbs,
            count: 1,
            len: b.len()
        }
    );
    assert_eq!(admin::names(&b[8..]).collect::<Vec<_>>(), [&long[..]]);
    assert_eq!(admin::decode(&b[..b.len() - 1]), admin::Decoded::Incomplete);
    for (cmd, token) in [(&b"RSET"[..], false), (&b"RSTK"[..], true)] {
        let ok = frame(cmd, &long[..127], token);
        assert!(matches!(
            admin::decode(&ok),
            admin::Decoded::Frame { count: 1, .. }
        ));
        assert_eq!(
            admin::decode(&frame(cmd, &long[..128], token)),
            admin::Decoded::Bad(admin::BadAdmin::NameTooLong(128))
        );
    }
}
