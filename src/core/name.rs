//! Fixed-capacity inline byte strings for keys and sources.
//!
//! Keys and sources are at most 127 bytes on the wire (a signed size byte),
//! so they are stored inline: creating or dropping a key never touches the
//! heap, and a hash map keyed by [`Name`] with capacity reserved at start-up
//! never allocates in steady state.

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

#[cfg(test)]
mod tests {
    use super::*;

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
