//! Frames of a peer link (one TCP connection per peer and shard; the
//! connecting side speaks first).
//!
//! ```text
//! frame := len u32 (kind + payload) · kind u8 · payload
//! 1 Hello  node u64 · group u32 · groups u32 · voters n u8 · id u64 × n ·
//!          client address: len u8 · "HOST:PORT"
//! 2 Raft   a raft-rs message (protobuf), followed by ringlock's own
//!          fields (below: what the sender reads, configuration notices)
//! 3 Forward   id u64 · term u64 · client address · a Locking-Center
//!             request frame (a follower passes its client's request to
//!             the leader it knows in that term of the link's group; a
//!             node in another term does nothing with it: not the leader)
//! 4 Answer    id u64 · answer u8 (`+`, `-`, `#`; 0: the request's
//!             outcome is unknown, close its connection; 1: not the leader,
//!             nothing done) · grant: key slot u32 · grant id u64 (0: none)
//!             (the leader's answer to a Forward)
//! 5 Withdraw  id u64 (the forwarded request's client hung up)
//! 6 GiveBack  key slot u32 · grant id u64 (a forwarded `+` that could not
//!             be delivered: release that grant if it still holds)
//! client address := family u8 (4 or 6) · IP (4 or 16 bytes) · port u16
//! ```
//!
//! Integers are little-endian. Frames 3–6 are decoded here whole and
//! exactly ([`decode_forwarding`]): one that is short, long or malformed
//! closes the link, as any frame no correct peer sends.
//!
//! A Hello whose group, number of groups or voters differ from the
//! receiver's is refused (the link is closed and the refusal logged): a
//! node never joins another cluster's or shape's traffic.

use protobuf::Message as _;
use raft::eraftpb::Message;

pub const KIND_HELLO: u8 = 1;
pub const KIND_RAFT: u8 = 2;
pub const KIND_FORWARD: u8 = 3;
pub const KIND_ANSWER: u8 = 4;
pub const KIND_WITHDRAW: u8 = 5;
pub const KIND_GIVE_BACK: u8 = 6;
/// The largest frame accepted: a batch of entries is capped at 1 MiB by
/// the replica, but a snapshot for a lagging follower holds every held key
/// (about 60 bytes each: 256 MiB is some four million keys).
pub const FRAME_MAX: usize = 256 << 20;
/// The largest frame before a link's Hello: a Hello is at most
/// 8 + 4 + 4 + 1 + 255 × 8 + 1 + 255 bytes (2 313); whatever announces more
/// is not a peer and is closed before its bytes are waited for.
pub const HELLO_FRAME_MAX: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub node: u64,
    pub group: u32,
    pub groups: u32,
    pub voters: Vec<u64>,
    /// The node's client (lock port) address, for `not leader` hints.
    pub client_addr: String,
}

pub fn frame(kind: u8, payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&((payload.len() + 1) as u32).to_le_bytes());
    out.push(kind);
    out.extend_from_slice(payload);
}

pub fn encode_hello(h: &Hello, out: &mut Vec<u8>) {
    let mut p = Vec::with_capacity(32 + 8 * h.voters.len() + h.client_addr.len());
    p.extend_from_slice(&h.node.to_le_bytes());
    p.extend_from_slice(&h.group.to_le_bytes());
    p.extend_from_slice(&h.groups.to_le_bytes());
    p.push(h.voters.len() as u8);
    for v in &h.voters {
        p.extend_from_slice(&v.to_le_bytes());
    }
    let a = h.client_addr.as_bytes();
    p.push(a.len().min(255) as u8);
    p.extend_from_slice(&a[..a.len().min(255)]);
    frame(KIND_HELLO, &p, out);
}

pub fn decode_hello(p: &[u8]) -> Option<Hello> {
    let u64_at = |at: usize| Some(u64::from_le_bytes(p.get(at..at + 8)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(p.get(at..at + 4)?.try_into().ok()?));
    let n = *p.get(16)? as usize;
    let voters = (0..n)
        .map(|i| u64_at(17 + 8 * i))
        .collect::<Option<Vec<_>>>()?;
    let at = 17 + 8 * n;
    let alen = *p.get(at)? as usize;
    let addr = p.get(at + 1..at + 1 + alen)?;
    if p.len() != at + 1 + alen {
        return None;
    }
    Some(Hello {
        node: u64_at(0)?,
        group: u32_at(8)?,
        groups: u32_at(12)?,
        voters,
        client_addr: String::from_utf8(addr.to_vec()).ok()?,
    })
}

/// A grant as the leader's table names it: `(key slot, grant id)`.
pub type Grant = (u32, u64);

/// The answer byte of a forwarded request whose outcome the leader cannot
/// tell (it stepped down with it decided, not committed): the follower
/// closes the client's connection without an answer, as a direct
/// connection to that leader would have been closed.
pub const ANSWER_UNKNOWN: u8 = 0;
/// The answer byte of a node that does not serve (it never forwards a
/// forwarded request on): nothing was done; the follower sends it to the
/// leader it learns of next.
pub const ANSWER_NOT_LEADER: u8 = 1;

/// A frame of Locking-Center forwarding (kinds 3–6), borrowing its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forwarding<'a> {
    /// A follower's client request, for the serving leader.
    Forward {
        id: u64,
        /// The link's group's term in which the follower knew the leader
        /// it sent this to.
        term: u64,
        client: std::net::SocketAddr,
        frame: &'a [u8],
    },
    /// The leader's answer; `grant` with a `+` that granted a key.
    Answer {
        id: u64,
        answer: u8,
        grant: Option<Grant>,
    },
    /// The forwarded request's client hung up before its answer.
    Withdraw { id: u64 },
    /// A forwarded grant whose `+` did not reach its client.
    GiveBack { grant: Grant },
}

pub fn is_forwarding(kind: u8) -> bool {
    (KIND_FORWARD..=KIND_GIVE_BACK).contains(&kind)
}

pub fn encode_forward(
    id: u64,
    term: u64,
    client: std::net::SocketAddr,
    req: &[u8],
    out: &mut Vec<u8>,
) {
    let mut p = Vec::with_capacity(16 + 19 + req.len());
    p.extend_from_slice(&id.to_le_bytes());
    p.extend_from_slice(&term.to_le_bytes());
    match client.ip() {
        std::net::IpAddr::V4(a) => {
            p.push(4);
            p.extend_from_slice(&a.octets());
        }
        std::net::IpAddr::V6(a) => {
            p.push(6);
            p.extend_from_slice(&a.octets());
        }
    }
    p.extend_from_slice(&client.port().to_le_bytes());
    p.extend_from_slice(req);
    frame(KIND_FORWARD, &p, out);
}

pub fn encode_answer(id: u64, answer: u8, grant: Option<Grant>, out: &mut Vec<u8>) {
    let mut p = [0u8; 21];
    p[..8].copy_from_slice(&id.to_le_bytes());
    p[8] = answer;
    let (slot, gid) = grant.unwrap_or((0, 0));
    p[9..13].copy_from_slice(&slot.to_le_bytes());
    p[13..].copy_from_slice(&gid.to_le_bytes());
    frame(KIND_ANSWER, &p, out);
}

pub fn encode_withdraw(id: u64, out: &mut Vec<u8>) {
    frame(KIND_WITHDRAW, &id.to_le_bytes(), out);
}

pub fn encode_give_back(grant: Grant, out: &mut Vec<u8>) {
    let mut p = [0u8; 12];
    p[..4].copy_from_slice(&grant.0.to_le_bytes());
    p[4..].copy_from_slice(&grant.1.to_le_bytes());
    frame(KIND_GIVE_BACK, &p, out);
}

/// Decodes a forwarding frame's payload exactly; `Err` says why a frame
/// is one no correct peer sends. A forwarded request must be one whole
/// Locking-Center request (not Persist): checked here, before any state
/// is allocated for it.
pub fn decode_forwarding(kind: u8, p: &[u8]) -> Result<Forwarding<'_>, String> {
    let u64_at = |at: usize| {
        p.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8")))
    };
    let u32_at = |at: usize| {
        p.get(at..at + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4")))
    };
    let short = || format!("a forwarding frame of kind {kind} with {} bytes", p.len());
    match kind {
        KIND_FORWARD => {
            let id = u64_at(0).ok_or_else(short)?;
            let term = u64_at(8).ok_or_else(short)?;
            let (ip, at): (std::net::IpAddr, usize) = match p.get(16) {
                Some(4) => {
                    let b: [u8; 4] = p.get(17..21).ok_or_else(short)?.try_into().expect("4");
                    (b.into(), 21)
                }
                Some(6) => {
                    let b: [u8; 16] = p.get(17..33).ok_or_else(short)?.try_into().expect("16");
                    (b.into(), 33)
                }
                Some(f) => return Err(format!("a forwarded request of address family {f}")),
                None => return Err(short()),
            };
            let port = p
                .get(at..at + 2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .ok_or_else(short)?;
            let frame = &p[at + 2..];
            match crate::protocol::decode(frame) {
                crate::protocol::Decoded::Frame { req, len }
                    if len == frame.len() && req.action != crate::protocol::Action::Persist =>
                {
                    Ok(Forwarding::Forward {
                        id,
                        term,
                        client: std::net::SocketAddr::new(ip, port),
                        frame,
                    })
                }
                _ => Err("a forwarded request that is not one whole Locking-Center request".into()),
            }
        }
        KIND_ANSWER if p.len() == 21 => {
            let answer = p[8];
            let grant = (u32_at(9).expect("21 bytes"), u64_at(13).expect("21 bytes"));
            match (answer, grant.1) {
                (b'+' | b'-' | b'#' | ANSWER_UNKNOWN | ANSWER_NOT_LEADER, 0) => {
                    Ok(Forwarding::Answer {
                        id: u64_at(0).expect("21 bytes"),
                        answer,
                        grant: None,
                    })
                }
                (b'+', _) => Ok(Forwarding::Answer {
                    id: u64_at(0).expect("21 bytes"),
                    answer,
                    grant: Some(grant),
                }),
                _ => Err(format!(
                    "a forwarded answer {answer:#04x} (grant id {})",
                    grant.1
                )),
            }
        }
        KIND_WITHDRAW if p.len() == 8 => Ok(Forwarding::Withdraw {
            id: u64_at(0).expect("8 bytes"),
        }),
        KIND_GIVE_BACK if p.len() == 12 => Ok(Forwarding::GiveBack {
            grant: (u32_at(0).expect("12 bytes"), u64_at(4).expect("12 bytes")),
        }),
        KIND_ANSWER | KIND_WITHDRAW | KIND_GIVE_BACK => Err(short()),
        _ => Err(format!("frame kind {kind} is not forwarding")),
    }
}

/// A whole frame: `(kind, payload, bytes it took)`.
pub type Frame<'a> = (u8, &'a [u8], usize);

/// The next whole frame at the start of `buf`: `(kind, payload, bytes
/// used)`, `Ok(None)` when more bytes are needed, `Err` for a frame no
/// peer sends, or one announcing more than `max` bytes (the link is
/// closed; the length is checked as soon as its 4 bytes are in, never
/// after waiting for the rest).
pub fn next_frame(buf: &[u8], max: usize) -> Result<Option<Frame<'_>>, String> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_le_bytes(buf[..4].try_into().expect("4")) as usize;
    if len == 0 || len > max {
        return Err(format!("peer frame of {len} bytes (at most {max} here)"));
    }
    if buf.len() < 5 {
        return Ok(None);
    }
    if buf.len() < 4 + len {
        return Ok(None);
    }
    Ok(Some((buf[4], &buf[5..4 + len], 4 + len)))
}

// ----- a Raft frame's payload: raft-rs's Message and ringlock's fields -------
//
// The fields ringlock adds to raft-rs's `Message` on a peer link are
// protobuf fields of numbers raft-rs does not define, appended to the
// message's encoding (a protobuf message may end with any field; a
// parser merges it in, and one that does not know the field keeps it
// aside), so a node of an earlier version reads the message as before.
// - [`FEATURES_FIELD`]: what the sending node can read ([`FEATURES`]).
// - [`EXCLUDED_FIELD`]: configuration notices for other groups
// ([`Replica::told_excluded`](super::replica::Replica::told_excluded)).

/// The protobuf field number that carries a node's [`FEATURES`] in every
/// raft message it sends. raft-rs's `Message` does not define it, so a
/// node of an earlier version parses the message as before and ignores it
/// (protobuf keeps unknown fields aside); this version reads it.
pub const FEATURES_FIELD: u32 = 9001;
/// Feature bit: this node reads session records (SessionOpen, SessionEnd,
/// SessionHold: replicated sessions).
pub const FEATURE_SESSIONS: u64 = 1;
/// Feature bit: this node reads records whose source is longer than 127
/// bytes (up to 255: a session's source, an election's value). A node of
/// an earlier version refuses an entry holding one (its scan bounds every
/// name to 127 bytes), so a leader takes such a source only once its
/// peers announced this ([`Replica::peers_read_long_sources`]).
///
/// [`Replica::peers_read_long_sources`]: super::replica::Replica::peers_read_long_sources
pub const FEATURE_LONG_SOURCES: u64 = 2;
/// What this version announces.
pub const FEATURES: u64 = FEATURE_SESSIONS | FEATURE_LONG_SOURCES;

/// A raft message as sent on a peer link: its protobuf encoding followed
/// by the [`FEATURES_FIELD`] varint (a protobuf message may end with any
/// field; a parser merges it in).
pub fn encode_message(m: &Message) -> Vec<u8> {
    let mut b = m.write_to_bytes().expect("encode");
    put_varint((FEATURES_FIELD as u64) << 3, &mut b);
    put_varint(FEATURES, &mut b);
    b
}

/// The protobuf field number of the configuration notices a node adds
/// to the raft messages it sends a peer of one group: "my replica of
/// group `g` applied a configuration that excludes you (no voter, no
/// outgoing voter, no learner), made by the entry at committed index
/// `i`", for each other group `g` of which that is so. Length-delimited,
/// a sequence of varint pairs `(g, i)`. A node removed from group `g`
/// whose removal it never applied (the leader sends a removed node
/// nothing, not even the commit index that would let it apply its
/// removal) learns it so from the groups where it is still a member
/// ([`Replica::told_excluded`](super::replica::Replica::told_excluded)).
/// raft-rs's `Message` does not define the field, so a node of an earlier
/// version ignores it, as [`FEATURES_FIELD`].
pub const EXCLUDED_FIELD: u32 = 9002;

fn put_varint(mut v: u64, b: &mut Vec<u8>) {
    loop {
        if v < 0x80 {
            b.push(v as u8);
            break;
        }
        b.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
}

fn get_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(v);
        }
    }
    None
}

/// The [`EXCLUDED_FIELD`] listing `notes` (`(group, index)` pairs), as
/// bytes to append to an encoded message (a protobuf message may end with
/// any field; a parser merges it in). Nothing for an empty list.
pub fn encode_excluded(notes: &[(u32, u64)], out: &mut Vec<u8>) {
    if notes.is_empty() {
        return;
    }
    let mut payload = Vec::with_capacity(notes.len() * 6);
    for &(g, i) in notes {
        put_varint(u64::from(g), &mut payload);
        put_varint(i, &mut payload);
    }
    put_varint(((EXCLUDED_FIELD as u64) << 3) | 2, out);
    put_varint(payload.len() as u64, out);
    out.extend_from_slice(&payload);
}

/// The `(group, index)` pairs of a message's [`EXCLUDED_FIELD`] (none
/// when absent; a malformed pair and what follows it are ignored).
pub fn decode_excluded(m: &Message) -> Vec<(u32, u64)> {
    let mut notes = Vec::new();
    let Some(values) = m.get_unknown_fields().get(EXCLUDED_FIELD) else {
        return notes;
    };
    for p in &values.length_delimited {
        let mut at = 0;
        while at < p.len() {
            let (Some(g), Some(i)) = (get_varint(p, &mut at), get_varint(p, &mut at)) else {
                break;
            };
            if let Ok(g) = u32::try_from(g) {
                notes.push((g, i));
            }
        }
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_roundtrip_and_partial_frames() {
        let h = Hello {
            node: 3,
            group: 1,
            groups: 2,
            voters: vec![1, 2, 3],
            client_addr: "127.0.0.1:22119".into(),
        };
        let mut b = Vec::new();
        encode_hello(&h, &mut b);
        frame(KIND_RAFT, b"xyz", &mut b);
        let (k, p, used) = next_frame(&b, HELLO_FRAME_MAX).unwrap().unwrap();
        assert_eq!(k, KIND_HELLO);
        assert_eq!(decode_hello(p), Some(h));
        assert_eq!(next_frame(&b[used..used + 6], FRAME_MAX).unwrap(), None);
        let (k, p, _) = next_frame(&b[used..], FRAME_MAX).unwrap().unwrap();
        assert_eq!((k, p), (KIND_RAFT, &b"xyz"[..]));
        assert!(next_frame(&[0, 0, 0, 0, 1], FRAME_MAX).is_err());
        assert!(decode_hello(&[1, 2, 3]).is_none());
    }

    #[test]
    fn forwarding_frames_roundtrip_and_malformed_ones_are_refused() {
        let v4: std::net::SocketAddr = "10.1.2.3:4567".parse().unwrap();
        let v6: std::net::SocketAddr = "[::1]:9".parse().unwrap();
        let lock = [1u8, 1, b'k', 2, b's', b'1'];
        for client in [v4, v6] {
            let mut b = Vec::new();
            encode_forward(7, 12, client, &lock, &mut b);
            let (k, p, _) = next_frame(&b, FRAME_MAX).unwrap().unwrap();
            assert_eq!(
                decode_forwarding(k, p),
                Ok(Forwarding::Forward {
                    id: 7,
                    term: 12,
                    client,
                    frame: &lock[..]
                })
            );
        }
        let mut b = Vec::new();
        encode_answer(9, b'+', Some((3, 77)), &mut b);
        encode_answer(10, b'#', None, &mut b);
        encode_withdraw(11, &mut b);
        encode_give_back((3, 77), &mut b);
        let mut at = 0;
        let mut got = Vec::new();
        while let Some((k, p, n)) = next_frame(&b[at..], FRAME_MAX).unwrap() {
            got.push(decode_forwarding(k, p).unwrap());
            at += n;
        }
        assert_eq!(
            got,
            vec![
                Forwarding::Answer {
                    id: 9,
                    answer: b'+',
                    grant: Some((3, 77))
                },
                Forwarding::Answer {
                    id: 10,
                    answer: b'#',
                    grant: None
                },
                Forwarding::Withdraw { id: 11 },
                Forwarding::GiveBack { grant: (3, 77) },
            ]
        );
        // A request that is not exactly one frame, a Persist, an unknown
        // family, a grant on a `-`, an odd answer byte, short payloads.
        let mut b = Vec::new();
        encode_forward(1, 0, v4, &lock[..5], &mut b);
        let (k, p, _) = next_frame(&b, FRAME_MAX).unwrap().unwrap();
        assert!(decode_forwarding(k, p).is_err());
        let mut two = lock.to_vec();
        two.extend_from_slice(&lock);
        for frame in [&two[..], &[6u8][..], &[][..]] {
            let mut b = Vec::new();
            encode_forward(1, 0, v4, frame, &mut b);
            let (k, p, _) = next_frame(&b, FRAME_MAX).unwrap().unwrap();
            assert!(decode_forwarding(k, p).is_err(), "{frame:?}");
        }
        let mut p = vec![0u8; 8];
        p.push(5);
        assert!(decode_forwarding(KIND_FORWARD, &p).is_err());
        for (answer, gid) in [(b'-', 5u64), (b'x', 0)] {
            let mut b = Vec::new();
            encode_answer(1, answer, Some((0, gid)), &mut b);
            let (k, p, _) = next_frame(&b, FRAME_MAX).unwrap().unwrap();
            assert!(decode_forwarding(k, p).is_err());
        }
        for k in KIND_FORWARD..=KIND_GIVE_BACK {
            for n in 0..30 {
                // Any length but the exact one fails cleanly, never panics.
                let _ = decode_forwarding(k, &vec![0xFF; n]);
            }
        }
        assert!(decode_forwarding(KIND_ANSWER, &[0; 20]).is_err());
        assert!(decode_forwarding(KIND_WITHDRAW, &[0; 9]).is_err());
        assert!(decode_forwarding(KIND_GIVE_BACK, &[0; 11]).is_err());
        assert!(decode_forwarding(KIND_RAFT, &[]).is_err());
    }

    #[test]
    fn an_oversized_length_is_refused_before_its_bytes_arrive() {
        // 256 MiB announced: refused from the 4 length bytes alone.
        let big = (256u32 << 20).to_le_bytes();
        assert!(next_frame(&big, HELLO_FRAME_MAX).is_err());
        assert!(next_frame(&big, FRAME_MAX).is_ok());
        // The largest Hello fits before the Hello.
        let h = Hello {
            node: u64::MAX,
            group: u32::MAX,
            groups: u32::MAX,
            voters: vec![u64::MAX; 255],
            client_addr: "x".repeat(255),
        };
        let mut b = Vec::new();
        encode_hello(&h, &mut b);
        assert!(b.len() <= HELLO_FRAME_MAX + 4);
        assert!(next_frame(&b, HELLO_FRAME_MAX).unwrap().is_some());
    }
}

#[cfg(test)]
mod extension_tests {
    use super::*;
    use raft::eraftpb::MessageType;

    /// The notices ride on a raft message as a field raft-rs does not
    /// define: the message parses as before (what a node of an earlier
    /// version reads, the features announcement included), and this
    /// version reads the notices back.
    #[test]
    fn excluded_notices_ride_on_a_message_that_parses_as_before() {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgHeartbeatResponse);
        m.to = 1;
        m.from = 2;
        m.term = 5;
        m.commit = 9;
        let plain = encode_message(&m);
        let mut b = plain.clone();
        let notes = [(2, 13), (0, 300_000), (7, u64::MAX)];
        encode_excluded(&notes, &mut b);
        assert!(b.len() > plain.len());
        let mut got = Message::parse_from_bytes(&b).unwrap();
        assert_eq!(decode_excluded(&got), notes);
        let features = got
            .get_unknown_fields()
            .get(FEATURES_FIELD)
            .and_then(|v| v.varint.last().copied());
        assert_eq!(features, Some(FEATURES));
        protobuf::Clear::clear(got.mut_unknown_fields());
        assert_eq!(
            got.write_to_bytes().unwrap(),
            m.write_to_bytes().unwrap(),
            "the message itself is unchanged"
        );
        // Nothing to say: nothing added.
        let mut b = plain.clone();
        encode_excluded(&[], &mut b);
        assert_eq!(b, plain);
        assert!(decode_excluded(&Message::parse_from_bytes(&plain).unwrap()).is_empty());
        // Two fields (the same one twice) are both read; a truncated pair
        // ends the list, a group beyond u32 is skipped.
        let mut b = plain.clone();
        encode_excluded(&[(1, 4)], &mut b);
        put_varint(((EXCLUDED_FIELD as u64) << 3) | 2, &mut b);
        let mut p = Vec::new();
        put_varint(1 << 40, &mut p);
        put_varint(6, &mut p);
        put_varint(3, &mut p);
        put_varint(8, &mut p);
        p.extend_from_slice(&[5, 0x80]);
        put_varint(p.len() as u64, &mut b);
        b.extend_from_slice(&p);
        let got = Message::parse_from_bytes(&b).unwrap();
        assert_eq!(decode_excluded(&got), [(1, 4), (3, 8)]);
    }
}
