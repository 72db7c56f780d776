//! The fields ringlock adds to raft-rs's `Message` on a peer link:
//! protobuf fields of numbers raft-rs does not define, appended to the
//! message's encoding (a protobuf message may end with any field; a
//! parser merges it in, and one that does not know the field keeps it
//! aside), so a node of an earlier version reads the message as before.
//! - [`FEATURES_FIELD`]: what the sending node can read ([`FEATURES`]).
//! - [`EXCLUDED_FIELD`]: configuration notices for other groups
//!   ([`Replica::told_excluded`](super::replica::Replica::told_excluded)).

use protobuf::Message as _;
use raft::eraftpb::Message;

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
