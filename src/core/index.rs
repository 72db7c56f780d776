//! A name → slot index over one slab: the table's key index and its source
//! index are both one of these.
//!
//! The index holds `(32-bit hash, slot)` pairs only; the names themselves
//! live in the table's [`Arena`](super::Arena) and are reached through the
//! caller's `name_of(slot)` accessor. A probe compares the stored hash
//! before it calls `name_of`, and growing the index rehashes from the
//! stored hashes without reading any name. Every operation is one probe
//! and allocates nothing once the index has grown to its working size.

use std::hash::BuildHasher;

use hashbrown::hash_table::{Entry, HashTable, VacantEntry};

/// `(hash, slot)` of every entry of one slab, keyed by the entry's name.
pub struct NameIndex {
    /// Seeded at random per index: which names collide cannot be worked
    /// out from outside.
    hasher: foldhash::fast::RandomState,
    table: HashTable<(u32, u32)>,
}

/// What [`NameIndex::get_or_vacant`] found.
pub enum Found<'a> {
    /// The name's slot.
    Slot(u32),
    /// The name is not indexed; [`Vacant::insert`] adds it once its slab
    /// entry exists.
    Vacant(Vacant<'a>),
}

/// Room for a new name, found by the probe that missed it.
pub struct Vacant<'a> {
    entry: VacantEntry<'a, (u32, u32)>,
    hash: u32,
}

impl Vacant<'_> {
    /// The new name's hash, for its slab entry (so that removing the entry
    /// does not hash the name again).
    pub fn hash(&self) -> u32 {
        self.hash
    }

    /// Indexes the new name at `slot`.
    pub fn insert(self, slot: u32) {
        self.entry.insert((self.hash, slot));
    }
}

/// Spreads a 32-bit name hash over the 64 bits the index probes with (its
/// low bits pick the group, its top 7 bits are the tag): multiplying by an
/// odd constant keeps the low bits a bijection and mixes every bit into
/// the top ones.
fn spread(h: u32) -> u64 {
    (h as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl Default for NameIndex {
    fn default() -> Self {
        NameIndex::new()
    }
}

impl NameIndex {
    /// An empty index (nothing reserved).
    pub fn new() -> NameIndex {
        NameIndex {
            hasher: foldhash::fast::RandomState::default(),
            table: HashTable::new(),
        }
    }

    /// The index hash of a name: 32 bits of foldhash, kept in the entry.
    pub fn hash(&self, name: &[u8]) -> u32 {
        self.hasher.hash_one(name) as u32
    }

    /// Number of indexed names.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// True when no name is indexed.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// The slot of `name`: one probe.
    pub fn find<'n>(&self, name: &[u8], name_of: impl Fn(u32) -> &'n [u8]) -> Option<u32> {
        let h = self.hash(name);
        self.table
            .find(spread(h), |&(eh, s)| eh == h && name_of(s) == name)
            .map(|&(_, s)| s)
    }

    /// The slot of `name`, or room to index it: one probe either way.
    pub fn get_or_vacant<'n>(
        &mut self,
        name: &[u8],
        name_of: impl Fn(u32) -> &'n [u8],
    ) -> Found<'_> {
        let h = self.hash(name);
        match self.table.entry(
            spread(h),
            |&(eh, s)| eh == h && name_of(s) == name,
            |&(eh, _)| spread(eh),
        ) {
            Entry::Occupied(e) => Found::Slot(e.get().1),
            Entry::Vacant(entry) => Found::Vacant(Vacant { entry, hash: h }),
        }
    }

    /// Forgets `slot`, indexed under `hash`; false if it was not indexed.
    pub fn remove(&mut self, hash: u32, slot: u32) -> bool {
        match self.table.find_entry(spread(hash), |&(_, s)| s == slot) {
            Ok(o) => {
                o.remove();
                true
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names in a plain vector stand in for a slab and its arena.
    fn get_or_insert(ix: &mut NameIndex, names: &mut Vec<Vec<u8>>, name: &[u8]) -> (u32, bool) {
        match ix.get_or_vacant(name, |s| names[s as usize].as_slice()) {
            Found::Slot(s) => (s, false),
            Found::Vacant(v) => {
                names.push(name.to_vec());
                v.insert(names.len() as u32 - 1);
                (names.len() as u32 - 1, true)
            }
        }
    }

    #[test]
    fn finds_inserts_and_removes_by_name() {
        let mut ix = NameIndex::new();
        let mut names = Vec::new();
        assert_eq!(get_or_insert(&mut ix, &mut names, b"a"), (0, true));
        assert_eq!(get_or_insert(&mut ix, &mut names, b"b"), (1, true));
        assert_eq!(get_or_insert(&mut ix, &mut names, b"a"), (0, false));
        assert_eq!(ix.len(), 2);
        let by = |s: u32| -> &[u8] { &[b'a', b'b'][s as usize..s as usize + 1] };
        assert_eq!(ix.find(b"b", by), Some(1));
        assert_eq!(ix.find(b"c", by), None);
        assert!(ix.remove(ix.hash(b"a"), 0));
        assert!(!ix.remove(ix.hash(b"a"), 0), "removed once");
        assert_eq!(ix.find(b"a", by), None);
        assert_eq!(ix.find(b"b", by), Some(1));
        assert_eq!(ix.len(), 1);
    }

    #[test]
    fn many_names_survive_growth() {
        let mut ix = NameIndex::new();
        let mut names = Vec::new();
        for i in 0..10_000u32 {
            let name = format!("key-{i}").into_bytes();
            assert_eq!(get_or_insert(&mut ix, &mut names, &name), (i, true));
        }
        for i in (0..10_000u32).step_by(7) {
            let name = format!("key-{i}").into_bytes();
            assert_eq!(ix.find(&name, |s| names[s as usize].as_slice()), Some(i));
        }
    }
}
