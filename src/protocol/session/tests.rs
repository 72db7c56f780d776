//! The session protocol codec's unit and property tests.

use super::*;
use proptest::prelude::*;

#[test]
fn requests_round_trip() {
    let reqs = [
        Req::Hello {
            version: VERSION,
            keepalive_ms: 3000,
            auth: b"",
        },
        Req::Hello {
            version: VERSION,
            keepalive_ms: 0,
            auth: b"s3cret",
        },
        Req::Acquire {
            hold: HoldMode::Lease,
            ttl_ms: 1500,
            wait_ms: WAIT_FOREVER,
            key: b"deploy",
            source: b"ci",
            access: Access::Exclusive,
        },
        Req::Release {
            token: 1 << 50,
            key: b"deploy",
        },
        Req::Extend {
            token: 7,
            ttl_ms: 9,
            key: b"k",
        },
        Req::Cancel {
            target: 41,
            key: b"k",
        },
        Req::Ping,
        Req::Watch { key: b"w" },
        Req::Unwatch {
            target: 3,
            key: b"w",
        },
        Req::Proclaim {
            token: 1 << 40,
            key: b"leader",
            source: b"10.0.0.7:9000",
        },
        Req::Proclaim {
            token: 2,
            key: b"leader",
            source: b"",
        },
        Req::Resume {
            version: VERSION,
            session_id: 0x0180_0000_0000_0007,
            auth: b"s3cret",
        },
        Req::Resume {
            version: VERSION,
            session_id: 1,
            auth: b"",
        },
    ];
    let mut buf = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        encode(i as u32 + 1, r, &mut buf);
    }
    let mut at = 0;
    for (i, r) in reqs.iter().enumerate() {
        match decode(&buf[at..]) {
            Decoded::Frame { rid, req, len, .. } => {
                assert_eq!(rid, i as u32 + 1);
                assert_eq!(req, Ok(*r));
                at += len;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(at, buf.len());
    // Every strict prefix of a frame is incomplete.
    let mut one = Vec::new();
    encode(5, &reqs[1], &mut one);
    for cut in 0..one.len() {
        assert_eq!(decode(&one[..cut]), Decoded::Incomplete, "cut {cut}");
    }
}

#[test]
fn documented_bytes_of_an_acquire() {
    let mut b = Vec::new();
    encode(
        1,
        &Req::Acquire {
            hold: HoldMode::Session,
            ttl_ms: 0,
            wait_ms: 0,
            key: b"k",
            source: b"",
            access: Access::Exclusive,
        },
        &mut b,
    );
    assert_eq!(
        b,
        [8, 1, 0, 0, 0, 12, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, b'k', 0]
    );
}

#[test]
fn malformed_bodies_are_invalid_not_fatal() {
    // Acquire with key size 0.
    let b = [8, 1, 0, 0, 0, 11, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    assert!(matches!(
        decode(&b),
        Decoded::Frame {
            req: Err(_),
            len: 18,
            ..
        }
    ));
    // Unknown hold mode 3.
    let b = [8, 1, 0, 0, 0, 12, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 1, b'k', 0];
    assert!(matches!(decode(&b), Decoded::Frame { req: Err(_), .. }));
    // Oversized body is a framing error.
    assert!(matches!(
        decode(&[12, 0, 0, 0, 0, 0x01, 0x02]),
        Decoded::Bad(_)
    ));
    assert!(matches!(decode(&[1, 0, 0]), Decoded::Bad(_)));
}

#[test]
fn answers_round_trip() {
    let mut b = Vec::new();
    let w = Welcome {
        status: Status::Ok,
        version: VERSION,
        keepalive_ms: 10_000,
        min_ttl_ms: 10,
        max_ttl_ms: 3_600_000,
        session_id: 99,
        max_keys: 100_000,
        max_waiters: 5,
        shards: 2,
        flags: FLAG_RESUMABLE,
    };
    encode_held(1, b"held", 77, HoldMode::Session, NO_TTL, &mut b);
    encode_held(1, b"lease", 78, HoldMode::Lease, 900, &mut b);
    encode_welcome(1, &w, &mut b);
    encode_reply(2, Status::Ok, 12345, NO_TTL, &mut b);
    encode_reply(3, Status::Stale, 0, 500, &mut b);
    encode_lost(b"key", 12345, LostWhy::Expired, &mut b);
    let mut at = 0;
    let mut got = Vec::new();
    while let Some((a, n)) = decode_answer(&b[at..], Some(1)).unwrap() {
        got.push(a);
        at += n;
    }
    assert_eq!(at, b.len());
    assert_eq!(
        got,
        vec![
            Answer::Held {
                rid: 1,
                key: b"held".to_vec(),
                token: 77,
                hold: HoldMode::Session,
                ttl_left_ms: None
            },
            Answer::Held {
                rid: 1,
                key: b"lease".to_vec(),
                token: 78,
                hold: HoldMode::Lease,
                ttl_left_ms: Some(900)
            },
            Answer::Welcome { rid: 1, welcome: w },
            Answer::Reply {
                rid: 2,
                status: Status::Ok,
                token: 12345,
                ttl_left_ms: None
            },
            Answer::Reply {
                rid: 3,
                status: Status::Stale,
                token: 0,
                ttl_left_ms: Some(500)
            },
            Answer::Lost {
                key: b"key".to_vec(),
                token: 12345,
                why: LostWhy::Expired
            },
        ]
    );
}

#[test]
fn statuses_with_detail_have_their_own_layout() {
    let mut b = Vec::new();
    encode_refusal(7, Status::UnsupportedVersion, VERSIONS, &mut b);
    assert_eq!(b, [0x80, 7, 0, 0, 0, 3, 0, 11, 1, 1]);
    encode_refusal(0, Status::NotLeader, b"10.0.0.9:22119", &mut b);
    // A Hello's rid does not make a refusal a Welcome.
    let (a, n) = decode_answer(&b, Some(7)).unwrap().unwrap();
    assert_eq!(
        a,
        Answer::Refused {
            rid: 7,
            status: Status::UnsupportedVersion,
            detail: vec![1]
        }
    );
    let (a, m) = decode_answer(&b[n..], None).unwrap().unwrap();
    assert_eq!(n + m, b.len());
    assert_eq!(
        a,
        Answer::Refused {
            rid: 0,
            status: Status::NotLeader,
            detail: b"10.0.0.9:22119".to_vec()
        }
    );
    // A detail longer than the body is malformed.
    assert!(decode_answer(&[0x80, 0, 0, 0, 0, 2, 0, 11, 5], None).is_err());
}

proptest! {
    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = decode(&bytes);
        let _ = decode_answer(&bytes, Some(0));
        let _ = decode_answer(&bytes, None);
    }
}

#[test]
fn an_event_of_a_kind_not_known_here_is_skipped_not_a_broken_stream() {
    let h = EventHolder {
        token: 9,
        hold: HoldMode::Session,
        access: Access::Exclusive,
        key: b"k",
        source: b"v",
    };
    let mut b = Vec::new();
    encode_event(5, EventKind::Proclaimed, &h, &mut b);
    let first = b.len();
    encode_event(6, EventKind::Granted, &h, &mut b);
    b[HEADER] = 200; // the first Event: a kind of a later server
    let (a, n) = decode_answer(&b, None).unwrap().unwrap();
    assert_eq!(a, Answer::OtherEvent { rid: 5, kind: 200 });
    assert_eq!(n, first, "the whole frame is consumed");
    let (a, _) = decode_answer(&b[n..], None).unwrap().unwrap();
    assert!(matches!(
        a,
        Answer::Event {
            rid: 6,
            kind: EventKind::Granted,
            ..
        }
    ));
}

/// A session source (an Acquire's, a Proclaim's: an election's value) is
/// 0..=255 bytes, its size byte unsigned; a key stays 1..=127. The
/// longest Acquire, Proclaim and Event fit a frame.
#[test]
fn a_source_is_up_to_255_bytes_and_a_key_up_to_127() {
    let key = [b'k'; KEY_MAX];
    let source = [0xc3; SOURCE_MAX];
    let reqs = [
        Req::Acquire {
            hold: HoldMode::Lease,
            ttl_ms: 1500,
            wait_ms: WAIT_FOREVER,
            key: &key,
            source: &source,
            access: Access::Semaphore(9),
        },
        Req::Proclaim {
            token: 3,
            key: &key,
            source: &source,
        },
    ];
    for r in reqs {
        let mut b = Vec::new();
        encode(7, &r, &mut b);
        assert!(b.len() <= FRAME_MAX);
        assert_eq!(
            decode(&b),
            Decoded::Frame {
                op: b[0],
                rid: 7,
                req: Ok(r),
                len: b.len()
            }
        );
    }
    // A key of 128 bytes is invalid (the frame is sound: answered
    // `invalid`, the connection goes on), in an Acquire as in a Proclaim.
    let long_key = [b'k'; KEY_MAX + 1];
    for r in [
        Req::Acquire {
            hold: HoldMode::Session,
            ttl_ms: 0,
            wait_ms: 0,
            key: &key,
            source: b"",
            access: Access::Exclusive,
        },
        Req::Proclaim {
            token: 3,
            key: &key,
            source: b"",
        },
    ] {
        let mut b = Vec::new();
        encode(1, &r, &mut b);
        // The key's size byte, then the key: make it one byte longer.
        let at = b.iter().position(|&x| x == KEY_MAX as u8).unwrap();
        b.splice(at..at + 1 + KEY_MAX, [&[128u8][..], &long_key].concat());
        let blen = (b.len() - HEADER) as u16;
        b[5..7].copy_from_slice(&blen.to_le_bytes());
        assert_eq!(
            decode(&b),
            Decoded::Frame {
                op: b[0],
                rid: 1,
                req: Err("key size out of range 1..=127"),
                len: b.len()
            }
        );
    }
    // An Event carries a 255-byte source whole.
    let mut b = Vec::new();
    let h = EventHolder {
        token: 11,
        hold: HoldMode::Session,
        access: Access::Exclusive,
        key: &key,
        source: &source,
    };
    encode_event(4, EventKind::Proclaimed, &h, &mut b);
    assert!(b.len() <= FRAME_MAX);
    match decode_answer(&b, None) {
        Ok(Some((
            Answer::Event {
                rid: 4,
                kind: EventKind::Proclaimed,
                token: 11,
                key: k,
                source: s,
                ..
            },
            n,
        ))) => {
            assert_eq!((&k[..], &s[..], n), (&key[..], &source[..], b.len()));
        }
        other => panic!("{other:?}"),
    }
}
