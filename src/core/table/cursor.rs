//! What a listing in progress keeps, its id and what each of its steps
//! produced: the table holds the listings, `listing` runs them (and says
//! how listings work).

/// Bytes of saved (changed-before-sent) entries a listing may keep.
pub const SAVED_BYTES_MAX: usize = 8 << 20;

/// A `slots` entry with this bit is an offset into `saved`, not a slot.
pub(super) const SAVED: u32 = 1 << 31;

/// Names a listing of a table (from
/// [`Table::listing_begin`](super::Table::listing_begin)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListingId(pub(super) u32);

pub(super) struct Listing {
    /// Held key slots at the start sorted by key, or `SAVED | offset` of
    /// an entry whose holder changed since (its start state is there).
    pub(super) slots: Vec<u32>,
    /// Entries before `next` were encoded already.
    pub(super) next: usize,
    /// Encoded entries (KEYX form) of holders that changed before their
    /// turn.
    pub(super) saved: Vec<u8>,
    /// The start, for lease time left.
    pub(super) unix_ms: u64,
    pub(super) overflowed: bool,
}

/// What [`Table::listing_next`](super::Table::listing_next) produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Some entries; more follow.
    More,
    /// The last entries (possibly none): the listing is over (ended).
    Done,
    /// Holders changed faster than the listing was read: it is ended.
    Overflowed,
}

/// The length of the encoded entry at the front of `b` (KEYS form, or
/// KEYX form with `extended`); `b` holds at least one whole entry.
pub fn entry_len(b: &[u8], extended: bool) -> usize {
    let mut at = 0;
    for _ in 0..3 {
        at += 1 + b[at] as usize;
    }
    at + 8 + if extended { 13 } else { 0 }
}
