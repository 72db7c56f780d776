//! Keys and sources: [`Name`], a fixed-capacity inline byte string for a
//! name in flight (a request, an effect, a log record being built), and
//! [`Arena`], where the table keeps every name it holds exactly once.
//!
//! Keys and sources are at most 127 bytes on the wire (a signed size byte).
//! A [`Name`] is always 128 bytes: fine on the stack for one request, far
//! too much for each of a million held keys whose names are mostly short.
//! The arena stores a name in the smallest of four slot sizes (16, 32, 64
//! or 128 bytes: a length byte and the bytes) and names it by a 4-byte
//! [`NameRef`]; a 13-byte key takes 16 bytes. Freed slots are reused
//! first, so a warmed-up arena stores and drops names without allocating.

use std::fmt;
use std::hash::{Hash, Hasher};

/// Longest key or source the protocol can carry.
pub const NAME_MAX: usize = 127;

#[derive(Clone, Copy)]
pub struct Name {
    len: u8,
    buf: [u8; NAME_MAX],
}

impl Name {
    pub const EMPTY: Name = Name {
        len: 0,
        buf: [0; NAME_MAX],
    };

    /// `None` when `bytes` is longer than [`NAME_MAX`].
    pub fn new(bytes: &[u8]) -> Option<Name> {
        if bytes.len() > NAME_MAX {
            return None;
        }
        let mut n = Name::EMPTY;
        n.buf[..bytes.len()].copy_from_slice(bytes);
        n.len = bytes.len() as u8;
        Some(n)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len as usize]
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl AsRef<[u8]> for Name {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}
impl Eq for Name {}

impl Hash for Name {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state)
    }
}

impl PartialOrd for Name {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Name {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

/// The bytes as a quoted, escaped logfmt value (`crate::log::Quoted`): log
/// lines write names with `{:?}`, so a name can neither forge a field nor
/// look like another name (a lossy UTF-8 conversion would show every invalid
/// byte as U+FFFD).
impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&crate::log::Quoted(self.as_bytes()), f)
    }
}

/// Slot sizes of the arena's classes: one length byte plus up to 15, 31,
/// 63 or 127 name bytes.
const CLASS_BYTES: [usize; 4] = [16, 32, 64, 128];
/// A [`NameRef`] keeps its class in the top two bits.
const CLASS_SHIFT: u32 = 30;
const NO_SLOT: u32 = u32::MAX;

/// Where a name lives in an [`Arena`]: its size class and slot. Valid until
/// the name is removed; the arena reuses the slot afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NameRef(u32);

impl NameRef {
    fn new(class: usize, slot: u32) -> NameRef {
        assert!(slot < 1 << CLASS_SHIFT, "name arena class {class} is full");
        NameRef((class as u32) << CLASS_SHIFT | slot)
    }
    fn class(self) -> usize {
        (self.0 >> CLASS_SHIFT) as usize
    }
    fn slot(self) -> usize {
        (self.0 & ((1 << CLASS_SHIFT) - 1)) as usize
    }
}

/// Names stored once each, in four slabs of fixed-size slots. A slot holds
/// `[len u8][len bytes]`; a free slot holds the next free slot of its
/// class (`u32` LE), so the free lists cost nothing beyond the slots.
///
/// Invariants: every live [`NameRef`] names a slot that is not on a free
/// list; `live` counts the slots that are neither free nor past the end.
pub struct Arena {
    classes: [Class; 4],
}

struct Class {
    bytes: Vec<u8>,
    /// Head of the free list, `NO_SLOT` when empty.
    free: u32,
    live: usize,
}

impl Default for Arena {
    fn default() -> Self {
        Arena::new()
    }
}

impl Arena {
    pub fn new() -> Arena {
        Arena {
            classes: std::array::from_fn(|_| Class {
                bytes: Vec::new(),
                free: NO_SLOT,
                live: 0,
            }),
        }
    }

    /// Stores `bytes` (at most [`NAME_MAX`]); allocates only when every
    /// slot of its class is in use.
    pub fn insert(&mut self, bytes: &[u8]) -> NameRef {
        assert!(bytes.len() <= NAME_MAX, "a name longer than NAME_MAX");
        let class = CLASS_BYTES
            .iter()
            .position(|&c| c > bytes.len())
            .expect("NAME_MAX fits the largest class");
        let size = CLASS_BYTES[class];
        let c = &mut self.classes[class];
        let slot = if c.free != NO_SLOT {
            let slot = c.free;
            let at = slot as usize * size;
            c.free = u32::from_le_bytes(c.bytes[at..at + 4].try_into().expect("4 bytes"));
            slot
        } else {
            let slot = (c.bytes.len() / size) as u32;
            c.bytes.resize(c.bytes.len() + size, 0);
            slot
        };
        let at = slot as usize * size;
        c.bytes[at] = bytes.len() as u8;
        c.bytes[at + 1..at + 1 + bytes.len()].copy_from_slice(bytes);
        c.live += 1;
        NameRef::new(class, slot)
    }

    /// The bytes of a live name.
    pub fn get(&self, r: NameRef) -> &[u8] {
        let size = CLASS_BYTES[r.class()];
        let at = r.slot() * size;
        let b = &self.classes[r.class()].bytes;
        let len = b[at] as usize;
        &b[at + 1..at + 1 + len]
    }

    /// Frees a live name's slot for reuse. `r` must not be used afterwards.
    pub fn remove(&mut self, r: NameRef) {
        let size = CLASS_BYTES[r.class()];
        let c = &mut self.classes[r.class()];
        let at = r.slot() * size;
        debug_assert!(at + size <= c.bytes.len(), "removal of a slot past the end");
        c.bytes[at..at + 4].copy_from_slice(&c.free.to_le_bytes());
        c.free = r.slot() as u32;
        c.live = c.live.checked_sub(1).expect("removal from an empty class");
    }

    /// Live names (tests and invariant checks).
    pub fn len(&self) -> usize {
        self.classes.iter().map(|c| c.live).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of slots allocated so far, live or free (inspection).
    pub fn slot_bytes(&self) -> usize {
        self.classes.iter().map(|c| c.bytes.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The arena agrees with a map of owned names under random inserts
        /// and removals, reuses freed slots before growing, and a name of
        /// n bytes takes the smallest slot that fits n + 1.
        #[test]
        fn arena_matches_a_model(ops in proptest::collection::vec((any::<bool>(), 0usize..=127, any::<u8>()), 1..300)) {
            let mut a = Arena::new();
            let mut live: Vec<(NameRef, Vec<u8>)> = Vec::new();
            for (i, (add, len, fill)) in ops.into_iter().enumerate() {
                if add || live.is_empty() {
                    let bytes: Vec<u8> = (0..len).map(|j| fill.wrapping_add(j as u8)).collect();
                    let before = a.slot_bytes();
                    let r = a.insert(&bytes);
                    let class = CLASS_BYTES[r.class()];
                    prop_assert!(class > len && (r.class() == 0 || CLASS_BYTES[r.class() - 1] <= len));
                    prop_assert!(a.slot_bytes() == before || a.slot_bytes() == before + class);
                    live.push((r, bytes));
                } else {
                    let (r, b) = live.swap_remove(i % live.len());
                    let before = a.slot_bytes();
                    a.remove(r);
                    // The next name of that size takes that very slot.
                    let again = a.insert(&b);
                    prop_assert_eq!(again, r);
                    prop_assert_eq!(a.slot_bytes(), before);
                    a.remove(again);
                }
                prop_assert_eq!(a.len(), live.len());
                for (r, b) in &live {
                    prop_assert_eq!(a.get(*r), &b[..]);
                }
            }
        }
    }

    #[test]
    fn a_13_byte_key_takes_16_bytes() {
        let mut a = Arena::new();
        let r = a.insert(b"key-000000001");
        assert_eq!(a.slot_bytes(), 16);
        assert_eq!(a.get(r), b"key-000000001");
        let e = a.insert(b"");
        assert_eq!(a.get(e), b"");
        let max = a.insert(&[9u8; 127]);
        assert_eq!(a.get(max), &[9u8; 127][..]);
        assert_eq!(a.slot_bytes(), 16 + 16 + 128);
    }

    #[test]
    fn bounds_and_equality() {
        assert!(Name::new(&[b'a'; 127]).is_some());
        assert!(Name::new(&[b'a'; 128]).is_none());
        let a = Name::new(b"abc").unwrap();
        let mut b = Name::new(b"abcdef").unwrap();
        assert_ne!(a, b);
        b = Name::new(b"abc").unwrap();
        assert_eq!(a, b);
        assert!(Name::new(b"ab").unwrap() < a);
    }

    #[test]
    fn debug_is_an_escaped_logfmt_value_and_keeps_names_apart() {
        let n = |b: &[u8]| format!("{:?}", Name::new(b).unwrap());
        assert_eq!(n(b"jobs/nightly"), r#""jobs/nightly""#);
        assert_eq!(n(b"x=1 \"\n"), r#""x=1 \"\n""#);
        // Two keys that a lossy conversion would both show as U+FFFD.
        assert_ne!(n(b"\xff"), n(b"\xfe"));
        assert_eq!(n(b"\xff"), r#""\xff""#);
    }
}
