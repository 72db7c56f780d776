//! Keys and sources: [`Name`], a fixed-capacity inline byte string for a
//! name in flight (a request, an effect, a log record being built), and
//! [`Arena`], where the table keeps every name it holds exactly once.
//!
//! Keys are at most [`KEY_MAX`] (127) bytes everywhere (the lock port's
//! size bytes are signed). Sources are at most 127 bytes on the lock port
//! too, but up to [`SOURCE_MAX`] (255) on the session protocol (an
//! election's value), so a held source is up to 255 bytes. A [`Name`] (a
//! key) is always 128 bytes and a [`Source`] 256: fine on the stack for
//! one request, far too much for each of a million held keys whose names
//! are mostly short. The arena stores a name in the smallest of five slot
//! sizes (16, 32, 64, 128 or 256 bytes: a length byte and the bytes) and
//! names it by a 4-byte [`NameRef`]; a 13-byte key takes 16 bytes. Freed
//! slots are reused first, so a warmed-up arena stores and drops names
//! without allocating.

use std::fmt;
use std::hash::{Hash, Hasher};

/// Longest key, on every port, in the log and in the table.
pub const KEY_MAX: usize = 127;
/// Longest source a holder may have: a session Acquire's or Proclaim's
/// (its size byte is unsigned). The Locking-Center lock port carries at
/// most [`KEY_MAX`] (its size bytes are signed).
pub const SOURCE_MAX: usize = 255;
/// Longest source on the Locking-Center lock port (a signed size byte),
/// and the longest any server before 255-byte sources reads in a log
/// record or a replicated entry.
pub const LOCK_PORT_SOURCE_MAX: usize = 127;

/// An inline name of at most `N` bytes (`N` <= 255: its length is a
/// byte). `Name` alone is a key's ([`KEY_MAX`]); a source is a
/// [`Source`].
#[derive(Clone, Copy)]
pub struct Name<const N: usize = KEY_MAX> {
    len: u8,
    buf: [u8; N],
}

/// A holder's source: up to [`SOURCE_MAX`] bytes.
pub type Source = Name<SOURCE_MAX>;

impl<const N: usize> Name<N> {
    /// The length is one byte.
    const FITS: () = assert!(N <= 255, "a name's length is one byte");

    pub const EMPTY: Name<N> = Name {
        len: 0,
        buf: [0; N],
    };

    /// `None` when `bytes` is longer than `N`.
    pub fn new(bytes: &[u8]) -> Option<Name<N>> {
        let () = Self::FITS;
        if bytes.len() > N {
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

impl<const N: usize> AsRef<[u8]> for Name<N> {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl<const N: usize> PartialEq for Name<N> {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}
impl<const N: usize> Eq for Name<N> {}

impl<const N: usize> Hash for Name<N> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state)
    }
}

impl<const N: usize> PartialOrd for Name<N> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<const N: usize> Ord for Name<N> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

/// The bytes as a quoted, escaped logfmt value (`crate::log::Quoted`): log
/// lines write names with `{:?}`, so a name can neither forge a field nor
/// look like another name (a lossy UTF-8 conversion would show every invalid
/// byte as U+FFFD).
impl<const N: usize> fmt::Debug for Name<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&crate::log::Quoted(self.as_bytes()), f)
    }
}

/// Slot sizes of the arena's classes: one length byte plus up to 15, 31,
/// 63, 127 or 255 name bytes (the last for sources only).
const CLASS_BYTES: [usize; 5] = [16, 32, 64, 128, 256];
/// A [`NameRef`] keeps its class in the top three bits.
const CLASS_SHIFT: u32 = 29;
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

/// Names stored once each, in five slabs of fixed-size slots. A slot holds
/// `[len u8][len bytes]`; a free slot holds the next free slot of its
/// class (`u32` LE), so the free lists cost nothing beyond the slots.
///
/// Invariants: every live [`NameRef`] names a slot that is not on a free
/// list; `live` counts the slots that are neither free nor past the end.
pub struct Arena {
    classes: [Class; 5],
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

    /// Stores `bytes` (a key or a source: at most [`SOURCE_MAX`]);
    /// allocates only when every slot of its class is in use.
    pub fn insert(&mut self, bytes: &[u8]) -> NameRef {
        assert!(bytes.len() <= SOURCE_MAX, "a name longer than SOURCE_MAX");
        let class = CLASS_BYTES
            .iter()
            .position(|&c| c > bytes.len())
            .expect("SOURCE_MAX fits the largest class");
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
        fn arena_matches_a_model(ops in proptest::collection::vec((any::<bool>(), 0usize..=SOURCE_MAX, any::<u8>()), 1..300)) {
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
        // A source of 128..=255 bytes takes the largest class.
        let long = a.insert(&[7u8; 255]);
        assert_eq!(a.get(long), &[7u8; 255][..]);
        let just = a.insert(&[6u8; 128]);
        assert_eq!(a.get(just), &[6u8; 128][..]);
        assert_eq!(a.slot_bytes(), 16 + 16 + 128 + 2 * 256);
        assert_eq!(a.get(max), &[9u8; 127][..]);
    }

    #[test]
    fn bounds_and_equality() {
        assert!(Name::<KEY_MAX>::new(&[b'a'; 127]).is_some());
        assert!(Name::<KEY_MAX>::new(&[b'a'; 128]).is_none());
        assert!(Source::new(&[b'a'; 255]).is_some());
        assert!(Source::new(&[b'a'; 256]).is_none());
        assert_eq!(std::mem::size_of::<Name>(), 128);
        assert_eq!(std::mem::size_of::<Source>(), 256);
        let a: Name = Name::new(b"abc").unwrap();
        let mut b: Name = Name::new(b"abcdef").unwrap();
        assert_ne!(a, b);
        b = Name::new(b"abc").unwrap();
        assert_eq!(a, b);
        assert!(Name::new(b"ab").unwrap() < a);
    }

    #[test]
    fn debug_is_an_escaped_logfmt_value_and_keeps_names_apart() {
        let n = |b: &[u8]| format!("{:?}", Name::<KEY_MAX>::new(b).unwrap());
        assert_eq!(n(b"jobs/nightly"), r#""jobs/nightly""#);
        assert_eq!(n(b"x=1 \"\n"), r#""x=1 \"\n""#);
        // Two keys that a lossy conversion would both show as U+FFFD.
        assert_ne!(n(b"\xff"), n(b"\xfe"));
        assert_eq!(n(b"\xff"), r#""\xff""#);
    }
}
