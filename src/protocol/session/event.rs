//! The Event frame of a watch (`docs/protocol.md`, "Watching a key"):
//! its body, `[u8 event][u64 token][u8 hold][u8 access][u32 slots]
//! [u8 keyLen][key][u8 srcLen][src]` (a key of 1..=127 bytes, a source of
//! 0..=255; a later version may append fields; a decoder skips them). The frame around it is the session module's.

use crate::core::{Access, HoldMode, KEY_MAX, SOURCE_MAX};

/// What an Event frame says of a watched key's holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A holder the key had when the watch began (before the Watch's
    /// Reply).
    Holder = 0,
    /// A new holder.
    Granted = 1,
    /// The holder let go: a Locking-Center Unlock, a session's Release, a
    /// grant whose answer could not be delivered.
    Released = 2,
    /// A lease ran out.
    Expired = 3,
    /// An operator's or a client's reset (ResetByKey, ResetBySource,
    /// admin RSET/RSBS/RSTK).
    Reset = 4,
    /// The holding session ended (its connection closed, or its
    /// keep-alive passed).
    SessionEnded = 5,
    /// The holder (same token) proclaimed a new source: the Event carries
    /// it (a Proclaim, [`super::OP_PROCLAIM`]).
    Proclaimed = 6,
}

impl EventKind {
    pub const ALL: [EventKind; 7] = [
        EventKind::Holder,
        EventKind::Granted,
        EventKind::Released,
        EventKind::Expired,
        EventKind::Reset,
        EventKind::SessionEnded,
        EventKind::Proclaimed,
    ];
    pub fn from_byte(b: u8) -> Option<EventKind> {
        EventKind::ALL.get(b as usize).copied()
    }
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Holder => "holder",
            EventKind::Granted => "granted",
            EventKind::Released => "released",
            EventKind::Expired => "expired",
            EventKind::Reset => "reset",
            EventKind::SessionEnded => "session_ended",
            EventKind::Proclaimed => "proclaimed",
        }
    }
    /// True when the holder is gone after it.
    pub fn ends_hold(self) -> bool {
        !matches!(
            self,
            EventKind::Holder | EventKind::Granted | EventKind::Proclaimed
        )
    }
}

/// One holder of a watched key as an Event frame carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventHolder<'a> {
    pub token: u64,
    pub hold: HoldMode,
    pub access: Access,
    pub key: &'a [u8],
    pub source: &'a [u8],
}

/// The access byte of an Acquire's trailer and of an Event (re-exported
/// by the session module).
pub use crate::core::types::{ACCESS_EXCLUSIVE, ACCESS_SEMAPHORE, ACCESS_SHARED};

/// Appends an Event body. Panics on a key over 127 bytes or a source over
/// 255 (the server's names never are).
pub(super) fn encode_body(kind: EventKind, h: &EventHolder<'_>, o: &mut Vec<u8>) {
    o.push(kind as u8);
    o.extend_from_slice(&h.token.to_le_bytes());
    o.push(h.hold as u8);
    let (a, slots) = h.access.to_bytes();
    o.push(a);
    o.extend_from_slice(&slots.to_le_bytes());
    for (n, max) in [(h.key, KEY_MAX), (h.source, SOURCE_MAX)] {
        assert!(n.len() <= max, "name too long");
        o.push(n.len() as u8);
        o.extend_from_slice(n);
    }
}

/// Decodes an Event body (bytes after the fields it knows are skipped);
/// `None` when it is malformed.
pub(super) fn decode_body(b: &[u8]) -> Option<(EventKind, EventHolder<'_>)> {
    let kind = EventKind::from_byte(*b.first()?)?;
    let token = u64::from_le_bytes(b.get(1..9)?.try_into().ok()?);
    let hold = HoldMode::from_byte(*b.get(9)?)?;
    let a = *b.get(10)?;
    let slots = u32::from_le_bytes(b.get(11..15)?.try_into().ok()?);
    let access = Access::from_bytes(a, slots)?;
    let mut at = 15;
    let mut name = |min: usize, max: usize| {
        let n = *b.get(at)? as usize;
        if n < min || n > max {
            return None;
        }
        let s = b.get(at + 1..at + 1 + n)?;
        at += 1 + n;
        Some(s)
    };
    let key = name(1, KEY_MAX)?;
    let source = name(0, SOURCE_MAX)?;
    Some((
        kind,
        EventHolder {
            token,
            hold,
            access,
            key,
            source,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_body_roundtrips_and_a_malformed_one_is_refused() {
        for kind in EventKind::ALL {
            for access in [Access::Exclusive, Access::Shared, Access::Semaphore(7)] {
                let h = EventHolder {
                    token: 0x0102_0304_0506_0708,
                    hold: HoldMode::Lease,
                    access,
                    key: b"k",
                    source: b"",
                };
                let mut b = Vec::new();
                encode_body(kind, &h, &mut b);
                assert_eq!(decode_body(&b), Some((kind, h)));
                // A later version's appended field is skipped.
                b.push(42);
                assert_eq!(decode_body(&b), Some((kind, h)));
                b.pop();
                // Every cut is refused.
                for cut in 0..b.len() {
                    assert_eq!(decode_body(&b[..cut]), None, "{kind:?} cut at {cut}");
                }
            }
        }
        let mut b = Vec::new();
        let h = EventHolder {
            token: 1,
            hold: HoldMode::Session,
            access: Access::Exclusive,
            key: b"k",
            source: b"s",
        };
        encode_body(EventKind::Granted, &h, &mut b);
        let mut bad = b.clone();
        bad[0] = 7; // no such event
        assert_eq!(decode_body(&bad), None);
        let mut bad = b.clone();
        bad[10] = 0;
        bad[11] = 1; // slots on an exclusive hold
        assert_eq!(decode_body(&bad), None);
        let mut bad = b;
        bad[15] = 0; // an empty key
        assert_eq!(decode_body(&bad), None);
    }
}
